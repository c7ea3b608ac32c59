"""aud15: ``kvplan workload fit`` measures the rate of new conversations from the sessions' starts. It was sessions /
(last request - first request): the follow-ups of the last sessions count as time without arrivals, so a trace of
sessions started at 0.5/s with 2.5 turns 45 s apart was fitted at 0.385/s and its workload offered 23% less load than
the trace (LMBench's llama8b qps0.5 file: 0.173/s, its sessions start at 0.210/s)."""

from __future__ import annotations

import numpy as np
import pytest

from kvplan.calibration.workload_fit import fit_workload
from kvplan.traces.sessions import trace_from_sessions
from kvplan.traces.stats import crude_service_time_s
from kvplan.traces.trace import Trace


def _trace(rate: float, sessions: int, seed: int) -> tuple[Trace, float]:
    """Sessions started by a Poisson stream at ``rate``, 1 + geometric turns (mean 2.5), idle gaps exponential 45 s."""
    rng = np.random.default_rng(seed)
    rows: list[tuple[str, float, int, int]] = []
    start = 0.0
    for s in range(sessions):
        start += float(rng.exponential(1 / rate))
        t, n_in = start, int(rng.integers(500, 4000))
        for _ in range(int(rng.geometric(0.4))):
            n_out = int(rng.integers(20, 600))
            rows.append((f"s{s}", t, n_in, n_out))
            t += float(crude_service_time_s(n_in, n_out)) + float(rng.exponential(45.0))
            n_in += n_out + int(rng.integers(0, 200))
    rows.sort(key=lambda r: r[1])
    sid, arr, n_in_l, n_out_l = zip(*rows, strict=True)
    tr = trace_from_sessions(sid, arr, n_in_l, n_out_l, source="synthetic")
    return tr, start


def test_the_fitted_rate_is_the_rate_sessions_start_at() -> None:
    tr, _last_start = _trace(0.5, 1500, 3)
    fit = fit_workload(tr)
    assert fit["arrival"]["rate_per_s"] == pytest.approx(0.5, rel=0.06)
    assert 1500 / tr.duration_s < 0.42  # what sessions / the trace's span gives: the last sessions' follow-ups
    assert "session start" in fit["report"]["arrival"] and fit["report"]["arrival_rate_measured"]


def test_the_reproduction_check_holds_the_load() -> None:
    """The reproduction table holds the load the fitted arrival rate offers (new conversations and requests per
    second over the span of the sessions' starts), relative only: the rate written before (sessions / the trace's
    span, 23% low here) is flagged; a cohort (no measured rate) gets no load rows."""
    from kvplan.calibration.workload_fit import reproduction_check, workload_section

    tr, _ = _trace(0.5, 1500, 3)
    fit = fit_workload(tr)
    section = workload_section(fit)
    rep = reproduction_check(tr, section, crude_service_time_s, 131072, fit["report"])
    rows = {r["statistic"]: r for r in rep["statistics"]}
    assert rows["new conversations per second"]["reproduced"] and rows["requests per second"]["reproduced"]
    assert rows["new conversations per second"]["trace"] == pytest.approx(0.5, rel=0.06)
    old = {**section, "arrival": {"kind": "poisson", "rate_per_s": 1500 / tr.duration_s}}
    rep = reproduction_check(tr, old, crude_service_time_s, 131072, fit["report"])
    assert {"new conversations per second", "requests per second"} <= set(rep["not_reproduced"])
    assert any(r.startswith("the load:") for r in rep["reasons"])
    rep = reproduction_check(tr, section, crude_service_time_s, 131072, {**fit["report"], "arrival_rate_measured": False})
    assert not any("per second" in r["statistic"] for r in rep["statistics"])
