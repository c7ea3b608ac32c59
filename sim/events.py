"""The append-only event log: the single source of truth of a run.

Every record is ``(t_s, kind, conv, turn, node, a, b)``, appended in simulation order (except lazily
expired retention, whose release is logged with its true expiry time when noticed) through
``ctx.log.append(...)`` (the compiled nodes append to ``ctx.log.buf``). :class:`EventLog` packs the rows
of the current slice of simulated time as binary rows (sim/evlog.py) and turns them into typed columnar
chunks (:class:`EventChunk`, NumPy arrays) when the engine flushes it, so a run never holds Python tuples
for its events. Per-turn records, the summary and every time series are
functions of this log (``results.py``, streamed by ``stream.py``). The meaning of ``a`` and ``b`` per kind
is in :data:`SCHEMA` (one :class:`EventSpec` per kind, named fields); readers name fields through it.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from enum import IntEnum
from itertools import starmap
from typing import Any, NamedTuple, cast

import numpy as np

from kvplan.sim import evlog
from kvplan.sim.evlog import ROW_BYTES, ROW_FORMAT, Row, RowBuffer

_PACK = struct.Struct(ROW_FORMAT).pack


class TupleRows(list[Row]):
    """Interpreted runs' row buffer: :class:`kvplan.sim.evlog.RowBuffer`'s interface (``append``, ``len``,
    :meth:`take`, :meth:`rows`) on a list, so an emit site's ``rows.append(row)`` is ``list.append`` (C code, no
    Python frame per event), and the rows are packed in bulk (``struct.pack`` mapped over them in C) at each
    :meth:`pack` (the engine calls it after every slice of simulated time: a few thousand live tuples at most,
    not a flush's worth) and at :meth:`take`. Same bytes as ``RowBuffer`` (the same ``struct`` format converts
    every value); a value that cannot be packed is refused at the next pack instead of at its emit site.
    Compiled, the nodes write into a ``RowBuffer``."""

    __slots__ = ("packed", "n_packed")

    def __init__(self) -> None:
        super().__init__()
        self.packed = bytearray()  # the rows packed so far (before the tuples still in the list)
        self.n_packed = 0

    def __len__(self) -> int:
        return self.n_packed + list.__len__(self)

    def pack(self) -> None:
        """Pack the listed rows behind the packed ones."""
        if list.__len__(self):
            self.packed += b"".join(starmap(_PACK, self))
            self.n_packed += list.__len__(self)
            self.clear()

    def take(self) -> bytes:
        """The packed rows so far, and start over."""
        self.pack()
        data = bytes(self.packed)
        self.packed.clear()
        self.n_packed = 0
        return data

    def rows(self) -> list[Row]:
        """The rows not yet taken, as packing and unpacking gives them back (floats for ``t_s``, ``a``, ``b``)."""
        self.pack()
        out: list[Row] = []
        for r in struct.iter_unpack(ROW_FORMAT, bytes(self.packed)):
            out.append((r[0], r[1], r[2], r[3], r[4], r[5], r[6]))
        return out


def row_buffer() -> RowBuffer:
    """A run's row buffer: compiled, the hot path's :class:`RowBuffer` (packed as rows come); interpreted, a
    :class:`TupleRows` (a list: cheaper per row in Python, packed per flush into the same bytes)."""
    return RowBuffer() if evlog._COMPILED else cast(RowBuffer, TupleRows())


class Ev(IntEnum):
    """Event kinds."""

    ARRIVE = 0  # turn reaches the router; a=prompt tokens, b=output tokens
    ROUTER = 1  # router lookup; a=RouterResult
    P_ENQUEUE = 2  # request reaches P's engine; node=P
    P_DECISION = 3  # connector decision when scheduled; a=Decision, b=local-hit tokens
    PULL_START = 4  # D->P read posted; node=D it reads from; a=tokens, b=bytes summed over ranks
    PULL_DONE = 5  # D->P read complete; a=xferDuration s (per rank), b=postDuration s
    P_COMPUTE = 6  # first prefill chunk of this request starts; a=tokens to compute
    P_DONE = 7  # P leg finished (its one token sampled); a=prefill compute wall time s, b=bytes P now holds for D
    D_ENQUEUE = 8  # request reaches D; node=D
    D_ADMIT = 9  # D allocated KV blocks; a=D local-hit tokens, b=blocks newly allocated
    P2D_START = 10  # P->D read posted; a=tokens, b=bytes summed over ranks
    P2D_DONE = 11  # P->D read complete; a=xferDuration s
    D_FIRST = 12  # first token (end of the first decode step including the request)
    D_FINISH = 13  # response complete; a=output tokens
    PIN = 14  # D retains blocks; node=D; a=tokens, b=expiry time s
    UNPIN = 15  # retention ends; node=D; a=tokens, b=Release
    ERROR = 16  # request failed; a=error reason (Decision.ERROR cause)
    SKIP = 17  # turn not sent (conversation ended by the context limit); a=prompt tokens
    D_PREEMPT = 30  # D preempted the running request (recompute); a=tokens sampled so far, b=KV tokens freed
    D_RECOMPUTE = 31  # preempted request readmitted on D, recomputing locally; a=tokens recomputed, b=D hit tokens
    P_UNHOLD = 33  # P frees the prompt's blocks it held from P_DONE for D's read; node=P; a=tokens, b=HoldRelease
    P2D_FAILED = 34  # D's read found P's lease lapsed: D recomputes locally; a=tokens recomputed, b=D hit tokens
    D_ITL = 35  # at D_FINISH: the turn's inter-token gaps (sim/itl.py); a=median s, b=maximum s (NaN: no gap)
    ITL_HIST = 36  # end of run, per engine and gap bucket (not a turn event): a=bucket key, b=gaps counted


class Decision(IntEnum):
    """What P did with a turn (``turns.csv`` column ``decision``)."""

    LOCAL = 0
    PULL = 1
    RECOMPUTE_BELOW_THRESHOLD = 2
    MISS = 3
    EXPIRED = 4
    ERROR = 5
    HOST_PULL = 6  # D's blocks were gone from HBM but P pulled them from D's host-memory offload tier


DECISION_NAMES = {
    Decision.LOCAL: "local",
    Decision.PULL: "pull",
    Decision.RECOMPUTE_BELOW_THRESHOLD: "recompute_below_threshold",
    Decision.MISS: "miss",
    Decision.EXPIRED: "expired",
    Decision.ERROR: "error",
    Decision.HOST_PULL: "host_pull",
}


class RouterResult(IntEnum):
    """Router lookup outcome."""

    HIT = 0
    NO_ENTRY = 1
    STALE = 2
    NO_CONVERSATION_ID = 3


class Release(IntEnum):
    """Why retained blocks were released."""

    READ = 0  # P read them (D->P pull done, NIXL notification)
    NOTIFIED = 1  # P decided local/recompute and notified D
    EXPIRED = 2  # TTL passed
    REUSED = 3  # the next turn landed on the same D and took the blocks as its prefix
    EVICTED = 4  # ttl_evictable: admission or growth on D needed the blocks (LRU among pins)


class HoldRelease(IntEnum):
    """Why P freed the blocks it held for D (``P_UNHOLD``)."""

    READ = 0  # D's read completed (NIXL notification)
    NOTIFIED = 1  # D recomputed the tail below the threshold and notified P
    LAPSED = 2  # the lease ran out before D's first heartbeat
    END = 3  # end of run



def _check_codes() -> None:
    """The hot path's literal codes (sim/evlog.py: ``EV_*``, ``DEC_*``, ``RR_*``, ``REL_*``, ``HOLD_*``) are these
    enums' values, one for one: checked at import, so the two tables cannot drift apart."""
    from kvplan.sim import evlog

    for enum, prefix in ((Ev, "EV_"), (Decision, "DEC_"), (RouterResult, "RR_"), (Release, "REL_"), (HoldRelease, "HOLD_")):
        codes = {k.removeprefix(prefix): v for k, v in vars(evlog).items() if k.startswith(prefix)}
        if codes != {m.name: m.value for m in enum}:
            raise RuntimeError(f"sim/evlog.py's {prefix}* codes differ from {enum.__name__}'s members")


