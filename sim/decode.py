"""The decode node: admission into the KV block pool, the P->D pull, and TTL retention.

It wires three parts: the block pool (``sim/blocks.py``), retention of finished requests' blocks
(``sim/retention.py``) and the continuous decode batch (``sim/batch.py``).

Sources (vLLM): the D side of ``nixl/pull_scheduler.py`` (pull ``prompt - local hit`` from P; with
``bidirectional_kv_xfer`` every finished request pins its blocks until ``now + decoder_kv_blocks_ttl``,
freed by the reader's NIXL notification or at the deadline), ``vllm/v1/core/sched/scheduler.py``
(pinned blocks are neither evictable nor preemptable; once freed, hashed blocks are LRU-evictable
prefix cache). Retained blocks expire lazily: the deadline is checked whenever blocks are needed.

Simplification (stated): D reserves ``prompt + output`` tokens of blocks at admission instead of
growing per step, so vLLM's recompute-preemption under KV pressure is not modelled; admission waits.
"""

from __future__ import annotations

import math
from collections import deque

from kvplan.sim.batch import DecodeBatch
from kvplan.sim.blocks import BlockPool
from kvplan.sim.context import P2D, Ctx, Request
from kvplan.sim.events import Ev, Release
from kvplan.sim.retention import Retention
from kvplan.sim.router import KVParams


