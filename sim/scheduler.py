"""One vLLM V1 scheduler core: the waiting and running queues, the scheduling pass, block allocation, preemption.

Source (vLLM): ``vllm/v1/core/sched/scheduler.py`` ``Scheduler.schedule``. There is no prefill or decode
phase: every request gets ``num_tokens - num_computed_tokens`` new tokens capped by the step's token budget
(``max_num_batched_tokens``). RUNNING requests are scheduled first (a request still prefilling takes its next
chunk, a decoding one a token), each calling ``kv_cache_manager.allocate_slots`` for the slots of what it
computes; when that fails the newest running request is preempted (``self.running.pop()``,
``_preempt_request``: its blocks freed, full hashed blocks kept as prefix cache by ``kv_cache_manager.free``,
re-queued at the front of WAITING) and no waiting request is scheduled in that step (``if not
preempted_reqs``). Then WAITING requests FCFS while ``len(running) < max_num_seqs`` and budget remains, each
after its local prefix hit (``kv_cache_manager.get_computed_blocks``: full blocks, never the whole request);
a waiting request whose blocks cannot be allocated stops the waiting loop (``break``).

:class:`Scheduler` is that pass for one engine; the prefill node (``sim/prefill.py``) and the aggregated
replica (``sim/aggregated.py``) are schedulers that add only what differs: what a waiting request needs before
it runs (P: the connector's pull decision; aggregated: nothing), how a running request grows, what a step
costs and what happens when a request leaves. D's admission (``sim/decode.py``) runs the same allocation
(:func:`prefix_hit`, :func:`reserve`) and preemption bookkeeping (:func:`record_preemption`) over its
admission queue and batch (``sim/batch.py``). Plain typed Python, no SimPy: compiled by mypyc (sim/native.py).
"""

from __future__ import annotations

from typing import Protocol

from kvplan.sim.blocks import BlockPool
from kvplan.sim.evlog import EV_D_PREEMPT, EV_P_ENQUEUE, RowBuffer
from kvplan.sim.fifo import Fifo, new_fifo
from kvplan.sim.request import Request


class Reclaimer(Protocol):
    """A node's ways to free blocks besides evicting prefix cache (called only when the pool is short)."""

    def before_evict(self, want: int) -> None:
        """Free what is due before the prefix cache is evicted (P: lapsed leases; D: the batch's true growth)."""

    def after_evict(self, want: int, keep: int | None) -> None:
        """Free more once the prefix cache is gone (D's ``ttl_evictable`` pins other than ``keep``)."""


