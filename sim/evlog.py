"""The event log's write side: each event packed as one fixed-size binary row the moment it is emitted.

``RowBuffer.append((t_s, kind, conv, turn, node, a, b))`` packs the row into a growing ``bytearray`` with
one ``struct`` call (little-endian ``d q q q q d d``, 56 bytes: the layout of :data:`ROW_FORMAT`), so a
run never holds Python tuples for its events and a flush is one zero-copy ``numpy.frombuffer``
(``events.EventLog.flush``). Compiled with the hot path (sim/native.py), an emit site passes the row
without building a tuple object. Values are converted exactly as NumPy's typed columns would convert
them (floats to IEEE doubles, integers and IntEnum members to int64).
"""

from __future__ import annotations

import struct
from typing import Final

ROW_FORMAT: Final = "<dqqqqdd"  # t_s, kind, conv, turn, node, a, b
ROW_BYTES: Final = struct.calcsize(ROW_FORMAT)
_PACK: Final = struct.Struct(ROW_FORMAT).pack_into

Row = tuple[float, int, int, int, int, float, float]


class RowBuffer:
    """Packed rows appended since the last :meth:`take`."""

    __slots__ = ("buf", "n", "cap")

    def __init__(self, cap_rows: int = 4096) -> None:
        self.cap = max(cap_rows, 1)
        self.buf = bytearray(self.cap * ROW_BYTES)
        self.n = 0

    def append(self, row: Row) -> None:
        """Pack one event ``(t_s, kind, conv, turn, node, a, b)``."""
        if self.n == self.cap:
            self.buf.extend(bytes(self.cap * ROW_BYTES))  # double the capacity
            self.cap *= 2
        _PACK(self.buf, self.n * ROW_BYTES, row[0], row[1], row[2], row[3], row[4], row[5], row[6])
        self.n += 1

    def __len__(self) -> int:
        return self.n

    def take(self) -> bytes:
        """The packed rows so far (a copy), and start over (the buffer's memory is kept for reuse)."""
        data = bytes(memoryview(self.buf)[: self.n * ROW_BYTES])  # one copy
        self.n = 0
        return data

    def rows(self) -> list[Row]:
        """The rows not yet taken, unpacked (for readers of the unflushed tail; not the hot path)."""
        out: list[Row] = []
        for r in struct.iter_unpack(ROW_FORMAT, bytes(self.buf[: self.n * ROW_BYTES])):
            out.append((r[0], r[1], r[2], r[3], r[4], r[5], r[6]))
        return out
