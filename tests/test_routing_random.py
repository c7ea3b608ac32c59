"""``deployment.routing: random`` (a Kubernetes ClusterIP Service: kube-proxy picks a backend at random per connection)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import full_costs

from kvplan.sim.api import run
from kvplan.sim.node_config import RouterConfig
from kvplan.sim.results import turns_csv_bytes
from kvplan.sim.router import Router, router_seed


def _replicas(routing: str, n: int = 4000, seed: int = 5) -> dict[str, Any]:
    # 3 replicas serving one request at a time, 0.1 s of work each (1000 tokens at a pure per-token cost), Poisson
    # arrivals at 70% of the replicas' capacity
    return {
        "deployment": {"mode": "aggregated", "replicas": 3, "max_num_seqs": 1, "prefill_prefix_caching": False,
                       "max_num_batched_tokens": 2**17, "routing": routing},
        "workload": {"conversations": n, "arrival": {"kind": "poisson", "rate_per_s": 0.7 * 3 / 0.1},
                     "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 1000},
                     "user_tokens": {"dist": "constant", "value": 0}, "output_tokens": {"dist": "constant", "value": 1}},
        "costs": full_costs(transfer={}, decode={}, overhead={}, prefill={"per_token_s": 1e-4}),
        "seed": seed,
    }


def test_random_routing_queues_more_than_round_robin() -> None:
    rr = run(_replicas("round_robin")).turns["prefill_queue_s"].mean()
    rnd = run(_replicas("random")).turns["prefill_queue_s"].mean()
    # random: each replica is an M/D/1 queue, mean wait rho S / (2 (1 - rho)) = 0.117 s; round-robin thins the
    # Poisson stream into Erlang-3 gaps per replica, which wait less (E3/D/1)
    assert rnd == pytest.approx(0.7 * 0.1 / (2 * 0.3), rel=0.15)
    assert rr < 0.6 * rnd


def test_random_routing_reproducible_uniform_and_its_own_stream() -> None:
    a, b = run(_replicas("random", n=600)), run(_replicas("random", n=600))
    assert turns_csv_bytes(a.turns) == turns_csv_bytes(b.turns)
    # the same workload draws as round-robin (the router has its own stream): identical arrivals and prompts
    rr = run(_replicas("round_robin", n=600)).turns
    assert np.array_equal(rr["arrival_s"].to_numpy(), a.turns["arrival_s"].to_numpy())
    r = Router(RouterConfig(450.0, "random", 4, 2, seed=3))
    picks = np.array([r.pick_prefill(c) for c in range(8000)])
    counts = np.bincount(picks, minlength=4)
    chi2 = float(((counts - 2000) ** 2 / 2000).sum())
    assert chi2 < 16.3  # uniform: the chi-square (3 degrees of freedom) 99.9% quantile
    assert not np.all(np.diff(picks[:50]) % 4 == 1)  # not a cycle
    assert all(0 <= r.pick_decode(c) < 2 for c in range(100))
    assert router_seed(0) != router_seed(1) and router_seed(7) != 7


def test_random_routing_draws_follow_the_run_seed() -> None:
    """The router's stream is derived from the run's seed: another seed gives other picks (the workload here has no
    random draws, so only the routing differs), the same seed the same picks."""

    def nodes(seed: int) -> list[int]:
        sc = _replicas("random", n=60, seed=seed)
        sc["workload"]["arrival"] = {"kind": "closed_loop", "clients": 60, "max_active_conversations": 60}
        return run(sc).turns.sort_values("conversation_id")["p_node"].tolist()

    assert nodes(1) == nodes(1)
    assert nodes(1) != nodes(2)
