"""The calls that cross between the model's nodes, as base classes the nodes subclass (compiled hot path).

A node never imports another node, the driver or the run state (``sim/context.py``): it reaches its peers through
:class:`PrefillPort`, :class:`DecodePort` and :class:`DriverPort`, each listing only the calls that cross between
them. They are base classes rather than ``typing.Protocol``\\ s so that in the compiled build (``sim/native.py``) a
call to a peer is a native method call (a virtual-table slot), not a lookup of the method by name and a generic
call with its arguments boxed; interpreted, a base class costs nothing. ``PrefillNode`` subclasses
:class:`PrefillPort` (itself a :class:`~kvplan.sim.scheduler.Scheduler`), ``DecodeNode`` :class:`DecodePort`
(through ``sim/batch.py``'s ``BatchOwner``) and ``Driver`` :class:`DriverPort`.
"""

from __future__ import annotations

from collections.abc import Callable

from kvplan.sim.request import Request
from kvplan.sim.scheduler import Scheduler


class PrefillPort(Scheduler):
    """What the driver and a decode engine ask of a prefill engine."""

    def submit(self, req: Request) -> None:
        """A request reaches the engine (after the proxy/HTTP leg)."""
        raise NotImplementedError

    def d_tracks(self, r: Request) -> None:
        """The request entered D's scheduler: D heartbeats P's lease on its held prompt."""
        raise NotImplementedError

    def release_hold(self, r: Request, why: int, at: float | None = None, kick: bool = True) -> None:
        """Free the prompt's held blocks (D's read done, D's notification, lapse)."""
        raise NotImplementedError


class DecodePort:
    """What the driver and a prefill engine ask of a decode engine."""

    def submit(self, req: Request) -> None:
        """The D leg reaches the engine."""
        raise NotImplementedError

    def pin_alive(self, pin_id: int, now: float) -> bool:
        """Whether the pinned blocks still exist at ``now``."""
        raise NotImplementedError

    def mark_reading(self, pin_id: int) -> None:
        """A P worker posted a READ of these blocks: they stay until the read completes."""
        raise NotImplementedError

    def release_pin(self, pin_id: int, why: int) -> None:
        """P released retained blocks (read done or notification)."""
        raise NotImplementedError

    def host_tokens(self, conv: int, now: float) -> int:
        """Tokens of the conversation in the node's host offload tier."""
        raise NotImplementedError

    def host_read(self, conv: int) -> None:
        """P read the conversation's host copy."""
        raise NotImplementedError


class DriverPort:
    """What an engine tells the driver when its leg of a turn is over."""

    def p_done(self, r: Request) -> None:
        """The P leg finished (or failed)."""
        raise NotImplementedError

    def d_done(self, r: Request) -> None:
        """D finished the response."""
        raise NotImplementedError


class CallbackDriver(DriverPort):
    """The driver of an engine on its own (unit tests): ``on_p_done(r)`` and ``on_d_done(r)`` (None: nothing).

    Interpreted code cannot subclass a compiled class, so a stand-in peer must be one of these."""

    def __init__(self, on_p_done: Callable[[Request], None] | None = None,
                 on_d_done: Callable[[Request], None] | None = None) -> None:
        self.on_p_done = on_p_done
        self.on_d_done = on_d_done

    def p_done(self, r: Request) -> None:
        """Report the end of the P leg."""
        if self.on_p_done is not None:
            self.on_p_done(r)

    def d_done(self, r: Request) -> None:
        """Report the end of the D leg."""
        if self.on_d_done is not None:
            self.on_d_done(r)
