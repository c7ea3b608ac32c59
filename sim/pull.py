"""A follow-up turn's D->P pull as the simulator composes it, for the closed-form screen and break-even.

The reader pays (``nixl/pull_scheduler.py``): P's ranks read D's blocks with P's NIXL costs, through the rank
plan of heterogeneous TP (``nixl/tp_mapping.py``, vLLM PR #27274; :func:`kvplan.sim.tp.rank_plan`), at the
link's line rate. The time is :func:`kvplan.sim.xfer.read_time_s`, the composition the simulator's
:meth:`~kvplan.sim.xfer.Reads.start` runs, on an idle link and without the one-off handshake.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.models.arch import kv_regions_per_rank
from kvplan.models.costs import TransferCost
from kvplan.sim.engine import Resolved, _resolve_roles
from kvplan.sim.scenario import Scenario
from kvplan.sim.tp import RankPlan, rank_plan
from kvplan.sim.xfer import read_time_s


@dataclass(frozen=True)
class FollowUpRead:
    """The D->P read of one scenario: the reader's costs, the link's rate, the rank plan, and P's resolution."""

    cost: TransferCost  # P's NIXL costs (the reader pays)
    per_byte_s: float  # the link's line rate, as the simulator's links
    plan: RankPlan  # P's ranks reading D's
    regions: int  # KV regions per rank
    block_size: int
    prefill: Resolved  # P's resolution at its own TP (its profile prices the recompute side)

    def time_s(self, tokens: int) -> float:
        """Request-visible time of pulling ``tokens`` tokens on an idle link, no handshake."""
        return read_time_s(self.cost, self.per_byte_s, self.plan, self.regions, self.block_size, tokens)


def follow_up_read(sc: Scenario, rs: Resolved) -> FollowUpRead:
    """The :class:`FollowUpRead` of ``sc`` (``rs``: its resolution at ``deployment.tensor_parallel_size``)."""
    rs_p, rs_d = _resolve_roles(sc, rs)
    dep = sc.deployment
    p_tp = dep.prefill_tensor_parallel_size or dep.tensor_parallel_size
    d_tp = dep.decode_tensor_parallel_size or dep.tensor_parallel_size
    return FollowUpRead(
        rs_p.costs.transfer, rs_d.per_byte_s, rank_plan(rs.arch, p_tp, d_tp),
        kv_regions_per_rank(rs.arch, dep.cross_layer_blocks), rs.arch.block_size_tokens, rs_p,
    )
