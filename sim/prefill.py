"""The prefill node: vLLM V1 scheduler with chunked prefill plus the NixlConnector pull decision.

Sources (vLLM): ``vllm/v1/core/sched/scheduler.py`` (running requests first, then waiting FCFS while
``len(running) < max_num_seqs`` and token budget remains; ``max_num_batched_tokens`` per step; local
prefix hit in full blocks and never the whole prompt), ``distributed/kv_transfer/kv_connector/v1/nixl/
pull_scheduler.py`` ``get_num_new_matched_tokens`` / ``_should_recompute_remote_kv`` (PR #32553:
``tokens_to_pull = min(remote_num_tokens, prompt) - local_hit``; <= 0 local, below
``kv_recompute_threshold`` recompute and notify D, else async pull in ``WAITING_FOR_REMOTE_KVS`` while
the engine keeps stepping), ``pull_worker`` expiry check (PR #47021: decline if now + 5 s safety margin
>= D's deadline; a declined read is a failed load handled by ``kv_load_failure_policy``).

P's KV pool (``sim/blocks.py``): a request is scheduled from WAITING only when the blocks for its whole
prompt minus its local hit are free after evicting prefix cache (``allocate_slots`` with
``full_sequence_must_fit``), FCFS, so a full pool stops admission. After the prefill P keeps the
prompt's blocks (``request_finished`` returns ``delay_free_blocks``) under a lease of
``kv_lease_duration`` (30 s) until D's read completes; D heartbeats the lease from the moment the
request enters D's scheduler (``on_new_request``) every ``kv_lease_duration // 6`` s, each extending it
to ``now + 2/3 kv_lease_duration``, so a tracked lease never lapses while D is healthy; it lapses only
when D's first heartbeat comes after the initial lease (``docs/design/nixl_kv_cache_lease.md``,
PR #41383; ``nixl/base_scheduler.py`` ``on_new_request``). A lapsed lease frees the blocks and D's read
then fails: D recomputes the prompt locally. Held blocks become prefix cache when freed.

One engine step = one SimPy event at its end, after the prefill cost of the chunks it holds.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from kvplan.errors import input_error
from kvplan.models.costs import prefill_step_time_s
from kvplan.sim.blocks import BlockPool
from kvplan.sim.clock import call_first, call_later
from kvplan.sim.events import Decision, Ev, HoldRelease, Release
from kvplan.sim.evlog import RowBuffer
from kvplan.sim.node_config import PrefillConfig
from kvplan.sim.ports import Wiring
from kvplan.sim.request import D2P, HOST2P, Request
from kvplan.sim.retention import read_declined
from kvplan.sim.shared import SharedPrefixes


class PrefillNode:
    """One prefill instance (TP ranks act as one engine)."""

    def __init__(self, ctx: Wiring, idx: int, cfg: PrefillConfig) -> None:
        self.ctx = ctx
        self.rows: RowBuffer = ctx.log.buf  # the event log's packed rows (sim/evlog.py)
        self.env = ctx.env
        self.idx = idx
        self.max_seqs = cfg.max_num_seqs
        self.max_tokens = cfg.max_num_batched_tokens
        self.threshold = cfg.kv_recompute_threshold_tokens
        self.margin = cfg.read_margin_s
        self.fail_on_decline = cfg.fail_on_decline
        self.pool = BlockPool(cfg.capacity_blocks, cfg.block_size, cfg.prefix_caching)
        self.lease_s = cfg.kv_lease_duration_s
        self.bytes_per_block = cfg.bytes_per_block  # all P's ranks
        self.heartbeat_s = max(cfg.kv_lease_duration_s // 6, 1e-9)
        self._leases: list[tuple[float, int, Request]] = []  # (initial deadline, seq, request) of held prompts
        # D's first heartbeat comes at most one interval after the D leg reaches it: if that is always within
        # the lease, no lease can lapse and the deadlines need no bookkeeping
        self.can_lapse = cfg.d_leg_s + self.heartbeat_s > self.lease_s
        self._lease_seq = 0
        self._blocked = False
        self._wake_at = float("inf")
        self._pc = cfg.costs
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.busy_s = 0.0
        self.thread_free_s = 0.0  # the engine thread is busy posting reads until then (sim/xfer.py)
        self.async_scheduling = cfg.async_scheduling
        self._sched_t = -math.inf  # when the step in progress (or just finished) was scheduled
        self._idle = False  # the scheduler loop waits for work (a submit or freed blocks kick it)
        self._batch: list[tuple[Request, int]] = []  # the step in progress: (request, new tokens)
        self.shared: SharedPrefixes | None = None  # prefixes shared by conversations (sim/shared.py)
        if ctx.shared_group is not None and self.pool.caching:
            self.shared = SharedPrefixes(ctx.shared_group, ctx.shared_tokens, cfg.block_size)
        # the loop starts as SimPy starts a process: an URGENT event now (simpy.events.Initialize)
        call_first(self.env, self._start)

    def cached_tokens(self, conv: int) -> int:
        """Prefix-cached tokens of the conversation on this P (for ``prefix_aware`` routing)."""
        entry = self.pool.cache.get(conv)
        return entry[0] if entry is not None else 0

    def load(self) -> int:
        """Requests waiting or running on this P."""
        return len(self.waiting) + len(self.running)

    def submit(self, req: Request) -> None:
        """A request reaches the engine (after the proxy/HTTP leg)."""
        bs = self.pool.block_size
        if -(-req.prompt // bs) > self.pool.capacity:
            raise input_error(
                "deployment.prefill_kv_capacity_tokens",
                f"P's pool ({self.pool.capacity * bs} tokens) cannot hold one prompt of {req.prompt} tokens",
                "raise it or shorten prompts",
            )
        req.p_node = self.idx
        self.rows.append((self.env._now, Ev.P_ENQUEUE, req.conv, req.turn, self.idx, 0, 0))
        req.wait_t = self.env._now
        self.waiting.append(req)
        self._kick()

    def charge_thread(self, work_s: float) -> None:
        """CPU work on this engine's thread (posting a read): queued after what it already has to do."""
        now = self.env._now
        self.thread_free_s = (self.thread_free_s if self.thread_free_s > now else now) + work_s

    def _kick(self) -> None:
        if self._idle:
            self._idle = False
            call_later(self.env, 0.0, self._woken)

    def _start(self, _e: object) -> None:
        self._next_step(True)

    def _woken(self, _e: object) -> None:
        self._next_step(False)

    def _next_step(self, check_idle: bool) -> None:
        """V1's engine loop up to its next wait: idle until kicked, or the next step's batch and its end.

        Written as callbacks (a generator process before; the events, their order and their ids are the
        same: the wake is one event now, the step one event at its end).
        """
        env = self.env
        log = self.rows
        # async scheduling (vLLM PR #19970): the step after the one that just ended was planned when that one
        # started, so only requests waiting since then can join it; an engine that was idle plans at once
        cutoff = self._sched_t if self.async_scheduling and check_idle else math.inf
        while True:
            if check_idle and not self.running and (not self.waiting or self._blocked):
                self._idle = True
                return
            check_idle = True
            self._blocked = False
            budget = self.max_tokens
            batch: list[tuple[Request, int]] = []
            new_tokens = 0
            pairs = 0.0
            ctx_pairs = 0.0
            for r in self.running:
                if budget <= 0:
                    break
                n = r.p_remaining if r.p_remaining < budget else budget
                batch.append((r, n))
                budget -= n
                new_tokens += n
                ctx_pairs += n * r.p_ctx
                pairs += n * r.p_ctx + n * (n + 1) / 2
            while self.waiting and len(self.running) < self.max_seqs and budget > 0:
                r = self.waiting[0]
                if r.wait_t > cutoff:
                    break  # joins the step after the next (FCFS)
                if not r.p_decided and not self._allocate(r):
                    self._blocked = True  # FCFS: the head waits for blocks (held prompts, running requests)
                    break
                self.waiting.popleft()
                if not r.p_decided:
                    if not self._decide(r):
                        continue  # pulling asynchronously, or failed
                self.running.append(r)
                r.p_compute_start = env._now
                log.append((env._now, Ev.P_COMPUTE, r.conv, r.turn, self.idx, r.p_remaining, 0))
                n = r.p_remaining if r.p_remaining < budget else budget
                batch.append((r, n))
                budget -= n
                new_tokens += n
                ctx_pairs += n * r.p_ctx
                pairs += n * r.p_ctx + n * (n + 1) / 2
            if not batch:
                cutoff = math.inf  # the planned step is empty: nothing runs, the next plan takes them at once
                continue
            self._sched_t = env._now
            dt = prefill_step_time_s(self._pc, new_tokens, pairs, ctx_pairs)
            self.busy_s += dt
            self._batch = batch
            # the step's forward overlaps the engine thread's posting work (PR #53333): it ends when both are done
            stall = self.thread_free_s - env._now - dt
            call_later(env, dt + stall if stall > 0 else dt, self._step_done)
            return

    def _step_done(self, _e: object) -> None:
        finished = False
        for r, n in self._batch:
            r.p_remaining -= n
            r.p_ctx += n
            if r.p_remaining == 0:
                finished = True
                self._finish(r)
        if finished:
            self.running = [r for r in self.running if r.p_remaining > 0]
        self._next_step(True)

    def _decide(self, r: Request) -> bool:
        """The connector decision at scheduling time. True when the request computes now."""
        env = self.env
        ctx = self.ctx
        r.p_decided = True
        prompt = r.prompt
        local = r.local_hit
        params = r.params
        pulled = 0
        if params is None:
            decision = Decision.MISS
        else:
            # only what the prompt repeats token for token is valid KV (vllm#43094: P itself does not check)
            n = min(params.remote_num_tokens, prompt, r.reuse) - local
            dnode = ctx.decode[params.decode_node]
            if n <= 0:
                decision = Decision.LOCAL
                dnode.release_pin(params.pin_id, Release.NOTIFIED)
            elif n < self.threshold:
                decision = Decision.RECOMPUTE_BELOW_THRESHOLD
                dnode.release_pin(params.pin_id, Release.NOTIFIED)
            elif read_declined(env._now, params.expiry_s, self.margin) or not dnode.pin_alive(params.pin_id, env._now):
                # Declined (PR #47021) or the blocks are already gone: a failed KV load, unless D's offload
                # tier holds the context (sim/retention_policy.py)
                n_host = min(dnode.host_tokens(r.conv, env._now), prompt) - local
                if n_host >= max(self.threshold, 1) and prompt - local - 1 > 0:
                    pulled = min(n_host, prompt - local - 1)
                    self.rows.append((env._now, Ev.P_DECISION, r.conv, r.turn, self.idx, Decision.HOST_PULL, local))
                    r.p_ctx = local + pulled
                    r.p_remaining = prompt - local - pulled
                    self._start_host_pull(r, params.decode_node, pulled)
                    return False
                if self.fail_on_decline:
                    log_t = env._now
                    self.rows.append((log_t, Ev.P_DECISION, r.conv, r.turn, self.idx, Decision.ERROR, local))
                    self.rows.append((log_t, Ev.ERROR, r.conv, r.turn, self.idx, Decision.EXPIRED, 0))
                    r.error = True
                    self.pool.held -= r.p_blocks  # nothing is computed: the blocks go back (the hit stays cached)
                    r.p_blocks = 0
                    self.pool.to_cache(r.conv, local)
                    ctx.driver.p_done(r)
                    return False
                decision = Decision.EXPIRED
            else:
                decision = Decision.PULL
                # at least one token is computed: the scheduler backs off a full-prompt hit by one
                pulled = min(n, prompt - local - 1)
        self.rows.append((env._now, Ev.P_DECISION, r.conv, r.turn, self.idx, decision, local))
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
            self.rows.append((env._now, Ev.PULL_DONE, r.conv, r.turn, d, xfer_s, post_s))
            dnode.release_pin(pin_id, Release.READ)
            r.wait_t = env._now
            self.waiting.appendleft(r)  # back to WAITING, ahead of later arrivals (FCFS)
            self._kick()

        self.rows.append((env._now, Ev.PULL_START, r.conv, r.turn, d, tokens, ctx.reads.total_bytes(D2P, tokens)))
        self.charge_thread(ctx.reads.start(self.idx, d, D2P, tokens, done))

    def _start_host_pull(self, r: Request, d: int, tokens: int) -> None:
        """Read the conversation's context from D's host memory (offload tier) at host-to-NIC bandwidth."""
        ctx = self.ctx
        env = self.env

        def done(xfer_s: float, post_s: float) -> None:
            self.rows.append((env._now, Ev.PULL_DONE, r.conv, r.turn, d, xfer_s, post_s))
            ctx.decode[d].host_read(r.conv)
            r.wait_t = env._now
            self.waiting.appendleft(r)
            self._kick()

        self.rows.append((env._now, Ev.PULL_START, r.conv, r.turn, d, tokens, ctx.reads.total_bytes(HOST2P, tokens)))
        self.charge_thread(ctx.reads.start(self.idx, d, HOST2P, tokens, done))

    def _allocate(self, r: Request) -> bool:
        """Blocks for the whole prompt minus the local prefix hit, else False (the request keeps waiting)."""
        pool = self.pool
        bs = pool.block_size
        entry = pool.take(r.conv) if pool.caching else None
        local = owned = 0
        if entry is not None:
            local = min(entry[0], ((r.prompt - 1) // bs) * bs)
            if r.reuse < local:  # the prompt repeats less of the context: the hash prefix, full blocks
                local = (r.reuse // bs) * bs
            owned = entry[1] if local > 0 else 0
        own_local = local
        if self.shared is not None:  # another conversation computed the shared prefix here: a local hit
            s_hit = self.shared.hit(r.conv, ((r.prompt - 1) // bs) * bs)
            if s_hit > local:
                local = s_hit
        total = -(-r.prompt // bs)
        want = max(total - owned, 0) + (entry[1] if entry is not None else 0)
        if pool.free() < want:
            self._lapse_due(self.env._now)
            pool.evict(want)
            if pool.free() < want:
                if entry is not None:
                    pool.put_back(r.conv, entry)
                self._wake_at_next_lapse()
                return False
        if entry is not None and own_local == 0:
            pool.to_cache(r.conv, entry[0])
        pool.held += total
        pool.check()
        r.p_blocks = total
        r.local_hit = local
        return True

    def _finish(self, r: Request) -> None:
        env = self.env
        now = env._now
        # the prompt's blocks stay for D's read under a lease (delay_free_blocks): P_DONE carries their bytes
        pool = self.pool
        self.rows.append(
            (now, Ev.P_DONE, r.conv, r.turn, self.idx, now - r.p_compute_start, r.p_blocks * self.bytes_per_block)
        )
        pool.held -= r.p_blocks
        pool.pinned += r.p_blocks
        if self.shared is not None:
            self.shared.see(r.conv)
        r.p_hold = True
        r.p_lease_expiry = now + self.lease_s
        if self.can_lapse:
            self._lease_seq += 1
            heapq.heappush(self._leases, (r.p_lease_expiry, self._lease_seq, r))
            if self._blocked:  # the head already waits for blocks: it may get these ones when the lease lapses
                self._wake_at_next_lapse()
        self.ctx.driver.p_done(r)

    # ---- the lease on held prompts -----------------------------------------------------------------------

    def d_tracks(self, r: Request) -> None:
        """The request entered D's scheduler: D heartbeats the lease from its next heartbeat on.

        D sends heartbeats every ``kv_lease_duration // 6`` s (one throttle per engine, here on a clock
        from 0); each extends the lease to ``now + 2/3 kv_lease_duration``, longer than the interval, so
        once the first one arrives in time the lease holds until the read. It lapsed if P's deadline
        passed before that first heartbeat.
        """
        if not r.p_hold:
            return
        hb = self.heartbeat_s
        first_hb = -(-self.env._now // hb) * hb
        if first_hb > r.p_lease_expiry:
            self.release_hold(r, HoldRelease.LAPSED, r.p_lease_expiry)
            r.p_lapsed = True
        else:
            r.p_tracked = True

    def _lapse_due(self, now: float) -> None:
        """Leases past their deadline that no D is heartbeating: the blocks are freed at the deadline."""
        leases = self._leases
        while leases and leases[0][0] <= now:
            t, _, r = heapq.heappop(leases)
            if r.p_hold and not r.p_tracked:
                self.release_hold(r, HoldRelease.LAPSED, t, kick=False)
                r.p_lapsed = True

    def _wake_at_next_lapse(self) -> None:
        leases = self._leases
        while leases and (not leases[0][2].p_hold or leases[0][2].p_tracked):
            heapq.heappop(leases)
        if not leases:
            return  # blocks come back when D reads a held prompt or a running prefill finishes
        t = leases[0][0]
        if self._wake_at <= t and self._wake_at > self.env._now:
            return
        self._wake_at = t
        call_later(self.env, max(t - self.env._now, 0.0), lambda _e: self._on_lapse_timer())

    def _on_lapse_timer(self) -> None:
        self._lapse_due(self.env._now)
        self._blocked = False
        self._kick()

    def release_hold(self, r: Request, why: HoldRelease, at: float | None = None, kick: bool = True) -> None:
        """Free the prompt's held blocks (D's read done, D's notification, lapse); they become prefix cache."""
        if not r.p_hold:
            return
        r.p_hold = False
        pool = self.pool
        pool.pinned -= r.p_blocks
        t = self.env._now if at is None else at
        self.rows.append((t, Ev.P_UNHOLD, r.conv, r.turn, self.idx, r.p_blocks * pool.block_size, why))
        r.p_blocks = 0
        pool.to_cache(r.conv, r.prompt)
        if kick and self._blocked:
            self._blocked = False
            self._kick()

    def release_all(self, requests: list[Request]) -> None:
        """End of run: anything still held is freed (counted as END; every turn reaches D, so none should be)."""
        for r in requests:
            self.release_hold(r, HoldRelease.END, kick=False)
        self._leases.clear()
