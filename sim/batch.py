"""D's continuous decode batch, advanced by event jumps between batch changes.

Sources (vLLM): ``vllm/v1/core/sched/scheduler.py`` (running requests are scheduled first, one token
each per step; requests whose remote KV has arrived join at the next step while
``len(running) < max_num_seqs``; ``_update_waiting_for_remote_kv`` backs a full-prompt hit off by one
token, so the first token costs one forward step).

Speed: between batch changes the step times form an arithmetic series (each step adds one token per
sequence), so the batch jumps to the next finish with one timeout and, when a request joins
mid-stretch, cuts the stretch at the boundary of the step in progress. ``exact=True`` schedules every
step instead; tests show both give the same per-turn times.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Callable

import simpy

from kvplan.models.costs import DecodeCost
from kvplan.sim.context import Request
from kvplan.sim.events import Ev


class DecodeBatch:
    """The running set of one decode engine and its step clock."""

    def __init__(
        self,
        env: simpy.Environment,
        log: list,
        node: int,
        cost: DecodeCost,
        max_seqs: int,
        exact: bool,
        on_finish: Callable[[Request], None],
    ) -> None:
        self.env = env
        self.log = log
        self.node = node
        self.max_seqs = max_seqs
        self.exact = exact
        self.on_finish = on_finish
        self._a, self._b, self._c = cost.fixed_s, cost.per_seq_s, cost.per_context_token_s
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

    def ready(self, r: Request) -> None:
        """The request's KV is in place: it joins at the next step boundary."""
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
            self.on_finish(r)
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
            log = self.log
            for r in joined:
                log.append((t_first, Ev.D_FIRST, r.conv, r.turn, self.node, 0, 0))
        n = 1 if self.exact else self._finish_heap[0][0] - self.step
        self._schedule(n)
