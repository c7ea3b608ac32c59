"""rev15: `kvplan workload fit` of a sparse trace ends in its answer or a one-line error, never a traceback.

The reproduction check draws at least 2,000 conversations at the fitted arrival rate; for a trace of 10 sessions over
a day (rate 1.16e-4/s) those span 1.7e7 s, beyond the simulated time a plan may span, and the Workload validator's
ValueError came out as a pydantic traceback (exit 1). A fitted workload whose own turn gaps are beyond that limit did
the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.app.cli import main

HEADER = "session_id,timestamp_s,input_tokens,output_tokens\n"


def _write(path: Path, rows: list[tuple[str, float, int, int]]) -> Path:
    path.write_text(HEADER + "".join(f"{s},{t!r},{i},{o}\n" for s, t, i, o in sorted(rows, key=lambda r: r[1])))
    return path


def test_a_sparse_trace_is_fitted_and_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [(f"s{s}", s * 9600.0 + 60.0 * k, 1000 + 300 * k, 100) for s in range(10) for k in range(3)]
    trace = _write(tmp_path / "day.csv", rows)
    assert main(["workload", "fit", str(trace), "--out", str(tmp_path / "w.yaml")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "10 conversations at 0.0001" in out and "reproduction:" in out, out
    assert (tmp_path / "w.yaml").exists()


def test_turn_gaps_beyond_the_simulated_time_limit_are_one_line(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    rows = [(f"s{s}", s * 10.0 + 3e7 * k, 1000 + 400 * k, 100) for s in range(5) for k in range(2)]
    trace = _write(tmp_path / "gaps.csv", rows)
    assert main(["workload", "fit", str(trace), "--out", str(tmp_path / "w.yaml")]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "turn_gap_s" in lines[0] and "beyond the limit" in lines[0], err
    assert not (tmp_path / "w.yaml").exists()
