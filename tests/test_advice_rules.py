"""The pure TTL rules of kvplan.plan.advice_rules on hand-made candidates (no simulation)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from kvplan.plan.advice_rules import (
    BENEFIT_FRACTION,
    DECODE_HBM,
    LINK,
    PREFILL_COMPUTE,
    TURN_GAPS,
    Evidence,
    TtlCandidate,
    apply_slo,
    binding_constraint,
    choose_ttl,
    router_ttl,
    significant_gain,
)
from kvplan.sim.seeds import replication_seeds

UNLIMITED_S = 0.100  # unlimited-TTL benefit on mean TTFT (s)


def cand(ttl: float, benefit: float, peak_gib: float = 1.0, p90: float = 0.5, budget: float | None = None,
         ci: float = 0.001) -> TtlCandidate:
    m = {"ttft_p90_s": p90, "ttft_mean_s": 0.4, "hit_rate": 0.5, "pinned_kv_gib_peak": peak_gib,
         "pinned_kv_gib_mean": peak_gib / 2, "d_queue_mean_s": 0.0, "kv_pull_mean_s": 0.01,
         "prefill_utilization": 0.3, "prefill_utilization_steady": 0.3}
    return TtlCandidate(ttl, router_ttl(ttl, 5.0, 1.0), m, (benefit, ci), UNLIMITED_S,
                        budget is None or peak_gib <= budget, significant_gain((benefit, ci), 1.0))


def evidence(curve: list[TtlCandidate], budget: float | None = None, unlimited: float = UNLIMITED_S) -> Evidence:
    return Evidence(curve, 1.0, (unlimited, 0.001), 0.9, budget, "turn gaps p50 60 s", 1000)


def test_shortest_ttl_reaching_the_benefit_fraction() -> None:
    curve = [cand(30, 0.05), cand(60, BENEFIT_FRACTION * UNLIMITED_S + 1e-6), cand(120, 0.099)]
    choice = choose_ttl(evidence(curve))
    assert choice.chosen is curve[1] and not choice.retention_off and choice.binding == TURN_GAPS


def test_budget_excludes_ttls_and_binds_decode_hbm() -> None:
    curve = [cand(30, 0.05, peak_gib=1), cand(60, 0.097, peak_gib=50, budget=10), cand(120, 0.099, peak_gib=80, budget=10)]
    choice = choose_ttl(evidence(curve, budget=10))
    # nothing feasible reaches 95%: the best feasible (30 s) is chosen, and the budget is what binds
    assert choice.chosen is curve[0] and choice.binding == DECODE_HBM


def test_no_material_unlimited_gain_turns_retention_off() -> None:
    choice = choose_ttl(evidence([cand(30, 0.0), cand(60, 0.0)], unlimited=0.001))
    assert choice.chosen is None and choice.retention_off


def test_slo_raises_the_ttl_to_the_shortest_meeting_it() -> None:
    curve = [cand(30, 0.099, p90=0.30), cand(60, 0.099, p90=0.20), cand(120, 0.099, p90=0.10)]
    choice = choose_ttl(evidence(curve))
    assert choice.chosen is curve[0]
    warnings: list[str] = []
    slo = apply_slo(choice, curve, {"ttft_p90_s": 1.0}, 250.0, warnings)
    assert choice.chosen is curve[1] and slo["met"] and warnings == []
    slo = apply_slo(choice, curve, {"ttft_p90_s": 1.0}, 50.0, warnings)
    assert not slo["met"] and len(warnings) == 1


def test_binding_constraint_thresholds() -> None:
    base = {"ttft_mean_s": 1.0, "d_queue_mean_s": 0.0, "kv_pull_mean_s": 0.1, "prefill_utilization_steady": 0.3}
    assert binding_constraint(TURN_GAPS, base, {}, True) == TURN_GAPS
    assert binding_constraint(TURN_GAPS, {**base, "d_queue_mean_s": 0.06}, {}, True) == DECODE_HBM
    assert binding_constraint(TURN_GAPS, {**base, "prefill_utilization_steady": 0.8}, {}, True) == PREFILL_COMPUTE
    assert binding_constraint(TURN_GAPS, {**base, "kv_pull_mean_s": 0.6}, {}, True) == LINK
    assert binding_constraint(TURN_GAPS, {**base, "kv_pull_mean_s": 0.6}, {}, False) == TURN_GAPS


def test_router_ttl_and_significance() -> None:
    assert router_ttl(480, 5.0, 25.0) == 450 and router_ttl(3, 5.0, 1.0) == 1  # floor of 1 s (the rule)
    assert significant_gain((0.02, 0.01), 1.0) and not significant_gain((0.02, 0.03), 1.0)
    assert not significant_gain((0.005, 0.001), 1.0)  # below 1% of the scale
    assert not significant_gain((math.nan, 0.0), 1.0)


def test_replication_seeds_are_spawned_not_shifted() -> None:
    a, b = replication_seeds(3, 50), replication_seeds(4, 50)
    assert a == [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(3).spawn(50)]
    assert len(set(a)) == 50 and not set(a) & set(b)  # seed + k would share 49 of 50 streams
    assert replication_seeds(3, 2) == a[:2]  # replication k's seed does not depend on K


def test_decode_batch_capacity_is_unknown_without_a_steady_window() -> None:
    """ans12: `recommend --trace trace_0019.json` (one weka session, starting at 0: no steady window) reported the
    decode batch capacity at vLLM's defaults as 1024 (max_num_seqs) against 137 without retention: the steady pinned
    KV was NaN and min(max_num_seqs, NaN) returned max_num_seqs, so pins raised the batch capacity. Unknown now."""
    import pytest

    from kvplan.plan.advice_rules import metrics

    row = {"error": None, "steady_pinned_kv_gib_mean": math.nan, "kv_bytes_per_token_all_ranks": 262144.0,
           "decode_kv_capacity_tokens": 3_600_000.0, "mean_request_kv_tokens": 26_000.0}
    assert math.isnan(metrics([row], 1024, 1)["decode_batch_capacity"])
    row0 = {**row, "steady_pinned_kv_gib_mean": 0.0}
    assert metrics([row0], 1024, 1)["decode_batch_capacity"] == pytest.approx(3_600_000 / 26_000)
    # end to end on the bundled weka trace (its sessions start at 0): the defaults' capacity is not above off's
    from pathlib import Path

    from kvplan.plan.advice import recommend

    trace = Path(__file__).resolve().parent / "data" / "traces" / "weka_small.json"
    sc = {"model": "qwen3-32b", "hardware": "p5en", "workload": {"trace": {"path": str(trace)}}}
    hbm = recommend(sc, replications=1, ttl_grid=(30,), workers=1).decode_hbm
    at_defaults, without = hbm["decode_batch_capacity_at_vllm_defaults"], hbm["decode_batch_capacity_without_retention"]
    assert math.isnan(at_defaults) or at_defaults <= without, hbm


def test_every_ttl_saturated_says_a_lower_mean_is_not_significant_rather_than_absent() -> None:
    # 1P1D Llama-3.3-70B TP4 at 1 conversation/s: TTL 30 s measured a mean TTFT of 19.9 s against 56.2 s with
    # bidirectional off (gain 36.3 s +- 80.7 s, 2 replications), and the rationale said "none lowers mean TTFT"
    from dataclasses import replace

    low = replace(cand(30, 36.3, ci=80.7), saturated="decode HBM", saturated_share=1.0)
    low.metrics["ttft_mean_s"] = 19.9
    worse = replace(cand(60, -57.8, ci=128.0), saturated="decode HBM", saturated_share=1.0)
    worse.metrics["ttft_mean_s"] = 114.0
    ev = Evidence([low, worse], 56.2, (0.1, 0.001), 0.9, None, "turn gaps p50 10 s", 0, off_saturated="P compute",
                  replications=2)
    choice = choose_ttl(ev)
    assert choice.chosen is None and choice.retention_off
    text = " ".join(choice.rationale)
    assert "none lowers mean TTFT significantly" in text and "19.90 s against 56.20 s" in text, text
    worst = [replace(c, benefit=(-abs(c.benefit[0]), c.benefit[1])) for c in (low, worse)]
    text = " ".join(choose_ttl(replace(ev, curve=worst)).rationale)
    assert "none lowers mean TTFT against bidirectional off" in text, text


def test_off_saturated_and_every_unsaturated_ttl_over_the_budget_is_the_budget_not_inconclusive() -> None:
    # 2P3D Qwen3-32B p5e TP4, budget 100 GiB: off saturates P compute (mean TTFT 8.56 s), TTL 60 s saturates nothing
    # but peaks at 316 GiB; the advice said "INCONCLUSIVE ... rerun with --replications 4", which no replication
    # count resolves: the budget excludes the only TTL that serves the load
    from dataclasses import replace

    sat = replace(cand(30, 5.0, peak_gib=250, budget=100, ci=10.0), saturated="P compute", saturated_share=1.0)
    over = cand(60, 8.0, peak_gib=316, budget=100, ci=14.0)
    assert not over.feasible and not over.saturated
    ev = Evidence([sat, over], 8.56, (8.10, 14.04), 1.0, 100.0, "turn gaps p50 8 s", 0, off_saturated="P compute",
                  replications=2)
    choice = choose_ttl(ev)
    assert choice.chosen is None and choice.retention_off and choice.binding == DECODE_HBM
    assert not choice.inconclusive
    text = " ".join(choice.rationale)
    assert "100 GiB budget" in text and "TTL 60 s, 316.0 GiB" in text and "INCONCLUSIVE" not in text, text


def test_the_unsaturating_ttl_hint_prefers_the_budget_and_says_when_above_it() -> None:
    # the hint named "TTL 60 s saturates nothing" as the change to make although TTL 60 s was above the budget
    from dataclasses import replace
    from typing import Any, cast

    from kvplan.plan.advice_report import unsaturate_hint
    from kvplan.plan.advice_runs import Saturation

    saturated = Saturation(("prefill_compute",), replications=2)
    tight = cand(30, 5.0, peak_gib=80, budget=100)
    fast = cand(60, 8.0, peak_gib=316, budget=100)
    fast.metrics["ttft_mean_s"], tight.metrics["ttft_mean_s"] = 0.3, 0.5
    hint = unsaturate_hint(cast(Any, None), saturated, [tight, fast])
    assert "TTL 30 s" in hint[0] and "above" not in hint[0], hint
    hint = unsaturate_hint(cast(Any, None), saturated, [replace(tight, feasible=False), fast])
    assert "TTL 60 s" in hint[0] and "316.0 GiB of decode KV, above the decode HBM budget" in hint[0], hint


def test_the_add_nodes_hint_of_a_trace_replay_names_no_preset_rate() -> None:
    """recommend --workload coding-agent --trace <weka folder> said 'xPyD search at 0.005 new conversations/s': the
    preset's Poisson rate, which a replayed trace does not use (its sessions bring their own arrivals)."""
    from pathlib import Path

    from kvplan.plan.advice_report import unsaturate_hint
    from kvplan.plan.advice_runs import Saturation
    from kvplan.sim.engine import resolve
    from kvplan.sim.scenario import scenario_from_dict

    saturated = Saturation(("prefill_compute",), replications=2)
    trace = Path(__file__).resolve().parent / "data" / "traces" / "weka_small.json"
    arrival = {"kind": "poisson", "rate_per_s": 0.005}
    base: dict[str, Any] = {"model": "qwen3-32b", "hardware": "p5en", "workload": {"arrival": arrival}}
    replay = {**base, "workload": {"arrival": arrival, "trace": {"path": str(trace)}}}
    synthetic = unsaturate_hint(resolve(scenario_from_dict(base)), saturated, [])[0]
    assert "xPyD search at 0.005 new conversations/s" in synthetic
    hint = unsaturate_hint(resolve(scenario_from_dict(replay)), saturated, [])[0]
    assert "0.005" not in hint and "xPyD search at the trace's own arrivals" in hint, hint
