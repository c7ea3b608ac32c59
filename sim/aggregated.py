"""Aggregated serving: ``deployment.replicas`` vLLM engines, each doing prefill and decode (no P/D split).

Sources (vLLM): ``vllm/v1/core/sched/scheduler.py`` ``Scheduler.schedule``, the pass of
:class:`kvplan.sim.scheduler.Scheduler` (RUNNING first, a decoding request taking 1 token and a prefilling one
its next chunk, then WAITING FCFS under ``max_num_seqs`` and the token budget after each request's prefix hit).
The step that computes a request's last prompt token samples its first token (TTFT); each later step
samples one more. Prefix caching (``enable_prefix_caching``, on by default) keeps a finished request's full
blocks as LRU-evictable cache (``kv_cache_manager`` free-block queue).

Model:

* Step time: :func:`kvplan.models.costs.mixed_step_time_s` of the step's prefill chunks and decode tokens.
* Blocks (:class:`kvplan.sim.blocks.BlockPool`, the decode node's pool): a waiting request is admitted when
  the blocks of its current tokens (the prompt; prompt + sampled tokens after a preemption) minus its
  prefix-cache hit, plus ``deployment.kv_watermark`` of the pool once requests are running, are free after
  evicting prefix cache (``kv_cache_manager.allocate_slots``). Each step then allocates the blocks of the
  tokens it computes (``allocate_slots(request, num_new_tokens)`` in the RUNNING loop). When a running
  request cannot get them, the newest running request is preempted (FCFS policy: ``self.running.pop()``,
  ``_preempt_request``): its blocks are freed (full blocks stay as prefix cache, ``kv_cache_manager.free``),
  it goes back to the front of the waiting queue, and no waiting request is scheduled in that step
  (``if not preempted_reqs``). Readmitted, it recomputes prompt + sampled tokens as a prefill (minus its
  surviving prefix) whose last chunk samples its next token. Counted as ``D_PREEMPT``/``D_RECOMPUTE``
  rows (turns' ``d_preemptions``; summary ``d_preemptions``, ``d_preempted_recompute_tokens``).
  A stretch of decode-only steps is cut at the last step whose blocks fit; its growth is allocated at its
  end (stated: the router may see a cache entry that the stretch evicts for a few steps longer).
* Prefix cache: per conversation (a conversation's context is a prefix chain), the previous turn's
  ``prompt + output - 1`` tokens in full blocks; a cache hit is logged as decision ``local``, otherwise
  ``miss``. ``deployment.prefill_prefix_caching`` is the engines' ``enable_prefix_caching``. A preempted
  request's first admission keeps the turn's ``P_DECISION``/``P_COMPUTE``; its ``P_DONE`` (and TTFT)
  comes at the end of the prefill that samples its first token.
* Routing across replicas: ``deployment.routing`` (``round_robin``, ``sticky``/``session_affinity``,
  ``prefix_aware``; :mod:`kvplan.sim.router`).
* Latency outside the engine: one proxy/HTTP leg, ``overhead.d_leg_s`` (proxy -> engine and the first
  streamed chunk back); the P leg's extra round trip of the disaggregated proxy does not exist here.
* Speed: a stretch of decode-only steps is one timeout (closed-form step series, as on the decode node);
  an arrival cuts it at the end of the step in progress.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import simpy

from kvplan.errors import input_error
from kvplan.models.costs import (
    decode_step_increment_s,
    decode_step_time_s,
    decode_steps_time_s,
    mixed_step_time_s,
    steps_within,
)
from kvplan.sim.blocks import BlockPool
from kvplan.sim.driver import Driver
from kvplan.sim.events import Decision, Ev
from kvplan.sim.itl import NO_SKIP, ItlTracker, bucket_key, log_pooled, stay_stats, turn_stats
from kvplan.sim.node_config import AggregatedConfig, DriverConfig
from kvplan.sim.ports import Wiring
from kvplan.sim.request import Request
from kvplan.sim.scenario import ClosedLoopArrival
from kvplan.sim.scheduler import Scheduler, record_preemption
from kvplan.sim.workload import ConversationPlan


class AggregatedNode(Scheduler):
    """One aggregated vLLM engine (TP ranks act as one engine): the scheduler core, mixed steps, decode stretches."""

    def __init__(self, ctx: Wiring, idx: int, cfg: AggregatedConfig) -> None:
        self.capacity_blocks = cfg.capacity_blocks
        pool = BlockPool(self.capacity_blocks, cfg.block_size, cfg.prefix_caching)
        super().__init__(ctx.log.buf, idx, cfg.max_num_seqs, cfg.max_num_batched_tokens, pool)
        self.ctx = ctx
        self.env = ctx.env
        self.bs = cfg.block_size
        self.costs = cfg.costs  # the replica's cost model (prefill chunks, decode tokens, mixed steps)
        self._left: dict[int, int] = {}  # id(request) -> output tokens still to sample (0 while prefilling)
        self.watermark_blocks = cfg.watermark_blocks
        self.preemptions = 0
        self._decoding: list[Request] = []  # the step being scheduled: its decode tokens
        self._ctx_sum = 0.0  # and their KV tokens
        self._wake: simpy.Event | None = None
        self.busy_s = 0.0
        self.steps = 0
        self.mixed_steps = 0  # steps holding both prefill chunks and decode tokens
        self.max_step_tokens = 0  # largest token count of one step (checked against the budget in tests)
        # most blocks held at once by scheduled and running requests (summary decode_kv_used_peak_fraction; the
        # prefix cache's evictable blocks are not held): read after each scheduling pass and each stretch's growth
        self.used_peak = 0
        self.itl = ItlTracker()  # step durations, for the inter-token gaps (sim/itl.py)
        self.env.process(self._loop())

    # ---- router interface ---------------------------------------------------------------------------------

    def submit(self, req: Request) -> None:
        """A request reaches the engine (after the proxy/HTTP leg)."""
        bs = self.bs
        if -(-(req.prompt + req.output) // bs) > self.capacity_blocks:
            raise input_error(
                "deployment.decode_kv_capacity_tokens",
                f"an aggregated replica's pool ({self.capacity_blocks * bs} tokens) cannot hold one request of "
                f"{req.prompt + req.output} tokens", "raise it or shorten prompts/outputs",
            )
        req.p_node = req.d_node = self.idx
        self._enqueue(self.env.now, req)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # ---- blocks ----------------------------------------------------------------------------------------------

    def _can_schedule(self, r: Request) -> bool:
        """Allocate the blocks of the request's current tokens after its prefix-cache hit; False when they do not fit."""
        resume = r.d_resume
        tokens = r.prompt + r.d_generated if resume else r.prompt
        # a resumed request's own KV is a hit in full; a new turn's only as far as its prompt repeats the context
        wm = self.watermark_blocks if self.running else 0  # allocate_slots: the watermark once others are scheduled
        hit = self._allocate(r, tokens, tokens if resume else r.reuse, wm, None)
        if hit < 0:
            return False  # submit() refused requests larger than the pool: blocks come back at a finish
        r.p_ctx = hit
        r.p_remaining = tokens - hit
        self._left[id(r)] = 0
        now = self.env.now
        log = self.rows
        if resume:
            r.d_resume = False
            log.append((now, Ev.D_RECOMPUTE, r.conv, r.turn, self.idx, tokens - hit, hit))
            return True
        r.local_hit = hit
        decision = Decision.LOCAL if hit > 0 else Decision.MISS
        log.append((now, Ev.P_DECISION, r.conv, r.turn, self.idx, decision, hit))
        log.append((now, Ev.P_COMPUTE, r.conv, r.turn, self.idx, r.p_remaining, 0))
        r.p_compute_start = now
        return True

    def _decode_token(self, r: Request) -> bool:
        """One decode token of a running request, its slots allocated; False when it preempted itself."""
        kv = r.prompt + r.output - self._left[id(r)]  # KV after this step: prompt + the tokens sampled so far
        blocks = -(-kv // self.pool.block_size)
        if blocks > r.p_blocks and not self._grow(r, blocks):
            return False
        self._decoding.append(r)
        self._ctx_sum += kv
        return True

    def _grow(self, r: Request, blocks: int) -> bool:
        """``allocate_slots`` for a running request up to ``blocks``: evict cache, then preempt the newest.

        False when ``r`` itself was preempted (it was the newest left).
        """
        pool = self.pool
        need = blocks - r.p_blocks
        if need <= 0:
            return True
        if pool.free() < need:
            pool.evict(need)
            while pool.free() < need:
                victim = self.running[-1]
                self._preempt(victim)
                if victim is r:
                    return False
                pool.evict(need)  # its freed full blocks went to the prefix cache: take them back
        pool.held += need
        r.p_blocks = blocks
        pool.check()
        return True

    def _preempt(self, r: Request) -> None:
        """``_preempt_request`` of the newest running request: free its blocks, re-queue it at the front."""
        self.running.pop()
        self.preempted_now = True
        left = self._left.pop(id(r))
        if r.p_remaining > 0:  # still prefilling (or recomputing): what it had sampled before survives
            sampled, kv_tokens = r.d_generated, r.p_ctx
        else:
            sampled = r.output - left
            kv_tokens = r.prompt + sampled - 1  # the last sampled token has no KV yet
        now = self.env.now
        if r.itl_old is not None:  # its stay in the batch ends: keep the step histogram of it (sim/itl.py)
            if r.itl_spans is None:
                r.itl_spans = []
            r.itl_spans.append((r.itl_old, self.itl.snapshot(), NO_SKIP))
            r.itl_old = None
            r.last_tok_t = now  # it sampled in the step that just ended
        self.pool.held -= r.p_blocks
        r.p_blocks = 0
        self.preemptions += 1
        record_preemption(self.rows, now, self.idx, self.pool, r, sampled, kv_tokens)
        self.waiting.appendleft(r)

    def _stretch_fit(self, decoding: list[Request], k: int) -> int:
        """The most decode-only steps (<= ``k``, >= 1) whose blocks fit in the free and evictable blocks."""
        bs = self.bs
        room = self.pool.free() + self.pool.cached
        # step 1's blocks were allocated when it was scheduled: k steps need at most (k - 1) // bs + 1 more each
        if room >= len(decoding) * ((k - 1) // bs + 1):
            return k
        left = self._left
        # before the stretch a member's KV covers prompt + sampled - 1 tokens; step j computes one more
        base = [(r.prompt + r.output - left[id(r)] - 1, r.p_blocks) for r in decoding]

        def extra(j: int) -> int:
            return sum(max(-(-(c + j) // bs) - h, 0) for c, h in base)

        if extra(k) <= room:
            return k
        lo, hi = 1, k  # extra(lo) <= room (step 1 was allocated when scheduled), extra(hi) > room
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if extra(mid) <= room:
                lo = mid
            else:
                hi = mid
        return lo

    # ---- the engine loop -------------------------------------------------------------------------------------

    def _schedule_step(self) -> tuple[list[tuple[Request, int]], list[Request], float, float, float]:
        """One ``Scheduler.schedule`` pass (sim/scheduler.py): (prompt chunks, decode tokens, their pairs, ctx)."""
        self._decoding = []
        self._ctx_sum = 0.0
        self.schedule()
        self.max_step_tokens = max(self.max_step_tokens, self.max_tokens - self.budget)
        if self.pool.held > self.used_peak:
            self.used_peak = self.pool.held
        return self.chunks, self._decoding, self.pairs, self.ctx_pairs, self._ctx_sum

    def _loop(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        costs = self.costs
        while True:
            if not self.running and not self.waiting:
                self._wake = env.event()
                yield self._wake
                self._wake = None
            chunks, decoding, pairs, ctx_pairs, dec_ctx = self._schedule_step()
            if not chunks and not decoding:
                if self.preempted_now:
                    continue  # the preempted request is scheduled from the waiting queue in the next pass
                # nothing can run: blocks are held by nothing running, so the head request can never fit
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            if not chunks:
                yield from self._decode_stretch(decoding, dec_ctx)
                continue
            dt = mixed_step_time_s(costs.prefill, costs.decode, self.new_tokens, pairs, len(decoding), dec_ctx, ctx_pairs)
            self.busy_s += dt
            self.steps += 1
            self.mixed_steps += bool(decoding)
            yield env.timeout(dt)
            self.itl.add(dt, 0.0, 1, len(decoding), bucket_key(dt))
            self._after_step(chunks, decoding, 1)

    def _decode_stretch(self, decoding: list[Request], ctx_sum: float) -> Generator[simpy.Event, Any, None]:
        """Decode-only steps until the next finish, or until an arrival (cut at the step in progress)."""
        env = self.env
        dc = self.costs.decode
        b = len(decoding)
        # a waiting request that could not be scheduled now can only be once blocks or slots free up, at a
        # finish: the stretch runs to the next finish unless an arrival cuts it
        k = self._stretch_fit(decoding, min(self._left[id(r)] for r in decoding))
        t0 = env.now
        total = decode_steps_time_s(dc, b, ctx_sum, k)
        if k > 1:
            self._wake = env.event()
            yield env.any_of([env.timeout(total), self._wake])
            self._wake = None
            e = env.now - t0
            if e < total:
                done = steps_within(e, decode_step_time_s(dc, b, ctx_sum), decode_step_increment_s(dc, b))
                k = min(done + 1, k)  # the step in progress ends at boundary done + 1
                total = decode_steps_time_s(dc, b, ctx_sum, k)
                if t0 + total > env.now:
                    yield env.timeout(t0 + total - env.now)
        else:
            yield env.timeout(total)
        self.busy_s += total
        self.steps += k
        first = decode_step_time_s(dc, b, ctx_sum)
        self.itl.add(first, decode_step_increment_s(dc, b), k, b, bucket_key(first))
        if k > 1:  # the blocks of steps 2..k (step 1's were allocated when it was scheduled); they fit
            bs = self.bs
            for r in decoding:
                kv = r.prompt + r.output - self._left[id(r)] + k - 1
                grew = self._grow(r, -(-kv // bs))
                assert grew  # _stretch_fit kept the stretch within the free and evictable blocks
            if self.pool.held > self.used_peak:
                self.used_peak = self.pool.held
        self._after_step([], decoding, k)

    def _after_step(self, chunks: list[tuple[Request, int]], decoding: list[Request], steps: int) -> None:
        now = self.env.now
        log = self.rows
        left = self._left
        done: list[Request] = []
        for r, n in chunks:
            r.p_remaining -= n
            r.p_ctx += n
            if r.p_remaining == 0:  # the last prompt token was computed: the next token is sampled now
                if r.d_generated == 0:  # the first token (TTFT)
                    log.append((now, Ev.P_DONE, r.conv, r.turn, self.idx, now - r.p_compute_start, 0))
                    log.append((now, Ev.D_ENQUEUE, r.conv, r.turn, self.idx, 0, 0))
                    log.append((now, Ev.D_ADMIT, r.conv, r.turn, self.idx, 0, 0))
                    log.append((now, Ev.D_FIRST, r.conv, r.turn, self.idx, 0, 0))
                else:  # a preempted request's recompute: the gap from its last token before the preemption
                    if r.itl_extra is None:
                        r.itl_extra = []
                    r.itl_extra.append(self.itl.gap(now - r.last_tok_t))
                left[id(r)] = r.output - r.d_generated - 1
                r.itl_old, r.itl_skip = self.itl.snapshot(), NO_SKIP  # every later step is a gap
                if left[id(r)] <= 0:
                    done.append(r)
        for r in decoding:
            left[id(r)] -= steps
            if left[id(r)] <= 0:
                done.append(r)
        if done:
            gone = {id(r) for r in done}
            self.running = [r for r in self.running if id(r) not in gone]
            for r in done:
                self._finish(r)

    def log_itl_hist(self) -> None:
        """End of run: the pooled inter-token gap counts of this engine (``Ev.ITL_HIST``)."""
        log_pooled(self.rows, self.env.now, self.idx, self.itl)

    def _finish(self, r: Request) -> None:
        now = self.env.now
        self.rows.append((now, Ev.D_FINISH, r.conv, r.turn, self.idx, r.output, 0))
        if r.itl_spans is None and r.itl_extra is None:  # one stay, no preemption
            p50, top = stay_stats(r.itl_old, self.itl.current(), NO_SKIP)
        else:
            spans = r.itl_spans or []
            spans.append((r.itl_old, self.itl.current(), NO_SKIP))  # read at once below
            p50, top = turn_stats(spans, r.itl_extra or [])
            r.itl_spans = r.itl_extra = None
        r.itl_old = None
        self.rows.append((now, Ev.D_ITL, r.conv, r.turn, self.idx, p50, top))
        del self._left[id(r)]
        self.pool.held -= r.p_blocks
        r.p_blocks = 0
        self.pool.to_cache(r.conv, r.prompt + r.output - 1)  # the last sampled token never gets KV
        self.ctx.driver.d_done(r)


class AggregatedDriver(Driver):
    """The conversation driver of aggregated mode: one leg to the chosen replica, no P/D sequence.

    Its config has the one leg as ``p_leg_s`` (proxy -> engine and the first streamed chunk back) and no D leg
    (``sim/node_setup.py`` :: ``driver_config``).
    """

    def _submit(self, r: Request) -> None:
        self.ctx.replicas[self.ctx.router.pick_prefill(r.conv)].submit(r)


def build(ctx: Wiring, cfg: AggregatedConfig, replicas: int, driver_cfg: DriverConfig, plan: ConversationPlan,
          closed_loop: ClosedLoopArrival | None) -> tuple[list[AggregatedNode], AggregatedDriver]:
    """Create the replicas and the driver of an aggregated run (the caller binds the router and stores them)."""
    nodes = [AggregatedNode(ctx, i, cfg) for i in range(replicas)]
    return nodes, AggregatedDriver(ctx, driver_cfg, plan, closed_loop)
