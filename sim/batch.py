"""D's continuous decode batch: per-step KV block growth, advanced by event jumps between batch changes.

Sources (vLLM): ``vllm/v1/core/sched/scheduler.py`` ``schedule`` (running requests first, one token each
per step, each calling ``kv_cache_manager.allocate_slots`` for ``num_computed_tokens + 1`` slots, so a
request takes a new block every ``block_size`` steps; when a running request cannot get its block the
newest running request is preempted, ``self.running.pop()``, until it fits; waiting requests are only
scheduled in a step without preemption (a preempting step ends its stretch: joiners and the owner's
admission, held meanwhile, get the next boundary) and join while ``len(running) < max_num_seqs``;
``_update_waiting_for_remote_kv`` backs a full-prompt hit off by one token, so the first token costs one
forward step).

Blocks are not counted per token: member ``i`` (virtual prompt ``p``, joined at step ``j``) holds
``ceil((p + S - j) / block)`` blocks during step ``S``. With ``x = p - j + block - 1 = q * block + r`` that
is ``q + S // block + [r + S % block >= block]``, so the batch total is ``sum(q) + n * (S // block)`` plus
a count over a residue histogram (``block`` entries): O(block) per query, whatever the batch size.

Speed: between batch changes the step times form an arithmetic series (each step adds one token per
sequence), so the batch jumps to the next finish, or to the first step at which the pool cannot hold the
batch's growth (found by bisection on the closed form), with one timeout; a request joining mid-stretch
cuts the stretch at the boundary of the step in progress. ``exact=True`` schedules every step instead;
tests show both give the same per-turn times, preemptions included.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Final

from kvplan.models.costs import (
    DecodeCost,
    PrefillCost,
    causal_pairs,
    mixed_step_time_s,
    steps_within,
)
from kvplan.models.formulas import DecodeSteps
from kvplan.sim.blocks import BlockPool
from kvplan.sim.clock import SimEnv, Wake, call_later, i64, sorted_pop, sorted_push
from kvplan.sim.evlog import EV_D_FIRST, RowBuffer
from kvplan.sim.fifo import Fifo, new_fifo
from kvplan.sim.itl import KEY_MIN, KEY_SPAN, LOG_GAMMA, ItlTracker, bucket_key
from kvplan.sim.peers import DecodePort
from kvplan.sim.request import Request

_COMPILED: Final = not __file__.endswith(".py")  # see sim/clock.py


class BatchOwner(DecodePort):
    """What the batch needs from its node (``DecodeNode`` subclasses it, a decode engine: sim/peers.py): finishing,
    fitting the pool, and the room left for growth.

    A base class, not a ``Protocol``: compiled (sim/native.py), the batch's calls into its node are native method
    calls and its reads of ``pool``, ``static`` and ``admission_held`` field reads (through a Protocol each is a
    lookup by name and a generic call). :class:`LoneOwner` is the owner of a batch run on its own."""

    pool: BlockPool
    static: int  # blocks of admitted requests outside the batch
    admission_held: bool  # the step in progress preempted: the owner admits nothing until it ends

    def finish(self, r: Request, now: float) -> None:
        """The request sampled its last token (at ``now``)."""
        raise NotImplementedError

    def fit(self, step: int, now: float) -> bool:
        """Make the batch's blocks for ``step`` fit at ``now`` (evicting, then preempting the newest); True if it
        preempted."""
        raise NotImplementedError

    def joined(self, r: Request) -> None:
        """The request's admitted blocks now grow with the batch."""
        raise NotImplementedError

    def grown(self, step: int) -> None:
        """The members held their blocks for ``step``: apply the evictions that growth caused."""
        raise NotImplementedError

    def resume_admission(self) -> None:
        """The step that held admission is over (and the one starting preempted nothing): admit now."""
        raise NotImplementedError


