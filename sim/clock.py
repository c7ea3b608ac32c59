"""The simulator's SimPy environment: :class:`SimEnv`, SimPy's ``Environment`` through its extension points.

SimPy (pinned 4.1.x in pyproject) is the engine. :class:`SimEnv` subclasses ``simpy.Environment`` the way
SimPy's own ``RealtimeEnvironment`` does (simpy/rt.py): it overrides ``step`` and adds nothing to the
event order. Its ``step`` is SimPy 4.1.2's ``Environment.step`` (simpy/core.py) written in typed code so
that the compiled build (sim/native.py) runs it as C: pop the next ``(time, priority, id, event)``, set the
clock, run the event's callbacks; a ``StopSimulation`` raised by a callback (``env.run(until=event)``)
re-attaches the callbacks not yet run and re-schedules the event at priority -1 before propagating, as
SimPy does; a failed event nobody defused crashes the run with a copy of its exception. :meth:`SimEnv.run_until`
is ``while env.peek() < stop: env.step()`` without a Python call per event. ``env.run()``,
``env.process``, ``env.timeout`` and the rest are SimPy's own, unchanged.

This is the one module that touches SimPy's internals (``_queue``, ``_now``, ``_eid``, an event's
``callbacks``/``_ok``/``_value``); everything else uses the public API plus the two scheduling helpers
below. ``call_later(env, delay, fn)`` is ``env.timeout(delay).callbacks.append(fn)`` and
``call_first(env, fn)`` is how SimPy starts a process (an URGENT event now), both without a ``Timeout``
object: they push a :class:`Wake` on SimPy's queue with SimPy's ordering, exactly what
``Environment.schedule`` does (``tests/test_native.py`` and ``tests/test_clock.py`` compare with SimPy).

The clock is read through one accessor, ``env.now`` (SimPy's public property). :class:`SimEnv` overrides
it with a typed getter (``-> float``) over a typed field: compiled code calls it directly in C and gets an
unboxed float, instead of a dictionary lookup returning an untyped object (``env._now`` on a plain
``simpy.Environment``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from heapq import heappop, heappush
from typing import Any, Final

import simpy
from simpy.core import EmptySchedule, StopSimulation
from simpy.events import NORMAL, URGENT, EventPriority

_RESCHEDULED: Final = EventPriority(-1)  # SimPy's: an event interrupted by StopSimulation runs first on resume


# C statics in the compiled build: a module global (an imported name included) is a dictionary lookup per use
_NORMAL: Final = NORMAL
_INF: Final = float("inf")
_URGENT: Final = URGENT
# interpreted only: heapq's C functions (compiled, the typed heap operations below, see _before) and SimPy's event
# counter read through the builtin ``next`` (compiled, the ids come from EventIds.take, see SimEnv)
_push: Final = heappush
_pop: Final = heappop
_next: Final[Callable[[Iterator[int]], object]] = next
# compiled, the queue's heap operations are the typed ones below (see _before); interpreted, heapq's C functions
_COMPILED: Final = not __file__.endswith(".py")


class Wake:
    """A triggered, successful SimPy event with one callback and no value.

    It holds its callback itself (``fn``, None once processed) instead of a list of them: one object per
    wake-up, not two. SimPy's own ``step`` sees the event it expects through ``callbacks``, ``_ok`` and
    ``_value``."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Any], None]) -> None:
        self.fn: Callable[[Any], None] | None = fn

    @property
    def callbacks(self) -> list[Callable[[Any], None]] | None:
        """SimPy's callback list: the one callback, None once the event is processed."""
        return None if self.fn is None else [self.fn]

    @callbacks.setter
    def callbacks(self, value: list[Callable[[Any], None]] | None) -> None:
        if value is not None and len(value) > 1:
            raise ValueError("a Wake has one callback")
        self.fn = value[0] if value else None

    @property
    def _ok(self) -> bool:
        return True

    @property
    def _value(self) -> object:
        return None


