"""Decode/prefill memory fidelity (issue 10): block pool invariants, growth and preemption, P leases, NICs, TP."""

from __future__ import annotations

from typing import Any

import numpy as np
from conftest import small

from kvplan.sim.api import run
from kvplan.sim.engine import simulate
from kvplan.sim.events import Ev
from kvplan.sim.scenario import scenario_from_dict


def _sim(sc: dict[str, Any]) -> Any:
    _rs, _plan, ctx = simulate(scenario_from_dict(sc))
    return ctx


def test_block_pool_never_negative_and_drains() -> None:
    """free >= 0 after every allocation; at the end nothing is held or pinned, every block is free or cached."""
    for dep in ({"decode_kv_capacity_tokens": 30_000, "max_num_seqs": 16}, {"decode_nodes": 2}):
        ctx = _sim(small(deployment={"prefill_prefix_caching": False, **dep}))
        for dn in ctx.decode:
            pool = dn.pool
            assert pool.min_free >= 0
            assert pool.held == 0 and pool.pinned == 0
            assert pool.cached == sum(b for _, b in pool.cache.values())
            assert pool.free() + pool.cached == pool.capacity
            assert not dn.retention.pins


def _pressure(pool_tokens: int, mode: str = "fast", **over: Any) -> dict[str, Any]:
    """Acceptance 1's workload: 1,024-token prompts, outputs of 4 x the prompt, D pool of ``pool_tokens``."""
    wl = {
        "conversations": 40, "arrival": {"kind": "closed_loop", "clients": 40, "max_active_conversations": 40},
        "turns": {"dist": "constant", "value": 1},
        "prefix_tokens": {"dist": "constant", "value": 1024}, "user_tokens": {"dist": "constant", "value": 0},
        "output_tokens": {"dist": "constant", "value": 4096},
    }
    dep = {
        "decode_kv_capacity_tokens": pool_tokens, "max_num_seqs": 64, "prefill_prefix_caching": False,
        "max_num_batched_tokens": 65536,
    }
    return small(workload=wl, deployment=dep, policy={"bidirectional": False}, simulation={"decode_mode": mode}, **over)


def _max_concurrent(ev: Any, kind_in: Ev, kind_out: Ev) -> int:
    e = ev[ev["kind"].isin([int(kind_in), int(kind_out)])].sort_values("t_s", kind="stable")
    return int((e["kind"].map({int(kind_in): 1, int(kind_out): -1})).cumsum().max())


def test_per_step_growth_admits_more_and_preempts_newest() -> None:
    """Acceptance 1: admission needs only the prompt, so 10 prompts' worth of pool decodes 10 at once (reserving
    prompt + output would fit 2); growth then preempts, every preempted request still finishes with its tokens."""
    r = run(_pressure(10 * 1024))
    ev, t = r.events, r.turns
    assert _max_concurrent(ev, Ev.D_ADMIT, Ev.D_FINISH) == 10
    pre = ev[ev["kind"] == int(Ev.D_PREEMPT)]
    assert r.summary["d_preemptions"] == len(pre) > 0
    assert r.summary["d_preempted_recompute_tokens"] > 0
    assert t["d_preemptions"].sum() == len(pre)
    assert (t["finish_s"].notna()).all() and len(t) == 40
    fin = ev[ev["kind"] == int(Ev.D_FINISH)].set_index("conv")["a"]
    assert (fin == 4096).all()
    # conservation: each readmission recomputes exactly the tokens it had (prompt + sampled) minus what survived
    rec = ev[ev["kind"] == int(Ev.D_RECOMPUTE)].reset_index(drop=True)
    pre = pre.reset_index(drop=True)
    for conv, p in pre.groupby("conv"):
        rc = rec[rec["conv"] == conv]
        assert len(rc) == len(p)
        np.testing.assert_array_equal(rc["a"].to_numpy() + rc["b"].to_numpy(), 1024 + p["a"].to_numpy())
    # the newest running request is the one preempted: nobody admitted earlier is preempted while a later one runs
    assert (pre["a"] < 4096).all()
    big = run(_pressure(1_000_000))
    assert big.summary["d_preemptions"] == 0 and big.turns["d_preemptions"].sum() == 0


def test_fast_and_exact_agree_with_preemption() -> None:
    """Acceptance 5: the closed-form jumps stop where the pool runs out and give the exact per-step times."""
    for pool, caching in ((10 * 1024, True), (7 * 1024 + 100, False)):
        dep = {"decode_prefix_caching": caching}
        fast = run(_pressure(pool))
        exact = run(_pressure(pool, "exact"))
        assert fast.summary["d_preemptions"] == exact.summary["d_preemptions"] > 0, dep
        for col in ("ttft_s", "finish_s", "first_decode_s", "d_queue_s"):
            np.testing.assert_allclose(fast.turns[col], exact.turns[col], rtol=0, atol=1e-7)
        assert (fast.turns["d_preemptions"] == exact.turns["d_preemptions"]).all()
        ctx = _sim(_pressure(pool, "exact"))
        assert ctx.decode[0].pool.min_free >= 0
