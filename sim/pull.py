"""A scenario's P<->D reads as the simulator composes them, for the analytic screen, break-even and estimates.

The reader pays (``nixl/pull_scheduler.py``): on a follow-up turn P's ranks read D's blocks (``D2P``) with P's
NIXL costs; on the P->D leg D's ranks read P's (``P2D``) with D's. Each goes through the rank plan of
heterogeneous TP (``nixl/tp_mapping.py``, vLLM PR #27274; :func:`kvplan.sim.tp.rank_plan`) at the link's line
rate. The cost is :func:`kvplan.sim.xfer.read_phases` / :func:`~kvplan.sim.xfer.read_time_s`, the one
composition the simulator's :meth:`~kvplan.sim.xfer.Reads.start` runs; here on an idle link, no handshake.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.models.arch import kv_regions_per_rank
from kvplan.models.costs import TransferCost
from kvplan.sim.engine import Resolved, resolve_roles
from kvplan.sim.request import D2P, P2D
from kvplan.sim.scenario import Scenario
from kvplan.sim.tp import RankPlan, rank_plan
from kvplan.sim.xfer import read_phases, read_time_s


@dataclass(frozen=True)
class ReadPath:
    """One direction's reads of a scenario: the reader's costs, the link's rate, the rank plan, the reader."""

    cost: TransferCost  # the reader's NIXL costs (the reader pays)
    per_byte_s: float  # the link's line rate, as the simulator's links
    plan: RankPlan  # the reader's ranks reading the source's
    regions: int  # KV regions per rank
    block_size: int
    reader: Resolved  # the reader's resolution at its own TP (P's prices the recompute side of a D->P pull)

    def phases(self, tokens: int) -> tuple[int, float, float, float, float]:
        """:func:`~kvplan.sim.xfer.read_phases` of ``tokens`` tokens (descriptors per reader rank, bytes through
        the busiest NIC, post, xferDuration without the bandwidth phase, unshared latency)."""
        return read_phases(self.cost, self.plan, self.regions, self.block_size, tokens)

    def time_s(self, tokens: int) -> float:
        """Request-visible time of reading ``tokens`` tokens on an idle link, no handshake."""
        return read_time_s(self.cost, self.per_byte_s, self.plan, self.regions, self.block_size, tokens)


def read_path(sc: Scenario, rs: Resolved, direction: int = D2P, cross_layer: bool | None = None) -> ReadPath:
    """The :class:`ReadPath` of ``sc`` in ``direction`` (``D2P``: the follow-up pull, ``P2D``: the D leg's read);
    ``rs`` is ``sc`` resolved at ``deployment.tensor_parallel_size``; ``cross_layer`` overrides
    ``deployment.cross_layer_blocks``."""
    rs_p, rs_d = resolve_roles(sc, rs)
    dep = sc.deployment
    p_tp = dep.prefill_tensor_parallel_size or dep.tensor_parallel_size
    d_tp = dep.decode_tensor_parallel_size or dep.tensor_parallel_size
    reader, plan = (rs_p, rank_plan(rs.arch, p_tp, d_tp)) if direction != P2D else (rs_d, rank_plan(rs.arch, d_tp, p_tp))
    cross = dep.cross_layer_blocks if cross_layer is None else cross_layer
    return ReadPath(reader.costs.transfer, rs_d.per_byte_s, plan, kv_regions_per_rank(rs.arch, cross),
                    rs.arch.block_size_tokens, reader)
