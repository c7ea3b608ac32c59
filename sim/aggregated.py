"""Aggregated serving: ``deployment.replicas`` vLLM engines, each doing prefill and decode (no P/D split).

Sources (vLLM): ``vllm/v1/core/sched/scheduler.py`` ``Scheduler.schedule``: there is no prefill or decode
phase, every request gets ``num_tokens - num_computed_tokens`` new tokens capped by the step's token budget
(``max_num_batched_tokens``): RUNNING requests first (a decoding request takes 1 token, a request still
prefilling takes its next chunk), then WAITING requests FCFS while ``len(running) < max_num_seqs`` and budget
remains, each after its local prefix-cache hit (``kv_cache_manager.get_computed_blocks``: full blocks, never
the whole prompt); a waiting request whose blocks cannot be allocated stops the waiting loop (``break``).
The step that computes a request's last prompt token samples its first token (TTFT); each later step
samples one more. Prefix caching (``enable_prefix_caching``, on by default) keeps a finished request's full
blocks as LRU-evictable cache (``kv_cache_manager`` free-block queue).

Model:

* Step time: :func:`kvplan.models.costs.mixed_step_time_s` of the step's prefill chunks and decode tokens.
* Blocks: a request reserves ``prompt + output`` tokens of blocks when it is scheduled (the same stated
  simplification as the decode node: vLLM allocates per step and preempts running requests under KV
  pressure; here admission waits instead, so no preemption happens).
* Prefix cache: per conversation (a conversation's context is a prefix chain), the previous turn's
  ``prompt + output - 1`` tokens in full blocks; a cache hit is logged as decision ``local``, otherwise
  ``miss``. ``deployment.prefill_prefix_caching`` is the engines' ``enable_prefix_caching``.
* Routing across replicas: ``deployment.routing`` (``round_robin``, ``sticky``/``session_affinity``,
  ``prefix_aware``; :mod:`kvplan.sim.router`).
* Latency outside the engine: one proxy/HTTP leg, ``overhead.d_leg_s`` (proxy -> engine and the first
  streamed chunk back); the P leg's extra round trip of the disaggregated proxy does not exist here.
* Speed: a stretch of decode-only steps is one timeout (closed-form step series, as on the decode node);
  an arrival cuts it at the end of the step in progress.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Generator
from typing import Any

import simpy

from kvplan.errors import input_error
from kvplan.models.costs import (
    causal_pairs,
    decode_step_increment_s,
    decode_step_time_s,
    decode_steps_time_s,
    mixed_step_time_s,
    steps_within,
)
from kvplan.sim.context import Ctx, Request
from kvplan.sim.driver import Driver
from kvplan.sim.events import Decision, Ev
from kvplan.sim.evlog import RowBuffer
from kvplan.sim.itl import NO_SKIP, ItlTracker, bucket_key, log_pooled, stay_stats
from kvplan.sim.scenario import ClosedLoopArrival
from kvplan.sim.workload import ConversationPlan


class AggregatedNode:
    """One aggregated vLLM engine (TP ranks act as one engine)."""

    def __init__(self, ctx: Ctx, idx: int) -> None:
        self.ctx = ctx
        self.rows: RowBuffer = ctx.log.buf  # the event log's packed rows (sim/evlog.py)
        self.env = ctx.env
        self.idx = idx
        dep = ctx.scenario.deployment
        self.max_seqs = dep.max_num_seqs
        self.max_tokens = dep.max_num_batched_tokens
        self.caching = dep.prefill_prefix_caching
        self.capacity_blocks = ctx.decode_capacity_blocks
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._left: dict[int, int] = {}  # id(request) -> output tokens still to sample (0 while prefilling)
        self._held: dict[int, int] = {}  # id(request) -> blocks held
        self.running_blocks = 0
        self.cache: OrderedDict[int, tuple[int, int]] = OrderedDict()  # conv -> (tokens, blocks)
        self.cache_blocks = 0
        self._wake: simpy.Event | None = None
        self.busy_s = 0.0
        self.steps = 0
        self.mixed_steps = 0  # steps holding both prefill chunks and decode tokens
        self.max_step_tokens = 0  # largest token count of one step (checked against the budget in tests)
        self.itl = ItlTracker()  # step durations, for the inter-token gaps (sim/itl.py)
        self.env.process(self._loop())

    # ---- router interface ---------------------------------------------------------------------------------

    def cached_tokens(self, conv: int) -> int:
        """Prefix-cached tokens of the conversation here (for ``prefix_aware`` routing)."""
        entry = self.cache.get(conv)
        return entry[0] if entry is not None else 0

    def load(self) -> int:
        """Requests waiting or running on this engine."""
        return len(self.waiting) + len(self.running)

    def submit(self, req: Request) -> None:
        """A request reaches the engine (after the proxy/HTTP leg)."""
        bs = self.ctx.block_size
        if -(-(req.prompt + req.output) // bs) > self.capacity_blocks:
            raise input_error(
                "deployment.decode_kv_capacity_tokens",
                f"an aggregated replica's pool ({self.capacity_blocks * bs} tokens) cannot hold one request of "
                f"{req.prompt + req.output} tokens", "raise it or shorten prompts/outputs",
            )
        req.p_node = req.d_node = self.idx
        self.rows.append((self.env._now, Ev.P_ENQUEUE, req.conv, req.turn, self.idx, 0, 0))
        self.waiting.append(req)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    # ---- blocks ----------------------------------------------------------------------------------------------

    def _free_blocks(self) -> int:
        return self.capacity_blocks - self.running_blocks - self.cache_blocks

    def _admit(self, r: Request) -> bool:
        """Allocate the request's blocks after its prefix-cache hit; False when they do not fit (it waits)."""
        bs = self.ctx.block_size
        total = -(-(r.prompt + r.output) // bs)
        entry = self.cache.pop(r.conv, None) if self.caching else None
        if entry is not None:
            self.cache_blocks -= entry[1]  # taken out so the eviction below cannot take it
        hit = min(entry[0], ((r.prompt - 1) // bs) * bs) if entry is not None else 0
        if r.reuse < hit:  # the prompt repeats less of the context (sim/history.py): the hash prefix, full blocks
            hit = (r.reuse // bs) * bs
        owned = entry[1] if entry is not None and hit > 0 else 0
        need = max(total - owned, 0)
        while self._free_blocks() < need and self.cache:
            _, (_, b) = self.cache.popitem(last=False)
            self.cache_blocks -= b
        if self._free_blocks() < need:
            if entry is not None:
                self.cache[r.conv] = entry
                self.cache_blocks += entry[1]
            return False  # submit() refused requests larger than the pool: blocks come back at a finish
        if entry is not None and hit == 0:
            self._put_cache(r.conv, entry[0])
        self.running_blocks += need + owned
        self._held[id(r)] = need + owned
        r.local_hit = hit
        r.p_ctx = hit
        r.p_remaining = r.prompt - hit
        decision = Decision.LOCAL if hit > 0 else Decision.MISS
        now = self.env._now
        log = self.rows
        log.append((now, Ev.P_DECISION, r.conv, r.turn, self.idx, decision, hit))
        log.append((now, Ev.P_COMPUTE, r.conv, r.turn, self.idx, r.p_remaining, 0))
        r.p_compute_start = now
        self._left[id(r)] = 0
        return True

    def _put_cache(self, conv: int, tokens: int) -> None:
        if not self.caching:
            return
        bs = self.ctx.block_size
        full = (tokens // bs) * bs
        old = self.cache.pop(conv, None)
        if old is not None:
            self.cache_blocks -= old[1]
        self.cache[conv] = (full, full // bs)
        self.cache_blocks += full // bs

    # ---- the engine loop -------------------------------------------------------------------------------------

    def _schedule_step(self) -> tuple[list[tuple[Request, int]], list[Request], float, float, float]:
        """One ``Scheduler.schedule`` pass: running first, then waiting FCFS under the token budget."""
        budget = self.max_tokens
        chunks: list[tuple[Request, int]] = []
        decoding: list[Request] = []
        pairs = 0.0
        ctx_pairs = 0.0  # of ``pairs``, those against KV already in the cache (priced at context_attention_s)
        ctx_sum = 0.0
        left = self._left
        for r in self.running:
            if budget <= 0:
                break
            if r.p_remaining > 0:
                n = min(r.p_remaining, budget)
                chunks.append((r, n))
                pairs += causal_pairs(n, r.p_ctx)
                ctx_pairs += n * r.p_ctx
                budget -= n
            else:
                decoding.append(r)
                ctx_sum += r.prompt + r.output - left[id(r)]
                budget -= 1
        while self.waiting and len(self.running) < self.max_seqs and budget > 0:
            r = self.waiting[0]
            if not self._admit(r):
                break  # scheduler.py: a waiting request that cannot get blocks stops the waiting loop
            self.waiting.popleft()
            self.running.append(r)
            n = min(r.p_remaining, budget)
            chunks.append((r, n))
            pairs += causal_pairs(n, r.p_ctx)
            ctx_pairs += n * r.p_ctx
            budget -= n
        self.max_step_tokens = max(self.max_step_tokens, self.max_tokens - budget)
        return chunks, decoding, pairs, ctx_pairs, ctx_sum

    def _loop(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        costs = self.ctx.costs
        while True:
            if not self.running and not self.waiting:
                self._wake = env.event()
                yield self._wake
                self._wake = None
            chunks, decoding, pairs, ctx_pairs, dec_ctx = self._schedule_step()
            if not chunks and not decoding:
                # nothing can run: blocks are held by nothing running, so the head request can never fit
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            if not chunks:
                yield from self._decode_stretch(decoding, dec_ctx)
                continue
            prefill_tokens = sum(n for _, n in chunks)
            dt = mixed_step_time_s(costs.prefill, costs.decode, prefill_tokens, pairs, len(decoding), dec_ctx, ctx_pairs)
            self.busy_s += dt
            self.steps += 1
            self.mixed_steps += bool(decoding)
            yield env.timeout(dt)
            self.itl.add(dt, 0.0, 1, len(decoding), bucket_key(dt))
            self._after_step(chunks, decoding, 1)

    def _decode_stretch(self, decoding: list[Request], ctx_sum: float) -> Generator[simpy.Event, Any, None]:
        """Decode-only steps until the next finish, or until an arrival (cut at the step in progress)."""
        env = self.env
        dc = self.ctx.costs.decode
        b = len(decoding)
        # a waiting request that could not be scheduled now can only be once blocks or slots free up, at a
        # finish: the stretch runs to the next finish unless an arrival cuts it
        k = min(self._left[id(r)] for r in decoding)
        t0 = env._now
        total = decode_steps_time_s(dc, b, ctx_sum, k)
        if k > 1:
            self._wake = env.event()
            yield env.any_of([env.timeout(total), self._wake])
            self._wake = None
            e = env._now - t0
            if e < total:
                done = steps_within(e, decode_step_time_s(dc, b, ctx_sum), decode_step_increment_s(dc, b))
                k = min(done + 1, k)  # the step in progress ends at boundary done + 1
                total = decode_steps_time_s(dc, b, ctx_sum, k)
                if t0 + total > env._now:
                    yield env.timeout(t0 + total - env._now)
        else:
            yield env.timeout(total)
        self.busy_s += total
        self.steps += k
        first = decode_step_time_s(dc, b, ctx_sum)
        self.itl.add(first, decode_step_increment_s(dc, b), k, b, bucket_key(first))
        self._after_step([], decoding, k)

    def _after_step(self, chunks: list[tuple[Request, int]], decoding: list[Request], steps: int) -> None:
        now = self.env._now
        log = self.rows
        left = self._left
        done: list[Request] = []
        for r, n in chunks:
            r.p_remaining -= n
            r.p_ctx += n
            if r.p_remaining == 0:  # the last prompt token was computed: the first token is sampled now
                log.append((now, Ev.P_DONE, r.conv, r.turn, self.idx, now - r.p_compute_start, 0))
                log.append((now, Ev.D_ENQUEUE, r.conv, r.turn, self.idx, 0, 0))
                log.append((now, Ev.D_ADMIT, r.conv, r.turn, self.idx, 0, 0))
                log.append((now, Ev.D_FIRST, r.conv, r.turn, self.idx, 0, 0))
                left[id(r)] = r.output - 1
                r.itl_old, r.itl_skip = self.itl.root, NO_SKIP  # every later step is a gap
                if r.output <= 1:
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
        log_pooled(self.rows, self.env._now, self.idx, self.itl)

    def _finish(self, r: Request) -> None:
        now = self.env._now
        self.rows.append((now, Ev.D_FINISH, r.conv, r.turn, self.idx, r.output, 0))
        p50, top = stay_stats(r.itl_old, self.itl.root, NO_SKIP)
        r.itl_old = None
        self.rows.append((now, Ev.D_ITL, r.conv, r.turn, self.idx, p50, top))
        del self._left[id(r)]
        self.running_blocks -= self._held.pop(id(r))
        self._put_cache(r.conv, r.prompt + r.output - 1)  # the last sampled token never gets KV
        self.ctx.driver.d_done(r)


class AggregatedDriver(Driver):
    """The conversation driver of aggregated mode: one leg to the chosen replica, no P/D sequence."""

    def __init__(self, ctx: Ctx, plan: ConversationPlan, closed_loop: ClosedLoopArrival | None) -> None:
        super().__init__(ctx, plan, closed_loop)
        self.p_leg = ctx.costs.overhead.d_leg_s  # proxy -> engine and the first streamed chunk back
        self.d_leg = 0.0

    def _submit(self, r: Request) -> None:
        self.ctx.replicas[self.ctx.router.pick_prefill(r.conv)].submit(r)


def build(ctx: Ctx, plan: ConversationPlan, closed_loop: ClosedLoopArrival | None) -> None:
    """Create the replicas and the driver of an aggregated run."""
    dep = ctx.scenario.deployment
    for name in ("prefill_tensor_parallel_size", "decode_tensor_parallel_size"):
        v = getattr(dep, name, None)
        if v is not None and v != dep.tensor_parallel_size:
            raise input_error(f"deployment.{name}", "an aggregated replica runs both phases at one TP",
                              "use deployment.tensor_parallel_size only")
    ctx.replicas = [AggregatedNode(ctx, i) for i in range(ctx.scenario.deployment.replicas)]
    ctx.router.bind(ctx.replicas, ())
    ctx.driver = AggregatedDriver(ctx, plan, closed_loop)