def prefix_hit(cached: int, tokens: int, reuse: int, block_size: int) -> int:
    """``get_computed_blocks``: the cached prefix in full blocks, never the last token of ``tokens``.

    Only what the prompt repeats token for token is a hit (``reuse``, sim/history.py), in full blocks.
    """
    cap = ((tokens - 1) // block_size) * block_size
    hit = cached if cached < cap else cap
    if reuse < hit:
        hit = (reuse // block_size) * block_size
    return hit


def reserve(pool: BlockPool, want: int, conv: int, entry: tuple[int, int] | None, reclaim: Reclaimer | None,
            keep: int | None = None) -> bool:
    """``allocate_slots``' check: ``want`` free blocks after evicting prefix cache (and what ``reclaim`` frees).

    False when they cannot be had; the conversation's cache entry taken for the lookup (``entry``) is then
    put back unchanged (the request keeps waiting).
    """
    if pool.free() >= want:
        return True
    if reclaim is not None:
        reclaim.before_evict(want)
    pool.evict(want)
    if reclaim is not None and pool.free() < want:
        reclaim.after_evict(want, keep)
    if pool.free() >= want:
        return True
    if entry is not None:
        pool.put_back(conv, entry)
    return False


def record_preemption(rows: RowBuffer, now: float, node: int, pool: BlockPool, r: Request, sampled: int,
                      kv_tokens: int) -> None:
    """``_preempt_request``'s bookkeeping: the request keeps ``sampled`` tokens and resumes by recomputing;
    its ``kv_tokens`` of KV are freed (full blocks stay as prefix cache); one ``D_PREEMPT`` row."""
    r.d_preemptions += 1
    r.d_generated = sampled
    r.d_resume = True
    rows.append((now, EV_D_PREEMPT, r.conv, r.turn, node, sampled, kv_tokens))
    pool.to_cache(r.conv, kv_tokens)


class Scheduler:
    """The waiting and running queues of one engine and ``Scheduler.schedule`` over them.

    Subclasses say what differs: :meth:`_can_schedule` (blocks and anything else a waiting request needs),
    :meth:`_scheduled` (it left WAITING: does it compute in this step?), :meth:`_grow` and
    :meth:`_decode_token` (a running request's slots; ``r.p_blocks`` is what it holds). The step being
    scheduled is ``chunks`` (request, new tokens), ``new_tokens``, the attention ``pairs`` and, of those,
    ``ctx_pairs`` against KV already cached.
    """

    def __init__(self, rows: RowBuffer, node: int, max_seqs: int, max_tokens: int, pool: BlockPool) -> None:
        self.rows = rows  # the event log's packed rows (sim/evlog.py)
        self.idx = node
        self.max_seqs = max_seqs
        self.max_tokens = max_tokens
        self.pool = pool
        self.waiting: Fifo[Request] = new_fifo()  # sim/fifo.py: native compiled, a deque interpreted
        self.running: list[Request] = []
        self.chunks: list[tuple[Request, int]] = []
        self.budget = 0
        self.new_tokens = 0
        self.pairs = 0.0
        self.ctx_pairs = 0.0
        self.preempted_now = False  # a preemption in the step being scheduled (no waiting request joins it)

    # ---- what the router asks ------------------------------------------------------------------------------

    def cached_tokens(self, conv: int) -> int:
        """Prefix-cached tokens of the conversation on this engine (for ``prefix_aware`` routing)."""
        entry = self.pool.entry(conv)
        return entry[0] if entry is not None else 0

    def load(self) -> int:
        """Requests waiting or running on this engine."""
        return len(self.waiting) + len(self.running)

    def _enqueue(self, now: float, req: Request) -> None:
        """The request enters WAITING (``P_ENQUEUE``)."""
        self.rows.append((now, EV_P_ENQUEUE, req.conv, req.turn, self.idx, 0, 0))
        self.waiting.append(req)

    # ---- the pass ------------------------------------------------------------------------------------------

    def schedule(self) -> None:
        """One scheduling pass: RUNNING first, then WAITING FCFS (no waiting request after a preemption)."""
        budget = self.max_tokens
        chunks: list[tuple[Request, int]] = []
        self.chunks = chunks
        self.preempted_now = False
        running = self.running
        bs = self.pool.block_size
        i = 0
        while i < len(running) and budget > 0:  # preemption pops from the end: never one already scheduled
            r = running[i]
            rem = r.p_remaining
            if rem > 0:
                n = rem if rem < budget else budget
                blocks = -(-(r.p_ctx + n) // bs)
                if blocks > r.p_blocks and not self._grow(r, blocks):
                    break  # it preempted itself: nothing after it runs
                chunks.append((r, n))
                budget -= n
            elif self._decode_token(r):
                budget -= 1
            else:
                break
            i += 1
        waiting = self.waiting
        while not self.preempted_now and waiting and len(running) < self.max_seqs and budget > 0:
            r = waiting[0]
            if not self._can_schedule(r):
                break  # FCFS: the head waits (for blocks, or for the next plan)
            waiting.popleft()
            if not self._scheduled(r):
                continue
            running.append(r)
            n = r.p_remaining if r.p_remaining < budget else budget
            chunks.append((r, n))
            budget -= n
        self.budget = budget
        # the step's prompt tokens and causal attention pairs over each chunk's ``p_ctx`` computed tokens (of
        # those, ``ctx_pairs`` against KV already cached), summed in scheduling order
        new = 0
        pairs = ctx_pairs = 0.0
        for r, n in chunks:
            c = r.p_ctx
            new += n
            ctx_pairs += n * c
            pairs += n * c + n * (n + 1) / 2  # models.costs.causal_pairs, inlined
        self.new_tokens = new
        self.pairs = pairs
        self.ctx_pairs = ctx_pairs

    # ---- block allocation ----------------------------------------------------------------------------------

    def _allocate(self, r: Request, tokens: int, reuse: int, watermark: int, reclaim: Reclaimer | None) -> int:
        """``allocate_slots`` for a waiting request: the blocks of ``tokens`` minus its own prefix-cache hit.

        Returns the hit (tokens), or -1 when the blocks are not free (the request keeps waiting). The cache
        entry leaves the LRU while looked up (eviction cannot take it); its blocks past the hit and past
        ``tokens`` go back to the free pool. ``r.p_blocks`` is the request's held blocks.
        """
        pool = self.pool
        bs = pool.block_size
        entry = pool.take(r.conv) if pool.caching else None
        hit = owned = 0
        if entry is not None:
            hit = prefix_hit(entry[0], tokens, reuse, bs)
            if hit > 0:
                owned = entry[1]
        total = -(-tokens // bs)
        # a taken entry's blocks left the cached count but are still in use: they are not free
        want = max(total - owned, 0) + watermark + (entry[1] if entry is not None else 0)
        if pool.free() < want and not reserve(pool, want, r.conv, entry, reclaim):
            return -1
        if entry is not None and hit == 0:
            pool.to_cache(r.conv, entry[0])
        pool.held += total
        pool.check()
        r.p_blocks = total
        return hit

    # ---- what a node says ----------------------------------------------------------------------------------

    def _can_schedule(self, r: Request) -> bool:
        """Whether the head of WAITING can be scheduled now (its blocks allocated); False stops the loop."""
        raise NotImplementedError

    def _scheduled(self, r: Request) -> bool:
        """``r`` left WAITING: True when it computes in this step (it joins RUNNING)."""
        return True

    def _grow(self, r: Request, blocks: int) -> bool:
        """Grow a running request's ``r.p_blocks`` to ``blocks`` (``allocate_slots`` for its next chunk); False
        when it was itself preempted. Default (P allocates whole prompts, so it is never asked): nothing to do."""
        return True

    def _decode_token(self, r: Request) -> bool:
        """Schedule one decode token of a running request (it takes one token of budget); False when it was
        itself preempted."""
        raise NotImplementedError