class EventIds:
    """SimPy's event counter (``Environment._eid``, an ``itertools.count()`` there) in the compiled build: the same
    ids 0, 1, 2, ... to SimPy's own ``next(env._eid)`` and to :func:`call_later` and the other helpers, which take
    them with a native call (:meth:`take`) instead of a generic call of the builtin ``next`` per scheduled event.
    Interpreted, the environment keeps SimPy's ``count`` (``next`` on it is C code already)."""

    __slots__ = ("n",)

    def __init__(self, start: int) -> None:
        self.n = start

    def __iter__(self) -> EventIds:
        return self

    def __next__(self) -> object:  # typed ``object``: mypyc fills the type's tp_iternext slot with it
        n = self.n
        self.n = n + 1
        return n

    def take(self) -> int:
        """The next id (= ``next(self)``)."""
        n = self.n
        self.n = n + 1
        return n


class SimEnv(simpy.Environment):
    """``simpy.Environment`` with a typed clock and ``step`` (SimPy 4.1.2's, compiled with the hot path).

    SimPy's own attributes are declared with their types: compiled, they are fields of the object (a read of
    the clock is a load, not a dictionary lookup); SimPy's interpreted code reaches them as before."""

    _now: float
    _queue: list[Any]
    _eid: Any  # SimPy's count, or (compiled) the EventIds below
    _ids: EventIds  # compiled: the same object as _eid (see EventIds); unset interpreted
    _soon: list[Callable[[Any], None]]  # call_soon's calls, run after the current event (see call_soon)
    _soon_on: bool  # run_until is stepping: call_soon may defer
    _soon_eid: int  # ids of deferred calls that must enter the queue after all: below every SimPy id, in order
    _far: list[Any]  # call_later_far's entries not yet in the queue, all after its head (a heap; see call_later_far)
    _far_t: float  # the time of the far heap's head (inf: empty)

    def __init__(self, initial_time: float = 0.0) -> None:
        super().__init__(float(initial_time))
        if not (isinstance(self._queue, list) and hasattr(self._eid, "__next__")):
            raise RuntimeError(f"SimPy {getattr(simpy, '__version__', '?')} is not supported: kvplan needs SimPy 4.1")
        if _COMPILED:
            self._ids = EventIds(next(self._eid))  # nothing is scheduled yet: the counter's next id
            self._eid = self._ids
        self._soon = []
        self._soon_on = False
        self._soon_eid = -(2**62)
        self._far = []
        self._far_t = _INF

    @property
    def now(self) -> float:
        """The current simulation time (SimPy's ``Environment.now``, typed for compiled callers)."""
        return self._now

    def step(self) -> None:
        """Process the next event (SimPy 4.1.2's ``Environment.step``); ``EmptySchedule`` when none is left."""
        q = self._queue
        if not q:
            raise EmptySchedule()
        t, _prio, _eid, event = heap_pop(q)
        _next_far(self)
        self._now = t
        _fire(self, event)

    def run_until(self, stop: float) -> None:
        """Process every queued event scheduled before ``stop``, in order (``while peek() < stop: step()``).

        A :class:`Wake` is run inline (a successful event whose callbacks are the model's, which never raise
        ``StopSimulation``); any other event goes through SimPy's step body (:func:`_fire`). After each event
        the calls :func:`call_soon` deferred during it are run (:meth:`_run_soon`)."""
        q = self._queue
        soon = self._soon
        self._soon_on = True
        try:
            while q:
                # typed reads of the entry (compiled: a C double and a tuple item, not generic indexing and unpacking)
                head: tuple[float, ...] = q[0]
                if not head[0] < stop:
                    break
                entry: tuple[Any, ...] = heap_pop(q)
                if q:
                    nxt: tuple[float, ...] = q[0]
                    if self._far_t <= nxt[0]:  # the far heap's head may be next (a plain float test per event)
                        _next_far(self)
                else:
                    _next_far(self)
                t: float = entry[0]
                event = entry[3]
                self._now = t
                if type(event) is Wake:  # ours (call_later/call_first): always ok, callbacks never stop the run
                    w: Wake = event
                    fn = w.fn
                    w.fn = None  # processed
                    if fn is not None:
                        fn(w)
                else:
                    _fire(self, event)
                if soon:
                    self._run_soon()
        finally:
            self._soon_on = False

    def _run_soon(self) -> None:
        """Run the deferred calls in order, each as the event ``call_later(env, 0.0, fn)`` would have been.

        Each would have been the first NORMAL event of this instant (nothing else was due now when it was
        deferred; what was scheduled after it comes after it), so it runs now, unless an URGENT event of this
        instant was scheduled since: that one runs first, so the rest enter the queue at NORMAL priority with ids
        below every SimPy id (in their order), which puts them before the NORMAL events of this instant."""
        soon = self._soon
        q = self._queue
        now = self._now
        i = 0
        while i < len(soon):
            if q and q[0][0] <= now and q[0][1] < _NORMAL:
                for fn in soon[i:]:
                    heap_push(q, (now, _NORMAL, self._soon_eid, Wake(fn)))
                    self._soon_eid += 1
                break
            fn = soon[i]
            i += 1
            fn(None)
        soon.clear()


