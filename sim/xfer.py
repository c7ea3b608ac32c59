"""Starting a NIXL READ between a P and a D: descriptors, bytes through the busiest NIC, latency phases.

Owned by :class:`~kvplan.sim.context.Ctx` (``ctx.reads``) and compiled with the other hot modules
(sim/native.py). The NIXL semantics are those
of models/costs.py: the reader pays request creation (``prep``, before NIXL's timer), xferDuration
(fixed + per descriptor + per byte, the post inside it) and the step-boundary ``poll_s``; the one-off
handshake the first time a reader contacts that remote engine (``pull_worker.start_load_kv``). The
reader's engine thread is busy creating and posting the read (``prep + post``), and over UCX's TCP transport
(``deployment.kv_transport: tcp``) moving its bytes too (``thread_per_byte_s``); the handshake runs in
vLLM's background handshake thread (``_background_nixl_handshake``), not on the engine thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from kvplan.models.formulas import NativeTransfer, TransferParams
from kvplan.sim.clock import call_later
from kvplan.sim.link import Link
from kvplan.sim.request import D2P, HOST2P, P2D

_NODES: Final = 1 << 20  # Reads' int key of a link holds D's index below this (larger ones are not cached)


class ReadCost:
    """One direction's READ cost: the reader's transfer costs (a typed copy), the rank plan's per-token figures,
    the regions per rank and the block size. :meth:`phases` is the one composition of a read (:func:`read_phases`);
    :class:`Reads` keeps one per direction (compiled: typed reads, no lookup by name per read)."""

    __slots__ = ("tc", "sources_per_reader", "bottleneck_bytes_per_token", "total_bytes_per_token", "regions",
                 "block_size")

    def __init__(self, tc: TransferParams, plan: Any, regions: int, block_size: int) -> None:
        self.tc: NativeTransfer = tc if isinstance(tc, NativeTransfer) else NativeTransfer(tc)
        self.sources_per_reader: int = plan.sources_per_reader
        self.bottleneck_bytes_per_token: int = plan.bottleneck_bytes_per_token
        self.total_bytes_per_token: int = plan.total_bytes_per_token
        self.regions = regions
        self.block_size = block_size

    def phases(self, tokens: int) -> tuple[int, float, float, float, float]:
        """:func:`read_phases` of ``tokens`` tokens."""
        tc = self.tc
        desc = self.regions * (-(-tokens // self.block_size)) * self.sources_per_reader
        nbytes = float(tokens * self.bottleneck_bytes_per_token)
        lat_x = tc.xfer_time_s(0.0, desc)
        return desc, nbytes, tc.post_time_s(desc), lat_x, tc.prep_time_s(desc) + lat_x


def read_phases(
    tc: TransferParams, plan: Any, regions: int, block_size: int, tokens: int
) -> tuple[int, float, float, float, float]:
    """The one composition of a NIXL READ of ``tokens`` tokens (simulator, screen and break-even use it).

    ``plan`` is the direction's :class:`~kvplan.sim.tp.RankPlan` (heterogeneous TP, vLLM PR #27274): each reader
    rank posts ``regions x blocks`` descriptors per source rank it reads from, and the bytes go through the
    read's busiest NIC. Returns (descriptors per reader rank, bytes through the busiest NIC, the post (inside
    xferDuration, reported only), xferDuration without the shared-bandwidth phase, that latency plus the
    request creation before NIXL's timer: the unshared part of the read, handshake and poll excluded): the
    formulas ``xfer_time_s(tc, 0.0, desc)``, ``post_time_s(tc, desc)`` and ``prep_time_s(tc, desc)`` of
    ``models/formulas.py``, composed by :meth:`ReadCost.phases`.
    """
    return ReadCost(tc, plan, regions, block_size).phases(tokens)


def read_time_s(tc: TransferParams, per_byte_s: float, plan: Any, regions: int, block_size: int, tokens: int,
                first_use: bool = False) -> float:
    """Request-visible time of one READ on an idle link (:func:`read_phases` as :meth:`Reads.start` runs it):
    the bytes at the line rate, then the unshared latency, the handshake on first use and the step-boundary poll."""
    _, nbytes, _, _, pre = read_phases(tc, plan, regions, block_size, tokens)
    if first_use:
        pre += tc.handshake_s
    return nbytes * per_byte_s + (pre + tc.poll_s)


class Reads:
    """The reads of one run: per-direction rank plans and reader costs, links by (P, D, direction)."""

    def __init__(self, ctx: Any) -> None:
        self.ctx = ctx
        self.env = ctx.env
        self.regions: int = ctx.regions
        self.block_size: int = ctx.block_size
        # the reader pays: D reads P's blocks (P2D) with D's transfer costs, P reads D's (D2P, HOST2P) with P's
        p2d, d2p = NativeTransfer(ctx.d_costs.transfer), NativeTransfer(ctx.costs.transfer)  # plain copies: read per read
        cost = {P2D: p2d, D2P: d2p, HOST2P: d2p}
        # per direction, indexed by the direction (D2P, P2D, HOST2P = 0, 1, 2): its ReadCost, typed, no lookup per read
        self._rc: list[ReadCost] = [ReadCost(cost[d], ctx.plans[d], self.regions, self.block_size)
                                    for d in sorted((D2P, P2D, HOST2P))]
        self.links: dict[tuple[int, int, int], Link] = ctx.links  # Ctx.link creates and caches them there
        self._link_of: dict[int, Link] = {}  # the same links by (p * _NODES + d) * 4 + direction
        self.seq = 0

    def total_bytes(self, direction: int, tokens: int) -> int:
        """Bytes a read of ``tokens`` tokens moves, summed over the reader's ranks."""
        return tokens * self._rc[direction].total_bytes_per_token

    def start(self, p: int, d: int, direction: int, tokens: int, on_done: Callable[[float, float], None]) -> float:
        """Start a READ of ``tokens`` tokens; ``on_done(xfer_s, post_s)`` fires when the reader sees it.

        Returns the reader's engine-thread time of creating and posting it
        (:func:`kvplan.models.costs.read_thread_time_s`), which the reading engine charges to its thread (its
        steps cannot end before that work is done)."""
        rc = self._rc[direction]
        tc = rc.tc
        desc, nbytes_rank, post, lat_x, pre = rc.phases(tokens)
        self.seq += 1
        key = (p * _NODES + d) * 4 + direction  # an int key: compiled, no tuple to build and hash per read
        link = self._link_of.get(key)
        if link is None:
            link = self.links.get((p, d, direction))
            if link is None:  # the reader's first read from that engine: it pays the handshake
                pre += tc.handshake_s
                link = self.ctx.link(p, d, direction)
            if d < _NODES:
                self._link_of[key] = link
        tail = pre + tc.poll_s
        env = self.env

        def bw_done(bw_s: float) -> None:
            # the shared-bandwidth phase is modelled first, then the unshared latency (request creation,
            # fixed and per-descriptor xferDuration, post included; handshake) and the step-boundary poll:
            # same duration, one event fewer
            xfer = lat_x + bw_s
            if tail > 0:
                call_later(env, tail, lambda _e: on_done(xfer, post))
            else:
                on_done(xfer, post)

        link.send(self.seq, nbytes_rank, bw_done)
        # = read_thread_time_s(tc, desc, nbytes_rank), without the call; the per-byte part is the bytes a software
        # transport (UCX TCP, deployment.kv_transport) moves on the reader's engine thread (0 over RDMA); reads of D's
        # host copy (HOST2P) are NIXL reads over the same transport, so they pay it too
        return post + tc.thread_per_descriptor_s * desc + tc.thread_per_byte_s * nbytes_rank
