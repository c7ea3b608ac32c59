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
from collections.abc import Callable
from typing import cast

from kvplan.errors import input_error
from kvplan.models.formulas import NativePrefill
from kvplan.sim.blocks import BlockPool
from kvplan.sim.clock import call_at, call_first, call_later, call_soon
from kvplan.sim.evlog import (
    DEC_ERROR,
    DEC_EXPIRED,
    DEC_HOST_PULL,
    DEC_LOCAL,
    DEC_MISS,
    DEC_PULL,
    DEC_RECOMPUTE_BELOW_THRESHOLD,
    EV_ERROR,
    EV_P_COMPUTE,
    EV_P_DECISION,
    EV_P_DONE,
    EV_P_UNHOLD,
    EV_PULL_DONE,
    EV_PULL_START,
    HOLD_END,
    HOLD_LAPSED,
    REL_NOTIFIED,
    REL_READ,
)
from kvplan.sim.node_config import PrefillConfig
from kvplan.sim.peers import DecodePort, DriverPort, PrefillPort
from kvplan.sim.ports import Wiring
from kvplan.sim.request import D2P, HOST2P, Request
from kvplan.sim.retention import read_declined
from kvplan.sim.shared import SharedPrefixes


class PrefillNode(PrefillPort):
    """One prefill instance (TP ranks act as one engine): the scheduler core plus the connector's decision."""

    def __init__(self, ctx: Wiring, idx: int, cfg: PrefillConfig) -> None:
        pool = BlockPool(cfg.capacity_blocks, cfg.block_size, cfg.prefix_caching)
        super().__init__(ctx.log.buf, idx, cfg.max_num_seqs, cfg.max_num_batched_tokens, pool)
        self.ctx = ctx
        self.env = ctx.env
        # the run's list, filled after (sim/peers.py); a list, not Wiring's Sequence: native reads compiled
        self.decode_nodes = cast(list[DecodePort], ctx.decode)
        self._drv: DriverPort | None = None  # the run's driver, made after the nodes (see _driver)
        self.threshold = cfg.kv_recompute_threshold_tokens
        self.margin = cfg.read_margin_s
        self.fail_on_decline = cfg.fail_on_decline
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
        self.costs = cfg.costs  # P's prefill step cost (its TP)
        self._pc = NativePrefill(cfg.costs)  # read every step: a plain copy (models/formulas.py)
        # the loop's wake-ups, bound once (a bound method made per step is an object and, compiled, an attribute lookup)
        self._on_step_done: Callable[[object], None] = self._step_done
        self._on_woken: Callable[[object], None] = self._woken
        self.busy_s = 0.0
        self.thread_free_s = 0.0  # the engine thread is busy posting reads until then (sim/xfer.py)
        # the health section's prefill_engine_thread: the posting work, and that plus the forwards it serialises
        self.thread_post_s = 0.0
        self.thread_busy_s = 0.0
        self.submitted = 0  # requests that reached P, and those it scheduled (decided): the demand on its thread
        self.decided = 0
        self.async_scheduling = cfg.async_scheduling
        self.post_serial = not cfg.kv_post_overlaps_forward  # sim/batch.py ``charge_thread``
        self._sched_t = -math.inf  # when the step in progress (or just finished) was scheduled
        self._idle = False  # the scheduler loop waits for work (a submit or freed blocks kick it)
        self._cutoff = math.inf  # async scheduling: requests waiting since after this time join a later step
        self._batch: list[tuple[Request, int]] = []  # the step in progress: (request, new tokens)
        self.shared: SharedPrefixes | None = None  # prefixes shared by conversations (sim/shared.py)
        if ctx.shared_group is not None and self.pool.caching:
            self.shared = SharedPrefixes(ctx.shared_group, ctx.shared_tokens, cfg.block_size)
        # the loop starts as SimPy starts a process: an URGENT event now (simpy.events.Initialize)
        call_first(self.env, self._start)

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
        self.submitted += 1
        req.wait_t = self.env.now
        self._enqueue(req.wait_t, req)
        self._kick()

    def charge_thread(self, work_s: float) -> None:
        """CPU work on this engine's thread (posting a read): queued after what it already has to do.

        Reads are posted only in ``schedule()`` (``_decide``), i.e. at the start of a step (``_next_step`` prices
        them against its forward) or of an empty step (no tokens scheduled: the next step starts after it)."""
        now = self.env.now
        self.thread_free_s = (self.thread_free_s if self.thread_free_s > now else now) + work_s
        self.thread_post_s += work_s
        self.thread_busy_s += work_s

    def _driver(self) -> DriverPort:
        """The run's driver (made after the nodes): read off the run once, at the first use."""
        d = self._drv
        if d is None:
            d = self._drv = self.ctx.driver
        return d

    def _kick(self) -> None:
        if self._idle:
            self._idle = False
            call_soon(self.env, self._on_woken)

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
        # async scheduling (vLLM PR #19970): the step after the one that just ended was planned when that one
        # started, so only requests waiting since then can join it; an engine that was idle plans at once
        self._cutoff = self._sched_t if self.async_scheduling and check_idle else math.inf
        while True:
            if check_idle and not self.running and (not self.waiting or self._blocked):
                self._idle = True
                return
            check_idle = True
            self._blocked = False
            free0 = self.thread_free_s  # the work posted before this step (in empty steps, or while idle)
            self.schedule()
            if not self.chunks:
                self._cutoff = math.inf  # the planned step is empty: nothing runs, the next plan takes them at once
                continue
            now = env.now  # read once: the clock does not move inside an event
            self._sched_t = now
            dt = self._pc.step_time_s(self.new_tokens, self.pairs, self.ctx_pairs)  # = prefill_step_time_s (typed)
            self.busy_s += dt
            self._batch = self.chunks
            # the step's forward overlaps the engine thread's posting work (PR #53333): it ends when both are done;
            # before that PR (deployment.kv_post_overlaps_forward false) the forward starts once the posting is done
            stall = self.thread_free_s - now - (0.0 if self.post_serial else dt)
            # work posted in an empty step (a step with no tokens still posts its loads: execute_model ->
            # kv_connector_no_forward, vllm/v1/worker/kv_connector_model_runner_mixin.py) or while idle ran before
            # this step: its forward starts once that is done, whatever post_serial
            wait = free0 - now
            if wait > stall:
                stall = wait
            if self.post_serial and self.thread_free_s > free0:
                self.thread_busy_s += dt  # this step posted reads: its forward runs after them, on the thread
            call_later(env, dt + stall if stall > 0 else dt, self._on_step_done)
            return

    def _can_schedule(self, r: Request) -> bool:
        """The head of WAITING: planned for this step (async scheduling) and its blocks allocated."""
        if r.wait_t > self._cutoff:
            return False  # joins the step after the next (FCFS)
        if r.p_decided:
            return True  # back from its pull: its blocks are held since its first scheduling
        # blocks for the whole prompt minus the local prefix hit (allocate_slots with full_sequence_must_fit)
        hit = self._allocate(r, r.prompt, r.reuse, 0, self)
        if hit < 0:
            self._blocked = True  # FCFS: the head waits for blocks (held prompts, running requests)
            self._wake_at_next_lapse()
            return False
        if self.shared is not None:  # another conversation computed the shared prefix here: a local hit
            bs = self.pool.block_size
            s_hit = self.shared.hit(r.conv, ((r.prompt - 1) // bs) * bs)
            if s_hit > hit:
                hit = s_hit
        r.local_hit = hit
        return True

    def _scheduled(self, r: Request) -> bool:
        """The connector decides at its first scheduling; it computes now unless it pulls (or failed)."""
        if not r.p_decided and not self._decide(r):
            return False  # pulling asynchronously, or failed
        now = self.env.now
        r.p_compute_start = now
        self.rows.append((now, EV_P_COMPUTE, r.conv, r.turn, self.idx, r.p_remaining, 0))
        return True

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
        now = self.env.now  # read once: the clock does not move inside an event
        r.p_decided = True
        self.decided += 1
        prompt = r.prompt
        local = r.local_hit
        params = r.params
        pulled = 0
        if params is None:
            decision = DEC_MISS
        else:
            # only what the prompt repeats token for token is valid KV (vllm#43094: P itself does not check)
            n = min(min(params.remote_num_tokens, prompt), r.reuse) - local  # two-argument mins: native when compiled
            dnode = self.decode_nodes[params.decode_node]
            if n <= 0:
                decision = DEC_LOCAL
                dnode.release_pin(params.pin_id, REL_NOTIFIED)
            elif n < self.threshold:
                decision = DEC_RECOMPUTE_BELOW_THRESHOLD
                dnode.release_pin(params.pin_id, REL_NOTIFIED)
            elif read_declined(now, params.expiry_s, self.margin) or not dnode.pin_alive(params.pin_id, now):
                # Declined (PR #47021) or the blocks are already gone: a failed KV load, unless D's offload
                # tier holds the context (sim/retention_policy.py)
                n_host = min(dnode.host_tokens(r.conv, now), prompt) - local
                if n_host >= max(self.threshold, 1) and prompt - local - 1 > 0:
                    pulled = min(n_host, prompt - local - 1)
                    self.rows.append((now, EV_P_DECISION, r.conv, r.turn, self.idx, DEC_HOST_PULL, local))
                    r.p_ctx = local + pulled
                    r.p_remaining = prompt - local - pulled
                    self._start_host_pull(r, params.decode_node, pulled)
                    return False
                if self.fail_on_decline:
                    log_t = now
                    self.rows.append((log_t, EV_P_DECISION, r.conv, r.turn, self.idx, DEC_ERROR, local))
                    self.rows.append((log_t, EV_ERROR, r.conv, r.turn, self.idx, DEC_EXPIRED, 0))
                    r.error = True
                    self.pool.held -= r.p_blocks  # nothing is computed: the blocks go back (the hit stays cached)
                    r.p_blocks = 0
                    self.pool.to_cache(r.conv, local)
                    self._driver().p_done(r)
                    return False
                decision = DEC_EXPIRED
            else:
                decision = DEC_PULL
                # at least one token is computed: the scheduler backs off a full-prompt hit by one
                pulled = min(n, prompt - local - 1)
        self.rows.append((now, EV_P_DECISION, r.conv, r.turn, self.idx, decision, local))
        r.p_ctx = local + pulled
        r.p_remaining = prompt - local - pulled
        if decision == DEC_PULL:
            assert params is not None
            self._start_pull(r, params.decode_node, params.pin_id, pulled)
            return False
        return True

    def _start_pull(self, r: Request, d: int, pin_id: int, tokens: int) -> None:
        env = self.env
        dnode = self.decode_nodes[d]
        dnode.mark_reading(pin_id)

        def done(xfer_s: float, post_s: float) -> None:
            now = env.now
            self.rows.append((now, EV_PULL_DONE, r.conv, r.turn, d, xfer_s, post_s))
            dnode.release_pin(pin_id, REL_READ)
            r.wait_t = now
            self.waiting.appendleft(r)  # back to WAITING, ahead of later arrivals (FCFS)
            self._kick()

        reads = self.ctx.reads
        self.rows.append((env.now, EV_PULL_START, r.conv, r.turn, d, tokens, reads.total_bytes(D2P, tokens)))
        self.charge_thread(reads.start(self.idx, d, D2P, tokens, done))

    def _start_host_pull(self, r: Request, d: int, tokens: int) -> None:
        """Read the conversation's context from D's host memory (offload tier) at host-to-NIC bandwidth."""
        env = self.env

        def done(xfer_s: float, post_s: float) -> None:
            self.rows.append((env.now, EV_PULL_DONE, r.conv, r.turn, d, xfer_s, post_s))
            self.decode_nodes[d].host_read(r.conv)
            r.wait_t = env.now
            self.waiting.appendleft(r)
            self._kick()

        reads = self.ctx.reads
        self.rows.append((env.now, EV_PULL_START, r.conv, r.turn, d, tokens, reads.total_bytes(HOST2P, tokens)))
        self.charge_thread(reads.start(self.idx, d, HOST2P, tokens, done))

    def before_evict(self, want: int) -> None:
        """The pool is short: leases past their deadline free their blocks first."""
        self._lapse_due(self.env.now)

    def after_evict(self, want: int, keep: int | None) -> None:
        """Nothing else to free on P."""

    def _finish(self, r: Request) -> None:
        env = self.env
        now = env.now
        # the prompt's blocks stay for D's read under a lease (delay_free_blocks): P_DONE carries their bytes
        pool = self.pool
        self.rows.append(
            (now, EV_P_DONE, r.conv, r.turn, self.idx, now - r.p_compute_start, r.p_blocks * self.bytes_per_block)
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
        self._driver().p_done(r)

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
        first_hb = -(-self.env.now // hb) * hb
        if first_hb > r.p_lease_expiry:
            self.release_hold(r, HOLD_LAPSED, r.p_lease_expiry)
            r.p_lapsed = True
        else:
            r.p_tracked = True

    def _lapse_due(self, now: float) -> None:
        """Leases past their deadline that no D is heartbeating: the blocks are freed at the deadline."""
        leases = self._leases
        while leases and leases[0][0] <= now:
            t, _, r = heapq.heappop(leases)
            if r.p_hold and not r.p_tracked:
                self.release_hold(r, HOLD_LAPSED, t, kick=False)
                r.p_lapsed = True

    def _wake_at_next_lapse(self) -> None:
        leases = self._leases
        while leases and (not leases[0][2].p_hold or leases[0][2].p_tracked):
            heapq.heappop(leases)
        if not leases:
            return  # blocks come back when D reads a held prompt or a running prefill finishes
        t = leases[0][0]
        if self._wake_at <= t and self._wake_at > self.env.now:
            return
        self._wake_at = t
        call_at(self.env, t, lambda _e: self._on_lapse_timer())  # exactly at the deadline: it is due there

    def _on_lapse_timer(self) -> None:
        self._lapse_due(self.env.now)
        self._blocked = False
        self._kick()

    def release_hold(self, r: Request, why: int, at: float | None = None, kick: bool = True) -> None:
        """Free the prompt's held blocks (D's read done, D's notification, lapse); they become prefix cache."""
        if not r.p_hold:
            return
        r.p_hold = False
        pool = self.pool
        pool.pinned -= r.p_blocks
        t = self.env.now if at is None else at
        self.rows.append((t, EV_P_UNHOLD, r.conv, r.turn, self.idx, r.p_blocks * pool.block_size, why))
        r.p_blocks = 0
        pool.to_cache(r.conv, r.prompt)
        if kick and self._blocked:
            self._blocked = False
            self._kick()

    def release_all(self, requests: list[Request]) -> None:
        """End of run: anything still held is freed (counted as END; every turn reaches D, so none should be)."""
        for r in requests:
            self.release_hold(r, HOLD_END, kick=False)
        self._leases.clear()