def _next_far(env: SimEnv) -> None:
    """After a pop: the far heap's head enters the queue when it is the next event (see :func:`call_later_far`)."""
    far = env._far
    q = env._queue
    if far and (not q or _before(far[0], q[0])):
        heap_push(q, heap_pop(far))
        env._far_t = far[0][0] if far else _INF


def _fire(env: SimEnv, event: Any) -> None:
    """The body of ``Environment.step`` after the pop: run the callbacks; StopSimulation and failures as SimPy."""
    callbacks: list[Any] = event.callbacks
    event.callbacks = None
    try:
        for cb in callbacks:
            cb(event)
    except StopSimulation:
        # SimPy: re-attach the callbacks not run yet and process the event first when the simulation resumes
        event.callbacks = callbacks[callbacks.index(cb) + 1:]
        env.schedule(event, _RESCHEDULED)
        raise
    if not event._ok and not hasattr(event, "_defused"):
        # a failed event nobody waited for: crash the run as SimPy does (a copy with a new traceback)
        exc = type(event._value)(*event._value.args)
        exc.__cause__ = event._value
        raise exc


# ---- SimPy's queue as a heap ----------------------------------------------------------------------------
# The same binary heap as heapq's (the same sift steps as its C code) on SimPy's entries ``(time, priority, id,
# event)``: ids are unique, so the entries are totally ordered and any valid heap pops them in the same order;
# SimPy's own ``schedule``/``step`` (heapq) keep working on it. Compiled, an entry's time is read as a C double
# and compared natively; heapq compares tuples through Python's generic rich comparison (two float compares
# per pair), about a fifth of the model's instructions. The model's other heaps use it too (D's finishes,
# a link's flows, D's pin deadlines): any heap of tuples whose first item is a float and whose entries are
# all different (a unique id second), popped only through :func:`heap_pop`.

