"""Streaming derivation of a run's results from its event log, chunk by chunk (issue 12).

The engine flushes the :class:`~kvplan.sim.events.EventLog` between slices of simulated time and hands each
typed chunk to :class:`RunStream`, which

* keeps the events of turns still in flight and completes a turn's record as soon as the turn is over
  (its response finished or it failed, and P no longer holds its KV for D), with the same arithmetic as
  :func:`kvplan.sim.turns.turn_columns`;
* releases finished records in (conversation, turn) order as soon as every earlier conversation is over
  (a reorder buffer bounded by the turns of conversations still running), to a sink (the streamed
  ``turns.parquet``/``turns.csv`` writers) and to the summary aggregates;
* accumulates counters and the pinned/held change points as they happen.

Memory: the in-flight events, the reorder buffer, and the pinned change points (2 per turn, 17 bytes each,
sorted once at the end into ``pinned.*``). A kept run keeps the held change points too; a streamed run folds
them into their statistics as it goes (:class:`StepStats`: up to the exact threshold one 8-byte product per
change, summed at the end as the one-shot mean is; above it O(1)). The columns behind
means and percentiles (TTFT, TPOT, P leg, prefill queue, D queue, link wait, pull times) are kept only while
the run is planned with at most
:data:`~kvplan.sim.quantiles.EXACT_PERCENTILE_MAX_TURNS` turns (then exact, bit for bit); a larger run
keeps exact counts and sums and a mergeable quantile sketch per column instead (O(1), relative error
:data:`~kvplan.sim.quantiles.ALPHA`; ``percentile_method`` in ``summary.json``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from kvplan.sim.events import DECISION_NAMES, Decision, Ev, EventChunk, HoldRelease, Release, col
from kvplan.sim.health import Waits, d_missed
from kvplan.sim.quantiles import EXACT_PERCENTILE_MAX_TURNS, ColumnStat, LogSketch
from kvplan.sim.result_files import TURN_COLUMNS
from kvplan.sim.turns import ARRAY_COLUMNS, turn_arrays, turn_columns, turns_frame

GIB = 1024**3
TURN_KINDS = np.array(sorted(int(k) for k in Ev if k not in (Ev.PIN, Ev.UNPIN, Ev.SKIP, Ev.ITL_HIST)), dtype=np.int16)
_BIT = {k: np.int64(1) << np.int64(i) for i, k in enumerate(sorted(int(k) for k in Ev))}
_BITS = np.zeros(max(int(k) for k in Ev) + 1, dtype=np.int64)
for _k, _b in _BIT.items():
    _BITS[_k] = _b
_ARRIVE, _FIN, _ERR = _BIT[Ev.ARRIVE], _BIT[Ev.D_FINISH], _BIT[Ev.ERROR]
_HOLD, _UNHOLD = _BIT[Ev.P_DONE], _BIT[Ev.P_UNHOLD]


_N_KINDS = max(int(k) for k in Ev) + 1
_TURN_LUT = np.zeros(_N_KINDS, dtype=bool)
_TURN_LUT[TURN_KINDS] = True


def _is_turn_event(kind: np.ndarray) -> np.ndarray:
    return _TURN_LUT[kind]


class SeriesBuffer:
    """Change points ``(t, delta, order)`` of a step function, kept compactly until the run ends.

    Three growing NumPy buffers (``capacity``: the points expected, e.g. two per planned turn; a buffer's
    unused tail costs no memory until written), not lists of per-chunk arrays: a million points joined at the
    end left the freed parts resident beside the joined copies. ``compact``: the changes are kept as int32 while
    every one converts back to the same float64 bit for bit (token counts do; a -0.0, a fraction or a value
    beyond int32 switches the buffer to float64 for good): 13 bytes per point instead of 17.
    """

    def __init__(self, capacity: int = 0, compact: bool = False) -> None:
        cap = max(capacity, 0)
        self._t = np.empty(cap)
        self._d = np.empty(cap, dtype=np.int32 if compact else np.float64)
        self._o = np.empty(cap, dtype=np.int8)
        self._n = 0

    def add(self, t: np.ndarray, delta: np.ndarray, order: int) -> None:
        """Append changes (``order`` 0 = releases, sorted before the additions of order 1 at equal times)."""
        m = len(t)
        if not m:
            return
        n, end = self._n, self._n + m
        if self._d.dtype != np.float64:
            d64 = np.asarray(delta, dtype=np.float64)
            with np.errstate(invalid="ignore"):
                small = d64.astype(self._d.dtype)
            if np.array_equal(small.astype(np.float64).view(np.int64), d64.view(np.int64)):
                delta = small
            else:  # not exactly representable: float64 from now on
                wide = np.empty(len(self._d))
                wide[:n] = self._d[:n]
                self._d = wide
        if end > len(self._t):
            size = max(end, 2 * len(self._t), 4096)
            for name in ("_t", "_d", "_o"):
                old = getattr(self, name)
                grown = np.empty(size, dtype=old.dtype)
                grown[:n] = old[:n]
                setattr(self, name, grown)
        self._t[n:end] = t
        self._d[n:end] = delta
        self._o[n:end] = order
        self._n = end

    def __len__(self) -> int:
        """Change points buffered."""
        return self._n

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Views of the buffered ``(t, delta, order)``, in the order added."""
        n = self._n
        return self._t[:n], self._d[:n], self._o[:n]

    def keep(self, mask: np.ndarray) -> None:
        """Drop the buffered changes where ``mask`` is false (the rest keep their order)."""
        t, d, o = (x[mask] for x in self.arrays())
        m = len(t)
        self._t[:m], self._d[:m], self._o[:m] = t, d, o
        self._n = m

    def steps(self, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(t, level)`` after each change, time-ordered (releases first at equal times, then log order).

        Consumes the buffer (empty afterwards), freeing each buffer as soon as it is sorted, so that a long run's
        change points never exist twice. ``out``, an ``(n, k >= 2)`` float64 array in Fortran order, receives
        ``t`` in column 0 and the level in column 1 (the returned arrays are those columns).
        """
        n = len(self)
        if out is None:
            out = np.empty((n, 2), order="F")
        t_out, level = out[:, 0], out[:, 1]
        if not n:
            return t_out, level
        t, d, o = self.arrays()
        idx = np.lexsort((o, t))  # stable: log order within equal (t, order)
        del o
        self._o = np.empty(0, dtype=np.int8)
        np.take(t, idx, out=t_out)
        del t
        self._t = np.empty(0)
        if d.dtype == np.float64:
            np.take(d, idx, out=level)
        else:  # compact: each change converts back exactly
            level[:] = d[idx]
        del d, idx
        self._d = np.empty(0)
        self._n = 0
        np.cumsum(level, out=level)
        return t_out, level


class OutstandingHolds:
    """The holds P keeps for D (a turn between its P_DONE and its P_UNHOLD), keyed by turn, as three small arrays
    sorted by key: the bytes held and the earliest P_DONE time among the hold's bounding records (inf: none).

    Each chunk's holds are added, then its releases taken, with the semantics of a dict ``key -> bytes`` updated with
    the holds and popped by the releases: a later hold of the same key replaces the bytes (its time keeps the
    earliest), a release of a key not held, or a second release of one key, gives NaN. Only the outstanding holds
    are kept (the transfers in flight), so each chunk costs O(outstanding + chunk) in NumPy, not a Python step per
    turn.
    """

    def __init__(self) -> None:
        self.keys = np.empty(0, dtype=np.int64)
        self.bytes = np.empty(0)
        self.since = np.empty(0)

    def __len__(self) -> int:
        """Holds outstanding."""
        return len(self.keys)

    def add(self, keys: np.ndarray, held: np.ndarray, since: np.ndarray) -> None:
        """Holds ``keys`` of ``held`` bytes, in log order (``since``: each record's P_DONE time, inf when it
        bounds nothing)."""
        if not len(keys):
            return
        k = np.concatenate((self.keys, keys))
        order = np.argsort(k, kind="stable")  # equal keys stay in log order (the outstanding ones first)
        k = k[order]
        new_key = np.empty(len(k), dtype=bool)
        new_key[0] = True
        np.not_equal(k[1:], k[:-1], out=new_key[1:])
        starts = np.flatnonzero(new_key)
        last = np.empty(len(k), dtype=bool)  # the last record of each key: its bytes win
        last[-1] = True
        last[:-1] = new_key[1:]
        self.keys = k[starts]
        self.bytes = np.concatenate((self.bytes, held))[order][last]
        self.since = np.minimum.reduceat(np.concatenate((self.since, since))[order], starts)

    def release(self, keys: np.ndarray) -> np.ndarray:
        """The bytes of each released key (NaN when not held, or already released earlier in ``keys``); the keys
        found are no longer outstanding."""
        n = len(self.keys)
        out = np.full(len(keys), np.nan)
        if not n or not len(keys):
            return out
        pos = np.minimum(np.searchsorted(self.keys, keys), n - 1)
        found = self.keys[pos] == keys
        first = np.zeros(len(keys), dtype=bool)  # a key released twice: its first release takes the bytes
        first[np.unique(keys, return_index=True)[1]] = True
        take = found & first
        out[take] = self.bytes[pos[take]]
        keep = np.ones(n, dtype=bool)
        keep[pos[take]] = False
        self.keys, self.bytes, self.since = self.keys[keep], self.bytes[keep], self.since[keep]
        return out

    def earliest(self) -> float:
        """The earliest P_DONE time of a bounding hold still outstanding (inf: none)."""
        return float(self.since.min()) if len(self.since) else float("inf")


class StepStats:
    """Time-weighted integral and peak of a step function, folded in while the run goes (bounded memory).

    Change points are buffered like :class:`SeriesBuffer`'s and folded in, sorted the same way (time, releases
    first, then log order), as soon as :meth:`advance` is told that no later change can come before time
    ``w``; what stays buffered is bounded by the changes still in flight. Levels are the running sum of the
    changes in that order, divided by ``divisor`` before integrating, as the one-shot statistics do.

    ``exact=False`` (a run above the exact threshold): the integral is summed per batch, O(1) memory; its float
    rounding differs from the one-shot's (partial sums per batch), deterministically. ``exact=True``: each
    interval's ``level x duration`` is kept (8 bytes per change, against 17 for a buffered change point) and summed
    once at the end as the one-shot ``(v * dt).sum()`` sums them (same values, same order, same NumPy pairwise
    sum), so mean and peak equal :func:`kvplan.sim.results._time_weighted_mean` and the maximum over the sorted
    series bit for bit.
    """

    def __init__(self, divisor: float, exact: bool = False, capacity: int = 0) -> None:
        self.divisor = divisor
        self.exact = exact
        self.buf = SeriesBuffer()  # the changes still in flight: small, no capacity hint
        self.level = 0.0  # exact running level (sum of changes)
        self.last_t = float("nan")  # time and scaled level of the last change folded in
        self.last_v = 0.0
        self.integral = 0.0
        self.peak = float("-inf")
        self.n = 0
        self.folded_to = float("-inf")  # every change before this time is folded in
        self.misordered = 0  # changes that came before ``folded_to`` (a broken promise to :meth:`advance`)
        self._prod = np.empty(max(capacity, 0) if exact else 0)  # exact: level x duration of each interval
        self._n_prod = 0

    def _keep_products(self, p: np.ndarray) -> None:
        n, end = self._n_prod, self._n_prod + len(p)
        if end > len(self._prod):
            grown = np.empty(max(end, 2 * len(self._prod), 4096))
            grown[:n] = self._prod[:n]
            self._prod = grown
        self._prod[n:end] = p
        self._n_prod = end

    def advance(self, w: float) -> None:
        """Fold in every buffered change before ``w`` (no change still to come may precede ``w``)."""
        if not len(self.buf):
            return
        t, d, o = self.buf.arrays()
        now = t < w
        if self.folded_to > float("-inf"):
            self.misordered += int(np.count_nonzero(t < self.folded_to))
        self.folded_to = max(self.folded_to, w)
        if not now.any():
            return
        t, d, o = t[now], d[now], o[now]  # copies: the buffer keeps the later ones
        self.buf.keep(~now)
        idx = np.lexsort((o, t))
        t, d = t[idx], d[idx]
        if self.exact and self.n:  # the one-shot cumsum's additions exactly: the running level, then each change
            level = np.cumsum(np.concatenate(([self.level], d)))[1:]
        else:
            level = np.cumsum(d)
            level += self.level
        v = level / self.divisor
        if self.exact:
            if self.n:
                self._keep_products(np.array([self.last_v]) * (t[:1] - self.last_t))
            self._keep_products(v[:-1] * np.diff(t))
        else:
            if self.n:
                self.integral += self.last_v * (float(t[0]) - self.last_t)
            self.integral += float((v[:-1] * np.diff(t)).sum())
        self.level, self.last_t, self.last_v = float(level[-1]), float(t[-1]), float(v[-1])
        self.peak = max(self.peak, float(v.max()))
        self.n += len(t)

    def mean_peak(self, t_end: float) -> tuple[float, float]:
        """(time-weighted mean over ``[0, t_end]``, peak) once everything is folded in (0, 0 with no change)."""
        self.advance(float("inf"))
        if not self.n:
            return 0.0, 0.0
        if t_end <= 0:
            return 0.0, self.peak
        if self.misordered and self.exact:  # a change came before what advance() was promised: not the one-shot order
            raise RuntimeError(f"internal error: {self.misordered} change points came after later ones were folded in")
        if self.exact:  # the last interval runs to t_end: the one-shot's dt = diff(append(t, max(t_end, t[-1])))
            self._keep_products(np.array([self.last_v]) * (np.array([max(t_end, self.last_t)]) - self.last_t))
            total = self._prod[:self._n_prod].sum()
            self._prod, self._n_prod = np.empty(0), 0
            return float(total / t_end), self.peak
        tail = self.last_v * (max(t_end, self.last_t) - self.last_t)
        return (self.integral + tail) / t_end, self.peak


TurnSink = Callable[[pd.DataFrame], None]


class RunStream:
    """Consumes event chunks; derives turns, counters and time series incrementally."""

    def __init__(self, offsets: np.ndarray, turns_per_conv: np.ndarray, sink: TurnSink | None = None,
                 keep_turns: bool = True, exact_max_turns: int = EXACT_PERCENTILE_MAX_TURNS) -> None:
        self.offsets = np.asarray(offsets, dtype=np.int64)
        self.remaining = np.asarray(turns_per_conv, dtype=np.int64).copy()
        self.sink = sink
        self.keep_turns = keep_turns
        self.kept_turns: list[pd.DataFrame] = []
        self.pending = EventChunk.empty()
        # finished turns not yet released (a later conversation's): NumPy columns (turns.ARRAY_COLUMNS); a frame is
        # built once per release, for the sink
        self.buffer: list[dict[str, np.ndarray]] = []
        self.watermark = 0  # every conversation below this one is over
        planned = int(self.remaining.sum())
        self.pinned = SeriesBuffer(2 * planned, compact=True)  # a pin and its release per turn (buffers grow)
        self.held = SeriesBuffer(2 * planned if keep_turns else 0)  # P's hold and its release per turn (kept runs)
        self._holds = OutstandingHolds()  # P's holds for D: turns between P_DONE and P_UNHOLD
        self.counts: dict[str, int] = {"pins": 0, "unpins": 0, "d_preemptions": 0, "p_lease_expiries": 0,
                                       "p2d_failed_reads": 0, "turns": 0, "conversations": 0}
        self.releases = {int(k): 0 for k in Release}
        self.d_recompute_tokens = 0.0
        self.itl = LogSketch()  # every simulated inter-token gap (the engines' ITL_HIST rows, sim/itl.py)
        self.unhold_tokens = 0.0
        self.unhold_bytes = 0.0
        self.t_max = float("-inf")
        self.t_max_active = float("-inf")  # over every event but retention releases
        # exact percentiles (columns kept) up to exact_max_turns planned turns, a quantile sketch above
        self.agg = TurnAggregates(exact=planned <= exact_max_turns, capacity=planned)
        # a streamed run keeps only the held series' statistics, folded in as the run goes: above that size in O(1)
        # memory, up to it exactly (one product per change, summed at the end as the one-shot mean sums them)
        self.held_stats = None if keep_turns else StepStats(GIB, exact=self.agg.exact, capacity=2 * planned)
        self._done_t = float("-inf")  # latest P_DONE time: every change still to come is at or after it

    # --- consuming -------------------------------------------------------------------------------------

    def consume(self, ch: EventChunk) -> None:
        """Take one flushed chunk: counters, pins, and every turn that is now over."""
        if not len(ch):
            return
        self._count(ch)
        turn_ev = _is_turn_event(ch.kind)
        self.pending = EventChunk.concat([self.pending, ch.take(turn_ev)])
        self._complete(final=False)

    def finish(self) -> None:
        """The run is over: every turn still pending is complete as it stands; release everything."""
        self._complete(final=True)
        self.watermark = len(self.remaining)
        self._release()

    def _count(self, ch: EventChunk) -> None:
        k = ch.kind
        n_of = np.bincount(k, minlength=_N_KINDS)  # events per kind: one pass instead of a mask per counter
        t_s, a = ch.t_s, ch.a
        book = k == int(Ev.ITL_HIST) if n_of[Ev.ITL_HIST] else None  # end-of-run bookkeeping rows: no time of their own
        t = t_s if book is None else t_s[~book]
        if len(t):
            self.t_max = max(self.t_max, float(t.max()))
        if n_of[Ev.UNPIN] or book is not None:
            active = k != int(Ev.UNPIN)
            if book is not None:
                active &= ~book
            if active.any():
                self.t_max_active = max(self.t_max_active, float(t_s[active].max()))
        elif len(t):
            self.t_max_active = max(self.t_max_active, float(t.max()))
        pin = np.flatnonzero(k == int(Ev.PIN))
        unpin = np.flatnonzero(k == int(Ev.UNPIN))
        self.pinned.add(t_s[pin], a[pin], 1)
        self._held_changes(ch, n_of)
        self.pinned.add(t_s[unpin], -a[unpin], 0)
        c = self.counts
        c["pins"] += int(n_of[Ev.PIN])
        c["unpins"] += int(n_of[Ev.UNPIN])
        if len(unpin):
            why = ch.b[unpin].astype(np.int64)
            n_why = np.bincount(why[why >= 0], minlength=len(self.releases))  # a code of no Release counts nowhere
            for r in self.releases:
                self.releases[r] += int(n_why[r])
        c["d_preemptions"] += int(n_of[Ev.D_PREEMPT])
        if n_of[Ev.D_RECOMPUTE]:
            self.d_recompute_tokens += float(a[k == int(Ev.D_RECOMPUTE)].sum())
        if n_of[Ev.P_UNHOLD]:
            c["p_lease_expiries"] += int(((k == int(Ev.P_UNHOLD)) & (ch.b == int(HoldRelease.LAPSED))).sum())
        c["p2d_failed_reads"] += int(n_of[Ev.P2D_FAILED])
        if book is not None:
            self.itl.add_key_counts(a[book].astype(np.int64), ch.b[book].astype(np.int64))

    def _complete(self, final: bool) -> None:
        ev = self.pending
        if not len(ev):
            return
        key = self.offsets[ev.conv] + ev.turn.astype(np.int64) - 1
        lo, hi = int(key.min()), int(key.max())
        if hi - lo <= 4 * len(key) + 4096:  # the pending turns are a window of the run's: a slot per key, no sort
            inv = key - lo
            flags = np.zeros(hi - lo + 1, dtype=np.int64)
        else:
            inv = np.unique(key, return_inverse=True)[1]
            flags = np.zeros(int(inv.max()) + 1, dtype=np.int64)
        bits = _BITS[ev.kind]
        # P holds the prompt for D only when P_DONE carried bytes (aggregated serving holds nothing, logs no P_UNHOLD)
        bits[(ev.kind == int(Ev.P_DONE)) & (getattr(ev, col(Ev.P_DONE, "held_bytes")) <= 0)] = 0
        np.bitwise_or.at(flags, inv, bits)
        if final:
            done = np.ones(len(flags), dtype=bool)
        else:
            over = (flags & (_FIN | _ERR)) != 0
            unheld = ((flags & _HOLD) == 0) | ((flags & _UNHOLD) != 0)
            done = over & unheld & ((flags & _ARRIVE) != 0)
        if not done.any():
            return
        ev_done = done[inv]
        fin = ev.take(ev_done)
        self.pending = ev.take(~ev_done)
        g = turn_arrays(fin, self.offsets)
        rows = {c: g[c] for c in ARRAY_COLUMNS}
        np.subtract.at(self.remaining, rows["conversation_id"], 1)
        self.buffer.append(rows)
        self._advance()

    def _held_changes(self, ch: EventChunk, n_of: np.ndarray) -> None:
        """KV P holds for D: +bytes at P_DONE, -the same bytes at its P_UNHOLD (log order within a chunk).
        ``n_of``: the chunk's events per kind."""
        k = ch.kind
        hold = np.flatnonzero(k == int(Ev.P_DONE))
        held_bytes = getattr(ch, col(Ev.P_DONE, "held_bytes"))[hold]
        t_hold = ch.t_s[hold]
        series = self.held if self.held_stats is None else self.held_stats.buf
        series.add(t_hold, held_bytes, 1)

        def key(at: np.ndarray) -> np.ndarray:
            return self.offsets[ch.conv[at]] + ch.turn[at].astype(np.int64) - 1

        # a hold bounds what is still to come when it has bytes, or always in exact mode (a lapse of an empty hold
        # is a zero change, but its place in the sorted series still sets the intervals summed)
        exact = self.held_stats is None or self.held_stats.exact
        self._holds.add(key(hold), held_bytes, t_hold if exact else np.where(held_bytes > 0, t_hold, np.inf))
        if n_of[Ev.P_UNHOLD]:
            unhold = np.flatnonzero(k == int(Ev.P_UNHOLD))
            b = self._holds.release(key(unhold))
            series.add(ch.t_s[unhold], -np.nan_to_num(b), 0)
            self.unhold_tokens += float(ch.a[unhold].sum())
            self.unhold_bytes += float(np.nansum(b))
        if len(hold):
            self._done_t = max(self._done_t, float(t_hold.max()))
        if self.held_stats is not None:
            # P_DONE is logged at the current time and a P_UNHOLD (even a lapse noticed late) at or after its own
            # P_DONE, so every change still to come is at or after min(latest P_DONE, earliest P_DONE of a bounding
            # hold still outstanding): fold in everything before that
            self.held_stats.advance(min(self._done_t, self._holds.earliest()))

    def _advance(self) -> None:
        n = len(self.remaining)
        w = self.watermark
        while w < n and self.remaining[w] <= 0:
            w += 1
        if w != self.watermark:
            self.watermark = w
            self._release()

    def _release(self) -> None:
        if not self.buffer:
            return
        rows = self.buffer[0] if len(self.buffer) == 1 else {
            c: np.concatenate([b[c] for b in self.buffer]) for c in ARRAY_COLUMNS}
        conv = rows["conversation_id"]
        ready = conv < self.watermark
        if not ready.any():
            self.buffer = [rows]
            return
        at = np.flatnonzero(ready)
        at = at[np.lexsort((rows["turn"][at], conv[at]))]
        if len(at) == len(conv) and (len(at) < 2 or bool((np.diff(at) == 1).all())):
            out = rows  # all of them, already in order: no copy
        else:
            out = {c: v[at] for c, v in rows.items()}
        rest = np.flatnonzero(~ready)
        self.buffer = [{c: v[rest] for c, v in rows.items()}] if len(rest) else []
        self.counts["turns"] += len(at)
        self.counts["conversations"] += len(np.unique(out["conversation_id"]))
        self.agg.add(out)
        if self.sink is not None or self.keep_turns:
            frame = turns_frame(out)
            if self.sink is not None:
                self.sink(frame)
            if self.keep_turns:
                self.kept_turns.append(frame)

    def turns(self) -> pd.DataFrame:
        """Every released turn (only when ``keep_turns``), in (conversation, turn) order."""
        if not self.kept_turns:
            return turn_columns(EventChunk.empty(), self.offsets)[TURN_COLUMNS]
        return pd.concat(self.kept_turns, ignore_index=True) if len(self.kept_turns) > 1 else self.kept_turns[0]


