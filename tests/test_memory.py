"""Decode/prefill memory fidelity (issue 10): block pool invariants, growth and preemption, P leases, NICs, TP."""

from __future__ import annotations

from typing import Any

from conftest import small

from kvplan.sim.engine import simulate
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
