"""The small interfaces the nodes of the model talk through, below every node class.

A node never imports another node, the driver or the run state (``sim/context.py``): it is given a
:class:`Wiring` (the run state satisfies it, a ``typing.Protocol``) and reaches its peers through
:class:`PrefillPort`, :class:`DecodePort` and :class:`DriverPort` (``sim/peers.py``, re-exported here), each
listing only the calls that cross between them: base classes the nodes subclass, so that compiled
(``sim/native.py``) a call to a peer is a native method call. Its constants come separately, as a frozen slice
(``sim/node_config.py``). In the compiled build a call through a Protocol (:class:`Wiring`'s properties,
:class:`EnginePort`) is an ordinary Python attribute lookup and call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kvplan.sim.clock import SimEnv
from kvplan.sim.events import EventLog
from kvplan.sim.peers import DecodePort, DriverPort, PrefillPort
from kvplan.sim.request import Request
from kvplan.sim.router import Router
from kvplan.sim.xfer import Reads

__all__ = ["DecodePort", "DriverPort", "EnginePort", "PrefillPort", "Wiring"]


class EnginePort(Protocol):
    """An aggregated replica as the driver sees it."""

    def submit(self, req: Request) -> None:
        """A request reaches the engine."""


class Wiring(Protocol):
    """The shared run a node is placed in: clock, event log, router, reads and its peers (read-only views);
    every constant a node needs (block size, cost model, limits) comes in its config (sim/node_config.py)."""

    @property
    def env(self) -> SimEnv:
        """The run's SimPy environment."""
        ...

    @property
    def log(self) -> EventLog:
        """The event log every component appends to (``sim/events.py``)."""
        ...

    @property
    def router(self) -> Router:
        """The KV-aware router (``sim/router.py``)."""
        ...

    @property
    def reads(self) -> Reads:
        """The run's NIXL READs (``sim/xfer.py``)."""
        ...

    @property
    def prefill(self) -> Sequence[PrefillPort]:
        """The prefill engines, by index."""
        ...

    @property
    def decode(self) -> Sequence[DecodePort]:
        """The decode engines, by index."""
        ...

    @property
    def replicas(self) -> Sequence[EnginePort]:
        """The aggregated replicas, by index (aggregated mode only)."""
        ...

    @property
    def driver(self) -> DriverPort:
        """The driver that sends the turns."""
        ...

    # prefixes shared by conversations (sim/shared.py)
    @property
    def shared_group(self) -> Any:
        """Per conversation its shared-prefix group (-1: none), or None."""
        ...

    @property
    def shared_tokens(self) -> Any:
        """Per conversation its shared-prefix tokens, or None."""
        ...
