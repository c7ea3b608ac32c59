"""'raise --conversations' says to how many (helper new15: recommend, compare and the vLLM-defaults column told a
newcomer only 'raise --conversations', or 'to at least (480 s + p90 conversation span) of arrivals', a sum to do by
hand from figures the output never printed)."""

from __future__ import annotations

import math

from kvplan.plan.advice_report import run_warnings
from kvplan.plan.advice_rules import TtlCandidate
from kvplan.plan.advice_runs import conversations_for_steady, raise_conversations_fix, steady
from kvplan.sim.engine import resolve
from kvplan.sim.scenario import Scenario


def _rows(arrival: float, span: float, n: int = 2) -> list[dict]:
    return [{"arrival_span_s": arrival, "conversation_span_p90_s": span + k} for k in range(n)]


def test_count_makes_the_runs_steady_at_the_same_rate() -> None:
    rows = _rows(200.0, 100.0)  # 40 conversations over 200 s; TTL 480 + span 101 s (the worse replication)
    n = conversations_for_steady(rows, 480.0, 40)
    assert n == math.ceil(40 * 581 / 200)
    scaled = [{**r, "arrival_span_s": r["arrival_span_s"] * n / 40} for r in rows]  # same rate, n conversations
    assert steady(scaled, 480.0)
    fewer = [{**r, "arrival_span_s": r["arrival_span_s"] * (n - 1) / 40} for r in rows]
    assert not steady(fewer, 480.0)


def test_no_spans_no_number() -> None:
    assert conversations_for_steady([{"error": "boom"}], 60.0, 40) is None
    assert raise_conversations_fix([], 60.0, 40) == "raise --conversations"
    fix = raise_conversations_fix(_rows(100.0, 50.0), 60.0, 40)  # 40 x (60 + 51) / 100 = 44.4
    assert fix.startswith("raise --conversations to at least 45 ")


def _cand(ttl: float) -> TtlCandidate:
    m = {"pinned_kv_gib_mean": math.nan, "ttft_mean_s": 1.0, "ttft_p90_s": 2.0, "hit_rate": 0.5,
         "pinned_kv_gib_peak": math.nan}
    return TtlCandidate(ttl_s=ttl, router_ttl_s=int(ttl) - 6, metrics=m, benefit=(0.0, 0.0), unlimited_benefit_s=1.0,
                        feasible=True, significant=False, steady=False)


def test_recommend_warning_names_the_count_for_its_longest_short_ttl() -> None:
    rs = resolve(Scenario.model_validate({"model": "qwen3-32b", "hardware": "p5en",
                                          "workload": {"conversations": 40}}))
    rows_at = {60.0: _rows(200.0, 100.0), 300.0: _rows(200.0, 100.0)}
    (line,) = [w for w in run_warnings(rs, [_cand(60), _cand(300)], rows_at) if "too short" in w]
    assert line.endswith(f"raise --conversations to at least {math.ceil(40 * 401 / 200)} (from 40: arrivals spanning "
                         "TTL 300 s + the p90 conversation span at the same rate)")
