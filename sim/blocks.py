"""A node's KV block pool: blocks held by requests, pinned by retention, kept as prefix cache, or free.

Sources (vLLM): ``vllm/v1/core/block_pool.py`` (one free-block queue; a freed block whose hash is known
stays in it as an evictable prefix-cache entry until a new allocation takes it, least recently freed
first) and ``vllm/v1/core/kv_cache_manager.py`` (``free``: a request's blocks are freed in reverse
order, so the tail of a sequence is evicted before its head).

Accounting: ``capacity = held + pinned + cached + free`` with ``free >= 0`` after every allocation;
``min_free`` records the smallest free count ever seen so tests can check the invariant. The pool
counts blocks; which request holds how many is stored on the request itself.
"""

from __future__ import annotations

from typing import Any


class BlockPool:
    """Block accounting of one engine (P or D) with an optional block-granular prefix cache.

    The cache's least recently freed entry is usually cut a little at every allocation of a full pool (its tail
    blocks are evicted, :meth:`evict`), so that cut is kept aside (``_trim`` blocks of the entry of ``_front``, the
    LRU conversation, whose stored blocks ``_front_b`` are known) instead of writing a new entry each time; every
    read of an entry (:meth:`entry`, :meth:`take`, :attr:`cache`) sees the cut applied. Same contents, same order.
    """

    __slots__ = ("capacity", "block_size", "caching", "held", "pinned", "cached", "_lru", "min_free", "_front",
                 "_front_b", "_trim")

    def __init__(self, capacity_blocks: int, block_size: int, caching: bool) -> None:
        self.capacity = capacity_blocks
        self.block_size = block_size
        self.caching = caching
        self.held = 0  # blocks of admitted, unfinished requests
        self.pinned = 0  # blocks of finished requests kept for a remote reader (not evictable)
        self.cached = 0  # freed blocks with a known hash (evictable prefix cache)
        # conv -> (tokens, blocks), least recently freed first: a dict keeps insertion order, and an entry filed
        # again is taken out first (compiled: native dictionary operations; an OrderedDict's are generic calls)
        self._lru: dict[int, tuple[int, int]] = {}
        self.min_free = capacity_blocks
        self._front = -1  # the LRU entry's conversation while known (-1: look it up), its stored blocks, and the
        self._front_b = 0  # blocks evicted from its tail not yet written into it (only ever the LRU entry's)
        self._trim = 0

    @property
    def cache(self) -> dict[int, tuple[int, int]]:
        """conv -> (tokens, blocks) of the prefix cache, least recently freed first (for readers outside the hot
        path: the pending cut is written into the entry first)."""
        if self._trim:
            conv = self._front
            tokens, b = self._lru[conv]
            self._lru[conv] = (tokens - self._trim * self.block_size, b - self._trim)
            self._front_b = b - self._trim
            self._trim = 0
        return self._lru

    def entry(self, conv: int) -> tuple[int, int] | None:
        """The conversation's cache entry (tokens, blocks), or None; the LRU order is unchanged."""
        e = self._lru.get(conv)
        if e is not None and self._trim and conv == self._front:
            return e[0] - self._trim * self.block_size, e[1] - self._trim
        return e

    def free(self) -> int:
        """Blocks neither held, pinned nor cached."""
        return self.capacity - self.held - self.pinned - self.cached

    def check(self) -> None:
        """Record the free count (tests assert ``min_free >= 0``)."""
        f = self.capacity - self.held - self.pinned - self.cached
        if f < self.min_free:
            self.min_free = f

    def to_cache(self, conv: int, tokens: int) -> None:
        """Blocks of ``tokens`` KV tokens are freed: the full ones stay as the conversation's cache entry."""
        if not self.caching:
            return  # straight back to the free pool
        bs = self.block_size
        full = (tokens // bs) * bs
        key: Any = conv  # boxed once (see take)
        self._take(key, conv)  # an older entry's blocks leave the cached count
        self._lru[key] = (full, full // bs)
        self.cached += full // bs

    def take(self, conv: int) -> tuple[int, int] | None:
        """Remove and return the conversation's cache entry (a lookup about to use or re-file it)."""
        return self._take(conv, conv)

    def _take(self, key: Any, conv: int) -> tuple[int, int] | None:
        """:meth:`take` with ``key`` the conversation number boxed once: compiled, each dictionary call would box
        an int ``conv`` again (a new int object above 256)."""
        entry = self._lru.get(key)
        if entry is not None:
            del self._lru[key]
            if conv == self._front:
                self._front = -1
                if self._trim:
                    entry = (entry[0] - self._trim * self.block_size, entry[1] - self._trim)
                    self._trim = 0
            self.cached -= entry[1]
        return entry

    def put_back(self, conv: int, entry: tuple[int, int]) -> None:
        """Return an entry taken by :meth:`take` unchanged (it was just looked up: most recently used)."""
        self._lru[conv] = entry
        self.cached += entry[1]

    def evict(self, need: int) -> None:
        """Evict cached blocks until ``need`` are free (or the cache is empty), tail blocks first.

        vLLM's free queue hands out its oldest block first, and ``free`` appends a request's blocks tail
        first, so eviction eats the least recently freed conversation from its tail: a shortened prefix
        of it survives as a (smaller) cache entry in the same place (the cut is kept aside: see the class).
        """
        cache = self._lru
        deficit = need - (self.capacity - self.held - self.pinned - self.cached)
        while deficit > 0 and cache:
            conv = self._front
            if conv < 0:  # look the LRU entry up (no cut is pending then)
                conv = next(iter(cache))
                self._front = conv
                self._front_b = cache[conv][1]
            b = self._front_b - self._trim
            if b > deficit:
                self._trim += deficit
                self.cached -= deficit
                return
            del cache[conv]
            self._front = -1
            self._trim = 0
            self.cached -= b
            deficit -= b
