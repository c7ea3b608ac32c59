"""The weka reader on hostile files (one-line errors naming the file and the field, bounded), and
reproducibility of a weka replay and of a shared-prefix scenario (same seed -> byte-identical outputs)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from kvplan.errors import KvplanInputError
from kvplan.sim.api import run
from kvplan.sim.result_files import write_result_dir
from kvplan.traces.weka import read_weka

SMALL = Path(__file__).resolve().parent / "data" / "traces" / "weka_small.json"


def _req(**kw: Any) -> dict[str, Any]:
    return {"t": 0, "in": 128, "out": 10, "hash_ids": [1, 2], **kw}


def _doc(reqs: Any, **kw: Any) -> dict[str, Any]:
    return {"id": "x", "block_size": 64, "requests": reqs, **kw}


def _nested_subagents(depth: int) -> dict[str, Any]:
    node: dict[str, Any] = _req()
    for _ in range(depth):
        node = {"type": "subagent", "t": 0, "requests": [node]}
    return _doc([node])


HOSTILE: list[tuple[str, Any, str]] = [
    ("truncated", '{"id": "x", "requests": [{"t": 0', "not valid JSON"),
    ("zero bytes", "", "empty"),
    ("whitespace", "  \n", "not valid JSON"),
    ("a list", "[]", "not a JSON object"),
    ("null", "null", "not a JSON object"),
    ("ragged hash_ids", _doc([_req(hash_ids=[[1], [2, 3]])]), "hash_ids"),
    ("nested hash_ids", _doc([_req(hash_ids=[[1], [2]])]), "hash_ids"),
    ("hash_ids a string", _doc([_req(hash_ids="12")]), "hash_ids"),
    ("hash_ids an object", _doc([_req(hash_ids={"a": 1})]), "hash_ids"),
    ("hash_ids null", _doc([_req(hash_ids=None)]), "hash_ids"),
    ("hash_ids bools", _doc([_req(hash_ids=[True, False])]), "hash_ids"),
    ("hash_ids beyond int64", _doc([_req(hash_ids=[2**70, 1])]), "hash_ids"),
    ("hash_ids floats", _doc([_req(hash_ids=[1.0, 2.0])]), "hash_ids"),
    ("in a string", _doc([_req(**{"in": "128"})]), "'in'"),
    ("in huge", _doc([_req(**{"in": 10**30})]), "'in'"),
    ("in negative", _doc([_req(**{"in": -1})]), "'in'"),
    ("t NaN", '{"id":"x","requests":[{"t": NaN, "in": 128, "out": 1, "hash_ids": [1,2]}]}', "'t'"),
    ("think_time negative", _doc([_req(think_time=-1)]), "think_time"),
    ("think_time Infinity",
     '{"id":"x","requests":[{"t": 0, "in": 128, "out": 1, "hash_ids": [1,2], "think_time": Infinity}]}', "think_time"),
    ("think_time a bool", _doc([_req(think_time=True)]), "think_time"),
    ("requests an object", _doc({"a": 1}), "requests"),
    ("no requests", {"id": "x"}, "requests"),
    ("empty requests", _doc([]), "no requests"),
    ("id a list", _doc([_req()], id=[1]), "'id'"),
    ("id huge", _doc([_req()], id="x" * 10_000), "'id'"),
    ("agent_id an object", _doc([{"type": "subagent", "t": 0, "agent_id": {"a": 1}, "requests": [_req()]}]),
     "agent_id"),
    ("block_size 16", _doc([_req()], block_size=16), "block_size"),
    ("tool_tokens negative", _doc([_req()], tool_tokens=-5), "tool_tokens"),
    ("deep JSON", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("deep sub-agents", _nested_subagents(20), "nested more than"),
    ("NUL bytes", "\x00\x00", "NUL"),
]


@pytest.mark.parametrize(("name", "content", "needle"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_file_one_line_error_naming_file_and_field(tmp_path: Path, name: str, content: Any,
                                                           needle: str) -> None:
    f = tmp_path / "trace.json"
    f.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(KvplanInputError) as exc:
        read_weka(f)
    msg = str(exc.value)
    assert "\n" not in msg and "trace.json" in msg and needle in msg, msg


def test_duplicate_ids_stay_apart_and_invalid_utf8(tmp_path: Path) -> None:
    for n in ("a.json", "b.json"):
        (tmp_path / n).write_text(json.dumps(_doc([_req()])))
    tr = read_weka(tmp_path)
    assert len(tr.sessions) == 2 and len({s.name for s in tr.sessions}) == 2
    bad = tmp_path / "sub" / "latin1.json"
    bad.parent.mkdir()
    bad.write_bytes(b"\xff\xfe{")
    with pytest.raises(KvplanInputError, match="UTF-8"):
        read_weka(bad)


def test_directory_with_devices_links_and_other_files(tmp_path: Path) -> None:
    (tmp_path / "ok.json").write_text(json.dumps(_doc([_req()])))
    (tmp_path / "notes.txt").write_text("not a trace")
    os.symlink("/dev/zero", tmp_path / "zero.json")  # not a regular file: never opened
    os.symlink(tmp_path, tmp_path / "loop.json")  # a directory: skipped
    os.symlink("/nonexistent", tmp_path / "dangling.json")
    os.mkfifo(tmp_path / "fifo.json")  # would block a plain open()
    tr = read_weka(tmp_path)
    assert tr.n_requests == 1 and len(tr.files) == 1
    for name in ("zero.json", "fifo.json"):
        with pytest.raises(KvplanInputError, match="not a regular file"):
            read_weka(tmp_path / name)
    if Path("/proc/self/status").exists():  # size 0 in stat: refused without reading, not called empty
        os.symlink("/proc/self/status", tmp_path / "proc.json")
        with pytest.raises(KvplanInputError, match="special file of the kernel"):
            read_weka(tmp_path / "proc.json")


def test_empty_directory_and_no_json(tmp_path: Path) -> None:
    with pytest.raises(KvplanInputError, match="no \\*.json"):
        read_weka(tmp_path)
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(KvplanInputError, match="no \\*.json"):
        read_weka(tmp_path)


# --- reproducibility ---------------------------------------------------------------------------------------


def _outputs(sc: dict[str, Any], out: Path) -> dict[str, bytes]:
    res = run(sc)
    write_result_dir(res, out)
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if p.is_file()}


@pytest.mark.parametrize("sc", [
    {"model": "qwen3-32b", "hardware": "p5en", "seed": 7, "policy": {"bidirectional": True},
     "workload": {"trace": {"path": str(SMALL), "format": "weka", "shared_prefix": True, "sample_sessions": 1.0}}},
    {"model": "qwen3-32b", "hardware": "p5en", "seed": 7,
     "workload": {"conversations": 12, "turns": {"dist": "constant", "value": 3},
                  "prefix_tokens": {"dist": "uniform", "low": 1500, "high": 3000},
                  "turn_gap_s": {"dist": "exponential", "mean": 5.0},
                  "shared_prefix_tokens": 1200, "shared_prefix_groups": 3,
                  "history": "partial", "history_kept_share": 0.7}},
], ids=["weka-replay", "shared-prefix"])
def test_same_seed_byte_identical_outputs(tmp_path: Path, sc: dict[str, Any]) -> None:
    a = _outputs(sc, tmp_path / "a")
    b = _outputs(sc, tmp_path / "b")
    assert a.keys() == b.keys() and len(a) >= 2
    for name in a:
        assert a[name] == b[name], name
