"""Wiring and the public entry point ``run(scenario, seed) -> Result``.

:func:`resolve` turns a scenario into its model, hardware and costs; :func:`simulate` wires the nodes,
the router and the :class:`~kvplan.sim.driver.Driver` (which sends every turn: router lookup, the P leg
strictly first, then the D leg; when turns arrive is its arrival source's job) and runs SimPy.

Importing this module installs the compiled build of the hot path (:func:`kvplan.sim.native.install`), first,
before it imports any hot module: from then on every hot module is the compiled one. If a hot module was
imported before the engine (``import kvplan.models.costs`` imports ``kvplan.models.formulas``), none is
compiled: the run is pure Python and ``kvplan native status`` says why. So the entry points that simulate
(``kvplan.app.cli``, ``kvplan.sim.api``, the sweep workers, the dashboard) import this module first.
"""

from __future__ import annotations

from kvplan.sim import native

native.install()  # before the imports below: all hot modules compiled, or none (sim/native.py)

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import simpy
from pydantic import ValidationError

from kvplan.errors import KvplanInputError, input_error
from kvplan.models.arch import ModelArch, full_blocks_tokens, get_model
from kvplan.models.bounds import bound_violations
from kvplan.models.costs import CostModel, with_transport
from kvplan.models.hardware import LINK_PRESETS, Node, get_hardware
from kvplan.models.memory import MemoryPlan, plan_memory, with_kv_cache_dtype
from kvplan.models.profile import Profile
from kvplan.models.resolve import resolve_profile
from kvplan.sim import node_setup
from kvplan.sim.clock import WAKE_HEAP, SimEnv
from kvplan.sim.context import Ctx
from kvplan.sim.decode import DecodeNode
from kvplan.sim.driver import Driver
from kvplan.sim.events import EventChunk, EventLog
from kvplan.sim.prefill import PrefillNode
from kvplan.sim.router import Router
from kvplan.sim.scenario import ClosedLoopArrival, CostOverrides, Scenario, with_overrides
from kvplan.sim.validity import (
    check_exact_decode_cost,
    check_pools_hold_largest_request,
    check_prefill_chunk_cost,
    check_tensor_parallel,
)
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
    memory: MemoryPlan | None = None


def apply_overrides(costs: CostModel, overrides: CostOverrides) -> CostModel:
    """``costs`` with the parameters an inline ``costs:`` block names replaced (the rest unchanged), validated
    again as a whole (knot lists of equal length, increasing). Inline ``decode.batch_knots`` without
    ``decode.context_knots_s`` drops the base's context knots (they belong to its batch knots): the step then
    reads the base's one ``per_context_token_s`` (or the inline one)."""
    parts = {}
    for comp in ("prefill", "transfer", "decode", "overhead"):
        base = getattr(costs, comp)
        named = getattr(overrides, comp)
        if not named:
            parts[comp] = base
            continue
        old = base.model_dump()
        if comp == "decode" and "batch_knots" in named and "context_knots_s" not in named:
            old["context_knots_s"] = ()
        try:
            parts[comp] = type(base).model_validate({**old, **dict(named)})
        except ValidationError as exc:
            first = exc.errors()[0]
            raise input_error(f"costs.{comp}", str(first.get("msg", exc)).removeprefix("Value error, "),
                              "give knot lists of equal length with increasing positive knots") from None
    return CostModel(**parts)


