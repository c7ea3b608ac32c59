"""Requests arriving at the same instant reach P one after the other in arrival order, at any count.

The sources chain the next start (or trace request) from ``reached_p``, so with the proxy overhead already elapsed a
simultaneous arrival was handled inside the previous one's: N sessions starting together nested N calls deep (a
400-session trace ended in a RecursionError, 20,000 in a segmentation fault of the compiled build, found by helper
in15), and the last of them reached P first."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvplan.sim.api import run
from kvplan.sim.scenario import scenario_from_dict


def _trace(tmp_path: Path, n: int) -> Path:
    p = tmp_path / "same.csv"
    p.write_text("session_id,timestamp_s,input_tokens,output_tokens\n" + "".join(f"s{i},0,100,10\n" for i in range(n)))
    return p


def test_thousands_of_sessions_starting_together_run_in_order(tmp_path: Path) -> None:
    n = 3000  # about 12,000 nested frames before: past CPython's recursion limit
    r = run(scenario_from_dict({"workload": {"trace": {"path": str(_trace(tmp_path, n)), "format": "csv"}}}))
    t = r.turns.sort_values("conversation_id")
    assert len(t) == n and (t["decision"] != "error").all()
    # FCFS on P in the trace's order: the first session waits least, and nobody waits less than an earlier one
    wait = t["prefill_queue_s"].to_numpy()
    assert wait[0] == 0.0 and bool(np.all(np.diff(wait) >= 0))
