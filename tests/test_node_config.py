"""Each node gets the right slice of the scenario (sim/node_setup.py): one field per knob, per mode and role.

Every knob is set away from its default and away from its sibling (P's vs D's prefix caching, P's vs D's TP,
the proxy's two legs), so a slice that reads the wrong one fails here even where the default runs agree.
"""

from __future__ import annotations

from conftest import small

from kvplan.models.arch import kv_bytes_per_token_all_ranks
from kvplan.sim.engine import simulate
from kvplan.sim.scenario import scenario_from_dict

_TINY = {"conversations": 2, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
         "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 300},
         "user_tokens": {"dist": "constant", "value": 10}, "output_tokens": {"dist": "constant", "value": 5},
         "turn_gap_s": {"dist": "constant", "value": 1.0}}


def test_aggregated_replica_and_its_one_leg() -> None:
    sc = scenario_from_dict(small(
        deployment={"mode": "aggregated", "replicas": 2, "prefill_prefix_caching": False, "decode_prefix_caching": True,
                    "kv_watermark": 0.05},
        costs={"overhead": {"p_leg_s": 0.011, "d_leg_s": 0.023}}, workload=_TINY))
    rs, _, ctx = simulate(sc, keep=False)
    node = ctx.replicas[0]
    assert node.pool.caching is False  # the engine's enable_prefix_caching: P's knob
    assert node.watermark_blocks == int(0.05 * ctx.decode_capacity_blocks)
    # one leg: proxy -> engine and the first streamed chunk back (the D leg's cost), no second leg
    assert ctx.driver.p_leg == 0.023 and ctx.driver.d_leg == 0.0


def test_disaggregated_slices_per_role() -> None:
    sc = scenario_from_dict(small(
        deployment={"prefill_prefix_caching": True, "decode_prefix_caching": False, "tensor_parallel_size": 4,
                    "prefill_tensor_parallel_size": 2, "decode_tensor_parallel_size": 4, "max_num_seqs": 64},
        simulation={"decode_mode": "exact"},
        costs={"overhead": {"p_leg_s": 0.011, "d_leg_s": 0.023}}, workload=_TINY))
    rs, _, ctx = simulate(sc, keep=False)
    p, d = ctx.prefill[0], ctx.decode[0]
    assert p.pool.caching is True and d.caching is False and d.pool.caching is False
    assert d.batch.exact is True
    assert ctx.driver.p_leg == 0.011 and ctx.driver.d_leg == 0.023
    # P's KV bytes at P's TP, D's cost model at D's TP
    assert p.bytes_per_block == kv_bytes_per_token_all_ranks(rs.arch, 2) * rs.arch.block_size_tokens
    rs_p, rs_d = ctx.roles
    assert p.costs == rs_p.costs.prefill and d.costs == rs_d.costs and rs_p.costs != rs_d.costs
    assert p.pool.capacity == rs_p.prefill_capacity_tokens // rs.arch.block_size_tokens
    assert d.pool.capacity == rs_d.decode_capacity_tokens // rs.arch.block_size_tokens
