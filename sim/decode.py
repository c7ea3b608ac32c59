"""The decode node: KV block pool, P->D pull, continuous batching, and TTL retention.

Sources (vLLM): the D side of ``nixl/pull_scheduler.py`` (pull ``prompt - local hit`` from P; with
``bidirectional_kv_xfer`` every request finishing as STOPPED or LENGTH_CAPPED returns
``delay_free_blocks=True`` with deadline ``now + decoder_kv_blocks_ttl``, never renewed; the blocks are
freed by the reader's NIXL notification or when the worker sees the deadline pass),
``vllm/v1/core/sched/scheduler.py`` (``_update_waiting_for_remote_kv``: a full-prompt hit backs off one
token, so the first token costs one forward step; pinned blocks stay allocated to the finished request
and are neither evictable nor preemptable; once freed, hashed blocks are LRU-evictable prefix cache).

Speed: decode does not cost one event per token. Between batch changes the step times form an arithmetic
series (each step adds one token per sequence), so the node jumps to the next finish with one timeout
and, when a request joins mid-stretch, cuts the stretch at the boundary of the step in progress.
``decode_mode='exact'`` schedules every step instead; tests show both give the same per-turn times.
Retained blocks expire lazily: the deadline is checked whenever blocks are needed (and at the end).

Simplification (stated): D reserves ``prompt + output`` tokens of blocks at admission instead of
growing per step, so vLLM's recompute-preemption under KV pressure is not modelled; admission waits.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict, deque

from kvplan.sim.context import P2D, Ctx, Request
from kvplan.sim.events import Ev, Release
from kvplan.sim.router import KVParams


class Pin:
    """Blocks a finished request keeps for a possible D->P read."""

    __slots__ = ("conv", "tokens", "blocks", "expiry_s", "reading")

    def __init__(self, conv: int, tokens: int, blocks: int, expiry_s: float) -> None:
        self.conv = conv
        self.tokens = tokens
        self.blocks = blocks
        self.expiry_s = expiry_s
        self.reading = False


class DecodeNode:
    """One decode instance."""

    def __init__(self, ctx: Ctx, idx: int) -> None:
        self.ctx = ctx
        self.env = ctx.env
        self.idx = idx
        sc = ctx.scenario
        self.capacity_blocks = ctx.decode_capacity_blocks
        self.max_seqs = sc.deployment.max_num_seqs
        self.caching = sc.deployment.decode_prefix_caching
        self.bidirectional = sc.policy.bidirectional
        self.ttl_s = sc.policy.decoder_kv_blocks_ttl_s
        self.p2d_threshold = sc.policy.kv_recompute_threshold_tokens if sc.policy.threshold_applies_to_p2d else 0
        self.exact = sc.simulation.decode_mode == "exact"
        dc = ctx.costs.decode
        self._a, self._b, self._c = dc.fixed_s, dc.per_seq_s, dc.per_context_token_s
        # block pool
        self.running_blocks = 0
        self.pinned_blocks = 0
        self.cache_blocks = 0
        self.cache: OrderedDict[int, tuple[int, int]] = OrderedDict()  # conv -> (tokens, blocks)
        self.pins: dict[int, Pin] = {}
        self.pin_of_conv: dict[int, int] = {}
        self._pin_heap: list[tuple[float, int]] = []
        self._next_pin_id = idx  # unique across nodes: idx + k * n_decode
        self._admit_q: deque[Request] = deque()
        self._admit_wake_at = math.inf
        self._admitting = False
        self._req_blocks: dict[int, int] = {}
        # batch
        self._join_q: deque[Request] = deque()
        self.step = 0
        self.batch = 0
        self.ctx_sum = 0.0
        self._finish_heap: list[tuple[int, int, Request]] = []
        self._seq = 0
        self._active = False
        self._gen = 0
        self._plan_t0 = 0.0
        self._plan_n = 0
        self._plan_first = 0.0
        self._plan_inc = 0.0

    # ---- retention ---------------------------------------------------------------------------------------

    def pin_alive(self, pin_id: int, now: float) -> bool:
        """Whether the pinned blocks still exist at ``now`` (deadline not passed, not yet released)."""
        pin = self.pins.get(pin_id)
        return pin is not None and now < pin.expiry_s

    def mark_reading(self, pin_id: int) -> None:
        """A P worker posted a READ of these blocks: they stay until the read completes."""
        pin = self.pins.get(pin_id)
        if pin is not None:
            pin.reading = True

    def release_pin(self, pin_id: int, why: Release, at: float | None = None) -> None:
        """Free retained blocks (notification, read done, reuse or expiry); they become prefix cache."""
        pin = self.pins.pop(pin_id, None)
        if pin is None:
            return
        t = self.env.now if at is None else at
        if self.pin_of_conv.get(pin.conv) == pin_id:
            del self.pin_of_conv[pin.conv]
        self.pinned_blocks -= pin.blocks
        self.ctx.log.append((t, Ev.UNPIN, pin.conv, -1, self.idx, pin.tokens, why))
        if why != Release.REUSED:
            self._to_cache(pin.conv, pin.tokens, pin.blocks)
            self._try_admit()

    def _expire(self, now: float) -> None:
        heap = self._pin_heap
        while heap and heap[0][0] <= now:
            expiry, pid = heapq.heappop(heap)
            pin = self.pins.get(pid)
            if pin is not None and not pin.reading:
                self.release_pin(pid, Release.EXPIRED, at=expiry)

    def expire_all(self) -> None:
        """End of run: every pin still held is counted as expired at its deadline (no leak)."""
        for pid in sorted(self.pins, key=lambda p: (self.pins[p].expiry_s, p)):
            self.release_pin(pid, Release.EXPIRED, at=self.pins[pid].expiry_s)
        self._pin_heap.clear()

    def _to_cache(self, conv: int, tokens: int, blocks: int) -> None:
        if not self.caching:
            return  # blocks go straight back to the free pool
        bs = self.ctx.block_size
        full = (tokens // bs) * bs
        old = self.cache.pop(conv, None)
        if old is not None:
            self.cache_blocks -= old[1]
        self.cache[conv] = (full, full // bs)
        self.cache_blocks += full // bs

    def _free_blocks(self) -> int:
        return self.capacity_blocks - self.running_blocks - self.pinned_blocks - self.cache_blocks

    def _evict(self, need: int) -> None:
        while self._free_blocks() < need and self.cache:
            _, (_, b) = self.cache.popitem(last=False)
            self.cache_blocks -= b

    def cached_tokens(self, conv: int) -> int:
        """Tokens of the conversation retained (pinned) or prefix-cached here (for ``prefix_aware`` routing)."""
        pid = self.pin_of_conv.get(conv)
        if pid is not None:
            return self.pins[pid].tokens
        entry = self.cache.get(conv)
        return entry[0] if entry is not None else 0

    def load(self) -> int:
        """Requests waiting for admission, pulling or running on this D."""
        return len(self._admit_q) + len(self._req_blocks)

    # ---- admission and P->D pull -------------------------------------------------------------------------

    def submit(self, req: Request) -> None:
        """The D leg reaches this engine: wait for KV blocks, pull from P, then join the batch."""
        req.d_node = self.idx
        self.ctx.log.append((self.env.now, Ev.D_ENQUEUE, req.conv, req.turn, self.idx, 0, 0))
        self._admit_q.append(req)
        self._try_admit()

    def _try_admit(self) -> None:
        if self._admitting or not self._admit_q:
            return  # re-entered from a release inside this loop; the outer loop continues
        self._admitting = True
        try:
            self._admit_loop()
        finally:
            self._admitting = False

    def _admit_loop(self) -> None:
        env = self.env
        now = env.now
        self._expire(now)
        bs = self.ctx.block_size
        q = self._admit_q
        while q:
            r = q[0]
            total = -(-(r.prompt + r.output) // bs)
            hit = owned = 0
            pid = self.pin_of_conv.get(r.conv) if self.caching else None
            entry = self.cache.pop(r.conv, None) if self.caching else None
            if entry is not None:
                self.cache_blocks -= entry[1]  # taken out so eviction below cannot take it
            cap = ((r.prompt - 1) // bs) * bs
            if pid is not None:
                hit, owned = min(self.pins[pid].tokens, cap), self.pins[pid].blocks
            elif entry is not None:
                hit, owned = min(entry[0], cap), entry[1]
            if hit <= 0:
                hit = owned = 0
            need = max(total - owned, 0)
            if self._free_blocks() < need:
                self._evict(need)
                if self._free_blocks() < need:
                    if entry is not None:  # put it back (it was just looked up: most recently used)
                        self.cache[r.conv] = entry
                        self.cache_blocks += entry[1]
                    if self.capacity_blocks < total:
                        raise RuntimeError(f"request of {total} blocks exceeds D capacity {self.capacity_blocks}")
                    self._wake_admission_at_next_expiry()
                    return
            q.popleft()
            if pid is not None and hit > 0:
                self.release_pin(pid, Release.REUSED)  # its blocks now belong to the running request
            elif entry is not None and hit == 0:
                self._to_cache(r.conv, entry[0], entry[1])
            held = need + owned
            self.running_blocks += held
            self._req_blocks[id(r)] = held
            self.ctx.log.append((now, Ev.D_ADMIT, r.conv, r.turn, self.idx, hit, need))
            self._start_p2d(r, hit)

    def _wake_admission_at_next_expiry(self) -> None:
        if not self._pin_heap:
            return  # blocks will come back when a running request finishes
        t = self._pin_heap[0][0]
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
            env.timeout(t).callbacks.append(lambda _e: self._ready(r))
            return

        def done(xfer_s: float, _post_s: float) -> None:
            ctx.log.append((env.now, Ev.P2D_DONE, r.conv, r.turn, self.idx, xfer_s, 0))
            self._ready(r)

        ctx.log.append((env.now, Ev.P2D_START, r.conv, r.turn, self.idx, tokens, tokens * ctx.kv_bytes_rank * ctx.tp))
        ctx.transfer(r.p_node, self.idx, P2D, tokens, done)

    # ---- batch: event jumps between batch changes -------------------------------------------------------

    def _ready(self, r: Request) -> None:
        self._join_q.append(r)
        if not self._active:
            self._active = True
            self._boundary()
        elif self._plan_n > 1:
            self._cut_at_next_boundary()

    def _steps_time(self, k: int) -> float:
        return k * self._plan_first + self._plan_inc * k * (k - 1) / 2

    def _cut_at_next_boundary(self) -> None:
        """A request joined mid-stretch: end the stretch at the boundary of the step in progress."""
        e = self.env.now - self._plan_t0
        a, inc = self._plan_first, self._plan_inc
        if inc > 0:
            k = int((-(a - inc / 2) + math.sqrt((a - inc / 2) ** 2 + 2 * inc * e)) / inc)
        else:
            k = int(e / a) if a > 0 else 0
        k = max(k, 0)
        while k > 0 and self._steps_time(k) > e:
            k -= 1
        while self._steps_time(k + 1) <= e:
            k += 1
        cut = k + 1  # the step in progress ends at boundary k + 1
        if cut >= self._plan_n:
            return
        self._schedule(cut)

    def _schedule(self, n: int) -> None:
        self._gen += 1
        gen = self._gen
        self._plan_n = n
        dt = self._plan_t0 + self._steps_time(n) - self.env.now
        self.env.timeout(max(dt, 0.0)).callbacks.append(lambda _e: self._on_boundary(gen, n))

    def _on_boundary(self, gen: int, n: int) -> None:
        if gen != self._gen:
            return
        self.step += n
        self.ctx_sum += self.batch * n
        heap = self._finish_heap
        step = self.step
        while heap and heap[0][0] <= step:
            _, _, r = heapq.heappop(heap)
            self.batch -= 1
            self.ctx_sum -= r.prompt + r.output
            self._finish(r)
        self._boundary()

    def _boundary(self) -> None:
        """At a step boundary: admit joiners, plan the next stretch."""
        env = self.env
        now = env.now
        jq = self._join_q
        joined: list[Request] = []
        while jq and self.batch < self.max_seqs:
            r = jq.popleft()
            self.batch += 1
            self.ctx_sum += r.prompt
            self._seq += 1
            heapq.heappush(self._finish_heap, (self.step + r.output, self._seq, r))
            joined.append(r)
        if self.batch == 0:
            self._active = False
            return
        self._plan_t0 = now
        self._plan_first = self._a + self._b * self.batch + self._c * self.ctx_sum
        self._plan_inc = self._c * self.batch
        if joined:
            t_first = now + self._plan_first  # the first step containing them ends here
            log = self.ctx.log
            for r in joined:
                log.append((t_first, Ev.D_FIRST, r.conv, r.turn, self.idx, 0, 0))
        n = 1 if self.exact else self._finish_heap[0][0] - self.step
        self._schedule(n)

    def _finish(self, r: Request) -> None:
        env = self.env
        ctx = self.ctx
        now = env.now
        ctx.log.append((now, Ev.D_FINISH, r.conv, r.turn, self.idx, r.output, 0))
        held = self._req_blocks.pop(id(r))
        self.running_blocks -= held
        kv_tokens = r.prompt + r.output - 1  # the last sampled token never gets KV
        if self.bidirectional:
            pid = self._next_pin_id
            self._next_pin_id += len(ctx.decode)
            blocks = -(-kv_tokens // ctx.block_size)
            expiry = now + self.ttl_s
            self.pins[pid] = Pin(r.conv, kv_tokens, blocks, expiry)
            old = self.pin_of_conv.get(r.conv)
            if old is not None:  # cannot happen with single-use routing; keep the accounting exact anyway
                self.release_pin(old, Release.EXPIRED)
            self.pin_of_conv[r.conv] = pid
            self.pinned_blocks += blocks
            heapq.heappush(self._pin_heap, (expiry, pid))
            ctx.log.append((now, Ev.PIN, r.conv, r.turn, self.idx, kv_tokens, expiry))
            ctx.router.store(r.conv, KVParams(self.idx, kv_tokens, expiry, now, pid))
        else:
            self._to_cache(r.conv, kv_tokens, -(-kv_tokens // ctx.block_size))
        ctx.driver.d_done(r)
        self._try_admit()
