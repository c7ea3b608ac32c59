"""Scenario and grid YAML files that are not UTF-8 text (helper in15).

They were decoded with replacement characters: a binary file was reported as 'YAML error: invalid YAML (truncated or
mis-indented file?)', and a Latin-1 byte inside a value silently became U+FFFD (then, e.g., a profile path that
names no file). They now get the one-line errors every other input file gets: a NUL byte is a binary file, an
invalid byte is named with its line, exit 2, nothing written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile import run_limited

SCENARIO = """model: qwen3-32b
hardware: p5en
deployment: {max_num_seqs: 64}
policy: {bidirectional: true}
workload:
  conversations: 5
  arrival: {kind: poisson, rate_per_s: 1.0}
  turns: {dist: constant, value: 2}
  prefix_tokens: {dist: constant, value: 1000}
  user_tokens: {dist: constant, value: 100}
  output_tokens: {dist: constant, value: 20}
  turn_gap_s: {dist: exponential, mean: 5}
seed: 1
"""
GRID = "base:\n" + "".join(f"  {ln}\n" for ln in SCENARIO.splitlines()) + \
    "axes:\n  policy.decoder_kv_blocks_ttl_s: [30, 60]\n"

CASES = [
    ("binary", bytes(range(256)) * 4, "byte 0 is a NUL byte: this is a binary file"),
    ("latin-1 value", SCENARIO.replace("seed: 1", "# r\xe9sum\xe9\nseed: 1").encode("latin-1"),
     "line 13: byte"),
    ("NUL after text", SCENARIO.encode() + b"\x00\x00", "NUL byte"),
]


def _check(tmp_path: Path, argv: list[str], needle: str) -> None:
    before = sorted(p.name for p in tmp_path.iterdir())
    res = run_limited(argv, tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in res.stderr, res.stderr[-1500:]
    assert res.code == 2, (res.code, res.stderr[-500:])
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert needle in lines[0] and "invalid YAML" not in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.parametrize(("name", "data", "needle"), CASES, ids=[c[0] for c in CASES])
def test_scenario_not_utf8(tmp_path: Path, name: str, data: bytes, needle: str) -> None:
    (tmp_path / "s.yaml").write_bytes(data)
    _check(tmp_path, ["simulate", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o")], needle)


def test_grid_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "g.yaml").write_bytes(GRID.replace("seed: 1", "# caf\xe9\n  seed: 1").encode("latin-1"))
    _check(tmp_path, ["sweep", str(tmp_path / "g.yaml"), "--out", str(tmp_path / "r.parquet"), "--workers", "1"],
           "g.yaml: line 14: byte")


def test_utf8_with_a_byte_order_mark_still_runs(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_bytes(b"\xef\xbb\xbf" + SCENARIO.replace("seed: 1", "# r\xe9sum\xe9\nseed: 1").encode())
    res = run_limited(["simulate", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o")], tmp_path)
    assert res.code == 0, res.stderr[-800:]
    assert (tmp_path / "o" / "summary.json").exists()
