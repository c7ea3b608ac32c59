"""Inter-token latency (ITL): the gaps between a request's streamed tokens, kept per engine (compiled hot path).

What a user's benchmark measures (vLLM ``benchmarks/serve.py`` / ``benchmark_serving.py``: ``itls`` are the
gaps between consecutive streamed chunks after the first; ``median_itl_ms``, ``p99_itl_ms`` pool every gap of
every request) is, in the model, one gap per engine step a request takes part in after its first token, plus
the longer gaps around a preemption (last token before it -> the token its recompute samples -> the token of
its first step back in the batch).

Cost: an engine's steps come in stretches of ``n`` steps whose durations form an arithmetic series
(``sim/batch.py``), so the gaps are counted per stretch, never per token. Each engine keeps

* a persistent histogram of its step durations (a path-copying binary tree over the logarithmic buckets of
  :class:`kvplan.sim.quantiles.LogSketch`, ``ALPHA`` = 0.5 %): each insertion makes a new version (O(depth)
  new nodes) and leaves older versions intact. A request keeps the version at the start of its stay in the
  batch and the bucket of the stay's first step (its first token, not a gap); at its finish, the difference
  between the current version and that one, less that step, is the histogram of exactly its gaps,
  whose median and maximum are read by walking down both trees (O(depth)) - the classic "k-th smallest in a
  range" persistent segment tree. Versions no request refers to any more are freed by reference counting,
  so memory stays bounded by the requests in flight;
* the pooled bucket counts of every gap (each step weighted by the requests it gave a non-first token),
  logged once at the end of the run (``Ev.ITL_HIST``) for the summary's ``itl_p50/p90/p99_s``.

Two representations of the same tree: compiled (sim/native.py), a node is a :class:`TNode` (native fields: a count
read is a load, a node one allocation outside the cyclic GC); interpreted, a 3-item list (a list literal is the
cheapest object CPython builds; a class instance costs an ``__init__`` call). :class:`ItlTracker` builds one or the
other (``native``), and the readers take whichever they are given; ``tests/test_itl.py`` holds the two to the same
answers on random histories.

Precision: per-turn ``itl_p50_s``/``itl_max_s`` and the pooled percentiles are bucket representatives,
within a relative 0.5 % of the simulated gaps (the summary sketch's bound).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Final

from kvplan.sim.evlog import EV_ITL_HIST, RowBuffer

_COMPILED: Final = not __file__.endswith(".py")  # see sim/clock.py

try:  # mypyc reads the class attributes of TNode from the decorator (see sim/clock.py)
    from mypy_extensions import i64, mypyc_attr
except ImportError:  # interpreted without mypy installed: the decorator does nothing, i64 is int
    i64 = int  # type: ignore[misc]

    def mypyc_attr(*_args: object, **_kwargs: object) -> Callable[[type], type]:  # type: ignore[misc]
        """mypy_extensions.mypyc_attr's stand-in: the class unchanged."""
        return lambda cls: cls

ALPHA: Final = 0.005  # = kvplan.sim.quantiles.ALPHA (the same buckets: pooled counts feed a LogSketch)
GAMMA: Final = (1.0 + ALPHA) / (1.0 - ALPHA)
LOG_GAMMA: Final = math.log(GAMMA)
DEPTH: Final = 11
KEY_MIN: Final = -1152  # bucket of ~1e-5 s: shorter gaps are counted here
KEY_SPAN: Final = 1 << DEPTH  # keys KEY_MIN .. KEY_MIN + 2047 (up to ~7,700 s; longer gaps are counted there)
NO_SKIP: Final = KEY_MIN - 1  # a span whose first step is a gap too (its start version is after the first token)


def bucket_key(x: float) -> int:
    """The sketch bucket of a gap of ``x`` seconds, clamped to the tree's key range."""
    if x <= 0.0:
        return KEY_MIN
    k = math.ceil(math.log(x) / LOG_GAMMA)
    if k < KEY_MIN:
        return KEY_MIN
    top = KEY_MIN + KEY_SPAN - 1
    return k if k <= top else top


