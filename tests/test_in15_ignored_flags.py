"""Flags that did nothing (helper in15): `compare|recommend|capacity SCENARIO.yaml --model M / --hardware H` ran the
scenario's own model and hardware (the flags pick a --workload preset's; compare's output was byte-identical with
and without them), and `compare|capacity --conversations N` with a trace replay (--trace, or the scenario's
workload.trace) ran the trace's own conversations. A flag that would change nothing is refused in one line naming
it and the fix, exit 2, before any run. (recommend already refused --conversations with --trace.)"""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile import SMALL_SCENARIO, run_limited

TRACE = Path(__file__).parent / "data" / "traces" / "sessions_small.csv"
SCENARIO = SMALL_SCENARIO
RUN = {"compare": ["--replications", "1", "--policies", "ttl"], "recommend": ["--replications", "1", "--no-policies"],
       "capacity": ["--slo-ttft-p90-ms", "500", "--replications", "1", "--max-nodes", "2"]}


def _run(tmp_path: Path, argv: list[str]) -> tuple[int | None, list[str]]:
    (tmp_path / "s.yaml").write_text(SCENARIO)
    (tmp_path / "t.yaml").write_text(SCENARIO + f"  trace: {{path: {TRACE}}}\n")
    res = run_limited([a.replace("{d}", str(tmp_path)) for a in argv], tmp_path, time_limit_s=30)
    assert "Traceback" not in res.stderr, res.stderr[-1000:]
    return res.code, [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith("simulating")]


@pytest.mark.parametrize("cmd", list(RUN))
@pytest.mark.parametrize(("flag", "value"), [("--model", "glm-5-fp8"), ("--hardware", "h800"),
                                             ("--model", "qwen3-32b")])  # the default spelled out: given all the same
def test_preset_flags_with_a_scenario_are_refused(tmp_path: Path, cmd: str, flag: str, value: str) -> None:
    code, lines = _run(tmp_path, [cmd, "{d}/s.yaml", flag, value, *RUN[cmd]])
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: {flag}: is only for a --workload preset") and f"drop {flag}" in lines[0]


@pytest.mark.parametrize("cmd", ["compare", "capacity"])
@pytest.mark.parametrize("how", ["--trace", "scenario trace"])
def test_conversations_with_a_trace_replay_are_refused(tmp_path: Path, cmd: str, how: str) -> None:
    argv = ([cmd, "{d}/s.yaml", "--trace", str(TRACE)] if how == "--trace" else [cmd, "{d}/t.yaml"])
    code, lines = _run(tmp_path, [*argv, "--conversations", "3", *RUN[cmd]])
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith("error: --conversations: the run replays a trace"), lines[0]


def test_preset_flags_still_pick_the_workload_preset(tmp_path: Path) -> None:
    code, lines = _run(tmp_path, ["compare", "--workload", "chat", "--model", "qwen3-32b", "--hardware", "p5en",
                                  "--conversations", "5", *RUN["compare"]])
    assert code == 0, lines
