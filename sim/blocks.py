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

from collections import OrderedDict


class BlockPool:
    """Block accounting of one engine (P or D) with an optional block-granular prefix cache."""

    __slots__ = ("capacity", "block_size", "caching", "held", "pinned", "cached", "cache", "min_free")

    def __init__(self, capacity_blocks: int, block_size: int, caching: bool) -> None:
        self.capacity = capacity_blocks
        self.block_size = block_size
        self.caching = caching
        self.held = 0  # blocks of admitted, unfinished requests
        self.pinned = 0  # blocks of finished requests kept for a remote reader (not evictable)
        self.cached = 0  # freed blocks with a known hash (evictable prefix cache)
        self.cache: OrderedDict[int, tuple[int, int]] = OrderedDict()  # conv -> (tokens, blocks), LRU first
        self.min_free = capacity_blocks

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
        old = self.cache.pop(conv, None)
        if old is not None:
            self.cached -= old[1]
        self.cache[conv] = (full, full // bs)
        self.cached += full // bs

    def take(self, conv: int) -> tuple[int, int] | None:
        """Remove and return the conversation's cache entry (a lookup about to use or re-file it)."""
        entry = self.cache.pop(conv, None)
        if entry is not None:
            self.cached -= entry[1]
        return entry

    def put_back(self, conv: int, entry: tuple[int, int]) -> None:
        """Return an entry taken by :meth:`take` unchanged (it was just looked up: most recently used)."""
        self.cache[conv] = entry
        self.cached += entry[1]

    def evict(self, need: int) -> None:
        """Evict cached blocks until ``need`` are free (or the cache is empty), tail blocks first.

        vLLM's free queue hands out its oldest block first, and ``free`` appends a request's blocks tail
        first, so eviction eats the least recently freed conversation from its tail: a shortened prefix
        of it survives as a (smaller) cache entry in the same place.
        """
        cache = self.cache
        deficit = need - (self.capacity - self.held - self.pinned - self.cached)
        while deficit > 0 and cache:
            conv, (tokens, b) = next(iter(cache.items()))
            if b > deficit:
                cache[conv] = (tokens - deficit * self.block_size, b - deficit)
                self.cached -= deficit
                return
            del cache[conv]
            self.cached -= b
            deficit -= b
