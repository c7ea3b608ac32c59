"""sim/fifo.py's ``Fifo`` (the compiled build's queue) behaves as ``collections.deque`` (the interpreted one)."""

from __future__ import annotations

from collections import deque

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.sim.fifo import Fifo, new_fifo

OPS = st.lists(st.tuples(st.sampled_from(["append", "appendleft", "popleft", "remove", "index", "peek"]),
                         st.integers(0, 40)), max_size=400)


@settings(max_examples=300, deadline=None)
@given(OPS)
def test_fifo_answers_as_deque(ops: list[tuple[str, int]]) -> None:
    """Random appends at both ends, pops (long runs too, so the list is shifted), removals and reads: after each
    step the same items, length, truth, indexing and errors as a deque."""
    f: Fifo[int] = Fifo()
    d: deque[int] = deque()
    for op, x in ops:
        if op in ("append", "appendleft"):
            getattr(f, op)(x)
            getattr(d, op)(x)
        elif op == "popleft":
            if d:
                assert f.popleft() == d.popleft()
            else:
                with pytest.raises(IndexError):
                    f.popleft()
        elif op == "remove":
            v = x % 8
            if v in d:
                f.remove(v)
                d.remove(v)
            else:
                with pytest.raises(ValueError):
                    f.remove(v)
        elif op == "index":
            i = x - 20
            if -len(d) <= i < len(d):
                assert f[i] == d[i]
            else:
                with pytest.raises(IndexError):
                    f[i]
        else:
            for _ in range(x):  # a run of pops: the popped slots outnumber the live ones
                if d:
                    assert f.popleft() == d.popleft()
        assert list(f) == list(d) and len(f) == len(d) and bool(f) == bool(d)


def test_new_fifo_is_a_deque_interpreted() -> None:
    """Interpreted, the engines' queues stay deques (C methods); compiled, Fifo (native calls)."""
    import kvplan.sim.fifo as fifo

    q = new_fifo()
    assert isinstance(q, Fifo if fifo._COMPILED else deque) and not q