_check_codes()

FIELDS: dict[Ev, tuple[str, str]] = {
    Ev.ARRIVE: ("prompt_tokens", "output_tokens"),
    Ev.ROUTER: ("router_result", ""),
    Ev.P_ENQUEUE: ("", ""),
    Ev.P_DECISION: ("decision", "local_hit_tokens"),
    Ev.PULL_START: ("tokens", "bytes"),
    Ev.PULL_DONE: ("xfer_s", "post_s"),
    Ev.P_COMPUTE: ("tokens", ""),
    Ev.P_DONE: ("prefill_s", "held_bytes"),
    Ev.D_ENQUEUE: ("", ""),
    Ev.D_ADMIT: ("d_hit_tokens", "blocks"),
    Ev.P2D_START: ("tokens", "bytes"),
    Ev.P2D_DONE: ("xfer_s", ""),
    Ev.D_FIRST: ("", ""),
    Ev.D_FINISH: ("output_tokens", ""),
    Ev.PIN: ("tokens", "expiry_s"),
    Ev.UNPIN: ("tokens", "release"),
    Ev.ERROR: ("reason", ""),
    Ev.SKIP: ("prompt_tokens", ""),
    Ev.D_PREEMPT: ("sampled_tokens", "kv_tokens"),
    Ev.D_RECOMPUTE: ("tokens", "d_hit_tokens"),
    Ev.P_UNHOLD: ("tokens", "hold_release"),
    Ev.P2D_FAILED: ("tokens", "d_hit_tokens"),
    Ev.D_ITL: ("itl_p50_s", "itl_max_s"),
    Ev.ITL_HIST: ("bucket_key", "gaps"),
}

