"""The two row buffers of the event log give the same bytes: the compiled hot path's packed ``RowBuffer`` and the
interpreted runs' ``TupleRows`` (a list packed per flush), on random rows of every value type an emit site passes
(floats, ints, bools, IntEnum members), over several takes."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.sim.events import Decision, Ev, EventLog, TupleRows
from kvplan.sim.evlog import RowBuffer

_I64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_ANY_INT = st.one_of(_I64, st.booleans(), st.sampled_from(list(Ev)), st.sampled_from(list(Decision)))
_NUM = st.one_of(st.floats(allow_nan=False), st.integers(min_value=-(2**53), max_value=2**53), st.sampled_from(list(Ev)))
_ROW = st.tuples(_NUM, _ANY_INT, _ANY_INT, _ANY_INT, _ANY_INT, _NUM, _NUM)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(_ROW, max_size=40), min_size=1, max_size=4))
def test_tuple_rows_pack_as_row_buffer(batches: list[list[tuple]]) -> None:
    packed, listed = RowBuffer(cap_rows=3), TupleRows()
    for rows in batches:
        for r in rows:
            packed.append(r)
            listed.append(r)
        assert len(packed) == len(listed) == len(rows)
        assert listed.rows() == packed.rows()
        assert listed.take() == packed.take()
        assert len(listed) == 0


def test_unpackable_value_is_refused_at_the_flush() -> None:
    listed = TupleRows()
    listed.append((0.0, 1.5, 0, 0, 0, 0.0, 0.0))  # type: ignore[arg-type]  # a float where the kind (int64) goes
    with pytest.raises(struct.error):
        listed.take()


def test_event_log_reads_back_what_was_appended() -> None:
    log = EventLog()
    log.append((0.5, Ev.ARRIVE, 3, 1, -1, 100, 20))
    log.flush()
    log.append((1.0, Ev.ROUTER, 3, 1, -1, 0, 0))
    assert list(log.rows()) == [(0.5, 0, 3, 1, -1, 100.0, 20.0), (1.0, 1, 3, 1, -1, 0.0, 0.0)]
    assert log.total == 2


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.lists(_ROW, max_size=20), st.booleans()), min_size=1, max_size=6))
def test_packing_between_slices_keeps_the_bytes(slices: list[tuple[list[tuple], bool]]) -> None:
    packed, listed = RowBuffer(), TupleRows()
    for rows, take in slices:
        for r in rows:
            packed.append(r)
            listed.append(r)
        listed.pack()
        assert len(listed) == len(packed)
        if take:
            assert listed.take() == packed.take()
    assert listed.rows() == packed.rows()
    assert listed.take() == packed.take()
