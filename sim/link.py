"""The P<->D link: a processor-shared bandwidth phase plus per-transfer latency.

A NIXL READ is modelled per TP rank (ranks run in parallel on their own NICs and finish together, so
one rank stands for all). The bytes move at the link's line rate, shared equally by the transfers in
flight on the same link and direction (processor sharing); the unshared latency (post, fixed,
per-descriptor, handshake) and ``poll_s`` (the engine notices completion at a step boundary) are added
by the caller. Like SimPy's ``latency.py`` Cable, the link owns its delays; senders only ask.

Processor sharing is kept in *virtual time* (bytes served to every active flow so far), so an arrival or
departure costs O(log n) and one rescheduled timeout, whatever the number of flows.

Sources: vLLM NIXL worker ``start_load_kv``/``get_finished`` (posting, polling each engine step);
NIXL telemetry ``postDuration``/``xferDuration`` (VLLM_BEHAVIOUR.md 2.6).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable

import simpy

EPS_S = 1e-9  # a flow within a nanosecond of done is done (float time resolution at t~1e4 s is ~1e-12 s)


class Link:
    """One direction of one (P node, D node) pair."""

    __slots__ = ("env", "per_byte_s", "_heap", "_v", "_last_t", "_gen")

    def __init__(self, env: simpy.Environment, per_byte_s: float) -> None:
        self.env = env
        self.per_byte_s = per_byte_s
        self._heap: list[tuple[float, int, float, Callable[[float], None]]] = []  # (finish V, key, start t, cb)
        self._v = 0.0  # bytes served to each active flow since the link was created
        self._last_t = 0.0
        self._gen = 0

    def send(self, key: int, nbytes: float, on_done: Callable[[float], None]) -> None:
        """Move ``nbytes``; call ``on_done(duration_s)`` when the last byte lands."""
        if self.per_byte_s <= 0 or nbytes <= 0:
            on_done(0.0)
            return
        self._advance()
        heapq.heappush(self._heap, (self._v + nbytes, key, self.env.now, on_done))
        self._reschedule()

    def _advance(self) -> None:
        now = self.env.now
        n = len(self._heap)
        if n:
            self._v += (now - self._last_t) / (self.per_byte_s * n)
        self._last_t = now

    def _reschedule(self) -> None:
        self._gen += 1
        if not self._heap:
            return
        n = len(self._heap)
        delay = max(self._heap[0][0] - self._v, 0.0) * self.per_byte_s * n
        gen = self._gen
        self.env.timeout(delay).callbacks.append(lambda _e: self._complete(gen))

    def _complete(self, gen: int) -> None:
        if gen != self._gen:
            return  # superseded by a later arrival or departure
        self._advance()
        heap = self._heap
        slack = EPS_S / (self.per_byte_s * max(len(heap), 1))
        now = self.env.now
        finished = []
        while heap and heap[0][0] - self._v <= slack:
            finished.append(heapq.heappop(heap))
        self._reschedule()
        for _v, _k, t0, cb in finished:
            cb(now - t0)
