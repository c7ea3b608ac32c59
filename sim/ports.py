"""The small interfaces the nodes of the model talk through (``typing.Protocol``), below every node class.

A node never imports another node, the driver or the run state (``sim/context.py``): it is given a
:class:`Wiring` (the run state satisfies it) and reaches its peers through :class:`PrefillPort`,
:class:`DecodePort` and :class:`DriverPort`, each listing only the calls that cross between them. Its
constants come separately, as a frozen slice (``sim/node_config.py``). In the compiled build (``sim/native.py``)
a call through a Protocol is an ordinary Python method call.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from kvplan.sim.clock import SimEnv
from kvplan.sim.events import EventLog
from kvplan.sim.request import Request
from kvplan.sim.router import Router
from kvplan.sim.xfer import Reads


class PrefillPort(Protocol):
    """What the driver and a decode engine ask of a prefill engine."""

    def submit(self, req: Request) -> None:
        """A request reaches the engine (after the proxy/HTTP leg)."""

    def d_tracks(self, r: Request) -> None:
        """The request entered D's scheduler: D heartbeats P's lease on its held prompt."""

    def release_hold(self, r: Request, why: int, at: float | None = None, kick: bool = True) -> None:
        """Free the prompt's held blocks (D's read done, D's notification, lapse)."""


class DecodePort(Protocol):
    """What the driver and a prefill engine ask of a decode engine."""

    def submit(self, req: Request) -> None:
        """The D leg reaches the engine."""

    def pin_alive(self, pin_id: int, now: float) -> bool:
        """Whether the pinned blocks still exist at ``now``."""

    def mark_reading(self, pin_id: int) -> None:
        """A P worker posted a READ of these blocks: they stay until the read completes."""

    def release_pin(self, pin_id: int, why: int) -> None:
        """P released retained blocks (read done or notification)."""

    def host_tokens(self, conv: int, now: float) -> int:
        """Tokens of the conversation in the node's host offload tier."""

    def host_read(self, conv: int) -> None:
        """P read the conversation's host copy."""


class EnginePort(Protocol):
    """An aggregated replica as the driver sees it."""

    def submit(self, req: Request) -> None:
        """A request reaches the engine."""


class DriverPort(Protocol):
    """What an engine tells the driver when its leg of a turn is over."""

    def p_done(self, r: Request) -> None:
        """The P leg finished (or failed)."""

    def d_done(self, r: Request) -> None:
        """D finished the response."""


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
