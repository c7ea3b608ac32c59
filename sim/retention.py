"""D's retention of finished requests' KV blocks for a possible D->P read (bidirectional transfer).

Sources (vLLM): ``nixl/pull_scheduler.py`` ``request_finished`` (with ``bidirectional_kv_xfer`` every
request finishing as STOPPED or LENGTH_CAPPED returns ``delay_free_blocks=True`` with deadline
``now + decoder_kv_blocks_ttl``, never renewed: ``docs/design/nixl_kv_cache_lease.md``), the worker's
``get_finished`` (blocks freed by the reader's NIXL notification or once the deadline has passed).
Pinned blocks belong to a finished request: neither evictable nor preemptable.

This class only keeps the pins and their deadlines; the node moves the blocks between its pool's
``pinned`` and ``cached`` counts. Deadlines are checked lazily (filed in time order), whenever blocks are needed.

**The expiry rule, in one place** (every other module calls these functions):

* when a held block set expires: its deadline is fixed at the finish (:func:`pin_deadline_s`: ``finish +
  decoder_kv_blocks_ttl``; a lease's hold is chosen by ``sim/retention_policy.py``), the blocks exist while
  ``now < deadline`` (:func:`is_held`) and are due for release once ``deadline <= now`` (:func:`is_due`);
* the margin: P declines a D->P read when ``now + margin >= deadline`` (:func:`read_declined`, PR #47021
  ``pull_worker``), the margin being ``expiry_safety_margin_s`` plus P's clock error against D's clock
  (:func:`read_margin_s`), so no read starts after the deadline minus the margin;
* what an expiry does: ``DecodeNode._expire`` (``sim/decode.py``) releases every due pin no read holds, as
  of its deadline (``Release.EXPIRED``): its blocks become LRU prefix cache, or go to the host tier when
  ``policy.offload`` is on. It runs lazily, whenever D needs blocks (admission, batch growth), when P asks
  for host-tier tokens, and at the admission wake-up set for the next deadline; at the end of the run every
  pin still held expires at its deadline (``DecodeNode.expire_all``).

The router's own entry TTL (``policy.router_ttl_s``, the proxy's 450 s) is a different clock: a stale entry
is a router miss (``sim/router.py`` :: ``Router.lookup``), the pin itself is untouched.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from kvplan.sim.clock import heap_pop, heap_push

_INF = float("inf")


def pin_deadline_s(finish_s: float, hold_s: float) -> float:
    """D's ``remote_blocks_expiry_time`` of a request finished at ``finish_s`` held for ``hold_s`` (never renewed
    under vLLM's TTL; ``nixl/pull_scheduler.py`` ``request_finished``)."""
    return finish_s + hold_s


def is_held(now: float, deadline_s: float) -> bool:
    """Whether pinned blocks with this deadline still exist at ``now`` (the worker frees them once it has passed)."""
    return now < deadline_s


def is_due(now: float, deadline_s: float) -> bool:
    """Whether a pin with this deadline is due for release at ``now``."""
    return deadline_s <= now


def read_margin_s(safety_margin_s: float, clock_skew_s: float) -> float:
    """The margin P applies to D's deadline: its safety margin plus its clock's error against D's clock."""
    return safety_margin_s + clock_skew_s


def read_declined(now: float, deadline_s: float, margin_s: float) -> bool:
    """PR #47021 (``pull_worker``): P declines a read of blocks whose deadline is within ``margin_s`` of ``now``."""
    return now + margin_s >= deadline_s


class Pin:
    """Blocks a finished request keeps for a possible D->P read."""

    __slots__ = ("conv", "tokens", "blocks", "expiry_s", "reading", "shared")

    def __init__(self, conv: int, tokens: int, blocks: int, expiry_s: float) -> None:
        self.conv = conv
        self.tokens = tokens
        self.blocks = blocks
        self.expiry_s = expiry_s
        self.reading = False
        self.shared = 0  # tokens of a shared prefix (sim/shared.py) pinned once for the group, not in ``blocks``


