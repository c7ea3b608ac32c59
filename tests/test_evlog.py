"""The event log's two row buffers (sim/evlog.py packed as emitted, sim/events.py's tuples packed per flush)
give the same bytes, and the log picks the one that fits how sim/evlog.py runs."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvplan.sim import events
from kvplan.sim.events import Decision, Ev, EventLog, _TupleRows, new_row_buffer
from kvplan.sim.evlog import RowBuffer

ROWS: list[tuple[Any, ...]] = [
    (0.0, Ev.ARRIVE, 0, 1, -1, 2100.0, 120.0),
    (1.5, int(Ev.P_DECISION), 3, 2, 0, float(Decision.PULL), 7),  # an int where a float goes
    (np.float64(2.25), Ev.D_ITL, np.int64(5), np.int32(9), 1, np.nan, float("inf")),  # NumPy scalars
    (3.0, Ev.ITL_HIST, -1, -1, 0, -350.0, 12.0),
]


def test_tuple_rows_pack_the_same_bytes_as_row_buffer() -> None:
    packed, tuples = RowBuffer(cap_rows=1), _TupleRows()  # cap 1: RowBuffer grows on the way
    for r in ROWS * 3:
        packed.append(r)
        tuples.append(r)
    assert len(packed) == len(tuples) == 12
    assert repr(tuples.rows()) == repr(packed.rows())  # repr: NaN equals NaN
    assert tuples.take() == packed.take()
    assert len(tuples) == len(packed) == 0  # both start over
    tuples.append(ROWS[0])
    packed.append(ROWS[0])
    assert tuples.take() == packed.take()


def test_tuple_rows_refuse_what_row_buffer_refuses() -> None:
    bad: tuple[Any, ...] = (0.0, Ev.ARRIVE, 1.5, 1, 0, 0.0, 0.0)  # a float conversation id
    with pytest.raises(Exception) as packed_err:
        RowBuffer().append(bad)
    tuples = _TupleRows()
    tuples.append(bad)
    with pytest.raises(type(packed_err.value)):
        tuples.take()


def test_log_uses_the_buffer_that_fits_the_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(events, "_PACKED_AS_EMITTED", True)
    assert type(new_row_buffer()) is RowBuffer
    monkeypatch.setattr(events, "_PACKED_AS_EMITTED", False)
    assert type(new_row_buffer()) is _TupleRows
    log = EventLog(keep=True)
    for r in ROWS:
        log.append(r)
    assert len(log) == 4 and list(log)[1][5] == float(Decision.PULL)
    ch = log.flush()
    assert ch.kind.tolist() == [int(r[1]) for r in ROWS] and ch.conv.tolist() == [0, 3, 5, -1]
    assert np.isnan(ch.a[2]) and ch.b[2] == float("inf") and log.total == 4 and len(log) == 0
