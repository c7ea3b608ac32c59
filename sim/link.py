"""The P<->D link: per-transfer latency plus a processor-shared bandwidth phase.

A NIXL READ is modelled per TP rank (ranks run in parallel on their own NICs and finish together, so
one rank stands for all): ``post + fixed + per-descriptor`` latency that transfers do not share, then
the bytes at the link's line rate shared equally by the transfers in flight on the same link and
direction (processor sharing), then ``poll_s`` until the engine notices completion at a step boundary.
Like SimPy's ``latency.py`` Cable, the link owns its delays; senders only ask for a transfer.

Sources: vLLM NIXL worker ``start_load_kv``/``get_finished`` (posting, polling each engine step);
NIXL telemetry ``postDuration``/``xferDuration`` (VLLM_BEHAVIOUR.md 2.6).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import simpy

EPS_S = 1e-9  # a share within a nanosecond of done is done (float time resolution at t~1e4 s is ~1e-12 s)


class Link:
    """One direction of one (P node, D node) pair. Bandwidth phase is processor-shared."""

    __slots__ = ("env", "per_byte_s", "_active", "_last_t", "_gen", "busy_bytes")

    def __init__(self, env: simpy.Environment, per_byte_s: float) -> None:
        self.env = env
        self.per_byte_s = per_byte_s
        self._active: dict[int, list[Any]] = {}  # id -> [remaining_bytes, on_done]
        self._last_t = 0.0
        self._gen = 0
        self.busy_bytes = 0.0

    def send(self, key: int, nbytes: float, on_done: Callable[[float], None]) -> None:
        """Start the bandwidth phase of ``nbytes``; call ``on_done(duration_s)`` when the last byte lands."""
        start = self.env.now
        if self.per_byte_s <= 0 or nbytes <= 0:
            on_done(0.0)
            return
        self._advance()
        self._active[key] = [float(nbytes), on_done, start]
        self.busy_bytes += nbytes
        self._reschedule()

    def _advance(self) -> None:
        now = self.env.now
        n = len(self._active)
        if n:
            moved = (now - self._last_t) / (self.per_byte_s * n)
            for item in self._active.values():
                item[0] -= moved
        self._last_t = now

    def _reschedule(self) -> None:
        self._gen += 1
        if not self._active:
            return
        n = len(self._active)
        rem = min(item[0] for item in self._active.values())
        delay = max(rem, 0.0) * self.per_byte_s * n
        gen = self._gen
        ev = self.env.timeout(delay)
        ev.callbacks.append(lambda _e: self._complete(gen))

    def _complete(self, gen: int) -> None:
        if gen != self._gen:
            return  # superseded by a later arrival or departure
        self._advance()
        slack = EPS_S / (self.per_byte_s * max(len(self._active), 1))
        done = [k for k, item in self._active.items() if item[0] <= slack]
        finished = [self._active.pop(k) for k in done]
        self._reschedule()
        now = self.env.now
        for item in finished:
            item[1](now - item[2])