class Retention:
    """The pins of one decode node, by id and by conversation, with their deadlines in time order.

    Deadlines are filed in two parts: a list in time order, to which a deadline is appended when it is not before
    the last one (pins are made in finish order and vLLM's TTL is fixed, so nearly all are), and a heap for the rest
    (a lease's deadline depends on the turn). The next deadline is the earlier of the two heads: the order of one
    heap of all of them (entries ``(deadline, pin id)`` are all different), at O(1) instead of O(log n) for most.
    ``due_from`` is the earliest deadline filed (inf: none), kept as deadlines are filed and taken, so "is anything
    due?" is one comparison (``now >= due_from``) on the decode node's per-step path, not a call."""

    __slots__ = ("pins", "of_conv", "_fifo", "_fifo_i", "_heap", "_next_id", "_stride", "due_from")

    def __init__(self, first_id: int, stride: int) -> None:
        self.pins: dict[int, Pin] = {}
        self.of_conv: dict[int, int] = {}
        self._fifo: list[tuple[float, int]] = []  # (deadline, pin id) in order, from index _fifo_i on
        self._fifo_i = 0
        self._heap: list[tuple[float, int]] = []  # those filed out of order (clock.heap_push)
        self._next_id = first_id  # unique across nodes: first_id + k * stride
        self._stride = stride
        self.due_from = _INF  # the earliest deadline filed (see the class)

    def _file(self, expiry_s: float, pid: int) -> None:
        """File a deadline (see the class): at the end of the ordered list unless it is before its last entry."""
        if expiry_s < self.due_from:
            self.due_from = expiry_s
        fifo = self._fifo
        if self._fifo_i < len(fifo):
            last: tuple[float, int] = fifo[-1]
            t = last[0]
            if expiry_s < t or (expiry_s == t and pid < last[1]):
                heap_push(self._heap, (expiry_s, pid))
                return
        elif fifo:
            fifo.clear()  # all taken: start over
            self._fifo_i = 0
        fifo.append((expiry_s, pid))

    def add(self, conv: int, tokens: int, blocks: int, expiry_s: float, shared: int = 0) -> tuple[int, int | None]:
        """Pin blocks (``shared``: see :class:`Pin`); returns (new pin id, the conversation's previous pin id if one
        was still held)."""
        pid = self._next_id
        self._next_id += self._stride
        pin = Pin(conv, tokens, blocks, expiry_s)
        pin.shared = shared
        key: Any = pid  # boxed once (see pop)
        self.pins[key] = pin
        ckey: Any = conv
        old = self.of_conv.get(ckey)
        self.of_conv[ckey] = key
        self._file(expiry_s, pid)
        return pid, old

    def alive(self, pid: int, now: float) -> bool:
        """Whether the pinned blocks still exist at ``now`` (deadline not passed, not yet released)."""
        key: Any = pid  # boxed once (see pop)
        pin = self.pins.get(key)
        return pin is not None and is_held(now, pin.expiry_s)

    def renew(self, pid: int, expiry_s: float) -> None:
        """Move a pin's deadline (a lease renewal); the old entry is skipped when it comes up."""
        pin = self.pins.get(pid)
        if pin is not None:
            pin.expiry_s = expiry_s
            self._file(expiry_s, pid)

    def lru_evictable(self) -> Iterator[int]:
        """Pin ids no read holds, oldest first (pins are created in finish order)."""
        return (pid for pid, pin in list(self.pins.items()) if not pin.reading)

    def mark_reading(self, pid: int) -> None:
        """A P worker posted a READ of these blocks: they stay until the read completes."""
        key: Any = pid  # boxed once (see pop)
        pin = self.pins.get(key)
        if pin is not None:
            pin.reading = True

    def pop(self, pid: int) -> Pin | None:
        """Remove a pin (released); None if it was already gone."""
        # get and del: native dictionary operations compiled (pop with a default is not); the keys are typed Any so
        # that compiled code boxes each int once, not at every dictionary call (a pin id or a conversation number
        # above 256 is a new int object each time)
        key: Any = pid
        pin = self.pins.get(key)
        if pin is not None:
            del self.pins[key]
            ckey: Any = pin.conv
            if self.of_conv.get(ckey) == pid:
                del self.of_conv[ckey]
        return pin

    def due(self, now: float) -> list[tuple[float, int]]:
        """(deadline, pin id) of every pin whose deadline has passed and that no read holds, in deadline order,
        each pin once; their entries are taken (the caller releases each pin, which changes no other pin)."""
        out: list[tuple[float, int]] = []
        listed: set[int] = set()  # pins already in ``out``
        fifo = self._fifo
        heap = self._heap
        while True:
            i = self._fifo_i
            if i < len(fifo):
                entry: tuple[float, int] = fifo[i]
                from_heap = False
                if heap:
                    h: tuple[float, int] = heap[0]
                    if h[0] < entry[0] or (h[0] == entry[0] and h[1] < entry[1]):
                        entry = h
                        from_heap = True
            elif heap:
                entry = heap[0]
                from_heap = True
            else:
                break
            expiry = entry[0]
            if not is_due(now, expiry):
                break
            if from_heap:
                heap_pop(heap)
            else:
                self._fifo_i = i + 1
            pid = entry[1]
            pin = self.pins.get(pid)
            if pin is not None and not pin.reading and pin.expiry_s <= expiry:  # else renewed: a later entry
                if pid in listed:
                    continue  # filed twice (renewed to an earlier or the same deadline): released at its first
                listed.add(pid)
                out.append((expiry, pid))
        i = self._fifo_i
        if i > 256 and 2 * i > len(fifo):  # drop the taken front now and then (amortised O(1))
            del fifo[:i]
            self._fifo_i = 0
        t = self.next_expiry()  # the due entries are taken: every deadline still filed is after ``now``
        self.due_from = t if t is not None else _INF
        return out

    def next_expiry(self) -> float | None:
        """The earliest deadline still filed (may belong to a pin already released)."""
        i = self._fifo_i
        heap = self._heap
        if i < len(self._fifo):
            t = self._fifo[i][0]
            if heap and heap[0][0] < t:
                return heap[0][0]
            return t
        return heap[0][0] if heap else None

    def next_expiry_due(self, now: float) -> bool:
        """Whether some filed deadline has passed (cheap check before :meth:`due`; hot callers compare ``due_from``)."""
        return is_due(now, self.due_from)

    def all_by_expiry(self) -> list[int]:
        """Every pin still held, by deadline (end of run)."""
        return sorted(self.pins, key=lambda p: (self.pins[p].expiry_s, p))

    def clear_deadlines(self) -> None:
        """Forget pending deadlines (end of run)."""
        self._fifo.clear()
        self._fifo_i = 0
        self._heap.clear()
        self.due_from = _INF
