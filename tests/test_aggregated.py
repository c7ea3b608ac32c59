"""Aggregated serving (one vLLM engine per replica doing both phases) and KV-aware routing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import full_costs, small

from kvplan.models.costs import DecodeCost, PrefillCost, mixed_step_time_s
from kvplan.sim.api import run
from kvplan.sim.engine import simulate
from kvplan.sim.results import turns_csv_bytes
from kvplan.sim.scenario import scenario_from_dict


def _agg(deployment: dict[str, Any] | None = None, **over: Any) -> dict[str, Any]:
    dep = {"mode": "aggregated", "replicas": 2, "max_num_seqs": 64, "prefill_prefix_caching": True, **(deployment or {})}
    return small(deployment=dep, **over)


def _mm1(rho: float, n: int, seed: int) -> float:
    sc = {
        "deployment": {"mode": "aggregated", "replicas": 1, "max_num_seqs": 1, "prefill_prefix_caching": False,
                       "max_num_batched_tokens": 2**17},
        "workload": {"conversations": n, "arrival": {"kind": "poisson", "rate_per_s": rho / 0.1},
                     "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "exponential", "mean": 1000},
                     "user_tokens": {"dist": "constant", "value": 0}, "output_tokens": {"dist": "constant", "value": 1}},
        # a pure per-token cost: every other parameter 0 (inline costs override only what they name)
        "costs": full_costs(transfer={}, decode={}, overhead={}, prefill={"per_token_s": 1e-4}),
        "seed": seed,
    }
    return float(run(sc).turns["prefill_queue_s"].mean())


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_aggregated_mm1_mean_wait(rho: float) -> None:
    # one replica, no prefix caching, single-turn Poisson arrivals, exponential work at a pure per-token cost
    waits = [_mm1(rho, 60_000, seed) for seed in (21, 22)]
    assert np.mean(waits) == pytest.approx(rho * 0.1 / (1 - rho), rel=0.05)


def test_mixed_batches_obey_the_token_budget() -> None:
    budget = 512
    sc = scenario_from_dict(_agg({"replicas": 1, "max_num_batched_tokens": budget},
                                 workload={**small()["workload"], "arrival": {"kind": "poisson", "rate_per_s": 2.0}}))
    _rs, _plan, ctx = simulate(sc)
    node = ctx.replicas[0]
    assert node.max_step_tokens == budget  # long prompts are chunked to exactly the budget, never beyond
    assert node.mixed_steps > 0  # decode tokens and prefill chunks did share steps
    t = run(sc).turns
    assert (t["prompt_tokens"] == t["local_hit_tokens"] + t["recomputed_tokens"]).all()
    assert (t["ttft_s"] > 0).all() and (t["finish_s"] >= t["arrival_s"] + t["ttft_s"]).all()


def test_mixed_step_cost_form() -> None:
    p = PrefillCost(fixed_s=0.01, per_token_s=1e-5, attention_s=1e-9)
    d = DecodeCost(fixed_s=0.02, per_seq_s=1e-4, per_context_token_s=1e-8)
    assert mixed_step_time_s(p, d, 0, 0, 4, 1000) == pytest.approx(0.02 + 4e-4 + 1e-5)
    assert mixed_step_time_s(p, d, 100, 5000, 4, 1000) == pytest.approx(0.01 + 1e-3 + 5e-6 + 4e-4 + 1e-5)


def test_aggregated_reproducible_and_routing_changes_hits() -> None:
    a = run(_agg({"routing": "prefix_aware"}))
    b = run(_agg({"routing": "prefix_aware"}))
    assert turns_csv_bytes(a.turns) == turns_csv_bytes(b.turns)
    rr = run(_agg({"routing": "round_robin"}))
    aff = run(_agg({"routing": "session_affinity"}))
    # with 2 replicas round-robin lands about half of the follow-ups on the other replica's cold cache
    assert a.summary["hit_rate"] > rr.summary["hit_rate"] + 0.2
    assert aff.summary["hit_rate"] > rr.summary["hit_rate"] + 0.2
    assert a.summary["errors"] == 0 and a.summary["pins"] == 0


def test_pd_session_affinity_hits_p_prefix_cache() -> None:
    dep = {"prefill_nodes": 2, "decode_nodes": 2, "max_num_seqs": 64, "prefill_prefix_caching": True}
    pol = {"bidirectional": False}
    rr = run(small(deployment={**dep, "routing": "round_robin"}, policy=pol)).turns
    for routing in ("session_affinity", "prefix_aware"):
        kv = run(small(deployment={**dep, "routing": routing}, policy=pol)).turns
        follow_rr, follow_kv = rr[rr["turn"] >= 2], kv[kv["turn"] >= 2]
        assert (follow_kv["local_hit_tokens"] > 0).mean() > (follow_rr["local_hit_tokens"] > 0).mean() + 0.2


def test_request_larger_than_a_replica_pool_is_an_input_error() -> None:
    from kvplan.errors import KvplanInputError

    with pytest.raises(KvplanInputError, match="decode_kv_capacity_tokens"):
        run(_agg({"decode_kv_capacity_tokens": 1024}))


def test_aggregated_refuses_split_tp() -> None:
    from kvplan.errors import KvplanInputError

    with pytest.raises(KvplanInputError, match="decode_tensor_parallel_size"):
        run(_agg({"decode_tensor_parallel_size": 4}))