def unused_overrides(costs: CostModel, overrides: CostOverrides, scenario: Scenario) -> list[tuple[str, str]]:
    """``(costs.<comp>.<param>, why)`` for every inline parameter that the resolved cost model never reads.

    With measured knots the interpolation replaces ``prefill.weight_read_s``, ``decode.fixed_s`` and (with
    context knots) ``decode.per_context_token_s`` (``formulas.linear_s``, ``formulas.batch_s``,
    ``formulas.per_context_s``); the per-unit slope past the last knot
    (``prefill.per_token_s``, ``decode.per_seq_s``) is read only when a step can go past it
    (``max_num_batched_tokens``, and ``max_num_seqs`` on a disaggregated D; an aggregated engine's mixed step
    reads ``decode.per_seq_s`` directly, ``models.costs.mixed_step_time_s``). Components given in full are
    not checked.
    """
    dep = scenario.deployment
    pc, dc = costs.prefill, costs.decode
    # a component given in full (a whole cost model, as the calibration fits pass one) names every parameter
    # by construction: only a partial override says the user meant that parameter to matter
    named = {(c, k) for c in ("prefill", "decode") if not _given_in_full(overrides, c)
             for k in (getattr(overrides, c) or {})}
    out = []
    if pc.linear_knots_tokens:
        last = pc.linear_knots_tokens[-1]
        if ("prefill", "weight_read_s") in named:
            out.append(("costs.prefill.weight_read_s", "the prefill linear knots replace it"))
        if ("prefill", "per_token_s") in named and dep.max_num_batched_tokens <= last:
            out.append(("costs.prefill.per_token_s", f"no step exceeds the last linear knot ({last} tokens) at "
                        f"max_num_batched_tokens {dep.max_num_batched_tokens}"))
    if dc.batch_knots:
        last = dc.batch_knots[-1]
        if ("decode", "fixed_s") in named:
            out.append(("costs.decode.fixed_s", "the decode batch knots replace it"))
        if ("decode", "per_seq_s") in named and dep.mode != "aggregated" and dep.max_num_seqs <= last:
            out.append(("costs.decode.per_seq_s", f"no decode batch exceeds the last batch knot ({last}) at "
                        f"max_num_seqs {dep.max_num_seqs}"))
        if ("decode", "per_context_token_s") in named and dc.context_knots_s:
            out.append(("costs.decode.per_context_token_s", "the decode context knots replace it"))
    return out


def _given_in_full(overrides: CostOverrides, comp: str) -> bool:
    named = getattr(overrides, comp) or {}
    return set(named) == set(type(getattr(CostModel(), comp)).model_fields)


def _check_inline_bounds(costs: CostModel, overrides: CostOverrides, arch: ModelArch, node: Node, tp: int,
                         notes: list[str]) -> None:
    """Inline costs obey the physical bounds of profiles (``models/bounds.py``): the first parameter below
    its bound is refused. A component given in full inline (every one of its parameters named, as a test of
    a bare formula against queueing theory does) is a formula what-if: said in a note, not refused."""
    for bad in bound_violations(costs, arch, node, tp):
        param = bad.split(" = ")[0]
        comp = param.split(".", 1)[0]
        if _given_in_full(overrides, comp):
            notes.append(f"inline costs.{comp} given in full, not physically possible: {bad}")
            continue
        raise input_error(f"costs.{param}", bad, "use a value at or above the bound (or a calibrated profile)")


