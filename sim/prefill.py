"""The prefill node: vLLM V1 scheduler with chunked prefill plus the NixlConnector pull decision.

Sources (vLLM): ``vllm/v1/core/sched/scheduler.py`` (running requests first, then waiting FCFS while
``len(running) < max_num_seqs`` and token budget remains; ``max_num_batched_tokens`` per step; local
prefix hit in full blocks and never the whole prompt), ``distributed/kv_transfer/kv_connector/v1/nixl/
pull_scheduler.py`` ``get_num_new_matched_tokens`` / ``_should_recompute_remote_kv`` (PR #32553:
``tokens_to_pull = min(remote_num_tokens, prompt) - local_hit``; <= 0 local, below
``kv_recompute_threshold`` recompute and notify D, else async pull in ``WAITING_FOR_REMOTE_KVS`` while
the engine keeps stepping), ``pull_worker`` expiry check (PR #47021: decline if now + 5 s safety margin
>= D's deadline; a declined read is a failed load handled by ``kv_load_failure_policy``).

One engine step = one SimPy timeout whose length is the prefill cost of the chunks it holds.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Generator
from typing import Any

import simpy

from kvplan.sim.context import D2P, HOST2P, Ctx, Request
from kvplan.sim.events import Decision, Ev, Release


class PrefixLRU:
    """Block-granular prefix cache keyed by conversation (each conversation's context is a prefix chain).

    Holds the full-block token count cached per conversation, evicting least recently used entries
    when the pool is full (vLLM's free-block queue evicts LRU cached blocks first).
    """

    __slots__ = ("capacity_tokens", "_map", "total")

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self._map: OrderedDict[int, int] = OrderedDict()
        self.total = 0

    def hit(self, conv: int) -> int:
        """Cached tokens of the conversation (marks it recently used)."""
        v = self._map.get(conv)
        if v is None:
            return 0
        self._map.move_to_end(conv)
        return v

    def peek(self, conv: int) -> int:
        """Cached tokens of the conversation, without marking it used (for the router)."""
        return self._map.get(conv, 0)

    def put(self, conv: int, tokens: int) -> None:
        """Record that the conversation's first ``tokens`` (full blocks) are cached."""
        old = self._map.pop(conv, 0)
        self.total -= old
        self._map[conv] = tokens
        self.total += tokens
        while self.total > self.capacity_tokens and self._map:
            _, t = self._map.popitem(last=False)
            self.total -= t


class PrefillNode:
    """One prefill instance (TP ranks act as one engine)."""

    def __init__(self, ctx: Ctx, idx: int) -> None:
        self.ctx = ctx
        self.env = ctx.env
        self.idx = idx
        dep = ctx.scenario.deployment
        pol = ctx.scenario.policy
        self.max_seqs = dep.max_num_seqs
        self.max_tokens = dep.max_num_batched_tokens
        self.threshold = pol.kv_recompute_threshold_tokens
        self.margin = pol.expiry_safety_margin_s + pol.clock_skew_s
        self.fail_on_decline = pol.kv_load_failure_policy == "fail"
        self.cache = PrefixLRU(ctx.prefill_cache_tokens) if dep.prefill_prefix_caching else None
        pc = ctx.costs.prefill
        self._fixed, self._per_tok, self._att = pc.fixed_s, pc.per_token_s, pc.attention_s
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._wake: simpy.Event | None = None
        self.busy_s = 0.0
        self.env.process(self._loop())

    def cached_tokens(self, conv: int) -> int:
        """Prefix-cached tokens of the conversation on this P (for ``prefix_aware`` routing)."""
        return self.cache.peek(conv) if self.cache is not None else 0

    def load(self) -> int:
        """Requests waiting or running on this P."""
        return len(self.waiting) + len(self.running)

    def submit(self, req: Request) -> None:
        """A request reaches the engine (after the proxy/HTTP leg)."""
        req.p_node = self.idx
        self.ctx.log.append((self.env.now, Ev.P_ENQUEUE, req.conv, req.turn, self.idx, 0, 0))
        self.waiting.append(req)
        self._kick()

    def _kick(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _loop(self) -> Generator[simpy.Event, Any, None]:
        env = self.env
        log = self.ctx.log
        while True:
            if not self.running and not self.waiting:
                self._wake = env.event()
                yield self._wake
                self._wake = None
            budget = self.max_tokens
            batch: list[tuple[Request, int]] = []
            new_tokens = 0
            pairs = 0.0
            for r in self.running:
                if budget <= 0:
                    break
                n = r.p_remaining if r.p_remaining < budget else budget
                batch.append((r, n))
                budget -= n
                new_tokens += n
                pairs += n * r.p_ctx + n * (n + 1) / 2
            while self.waiting and len(self.running) < self.max_seqs and budget > 0:
                r = self.waiting.popleft()
                if not r.p_decided:
                    if not self._decide(r):
                        continue  # pulling asynchronously, or failed
                self.running.append(r)
                r.p_compute_start = env.now
                log.append((env.now, Ev.P_COMPUTE, r.conv, r.turn, self.idx, r.p_remaining, 0))
                n = r.p_remaining if r.p_remaining < budget else budget
                batch.append((r, n))
                budget -= n
                new_tokens += n
                pairs += n * r.p_ctx + n * (n + 1) / 2
            if not batch:
                continue
            dt = self._fixed + self._per_tok * new_tokens + self._att * pairs
            self.busy_s += dt
            yield env.timeout(dt)
            finished = False
            for r, n in batch:
                r.p_remaining -= n
                r.p_ctx += n
                if r.p_remaining == 0:
                    finished = True
                    self._finish(r)
            if finished:
                self.running = [r for r in self.running if r.p_remaining > 0]

    def _decide(self, r: Request) -> bool:
        """The connector decision at scheduling time. True when the request computes now."""
        env = self.env
        ctx = self.ctx
        r.p_decided = True
        prompt = r.prompt
        local = 0
        if self.cache is not None:
            bs = ctx.block_size
            local = min(self.cache.hit(r.conv), ((prompt - 1) // bs) * bs)
        r.local_hit = local
        params = r.params
        pulled = 0
        if params is None:
            decision = Decision.MISS
        else:
            n = min(params.remote_num_tokens, prompt) - local
            dnode = ctx.decode[params.decode_node]
            if n <= 0:
                decision = Decision.LOCAL
                dnode.release_pin(params.pin_id, Release.NOTIFIED)
            elif n < self.threshold:
                decision = Decision.RECOMPUTE_BELOW_THRESHOLD
                dnode.release_pin(params.pin_id, Release.NOTIFIED)
            elif env.now + self.margin >= params.expiry_s or not dnode.pin_alive(params.pin_id, env.now):
                # Declined (PR #47021) or the blocks are already gone: a failed KV load, unless D's offload
                # tier holds the context (sim/retention_policy.py)
                n_host = min(dnode.host_tokens(r.conv, env.now), prompt) - local
                if n_host >= max(self.threshold, 1) and prompt - local - 1 > 0:
                    pulled = min(n_host, prompt - local - 1)
                    ctx.log.append((env.now, Ev.P_DECISION, r.conv, r.turn, self.idx, Decision.HOST_PULL, local))
                    r.p_ctx = local + pulled
                    r.p_remaining = prompt - local - pulled
                    self._start_host_pull(r, params.decode_node, pulled)
                    return False
                if self.fail_on_decline:
                    log_t = env.now
                    ctx.log.append((log_t, Ev.P_DECISION, r.conv, r.turn, self.idx, Decision.ERROR, local))
                    ctx.log.append((log_t, Ev.ERROR, r.conv, r.turn, self.idx, Decision.EXPIRED, 0))
                    r.error = True
                    ctx.driver.p_done(r)
                    return False
                decision = Decision.EXPIRED
            else:
                decision = Decision.PULL
                # at least one token is computed: the scheduler backs off a full-prompt hit by one
                pulled = min(n, prompt - local - 1)
        ctx.log.append((env.now, Ev.P_DECISION, r.conv, r.turn, self.idx, decision, local))
        r.p_ctx = local + pulled
        r.p_remaining = prompt - local - pulled
        if decision == Decision.PULL:
            assert params is not None
            self._start_pull(r, params.decode_node, params.pin_id, pulled)
            return False
        return True

    def _start_pull(self, r: Request, d: int, pin_id: int, tokens: int) -> None:
        ctx = self.ctx
        env = self.env
        dnode = ctx.decode[d]
        dnode.mark_reading(pin_id)

        def done(xfer_s: float, post_s: float) -> None:
            ctx.log.append((env.now, Ev.PULL_DONE, r.conv, r.turn, d, xfer_s, post_s))
            dnode.release_pin(pin_id, Release.READ)
            self.waiting.appendleft(r)  # back to WAITING, ahead of later arrivals (FCFS)
            self._kick()

        ctx.log.append((env.now, Ev.PULL_START, r.conv, r.turn, d, tokens, tokens * ctx.kv_bytes_rank * ctx.tp))
        ctx.transfer(self.idx, d, D2P, tokens, done)

    def _start_host_pull(self, r: Request, d: int, tokens: int) -> None:
        """Read the conversation's context from D's host memory (offload tier) at host-to-NIC bandwidth."""
        ctx = self.ctx
        env = self.env

        def done(xfer_s: float, post_s: float) -> None:
            ctx.log.append((env.now, Ev.PULL_DONE, r.conv, r.turn, d, xfer_s, post_s))
            ctx.decode[d].host_read(r.conv)
            self.waiting.appendleft(r)
            self._kick()

        ctx.log.append((env.now, Ev.PULL_START, r.conv, r.turn, d, tokens, tokens * ctx.kv_bytes_rank * ctx.tp))
        ctx.transfer(self.idx, d, HOST2P, tokens, done)

    def _finish(self, r: Request) -> None:
        env = self.env
        self.ctx.log.append((env.now, Ev.P_DONE, r.conv, r.turn, self.idx, env.now - r.p_compute_start, 0))
        if self.cache is not None:
            bs = self.ctx.block_size
            self.cache.put(r.conv, (r.prompt // bs) * bs)
        self.ctx.driver.p_done(r)
