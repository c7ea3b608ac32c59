"""Streaming statistics of a per-turn column: exact while the run is small enough to keep it, else a sketch.

:class:`LogSketch` is a DDSketch-style mergeable quantile sketch (Masson, Rim and Lee, "DDSketch: a fast and
fully-mergeable quantile sketch with relative-error guarantees", VLDB 2019): a value ``x`` with ``|x| >=
MIN_ABS`` is counted in the logarithmic bucket ``k = ceil(log_gamma |x|)``, ``gamma = (1 + alpha) / (1 -
alpha)``, whose representative ``2 gamma^k / (gamma + 1)`` is within a relative ``alpha`` of every value of
the bucket; values nearer zero than ``MIN_ABS`` (1 ns as a time) go to a zero bucket (absolute error below
``MIN_ABS``). Counts are integers, so merging two sketches (adding counts) gives exactly the sketch of the
union, and a sketch is a deterministic function of the values (byte-identical reruns).

Error bound (:data:`ALPHA` = 0.5 %): :meth:`LogSketch.percentile` interpolates between the representatives of
the two order statistics ``x_lo, x_hi`` NumPy's ``linear`` percentile interpolates between, so it differs
from ``numpy.percentile`` by at most ``ALPHA * max(|x_lo|, |x_hi|) + MIN_ABS``: within 0.5 % of the exact
percentile for same-signed neighbours. Memory: one int64 count per occupied bucket (~1,400 buckets per
decade of 10^-9..10^3 s at most), independent of the number of values.

Written with NumPy rather than taken from the ``ddsketch`` package (DataDog's sketches-py): that package adds
one value per Python call, ~1 us each, which for 10M turns x 5 columns would cost about a minute; here a
released batch of turns is bucketed in one vectorised step.

:class:`ColumnStat` is what the run summary reads: ``count``, ``mean`` and ``percentile`` of a column, kept
whole (exact, bit-identical to NumPy/pandas on the whole column) or, above the threshold, as exact count and
sum (a deterministic sum of per-batch pairwise sums, so the mean is exact up to float rounding) plus a sketch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

ALPHA = 0.005  # relative accuracy of the sketch's percentiles (0.5 %)
MIN_ABS = 1e-9  # values nearer zero than this (1 ns) are counted as zero
EXACT_PERCENTILE_MAX_TURNS = 1_000_000  # a run planned with at most this many turns keeps its columns: exact


@dataclass
class _Store:
    """Counts of consecutive bucket keys from ``offset`` (dense; grows as keys arrive)."""

    offset: int = 0
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def add_keys(self, keys: np.ndarray) -> None:
        """Count each key once."""
        if not len(keys):
            return
        lo, hi = int(keys.min()), int(keys.max())
        self._cover(lo, hi)
        self.counts += np.bincount(keys - self.offset, minlength=len(self.counts))

    def add_store(self, other: _Store) -> None:
        """Add another store's counts."""
        if not len(other.counts):
            return
        self._cover(other.offset, other.offset + len(other.counts) - 1)
        start = other.offset - self.offset
        self.counts[start:start + len(other.counts)] += other.counts

    def _cover(self, lo: int, hi: int) -> None:
        if not len(self.counts):
            self.offset, self.counts = lo, np.zeros(hi - lo + 1, dtype=np.int64)
            return
        new_lo, new_hi = min(lo, self.offset), max(hi, self.offset + len(self.counts) - 1)
        if new_lo == self.offset and new_hi == self.offset + len(self.counts) - 1:
            return
        grown = np.zeros(new_hi - new_lo + 1, dtype=np.int64)
        grown[self.offset - new_lo:self.offset - new_lo + len(self.counts)] = self.counts
        self.offset, self.counts = new_lo, grown

    def trimmed(self) -> tuple[int, tuple[int, ...]]:
        """``(first occupied key, counts up to the last occupied key)``: equal for equal contents."""
        nz = np.flatnonzero(self.counts)
        if not len(nz):
            return 0, ()
        return self.offset + int(nz[0]), tuple(self.counts[nz[0]:nz[-1] + 1].tolist())