def resolve(scenario: Scenario) -> Resolved:
    """Resolve presets and the profile (:func:`kvplan.models.resolve.resolve_profile`), apply inline cost
    overrides, size KV pools."""
    arch = get_model(scenario.model)
    node = get_hardware(scenario.hardware)
    tp = scenario.deployment.tensor_parallel_size
    if tp > node.gpus_per_node:
        raise input_error(
            "deployment.tensor_parallel_size", f"{tp} exceeds the {node.gpus_per_node} GPUs of a {node.name} node"
        )
    check_tensor_parallel(arch, tp)
    profile, notes = resolve_profile(arch, node, tp, scenario.profile, scenario.simulation.allow_unreliable_profile)
    costs = apply_overrides(profile.costs, scenario.costs)
    for comp in ("prefill", "transfer", "decode", "overhead"):
        named = getattr(scenario.costs, comp)
        if named:
            notes.append(f"costs.{comp} given inline: {', '.join(sorted(named))} (the rest from the profile)")
    dropped = profile.costs.decode.context_knots_s
    named_decode = scenario.costs.decode or {}
    if dropped and "batch_knots" in named_decode and "context_knots_s" not in named_decode:
        # apply_overrides: the base's context knots belong to its batch knots, so they cannot follow new ones
        src = "inline" if "per_context_token_s" in named_decode else "the profile's"
        notes.append(f"costs.decode.batch_knots given inline without context_knots_s: the profile's {len(dropped)} "
                     f"per-knot context slopes are dropped; the decode step's attention term falls back to one "
                     f"per_context_token_s = {costs.decode.per_context_token_s:.4g} s/token ({src}) at every batch "
                     "(give context_knots_s, one per batch knot, to keep a per-batch slope)")
    for param, why in unused_overrides(costs, scenario.costs, scenario)[:1]:
        raise input_error(param, f"is not used by the resolved cost model: {why}",
                          "remove it, or give the knots it would replace")
    if scenario.deployment.mode == "aggregated" and scenario.costs.transfer:
        notes.append("no effect: costs.transfer given inline, but aggregated serving transfers no KV")
    if costs != profile.costs:
        _check_inline_bounds(costs, scenario.costs, arch, node, tp, notes)
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
    costs = with_transport(costs, dep.kv_transport, per_byte_s, set(scenario.costs.transfer or {}), notes)
    arch = with_kv_cache_dtype(arch, dep.kv_cache_dtype)
    # P and D are the same kind of node: one pool size, vLLM's memory accounting, unless overridden per role
    mem = plan_memory(
        arch, node.gpu, tp, dep.gpu_memory_utilization, dep.max_num_batched_tokens, dep.max_num_seqs,
        cudagraph_memory_profiling=dep.cudagraph_memory_profiling,
    )
    pool = mem.kv_cache_tokens
    d_cap = pool if dep.decode_kv_capacity_tokens is None else full_blocks_tokens(
        dep.decode_kv_capacity_tokens, arch.block_size_tokens
    )
    p_cap = dep.prefill_kv_capacity_tokens or pool
    if d_cap < arch.block_size_tokens:
        raise input_error("deployment.decode_kv_capacity_tokens", "smaller than one KV block")
    if dep.max_model_len is not None:  # vLLM --max-model-len (after the profile: priors are keyed by the preset)
        if dep.max_model_len > arch.max_model_len:
            raise input_error(
                "deployment.max_model_len", f"{dep.max_model_len} exceeds {arch.name}'s limit of {arch.max_model_len} "
                "(vLLM refuses it without RoPE scaling)", "lower it, or give an inline model with a larger max_model_len",
            )
        arch = arch.model_copy(update={"max_model_len": dep.max_model_len})
        notes.append(f"max_model_len {dep.max_model_len} (deployment.max_model_len; the model allows "
                     f"{get_model(scenario.model).max_model_len})")
    return Resolved(scenario, arch, node, profile, costs, per_byte_s, d_cap, p_cap, tuple(notes), mem)


def resolve_roles(scenario: Scenario, rs: Resolved) -> tuple[Resolved, Resolved]:
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
        try:
            out.append(resolve(with_overrides(scenario, {"deployment.tensor_parallel_size": tp})))
        except KvplanInputError as exc:  # name the role's field, not the shared one
            raise KvplanInputError(str(exc).replace("deployment.tensor_parallel_size", f"deployment.{name}")) from None
    a, b = tps.values()
    if max(a, b) % min(a, b):
        raise input_error(
            "deployment.prefill_tensor_parallel_size", f"TP {a} (prefill) and {b} (decode) do not divide one another",
            "vLLM's heterogeneous TP needs one TP size to be a multiple of the other",
        )
    return out[0], out[1]


def profile_parts(rs: Resolved, roles: tuple[Resolved, Resolved] | None = None) -> dict[str, str]:
    """What each part of the deployment's costs is (``Profile.component_status``), each role's own: with
    heterogeneous TP P and D are priced by their own TP's profile (:func:`resolve_roles`, or ``roles`` when the
    caller has them), so ``prefill.*`` comes from P's and ``decode.*`` from D's, labelled with that TP and profile
    (``rs.profile`` is the one of ``tensor_parallel_size``); summary.json's ``profile_components``."""
    parts = dict(rs.profile.component_status)
    rs_p, rs_d = roles if roles is not None else resolve_roles(rs.scenario, rs)
    for role, r in (("prefill", rs_p), ("decode", rs_d)):
        if r is rs:
            continue
        tp = r.scenario.deployment.tensor_parallel_size
        parts = {k: v for k, v in parts.items() if not k.startswith(role + ".")}
        parts.update({k: f"{v} [{role} at TP{tp}: profile {r.profile.name}]"
                      for k, v in r.profile.component_status.items() if k.startswith(role + ".")})
    return parts


