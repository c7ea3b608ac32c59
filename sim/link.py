"""The P<->D network: per-NIC processor sharing, in both directions, plus per-transfer latency.

A NIXL READ is modelled per TP rank: the NIXL worker of each reader rank posts its own READ to the
source ranks it maps to (``nixl/worker.py`` / ``pull_worker.py``, ``nixl/tp_mapping.py``), each rank
through its own EFA NIC(s), so ranks run in parallel and one rank stands for all. Every node has one
egress and one ingress per GPU NIC (EFA is full duplex); a transfer from node A to node B uses A's
egress and B's ingress, and the transfers in flight through a NIC share its line rate. Transfers
between the same pair of nodes in the same direction share their resources identically, so they form
one :class:`Link` (processor sharing in *virtual time*: an arrival or departure costs O(log n) and one
rescheduled timeout); between links, rates are max-min fair (progressive filling over the NICs the
links share). A link whose NICs carry no other link's traffic runs at the full line rate: 1P1D is
exactly the per-pair model. The unshared latency (post, fixed, per-descriptor, handshake) and
``poll_s`` (the engine notices completion at a step boundary) are added by the caller.

Sources: vLLM NIXL worker ``start_load_kv``/``get_finished`` (posting, polling each engine step);
NIXL telemetry ``postDuration``/``xferDuration`` (VLLM_BEHAVIOUR.md 2.6).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from kvplan.sim.clock import SimEnv, Wake, call_later, sorted_pop, sorted_push

EPS_S: Final = 1e-9  # a flow within a nanosecond of done is done (float time resolution at t~1e4 s is ~1e-12 s)


class Link:
    """The transfers from one node to another (one direction of one pair): equal shares of the link's rate.

    ``frac`` is the fraction of the NIC line rate each of its flows gets (``1 / n`` when nothing else
    crosses its NICs); the :class:`Fabric` lowers it when other links share a NIC.
    """

    __slots__ = (
        "env", "per_byte_s", "_heap", "_v", "_last_t", "_timer", "_on_timer", "frac", "nics", "fabric", "bytes_sent",
    )

    def __init__(
        self, env: SimEnv, per_byte_s: float, nics: tuple[int, int] = (0, 1), fabric: Fabric | None = None
    ) -> None:
        self.env = env
        self.per_byte_s = per_byte_s
        self._heap: list[tuple[float, int, float, Callable[[float], None]]] = []  # (finish V, key, start t, cb)
        self._v = 0.0  # bytes served to each active flow since the link was created
        self._last_t = 0.0
        self._timer: Wake | None = None  # the pending completion wake-up (an earlier one is superseded)
        self._on_timer: Callable[[object], None] = self._complete  # bound once: no closure per wake-up
        self.frac = 1.0
        self.nics = nics  # (source egress, destination ingress)
        self.fabric = fabric
        self.bytes_sent = 0.0  # per rank, through the busiest NIC

    @property
    def flows(self) -> int:
        """Transfers in flight on this link."""
        return len(self._heap)

    def send(self, key: int, nbytes: float, on_done: Callable[[float], None]) -> None:
        """Move ``nbytes``; call ``on_done(duration_s)`` when the last byte lands."""
        self.bytes_sent += nbytes
        if self.per_byte_s <= 0 or nbytes <= 0:
            on_done(0.0)
            return
        now = self.env.now
        if self._heap:  # _advance written out (as in _complete): a call fewer per read interpreted
            self._v += (now - self._last_t) * self.frac / self.per_byte_s
        self._last_t = now
        sorted_push(self._heap, (self._v + nbytes, key, now, on_done))
        if self.fabric is None or not self.fabric.reshare(self):
            self.frac = 1.0 / float(len(self._heap))  # float / float: native (float / int was a generic call)
            self._reschedule()

    def _advance(self) -> None:
        now = self.env.now
        if self._heap:
            self._v += (now - self._last_t) * self.frac / self.per_byte_s
        self._last_t = now

    def set_frac(self, frac: float) -> None:
        """Change the per-flow share (bytes served so far are kept)."""
        self._advance()
        self.frac = frac
        self._reschedule()

    def _reschedule(self) -> None:
        self._timer = None
        if not self._heap:
            return
        delay = max(self._heap[0][0] - self._v, 0.0) * self.per_byte_s / self.frac
        self._timer = call_later(self.env, delay, self._on_timer)

    def _complete(self, e: object) -> None:
        if e is not self._timer:
            return  # superseded by a later arrival or departure
        heap = self._heap
        now = self.env.now
        if heap:  # _advance written out
            self._v += (now - self._last_t) * self.frac / self.per_byte_s
        self._last_t = now
        slack = EPS_S * self.frac / self.per_byte_s
        finished: list[tuple[float, int, float, Callable[[float], None]]] = []  # typed: native reads of the items
        while heap and heap[0][0] - self._v <= slack:
            finished.append(sorted_pop(heap))
        if self.fabric is None or not self.fabric.reshare(self):
            if heap:
                self.frac = 1.0 / float(len(heap))
            self._reschedule()
        for _v, _k, t0, cb in finished:
            cb(now - t0)


class Fabric:
    """The NICs of every node and the links crossing them: max-min fair shares between links.

    NIC ids are small integers (``Ctx.nic``); each link crosses two (source egress, destination
    ingress). ``reshare(link)`` is called when a link's flow count changed: if its NICs carry no other
    active link it returns False (the link sets ``1 / n`` itself, the fast path); otherwise it recomputes
    the shares of every link connected to it through shared NICs (progressive filling: the NIC with the
    smallest fair level per flow is the bottleneck of its links) and returns True.
    """

    def __init__(self) -> None:
        self.active: dict[int, set[Link]] = {}  # NIC -> links with flows in flight through it

    def reshare(self, link: Link) -> bool:
        """Update the NICs' active links after ``link`` changed; re-share if another link is involved."""
        active = self.active
        busy = link.flows > 0
        alone = True
        for nic in link.nics:
            s = active.setdefault(nic, set())
            if busy:
                s.add(link)
            else:
                s.discard(link)
            if len(s) > (1 if busy else 0):
                alone = False
        if alone:
            return False
        self._refill(self._component(link))
        return True

    def _component(self, start: Link) -> list[Link]:
        seen = {start}
        todo = [start]
        for nic in start.nics:
            for other in self.active.get(nic, ()):
                if other not in seen:
                    seen.add(other)
                    todo.append(other)
        while todo:
            lk = todo.pop()
            for nic in lk.nics:
                for other in self.active.get(nic, ()):
                    if other not in seen:
                        seen.add(other)
                        todo.append(other)
        return sorted((lk for lk in seen if lk.flows > 0), key=lambda lk: lk.nics)

    def _refill(self, links: list[Link]) -> None:
        cap: dict[int, float] = {}
        for lk in links:
            for nic in lk.nics:
                cap[nic] = 1.0
        frozen: dict[Link, float] = {}
        while len(frozen) < len(links):
            best_nic, best_level = -1, float("inf")
            for nic in sorted(cap):
                w = sum(lk.flows for lk in links if lk not in frozen and nic in lk.nics)
                if w and cap[nic] / w < best_level:
                    best_nic, best_level = nic, cap[nic] / w
            for lk in links:
                if lk not in frozen and best_nic in lk.nics:
                    frozen[lk] = best_level
                    for nic in lk.nics:
                        cap[nic] -= best_level * lk.flows
        for lk in links:
            lk.set_frac(frozen[lk])