class DecodeNode:
    """One decode instance."""

    def __init__(self, ctx: Ctx, idx: int) -> None:
        self.ctx = ctx
        self.env = ctx.env
        self.idx = idx
        sc = ctx.scenario
        self.caching = sc.deployment.decode_prefix_caching
        self.bidirectional = sc.policy.bidirectional
        self.ttl_s = sc.policy.decoder_kv_blocks_ttl_s
        self.p2d_threshold = sc.policy.kv_recompute_threshold_tokens if sc.policy.threshold_applies_to_p2d else 0
        self.pool = BlockPool(ctx.decode_capacity_blocks, ctx.block_size, self.caching)
        self.retention = Retention(idx, sc.deployment.decode_nodes)
        self.batch = DecodeBatch(
            self.env, ctx.log, idx, ctx.costs.decode, sc.deployment.max_num_seqs,
            sc.simulation.decode_mode == "exact", self._finish,
        )
        self._admit_q: deque[Request] = deque()
        self._admit_wake_at = math.inf
        self._inflight = 0  # admitted, not yet finished

    @property
    def capacity_blocks(self) -> int:
        """KV blocks of this node's pool."""
        return self.pool.capacity

    # ---- retention ---------------------------------------------------------------------------------------

    def pin_alive(self, pin_id: int, now: float) -> bool:
        """Whether the pinned blocks still exist at ``now`` (deadline not passed, not yet released)."""
        return self.retention.alive(pin_id, now)

    def mark_reading(self, pin_id: int) -> None:
        """A P worker posted a READ of these blocks: they stay until the read completes."""
        self.retention.mark_reading(pin_id)

    def release_pin(self, pin_id: int, why: Release) -> None:
        """P released retained blocks (read done or notification): they become prefix cache."""
        if self._unpin(pin_id, why, self.env.now):
            self._try_admit()

    def _unpin(self, pin_id: int, why: Release, t: float) -> bool:
        pin = self.retention.pop(pin_id)
        if pin is None:
            return False
        self.pool.pinned -= pin.blocks
        self.ctx.log.append((t, Ev.UNPIN, pin.conv, -1, self.idx, pin.tokens, why))
        if why != Release.REUSED:
            self.pool.to_cache(pin.conv, pin.tokens)
        return True

    def _expire(self, now: float) -> None:
        for expiry, pid in self.retention.due(now):
            self._unpin(pid, Release.EXPIRED, expiry)

    def expire_all(self) -> None:
        """End of run: every pin still held is counted as expired at its deadline (no leak)."""
        for pid in self.retention.all_by_expiry():
            self._unpin(pid, Release.EXPIRED, self.retention.pins[pid].expiry_s)
        self.retention.clear_heap()

    def cached_tokens(self, conv: int) -> int:
        """Tokens of the conversation retained (pinned) or prefix-cached here (for ``prefix_aware`` routing)."""
        pid = self.retention.of_conv.get(conv)
        if pid is not None:
            return self.retention.pins[pid].tokens
        entry = self.pool.cache.get(conv)
        return entry[0] if entry is not None else 0

    def load(self) -> int:
        """Requests waiting for admission, pulling or running on this D."""
        return len(self._admit_q) + self._inflight

    # ---- admission and P->D pull -------------------------------------------------------------------------

    def submit(self, req: Request) -> None:
        """The D leg reaches this engine: wait for KV blocks, pull from P, then join the batch."""
        req.d_node = self.idx
        self.ctx.log.append((self.env.now, Ev.D_ENQUEUE, req.conv, req.turn, self.idx, 0, 0))
        self._admit_q.append(req)
        self._try_admit()

    def _try_admit(self) -> None:
        """Admit waiting requests in FCFS order while their blocks fit (expired pins freed first)."""
        q = self._admit_q
        if not q:
            return
        now = self.env.now
        self._expire(now)
        pool = self.pool
        ret = self.retention
        bs = self.ctx.block_size
        while q:
            r = q[0]
            total = -(-(r.prompt + r.output) // bs)
            hit = owned = 0
            pid = ret.of_conv.get(r.conv) if self.caching else None
            entry = pool.take(r.conv) if self.caching else None  # out of the cache: eviction cannot take it
            cap = ((r.prompt - 1) // bs) * bs
            if pid is not None:
                pin = ret.pins[pid]
                hit, owned = min(pin.tokens, cap), pin.blocks
            elif entry is not None:
                hit, owned = min(entry[0], cap), entry[1]
            if hit <= 0:
                hit = owned = 0
            need = max(total - owned, 0)
            if pool.free() < need:
                pool.evict(need)
                if pool.free() < need:
                    if entry is not None:
                        pool.put_back(r.conv, entry)
                    if pool.capacity < total:
                        raise RuntimeError(f"request of {total} blocks exceeds D capacity {pool.capacity}")
                    self._wake_admission_at_next_expiry()
                    return
            q.popleft()
            self._inflight += 1
            if pid is not None and hit > 0:
                self._unpin(pid, Release.REUSED, now)  # its blocks now belong to the running request
            elif entry is not None and hit == 0:
                pool.to_cache(r.conv, entry[0])
            held = need + owned
            pool.held += held
            r.d_blocks = held
            pool.check()
            self.ctx.log.append((now, Ev.D_ADMIT, r.conv, r.turn, self.idx, hit, need))
            self._start_p2d(r, hit)

    def _wake_admission_at_next_expiry(self) -> None:
        t = self.retention.next_expiry()
        if t is None:
            return  # blocks will come back when a running request finishes
        if t >= self._admit_wake_at and self._admit_wake_at > self.env.now:
            return
        self._admit_wake_at = t
        self.env.timeout(max(t - self.env.now, 0.0)).callbacks.append(lambda _e: self._try_admit())

    def _start_p2d(self, r: Request, hit: int) -> None:
        ctx = self.ctx
        env = self.env
        tokens = r.prompt - hit
        if 0 < tokens < self.p2d_threshold:
            # newest vLLM (PR #55801): D recomputes a short tail instead of pulling it
            t = ctx.costs.prefill.fixed_s + ctx.costs.prefill.per_token_s * tokens
            env.timeout(t).callbacks.append(lambda _e: self.batch.ready(r))
            return

        def done(xfer_s: float, _post_s: float) -> None:
            ctx.log.append((env.now, Ev.P2D_DONE, r.conv, r.turn, self.idx, xfer_s, 0))
            self.batch.ready(r)

        ctx.log.append((env.now, Ev.P2D_START, r.conv, r.turn, self.idx, tokens, tokens * ctx.kv_bytes_rank * ctx.tp))
        ctx.transfer(r.p_node, self.idx, P2D, tokens, done)

    # ---- finish and retention ----------------------------------------------------------------------------

    def _finish(self, r: Request) -> None:
        env = self.env
        ctx = self.ctx
        now = env.now
        ctx.log.append((now, Ev.D_FINISH, r.conv, r.turn, self.idx, r.output, 0))
        self.pool.held -= r.d_blocks
        r.d_blocks = 0
        self._inflight -= 1
        kv_tokens = r.prompt + r.output - 1  # the last sampled token never gets KV
        if self.bidirectional:
            blocks = -(-kv_tokens // ctx.block_size)
            expiry = now + self.ttl_s
            pid, old = self.retention.add(r.conv, kv_tokens, blocks, expiry)
            if old is not None:  # cannot happen with single-use routing; keep the accounting exact anyway
                self._unpin(old, Release.EXPIRED, now)
            self.pool.pinned += blocks
            ctx.log.append((now, Ev.PIN, r.conv, r.turn, self.idx, kv_tokens, expiry))
            ctx.router.store(r.conv, KVParams(self.idx, kv_tokens, expiry, now, pid))
        else:
            self.pool.to_cache(r.conv, kv_tokens)
        ctx.driver.d_done(r)
        self._try_admit()