def bucket_value(key: int) -> float:
    """The bucket's representative (within ALPHA of every value of the bucket), as ``LogSketch`` gives it."""
    return 2.0 * math.exp(key * LOG_GAMMA) / (GAMMA + 1.0)


# A tree node is ``[count of its key range, lower half, upper half]``; a list built top-down by :func:`insert`
# and never changed afterwards, so every older version stays valid. Empty subtrees are the one node EMPTY,
# its own children, so that walks need no test for a missing child. The walks below read a node's items into
# annotated locals (``c: int = n[0]``, ``lo: Node = n[1]``): compiled, that is a checked unbox, and what follows
# is native list and integer code instead of Python's generic item access and arithmetic on ``Any``.
Node = list[Any]
EMPTY: Final[Node] = [0, None, None]
EMPTY[1] = EMPTY
EMPTY[2] = EMPTY


Root = Any  # a version of the tree: a TNode (ItlTracker(native=True), the compiled default) or a list Node


@mypyc_attr(acyclic=True)
class TNode:
    """A tree node of the compiled build: ``c`` the count of its key range, ``lo``/``hi`` its halves.

    Built top-down by :func:`_insert_t` and never changed once returned, like the list nodes. ``TNode(0)`` is an
    empty subtree whose halves are itself (:data:`T_EMPTY`). ``acyclic`` (mypyc): a node refers to older nodes
    only (the empty one to itself, kept for the whole process), so it stays out of the cyclic GC: an allocation
    without the GC header's bookkeeping, and a free without untracking.

    ``epoch``: the tracker's epoch the node was made in (-1: never changed). A node of the current epoch belongs to
    the current version alone (no version kept since it was made refers to it: keeping one starts a new epoch,
    :meth:`ItlTracker.snapshot`), so an insertion updates it in place instead of copying it (a "transient" in
    persistent-structure terms): about half the insertions follow no snapshot, and their path costs no allocation
    and no free."""

    __slots__ = ("c", "lo", "hi", "epoch")

    def __init__(self, c: int, lo: TNode | None = None, hi: TNode | None = None, epoch: i64 = -1) -> None:
        self.c = c
        self.lo: TNode = lo if lo is not None else self
        self.hi: TNode = hi if hi is not None else self
        self.epoch = epoch


T_EMPTY: Final = TNode(0)


def _count(n: Root | None) -> int:
    if n is None:
        return 0
    if isinstance(n, TNode):
        return n.c
    return int(n[0])


def _lo(n: Root | None) -> Root | None:
    if n is None:
        return None
    return n.lo if isinstance(n, TNode) else n[1]


def _hi(n: Root | None) -> Root | None:
    if n is None:
        return None
    return n.hi if isinstance(n, TNode) else n[2]


def insert(root: Node | None, key: int, c: int) -> Node:
    """A new version of ``root`` with ``c`` more at ``key`` (path copying; ``root`` is unchanged)."""
    off = key - KEY_MIN
    r = root if root is not None else EMPTY
    n0: int = r[0]
    top: Node = [c + n0, r[1], r[2]]
    new = top
    half = KEY_SPAN >> 1
    while half:
        side = 2 if off & half else 1
        ch: Node = new[side]
        n0 = ch[0]
        nxt: Node = [c + n0, ch[1], ch[2]]
        new[side] = nxt
        new = nxt
        half >>= 1
    return top


def _insert_t(root: TNode, key: int, c: int, epoch: i64) -> TNode:
    """:func:`insert` on :class:`TNode` versions; the nodes of ``epoch`` (the current version's own, see
    :class:`TNode`) are updated in place, the others copied into ``epoch``."""
    off = key - KEY_MIN
    if root.epoch == epoch:
        top = root
        top.c = root.c + c
    else:
        top = TNode(root.c + c, root.lo, root.hi, epoch)
    new = top
    half = KEY_SPAN >> 1
    while half:
        if off & half:
            ch = new.hi
            if ch.epoch == epoch:  # its parent is of this epoch too: it is the current version's alone
                ch.c = ch.c + c
                nxt = ch
            else:
                nxt = TNode(ch.c + c, ch.lo, ch.hi, epoch)
                new.hi = nxt
        else:
            ch = new.lo
            if ch.epoch == epoch:
                ch.c = ch.c + c
                nxt = ch
            else:
                nxt = TNode(ch.c + c, ch.lo, ch.hi, epoch)
                new.lo = nxt
        new = nxt
        half >>= 1
    return top


