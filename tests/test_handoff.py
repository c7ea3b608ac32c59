"""``deployment.handoff``: a serialised prefill-to-decode stage between the P and D legs (sim/scenario_handoff.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import small

from kvplan.errors import KvplanInputError
from kvplan.models.arch import kv_bytes_per_token_per_rank
from kvplan.sim.api import run
from kvplan.sim.engine import resolve
from kvplan.sim.scenario import scenario_from_dict


def _burst(handoff: dict[str, Any] | None, clients: int = 3) -> dict[str, Any]:
    # ``clients`` single-turn requests of 2000 prompt tokens sent at once (closed loop, one request per client)
    dep: dict[str, Any] = {"tensor_parallel_size": 8, "max_num_seqs": 64, "prefill_prefix_caching": False}
    if handoff is not None:
        dep["handoff"] = handoff
    return small(
        deployment=dep, policy={"bidirectional": False},
        workload={"conversations": clients, "arrival": {"kind": "closed_loop", "clients": clients,
                                                        "max_active_conversations": clients},
                  "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 2000},
                  "user_tokens": {"dist": "constant", "value": 0}, "output_tokens": {"dist": "constant", "value": 20},
                  "turn_gap_s": {"dist": "constant", "value": 0}},
    )


def _ttft(handoff: dict[str, Any] | None, clients: int = 3) -> np.ndarray:
    t = run(_burst(handoff, clients)).turns
    return np.sort(t["ttft_s"].to_numpy())


def test_handoff_adds_its_cost_to_ttft() -> None:
    base = _ttft(None, clients=1)
    assert _ttft({"fixed_s": 0.5}, clients=1) == pytest.approx(base + 0.5, abs=1e-9)
    # the per-byte part: one copy of the model's KV per prompt token at the stage's bandwidth
    per_token = kv_bytes_per_token_per_rank(resolve(scenario_from_dict(_burst(None))).arch, 1)
    assert _ttft({"bandwidth_bytes_per_s": 1e9}, clients=1) == pytest.approx(base + 2000 * per_token / 1e9, abs=1e-9)


def test_serialised_handoff_queues_concurrent_requests() -> None:
    base = _ttft(None)
    serial = _ttft({"fixed_s": 0.5})
    parallel = _ttft({"fixed_s": 0.5, "serialised": False})
    assert parallel == pytest.approx(base + 0.5, abs=1e-9)  # independent stages: each request pays 0.5 s
    # one at a time: the k-th request through the stage waits for the k-1 before it
    assert np.all(np.diff(serial) > 0.5 - 0.05)
    assert serial[-1] > parallel[-1] + 0.9


def test_handoff_refused_in_aggregated_mode() -> None:
    with pytest.raises(KvplanInputError, match="handoff"):
        scenario_from_dict(small(deployment={"mode": "aggregated", "handoff": {"fixed_s": 0.1}}))
    with pytest.raises(KvplanInputError, match="bandwidth_bytes_per_s"):
        scenario_from_dict(small(deployment={"handoff": {"bandwidth_bytes_per_s": 0}}))


def test_handoff_absent_by_default_and_left_out_of_the_dump() -> None:
    sc = scenario_from_dict(small())
    assert sc.deployment.handoff is None
    assert "handoff" not in sc.model_dump()["deployment"]  # old scenario fingerprints stay


def test_serialised_handoff_is_per_decode_instance() -> None:
    """Each decode instance has its own stage: two requests routed to two D instances do not wait for each other."""

    def ttft(handoff: dict[str, Any]) -> np.ndarray:
        sc = _burst(handoff, clients=2)
        sc["deployment"]["decode_nodes"] = 2  # round-robin: one request per D
        return np.sort(run(sc).turns["ttft_s"].to_numpy())

    serial = ttft({"fixed_s": 2.0})
    parallel = ttft({"fixed_s": 2.0, "serialised": False})
    # one stage for both D instances would make the second request wait ~2 s more
    assert serial == pytest.approx(parallel, abs=1e-9)


def test_lease_lapsing_during_the_handoff_frees_p_at_its_deadline() -> None:
    """A handoff longer than P's kv_lease_duration: D's first heartbeat comes too late, so the lease lapses and P's
    blocks are free at its deadline (P finish + 30 s), not when D finally gets the request (~40 s); the second
    request, waiting for those blocks in a P pool that holds one prompt, starts then."""
    sc = _burst({"fixed_s": 40.0, "serialised": False}, clients=2)
    sc["deployment"]["prefill_kv_capacity_tokens"] = 2100
    sc["policy"]["kv_lease_duration_s"] = 30.0
    t = run(sc).turns.sort_values("prefill_queue_s")
    first, second = t["prefill_queue_s"].to_numpy()
    assert t["p_hold_s"].to_numpy() == pytest.approx([30.0, 30.0])  # both leases lapsed
    p_done = first + t["prefill_s"].to_numpy()[0]  # the first prompt's P finish after its arrival at P
    assert second == pytest.approx(p_done + 30.0, abs=0.02)
