"""An empty input file that is not a trace (a --recommendation JSON, an engine log, a profile upload) was told to
'pass a non-empty trace file' (helper in15): the fix named the wrong kind of file. The error names the flag's file and
a fix that fits every kind."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile import SMALL_SCENARIO, run_limited

from kvplan.app.dash_upload import load_uploaded_profile
from kvplan.errors import KvplanInputError

SCENARIO = SMALL_SCENARIO


@pytest.mark.parametrize("argv", [
    ["compare", "{d}/s.yaml", "--replications", "1", "--recommendation", "{d}/e"],
    ["calibrate", "--log", "{d}/e", "--model", "qwen3-32b", "--hardware", "p5en", "--out", "{d}/p.json"],
    ["calibrate", "--prometheus", "{d}/e", "--model", "qwen3-32b", "--hardware", "p5en", "--out", "{d}/p.json"],
], ids=["compare --recommendation", "calibrate --log", "calibrate --prometheus"])
def test_empty_non_trace_file(tmp_path: Path, argv: list[str]) -> None:
    (tmp_path / "s.yaml").write_text(SCENARIO)
    (tmp_path / "e").write_bytes(b"")
    res = run_limited([a.replace("{d}", str(tmp_path)) for a in argv], tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.code == 2 and len(lines) == 1, res.stderr[-800:]
    assert "trace file" not in lines[0] and str(tmp_path / "e") in lines[0], lines[0]
    assert "file is empty; pass the complete file" in lines[0]


def test_empty_profile_upload() -> None:
    with pytest.raises(KvplanInputError) as info:
        load_uploaded_profile("p.json", b"")
    assert "upload is empty; pick the complete file" in str(info.value) and "trace file" not in str(info.value)