Span = tuple[Root | None, Root | None, int]  # (version at the stay's start, at its end, key of its first step)


def kth_key(spans: list[Span], extra: list[int], k: int) -> int:
    """Key of the ``k``-th smallest (0-based) gap: each span's ``end - start`` less its first step, plus ``extra``."""
    olds = [s[0] for s in spans]
    news = [s[1] for s in spans]
    skips = [s[2] for s in spans]
    base = KEY_MIN
    half = KEY_SPAN >> 1
    while half:
        mid = base + half
        left = 0
        for i in range(len(news)):
            left += _count(_lo(news[i])) - _count(_lo(olds[i]))
        for sk in skips:
            if base <= sk < mid:
                left -= 1
        for x in extra:
            if base <= x < mid:
                left += 1
        if k < left:
            olds = [_lo(o) for o in olds]
            news = [_lo(o) for o in news]
        else:
            k -= left
            base = mid
            olds = [_hi(o) for o in olds]
            news = [_hi(o) for o in news]
        half >>= 1
    return base


def kth_key1(old: Node | None, new: Node | None, skip: int, k: int, base: int = KEY_MIN,
             half: int = KEY_SPAN >> 1) -> int:
    """:func:`kth_key` of one span and no extra gap (the common case, without lists); ``old``/``new`` may be
    the subtrees of keys ``base .. base + 2 * half - 1``."""
    o = old if old is not None else EMPTY
    n = new if new is not None else EMPTY
    while half:
        nl: Node = n[1]
        ol: Node = o[1]
        c_new: int = nl[0]
        c_old: int = ol[0]
        left = c_new - c_old
        if base <= skip < base + half:
            left -= 1
        if k < left:
            o, n = ol, nl
        else:
            k -= left
            base += half
            o, n = o[2], n[2]
        half >>= 1
    return base


def _kth_key1_t(old: TNode, new: TNode, skip: int, k: int, base: int, half: int) -> int:
    """:func:`kth_key1` on :class:`TNode` versions."""
    o = old
    n = new
    while half:
        nl = n.lo
        ol = o.lo
        c_new = nl.c
        c_old = ol.c
        left = c_new - c_old
        if base <= skip < base + half:
            left -= 1
        if k < left:
            o, n = ol, nl
        else:
            k -= left
            base += half
            o, n = o.hi, n.hi
        half >>= 1
    return base


def stay_stats(old: Root | None, new: Root | None, skip: int) -> tuple[float, float]:
    """:func:`turn_stats` of one stay in the batch without gaps around preemptions (the common case).

    One walk down the tree finds the middle order statistic(s) and the maximum: the paths are shared until
    they part (median and maximum usually lie in nearby buckets), then each part finishes on its own subtree.
    """
    if isinstance(new, TNode):
        return _stay_stats_t(old, new, skip)
    return _stay_stats_l(old, new if new is not None else EMPTY, skip)


