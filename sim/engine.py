"""Wiring and the public entry point ``run(scenario, seed) -> Result``.

:func:`resolve` turns a scenario into its model, hardware and costs; :func:`simulate` wires the nodes,
the router and the :class:`~kvplan.sim.driver.Driver` (which sends every turn: router lookup, the P leg
strictly first, then the D leg; when turns arrive is its arrival source's job) and runs SimPy.
"""

from __future__ import annotations

from dataclasses import dataclass

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
from kvplan.sim.context import Ctx
from kvplan.sim.decode import DecodeNode
from kvplan.sim.driver import Driver
from kvplan.sim.prefill import PrefillNode
from kvplan.sim.router import Router
from kvplan.sim.scenario import ClosedLoopArrival, Scenario
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


def simulate(scenario: Scenario, seed: int | None = None) -> tuple[Resolved, ConversationPlan, Ctx]:
    """Run the discrete-event model; returns the resolved inputs, the drawn plan and the final state."""
    rs = resolve(scenario)
    seed = scenario.seed if seed is None else seed
    plan = make_plan(scenario.workload, seed, rs.arch.max_model_len)
    env = simpy.Environment()
    dep = scenario.deployment
    router = Router(scenario.policy.router_ttl_s, dep.routing, dep.prefill_nodes, dep.decode_nodes)
    ctx = Ctx(
        env=env,
        scenario=scenario,
        arch=rs.arch,
        costs=rs.costs,
        tp=dep.tensor_parallel_size,
        per_byte_s=rs.per_byte_s,
        decode_capacity_blocks=rs.decode_capacity_tokens // rs.arch.block_size_tokens,
        prefill_cache_tokens=rs.prefill_capacity_tokens,
        router=router,
    )
    ctx.prefill = [PrefillNode(ctx, i) for i in range(dep.prefill_nodes)]
    ctx.decode = [DecodeNode(ctx, i) for i in range(dep.decode_nodes)]
    arrival = scenario.workload.arrival
    ctx.driver = Driver(ctx, plan, arrival if isinstance(arrival, ClosedLoopArrival) else None)
    ctx.driver.start()
    env.run()
    for dn in ctx.decode:
        dn.expire_all()
    for pn in ctx.prefill:
        pn.release_all()
    return rs, plan, ctx