#: Profile statuses from the most to the least trustworthy (``Profile.status``): a run priced by two profiles
#: (heterogeneous TP) is as trustworthy as the less trustworthy of them.
STATUS_ORDER = ("calibrated", "composed", "prior", "proxy", "unreliable")


def run_profile_status(roles: tuple[Resolved, Resolved]) -> str:
    """The status of the profiles a run is priced by (P's and D's, :func:`resolve_roles`): the less trustworthy one
    (:data:`STATUS_ORDER`); with one TP both are the same profile."""
    statuses = [r.profile.status for r in roles]
    return max(statuses, key=lambda st: STATUS_ORDER.index(st) if st in STATUS_ORDER else len(STATUS_ORDER))


CLOCK_LIMIT_S = float(2**24)  # beyond it float64 spacing (3.7e-9 s) exceeds sim/link.py's 1 ns slack: livelock


def _refuse_if_unfinished(env: simpy.Environment) -> None:
    """The sentinel at :data:`CLOCK_LIMIT_S`: nothing may still be pending there (overload plus a long TTL)."""
    if env.peek() != float("inf"):
        raise input_error(
            "simulation", f"the simulated clock reached {CLOCK_LIMIT_S:.3g} s with work still queued (the deployment "
            "never drains: overloaded, or retention holding the decode pool); lower the load, the TTL, or add nodes",
        )


ChunkSink = Callable[[EventChunk], None]
ProgressHook = Callable[[float, float], None]
USE_QUEUE_LOOP = True  # False: step with SimPy's own Environment.step, not SimEnv's (tests compare the two)
SLICE_EVENTS = 131_072  # events per flushed slice of simulated time (the slice length adapts to reach it)


