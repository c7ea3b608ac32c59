"""SimPy's clock, driven from compiled code: scheduling a callback and stepping events (the hottest operations).

``call_later(env, delay, fn)`` is what ``env.timeout(delay).callbacks.append(fn)`` does, and
:func:`run_until` is what ``while env.peek() < stop: env.step()`` does: both work on SimPy's own event
queue with SimPy's own ordering (time, priority, insertion id), so every result is unchanged
(``tests/test_native.py`` and ``tests/test_sim.py`` compare with SimPy's ``Environment.step``). They
inline SimPy 4's ``Environment.schedule`` and ``Environment.step`` (simpy/core.py) over its queue,
clock and id counter (``_queue``, ``_now``, ``_eid``), which is what makes them cheap once compiled
(sim/native.py): no ``Timeout`` object (its ``__init__`` is Python code) and no interpreted ``step``. An
environment without those attributes (another SimPy version) falls back to the public API.

The hot modules read the clock as ``env._now``, the attribute behind SimPy's ``Environment.now`` property
(a property call per read costs more than the read; pyproject pins SimPy 4, and ``tests/test_native.py``
checks that the two agree).

The event they schedule is a :class:`Wake`, which carries only what ``Environment.step`` reads of an
event (``callbacks``, ``_ok``, ``_value``).
"""

from __future__ import annotations

from collections.abc import Callable
from heapq import heappop, heappush
from typing import Any

from simpy.events import NORMAL, URGENT


class Wake:
    """A triggered, successful SimPy event with callbacks and no value."""

    __slots__ = ("callbacks", "_ok", "_value")

    def __init__(self, fn: Callable[[Any], None]) -> None:
        self.callbacks: list[Callable[[Any], None]] | None = [fn]
        self._ok = True
        self._value: object = None


def queue_access(env: Any) -> bool:
    """True when ``env`` has SimPy 4's queue, clock and id counter (the fast paths apply)."""
    return hasattr(env, "_queue") and hasattr(env, "_now") and hasattr(env, "_eid")


def call_later(env: Any, delay: float, fn: Callable[[Any], None]) -> None:
    """Call ``fn(event)`` ``delay`` seconds from now (``delay >= 0``), in SimPy's event order."""
    if delay < 0:
        raise ValueError(f"Negative delay {delay}")
    try:
        heappush(env._queue, (env._now + delay, NORMAL, next(env._eid), Wake(fn)))
    except AttributeError:
        env.schedule(Wake(fn), NORMAL, delay)


def call_first(env: Any, fn: Callable[[Any], None]) -> None:
    """Call ``fn(event)`` now, before the NORMAL events of this instant: how SimPy starts a process
    (``Process.__init__`` schedules its ``Initialize`` event at URGENT priority)."""
    try:
        heappush(env._queue, (env._now, URGENT, next(env._eid), Wake(fn)))
    except AttributeError:
        env.schedule(Wake(fn), URGENT, 0.0)


def run_until(env: Any, stop: float) -> None:
    """Process every queued event scheduled before ``stop``, in order (``Environment.step`` inlined)."""
    q: list[Any] = env._queue
    while q and q[0][0] < stop:
        t, _prio, _eid, event = heappop(q)
        env._now = t
        callbacks = event.callbacks
        event.callbacks = None
        for cb in callbacks:
            cb(event)
        if not event._ok and not hasattr(event, "_defused"):
            # a failed event nobody waited for: crash the run as SimPy does (a copy with a new traceback)
            exc = type(event._value)(*event._value.args)
            exc.__cause__ = event._value
            raise exc
