"""The event log's write side: each event packed as one fixed-size binary row the moment it is emitted.

``RowBuffer.append((t_s, kind, conv, turn, node, a, b))`` packs the row (little-endian ``d q q q q d d``, 56
bytes: the layout of :data:`ROW_FORMAT`), so a run never holds Python tuples for its events and a flush is one
zero-copy ``numpy.frombuffer`` (``events.EventLog.flush``). Compiled with the hot path (sim/native.py), an emit
site passes the row without building a tuple object and the row is written field by field into a
``librt.strings.BytesWriter`` (mypyc's runtime library, installed with mypy: each ``write_f64_le`` /
``write_i64_le`` is an inline C store, no Python object per value). Interpreted runs log into
``events.TupleRows`` instead (a list: ``append`` is ``list.append``, no Python frame per event), packed with this
format after every slice of simulated time; :class:`RowBuffer` interpreted (tests, direct users) packs each row with
one ``struct.pack_into`` call into a growing ``bytearray``. All give the same bytes: values are converted exactly as
NumPy's typed columns would convert them (floats to IEEE doubles, integers and IntEnum members to int64).
"""

from __future__ import annotations

import struct
from typing import Final

_COMPILED: Final = not __file__.endswith(".py")  # see sim/clock.py
if _COMPILED:  # mypyc's runtime library (a dependency of mypy, so of every compiled build)
    from librt.strings import BytesWriter, write_f64_le, write_i64_le

ROW_FORMAT: Final = "<dqqqqdd"  # t_s, kind, conv, turn, node, a, b
ROW_BYTES: Final = struct.calcsize(ROW_FORMAT)
_PACK: Final = struct.Struct(ROW_FORMAT).pack_into

Row = tuple[float, int, int, int, int, float, float]

# The codes of the event kinds and of the values logged in ``a``/``b`` (sim/events.py's IntEnums, which are
# checked against these at import): literal Finals, so the compiled hot path logs and compares C constants
# instead of reading an enum member (a module lookup and a metaclass ``__getattr__`` per use).
# Ev (sim/events.py)
EV_ARRIVE: Final = 0
EV_ROUTER: Final = 1
EV_P_ENQUEUE: Final = 2
EV_P_DECISION: Final = 3
EV_PULL_START: Final = 4
EV_PULL_DONE: Final = 5
EV_P_COMPUTE: Final = 6
EV_P_DONE: Final = 7
EV_D_ENQUEUE: Final = 8
EV_D_ADMIT: Final = 9
EV_P2D_START: Final = 10
EV_P2D_DONE: Final = 11
EV_D_FIRST: Final = 12
EV_D_FINISH: Final = 13
EV_PIN: Final = 14
EV_UNPIN: Final = 15
EV_ERROR: Final = 16
EV_SKIP: Final = 17
EV_D_PREEMPT: Final = 30
EV_D_RECOMPUTE: Final = 31
EV_P_UNHOLD: Final = 33
EV_P2D_FAILED: Final = 34
EV_D_ITL: Final = 35
EV_ITL_HIST: Final = 36

# Decision (sim/events.py)
DEC_LOCAL: Final = 0
DEC_PULL: Final = 1
DEC_RECOMPUTE_BELOW_THRESHOLD: Final = 2
DEC_MISS: Final = 3
DEC_EXPIRED: Final = 4
DEC_ERROR: Final = 5
DEC_HOST_PULL: Final = 6

# RouterResult (sim/events.py)
RR_HIT: Final = 0
RR_NO_ENTRY: Final = 1
RR_STALE: Final = 2
RR_NO_CONVERSATION_ID: Final = 3

# Release (sim/events.py)
REL_READ: Final = 0
REL_NOTIFIED: Final = 1
REL_EXPIRED: Final = 2
REL_REUSED: Final = 3
REL_EVICTED: Final = 4

# HoldRelease (sim/events.py)
HOLD_READ: Final = 0
HOLD_NOTIFIED: Final = 1
HOLD_LAPSED: Final = 2
HOLD_END: Final = 3


class RowBuffer:
    """Packed rows appended since the last :meth:`take`."""

    __slots__ = ("buf", "n", "cap", "w")

    def __init__(self, cap_rows: int = 4096) -> None:
        self.cap = max(cap_rows, 1)
        self.n = 0
        if _COMPILED:
            self.w = BytesWriter()
            self.buf = bytearray()
        else:
            self.buf = bytearray(self.cap * ROW_BYTES)

    def append(self, row: Row) -> None:
        """Pack one event ``(t_s, kind, conv, turn, node, a, b)``."""
        if _COMPILED:  # seven inline stores (the writer grows itself)
            w = self.w
            write_f64_le(w, row[0])
            write_i64_le(w, row[1])
            write_i64_le(w, row[2])
            write_i64_le(w, row[3])
            write_i64_le(w, row[4])
            write_f64_le(w, row[5])
            write_f64_le(w, row[6])
            self.n += 1
            return
        if self.n == self.cap:
            self.buf.extend(bytes(self.cap * ROW_BYTES))  # double the capacity
            self.cap *= 2
        _PACK(self.buf, self.n * ROW_BYTES, row[0], row[1], row[2], row[3], row[4], row[5], row[6])
        self.n += 1

    def __len__(self) -> int:
        return self.n

    def _packed(self) -> bytes:
        """The rows not yet taken (a copy)."""
        if _COMPILED:
            return self.w.getvalue()
        return bytes(memoryview(self.buf)[: self.n * ROW_BYTES])

    def take(self) -> bytes:
        """The packed rows so far (a copy), and start over (the buffer's memory is kept for reuse)."""
        data = self._packed()  # one copy
        self.n = 0
        if _COMPILED:
            self.w.truncate(0)
        return data

    def rows(self) -> list[Row]:
        """The rows not yet taken, unpacked (for readers of the unflushed tail; not the hot path)."""
        out: list[Row] = []
        for r in struct.iter_unpack(ROW_FORMAT, self._packed()):
            out.append((r[0], r[1], r[2], r[3], r[4], r[5], r[6]))
        return out
