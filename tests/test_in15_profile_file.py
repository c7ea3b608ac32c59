"""A profile JSON file (--profile, a scenario's profile:) that is empty, compressed, UTF-16 or binary (helper in15):
it was 'not valid JSON (Expecting value: line 1 column 1 (char 0))' or a codec message ("'utf-8' codec can't decode
byte 0x8b in position 1"); it is named as what it is, with the fix, like every other input file."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from hostile import run_limited

PROFILE = '{"name": "x"}'
CASES = [
    ("empty", b"", "profile file is empty; re-create it with kvplan calibrate"),
    ("blank", b"\n  \n", "profile file is empty"),
    ("gzip", gzip.compress(PROFILE.encode(), mtime=0), "is compressed (gzip), not a text file; decompress it"),
    ("utf-16", PROFILE.encode("utf-16"), "is UTF-16 text"),
    ("latin-1", b'{"name": "caf\xe9"}', "line 1: byte 13 is not valid UTF-8; save it as UTF-8"),
]


@pytest.mark.parametrize(("name", "data", "needle"), CASES, ids=[c[0] for c in CASES])
def test_cost_profile_file(tmp_path: Path, name: str, data: bytes, needle: str) -> None:
    (tmp_path / "p.json").write_bytes(data)
    res = run_limited(["cost", "--profile", str(tmp_path / "p.json"), "--tokens", "100"], tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.code == 2 and "Traceback" not in res.stderr, res.stderr[-800:]
    assert len(lines) == 1 and needle in lines[0] and "p.json" in lines[0], lines
    assert "codec" not in lines[0] and "Expecting value" not in lines[0]
