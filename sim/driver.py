"""The driver: sends every turn through the router, the P leg and the D leg; an :class:`ArrivalSource` per mode.

Per turn (``disagg_proxy_multiturn.py``): the router lookup and P choice at arrival, the P leg
(``max_tokens=1``) after the proxy/HTTP overhead, the D leg strictly after P after its overhead. *When* a
turn arrives is the arrival source's job, one class per mode:

* :class:`OpenLoop`: conversations start at their drawn start times (Poisson); each next turn arrives one
  turn gap after the previous response ends.
* :class:`TraceReplay`: every request at its own time on the trace's clock, independent of responses.
* :class:`ClosedLoop`: ``clients`` clients, each cycling round-robin over at most
  ``max_active_conversations / clients`` active conversations and sending the next turn one think time
  after the previous response (vLLM ``benchmarks/multi_turn/benchmark_serving_multi_turn.py``).

With ``deployment.handoff`` (a non-vLLM stack's serialised transfer stage, :mod:`kvplan.sim.scenario_handoff`;
off by default) the D leg waits, after its overhead, for the stage of the chosen D: FCFS one request at a time
when serialised. The stage is deterministic per request and FCFS, so it is a ``free at`` time per D instance
and one timeout per request (no queue object).

Everything is callbacks, no generator per turn (this is the hot path). The proxy's overhead before P is
folded into the timeout that ends the gap (one event, not two); the lookup is evaluated with the true
arrival time, so nothing changes but the event count.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import cast

import numpy as np

from kvplan.sim.clock import call_later, call_later_far
from kvplan.sim.evlog import EV_ARRIVE, EV_ROUTER, RowBuffer
from kvplan.sim.node_config import DriverConfig
from kvplan.sim.peers import DecodePort, DriverPort, PrefillPort
from kvplan.sim.ports import Wiring
from kvplan.sim.request import Request
from kvplan.sim.router import Router
from kvplan.sim.scenario import ClosedLoopArrival
from kvplan.sim.workload import ConversationPlan


def _view(a: np.ndarray, dtype: type[np.generic]) -> memoryview:
    """A memoryview of ``a`` as a contiguous ``dtype`` array (no copy when it is one): indexing it returns a Python
    int/float, and ``len`` and slicing work as on a list. Callers type it ``Sequence[int]`` / ``Sequence[float]``
    (the compiled build checks the items against that; typeshed calls every memoryview item an int)."""
    return np.ascontiguousarray(a, dtype=dtype).data


class ArrivalSource:
    """When turns arrive: started once, told when a turn reaches P and when a turn is over.

    A base class (each mode's source subclasses it), not a Protocol: compiled, the driver's two calls per turn are
    native method calls."""

    def start(self) -> None:
        """Schedule the first arrivals."""
        raise NotImplementedError

    def reached_p(self, c: int, i: int) -> None:
        """Request ``i`` of conversation ``c`` has just reached P (after the proxy overhead)."""
        raise NotImplementedError

    def turn_over(self, c: int, i: int) -> None:
        """Request ``i`` of conversation ``c`` is finished (response done, or failed)."""
        raise NotImplementedError


class Driver(DriverPort):
    """Sends turns to P then D and hands their timing to an :class:`ArrivalSource`."""

    def __init__(
        self, ctx: Wiring, cfg: DriverConfig, plan: ConversationPlan, closed_loop: ClosedLoopArrival | None
    ) -> None:
        self.ctx = ctx
        self.router: Router = ctx.router  # typed: direct calls (compiled), no lookup on the run state per turn
        # the run's engines (sim/peers.py: native calls), typed lists, not Wiring's Sequences: compiled, an index into a
        # list is a native read, into a Sequence a generic call
        self.prefill_nodes = cast(list[PrefillPort], ctx.prefill)
        self.decode_nodes = cast(list[DecodePort], ctx.decode)
        self.rows: RowBuffer = ctx.log.buf  # the event log's packed rows (sim/evlog.py)
        self.env = ctx.env
        self.plan = plan
        self.p_leg = cfg.p_leg_s
        self.d_leg = cfg.d_leg_s
        self.send_id = cfg.send_conversation_id
        self.handoff = cfg.handoff
        self.handoff_fixed_s = cfg.handoff_fixed_s
        self.handoff_per_token_s = cfg.handoff_per_token_s
        self.handoff_serialised = cfg.handoff_serialised
        self.handoff_free_at: list[float] = [0.0] * cfg.n_decode  # per D: stage free from
        # arrivals due now that came while another was reaching P (simultaneous starts chain through reached_p): taken
        # in order after it, not by a call inside it (see arrive_at)
        self._due: deque[tuple[int, int, float]] = deque()
        self._arriving = False
        # zero-copy views of the plan's arrays: indexing gives Python ints/floats at 0 extra bytes per turn (a list
        # of Python objects cost ~36 bytes per element and turn, ~100 bytes per turn for the three, issue 12)
        # per conversation, read several times per turn: a list (compiled, a native read; an index into a memoryview
        # is a generic call that boxes the item), one int per conversation
        self.offsets: list[int] = np.asarray(plan.offsets, dtype=np.int64).tolist()
        self.prompt: Sequence[int] = _view(plan.prompt_tokens, np.int64)
        self.output: Sequence[int] = _view(plan.output_tokens, np.int64)
        self.gap: Sequence[float] = _view(plan.gap_s, np.float64)
        # per turn: tokens of the previous context the prompt repeats (None: all of it, verbatim history)
        self.reuse: Sequence[int] | None = None if plan.reuse_tokens is None else _view(plan.reuse_tokens, np.int64)
        self.source: ArrivalSource
        # per conversation: its request whose router lookup comes last (None: its last planned turn, as the
        # open and closed loops send a conversation's turns one after the other)
        self.last_request: Sequence[int] | None = None
        if plan.arrival_s is not None:  # a trace brings its own clock
            trace = TraceReplay(self, plan.arrival_s)
            self.source = trace
            self.last_request = trace.last_request(len(plan.turns))
        elif closed_loop is not None:
            self.source = ClosedLoop(self, closed_loop)
        else:
            self.source = OpenLoop(self)

    def start(self) -> None:
        """Schedule the first arrivals (open loop, trace) or start the clients (closed loop)."""
        self.source.start()

    def arrive_at(self, c: int, i: int, t_arrival: float) -> None:
        """Request ``i`` of conversation ``c`` arrives at ``t_arrival`` (now or later).

        One due now while another request is reaching P (the sources chain the next start or trace request from
        ``reached_p``, so simultaneous arrivals come one inside the other) waits its turn: it reaches P right after
        the current one, in arrival order. Called inside, it reached P first (the last of N simultaneous arrivals
        was submitted first) and N of them nested N calls deep: a trace of 400 sessions starting together ended
        in a RecursionError, 20,000 in a segmentation fault of the compiled build."""
        env = self.env
        delay = t_arrival - env.now + self.p_leg
        if delay > 0:
            call_later_far(env, delay, lambda _e: self._reach(c, i, t_arrival))  # a turn gap away, mostly
        else:
            self._reach(c, i, t_arrival)

    def _reach(self, c: int, i: int, t_arrival: float) -> None:
        """The request reaches P now, or right after the one reaching P now (:meth:`arrive_at`)."""
        if self._arriving:
            self._due.append((c, i, t_arrival))
            return
        self._arriving = True
        try:
            self._at_p(c, i, t_arrival)
            due = self._due
            while due:
                nxt = due.popleft()
                self._at_p(nxt[0], nxt[1], nxt[2])
        finally:
            self._arriving = False

    def _at_p(self, c: int, i: int, t_arrival: float) -> None:
        self.source.reached_p(c, i)
        turn = i - self.offsets[c] + 1
        prompt = self.prompt[i]
        output = self.output[i]
        log = self.rows
        log.append((t_arrival, EV_ARRIVE, c, turn, -1, prompt, output))
        res, params = self.router.lookup(c, t_arrival, self.send_id)
        log.append((t_arrival, EV_ROUTER, c, turn, -1, res, 0))
        r = Request(c, turn, i, prompt, output, params)
        if self.reuse is not None:
            r.reuse = self.reuse[i]
        last = self.last_request
        r.last = i + 1 == self.offsets[c + 1] if last is None else i == last[c]
        self._submit(r)

    def _submit(self, r: Request) -> None:
        """The P leg reaches the chosen P's engine (aggregated mode overrides it: the chosen replica)."""
        self.prefill_nodes[self.router.pick_prefill(r.conv)].submit(r)

    def p_done(self, r: Request) -> None:
        """P leg finished (or failed): start the D leg after its overhead, or move on."""
        if r.error:
            self.source.turn_over(r.conv, r.index)
            return
        if self.d_leg > 0:
            call_later(self.env, self.d_leg, lambda _e: self._at_d(r))
        else:
            self._at_d(r)

    def _at_d(self, r: Request) -> None:
        d = self.router.pick_decode(r.conv)
        if self.handoff:
            self._handoff(r, d)
        else:
            self.decode_nodes[d].submit(r)

    def _handoff(self, r: Request, d: int) -> None:
        """The handoff stage of D ``d`` (FCFS, one at a time when serialised), then D."""
        env = self.env
        now = env.now
        start = now
        cost = self.handoff_fixed_s + r.prompt * self.handoff_per_token_s
        if self.handoff_serialised:
            start = max(now, self.handoff_free_at[d])
            self.handoff_free_at[d] = start + cost
        node = self.decode_nodes[d]
        delay = start + cost - now
        if delay > 0:
            call_later(env, delay, lambda _e: node.submit(r))
        else:
            node.submit(r)

    def d_done(self, r: Request) -> None:
        """D finished the response: the turn is over."""
        self.source.turn_over(r.conv, r.index)


class OpenLoop(ArrivalSource):
    """Conversations start at ``plan.start_s``; a follow-up arrives one turn gap after the response."""

    def __init__(self, driver: Driver) -> None:
        self.d = driver
        plan = driver.plan
        order = np.argsort(plan.start_s, kind="stable")
        self.starts: Sequence[int] = _view(order[plan.turns[order] > 0], np.int64)
        self.start_s: Sequence[float] = _view(plan.start_s, np.float64)
        self.next_start = 0

    def start(self) -> None:
        """Schedule the first conversation start."""
        self._schedule_next_start()

    def _schedule_next_start(self) -> None:
        # chain: the next conversation start is scheduled when this one's arrival fires (O(1) pending starts)
        if self.next_start >= len(self.starts):
            return
        c = self.starts[self.next_start]
        self.next_start += 1
        self.d.arrive_at(c, self.d.offsets[c], self.start_s[c])

    def reached_p(self, c: int, i: int) -> None:
        """A conversation's first turn reached P: schedule the next conversation's start."""
        if i == self.d.offsets[c]:
            self._schedule_next_start()

    def turn_over(self, c: int, i: int) -> None:
        """Send the conversation's next turn one gap later, if it has one."""
        d = self.d
        if i + 1 < d.offsets[c + 1]:
            d.arrive_at(c, i + 1, d.env.now + d.gap[i])


class TraceReplay(ArrivalSource):
    """Every request on the trace's own clock, in arrival order, independent of earlier responses."""

    def __init__(self, driver: Driver, arrival_s: np.ndarray) -> None:
        self.d = driver
        plan = driver.plan
        self.arrival_s: Sequence[float] = _view(arrival_s, np.float64)
        self.order: Sequence[int] = _view(np.argsort(arrival_s, kind="stable"), np.int64)
        self.conv_of: Sequence[int] = _view(np.repeat(np.arange(len(plan.turns)), plan.turns), np.int64)
        self.next_request = 0

    def last_request(self, conversations: int) -> Sequence[int]:
        """Per conversation, its request sent last (the trace's arrival order; -1: none): no lookup follows it."""
        order = np.asarray(self.order, dtype=np.int64)
        if not len(order):
            return _view(np.full(conversations, -1, dtype=np.int64), np.int64)
        pos = np.full(conversations, -1, dtype=np.int64)  # per conversation: the position of its last request
        np.maximum.at(pos, np.asarray(self.conv_of, dtype=np.int64)[order], np.arange(len(order), dtype=np.int64))
        return _view(np.where(pos >= 0, order[np.maximum(pos, 0)], -1), np.int64)

    def start(self) -> None:
        """Schedule the first request."""
        self._schedule_next_request()

    def _schedule_next_request(self) -> None:
        if self.next_request >= len(self.order):
            return
        i = self.order[self.next_request]
        self.next_request += 1
        self.d.arrive_at(self.conv_of[i], i, self.arrival_s[i])

    def reached_p(self, c: int, i: int) -> None:
        """Chain the next request of the trace."""
        self._schedule_next_request()

    def turn_over(self, c: int, i: int) -> None:
        """Nothing: the trace's clock, not the response, sets the next arrival."""


class ClosedLoop(ArrivalSource):
    """``clients`` clients cycle round-robin over their active conversations (think time = turn gap)."""

    def __init__(self, driver: Driver, closed: ClosedLoopArrival) -> None:
        self.d = driver
        plan = driver.plan
        self.clients = closed.clients
        self.slots = max(1, closed.max_active_conversations // closed.clients)
        self.pool: deque[int] = deque(c for c in range(len(plan.turns)) if plan.turns[c] > 0)
        self.client_of: dict[int, deque[int]] = {}
        self.next_turn: dict[int, int] = {}

    def start(self) -> None:
        """Give each client its first active conversations and send their first turns."""
        for _ in range(self.clients):
            active: deque[int] = deque()
            while self.pool and len(active) < self.slots:
                active.append(self.pool.popleft())
            if active:
                self._client_next(active, 0.0)

    def reached_p(self, c: int, i: int) -> None:
        """Nothing: a client waits for the response."""

    def turn_over(self, c: int, i: int) -> None:
        """Keep the conversation active while it has turns, else take a new one; send the client's next turn."""
        active = self.client_of.pop(c)
        if i + 1 < self.d.offsets[c + 1]:
            active.append(c)
        elif self.pool:
            active.append(self.pool.popleft())
        if active:
            self._client_next(active, self.d.gap[i])

    def _client_next(self, active: deque[int], think_s: float) -> None:
        c = active.popleft()
        self.client_of[c] = active
        i = self.next_turn.get(c, self.d.offsets[c])
        self.next_turn[c] = i + 1
        self.d.arrive_at(c, i, self.d.env.now + think_s)
