"""Shared run state: derived constants and the wiring every node needs (the request record is in request.py).

:class:`Ctx` is the engine's concrete run state; a node sees it only through the ``Wiring`` protocol of
``sim/ports.py`` (nodes import neither this module nor each other) and gets its constants as a frozen slice
(``sim/node_config.py``, built by ``sim/node_setup.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvplan.models.arch import ModelArch, kv_regions_per_rank
from kvplan.models.costs import CostModel
from kvplan.sim.clock import SimEnv
from kvplan.sim.events import EventLog
from kvplan.sim.link import Fabric, Link
from kvplan.sim.request import D2P, HOST2P, P2D, Request
from kvplan.sim.router import Router
from kvplan.sim.scenario import Scenario
from kvplan.sim.tp import rank_plan
from kvplan.sim.xfer import Reads

__all__ = ["D2P", "HOST2P", "P2D", "Ctx", "Request"]  # Request and the directions live in sim/request.py

if TYPE_CHECKING:
    from kvplan.sim.aggregated import AggregatedNode
    from kvplan.sim.decode import DecodeNode
    from kvplan.sim.driver import Driver
    from kvplan.sim.prefill import PrefillNode

@dataclass
class Ctx:
    """Everything a node needs: environment, log, costs, policy, derived sizes, peers and links."""

    env: SimEnv
    scenario: Scenario
    arch: ModelArch
    costs: CostModel
    tp: int
    per_byte_s: float
    decode_capacity_blocks: int
    prefill_cache_tokens: int
    router: Router
    log: EventLog = field(default_factory=EventLog)
    prefill: list[PrefillNode] = field(default_factory=list)
    decode: list[DecodeNode] = field(default_factory=list)
    replicas: list[AggregatedNode] = field(default_factory=list)  # aggregated mode only
    links: dict[tuple[int, int, int], Link] = field(default_factory=dict)
    fabric: Fabric = field(default_factory=Fabric)
    driver: Driver = field(init=False)
    block_size: int = 16
    host_per_byte_s: float = 0.0  # offload tier reads (HOST2P), set by the engine from D's retention config
    p_tp: int = 0  # prefill TP (0: ``tp``)
    d_tp: int = 0  # decode TP (0: ``tp``)
    d_costs: CostModel | None = None  # D's cost model when D's TP differs (None: ``costs``, which is P's)
    roles: tuple[Any, ...] = ()  # (P's, D's) resolved scenario (engine.Resolved)
    # shared prefixes (sim/shared.py): per conversation its group (-1: none) and its shared tokens; None: none
    shared_group: Any = None
    shared_tokens: Any = None
    # the steady window (engine.steady_window: the second half of the arrival window) and the prefill engines'
    # busy seconds inside it (read as the clock passed its ends, engine._run_sliced); None: closed loop
    steady_window: tuple[float, float] | None = None
    window_busy_s: float | None = None
    window_busy_each_s: list[float] | None = None  # the same, per engine (P nodes, or aggregated replicas)
    # the engine threads inside the window, per engine: P's busy and posting seconds, requests that reached P and
    # that P scheduled, then D's busy and posting seconds, requests that reached D and that D admitted
    window_thread_s: list[list[float]] | None = None

    def __post_init__(self) -> None:
        self.p_tp = self.p_tp or self.tp
        self.d_tp = self.d_tp or self.tp
        if self.d_costs is None:
            self.d_costs = self.costs
        # the reader pulls: D reads P's ranks (P->D), P reads D's ranks (D->P); vLLM PR #27274 mapping
        self.plans = {P2D: rank_plan(self.arch, self.d_tp, self.p_tp), D2P: rank_plan(self.arch, self.p_tp, self.d_tp)}
        self.plans[HOST2P] = self.plans[D2P]  # offload tier: P's ranks read D's host copy of the same layout
        self.block_size = self.arch.block_size_tokens
        self.cross_layer = self.scenario.deployment.cross_layer_blocks
        self.regions = kv_regions_per_rank(self.arch, self.cross_layer)
        # vLLM PR #55801 (nixl/base_scheduler.py): kv_recompute_threshold applies to every pull, and its
        # default is 64 with bidirectional_kv_xfer, 0 without it
        pol = self.scenario.policy
        self.threshold_applies_to_p2d = pol.bidirectional if pol.threshold_applies_to_p2d is None else (
            pol.threshold_applies_to_p2d
        )
        self.reads = Reads(self)  # the NIXL READs of the run (compiled hot path)

    @staticmethod
    def nic(role: str, node: int, ingress: bool) -> int:
        """Id of a node's NIC resource (one egress and one ingress stand for each rank's NIC)."""
        return 4 * node + (2 if role == "d" else 0) + (1 if ingress else 0)

    def link(self, p: int, d: int, direction: int) -> Link:
        """The link of one (P, D) pair and direction, created on first use.

        The reader pulls: P->D data leaves P's egress into D's ingress, D->P data D's egress into P's ingress.
        """
        key = (p, d, direction)
        lk = self.links.get(key)
        if lk is None:
            if direction == P2D:
                nics = (self.nic("p", p, False), self.nic("d", d, True))
            else:
                nics = (self.nic("d", d, False), self.nic("p", p, True))
            if direction == HOST2P:
                # offload tier reads: bounded by D's host-to-NIC bandwidth, kept out of the NIC fabric
                # (stated simplification: they do not contend with HBM reads on D's NICs)
                lk = Link(self.env, self.host_per_byte_s, nics, None)
                self.links[key] = lk
                return lk
            # with one P and one D no two links share a NIC (full duplex): no fabric bookkeeping needed
            shared = len(self.prefill) > 1 or len(self.decode) > 1
            lk = Link(self.env, self.per_byte_s, nics, self.fabric if shared else None)
            self.links[key] = lk
        return lk

    def nic_utilization(self, span_s: float) -> dict[str, float]:
        """Each node's egress and ingress: bytes moved per rank x seconds per byte, over ``span_s``."""
        moved: dict[int, float] = {}
        for lk in self.links.values():
            for nic in lk.nics:
                moved[nic] = moved.get(nic, 0.0) + lk.bytes_sent
        out: dict[str, float] = {}
        names = [("p", i) for i in range(len(self.prefill))] + [("d", i) for i in range(len(self.decode))]
        for role, i in names:
            for ingress, name in ((False, "egress"), (True, "ingress")):
                b = moved.get(self.nic(role, i, ingress), 0.0)
                out[f"{role}{i}_{name}"] = b * self.per_byte_s / span_s if span_s > 0 else 0.0
        return out
