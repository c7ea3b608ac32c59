"""`kvplan workload fit` of a trace whose fitted workload `kvplan simulate` would refuse (helper in15).

A trace whose sessions start days apart fits an arrival rate so low that its drawn arrivals span more simulated time
than the simulator resolves; one session of 100,001 requests fits more turns than a conversation may have. Both once
ended in a pydantic traceback from the reproduction check; now a one-line error naming the trace and the field, exit
2, nothing written. A trace that is runnable at its own size but not at the check's 2,000 conversations is checked at
its own size.
"""

from __future__ import annotations

import json
from pathlib import Path

from hostile import run_limited

LM_HEADER = "prompt_tokens,generation_tokens,ttft,generation_time,user_id,question_id,launch_time,finish_time\n"
CSV_HEADER = "session_id,timestamp_s,input_tokens,output_tokens\n"


def _refused(tmp_path: Path, name: str, text: str) -> str:
    (tmp_path / name).write_text(text)
    res = run_limited(["workload", "fit", str(tmp_path / name), "--out", str(tmp_path / "w.yaml")], tmp_path,
                      time_limit_s=30)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert "Traceback" not in res.stderr, res.stderr[-1500:]
    assert res.code == 2, (res.code, res.stderr[-500:])
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # nothing written
    return lines[0]


def test_sessions_a_million_years_apart_are_refused(tmp_path: Path) -> None:
    line = _refused(tmp_path, "l.csv", LM_HEADER + "100,10,0.1,1,u1,q1,0,1\n"
                    "120,10,0.1,1,u1,q2,1000000000000,1000000000001\n")
    assert "l.csv" in line and "field 'workload'" in line and "simulated time" in line
    assert "fit a shorter stretch of the trace" in line
    assert "raise arrival.rate_per_s" not in line  # the scenario validator's advice is not a trace's fix


def test_one_session_of_100001_requests_is_refused(tmp_path: Path) -> None:
    rows = "".join(f"a,{i},{i + 1},1\n" for i in range(100_001))
    line = _refused(tmp_path, "t.csv", CSV_HEADER + rows)
    assert "t.csv" in line and "field 'workload'" in line and "turns" in line


def test_reproduction_check_falls_back_to_the_traces_own_size(tmp_path: Path) -> None:
    # 10 sessions 900,000 s apart: runnable as fitted (8.1e6 s of arrivals), not as 2,000 conversations
    rows = "".join(f"s{i},{i * 900_000},{1000 + i},100\ns{i},{i * 900_000 + 30},{1200 + i},100\n" for i in range(10))
    (tmp_path / "t.csv").write_text(CSV_HEADER + rows)
    res = run_limited(["workload", "fit", str(tmp_path / "t.csv"), "--out", str(tmp_path / "w.yaml")], tmp_path,
                      time_limit_s=30)
    assert "Traceback" not in res.stderr, res.stderr[-1500:]
    assert res.code == 0, res.stderr[-500:]
    report = json.loads((tmp_path / "w.fit.json").read_text())
    assert report["reproduction"]["statistics"]
    assert "conversations: 10" in (tmp_path / "w.yaml").read_text()
