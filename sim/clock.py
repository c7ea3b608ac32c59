"""Calling back on SimPy's clock without building a :class:`simpy.Timeout` (the model's hottest operation).

``call_later(env, delay, fn)`` is what ``env.timeout(delay).callbacks.append(fn)`` does: it schedules an
event through SimPy's public ``Environment.schedule(event, NORMAL, delay)``, so ordering (time, priority,
insertion id) and therefore every result are unchanged. The event is a :class:`Wake`, which carries only
what ``Environment.step`` reads of an event (``callbacks``, ``_ok``, ``_value``; simpy/core.py, simpy 4):
compiled (sim/native.py), it costs a fraction of a ``Timeout``, whose ``__init__`` is Python code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simpy.events import NORMAL


class Wake:
    """A triggered, successful SimPy event with callbacks and no value."""

    __slots__ = ("callbacks", "_ok", "_value")

    def __init__(self, fn: Callable[[Any], None]) -> None:
        self.callbacks: list[Callable[[Any], None]] | None = [fn]
        self._ok = True
        self._value: object = None


def call_later(env: Any, delay: float, fn: Callable[[Any], None]) -> None:
    """Call ``fn(event)`` ``delay`` seconds from now (``delay >= 0``), in SimPy's event order."""
    if delay < 0:
        raise ValueError(f"Negative delay {delay}")
    env.schedule(Wake(fn), NORMAL, delay)