COLUMNS = ("t_s", "kind", "conv", "turn", "node", "a", "b")


class EventSpec(NamedTuple):
    """The typed schema of one event kind: what its ``a`` and ``b`` columns hold ("" when unused)."""

    kind: Ev
    a: str
    b: str

    def column(self, name: str) -> str:
        """The raw column (``"a"`` or ``"b"``) holding the named field of this kind."""
        if name and name == self.a:
            return "a"
        if name and name == self.b:
            return "b"
        raise KeyError(f"{self.kind.name} has no field {name!r} (fields: {self.a!r}, {self.b!r})")


SCHEMA: dict[Ev, EventSpec] = {k: EventSpec(k, a, b) for k, (a, b) in FIELDS.items()}


def col(kind: Ev, name: str) -> str:
    """The raw column of field ``name`` of ``kind`` events, e.g. ``col(Ev.P_DONE, "held_bytes") == "b"``."""
    return SCHEMA[kind].column(name)


# the packed row of sim/evlog.py (ROW_FORMAT "<dqqqqdd")
_ROW = np.dtype(
    [("t_s", "<f8"), ("kind", "<i8"), ("conv", "<i8"), ("turn", "<i8"), ("node", "<i8"), ("a", "<f8"), ("b", "<f8")]
)
assert _ROW.itemsize == ROW_BYTES


