"""One composition of a pull's cost (sim/xfer.py ``read_phases``) for the simulator, the screen and break-even.

Heterogeneous TP (vLLM PR #27274): P at TP 4 reads D's blocks at TP 8; with Qwen3-32B's 8 KV heads each P rank
reads from two D ranks, so it posts twice the descriptors and receives twice the bytes of one TP-8 rank.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from kvplan.models.arch import kv_bytes_per_token_all_ranks, kv_bytes_per_token_per_rank, kv_regions_per_rank
from kvplan.plan.breakeven import break_even
from kvplan.plan.screen import _pull_s, screen_point
from kvplan.sim.engine import resolve
from kvplan.sim.pull import read_path
from kvplan.sim.scenario import scenario_from_dict


def _scenario(prefill_tp: int | None) -> Any:
    dep: dict[str, Any] = {"max_num_seqs": 64, "prefill_prefix_caching": False, "tensor_parallel_size": 8}
    if prefill_tp is not None:
        dep["prefill_tensor_parallel_size"] = prefill_tp
    return scenario_from_dict({
        "model": "qwen3-32b", "hardware": "p5en", "deployment": dep,
        "workload": {"conversations": 4, "turns": {"dist": "constant", "value": 2},
                     "prefix_tokens": {"dist": "constant", "value": 3000},
                     "user_tokens": {"dist": "constant", "value": 100},
                     "output_tokens": {"dist": "constant", "value": 50},
                     "turn_gap_s": {"dist": "constant", "value": 5.0}},
        "seed": 1,
    })


def _by_hand(sc: Any, n: int, sources: int, reader_tp: int) -> float:
    """prep + xferDuration (fixed, per descriptor, per byte at the link's rate) + poll, from the profile."""
    rs = resolve(sc)
    tc = rs.costs.transfer
    desc = kv_regions_per_rank(rs.arch, False) * math.ceil(n / rs.arch.block_size_tokens) * sources
    nbytes = n * kv_bytes_per_token_per_rank(rs.arch, reader_tp)
    return (tc.prep_fixed_s + tc.prep_per_descriptor_s * desc + tc.fixed_s + tc.per_descriptor_s * desc
            + rs.per_byte_s * nbytes + tc.poll_s)


def test_heterogeneous_tp_pull_in_break_even_and_screen() -> None:
    homo, hetero = _scenario(None), _scenario(4)
    read = read_path(hetero, resolve(hetero))
    assert read.plan.sources_per_reader == 2 and read.plan.reader_tp == 4 and read.plan.source_tp == 8
    n = 3000
    assert read.time_s(n) == pytest.approx(_by_hand(hetero, n, 2, 4), rel=1e-12)
    assert read_path(homo, resolve(homo)).time_s(n) == pytest.approx(_by_hand(homo, n, 1, 8), rel=1e-12)
    # break-even prices the pull with the rank plan (it used TP 8's bytes and descriptors before)
    be = break_even(resolve(hetero), local_prefix_tokens=0, tail_tokens=100, max_tokens=4096)
    assert be.pull_s == pytest.approx(_by_hand(hetero, min(be.tokens, 4096), 2, 4), rel=1e-12)
    # the screen too
    p = screen_point(hetero, {})
    assert float(_pull_s(p, np.array([float(n)]))[0]) == pytest.approx(_by_hand(hetero, n, 2, 4), rel=1e-12)
    assert _by_hand(hetero, n, 2, 4) > 1.5 * _by_hand(homo, n, 1, 8) - 1e-3  # the plan matters here


def test_screen_prices_each_role_at_its_own_tp() -> None:
    """P's prefill (recompute) at P's TP, D's decode, pool and pinned KV at D's, as the simulator (sim/engine.py
    ``resolve_roles``); the screen took all of them from ``deployment.tensor_parallel_size`` before."""
    hetero = _scenario(4)  # P at TP 4 reading D at TP 8
    p4 = resolve(scenario_from_dict({**hetero.model_dump(mode="json"),
                                     "deployment": {**hetero.deployment.model_dump(mode="json"),
                                                    "tensor_parallel_size": 4, "prefill_tensor_parallel_size": None}}))
    r8 = resolve(hetero)
    assert p4.costs.prefill != r8.costs.prefill  # TP matters for this profile
    p = screen_point(hetero, {})
    assert p.costs.prefill == p4.costs.prefill and p.costs.overhead == p4.costs.overhead
    assert p.costs.decode == r8.costs.decode and p.decode_capacity_tokens == r8.decode_capacity_tokens
    # D at TP 4 under a shared TP 8: D's pool and KV bytes are TP 4's, P's prefill TP 8's
    sc = scenario_from_dict({**hetero.model_dump(mode="json"),
                             "deployment": {**hetero.deployment.model_dump(mode="json"),
                                            "prefill_tensor_parallel_size": None, "decode_tensor_parallel_size": 4}})
    q = screen_point(sc, {})
    assert q.decode_capacity_tokens == p4.decode_capacity_tokens != r8.decode_capacity_tokens
    assert q.costs.decode == p4.costs.decode and q.costs.prefill == r8.costs.prefill
    assert q.kv_bytes_per_token_all == kv_bytes_per_token_all_ranks(r8.arch, 4)


def test_read_path_directions_match_the_simulators_plans_and_readers() -> None:
    """P2D: D's ranks read P's with D's costs; D2P: P's read D's with P's (sim/context.py ``plans``, sim/xfer.py
    ``Reads.cost``); ``cross_layer`` overrides the deployment's layout."""
    from kvplan.sim.request import D2P, P2D
    from kvplan.sim.tp import rank_plan

    hetero = _scenario(4)
    rs = resolve(hetero)
    p4 = resolve(scenario_from_dict({**hetero.model_dump(mode="json"),
                                     "deployment": {**hetero.deployment.model_dump(mode="json"),
                                                    "tensor_parallel_size": 4, "prefill_tensor_parallel_size": None}}))
    p2d, d2p = read_path(hetero, rs, P2D), read_path(hetero, rs, D2P)
    assert p2d.plan == rank_plan(rs.arch, 8, 4) and d2p.plan == rank_plan(rs.arch, 4, 8) and p2d.plan != d2p.plan
    assert p2d.reader.costs == rs.costs and p2d.cost == rs.costs.transfer
    assert d2p.reader.costs.prefill == p4.costs.prefill and d2p.cost == p4.costs.transfer
    assert read_path(hetero, rs, cross_layer=True).regions == kv_regions_per_rank(rs.arch, True) < d2p.regions


def test_unloaded_service_time_prices_each_role_at_its_own_tp() -> None:
    """``kvplan workload``'s service time (sim/service.py): P's prefill at P's TP, D's decode at D's."""
    from kvplan.models.costs import decode_steps_time_s, prefill_time_s
    from kvplan.sim.request import P2D
    from kvplan.sim.service import unloaded_service_time_fn

    hetero = _scenario(4)
    rs = resolve(hetero)
    p4 = resolve(scenario_from_dict({**hetero.model_dump(mode="json"),
                                     "deployment": {**hetero.deployment.model_dump(mode="json"),
                                                    "tensor_parallel_size": 4, "prefill_tensor_parallel_size": None}}))
    chunk = hetero.deployment.max_num_batched_tokens
    want = (p4.costs.overhead.p_leg_s + p4.costs.overhead.d_leg_s + prefill_time_s(p4.costs.prefill, 3000, 0, chunk)
            + read_path(hetero, rs, P2D).time_s(3000) + decode_steps_time_s(rs.costs.decode, 1, 3000, 50))
    got = float(unloaded_service_time_fn(hetero)(np.array([3000]), np.array([50]))[0])
    assert got == pytest.approx(want, rel=1e-12)
    p_tp4, p_tp8 = (prefill_time_s(r.costs.prefill, 3000, 0, chunk) for r in (p4, rs))
    assert p_tp4 != pytest.approx(p_tp8)  # the roles' TP matter here


def test_conversation_span_estimate_decodes_at_ds_tp() -> None:
    """recommend's steady-state span estimate (plan/advice_runs.py) decodes on D's profile (its own TP)."""
    from kvplan.plan.advice_runs import conversation_span_estimate_s

    homo = _scenario(None)
    d4 = scenario_from_dict({**homo.model_dump(mode="json"),
                             "deployment": {**homo.deployment.model_dump(mode="json"), "decode_tensor_parallel_size": 4}})
    tp4 = scenario_from_dict({**homo.model_dump(mode="json"),
                              "deployment": {**homo.deployment.model_dump(mode="json"), "tensor_parallel_size": 4}})
    span = conversation_span_estimate_s
    assert span(resolve(d4)) == pytest.approx(span(resolve(tp4)), rel=1e-12)
    assert span(resolve(d4)) != pytest.approx(span(resolve(homo)), rel=1e-6)
