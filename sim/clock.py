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
object: they push a :class:`Wake` with SimPy's ordering, exactly where ``Environment.schedule`` would put the
event (``tests/test_native.py`` and ``tests/test_clock.py`` compare with SimPy). Interpreted, the wake-up is SimPy's
queue entry ``(time, priority, id, Wake)`` itself; compiled, the wake-ups wait in a queue of their own
(``SimEnv._wq``, see :class:`Wake`) beside SimPy's queue, which then holds only SimPy's own events, and
``step``/``peek``/``run_until`` take the earlier of the two heads, by the same ``(time, priority, id)``.

The clock is read through one accessor, ``env.now`` (SimPy's public property). :class:`SimEnv` overrides
it with a typed getter (``-> float``) over a typed field: compiled code calls it directly in C and gets an
unboxed float, instead of a dictionary lookup returning an untyped object (``env._now`` on a plain
``simpy.Environment``).
"""

from __future__ import annotations

from bisect import insort
from collections.abc import Callable, Iterator
from heapq import heappop, heappush
from operator import methodcaller
from typing import Any, Final

import simpy
from simpy.core import EmptySchedule, StopSimulation
from simpy.events import NORMAL, URGENT, EventPriority

_RESCHEDULED: Final = EventPriority(-1)  # SimPy's: an event interrupted by StopSimulation runs first on resume


# C statics in the compiled build: a module global (an imported name included) is a dictionary lookup per use
_NORMAL: Final = NORMAL
_INF: Final = float("inf")
_URGENT: Final = URGENT
_NEAR_CAP: Final = 256  # near wake-ups kept sorted at most (see _npush)
# interpreted only: heapq's C functions (compiled, the typed heap operations below, see _before) and SimPy's event
# counter read through the builtin ``next`` (compiled, the ids come from EventIds.take, see SimEnv)
_push: Final = heappush
_insort: Final = insort
_pop_first: Final = methodcaller("pop", 0)
_pop: Final = heappop
_next: Final[Callable[[Iterator[int]], int]] = next
# compiled, the queue's heap operations are the typed ones below (see _before); interpreted, heapq's C functions
_COMPILED: Final = not __file__.endswith(".py")
WAKE_HEAP: Final = _COMPILED  # the wake-ups wait in SimEnv._wq, outside SimPy's queue (see Wake): SimPy's own
# Environment.step would not see them (SimEnv.step does)

try:  # mypyc reads the class attributes below from the decorator (compiled, mypy_extensions is there: mypy's)
    from mypy_extensions import i64, mypyc_attr
except ImportError:  # interpreted without mypy installed: the decorator does nothing, i64 is int
    i64 = int  # type: ignore[misc]

    def mypyc_attr(*_args: object, **_kwargs: object) -> Callable[[type], type]:  # type: ignore[misc]
        """mypy_extensions.mypyc_attr's stand-in: the class unchanged."""
        return lambda cls: cls


@mypyc_attr(free_list_len=1)
class Wake:
    """A triggered, successful SimPy event with one callback and no value, and its place in the event order.

    It holds its callback itself (``fn``, None once processed) instead of a list of them: one object per
    wake-up, not two. SimPy's own ``step`` sees the event it expects through ``callbacks``, ``_ok`` and
    ``_value``.

    ``t``, ``prio`` and ``eid`` are its key in SimPy's order, the first three items of SimPy's queue entry. Compiled,
    the wake-up *is* the queue entry (``SimEnv._wq``, ordered by :func:`_wbefore`): no tuple, no boxed time and id
    per event, and two wake-ups compare as three native fields, where SimPy's tuples compare through Python's generic
    comparison (each time unboxed by a call). ``free_list_len=1`` (mypyc): the object a processed wake-up frees
    is kept for the next one, which is usually allocated within the same event, so most wake-ups cost no
    allocation. Interpreted, the entry is SimPy's tuple and these fields are only copied into it."""

    __slots__ = ("fn", "t", "prio", "eid")

    def __init__(self, fn: Callable[[Any], None], t: float, prio: int, eid: int) -> None:
        self.fn: Callable[[Any], None] | None = fn
        self.t = t
        self.prio = prio
        self.eid = eid

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
    the clock is a load, not a dictionary lookup); SimPy's interpreted code reaches them as before.

    Compiled, the wake-ups (:class:`Wake`) wait in a queue of their own, ``_wq``, and SimPy's queue ``_queue`` holds
    SimPy's own events only (``env.timeout``, processes, ``run(until=...)``); both draw their ids from the one
    counter, so ``(time, priority, id)`` orders all events as in one queue, and :meth:`step`, :meth:`peek` and
    :meth:`run_until` take the earlier head (:func:`_wake_first`). SimPy's own ``Environment.step`` does not see
    ``_wq``: use ``env.step()``. Interpreted, ``_wq`` stays empty and the wake-ups are entries of SimPy's queue."""

    _now: float
    _queue: list[Any]
    _eid: Any  # SimPy's count, or (compiled) the EventIds below
    _ids: EventIds  # compiled: the same object as _eid (see EventIds); unset interpreted
    _soon: list[Callable[[Any], None]]  # call_soon's calls, run after the current event (see call_soon)
    _soon_on: bool  # run_until is stepping: call_soon may defer
    _soon_eid: int  # ids of deferred calls that must enter the queue after all: below every SimPy id, in order
    _far: list[Any]  # interpreted: call_later_far's entries not yet in the queue, all after its head (a heap)
    _far_t: float  # the time of the far heap's head (inf: empty); compiled, of _wfar's
    _wq: list[Wake]  # compiled: the near wake-ups, sorted latest first (the next is the last item; see _npush)
    _wfar: list[Wake]  # compiled: wake-ups not yet in _wq, all after its head (a heap: call_later_far, _spill)

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
        self._wq = []
        self._wfar = []

    @property
    def now(self) -> float:
        """The current simulation time (SimPy's ``Environment.now``, typed for compiled callers)."""
        return self._now

    def peek(self) -> float:
        """The time of the next event, ``inf`` when none is left (SimPy's ``Environment.peek``, over both queues)."""
        q = self._queue
        t = _INF
        if q:
            head: tuple[float, ...] = q[0]
            t = head[0]
        wq = self._wq
        if wq:
            wt = wq[-1].t
            if wt < t:
                t = wt
        return t

    def step(self) -> None:
        """Process the next event (SimPy 4.1.2's ``Environment.step``); ``EmptySchedule`` when none is left."""
        q = self._queue
        wq = self._wq
        if wq and (not q or _wake_first(wq[-1], q[0])):
            w = wq.pop()
            _next_wfar(self)
            self._now = w.t
            fn = w.fn
            w.fn = None  # processed
            if fn is not None:
                fn(w)
            return
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
        self._soon_on = True
        try:
            if _COMPILED:
                self._run_wakes(stop)
            else:
                self._run_queue(stop)
        finally:
            self._soon_on = False

    def _run_wakes(self, stop: float) -> None:
        """:meth:`run_until`'s loop, compiled: the earlier of the wake-ups' head and SimPy's queue's, each time."""
        q = self._queue
        wq = self._wq
        soon = self._soon
        while wq or q:
            if wq:
                w = wq[-1]
                if not q or _wake_first(w, q[0]):  # a wake-up is next (always, unless SimPy's own events are queued)
                    t = w.t
                    if not t < stop:
                        return
                    wq.pop()
                    if not wq or self._far_t <= wq[-1].t:  # the far heap's head may be next (a float test per event)
                        _next_wfar(self)
                    self._now = t
                    fn = w.fn
                    w.fn = None  # processed
                    if fn is not None:
                        fn(w)
                    if soon:
                        self._run_soon()
                    continue
            if not self._step_queue(stop):  # one of SimPy's events is next
                return

    def _step_queue(self, stop: float) -> bool:
        """Process the head of SimPy's queue if it is before ``stop`` (False: it is not, nothing done)."""
        q = self._queue
        head: tuple[float, ...] = q[0]
        if not head[0] < stop:
            return False
        entry: tuple[Any, ...] = heap_pop(q)
        t: float = entry[0]
        self._now = t
        _fire(self, entry[3])
        if self._soon:
            self._run_soon()
        return True

    def _run_queue(self, stop: float) -> None:
        """:meth:`run_until`'s loop, interpreted: the wake-ups are entries of SimPy's queue."""
        q = self._queue
        soon = self._soon
        while q:
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

    def _run_soon(self) -> None:
        """Run the deferred calls in order, each as the event ``call_later(env, 0.0, fn)`` would have been.

        Each would have been the first NORMAL event of this instant (nothing else was due now when it was
        deferred; what was scheduled after it comes after it), so it runs now, unless an URGENT event of this
        instant was scheduled since: that one runs first, so the rest enter the queue at NORMAL priority with ids
        below every SimPy id (in their order), which puts them before the NORMAL events of this instant."""
        soon = self._soon
        q = self._queue
        wq = self._wq
        now = self._now
        i = 0
        while i < len(soon):
            if (q and q[0][0] <= now and q[0][1] < _NORMAL) or (wq and wq[-1].t <= now and wq[-1].prio < _NORMAL):
                for fn in soon[i:]:
                    _schedule(self, now, _NORMAL, self._soon_eid, fn)
                    self._soon_eid += 1
                break
            fn = soon[i]
            i += 1
            fn(None)
        soon.clear()


