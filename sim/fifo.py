"""The engines' FIFO queues (P's WAITING, D's admission queue, the decode batch's joiners): compiled hot path.

``collections.deque`` is C, but from compiled code (sim/native.py) each of its methods, ``q[0]``, ``len(q)`` and
``if q`` is a generic Python call (a method lookup by name, boxed arguments: ~200 instructions each, about ten per
turn). :class:`Fifo` is the part of deque's interface the engines use, written as a native class: a list and the
index of its head, so each operation is a native call on native list operations. Interpreted, a Python class
would be slower than deque's C methods, so :func:`new_fifo` returns a ``deque`` there (the same behaviour:
``tests/test_fifo.py`` runs both through random operations). Type the queue ``Fifo[T]``, make it with
:func:`new_fifo`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Any, Final, Generic, TypeVar

T = TypeVar("T")

_COMPILED: Final = not __file__.endswith(".py")  # see sim/clock.py
_COMPACT: Final = 32  # popped slots kept at most (and at most as many as live ones) before the list is shifted


class Fifo(Generic[T]):
    """``deque``'s ``append``, ``appendleft``, ``popleft``, ``remove``, ``q[i]``, ``len``, truth and iteration.

    The items are ``_items[_head:]``; ``popleft`` moves the head and shifts the list only once the popped slots
    outnumber both :data:`_COMPACT` and the live items (amortised O(1)); an emptied queue is cleared at once."""

    __slots__ = ("_items", "_head")

    def __init__(self, items: list[T] | None = None) -> None:
        self._items: list[T] = list(items) if items is not None else []
        self._head = 0

    def __len__(self) -> int:
        return len(self._items) - self._head

    def __bool__(self) -> bool:
        return len(self._items) > self._head

    def __getitem__(self, i: int) -> T:
        n = len(self._items) - self._head
        if i < 0:
            i += n
        if i < 0 or i >= n:
            raise IndexError("Fifo index out of range")
        return self._items[self._head + i]

    def __iter__(self) -> Iterator[T]:
        return iter(self._items[self._head:])

    def __repr__(self) -> str:
        return f"Fifo({self._items[self._head:]!r})"

    def append(self, x: T) -> None:
        """Add ``x`` at the tail."""
        self._items.append(x)

    def appendleft(self, x: T) -> None:
        """Put ``x`` back at the head (a popped slot is reused when there is one)."""
        h = self._head
        if h > 0:
            h -= 1
            self._items[h] = x
            self._head = h
        else:
            self._items.insert(0, x)

    def popleft(self) -> T:
        """Remove and return the head (IndexError when empty)."""
        items = self._items
        h = self._head
        if h >= len(items):
            raise IndexError("pop from an empty Fifo")
        x = items[h]
        h += 1
        if h == len(items):
            items.clear()
            h = 0
        elif h >= _COMPACT and h + h >= len(items):
            del items[:h]
            h = 0
        self._head = h
        return x

    def remove(self, x: T) -> None:
        """Remove the first item equal to ``x`` (ValueError when there is none)."""
        i = self._items.index(x, self._head)
        del self._items[i]


def new_fifo() -> Fifo[Any]:
    """An empty queue: a :class:`Fifo` compiled, a ``deque`` interpreted (see the module's docstring)."""
    if _COMPILED:
        return Fifo()
    return deque()  # type: ignore[return-value]