class LogSketch:
    """Mergeable relative-error quantile sketch of float values (NaN ignored); see the module docstring."""

    def __init__(self, alpha: float = ALPHA, min_abs: float = MIN_ABS) -> None:
        if not 0 < alpha < 1 or not min_abs > 0:
            raise ValueError("alpha must be in (0, 1) and min_abs > 0")
        self.alpha = alpha
        self.min_abs = min_abs
        self.gamma = (1 + alpha) / (1 - alpha)
        self._log_gamma = math.log(self.gamma)
        self.pos = _Store()
        self.neg = _Store()  # keys of |x| for x <= -min_abs
        self.zero = 0
        self.count = 0

    def _keys(self, mag: np.ndarray) -> np.ndarray:
        return np.ceil(np.log(mag) / self._log_gamma).astype(np.int64)

    def _value(self, key: np.ndarray) -> np.ndarray:
        return 2.0 * np.exp(key * self._log_gamma) / (self.gamma + 1.0)

    def add(self, values: np.ndarray) -> None:
        """Count every non-NaN value of ``values``."""
        v = np.asarray(values, dtype=np.float64)
        v = v[~np.isnan(v)]
        if not len(v):
            return
        pos, neg = v >= self.min_abs, v <= -self.min_abs
        self.pos.add_keys(self._keys(v[pos]))
        self.neg.add_keys(self._keys(-v[neg]))
        self.zero += int(len(v) - pos.sum() - neg.sum())
        self.count += len(v)

    def add_key_counts(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """Count ``counts[i]`` positive values in bucket ``keys[i]`` (pre-bucketed values, e.g. ``sim/itl.py``'s)."""
        if not len(keys):
            return
        self.pos._cover(int(keys.min()), int(keys.max()))
        np.add.at(self.pos.counts, keys - self.pos.offset, counts)
        self.count += int(counts.sum())

    def merge(self, other: LogSketch) -> LogSketch:
        """A new sketch of both sketches' values (exactly the sketch of the union)."""
        if (other.alpha, other.min_abs) != (self.alpha, self.min_abs):
            raise ValueError("only sketches of the same alpha and min_abs merge")
        out = LogSketch(self.alpha, self.min_abs)
        for s in (self, other):
            out.pos.add_store(s.pos)
            out.neg.add_store(s.neg)
            out.zero += s.zero
            out.count += s.count
        return out

    def __eq__(self, other: object) -> bool:
        """Same parameters and the same counts in every bucket."""
        if not isinstance(other, LogSketch):
            return NotImplemented
        return (self.alpha, self.min_abs, self.zero, self.count, self.pos.trimmed(), self.neg.trimmed()) == (
            other.alpha, other.min_abs, other.zero, other.count, other.pos.trimmed(), other.neg.trimmed())

    __hash__ = None  # type: ignore[assignment]  # mutable

    def _ordered(self) -> tuple[np.ndarray, np.ndarray]:
        """Bucket representatives in ascending order and the cumulative counts up to each."""
        nk = self.neg.offset + np.arange(len(self.neg.counts))[::-1]
        pk = self.pos.offset + np.arange(len(self.pos.counts))
        vals = np.concatenate([-self._value(nk), [0.0], self._value(pk)])
        counts = np.concatenate([self.neg.counts[::-1], [self.zero], self.pos.counts])
        return vals, np.cumsum(counts)

    def percentile(self, q: float) -> float:
        """The ``q``-th percentile (0..100) as ``numpy.percentile`` (linear) would give it, within the bound."""
        if not self.count:
            return float("nan")
        vals, cum = self._ordered()
        h = (self.count - 1) * q / 100.0
        lo, hi = math.floor(h), math.ceil(h)
        x_lo, x_hi = (float(vals[np.searchsorted(cum, r, side="right")]) for r in (lo, hi))
        return x_lo + (h - lo) * (x_hi - x_lo)


#: values per compressed block of an exact column (:class:`ColumnStat`): 512 KiB of float64
BLOCK_VALUES = 65_536

class ColumnStat:
    """Count, mean and percentiles of one per-turn column, fed in release (row) order.

    ``exact``: the column is kept and every statistic equals NumPy/pandas on the whole column bit for bit.
    Otherwise an exact count and sum are kept (and, with ``quantiles``, a :class:`LogSketch`): O(1) memory.

    An exact column is kept losslessly compressed: each full block of :data:`BLOCK_VALUES` values is
    byte-shuffled (the k-th bytes of all values together: signs, exponents and leading mantissa bytes repeat)
    and compressed with zstd (level 1, pyarrow's codec), the last partial block stays as it is; :meth:`column`
    gives back the very same float64 values. A 1M-turn run's eight columns take ~60% of their 61 MiB (an
    all-zero column almost nothing), for ~0.1 CPU s per million values both ways.
    """

    def __init__(self, exact: bool, quantiles: bool = True, capacity: int = 0,
                 opened: list[tuple[ColumnStat, np.ndarray]] | None = None) -> None:
        self.exact = exact
        # the column decompressed last, shared by the columns of one run (``opened``): the summary reads a
        # column's mean and percentiles one after another, so each is decompressed once, one at a time
        self._open: list[tuple[ColumnStat, np.ndarray]] = [] if opened is None else opened
        # the block being filled (``capacity``: the values expected, e.g. the planned turns: a small run's
        # column is one buffer of that size, never compressed)
        self._buf = np.empty(min(max(capacity, 0), BLOCK_VALUES) if exact else 0)
        self._len = 0
        self._blocks: list[bytes] = []  # full blocks, shuffled and compressed
        self._packed = 0  # values in ``_blocks``
        self.sketch = LogSketch() if quantiles and not exact else None
        self.quantiles = quantiles
        self.n = 0
        self.sums: list[float] = []

    def add(self, values: np.ndarray) -> None:
        """Fold a batch in (NaN values count for nothing but are kept in an exact column)."""
        v = np.asarray(values, dtype=np.float64)
        if self.exact:  # copied in: ``values`` may be a view of a whole frame's 2-D block
            if self._open and self._open[0][0] is self:
                self._open.clear()
            i, m = 0, len(v)
            while i < m:
                if self._len == len(self._buf):
                    if len(self._buf) >= BLOCK_VALUES:
                        self._pack()
                    else:
                        grown = np.empty(min(max(self._len + m - i, 2 * len(self._buf), 1024), BLOCK_VALUES))
                        grown[: self._len] = self._buf[: self._len]
                        self._buf = grown
                take = min(len(self._buf) - self._len, m - i)
                self._buf[self._len:self._len + take] = v[i:i + take]
                self._len += take
                i += take
            return
        ok = v[~np.isnan(v)]
        self.n += len(ok)
        if len(ok):
            self.sums.append(float(ok.sum()))
        if self.sketch is not None:
            self.sketch.add(ok)

    def _pack(self) -> None:
        """Compress the full block (byte-shuffled) and start an empty one."""
        import pyarrow as pa

        n = self._len
        shuffled = self._buf[:n].view(np.uint8).reshape(n, 8).T.copy()
        self._blocks.append(pa.Codec("zstd", compression_level=1).compress(shuffled, asbytes=True))
        self._packed += n
        self._len = 0

    def column(self) -> np.ndarray:
        """The kept column (exact mode only)."""
        if not self.exact:
            raise ValueError("the column was not kept (sketch mode)")
        if not self._blocks:
            return self._buf[: self._len]
        if self._open and self._open[0][0] is self:
            return self._open[0][1]
        self._open.clear()  # the previous column's whole copy goes first
        import pyarrow as pa

        codec = pa.Codec("zstd", compression_level=1)
        out = np.empty(self._packed + self._len)
        for k, blob in enumerate(self._blocks):
            a = k * BLOCK_VALUES
            raw = codec.decompress(blob, decompressed_size=8 * BLOCK_VALUES, asbytes=True)
            out[a:a + BLOCK_VALUES].view(np.uint8).reshape(BLOCK_VALUES, 8)[:] = (
                np.frombuffer(raw, dtype=np.uint8).reshape(8, BLOCK_VALUES).T)
        out[self._packed:] = self._buf[: self._len]
        self._open.append((self, out))
        return out

    def count(self) -> int:
        """Non-NaN values."""
        if self.exact:
            return int(np.count_nonzero(~np.isnan(self.column())))
        return self.n

    def mean(self, empty: float) -> float:
        """Mean of the non-NaN values (pandas' ``Series.mean``), ``empty`` when there are none."""
        if self.exact:
            x = self.column()
            return float(pd.Series(x, dtype=float).mean()) if len(x) else empty
        return math.fsum(self.sums) / self.n if self.n else empty

    def percentile(self, q: float, empty: float = float("nan")) -> float:
        """``numpy.percentile`` of the non-NaN values (exact), or the sketch's within its bound."""
        if self.exact:
            x = self.column()
            x = x[~np.isnan(x)]
            return float(np.percentile(x, q)) if len(x) else empty
        if self.sketch is None:
            raise ValueError("this column keeps no quantiles")
        return self.sketch.percentile(q) if self.sketch.count else empty

    def free(self) -> None:
        """Drop the kept column (its statistics are no longer needed)."""
        if self._open and self._open[0][0] is self:
            self._open.clear()
        self._buf = np.empty(0)
        self._len = 0
        self._blocks = []
        self._packed = 0
