"""Shared run state: the request record, derived constants and the wiring every node needs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import simpy

from kvplan.models.arch import ModelArch, kv_bytes_per_token_per_rank, kv_regions_per_rank
from kvplan.models.costs import CostModel
from kvplan.sim.link import Link
from kvplan.sim.router import KVParams, Router
from kvplan.sim.scenario import Scenario

if TYPE_CHECKING:
    from kvplan.sim.aggregated import AggregatedNode
    from kvplan.sim.decode import DecodeNode
    from kvplan.sim.engine import Driver
    from kvplan.sim.prefill import PrefillNode

D2P = 0  # bidirectional read-back: P reads D's retained blocks
P2D = 1  # the ordinary direction: D reads P's freshly computed blocks
HOST2P = 2  # offload tier: P reads D's host-memory copy (host-to-NIC bandwidth)


class Request:
    """One turn in flight: the P leg then the D leg. Plain slots object (hot path)."""

    __slots__ = (
        "conv",
        "turn",
        "prompt",
        "output",
        "params",
        "index",
        "error",
        "p_node",
        "d_node",
        "p_remaining",
        "p_ctx",
        "p_decided",
        "p_compute_start",
        "local_hit",
        "d_blocks",
        "d_p",
        "d_j",
        "d_g0",
        "d_rem",
        "d_seq",
        "d_first_done",
        "d_generated",
        "d_resume",
        "d_preemptions",
        "d_state",
        "d_hit",
        "d_epoch",
    )

    def __init__(
        self, conv: int, turn: int, index: int, prompt: int, output: int, params: KVParams | None
    ) -> None:
        self.conv = conv
        self.turn = turn
        self.index = index  # flat turn index in the ConversationPlan
        self.prompt = prompt
        self.output = output
        self.params = params
        self.error = False
        self.p_node = -1
        self.d_node = -1
        self.p_remaining = 0
        self.p_ctx = 0
        self.p_decided = False
        self.p_compute_start = -1.0
        self.local_hit = 0
        self.d_blocks = 0  # KV blocks this request holds in D's pool outside the batch (admitted, not joined)
        # in D's batch: virtual prompt (tokens its next step attends), join step, tokens sampled at join,
        # steps left at join, finish-heap sequence number (-1 once it left)
        self.d_p = prompt
        self.d_j = 0
        self.d_g0 = 0
        self.d_rem = output
        self.d_seq = -1
        self.d_first_done = False
        self.d_generated = 0  # tokens sampled when last preempted
        self.d_resume = False  # preempted: recompute locally on D when readmitted
        self.d_preemptions = 0
        self.d_state = 0  # 0 waiting/in batch, 1 recomputing on D, 2 recomputed and waiting to join
        self.d_hit = 0  # D prefix-hit tokens at its last (re)admission
        self.d_epoch = 0  # bumped when a recompute in progress is preempted (its completion is then ignored)


@dataclass
class Ctx:
    """Everything a node needs: environment, log, costs, policy, derived sizes, peers and links."""

    env: simpy.Environment
    scenario: Scenario
    arch: ModelArch
    costs: CostModel
    tp: int
    per_byte_s: float
    decode_capacity_blocks: int
    prefill_cache_tokens: int
    router: Router
    log: list[tuple[Any, ...]] = field(default_factory=list)
    prefill: list[PrefillNode] = field(default_factory=list)
    decode: list[DecodeNode] = field(default_factory=list)
    replicas: list[AggregatedNode] = field(default_factory=list)  # aggregated mode only
    links: dict[tuple[int, int, int], Link] = field(default_factory=dict)
    handshaken: set[tuple[int, int, int]] = field(default_factory=set)
    driver: Driver = field(init=False)
    kv_bytes_rank: int = 0
    block_size: int = 16
    _xfer_seq: int = 0
    host_per_byte_s: float = 0.0  # offload tier reads (HOST2P), set by the decode nodes

    def __post_init__(self) -> None:
        self.kv_bytes_rank = kv_bytes_per_token_per_rank(self.arch, self.tp)
        self.block_size = self.arch.block_size_tokens
        self.cross_layer = self.scenario.deployment.cross_layer_blocks
        self.regions = kv_regions_per_rank(self.arch, self.cross_layer)
        self.threshold_applies_to_p2d = bool(self.scenario.policy.threshold_applies_to_p2d)

    def link(self, p: int, d: int, direction: int) -> Link:
        """The link of one (P, D) pair and direction, created on first use."""
        key = (p, d, direction)
        lk = self.links.get(key)
        if lk is None:
            lk = Link(self.env, self.host_per_byte_s if direction == HOST2P else self.per_byte_s)
            self.links[key] = lk
        return lk

    def transfer(
        self, p: int, d: int, direction: int, tokens: int, on_done: Any
    ) -> tuple[float, float]:
        """Start a NIXL READ of ``tokens`` tokens; ``on_done(xfer_s, post_s)`` fires when the reader sees it.

        Returns (bytes summed over ranks, descriptors per rank). The reader pays a one-off handshake the
        first time it contacts that remote engine (pull_worker.start_load_kv background handshake).
        """
        tc = self.costs.transfer
        desc = self.regions * (-(-tokens // self.block_size))  # descriptors = regions x blocks
        nbytes_rank = tokens * self.kv_bytes_rank
        post = tc.post_fixed_s + tc.post_per_descriptor_s * desc
        lat_x = tc.fixed_s + tc.per_descriptor_s * desc
        pre = post + lat_x
        if (p, d, direction) not in self.handshaken:
            self.handshaken.add((p, d, direction))
            pre += tc.handshake_s
        self._xfer_seq += 1
        key = self._xfer_seq
        link = self.link(p, d, direction)
        env = self.env
        tail = pre + tc.poll_s

        def bw_done(bw_s: float) -> None:
            # the shared-bandwidth phase is modelled first, then the unshared latency (post, fixed,
            # descriptors, handshake) and the step-boundary poll: same duration, one event fewer
            xfer = lat_x + bw_s
            if tail > 0:
                env.timeout(tail).callbacks.append(lambda _e: on_done(xfer, post))
            else:
                on_done(xfer, post)

        link.send(key, nbytes_rank, bw_done)
        return float(nbytes_rank * self.tp), float(desc)
