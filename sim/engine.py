"""Wiring and the public entry point ``run(scenario, seed) -> Result``.

A conversation is one SimPy process that sends its turns in order: router lookup, the P leg
(``max_tokens=1``, strictly first), then the D leg, then the turn gap (open loop), or a client that
cycles round-robin over its active conversations (closed loop, vLLM ``benchmark_serving_multi_turn``).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
import simpy

from kvplan.errors import input_error
from kvplan.models.arch import MODEL_PRESETS, ModelArch, full_blocks_tokens, get_model, kv_capacity_tokens
from kvplan.models.costs import CostModel
from kvplan.models.hardware import LINK_PRESETS, Node, get_hardware
from kvplan.models.profile import (
    Profile,
    default_profile_name,
    extrapolate_profile,
    load_profile,
    shipped_profiles,
)
from kvplan.sim.context import Ctx, Request
from kvplan.sim.decode import DecodeNode
from kvplan.sim.events import Ev
from kvplan.sim.prefill import PrefillNode
from kvplan.sim.router import Router
from kvplan.sim.scenario import ClosedLoopArrival, Scenario, with_overrides
from kvplan.sim.workload import ConversationPlan, make_plan


@dataclass(frozen=True)
class Resolved:
    """A scenario with its presets, profile and derived sizes resolved (what the run actually uses)."""

    scenario: Scenario
    arch: ModelArch
    node: Node
    profile: Profile
    costs: CostModel
    per_byte_s: float
    decode_capacity_tokens: int
    prefill_capacity_tokens: int
    notes: tuple[str, ...]


def resolve(scenario: Scenario) -> Resolved:
    """Resolve presets, load (or extrapolate) the profile, apply inline cost overrides, size KV pools."""
    arch = get_model(scenario.model)
    node = get_hardware(scenario.hardware)
    tp = scenario.deployment.tensor_parallel_size
    if tp > node.gpus_per_node:
        raise input_error(
            "deployment.tensor_parallel_size", f"{tp} exceeds the {node.gpus_per_node} GPUs of a {node.name} node"
        )
    notes: list[str] = []
    if scenario.profile is not None:
        profile = load_profile(scenario.profile)
    else:
        name = default_profile_name(arch.name, node.name)
        if name in shipped_profiles():
            profile = load_profile(name)
        else:
            same_hw = [p for p in shipped_profiles() if p.startswith(node.name + "-")]
            base_name = default_profile_name("qwen3-32b", node.name)
            if base_name not in same_hw:
                if not same_hw:
                    raise input_error(
                        "hardware", f"no calibrated profile for hardware '{node.name}'", "give 'profile:' or 'costs:'"
                    )
                base_name = same_hw[0]
            base = load_profile(base_name)
            base_arch = MODEL_PRESETS[base.model]
            profile = extrapolate_profile(base, base_arch, arch, tp)
    if profile.model != arch.name or profile.tensor_parallel_size != tp:
        if profile.model in MODEL_PRESETS and not profile.extrapolated:
            profile = extrapolate_profile(profile, MODEL_PRESETS[profile.model], arch, tp)
    notes.extend(profile.notes)
    c = profile.costs
    o = scenario.costs
    costs = CostModel(
        prefill=o.prefill if o.prefill is not None else c.prefill,
        transfer=o.transfer if o.transfer is not None else c.transfer,
        decode=o.decode if o.decode is not None else c.decode,
        overhead=o.overhead if o.overhead is not None else c.overhead,
    )
    for comp in ("prefill", "transfer", "decode", "overhead"):
        if getattr(o, comp) is not None:
            notes.append(f"costs.{comp} given inline (replaces the profile's; omitted parameters are 0)")
    per_byte_s = costs.transfer.per_byte_s
    if scenario.deployment.link is not None:
        link = LINK_PRESETS.get(scenario.deployment.link)
        if link is None:
            raise input_error(
                "deployment.link", f"unknown link '{scenario.deployment.link}'", f"use one of {', '.join(LINK_PRESETS)}"
            )
        per_byte_s = 1.0 / link.bandwidth_bytes_per_s_per_rank
        notes.append(f"link overridden: {link.description}")
    dep = scenario.deployment
    # P and D are the same kind of node: one pool size from HBM unless overridden per role
    pool = kv_capacity_tokens(
        arch, tp, node.gpu.hbm_bytes, dep.gpu_memory_utilization, node.activation_reserve_bytes_per_gpu
    )
    d_cap = pool if dep.decode_kv_capacity_tokens is None else full_blocks_tokens(
        dep.decode_kv_capacity_tokens, arch.block_size_tokens
    )
    p_cap = dep.prefill_kv_capacity_tokens or pool
    if d_cap < arch.block_size_tokens:
        raise input_error("deployment.decode_kv_capacity_tokens", "smaller than one KV block")
    return Resolved(scenario, arch, node, profile, costs, per_byte_s, d_cap, p_cap, tuple(notes))


def _resolve_roles(scenario: Scenario, rs: Resolved) -> tuple[Resolved, Resolved]:
    """P's and D's resolution, each for its own TP (``deployment.prefill/decode_tensor_parallel_size``).

    vLLM's NIXL connector reads between different TP sizes when one divides the other (heterogeneous
    TP, PR #27274); each role's profile and KV pool follow its own TP.
    """
    dep = scenario.deployment
    out = []
    tps = {}
    for name in ("prefill_tensor_parallel_size", "decode_tensor_parallel_size"):
        tp = getattr(dep, name) or dep.tensor_parallel_size
        tps[name] = tp
        if tp == dep.tensor_parallel_size:
            out.append(rs)
            continue
        if tp > rs.node.gpus_per_node:
            raise input_error(
                f"deployment.{name}", f"{tp} exceeds the {rs.node.gpus_per_node} GPUs of a {rs.node.name} node"
            )
        out.append(resolve(with_overrides(scenario, {"deployment.tensor_parallel_size": tp})))
    a, b = tps.values()
    if max(a, b) % min(a, b):
        raise input_error(
            "deployment.prefill_tensor_parallel_size", f"TP {a} (prefill) and {b} (decode) do not divide one another",
            "vLLM's heterogeneous TP needs one TP size to be a multiple of the other",
        )
    return out[0], out[1]


class Driver:
    """Sends every conversation's turns in order, as callbacks (no generator per turn: this is hot).

    Per turn: the router lookup and P choice at arrival, the P leg after the proxy/HTTP overhead, the D
    leg (strictly after P) after its overhead, then the turn gap until the conversation's next arrival.
    The proxy's overhead before P is folded into the timeout that ends the gap (one event, not two);
    the lookup is evaluated with the true arrival time, so nothing changes but the event count.
    """

    def __init__(self, ctx: Ctx, plan: ConversationPlan, closed_loop: ClosedLoopArrival | None) -> None:
        self.ctx = ctx
        self.env = ctx.env
        self.plan = plan
        oh = ctx.costs.overhead
        self.p_leg = oh.p_leg_s
        self.d_leg = oh.d_leg_s
        self.send_id = ctx.scenario.policy.send_conversation_id
        self.offsets = plan.offsets.tolist()
        self.prompt = plan.prompt_tokens.tolist()
        self.output = plan.output_tokens.tolist()
        self.gap = plan.gap_s.tolist()
        self.closed = closed_loop if plan.arrival_s is None else None  # a trace brings its own clock
        self._pool: deque[int] = deque()
        self._client_of: dict[int, deque[int]] = {}
        self._next_turn: dict[int, int] = {}

    # -- open loop ------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Schedule the first arrivals (open loop) or start the clients (closed loop)."""
        plan = self.plan
        if self.closed is not None:
            self._pool = deque(c for c in range(len(plan.turns)) if plan.turns[c] > 0)
            slots = max(1, self.closed.max_active_conversations // self.closed.clients)
            for _ in range(self.closed.clients):
                active: deque[int] = deque()
                while self._pool and len(active) < slots:
                    active.append(self._pool.popleft())
                if active:
                    self._client_next(active, 0.0)
            return
        if plan.arrival_s is not None:
            # trace replay: every request on the trace's own clock, independent of earlier responses
            self._req_order = np.argsort(plan.arrival_s, kind="stable").tolist()
            self._req_conv = np.repeat(np.arange(len(plan.turns)), plan.turns).tolist()
            self._req_i = 0
            self._schedule_next_request()
            return
        order = [int(c) for c in np.argsort(plan.start_s, kind="stable") if plan.turns[c] > 0]
        self._starts = order
        self._start_i = 0
        self._schedule_next_start()

    def _schedule_next_start(self) -> None:
        if self._start_i >= len(self._starts):
            return
        c = self._starts[self._start_i]
        self._start_i += 1
        t = float(self.plan.start_s[c])
        self._arrive_at(c, self.offsets[c], t)
        # chain: the next conversation start is scheduled when this one's arrival fires
        # (keeps O(1) pending start events)

    def _schedule_next_request(self) -> None:
        if self._req_i >= len(self._req_order):
            return
        i = self._req_order[self._req_i]
        self._req_i += 1
        assert self.plan.arrival_s is not None
        self._arrive_at(self._req_conv[i], i, float(self.plan.arrival_s[i]))

    def _arrive_at(self, c: int, i: int, t_arrival: float) -> None:
        env = self.env
        delay = t_arrival - env.now + self.p_leg
        if delay > 0:
            env.timeout(delay).callbacks.append(lambda _e: self._at_p(c, i, t_arrival))
        else:
            self._at_p(c, i, t_arrival)

    def _at_p(self, c: int, i: int, t_arrival: float) -> None:
        ctx = self.ctx
        if self.plan.arrival_s is not None:
            self._schedule_next_request()
        elif self.closed is None and i == self.offsets[c]:
            self._schedule_next_start()
        turn = i - self.offsets[c] + 1
        prompt = self.prompt[i]
        log = ctx.log
        log.append((t_arrival, Ev.ARRIVE, c, turn, -1, prompt, self.output[i]))
        res, params = ctx.router.lookup(c, t_arrival, self.send_id)
        log.append((t_arrival, Ev.ROUTER, c, turn, -1, res, 0))
        self._submit(Request(c, turn, i, prompt, self.output[i], params))

    def _submit(self, r: Request) -> None:
        """The P leg reaches the chosen P's engine."""
        self.ctx.prefill[self.ctx.router.pick_prefill(r.conv)].submit(r)

    def p_done(self, r: Request) -> None:
        """P leg finished (or failed): start the D leg after its overhead, or move on."""
        if r.error:
            self._turn_over(r)
            return
        if self.d_leg > 0:
            self.env.timeout(self.d_leg).callbacks.append(lambda _e: self._at_d(r))
        else:
            self._at_d(r)

    def _at_d(self, r: Request) -> None:
        d = self.ctx.router.pick_decode(r.conv)
        self.ctx.decode[d].submit(r)

    def d_done(self, r: Request) -> None:
        """D finished the response: the turn is over."""
        self._turn_over(r)

    def _turn_over(self, r: Request) -> None:
        c, i = r.conv, r.index
        if self.closed is not None:
            active = self._client_of.pop(c)
            if i + 1 < self.offsets[c + 1]:
                active.append(c)
            elif self._pool:
                active.append(self._pool.popleft())
            if active:
                self._client_next(active, self.gap[i])
            return
        if self.plan.arrival_s is None and i + 1 < self.offsets[c + 1]:
            self._arrive_at(c, i + 1, self.env.now + self.gap[i])

    # -- closed loop ----------------------------------------------------------------------------------------

    def _client_next(self, active: deque[int], think_s: float) -> None:
        """The client sends the next turn of its next active conversation (round-robin)."""
        c = active.popleft()
        self._client_of[c] = active
        i = self._next_turn.get(c, self.offsets[c])
        self._next_turn[c] = i + 1
        self._arrive_at(c, i, self.env.now + think_s)


def simulate(scenario: Scenario, seed: int | None = None) -> tuple[Resolved, ConversationPlan, Ctx]:
    """Run the discrete-event model; returns the resolved inputs, the drawn plan and the final state."""
    rs = resolve(scenario)
    rs_p, rs_d = _resolve_roles(scenario, rs)
    seed = scenario.seed if seed is None else seed
    plan = make_plan(scenario.workload, seed, rs.arch.max_model_len)
    env = simpy.Environment()
    dep = scenario.deployment
    aggregated = dep.mode == "aggregated"
    n_p, n_d = (dep.replicas, 1) if aggregated else (dep.prefill_nodes, dep.decode_nodes)
    router = Router(scenario.policy.router_ttl_s, dep.routing, n_p, n_d)
    ctx = Ctx(
        env=env,
        scenario=scenario,
        arch=rs.arch,
        costs=rs_p.costs,
        tp=dep.tensor_parallel_size,
        per_byte_s=rs_d.per_byte_s,
        decode_capacity_blocks=rs_d.decode_capacity_tokens // rs.arch.block_size_tokens,
        prefill_cache_tokens=rs_p.prefill_capacity_tokens,
        router=router,
        p_tp=dep.prefill_tensor_parallel_size or dep.tensor_parallel_size,
        d_tp=dep.decode_tensor_parallel_size or dep.tensor_parallel_size,
        d_costs=rs_d.costs,
    )
    ctx.roles = (rs_p, rs_d)
    arrival = scenario.workload.arrival
    closed = arrival if isinstance(arrival, ClosedLoopArrival) else None
    if aggregated:
        from kvplan.sim import aggregated as agg

        agg.build(ctx, plan, closed)
    else:
        ctx.prefill = [PrefillNode(ctx, i) for i in range(dep.prefill_nodes)]
        ctx.decode = [DecodeNode(ctx, i) for i in range(dep.decode_nodes)]
        router.bind(ctx.prefill, ctx.decode)
        ctx.driver = Driver(ctx, plan, closed)
    ctx.driver.start()
    env.run()
    for dn in ctx.decode:
        dn.expire_all()
    for pn in ctx.prefill:
        pn.release_all([lease[2] for lease in pn._leases])
    return rs, plan, ctx
