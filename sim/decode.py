"""The decode node: admission into the KV block pool, the P->D pull, preemption, and TTL retention.

It wires three parts: the block pool (``sim/blocks.py``), retention of finished requests' blocks
(``sim/retention.py``) and the continuous decode batch with per-step block growth (``sim/batch.py``).

Sources (vLLM):
- ``vllm/v1/core/sched/scheduler.py`` and ``vllm/v1/core/kv_cache_manager.py`` ``allocate_slots``:
  a waiting request is admitted when the blocks for its current tokens (``request.num_tokens``: the
  prompt, or prompt + sampled tokens after a preemption; ``scheduler_reserve_full_isl`` /
  ``full_sequence_must_fit``) minus its local prefix hit, plus the watermark (``SchedulerConfig.watermark``,
  default 0, applied when requests are already running), are free after evicting prefix cache; FCFS, so
  the head blocks the queue. Blocks then grow one per ``block_size`` tokens as the batch steps (``sim/batch.py``).
- ``_preempt_request``: when a running request cannot get its next block the newest running request is
  preempted: its blocks are freed (``kv_cache_manager.free``: hashed full blocks stay as prefix cache),
  ``num_computed_tokens`` reset, and it is re-queued at the front. Its transfer params are used up, so
  it is recomputed locally on D (prompt + sampled tokens, minus whatever of its prefix survives in D's
  cache); the recompute's last chunk samples its next token. Counted (``D_PREEMPT``/``D_RECOMPUTE``).
- the D side of ``nixl/pull_scheduler.py``: pull ``prompt - local hit`` from P; with
  ``bidirectional_kv_xfer`` every finished request pins its blocks until ``now + decoder_kv_blocks_ttl``,
  freed by the reader's NIXL notification or at the deadline; pinned blocks are neither evictable nor
  preemptable. Retained blocks expire lazily: the deadline is checked whenever blocks are needed.

A P->D tail below the threshold (PR #55801) is computed in the mixed step that samples the request's first
token (``sim/batch.py``: that step costs ``mixed_step_time_s`` of the tail and the batch's decode tokens),
as vLLM schedules it: a prompt chunk in D's next step.

Simplifications (stated): admission is tried when a request arrives or blocks come back, not only at
step boundaries, except during a step that preempted: vLLM skips that step's waiting loop, so admission is
held until the step ends (the batch's next boundary; at once with async scheduling, ``_skip_waiting``); a
preempted request's local recompute (and a failed read's) is one prefill-cost delay beside the batch (vLLM
mixes its chunks into D's steps, lengthening them).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

from kvplan.errors import input_error
from kvplan.models.costs import prefill_time_s
from kvplan.sim.batch import BatchOwner, DecodeBatch
from kvplan.sim.blocks import BlockPool
from kvplan.sim.clock import call_at, call_later, call_soon
from kvplan.sim.evlog import (
    EV_D_ADMIT,
    EV_D_ENQUEUE,
    EV_D_FINISH,
    EV_D_FIRST,
    EV_D_ITL,
    EV_D_RECOMPUTE,
    EV_P2D_DONE,
    EV_P2D_FAILED,
    EV_P2D_START,
    EV_PIN,
    EV_UNPIN,
    HOLD_NOTIFIED,
    HOLD_READ,
    REL_EVICTED,
    REL_EXPIRED,
    REL_REUSED,
    RowBuffer,
)
from kvplan.sim.fifo import Fifo, new_fifo
from kvplan.sim.itl import log_pooled, turn_stats
from kvplan.sim.node_config import DecodeConfig
from kvplan.sim.peers import DriverPort, PrefillPort
from kvplan.sim.ports import Wiring
from kvplan.sim.request import P2D, Request
from kvplan.sim.retention import Retention
from kvplan.sim.retention_policy import RetentionPolicy
from kvplan.sim.router import KVParams, Router
from kvplan.sim.scheduler import prefix_hit, record_preemption, reserve
from kvplan.sim.shared import SharedPrefixes
from kvplan.sim.xfer import Reads


class DecodeNode(BatchOwner):
    """One decode instance (the owner of its decode batch)."""

    def __init__(self, ctx: Wiring, idx: int, cfg: DecodeConfig, conv_offsets: Sequence[int]) -> None:
        self.ctx = ctx
        self.rows: RowBuffer = ctx.log.buf  # the event log's packed rows (sim/evlog.py)
        # the run's router and reads, typed (compiled: direct calls, no lookup on the run state per use)
        self.router: Router = ctx.router
        self.reads: Reads = ctx.reads
        # the run's list (sim/peers.py: native calls); typed a list, not Wiring's Sequence: compiled, an index into a
        # Sequence is a generic call, into a list a native read
        self.prefill_nodes = cast(list[PrefillPort], ctx.prefill)
        self._drv: DriverPort | None = None  # the run's driver, made after the nodes (see _driver)
        self.env = ctx.env
        self.idx = idx
        self.caching = cfg.prefix_caching
        self.bidirectional = cfg.bidirectional
        self.p2d_threshold = cfg.p2d_threshold_tokens
        self.chunk = cfg.max_num_batched_tokens
        self.costs = cfg.costs  # D's own cost model (its TP)
        self.bs = cfg.block_size
        self.max_seqs = cfg.max_num_seqs
        self.pool = BlockPool(cfg.capacity_blocks, cfg.block_size, self.caching)
        self.watermark_blocks = cfg.watermark_blocks
        self.static = 0  # blocks of admitted requests not (or no longer) in the batch
        self._max_tokens = self.pool.capacity * cfg.block_size
        self.retention = Retention(idx, cfg.decode_nodes)
        # ttl (vLLM), lease or ttl_evictable, and the offload tier
        self.policy = RetentionPolicy(cfg.retention, self.retention, conv_offsets)
        self.host = self.policy.host_tier()
        self.batch = DecodeBatch(
            self.env, ctx.log.buf, idx, self.costs.decode, cfg.max_num_seqs, cfg.exact_steps, cfg.block_size, self,
        )
        self.batch.pc = self.costs.prefill  # prompt chunks in D's steps (short tails, PR #55801)
        self.batch.async_scheduling = cfg.async_scheduling
        self.batch.post_serial = not cfg.kv_post_overlaps_forward
        self._admit_q: Fifo[Request] = new_fifo()  # sim/fifo.py
        self._admit_wake_at = math.inf
        self._inflight = 0  # admitted, not yet finished nor preempted (for the router's load)
        self._retry_pending = False
        self.admission_held = False  # the step in progress preempted: admission waits for its end (sim/batch.py)
        self._synced = False  # admission: the pool's held count is the batch's exact blocks (not an upper bound)
        self.preemptions = 0
        # the most blocks admitted and running requests and pins held at once (what admission waits on: the pool
        # less prefix cache, which it evicts), noted where it can rise: an admission, the last step of a stretch
        # before its finishes, a step whose growth does not fit (then the pool is full); the health section's
        # decode_kv utilization (summary decode_kv_used_peak_fraction)
        self.used_peak = 0
        self.submitted = 0  # requests that reached this D, and those admitted (first admissions): the health
        self.admitted = 0  # section's demand on D's engine thread (sim/api.py _thread_utilization)
        # vLLM's ``self.running`` order: batch members and requests recomputing after a preemption; the
        # last is the newest, preempted first
        self.running: dict[Request, None] = {}
        self.shared: SharedPrefixes | None = None  # prefixes shared by conversations (sim/shared.py)
        if ctx.shared_group is not None:
            self.shared = SharedPrefixes(ctx.shared_group, ctx.shared_tokens, cfg.block_size)

    def _driver(self) -> DriverPort:
        """The run's driver (made after the nodes): read off the run once, at the first use."""
        d = self._drv
        if d is None:
            d = self._drv = self.ctx.driver
        return d

    # ---- retention ---------------------------------------------------------------------------------------

    def pin_alive(self, pin_id: int, now: float) -> bool:
        """Whether the pinned blocks still exist at ``now`` (deadline not passed, not yet released)."""
        return self.retention.alive(pin_id, now)

    def renew_lease(self, entry: KVParams, now: float) -> bool:
        """Lease retention: the conversation's next request reached the router; renew its lease if still alive."""
        return self.policy.renew(entry, now)

    def mark_reading(self, pin_id: int) -> None:
        """A P worker posted a READ of these blocks: they stay until the read completes."""
        self.retention.mark_reading(pin_id)

    def release_pin(self, pin_id: int, why: int) -> None:
        """P released retained blocks (read done or notification): they become prefix cache."""
        now = self.env.now
        if self._unpin(pin_id, why, now) and self._admit_q:
            self._try_admit(now)

    def _unpin(self, pin_id: int, why: int, t: float) -> bool:
        pin = self.retention.pop(pin_id)
        if pin is None:
            return False
        pool = self.pool
        batch = self.batch
        bound = self.static + batch.fin_sum + pool.pinned
        peak = bound > self.used_peak  # the level before this release may be a peak
        if peak or bound + pool.cached > pool.capacity:
            step = batch.step_at(t)
            if peak:
                self._note_used(step)
            if bound + pool.cached > pool.capacity:
                # the growth before ``t`` took its blocks (evicting cache) before this release frees any
                self._sync(step)
        pool.pinned -= pin.blocks
        unpinned = pin.tokens
        if pin.shared > 0 and self.shared is not None:  # the group's prefix goes with its last pin
            unpinned = pin.tokens - pin.shared + self._unpin_shared(pin.conv)
        self.rows.append((t, EV_UNPIN, pin.conv, -1, self.idx, unpinned, why))
        if self.host is not None and why in (REL_EXPIRED, REL_EVICTED):
            self.host.put(pin.conv, pin.tokens)  # offload tier: the blocks are copied to host memory
        if why not in (REL_REUSED, REL_EVICTED):  # evicted blocks are taken by the allocation
            self.pool.to_cache(pin.conv, pin.tokens)
        return True

    def _unpin_shared(self, conv: int) -> int:
        """A pin of the conversation's shared-prefix group is gone: tokens the group unpins with it."""
        assert self.shared is not None
        tokens = self.shared.unpin(conv)
        self.pool.pinned -= tokens // self.bs
        return tokens

    def _pin_shared(self, r: Request, kv_tokens: int) -> tuple[int, int]:
        """(tokens the pin leaves to its group, tokens the group pins now) for a finished request."""
        assert self.shared is not None
        left, new = self.shared.pin(r.conv, kv_tokens)
        self.pool.pinned += new // self.bs
        return left, new

    def _evict_pins(self, want: int, keep: int | None = None) -> None:
        """ttl_evictable: release pins (not ``keep``), least recently pinned first, until ``want`` blocks are free."""
        for pid in self.retention.lru_evictable():
            if self.pool.free() >= want:
                break
            if pid != keep:
                self._unpin(pid, REL_EVICTED, self.env.now)

    def host_tokens(self, conv: int, now: float) -> int:
        """Tokens of the conversation in this node's host offload tier (expired pins are moved there first)."""
        if self.host is None:
            return 0
        self._expire(now)
        return self.host.tokens(conv)

    def host_read(self, conv: int) -> None:
        """P read the conversation's host copy: it is dropped (the new turn's KV supersedes it)."""
        if self.host is not None:
            self.host.pop(conv)

    def _expire(self, now: float) -> None:
        """What an expiry does (the rule: ``sim/retention.py``): each due pin no read holds is released as of its
        deadline; its blocks become prefix cache, or go to the host tier with offload (``_unpin``)."""
        for expiry, pid in self.retention.due(now):
            self._unpin(pid, REL_EXPIRED, expiry)

    def expire_all(self) -> None:
        """End of run: every pin still held is counted as expired at its deadline (no leak)."""
        for pid in self.retention.all_by_expiry():
            self._unpin(pid, REL_EXPIRED, self.retention.pins[pid].expiry_s)
        self.retention.clear_deadlines()
        self._sync(self.batch.step)
        self.log_itl_hist()

    # ---- the batch's view of the pool --------------------------------------------------------------------

    def _sync(self, step: int) -> None:
        """Bring the pool's held count to the batch's blocks at ``step``; evict cache the growth has taken."""
        pool = self.pool
        held = pool.held = self.static + self.batch.alloc(step)
        if pool.capacity - held - pool.pinned - pool.cached < 0:
            pool.evict(0)

    def _note_used(self, step: int) -> None:
        """The blocks held now (the batch's at ``step``, admitted requests outside it, pins): keep the peak."""
        if self.static + self.batch.fin_sum + self.pool.pinned > self.used_peak:  # fin_sum bounds the batch's blocks
            used = self.static + self.batch.alloc(step) + self.pool.pinned
            if used > self.used_peak:
                self.used_peak = used

    def grown(self, step: int) -> None:
        """The members held their blocks for ``step``: evict what that growth took from the cache."""
        pool = self.pool
        bound = self.static + self.batch.fin_sum + pool.pinned
        if bound > self.used_peak:
            self._note_used(step)  # the stretch's last step, its finishes not yet out: its peak
        if bound + pool.cached > pool.capacity:
            self._sync(step)

    def joined(self, r: Request) -> None:
        """The request's admitted blocks now grow with the batch."""
        self.static -= r.d_blocks
        r.d_blocks = 0
        r.d_state = 0
        if r not in self.running:
            self.running[r] = None

    def fit(self, step: int, now: float) -> bool:
        """Blocks for ``step``: evict prefix cache, then preempt the newest running requests until they fit."""
        if now >= self.retention.due_from:  # a filed deadline has passed (Retention.due_from)
            self._expire(now)
        pool = self.pool
        free_at_end = pool.capacity - self.static - self.batch.fin_sum - pool.pinned - pool.cached
        if free_at_end >= 0:
            return False  # even at their last step the members fit without evicting anything
        held = pool.held = self.static + self.batch.alloc(step)
        used = held + pool.pinned
        if used > self.used_peak:  # beyond the pool: it is full, and preempts below
            self.used_peak = used if used < pool.capacity else pool.capacity
        if pool.capacity - held - pool.pinned - pool.cached >= 0:
            return False
        pool.evict(0)
        preempted = False
        if pool.free() < 0:  # evicting the cache was not enough
            if self.policy.evictable:
                self._evict_pins(0)
            while pool.free() < 0 and self.running:
                self._preempt(next(reversed(self.running)))
                preempted = True
                self._sync(step)
        pool.check()
        if preempted:
            self._skip_waiting()
        return preempted

    def _skip_waiting(self) -> None:
        """The step starting now preempted: vLLM skips its waiting loop, the next ``schedule()`` admits.

        ``Scheduler.schedule`` runs the waiting queue only ``if not preempted_reqs``
        (``vllm/v1/core/sched/scheduler.py``), so nothing is admitted (no allocation, no P->D read) before the
        next call. Without async scheduling that is the next step boundary, after this step: admission is held
        until the batch ends the step (``sim/batch.py`` ``_boundary`` calls :meth:`resume_admission`; an empty
        step costs nothing, it resumes at once). With async scheduling (``step_with_batch_queue``,
        ``vllm/v1/engine/core.py``) each ``schedule()`` runs one step ahead, as the previous step starts; the
        batch models that (its async cutoff: this ``fit`` stands for a ``schedule()`` made a step earlier), so
        the next ``schedule()`` is now: retry at once.
        """
        if not self.batch.async_scheduling:
            self.admission_held = True
        elif not self._retry_pending:
            self._retry_pending = True
            call_soon(self.env, self._retry)

    def resume_admission(self) -> None:
        """The step that preempted is over and the next one preempted nothing: its waiting loop runs now."""
        self.admission_held = False
        self._try_admit(self.env.now)

    def _retry(self, _e: object) -> None:
        self._retry_pending = False
        self._try_admit(self.env.now)

    def _preempt(self, r: Request) -> None:
        """Preempt one running request (``_preempt_request``): free its blocks, re-queue it at the front."""
        del self.running[r]
        if r.d_state == 1:  # still recomputing: what it had at readmission survives
            sampled, kv_tokens = r.d_generated, r.d_hit
            r.d_epoch += 1
        else:
            if r.d_state == 2:
                self.batch.drop_joiner(r)
                sampled = r.d_g0
            else:
                sampled = self.batch.preempt(r)
            kv_tokens = r.prompt + sampled - 1  # the last sampled token has no KV yet
        self.static -= r.d_blocks
        r.d_blocks = 0
        r.d_state = 0
        self.preemptions += 1
        record_preemption(self.rows, self.env.now, self.idx, self.pool, r, sampled, kv_tokens)
        self._inflight -= 1
        self._admit_q.appendleft(r)

    def cached_tokens(self, conv: int) -> int:
        """Tokens of the conversation retained (pinned) or prefix-cached here (for ``prefix_aware`` routing)."""
        pid = self.retention.of_conv.get(conv)
        if pid is not None:
            return self.retention.pins[pid].tokens
        entry = self.pool.entry(conv)
        return entry[0] if entry is not None else 0

    def load(self) -> int:
        """Requests waiting for admission, pulling or running on this D."""
        return len(self._admit_q) + self._inflight

    # ---- admission and P->D pull -------------------------------------------------------------------------

    def submit(self, req: Request) -> None:
        """The D leg reaches this engine: wait for KV blocks, pull from P, then join the batch."""
        bs = self.bs
        if req.prompt + req.output - 1 > self._max_tokens:
            raise input_error(
                "deployment.decode_kv_capacity_tokens",
                f"D's pool ({self.pool.capacity * bs} tokens) cannot hold one request of "
                f"{req.prompt + req.output - 1} tokens (vLLM refuses to start below max_model_len)",
                "raise it or shorten prompts/outputs",
            )
        req.d_node = self.idx
        self.submitted += 1
        now = self.env.now
        self.rows.append((now, EV_D_ENQUEUE, req.conv, req.turn, self.idx, 0, 0))
        self.prefill_nodes[req.p_node].d_tracks(req)  # on_new_request: D starts heartbeating P's lease
        self._admit_q.append(req)
        self._try_admit(now)

    def _local_hit(self, r: Request, tokens: int) -> tuple[int | None, tuple[int, int] | None, int, int]:
        """The conversation's KV still on this node: (pin id, cache entry taken out of the LRU, hit, owned blocks).

        A pin of the conversation (retained for its next turn) wins over a prefix-cache entry; the hit is
        capped below the last token (vLLM recomputes at least one token) and counted in full blocks.
        """
        if not self.caching:
            return None, None, 0, 0
        ret, pool, bs = self.retention, self.pool, self.bs
        pid = ret.of_conv.get(r.conv)
        entry = pool.take(r.conv)  # out of the cache: eviction cannot take it
        cap = ((tokens - 1) // bs) * bs
        cached = owned = 0
        if pid is not None:
            pin = ret.pins[pid]
            cached, owned = pin.tokens, pin.blocks
        elif entry is not None:
            cached, owned = entry
        hit = prefix_hit(cached, tokens, r.reuse, bs) if cached > 0 else 0  # as far as the prompt repeats it
        if self.shared is not None:  # a prefix shared with other conversations, already here (sim/shared.py)
            s_hit = self.shared.hit(r.conv, cap)
            if s_hit > hit:
                hit = s_hit
        if hit <= 0:
            hit = owned = 0
        return pid, entry, hit, owned

    def _try_admit(self, now: float) -> None:
        """Admit waiting requests in FCFS order while their current tokens fit (expired pins freed first); ``now``:
        the clock's time."""
        q = self._admit_q
        if not q or self.admission_held:
            return  # held: a preempting step is running, the batch resumes admission at its end
        if now >= self.retention.due_from:  # a filed deadline has passed (Retention.due_from)
            self._expire(now)
        batch = self.batch
        pool = self.pool
        # an upper bound of the batch's blocks is enough while nothing needs evicting
        synced = self.static + batch.fin_sum + pool.pinned + pool.cached > pool.capacity
        if synced:
            self._sync(batch.in_progress_step(now))
        else:
            pool.held = self.static + batch.fin_sum
        bs = self.bs
        admitted = False
        while q:
            if batch.batch >= self.max_seqs:
                # vLLM's waiting loop stops once ``len(self.running) == self.max_num_running_reqs`` (checked before a
                # request's remote-KV load is started, vllm/v1/core/sched/scheduler.py): a full batch starts no
                # allocation and no P->D read; a finish leaves the batch and retries (``finish``)
                break
            r = q[0]
            tokens = r.prompt + r.d_generated if r.d_resume else r.prompt
            total = -(-tokens // bs)
            pid, entry, hit, owned = self._local_hit(r, tokens)
            need = max(total - owned, 0)
            # a taken cache entry's blocks left the cached count but stay in use: they are not free
            # the watermark applies once other requests are scheduled (allocate_slots ``has_scheduled_reqs``)
            wm = self.watermark_blocks if (batch.batch or self.static) else 0
            want = need + wm + (owned if pid is None else 0)
            if pool.capacity - pool.held - pool.pinned - pool.cached < want:
                self._synced = synced
                if not reserve(pool, want, r.conv, entry, self, pid):  # not evicting the pin it is about to reuse
                    self._wake_admission_at_next_expiry()
                    break
                synced = self._synced
            q.popleft()
            self._inflight += 1
            if pid is not None and hit > 0:
                self._unpin(pid, REL_REUSED, now)  # its blocks now belong to the running request
            elif entry is not None and hit == 0:
                pool.to_cache(r.conv, entry[0])
            # it holds the blocks of its current tokens; taken blocks past them go back to the free pool
            self.static += total
            pool.held += total
            if not synced:
                pool.held = self.static + batch.fin_sum
            r.d_blocks = total
            pool.check()
            admitted = True
            if r.d_resume:
                self._recompute(r, tokens, hit)
            else:
                self.admitted += 1
                self.rows.append((now, EV_D_ADMIT, r.conv, r.turn, self.idx, hit, need))
                self._start_p2d(r, hit, now)
        if admitted:
            if self.static + batch.fin_sum + pool.pinned > self.used_peak:  # _note_used's bound, before the step
                self._note_used(batch.in_progress_step(now))
            batch.recheck(now)

    def before_evict(self, want: int) -> None:
        """The pool looks short: first bring the held count from its upper bound to the batch's true blocks."""
        if not self._synced:
            self._synced = True
            self._sync(self.batch.in_progress_step(self.env.now))

    def after_evict(self, want: int, keep: int | None) -> None:
        """Still short with the prefix cache gone: ``ttl_evictable`` releases pins (not ``keep``)."""
        if self.policy.evictable:
            self._evict_pins(want, keep)

    def _wake_admission_at_next_expiry(self) -> None:
        """The head waits for blocks only an expiry frees: retry admission at the next deadline, exactly.

        vLLM's engine keeps stepping while requests wait (``vllm/v1/engine/core.py``: ``has_requests()``), each
        step's ``schedule`` retries the waiting queue (``vllm/v1/core/sched/scheduler.py``), and an expired pin's
        blocks, reported in ``finished_sending``, are freed by ``_update_from_kv_xfer_finished`` before the next
        one. The wake must land on the deadline itself (``call_at``): one ulp early, nothing is due yet, and as
        a wake is already set for that deadline no other comes; the request would be lost when the run drains.
        """
        t = self.retention.next_expiry()
        if t is None:
            return  # blocks will come back when a running request finishes
        if t >= self._admit_wake_at and self._admit_wake_at > self.env.now:
            return
        self._admit_wake_at = t
        call_at(self.env, t, lambda _e: self._try_admit(self.env.now))  # exactly at the deadline: it is due there

    def _start_p2d(self, r: Request, hit: int, now: float) -> None:
        env = self.env
        tokens = r.prompt - hit
        pnode = self.prefill_nodes[r.p_node]
        if r.p_lapsed:
            # P's lease ran out and its blocks are gone: the read fails and D recomputes locally
            self.rows.append((now, EV_P2D_FAILED, r.conv, r.turn, self.idx, tokens, hit))
            t = prefill_time_s(self.costs.prefill, tokens, hit, self.chunk)
            call_later(env, t, lambda _e: self.batch.ready(r, r.prompt, 0))
            return
        if 0 < tokens < self.p2d_threshold:
            # newest vLLM (PR #55801): D recomputes a short tail instead of pulling it, and notifies P; the tail
            # is scheduled like any prompt chunk, in D's next (mixed) step, which samples its first token
            pnode.release_hold(r, HOLD_NOTIFIED)
            r.d_tail, r.d_tail_ctx = tokens, hit
            self.batch.ready(r, r.prompt, 0)
            return

        def done(xfer_s: float, _post_s: float) -> None:
            self.rows.append((env.now, EV_P2D_DONE, r.conv, r.turn, self.idx, xfer_s, 0))
            pnode.release_hold(r, HOLD_READ)  # P frees its blocks on the read's notification
            self.batch.ready(r, r.prompt, 0)

        reads = self.reads
        self.rows.append((now, EV_P2D_START, r.conv, r.turn, self.idx, tokens, reads.total_bytes(P2D, tokens)))
        self.batch.charge_thread(reads.start(r.p_node, self.idx, P2D, tokens, done))

    def _recompute(self, r: Request, tokens: int, hit: int) -> None:
        """A preempted request recomputes its prompt and sampled tokens on D (its P->D params are used up)."""
        env = self.env
        self.rows.append((env.now, EV_D_RECOMPUTE, r.conv, r.turn, self.idx, tokens - hit, hit))
        r.d_resume = False
        r.d_state = 1
        r.d_hit = hit
        self.running[r] = None
        epoch = r.d_epoch
        t = prefill_time_s(self.costs.prefill, tokens - hit, hit, self.chunk)
        call_later(env, t, lambda _e: self._recomputed(r, epoch))

    def _recomputed(self, r: Request, epoch: int) -> None:
        if epoch != r.d_epoch:
            return  # preempted while recomputing
        sampled = r.d_generated + 1  # the recompute's last chunk samples the next token
        now = self.env.now
        if not r.d_first_done:
            r.d_first_done = True
            self.rows.append((now, EV_D_FIRST, r.conv, r.turn, self.idx, 0, 0))
        else:  # the gap from its last token before the preemption
            if r.itl_extra is None:
                r.itl_extra = []
            r.itl_extra.append(self.batch.itl.gap(now - r.last_tok_t))
        r.last_tok_t = now
        if sampled >= r.output:
            self.finish(r, now)
        else:
            r.d_state = 2
            self.batch.ready(r, r.prompt + sampled, sampled)

    # ---- finish and retention ----------------------------------------------------------------------------

    def log_itl_hist(self) -> None:
        """End of run: the pooled inter-token gap counts of this engine (``Ev.ITL_HIST``, one row per bucket)."""
        log_pooled(self.rows, self.env.now, self.idx, self.batch.itl)

    def finish(self, r: Request, now: float) -> None:
        """The response is complete (at ``now``): its inter-token gaps are logged (``sim/itl.py``: median and
        maximum, one ``D_ITL`` row), its blocks pinned for the TTL (bidirectional) or left as cache."""
        rows = self.rows
        rows.append((now, EV_D_FINISH, r.conv, r.turn, self.idx, r.output, 0))
        if r.itl_spans is None and r.itl_extra is None and r.itl_in:  # one stay, no preemption
            p50, top = self.batch.itl.stats_since(r.itl_old, r.itl_skip)
            r.itl_in = False
            r.itl_old = None
        else:
            self.batch.close_stay(r)
            p50, top = turn_stats(r.itl_spans or [], r.itl_extra or [])
            r.itl_spans = r.itl_extra = None
        rows.append((now, EV_D_ITL, r.conv, r.turn, self.idx, p50, top))
        self.static -= r.d_blocks  # only a request that finished right after its recompute still has some
        r.d_blocks = 0
        self._inflight -= 1
        r.d_state = 0
        if r in self.running:
            del self.running[r]
        kv_tokens = r.prompt + r.output - 1  # the last sampled token never gets KV
        if self.shared is not None:
            self.shared.see(r.conv)
        if self.bidirectional:
            left = new = 0
            if self.shared is not None:  # shared blocks are pinned once per group, not in this pin's blocks
                left, new = self._pin_shared(r, kv_tokens)
            blocks = -(-(kv_tokens - left) // self.bs)
            expiry = self.policy.expiry_at_finish(r.conv, r.index, now)
            pid, old = self.retention.add(r.conv, kv_tokens, blocks, expiry, left)
            if old is not None:  # cannot happen with single-use routing; keep the accounting exact anyway
                self._unpin(old, REL_EXPIRED, now)
            self.pool.pinned += blocks
            rows.append((now, EV_PIN, r.conv, r.turn, self.idx, kv_tokens - left + new, expiry))
            if not r.last:  # the conversation's last lookup is behind it: an entry would never be read
                self.router.store(r.conv, KVParams(self.idx, kv_tokens, expiry, now, pid))
        else:
            self.pool.to_cache(r.conv, kv_tokens)
        d = self._drv
        (d if d is not None else self._driver()).d_done(r)
        if self._admit_q:
            self._try_admit(now)