def simulate(
    scenario: Scenario, seed: int | None = None, consumer: Callable[[ConversationPlan], ChunkSink] | None = None,
    progress: ProgressHook | None = None, keep: bool = True,
) -> tuple[Resolved, ConversationPlan, Ctx]:
    """Run the discrete-event model; returns the resolved inputs, the drawn plan and the final state.

    The event log is flushed into typed chunks between slices of simulated time and each chunk handed to
    the sink ``consumer(plan)`` returns (``keep`` also keeps them in ``ctx.log``); ``progress(now_s,
    horizon_s)`` is called after each slice, the horizon being the plan's last planned arrival (an estimate
    for closed loops). Slicing ``env.run`` does not change the run: SimPy processes events in (time,
    priority, id) order and the stop event of a slice only interleaves with them.
    """
    rs = resolve(scenario)
    rs_p, rs_d = resolve_roles(scenario, rs)
    seed = scenario.seed if seed is None else seed
    check_tensor_parallel(rs.arch, scenario.deployment.tensor_parallel_size)
    plan = make_plan(scenario.workload, seed, rs.arch.max_model_len)
    if plan.total_turns == 0:  # an empty result is refused, never reported as a healthy run
        raise input_error("workload", f"no request fits the {rs.arch.name} context of {rs.arch.max_model_len:,} tokens "
                          "(every first turn is longer), so there is nothing to simulate",
                          "shorten prefix_tokens/user_tokens/output_tokens (a trace: workload.trace.overlong: truncate, "
                          "or a window with requests in it)")
    check_exact_decode_cost(plan, scenario.simulation.decode_mode)
    check_prefill_chunk_cost(plan, scenario.deployment.max_num_batched_tokens)
    dep = scenario.deployment
    check_pools_hold_largest_request(plan, rs.decode_capacity_tokens, rs.prefill_capacity_tokens, rs.arch.block_size_tokens,
                                     dep.decode_kv_capacity_tokens is not None, dep.prefill_kv_capacity_tokens is not None)
    on_chunk = consumer(plan) if consumer is not None else None
    env = SimEnv()
    aggregated = dep.mode == "aggregated"
    n_p, n_d = (dep.replicas, 1) if aggregated else (dep.prefill_nodes, dep.decode_nodes)
    router = Router(node_setup.router_config(scenario, n_p, n_d, seed))
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
        log=EventLog(keep=keep),
    )
    ctx.roles = (rs_p, rs_d)
    if plan.shared_group is not None:  # a prefix shared by conversations (sim/shared.py), zero-copy views
        ctx.shared_group = np.ascontiguousarray(plan.shared_group, dtype=np.int64).data
        ctx.shared_tokens = np.ascontiguousarray(plan.shared_tokens, dtype=np.int64).data
    arrival = scenario.workload.arrival
    # a trace brings its own clock (its arrival times, or weka's session starts and think times after each answer):
    # a closed loop of the scenario does not pace it (said as a "no effect" note, sim/api.py)
    closed = arrival if isinstance(arrival, ClosedLoopArrival) and scenario.workload.trace is None else None
    driver_cfg = node_setup.driver_config(scenario, ctx)
    if aggregated:
        from kvplan.sim import aggregated as agg

        ctx.replicas, ctx.driver = agg.build(ctx, node_setup.aggregated_config(scenario, ctx), dep.replicas, driver_cfg,
                                             plan, closed)
        router.bind(ctx.replicas, ())
    else:
        p_cfg = node_setup.prefill_config(scenario, ctx)
        d_cfg = node_setup.decode_config(scenario, rs_d.node, ctx)
        ctx.host_per_byte_s = d_cfg.retention.host_per_byte_s
        offsets = np.ascontiguousarray(plan.offsets, dtype=np.int64).data  # lease: a conversation's last turn
        # filled in place: a node keeps the run's list of its peers from its construction on (sim/peers.py)
        ctx.prefill.extend(PrefillNode(ctx, i, p_cfg) for i in range(dep.prefill_nodes))
        ctx.decode.extend(DecodeNode(ctx, i, d_cfg, offsets) for i in range(dep.decode_nodes))
        router.bind(ctx.prefill, ctx.decode)
        ctx.driver = Driver(ctx, driver_cfg, plan, closed)
    ctx.driver.start()
    ctx.steady_window = steady_window(plan)
    engines = ctx.replicas if aggregated else ctx.prefill
    busy_at: list[list[float]] = []  # per mark: each engine's cumulative busy seconds
    threads_at: list[list[list[float]]] = []  # per mark: the Ctx.window_thread_s columns, cumulative

    def read_busy() -> None:
        busy_at.append([float(p.busy_s) for p in engines])
        threads_at.append(thread_counters(ctx))
        if len(busy_at) == 2:
            ctx.window_busy_each_s = [b - a for a, b in zip(busy_at[0], busy_at[1], strict=True)]
            ctx.window_busy_s = float(sum(busy_at[1])) - float(sum(busy_at[0]))
            ctx.window_thread_s = [[b - a for a, b in zip(x, y, strict=True)] for x, y in zip(*threads_at, strict=True)]

    marks = [(t, read_busy) for t in ctx.steady_window] if ctx.steady_window is not None else []
    _run_sliced(env, ctx.log, on_chunk, progress, _horizon_s(plan), marks)
    for dn in ctx.decode:
        dn.expire_all()
    for rep in ctx.replicas:
        rep.log_itl_hist()  # aggregated engines' pooled inter-token gaps (D's are logged by expire_all)
    for pn in ctx.prefill:
        pn.release_all([lease[2] for lease in pn._leases])
    chunk = ctx.log.flush()
    if on_chunk is not None:
        on_chunk(chunk)
    return rs, plan, ctx