_NAME_OF_CODE = {int(k): v for k, v in DECISION_NAMES.items()}
_DECISION_CODES = np.array(sorted(_NAME_OF_CODE), dtype=np.float64)
#: the decisions that reused a conversation's KV (the summary's ``reuse_rate`` counts them among follow-ups)
_REUSE_CODES = np.array([int(d) for d in (Decision.PULL, Decision.LOCAL, Decision.RECOMPUTE_BELOW_THRESHOLD,
                                          Decision.HOST_PULL)], dtype=np.float64)
#: the per-turn columns the summary and the health section read: name -> whether percentiles are read of it
STAT_COLUMNS = {"ttft": True, "tpot": True, "p_leg": False, "prefill_queue": True, "d_queue": True,
                "link_wait": True, "kv_pull": False, "d2p_xfer": False}


@dataclass
class TurnAggregates:
    """What the summary needs from the turn records, accumulated in release order.

    Counts and token sums are exact integers. The columns behind means and percentiles are
    :class:`~kvplan.sim.quantiles.ColumnStat`: kept whole when ``exact`` (a run planned with at most
    :data:`~kvplan.sim.quantiles.EXACT_PERCENTILE_MAX_TURNS` turns), so the summary equals the one-shot
    computation over ``turns.csv`` bit for bit; otherwise exact counts and sums plus a mergeable quantile
    sketch of stated relative error (:data:`~kvplan.sim.quantiles.ALPHA`): O(1) memory per column.
    """

    exact: bool = True
    decisions: dict[str, int] = field(default_factory=dict)
    sums: dict[str, int] = field(default_factory=dict)
    follow_up: int = 0
    reused: int = 0
    reused_kv: int = 0  # follow-ups that reused any KV (local prefix hit or pull > 0)
    follow_ok_prompt: int = 0  # prompt tokens of follow-ups that did not fail (health's routing check)
    follow_ok_d_hit: int = 0  # of them, found in their D's prefix cache (d_hit_tokens)
    follow_ok: int = 0  # follow-ups that did not fail
    follow_ok_d_missed: int = 0  # of them, those whose D found less than half their prompt (health.d_missed)
    follow_ok_local_hit: int = 0  # the same two for the engine that prefilled them (local_hit_tokens: P's or a
    follow_ok_local_missed: int = 0  # replica's prefix cache; health's routing check of aggregated serving)
    cols: dict[str, ColumnStat] = field(default_factory=dict)
    ok_arrival_min: float = float("nan")  # over turns that did not fail (health's span)
    ok_finish_max: float = float("nan")
    n_ok: int = 0
    capacity: int = 0  # turns expected (the plan's): an exact column's buffer is sized for them once

    SUM_COLS = ("pulled_tokens", "recomputed_tokens", "local_hit_tokens", "failed_tokens", "prompt_tokens",
                "d2p_bytes", "p2d_bytes")

    def __post_init__(self) -> None:
        """One statistic per column of :data:`STAT_COLUMNS`."""
        opened: list[tuple[ColumnStat, np.ndarray]] = []  # one decompressed column at a time (ColumnStat.column)
        self.cols = {name: ColumnStat(self.exact, q, self.capacity, opened) for name, q in STAT_COLUMNS.items()}

    def _keep(self, name: str, values: np.ndarray) -> None:
        self.cols[name].add(np.asarray(values, dtype=np.float64))

    def add(self, t: dict[str, np.ndarray]) -> None:
        """Fold released rows in (:func:`kvplan.sim.turns.turn_arrays`' columns, decisions as codes)."""
        code = t["decision_code"]
        known = np.isin(code, _DECISION_CODES)  # a code without a name (NaN: no decision) is not counted
        counts = np.bincount(code[known].astype(np.int64), minlength=int(_DECISION_CODES.max()) + 1)
        for k, name in _NAME_OF_CODE.items():
            if counts[k]:
                self.decisions[name] = self.decisions.get(name, 0) + int(counts[k])
        for c in self.SUM_COLS:
            self.sums[c] = self.sums.get(c, 0) + int(t[c].sum())
        follow = t["turn"] >= 2
        self.follow_up += int(follow.sum())
        reuse = np.isin(code, _REUSE_CODES)
        self.reused += int((reuse & follow).sum())
        kv = (t["local_hit_tokens"] + t["pulled_tokens"]) > 0
        self.reused_kv += int((kv & follow).sum())
        ok = code != int(Decision.ERROR)  # masks on the columns read, not copies of them
        follow_ok = follow & ok
        self.follow_ok_prompt += int(t["prompt_tokens"][follow_ok].sum())
        self.follow_ok_d_hit += int(t["d_hit_tokens"][follow_ok].sum())
        self.follow_ok += int(follow_ok.sum())
        self.follow_ok_d_missed += int((d_missed(t["d_hit_tokens"], t["prompt_tokens"]) & follow_ok).sum())
        self.follow_ok_local_hit += int(t["local_hit_tokens"][follow_ok].sum())
        self.follow_ok_local_missed += int((d_missed(t["local_hit_tokens"], t["prompt_tokens"]) & follow_ok).sum())

        def col(name: str, mask: np.ndarray) -> np.ndarray:
            return t[name][mask]

        ttft, tpot = col("ttft_s", ok), col("tpot_s", ok)
        self._keep("ttft", ttft[~np.isnan(ttft)])
        self._keep("tpot", tpot[~np.isnan(tpot)])
        self._keep("p_leg", col("p_leg_s", ok))
        self._keep("prefill_queue", col("prefill_queue_s", ok))
        self._keep("d_queue", col("d_queue_s", ok))
        self._keep("link_wait", col("kv_pull_s", ok) + col("p2d_transfer_s", ok))
        n_ok = int(ok.sum())
        if n_ok:
            self.ok_arrival_min = float(np.nanmin([self.ok_arrival_min, _min_skipna(col("arrival_s", ok))]))
            self.ok_finish_max = float(np.nanmax([self.ok_finish_max, _max_skipna(col("finish_s", ok))]))
        self.n_ok += n_ok
        pull = code == int(Decision.PULL)
        self._keep("kv_pull", col("kv_pull_s", pull))
        self._keep("d2p_xfer", col("d2p_xfer_s", pull))

    def drop_summary_columns(self) -> None:
        """Free the kept columns only the summary's means and percentiles read (health's stay)."""
        for name in ("ttft", "tpot", "p_leg", "kv_pull", "d2p_xfer"):
            self.cols[name].free()

    def waits(self) -> Waits:
        """What :func:`kvplan.sim.health.compute_health` reads of the turns that did not fail."""
        n = self.n_ok

        def stat(name: str) -> tuple[float, float]:
            c = self.cols[name]
            return c.percentile(90, 0.0), c.mean(0.0) if n else 0.0

        span = self.ok_finish_max - self.ok_arrival_min if n else 0.0
        return Waits(span_s=float(span), prefill=stat("prefill_queue"), decode=stat("d_queue"), link=stat("link_wait"),
                     follow_ups=self.follow_ok, follow_ups_d_missed=self.follow_ok_d_missed,
                     follow_up_prompt_tokens=self.follow_ok_prompt, follow_up_d_hit_tokens=self.follow_ok_d_hit,
                     follow_ups_local_missed=self.follow_ok_local_missed,
                     follow_up_local_hit_tokens=self.follow_ok_local_hit)

    def column(self, name: str) -> np.ndarray:
        """A kept column, concatenated (exact mode)."""
        return self.cols[name].column()


def _min_skipna(x: np.ndarray) -> float:
    """``pd.Series.min()``: the smallest value that is not NaN, NaN if there is none."""
    x = x[~np.isnan(x)]
    return float(x.min()) if len(x) else float("nan")


def _max_skipna(x: np.ndarray) -> float:
    """``pd.Series.max()``: the largest value that is not NaN, NaN if there is none."""
    x = x[~np.isnan(x)]
    return float(x.max()) if len(x) else float("nan")


def decision_names() -> list[str]:
    """Decision names in enum order (summary ``decisions`` keys)."""
    from kvplan.sim.events import DECISION_NAMES

    return [DECISION_NAMES[d] for d in Decision]