class EventChunk(NamedTuple):
    """A slice of the log as typed columns (one array per field of ``COLUMNS``)."""

    t_s: np.ndarray  # float64
    kind: np.ndarray  # int16
    conv: np.ndarray  # int64
    turn: np.ndarray  # int32 (-1 for UNPIN, which belongs to a retention entry, not a turn)
    node: np.ndarray  # int16
    a: np.ndarray  # float64
    b: np.ndarray  # float64

    @staticmethod
    def empty() -> EventChunk:
        """A chunk with no events."""
        return EventChunk.from_tuples([])

    @staticmethod
    def from_tuples(rows: list[tuple[Any, ...]]) -> EventChunk:
        """Typed columns from a list of ``(t_s, kind, conv, turn, node, a, b)`` tuples."""
        return EventChunk.from_rows(np.fromiter(rows, dtype=_ROW, count=len(rows)))

    @staticmethod
    def from_rows(arr: np.ndarray) -> EventChunk:
        """Typed columns (copies) from an array of :data:`_ROW` records."""
        return EventChunk(
            arr["t_s"].copy(), arr["kind"].astype(np.int16), arr["conv"].copy(), arr["turn"].astype(np.int32),
            arr["node"].astype(np.int16), arr["a"].copy(), arr["b"].copy(),
        )

    def take(self, idx: np.ndarray) -> EventChunk:
        """The events at ``idx`` (an index or boolean mask), in that order."""
        if idx.dtype == np.bool_:  # positions once, not a mask scan per column
            idx = np.flatnonzero(idx)
        return EventChunk(*(c.take(idx) for c in self))

    @staticmethod
    def concat(chunks: list[EventChunk]) -> EventChunk:
        """The events of ``chunks`` one after the other."""
        if not chunks:
            return EventChunk.empty()
        if len(chunks) == 1:
            return chunks[0]
        return EventChunk(*(np.concatenate(cols) for cols in zip(*chunks, strict=True)))

    def __len__(self) -> int:
        """Number of events."""
        return len(self.t_s)


class EventLog:
    """The run's event log: emit sites call ``append((t, kind, conv, turn, node, a, b))`` as on a list.

    Rows are packed as they come (:class:`kvplan.sim.evlog.RowBuffer`, ``buf``; the compiled nodes append to
    it directly) and :meth:`flush` hands the rows since the last flush on as one typed
    :class:`EventChunk` (the engine flushes between slices of simulated time). With ``keep`` the chunks
    are kept and :meth:`chunk` returns the whole log (small runs, sweeps, tests); otherwise a streaming
    consumer derives everything chunk by chunk and memory stays bounded.
    """

    def __init__(self, keep: bool = True) -> None:
        self.buf = row_buffer()
        self.keep = keep
        self.kept: list[EventChunk] = []
        self.flushed = 0

    def append(self, row: tuple[Any, ...]) -> None:
        """Log one event ``(t_s, kind, conv, turn, node, a, b)``."""
        self.buf.append(row)  # values are converted (and checked) as they are packed

    def __len__(self) -> int:
        """Events logged since the last flush."""
        return len(self.buf)

    def pack(self) -> None:
        """Between slices of simulated time: the interpreted buffer packs the rows it listed (compiled, a no-op)."""
        buf = self.buf
        if isinstance(buf, TupleRows):
            buf.pack()

    def flush(self) -> EventChunk:
        """The events appended since the last flush as typed columns."""
        chunk = EventChunk.from_rows(np.frombuffer(self.buf.take(), dtype=_ROW))
        self.flushed += len(chunk)
        if self.keep and len(chunk):
            self.kept.append(chunk)
        return chunk

    def chunk(self) -> EventChunk:
        """The whole kept log (every flushed chunk and the unflushed tail) as one chunk."""
        if len(self):
            self.flush()
        self.kept = [EventChunk.concat(self.kept)] if self.kept else []
        return self.kept[0] if self.kept else EventChunk.empty()

    def rows(self) -> Iterator[tuple[Any, ...]]:
        """Every kept event (flushed chunks, then the unflushed tail) as ``(t, kind, conv, turn, node, a, b)``."""
        for ch in self.kept:
            yield from zip(*(c.tolist() for c in ch), strict=True)
        yield from self.buf.rows()

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        """Iterating the log yields every kept event in log order, as iterating the old tuple list did."""
        return self.rows()

    @property
    def total(self) -> int:
        """Events logged so far (flushed and not)."""
        return self.flushed + len(self)
