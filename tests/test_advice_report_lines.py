"""recommend's text: warnings about many TTLs in one line, times scaled for humans."""

from __future__ import annotations

import math

from kvplan.plan.advice_report import run_warnings
from kvplan.plan.advice_rules import TtlCandidate
from kvplan.sim.engine import resolve
from kvplan.sim.scenario import Scenario


def _cand(ttl: float, settled: bool) -> TtlCandidate:
    m = {"pinned_kv_gib_mean": math.nan, "ttft_mean_s": 1.0, "ttft_p90_s": 2.0, "hit_rate": 0.5,
         "pinned_kv_gib_peak": math.nan}
    return TtlCandidate(ttl_s=ttl, router_ttl_s=int(ttl) - 6, metrics=m, benefit=(0.0, 0.0), unlimited_benefit_s=1.0,
                        feasible=False, significant=False, saturated="P compute", router_settled=settled)


def test_unsettled_router_ttls_are_one_warning_naming_each_ttl() -> None:
    rs = resolve(Scenario.model_validate({"model": "qwen3-32b", "hardware": "p5en"}))
    curve = [_cand(t, t == 60) for t in (10, 30, 60, 120, 480)]  # only 60 s settled
    lines = [w for w in run_warnings(rs, curve) if "did not settle" in w]
    assert len(lines) == 1
    assert lines[0].startswith("router TTL at TTLs 10, 30, 120, 480 s did not settle")
    one = [w for w in run_warnings(rs, [_cand(30, False), _cand(60, True)]) if "did not settle" in w]
    assert one == [w for w in one if w.startswith("router TTL at TTL 30 s did not settle")] and len(one) == 1
    assert not [w for w in run_warnings(rs, [_cand(30, True)]) if "did not settle" in w]
