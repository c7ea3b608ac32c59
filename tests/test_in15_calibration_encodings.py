"""Calibration inputs that are compressed or UTF-16 (helper in15). A dashboard Calibration upload (its format
is sniffed by kvplan.calibration.parsers.detect_format) was 'contains NUL bytes: this is a binary file, not a
trace', with no hint that decompressing or re-saving as UTF-8 is the fix; it is named now as `kvplan calibrate`
already named it (the CLI cases are kept as the reference the upload must match)."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from hostile import run_limited

from kvplan.app.dash_upload import parse_upload
from kvplan.errors import KvplanInputError

LOG = ("INFO 05-11 23:40:01 [loggers.py:116] Engine 000: Avg prompt throughput: 1200.0 tokens/s, Avg generation "
       "throughput: 50.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs\n")
FILES = [
    ("gzip log", "e.log", gzip.compress(LOG.encode(), mtime=0), "is compressed (gzip), not a text file; decompress"),
    ("utf-16 log", "e.log", LOG.encode("utf-16"), "is UTF-16 text (it starts with a UTF-16 byte-order mark), not "
     "UTF-8; save it as UTF-8"),
    ("utf-16 points", "p.csv", "kind,tokens,cached_tokens,value_ms\nprefill,1000,0,50\n".encode("utf-16"),
     "is UTF-16 text"),
]


@pytest.mark.parametrize(("name", "fname", "data", "needle"), FILES, ids=[f[0] for f in FILES])
def test_calibrate_names_compressed_and_utf16_files(tmp_path: Path, name: str, fname: str, data: bytes,
                                                    needle: str) -> None:
    (tmp_path / fname).write_bytes(data)
    flag = "--log" if fname.endswith(".log") else "--points"
    res = run_limited(["calibrate", flag, str(tmp_path / fname), "--model", "qwen3-32b", "--hardware", "p5en",
                       "--out", str(tmp_path / "p.json")], tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.code == 2 and "Traceback" not in res.stderr, res.stderr[-1000:]
    assert len(lines) == 1 and needle in lines[0] and fname in lines[0], lines
    assert not (tmp_path / "p.json").exists()


@pytest.mark.parametrize(("name", "fname", "data", "needle"), FILES, ids=[f[0] for f in FILES])
def test_dashboard_upload_names_compressed_and_utf16_files(name: str, fname: str, data: bytes, needle: str) -> None:
    with pytest.raises(KvplanInputError) as info:
        parse_upload(fname, data)
    assert needle in str(info.value) and fname in str(info.value)