class LoneOwner(BatchOwner):
    """The owner of a batch on its own (unit tests): ``pool``, ``on_finish(r)`` at each finish and
    ``on_fit(step) -> preempted`` at each step boundary (None: nothing is ever preempted)."""

    def __init__(self, pool: BlockPool, on_finish: Callable[[Request], None],
                 on_fit: Callable[[int], bool] | None = None) -> None:
        self.pool = pool
        self.static = 0
        self.admission_held = False
        self.on_finish = on_finish
        self.on_fit = on_fit

    def finish(self, r: Request, now: float) -> None:
        """Report the finish."""
        self.on_finish(r)

    def fit(self, step: int, now: float) -> bool:
        """Ask ``on_fit`` (never preempts without it)."""
        return self.on_fit(step) if self.on_fit is not None else False

    def joined(self, r: Request) -> None:
        """Nothing to account."""

    def grown(self, step: int) -> None:
        """Nothing to evict."""

    def resume_admission(self) -> None:
        """Nothing waits."""


class DecodeBatch:
    """The running batch of one decode engine (member counts, finish order, block residues), its step clock and its
    block growth."""

    def __init__(
        self, env: SimEnv, log: RowBuffer, node: int, cost: DecodeCost, max_seqs: int, exact: bool,
        block_size: int, owner: BatchOwner,
    ) -> None:
        self.env = env
        self.log = log
        self.node = node
        self.max_seqs = max_seqs
        self.exact = exact
        self.bs = block_size
        self.owner = owner
        self._dc = cost
        self._steps = DecodeSteps(cost, max_seqs)  # step time and increment per batch size (formulas.py)
        self._join_q: Fifo[Request] = new_fifo()  # sim/fifo.py
        self.step = 0  # steps completed
        self.batch = 0
        self.ctx_sum = 0.0
        self._q_sum = 0
        self._res = [0] * block_size
        self.fin_sum = 0  # blocks the members will hold at their last step
        self._finish_heap: list[tuple[float, int, Request]] = []  # (last step as a float: clock.sorted_push, seq, r)
        self._seq = 0
        self._active = False
        self._gen = 0  # plans made (a stretch's plan is cached per (time, plan): in_progress_step)
        self._timer: Wake | None = None  # the pending boundary wake-up (an earlier one is superseded)
        self._on_timer: Callable[[object], None] = self._on_boundary  # bound once: no closure per wake-up
        self._plan_t0 = 0.0
        self._plan_n = 0
        self._plan_first = 0.0
        self._plan_inc = 0.0
        self._ips_t = -1.0  # (time, plan) of the cached in-progress step
        self._ips_gen = -1
        self._base = 0  # step at the start of the current (or just-ended) stretch
        self._last_n = 0  # its length in steps
        self._ips = 0
        self.itl = ItlTracker()  # the engine's step durations, for the inter-token gaps (sim/itl.py)
        self.pc: PrefillCost | None = None  # the node's prefill cost: prompt chunks in a step (short P->D tails)
        self.async_scheduling = False  # vLLM async scheduling: a joiner ready during a step joins one step later
        self._last_step_start = -math.inf  # start of the last step of the stretch that just ended (async only)
        self._key0 = 0  # the gap bucket of the current stretch's first step
        self._delay = 0.0  # how long the current stretch's first step waited for the engine thread
        self._thread_pending = 0.0  # engine-thread work posted mid-stretch: done during step ``_pending_step``
        self._pending_step = -1
        self.thread_free_s = 0.0  # the engine thread is busy until then
        # the health section's decode_engine_thread: thread_post_s the posting work charged (hidden or not);
        # thread_busy_s that plus, with post_serial, the forward of each step the posting ran before
        self.thread_post_s = 0.0
        self.thread_busy_s = 0.0
        # deployment.kv_post_overlaps_forward false: the posting runs before the step's forward is launched
        self.post_serial = False

    # ---- block growth ------------------------------------------------------------------------------------

    def alloc(self, s: int) -> int:
        """Blocks the members hold during step ``s`` (closed form)."""
        bs = self.bs
        lo: i64 = bs - s % bs  # i64 (mypyc's native int): the list is read by a C index (see sim/clock.py _fpush)
        if _COMPILED:
            res = self._res
            extra = 0
            hi: i64 = bs
            for i in range(lo, hi):  # the residues that took a block more (compiled: a C loop, no slice)
                extra += res[i]
        else:  # interpreted: a slice and its sum in C, not a loop in bytecode
            extra = sum(self._res[lo:])
        return self._q_sum + self.batch * (s // bs) + extra

    def in_progress_step(self, now: float) -> int:
        """Index of the step running at ``now`` (the clock's time; its blocks are allocated); ``step`` when idle."""
        if not self._active or self._plan_n <= 1:
            return self.step
        if now == self._ips_t and self._gen == self._ips_gen:
            return self._ips
        self._ips_t = now
        self._ips_gen = self._gen
        e = now - self._plan_t0
        done = steps_within(e, self._plan_first, self._plan_inc) if e > 0 else 0  # steps completed in the stretch
        last = self._plan_n - 1
        self._ips = self.step + (done if done < last else last)
        return self._ips

    def step_at(self, t: float) -> int:
        """Index of the step that was running at time ``t`` (at most now) in the current or just-ended stretch."""
        n = self._last_n
        if not n or t <= self._plan_t0:
            return self._base
        return self._base + min(steps_within(t - self._plan_t0, self._plan_first, self._plan_inc), n - 1)

    def _add(self, r: Request, p: int, g0: int, rem: int) -> None:
        """Member with virtual prompt ``p`` (tokens attended by its next step), ``g0`` tokens already sampled."""
        bs = self.bs
        r.d_p, r.d_j, r.d_g0 = p, self.step, g0
        x = p - self.step + bs - 1
        q = x // bs  # = divmod (compiled: native integer operations, no generic call and tuple)
        res = x % bs
        self._q_sum += q
        resl = self._res  # an int read and write (compiled: ``l[j] += 1`` is a generic in-place add)
        resl[res] = resl[res] + 1
        self.fin_sum += -(-(p + rem - 1) // bs)
        self.batch += 1
        self.ctx_sum += p
        self._seq += 1
        r.d_seq = self._seq
        r.d_rem = rem
        self.owner.joined(r)
        sorted_push(self._finish_heap, (float(self.step + rem), self._seq, r))

    def _remove(self, r: Request) -> int:
        """Drop a member; returns the steps it completed in this stay."""
        bs = self.bs
        x = r.d_p - r.d_j + bs - 1
        q = x // bs
        res = x % bs
        self._q_sum -= q
        resl = self._res
        resl[res] = resl[res] - 1
        self.fin_sum -= -(-(r.d_p + r.d_rem - 1) // bs)
        self.batch -= 1
        done = self.step - r.d_j
        self.ctx_sum -= r.d_p + done
        r.d_seq = -1  # its finish-heap entry is stale now
        return done

    def preempt(self, r: Request) -> int:
        """Take a member out (preempted); returns the tokens it has sampled."""
        done = self._remove(r)
        self.close_stay(r)
        if done > 0:
            r.last_tok_t = self.env.now  # its last step ended now
        return r.d_g0 + done

    def close_stay(self, r: Request) -> None:
        """The request leaves the batch: keep the step histogram of its stay (``sim/itl.py``)."""
        if r.itl_in:
            if r.itl_spans is None:
                r.itl_spans = []
            r.itl_spans.append((r.itl_old, self.itl.snapshot(), r.itl_skip))
            r.itl_in = False
            r.itl_old = None

    def drop_joiner(self, r: Request) -> None:
        """A request waiting to join is preempted before it joined."""
        self._join_q.remove(r)

    # ---- stepping ----------------------------------------------------------------------------------------

    def charge_thread(self, work_s: float) -> None:
        """CPU work on the engine thread (posting a P->D read, ``sim/xfer.py``).

        vLLM runs it in ``start_load_kv`` at the start of the next step, overlapped with its forward (PR #53333),
        so that step ends when both are done. Work posted mid-stretch runs during the next step; only when it
        outlasts that step is the stretch cut there (otherwise it is hidden and the timing unchanged). Work
        posted at a step boundary (a read admitted by a finish there: ``schedule()`` admits it into the step
        starting there) runs during that step, priced in ``_thread_delay``. An idle engine does it at once, in
        an empty step: the next step starts after it. Simplification: a read posted mid-stretch whose work
        alone is shorter than a step is taken as hidden without adding it to other reads posted for the same
        step. With ``post_serial``
        (``deployment.kv_post_overlaps_forward: false``, vLLM before PR #53333: ``execute_model`` calls
        ``start_load_kv`` before it launches the forward) nothing is hidden: that step lasts the work plus its
        forward.
        """
        if work_s <= 0.0:
            return
        self.thread_post_s += work_s
        self.thread_busy_s += work_s
        if not self._active:
            now = self.env.now
            self.thread_free_s = (self.thread_free_s if self.thread_free_s > now else now) + work_s
            return
        if self._plan_n == 0:  # at a step boundary, between stretches: it runs during the step starting now
            if self._pending_step != self.step:
                self._pending_step = self.step
                self._thread_pending = 0.0
            self._thread_pending += work_s  # ``_thread_delay`` prices it against that step's forward
            return
        serial = self.post_serial
        nxt = self.in_progress_step(self.env.now) + 1  # the step during which this work runs
        if (not serial and self._thread_pending == 0.0 and work_s <= self._plan_first
                and nxt - self.step < self._plan_n):
            return  # hidden by the next step's forward, inside this stretch: it lasts at least the stretch's first step
        if nxt != self._pending_step:  # what was posted for an earlier step was hidden by it
            self._pending_step = nxt
            self._thread_pending = 0.0
        self._thread_pending += work_s
        i = nxt - self.step  # that step's index in the current stretch
        if 0 < i < self._plan_n and (serial or self._thread_pending > self._plan_first + self._plan_inc * i):
            self._cut_at_next_boundary(self.env.now)

    def ready(self, r: Request, p: int, g0: int) -> None:
        """The request's KV is in place: it joins at the next step boundary (``g0`` tokens sampled so far), or with
        async scheduling (vLLM PR #19970) at the one after when a step is running (that step's successor was
        planned when it started)."""
        r.d_p, r.d_g0 = p, g0
        self._join_q.append(r)
        if not self._active:
            r.wait_t = -math.inf
            self._active = True
            self._boundary(self.env.now)
        else:
            now = r.wait_t = self.env.now
            if self._plan_n > 1:
                self._cut_at_next_boundary(now)

    def recheck(self, now: float) -> None:
        """The room for growth shrank mid-stretch (an admission at ``now``): end the stretch where the pool runs
        out."""
        if not self._active or self.exact:
            return
        owner = self.owner
        if self.fin_sum <= owner.pool.capacity - owner.pool.pinned - owner.static:
            return
        s0 = self.in_progress_step(now)
        end = self.step + self._plan_n
        h = self._horizon(s0 + 1, end)
        if h < end:
            self._schedule(h - self.step, now)

    def _horizon(self, lo: int, end: int) -> int:
        """First step in ``[lo, end)`` whose blocks exceed the room, else ``end``.

        The room is the pool less pins and the blocks of admitted requests outside the batch (prefix cache is
        evictable); ttl_evictable pins count too, so a stretch ends at the step whose growth reaches them and
        the owner's ``fit`` evicts them there, before preempting anything.
        """
        owner = self.owner
        pool = owner.pool
        room = pool.capacity - pool.pinned - owner.static
        if self.fin_sum <= room or lo >= end or self.alloc(end - 1) <= room:
            return end
        hi = end - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.alloc(mid) > room:
                hi = mid
            else:
                lo = mid + 1
        return lo

    def _cut_at_next_boundary(self, now: float) -> None:
        """A request joined mid-stretch: end the stretch at the boundary of the step in progress."""
        e = now - self._plan_t0
        cut = (steps_within(e, self._plan_first, self._plan_inc) if e > 0 else 0) + 1  # the step in progress ends at
        if cut >= self._plan_n:  # boundary k + 1 (k: the steps completed in the stretch)
            return
        self._schedule(cut, now)

    def _schedule(self, n: int, now: float) -> None:
        """Plan the stretch's end after its ``n``-th step (``k`` steps take ``k first + inc k (k - 1) / 2``)."""
        self._gen += 1
        self._plan_n = n
        self._base = self.step
        self._last_n = n
        dt = self._plan_t0 + (n * self._plan_first + self._plan_inc * n * (n - 1) / 2) - now
        self._timer = call_later(self.env, dt if dt > 0.0 else 0.0, self._on_timer)

    def _on_boundary(self, e: object) -> None:
        if e is not self._timer:
            return  # superseded: the stretch was cut or re-planned since
        n = self._plan_n  # the stretch's length (set with the timer, changed only by a later plan or here)
        now = self.env.now
        step = self.step + n
        self.step = step
        self._plan_n = 0  # the stretch is over: until re-planned, the step in progress is ``step``
        itl, first, inc, b = self.itl, self._plan_first, self._plan_inc, self.batch
        m = n - 1
        if self.async_scheduling:  # its last step's start: the joiners' cutoff (_boundary)
            self._last_step_start = self._plan_t0 + (m * first + inc * m * (m - 1) / 2)
        if self._delay > 0.0:  # the first step waited for the engine thread: a longer first gap
            itl.add(first + self._delay, 0.0, 1, b, self._key0)
            if n > 1:
                itl.add(first + inc, inc, m, b, bucket_key(first + inc))
        else:
            itl.add(first, inc, n, b, self._key0)  # each step a gap for every member
        self.ctx_sum += b * n
        heap = self._finish_heap
        if heap and heap[0][0] <= step:
            owner = self.owner
            owner.grown(step - 1)  # the growth of the last step took its blocks before anyone leaves
            while heap and heap[0][0] <= step:
                entry: tuple[float, int, Request] = sorted_pop(heap)  # typed: native reads of the request
                r = entry[2]
                if r.d_seq != entry[1]:
                    continue  # preempted since
                self._remove(r)
                owner.finish(r, now)
        self._boundary(now)

    def _tail_extra(self, joined: list[Request], first: float) -> float:
        """How much longer the first step is for the joiners' short prompt tails (vLLM PR #55801).

        vLLM schedules a tail like any prompt chunk: the step mixes it with the batch's decode tokens
        (``mixed_step_time_s``) and samples the joiner's first token; the extra time delays every member.
        """
        n_tail = 0
        pairs = 0.0
        ctx_pairs = 0.0
        for r in joined:
            if r.d_tail > 0:
                if r.d_seq > 0:
                    n, c = r.d_tail, r.d_tail_ctx
                    n_tail += n
                    pairs += causal_pairs(n, c)
                    ctx_pairs += n * c
                r.d_tail = 0
        if n_tail == 0 or self.pc is None:
            return 0.0
        mixed = mixed_step_time_s(self.pc, self._dc, n_tail, pairs, self.batch, self.ctx_sum, ctx_pairs)
        return mixed - first if mixed > first else 0.0

    def _thread_delay(self, now: float, first: float, extra: float) -> float:
        """How long the next stretch's first step takes beyond a decode step: ``extra`` (prompt chunks in it)
        or the wait for the engine thread, whichever is longer.

        The step's forward overlaps the thread work posted for it (PR #53333): it ends when both are done; with
        ``post_serial`` the forward starts when the thread is free (the posting ran before it was launched).
        Work posted while the engine was idle ran in an empty step before this one (a step with no tokens still
        posts its loads: ``execute_model`` -> ``kv_connector_no_forward``,
        ``vllm/v1/worker/kv_connector_model_runner_mixin.py``), so this step starts only when the thread is
        free, whatever ``post_serial``. After a stretch the thread is never
        busy past its end (a step ends no earlier than the work posted for it): only an idle engine waits.
        """
        free = self.thread_free_s
        wait = free - now if self._last_n == 0 else 0.0  # the engine was idle: its empty steps did that work
        if self._thread_pending > 0.0:
            if self._pending_step == self.step:  # posted for this step: it runs beside its forward
                free = (free if free > now else now) + self._thread_pending
                self.thread_free_s = free
                if self.post_serial:
                    self.thread_busy_s += first + extra  # its forward runs after that posting, on the thread
            self._thread_pending = 0.0
        if self.post_serial:
            delay = free - now
            delay = (delay if delay > 0.0 else 0.0) + extra
        else:
            delay = free - now - first
            wait = (wait if wait > 0.0 else 0.0) + extra  # the forward starts once the empty step's work is done
            if delay < wait:
                delay = wait
        self._delay = delay if delay > 0.0 else 0.0
        return self._delay

    def _first_steps(self, joined: list[Request], t_first: float, key0: int) -> None:
        """The joiners' first step in the batch: first token (``D_FIRST``) or a resumed one's gap, ITL stays."""
        itl = self.itl
        log = self.log
        members = 0
        root = itl.snapshot()  # the joiners' stays start here (kept until they leave)
        for r in joined:
            if r.d_seq <= 0:
                continue  # preempted again before its first step
            members += 1
            r.itl_old, r.itl_skip, r.itl_in = root, key0, True
            if r.d_g0 > 0:  # resumed: its gap runs from the token its recompute sampled
                if r.itl_extra is None:
                    r.itl_extra = []
                r.itl_extra.append(itl.gap(t_first - r.last_tok_t))
            elif not r.d_first_done:
                r.d_first_done = True
                log.append((t_first, EV_D_FIRST, r.conv, r.turn, self.node, 0, 0))
        itl.unpool(key0, members)  # the stretch's first step is no gap for those joining with it

    def _idle(self, now: float) -> None:
        """The batch is empty at a boundary: the engine idles, unless requests wait to join (or be admitted)."""
        if self._thread_pending > 0.0 and self._pending_step == self.step:  # going idle: the thread does it now
            self.thread_free_s = (self.thread_free_s if self.thread_free_s > now else now) + self._thread_pending
        self._thread_pending = 0.0
        self._active = False
        self._last_n = 0
        self._base = self.step
        if self._join_q or self.owner.admission_held:  # all preempted, others wait: the next (empty) step takes them
            self._active = True
            self._boundary(now)

    def _boundary(self, now: float) -> None:
        """At a step boundary (``now``): grow (preempting if needed), admit joiners, plan the next stretch."""
        owner = self.owner
        step = self.step  # nothing below moves it
        preempted = owner.fit(step, now) if self.batch else False
        joined: list[Request] = []
        # async scheduling: only joiners ready before the ended step started were in this step's plan (an
        # empty batch plans at once)
        cutoff = self._last_step_start if self.async_scheduling and self.batch else math.inf
        late = False
        tails = False  # a joiner has a short prompt tail to compute in its first step (_tail_extra)
        if not preempted or self.batch == 0:  # an empty step after a preemption costs nothing: join now
            if owner.admission_held:  # the waiting loop a preempting step skipped runs in this step
                owner.resume_admission()
            jq = self._join_q
            while jq and self.batch < self.max_seqs:
                if jq[0].wait_t > cutoff:
                    late = True
                    break
                r = jq.popleft()
                self._add(r, r.d_p, r.d_g0, r.output - r.d_g0)
                joined.append(r)
                if r.d_tail > 0:
                    tails = True
            if joined:
                owner.fit(step, now)  # a resumed joiner may need one block more than it was admitted with
        b = self.batch
        if b == 0:
            self._idle(now)
            return
        steps = self._steps  # the one composition of a step's time (formulas.py)
        self._plan_first = first = steps.step_time_s(b, self.ctx_sum)
        self._plan_inc = steps.increment_s(b)
        extra = self._tail_extra(joined, first) if tails else 0.0
        if self._thread_pending > 0.0 or self._last_n == 0 or self.post_serial:
            delay = self._thread_delay(now, first, extra)
        else:  # _thread_delay after a stretch with nothing posted for this step (the usual boundary), written out
            delay = self.thread_free_s - now - first
            if delay < extra:
                delay = extra
            delay = self._delay = delay if delay > 0.0 else 0.0
        t0 = self._plan_t0 = now + delay
        k = math.ceil(math.log(first + delay) / LOG_GAMMA)  # bucket_key, inlined (once per stretch)
        key0 = self._key0 = k if KEY_MIN <= k < KEY_MIN + KEY_SPAN else bucket_key(first + delay)
        if joined:
            self._first_steps(joined, t0 + first, key0)  # the first step containing them ends at t0 + first
        heap = self._finish_heap
        while heap[0][2].d_seq != heap[0][1]:
            sorted_pop(heap)
        end = int(heap[0][0])
        if self.exact or late or (preempted and self._join_q) or owner.admission_held:
            # a late joiner joins at the next boundary; so does one a preempting step kept out, and the owner admits
            # there (vLLM schedules no waiting request in a step that preempted, and takes it in the next:
            # vllm/v1/core/sched/scheduler.py)
            n = 1
        else:
            pool = owner.pool
            lo = step + 1
            if self.fin_sum <= pool.capacity - pool.pinned - owner.static or lo >= end:  # _horizon's first test
                n = end - step
            else:
                n = self._horizon(lo, end) - step
        self._schedule(n, now)