def _next_far(env: SimEnv) -> None:
    """After a pop (interpreted): the far heap's head enters the queue when it is the next event (see
    :func:`call_later_far`)."""
    far = env._far
    q = env._queue
    if far and (not q or _before(far[0], q[0])):
        heap_push(q, heap_pop(far))
        env._far_t = far[0][0] if far else _INF


def _next_wfar(env: SimEnv) -> None:
    """After a pop (compiled): the far heap's head enters the near wake-ups when it is before their head."""
    far = env._wfar
    wq = env._wq
    if far and (not wq or _wbefore(far[0], wq[-1])):
        wq.append(_fpop(far))  # before every near one: the new head, at the end
        env._far_t = far[0].t if far else _INF


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
# per pair), about a fifth of the model's instructions. D's pin deadlines use it too (a decode batch's finishes
# and a link's flows are sorted lists, below): any heap of tuples whose first item is a float and whose entries
# are all different (a unique id second), popped only through :func:`heap_pop`. The far wake-ups are the same
# heap on Wake entries (:func:`_fpush`, :func:`_fpop`).

def _before(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """``a < b`` for two queue entries: by time, then (same time) as tuples (priority, then id)."""
    ta = a[0]
    tb = b[0]
    if ta != tb:
        return ta < tb
    return bool(a < b)


def _wbefore(a: Wake, b: Wake) -> bool:
    """``a`` before ``b`` in SimPy's order (compiled: three native field compares, see :class:`Wake`)."""
    if a.t != b.t:
        return a.t < b.t
    if a.prio != b.prio:
        return a.prio < b.prio
    return a.eid < b.eid


def _wake_first(w: Wake, entry: tuple[Any, ...]) -> bool:
    """The wake-up ``w`` is before SimPy's queue entry ``entry`` (``(time, priority, id, event)``)."""
    t: float = entry[0]
    if w.t != t:
        return w.t < t
    prio: int = entry[1]
    if w.prio != prio:
        return w.prio < prio
    eid: int = entry[2]
    return w.eid < eid


def _npush(env: SimEnv, w: Wake) -> None:
    """Queue ``w`` among the near wake-ups (``SimEnv._wq``): a list sorted latest first, so the next one is popped
    from its end.

    The near wake-ups are few (the reference run: about a dozen; far ones wait in the far heap, ``call_later_far``),
    and for a few a sorted list beats a binary heap: the insertion is a binary search (a compare per halving) and
    one ``list.insert`` (a short memmove), the pop is ``list.pop()``, where a heap's pop sifts through every level
    with two reads, a compare and a write each. The order is SimPy's either way (keys are unique). Past
    :data:`_NEAR_CAP` entries, the latest half moves to the far heap (:func:`_spill`), so an insertion stays cheap."""
    h = env._wq
    lo: i64 = 0
    hi: i64 = len(h)  # i64: see _fpush
    while lo < hi:
        mid = (lo + hi) >> 1
        if _wbefore(h[mid], w):  # h[mid] comes first: w goes before it in the list
            hi = mid
        else:
            lo = mid + 1
    h.insert(lo, w)
    if len(h) > _NEAR_CAP:
        _spill(env)


def _spill(env: SimEnv) -> None:
    """Move the latest half of the near wake-ups to the far heap (all are after the near head, which stays)."""
    h = env._wq
    k = len(h) // 2
    far = env._wfar
    for w in h[:k]:
        _fpush(far, w)
    del h[:k]
    env._far_t = far[0].t


def _fpush(h: list[Wake], w: Wake) -> None:
    """:func:`heap_push` on a heap of wake-ups (heapq's sift, :func:`_settle`)."""
    h.append(w)
    pos: i64 = len(h) - 1  # i64 (mypyc's native int): list reads and writes by a C integer, no tagged-int checks
    while pos > 0:
        parent_pos = (pos - 1) >> 1
        parent = h[parent_pos]
        if not _wbefore(w, parent):
            break
        h[pos] = parent
        pos = parent_pos
    h[pos] = w


def _fpop(h: list[Wake]) -> Wake:
    """:func:`heap_pop` on a heap of wake-ups (``h`` not empty)."""
    last = h.pop()
    if not h:
        return last
    top = h[0]
    end: i64 = len(h)  # i64: see _fpush
    pos: i64 = 0
    child: i64 = 1
    while child < end:
        smaller = h[child]
        right = child + 1
        if right < end:
            other = h[right]
            if not _wbefore(smaller, other):
                child = right
                smaller = other
        h[pos] = smaller
        pos = child
        child = 2 * pos + 1
    while pos > 0:  # then ``last`` sifts down from that leaf
        parent_pos = (pos - 1) >> 1
        parent = h[parent_pos]
        if not _wbefore(last, parent):
            break
        h[pos] = parent
        pos = parent_pos
    h[pos] = last
    return top


def heap_push(q: list[Any], item: Any) -> None:
    """``heapq.heappush(q, item)`` (interpreted, it is heapq's: see below)."""
    entry: tuple[float, ...] = item
    q.append(entry)
    _settle(q, len(q) - 1, entry)


def _settle(q: list[Any], pos: i64, entry: tuple[float, ...]) -> None:
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
    end: i64 = len(q)  # i64: see _fpush
    pos: i64 = 0
    child: i64 = 1
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


# ---- small priority queues as sorted lists ----------------------------------------------------------------
# The model's short queues of ``(time or step, unique int, ...)`` entries (a decode batch's finishes, a link's
# flows): a list kept in ascending order, the next entry at ``q[0]`` as in a heap. For the few entries they hold
# (a batch's members, a link's flows in flight) an insertion (a binary search and one ``list.insert``) and
# ``q.pop(0)`` (one short memmove) cost fewer compares and writes than a heap's sifts, compiled and interpreted
# (there ``bisect.insort`` and ``list.pop`` are C). Entries are all different, so the order is the heap's.

def sorted_push(q: list[Any], item: Any) -> None:
    """``bisect.insort(q, item)`` (interpreted, it is bisect's: see below)."""
    entry: tuple[float, ...] = item
    lo: i64 = 0
    hi: i64 = len(q)  # i64: see _fpush
    while lo < hi:
        mid = (lo + hi) >> 1
        other: tuple[float, ...] = q[mid]
        if _before(entry, other):
            hi = mid
        else:
            lo = mid + 1
    q.insert(lo, entry)


def sorted_pop(q: list[Any]) -> Any:
    """The first (smallest) entry of the sorted list ``q`` (not empty), removed."""
    return q.pop(0)


if not _COMPILED:  # interpreted, C functions themselves: no Python call around each insertion and pop
    sorted_push = _insort  # type: ignore[assignment]
    sorted_pop = _pop_first  # type: ignore[assignment]



def _schedule(env: SimEnv, t: float, prio: int, eid: int, fn: Callable[[Any], None]) -> Wake:
    """Queue the wake-up ``fn`` at ``(t, prio, eid)``: compiled in the wake-up heap, interpreted in SimPy's queue."""
    w = Wake(fn, t, prio, eid)
    if _COMPILED:
        _npush(env, w)
    else:
        heap_push(env._queue, (t, prio, eid, w))
    return w


def call_later(env: SimEnv, delay: float, fn: Callable[[Any], None]) -> Wake:
    """Call ``fn(event)`` ``delay`` seconds from now (``delay >= 0``), in SimPy's event order; returns the event
    ``fn`` will get (a timer superseded by a later one knows itself by it: no closure per wake-up)."""
    if delay < 0:
        raise ValueError(f"Negative delay {delay}")
    t = env._now + delay
    if _COMPILED:  # _schedule written out: the most frequent wake-up
        w = Wake(fn, t, _NORMAL, env._ids.take())
        _npush(env, w)
        return w
    eid = _next(env._eid)
    w = Wake(fn, t, _NORMAL, eid)
    heap_push(env._queue, (t, _NORMAL, eid, w))
    return w


def call_later_far(env: SimEnv, delay: float, fn: Callable[[Any], None]) -> None:
    """``call_later(env, delay, fn)`` for a wake-up usually far behind the events queued before it (a conversation's
    next turn, one think time away): same entry, same order, but while :meth:`SimEnv.run_until` steps it waits in the
    clock's far heap unless it would be the queue's head, and enters the queue when it is the next event.

    The queue keeps its head: every far entry is after it (checked after each pop, :func:`_next_far`), so
    ``peek`` and the order are unchanged; entries keep their SimPy id. What it saves: the queue holds the near
    events only (the reference run: a dozen instead of ~190 pending turns), so its pushes and pops sift fewer levels.
    Compiled, the queue is the wake-up heap (``SimEnv._wq``) and the far heap ``SimEnv._wfar``."""
    if delay < 0:
        raise ValueError(f"Negative delay {delay}")
    t = env._now + delay
    eid = env._ids.take() if _COMPILED else _next(env._eid)
    if _COMPILED:
        w = Wake(fn, t, _NORMAL, eid)
        wq = env._wq
        if env._soon_on and wq and _wbefore(wq[-1], w):
            far = env._wfar
            _fpush(far, w)
            env._far_t = far[0].t
        else:
            _npush(env, w)
        return
    entry: Any = (t, _NORMAL, eid, Wake(fn, t, _NORMAL, eid))
    q = env._queue
    if env._soon_on and q and _before(q[0], entry):
        far_q = env._far
        heap_push(far_q, entry)
        env._far_t = far_q[0][0]
    else:
        heap_push(q, entry)


def call_soon(env: SimEnv, fn: Callable[[Any], None]) -> None:
    """``call_later(env, 0.0, fn)`` without an event when it can be: ``fn(None)`` runs right after the current
    event's callbacks if nothing else is due now (an event of this instant already queued runs before it, so
    then it is queued as ``call_later`` queues it; so is it outside :meth:`SimEnv.run_until`). Same order, same
    times: what it saves is a queue entry, its push and pop, per wake-up that nothing competes with."""
    now = env._now
    q = env._queue
    wq = env._wq
    # nothing due now in either queue (peek() written out: a call fewer per wake-up, interpreted too)
    if env._soon_on and not ((wq and wq[-1].t <= now) or (q and q[0][0] <= now)):
        env._soon.append(fn)
    else:
        _schedule(env, now + 0.0, _NORMAL, (env._ids.take() if _COMPILED else _next(env._eid)), fn)


def call_at(env: SimEnv, when: float, fn: Callable[[Any], None]) -> None:
    """Call ``fn(event)`` at the absolute time ``when`` (now if it has passed), in SimPy's event order.

    A wake-up for a deadline (a pin's expiry, a lease's lapse) must fire *at* the deadline: with
    ``call_later(env, when - now, ...)`` the clock lands on ``now + (when - now)``, which in floating point
    can be one ulp before ``when``, so a ``deadline <= now`` check there still finds nothing due."""
    eid = env._ids.take() if _COMPILED else _next(env._eid)
    _schedule(env, when if when > env._now else env._now, _NORMAL, eid, fn)


def call_first(env: SimEnv, fn: Callable[[Any], None]) -> None:
    """Call ``fn(event)`` now, before the NORMAL events of this instant: how SimPy starts a process
    (``Process.__init__`` schedules its ``Initialize`` event at URGENT priority)."""
    _schedule(env, env._now, _URGENT, (env._ids.take() if _COMPILED else _next(env._eid)), fn)