def _stay_stats_l(old: Node | None, new: Node, skip: int) -> tuple[float, float]:
    """:func:`stay_stats` on list versions."""
    o = old if old is not None else EMPTY
    n = new if new is not None else EMPTY
    c_new: int = n[0]
    c_old: int = o[0]
    total = c_new - c_old - (skip != NO_SKIP)
    if total <= 0:
        return math.nan, math.nan
    k = (total - 1) >> 1
    kmax = total - 1
    want_hi = not total & 1  # even count: the upper middle one too
    base = KEY_MIN
    half = KEY_SPAN >> 1
    hi = top = 0
    split = top_done = False
    while half:
        nl: Node = n[1]
        ol: Node = o[1]
        c_new = nl[0]
        c_old = ol[0]
        left = c_new - c_old
        if base <= skip < base + half:
            left -= 1
        if k < left:
            if kmax >= left and not top_done:  # the maximum is in the upper half
                top_done = True
                top = kth_key1(o[2], n[2], skip, kmax - left, base + half, half >> 1)
            if want_hi and not split and k + 1 == left:  # the upper middle one is in the upper half
                split = True
                hi = kth_key1(o[2], n[2], skip, 0, base + half, half >> 1)
            o, n = ol, nl
        else:
            k -= left
            kmax -= left
            base += half
            o, n = o[2], n[2]
        half >>= 1
    if not top_done:
        top = base  # the maximum shares the median's bucket
    if not split:
        hi = base  # odd count, or both middle ones in one bucket
    lo_v = 2.0 * math.exp(base * LOG_GAMMA) / (GAMMA + 1.0)
    med = 0.5 * (lo_v + 2.0 * math.exp(hi * LOG_GAMMA) / (GAMMA + 1.0)) if hi != base else lo_v
    return med, 2.0 * math.exp(top * LOG_GAMMA) / (GAMMA + 1.0)


def _stay_stats_t(old: TNode | None, new: TNode, skip: int) -> tuple[float, float]:
    """:func:`stay_stats` on :class:`TNode` versions."""
    o = old if old is not None else T_EMPTY
    n = new
    c_new = n.c
    c_old = o.c
    total = c_new - c_old - (skip != NO_SKIP)
    if total <= 0:
        return math.nan, math.nan
    k = (total - 1) >> 1
    kmax = total - 1
    want_hi = not total & 1  # even count: the upper middle one too
    base = KEY_MIN
    half = KEY_SPAN >> 1
    hi = top = 0
    split = top_done = False
    while half:
        nl = n.lo
        ol = o.lo
        c_new = nl.c
        c_old = ol.c
        left = c_new - c_old
        if base <= skip < base + half:
            left -= 1
        if k < left:
            if kmax >= left and not top_done:  # the maximum is in the upper half
                top_done = True
                top = _kth_key1_t(o.hi, n.hi, skip, kmax - left, base + half, half >> 1)
            if want_hi and not split and k + 1 == left:  # the upper middle one is in the upper half
                split = True
                hi = _kth_key1_t(o.hi, n.hi, skip, 0, base + half, half >> 1)
            o, n = ol, nl
        else:
            k -= left
            kmax -= left
            base += half
            o, n = o.hi, n.hi
        half >>= 1
    if not top_done:
        top = base  # the maximum shares the median's bucket
    if not split:
        hi = base  # odd count, or both middle ones in one bucket
    lo_v = 2.0 * math.exp(base * LOG_GAMMA) / (GAMMA + 1.0)
    med = 0.5 * (lo_v + 2.0 * math.exp(hi * LOG_GAMMA) / (GAMMA + 1.0)) if hi != base else lo_v
    return med, 2.0 * math.exp(top * LOG_GAMMA) / (GAMMA + 1.0)