def steady_window(plan: ConversationPlan) -> tuple[float, float] | None:
    """The second half of the arrival window, ``(max(first arrival, t_b / 2), t_b)``: ``t_b`` the last new
    conversation's first arrival (open loop) or the trace's last request. The ramp-up before it and the drain
    after it are left out. Pricing counts served turns over this window too, the same for every policy and TTL
    (:func:`kvplan.plan.pricing.pricing_window`); the pinned-KV window (:func:`kvplan.plan.executor.run_extras`) starts
    at ``min(t_b / 2, TTL + p90 conversation span)``, so this is the same window or its tail. None for a closed
    loop (its arrivals follow its responses) or an empty window."""
    t = plan.arrival_s if plan.arrival_s is not None and len(plan.arrival_s) else plan.start_s
    t = t[np.isfinite(t)] if t is not None else t
    if t is None or not len(t):
        return None
    t0, t_b = float(t.min()), float(t.max())
    t_a = max(t0, t_b / 2)
    return (t_a, t_b) if t_b > t_a else None


def _horizon_s(plan: ConversationPlan) -> float:
    """Simulated time of the last planned arrival (progress estimate; NaN-free)."""
    if plan.arrival_s is not None and len(plan.arrival_s):
        return float(np.nanmax(plan.arrival_s))
    start = plan.start_s[np.isfinite(plan.start_s)]
    if not len(start):
        return 0.0
    conv_span = float(np.mean(plan.turns)) * (float(np.mean(plan.gap_s)) if len(plan.gap_s) else 0.0)
    return float(start.max()) + conv_span


def thread_counters(ctx: Ctx) -> list[list[float]]:
    """The engine threads' cumulative counters, one column per engine (the layout of ``Ctx.window_thread_s``): P's
    busy and posting seconds, requests that reached P and that P scheduled, then D's busy and posting seconds,
    requests that reached D and that D admitted."""
    return [[p.thread_busy_s for p in ctx.prefill], [p.thread_post_s for p in ctx.prefill],
            [float(p.submitted) for p in ctx.prefill], [float(p.decided) for p in ctx.prefill],
            [d.batch.thread_busy_s for d in ctx.decode], [d.batch.thread_post_s for d in ctx.decode],
            [float(d.submitted) for d in ctx.decode], [float(d.admitted) for d in ctx.decode]]


def _run_sliced(
    env: SimEnv, log: EventLog, on_chunk: ChunkSink | None, progress: ProgressHook | None, horizon: float,
    marks: list[tuple[float, Callable[[], None]]] | None = None,
) -> None:
    """``env.run()`` in slices of simulated time, flushing the log between them (deterministic slice lengths).

    Steps events itself (what ``env.run`` does) so that no stop event enters the queue; the clock limit's
    sentinel (:data:`CLOCK_LIMIT_S`) is checked before each slice. ``marks``: ``(t, fn)`` in time order; a slice
    ends at each ``t`` and ``fn()`` is called once every event before ``t`` has run (none at ``t``): a reading of
    the state at ``t`` without an event of its own, so the run is unchanged.
    """
    peek = env.peek
    fast = USE_QUEUE_LOOP
    dt = max(horizon / 1000.0, 1.0)
    pending = list(marks or ())
    while True:
        nxt = peek()
        while pending and pending[0][0] <= nxt:
            pending.pop(0)[1]()
        if nxt == float("inf"):
            break
        if nxt >= CLOCK_LIMIT_S:
            _refuse_if_unfinished(env)
        before = log.total
        stop = min(nxt + dt, CLOCK_LIMIT_S, pending[0][0] if pending else float("inf"))
        if fast:
            env.run_until(stop)  # SimEnv.step's loop, compiled with the hot path (sim/clock.py)
        else:
            while peek() < stop:
                if WAKE_HEAP:  # compiled, the wake-ups wait beside SimPy's queue: SimEnv.step is SimPy's over both
                    env.step()
                else:
                    simpy.Environment.step(env)  # SimPy's own step (the reference the tests compare with)
        log.pack()  # interpreted: the slice's rows, listed as tuples, packed now (sim/events.py TupleRows)
        n = log.total - before
        if len(log) >= SLICE_EVENTS or peek() == float("inf"):
            chunk = log.flush()
            if on_chunk is not None:
                on_chunk(chunk)
        if progress is not None:
            progress(env.now, horizon)
        if n > SLICE_EVENTS // 4:
            dt /= 2.0
        elif n < SLICE_EVENTS // 16:
            dt = min(dt * 2.0, max(horizon / 20.0, 1.0))
