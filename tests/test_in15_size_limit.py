"""An input file over its size limit (helper in15) was told to 'pass a smaller file (split or filter the trace) or
raise max_bytes': max_bytes is an API parameter no user can raise, and a --recommendation JSON or an engine log is no
trace. The fix now says what a user can do (and, marked as such, what an API caller can)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hostile import SMALL_SCENARIO, run_limited

SCENARIO = SMALL_SCENARIO


@pytest.mark.parametrize("argv", [
    ["compare", "{d}/s.yaml", "--replications", "1", "--recommendation", "{d}/big"],
    ["calibrate", "--log", "{d}/big", "--model", "qwen3-32b", "--hardware", "p5en", "--out", "{d}/p.json"],
    ["workload", "show", "{d}/big"],
], ids=["--recommendation", "calibrate --log", "workload show"])
def test_oversized_file_fix_is_actionable(tmp_path: Path, argv: list[str]) -> None:
    (tmp_path / "s.yaml").write_text(SCENARIO)
    with open(tmp_path / "big", "wb") as fh:
        fh.truncate(300 * 1024**2)  # sparse: refused from stat, never read
    res = run_limited([a.replace("{d}", str(tmp_path)) for a in argv], tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.code == 2 and len(lines) == 1, res.stderr[-500:]
    assert "larger than the" in lines[0] and "; pass a smaller file (split or filter it;" in lines[0], lines[0]
    assert "split or filter the trace" not in lines[0] and "or raise max_bytes" not in lines[0]
    os.unlink(tmp_path / "big")