class ItlTracker:
    """One engine's step-duration history (persistent histogram) and pooled gap counts.

    A version kept past the current event (a stay's start or end) is taken with :meth:`snapshot`; :meth:`current`
    is for a reading done at once (TNode versions change in place until a snapshot is taken, see :class:`TNode`)."""

    def __init__(self, native: bool = _COMPILED) -> None:
        # the tree's versions are TNodes (native, the compiled default) or list nodes (the interpreted default)
        self.native = native
        self._root: Root = T_EMPTY if native else EMPTY
        self._epoch: i64 = 0  # TNode versions: the current epoch (bumped by each snapshot)
        # pooled gap counts by bucket, at ``key - KEY_MIN`` (a list: compiled, an indexed read and write instead of
        # a dictionary lookup with boxed keys; every key is in the tree's range)
        self.pooled: list[int] = [0] * KEY_SPAN

    def add(self, first: float, inc: float, n: int, weight: int, k: int) -> None:
        """``n`` steps of durations ``first + inc * i`` (``k``: the bucket of ``first``), each a gap for ``weight``
        requests (pooled counts)."""
        if n <= 0:
            return
        last = first + inc * (n - 1)
        if n == 1 or inc <= 0.0 or last <= math.exp(k * LOG_GAMMA) or k == KEY_MIN + KEY_SPAN - 1:  # one bucket
            if self.native:  # _put, written out (most stretches)
                self._root = _insert_t(self._root, k, n, self._epoch)
            else:
                self._root = insert(self._root, k, n)
            pooled = self.pooled
            j: i64 = k - KEY_MIN
            pooled[j] = pooled[j] + n * weight
            return
        # the series crosses buckets (bucket k holds (gamma^(k-1), gamma^k]): count the steps in each
        k1 = bucket_key(last)
        i = 0
        while i < n:
            if k >= k1:
                j = n
            else:
                j = min(n, max(i + 1, math.floor((math.exp(k * LOG_GAMMA) - first) / inc) + 1))
            self._put(k, j - i, weight)
            i = j
            if i < n:
                k = max(k + 1, bucket_key(first + inc * i))

    def snapshot(self) -> Root:
        """The current version, kept unchanged from now on (later insertions copy what they change)."""
        self._epoch += 1
        return self._root

    def current(self) -> Root:
        """The current version for a reading done at once (not to be kept: it may change in place)."""
        return self._root

    def stats_since(self, old: Root | None, skip: int) -> tuple[float, float]:
        """:func:`stay_stats` of a stay from version ``old`` (first step at ``skip``) to now, in one call."""
        if self.native:
            return _stay_stats_t(old, self._root, skip)
        return _stay_stats_l(old, self._root, skip)

    def _put(self, key: int, c: int, weight: int) -> None:
        if self.native:
            self._root = _insert_t(self._root, key, c, self._epoch)
        else:
            self._root = insert(self._root, key, c)
        pooled = self.pooled  # an int read and write (compiled: ``pooled[j] += x`` is a generic in-place add)
        j: i64 = key - KEY_MIN  # i64: a read and write by a C index (sim/clock.py _fpush)
        pooled[j] = pooled[j] + c * weight

    def unpool(self, key: int, c: int) -> None:
        """``c`` requests took their first token in a step counted at ``key``: not a gap for them."""
        pooled = self.pooled
        j: i64 = key - KEY_MIN
        pooled[j] = pooled[j] - c

    def gap(self, x: float) -> int:
        """One gap outside the step series (around a preemption), pooled; returns its key for the request."""
        key = bucket_key(x)
        pooled = self.pooled
        j: i64 = key - KEY_MIN
        pooled[j] = pooled[j] + 1
        return key

    def pooled_counts(self) -> dict[int, int]:
        """The pooled gap counts by bucket key (the buckets whose count is not 0), in key order."""
        return {KEY_MIN + i: c for i, c in enumerate(self.pooled) if c != 0}


def turn_stats(spans: list[Span], extra: list[int]) -> tuple[float, float]:
    """(median, max) of one request's gaps: its spans' step gaps plus the ``extra`` gap keys.

    The median is the mean of the two middle order statistics (``numpy.median``), each a bucket
    representative; NaN for a request without any gap (one output token).
    """
    total = len(extra)
    for old, new, skip in spans:
        total += _count(new) - _count(old) - (skip != NO_SKIP)
    if total <= 0:
        return math.nan, math.nan
    r_lo, r_hi = (total - 1) // 2, total // 2
    lo = kth_key(spans, extra, r_lo)
    hi = lo if r_hi == r_lo else kth_key(spans, extra, r_hi)
    top = kth_key(spans, extra, total - 1)
    return 0.5 * (bucket_value(lo) + bucket_value(hi)), bucket_value(top)


def log_pooled(rows: RowBuffer, now: float, node: int, itl: ItlTracker) -> None:
    """One ``ITL_HIST`` row per occupied bucket of the engine's pooled gaps: ``a`` = bucket key, ``b`` = count."""
    for key, c in itl.pooled_counts().items():
        if c > 0:
            rows.append((now, EV_ITL_HIST, -1, -1, node, float(key), float(c)))