def _before(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """``a < b`` for two queue entries: by time, then (same time) as tuples (priority, then id)."""
    ta = a[0]
    tb = b[0]
    if ta != tb:
        return ta < tb
    return bool(a < b)


def heap_push(q: list[Any], item: Any) -> None:
    """``heapq.heappush(q, item)`` (interpreted, it is heapq's: see below)."""
    entry: tuple[float, ...] = item
    q.append(entry)
    _settle(q, len(q) - 1, entry)


def _settle(q: list[Any], pos: int, entry: tuple[float, ...]) -> None:
    """Put ``entry`` at ``pos`` or, while it is before its parent, above (heapq's ``_siftdown(q, 0, pos)``)."""
    while pos > 0:
        parent_pos = (pos - 1) >> 1
        parent: tuple[float, ...] = q[parent_pos]
        if not _before(entry, parent):
            break
        q[pos] = parent
        pos = parent_pos
    q[pos] = entry


def heap_pop(q: list[Any]) -> Any:
    """``heapq.heappop(q)`` (``q`` not empty; interpreted, it is heapq's: see below)."""
    last: tuple[float, ...] = q.pop()
    if not q:
        return last
    top: tuple[float, ...] = q[0]
    # heapq's _siftup(q, 0): the smaller child moves up until a leaf is reached, then ``last`` sifts down there
    end = len(q)
    pos = 0
    child = 1
    while child < end:
        smaller: tuple[float, ...] = q[child]  # each entry read once per level
        right = child + 1
        if right < end:
            other: tuple[float, ...] = q[right]
            if not _before(smaller, other):
                child = right
                smaller = other
        q[pos] = smaller
        pos = child
        child = 2 * pos + 1
    _settle(q, pos, last)
    return top


if not _COMPILED:  # interpreted, heapq's C functions themselves: no Python call around each push and pop
    heap_push = _push  # type: ignore[assignment]
    heap_pop = _pop  # type: ignore[assignment]


def call_later(env: SimEnv, delay: float, fn: Callable[[Any], None]) -> Wake:
    """Call ``fn(event)`` ``delay`` seconds from now (``delay >= 0``), in SimPy's event order; returns the event
    ``fn`` will get (a timer superseded by a later one knows itself by it: no closure per wake-up)."""
    if delay < 0:
        raise ValueError(f"Negative delay {delay}")
    w = Wake(fn)
    heap_push(env._queue, (env._now + delay, _NORMAL, (env._ids.take() if _COMPILED else _next(env._eid)), w))
    return w


def call_later_far(env: SimEnv, delay: float, fn: Callable[[Any], None]) -> None:
    """``call_later(env, delay, fn)`` for a wake-up usually far behind the events queued before it (a conversation's
    next turn, one think time away): same entry, same order, but while :meth:`SimEnv.run_until` steps it waits in the
    clock's far heap unless it would be the queue's head, and enters SimPy's queue when it is the next event.

    SimPy's queue keeps its head: every far entry is after it (checked after each pop, :func:`_next_far`), so
    ``peek`` and the order are unchanged; entries keep their SimPy id. What it saves: the queue holds the near
    events only (the reference run: a dozen instead of ~190 pending turns), so its pushes and pops sift fewer levels."""
    if delay < 0:
        raise ValueError(f"Negative delay {delay}")
    entry: Any = (env._now + delay, _NORMAL, (env._ids.take() if _COMPILED else _next(env._eid)), Wake(fn))
    q = env._queue
    if env._soon_on and q and _before(q[0], entry):
        far = env._far
        heap_push(far, entry)
        env._far_t = far[0][0]
    else:
        heap_push(q, entry)


def call_soon(env: SimEnv, fn: Callable[[Any], None]) -> None:
    """``call_later(env, 0.0, fn)`` without an event when it can be: ``fn(None)`` runs right after the current
    event's callbacks if nothing else is due now (an event of this instant already queued runs before it, so
    then it is queued as ``call_later`` queues it; so is it outside :meth:`SimEnv.run_until`). Same order, same
    times: what it saves is a queue entry, its push and pop, per wake-up that nothing competes with."""
    q = env._queue
    if env._soon_on and not (q and q[0][0] <= env._now):
        env._soon.append(fn)
    else:
        heap_push(q, (env._now + 0.0, _NORMAL, (env._ids.take() if _COMPILED else _next(env._eid)), Wake(fn)))


def call_at(env: SimEnv, when: float, fn: Callable[[Any], None]) -> None:
    """Call ``fn(event)`` at the absolute time ``when`` (now if it has passed), in SimPy's event order.

    A wake-up for a deadline (a pin's expiry, a lease's lapse) must fire *at* the deadline: with
    ``call_later(env, when - now, ...)`` the clock lands on ``now + (when - now)``, which in floating point
    can be one ulp before ``when``, so a ``deadline <= now`` check there still finds nothing due."""
    eid = env._ids.take() if _COMPILED else _next(env._eid)
    heap_push(env._queue, (when if when > env._now else env._now, _NORMAL, eid, Wake(fn)))


def call_first(env: SimEnv, fn: Callable[[Any], None]) -> None:
    """Call ``fn(event)`` now, before the NORMAL events of this instant: how SimPy starts a process
    (``Process.__init__`` schedules its ``Initialize`` event at URGENT priority)."""
    heap_push(env._queue, (env._now, _URGENT, (env._ids.take() if _COMPILED else _next(env._eid)), Wake(fn)))
