"""Building each node's frozen slice (``sim/node_config.py``) and the router's config from the scenario, once per run.

This is the one place that reads the scenario's deployment and policy knobs (and the hardware preset's host
memory) for the nodes; ``sim/engine.py`` calls it while wiring a run and hands each node its slice.
"""

from __future__ import annotations

import math

from kvplan.errors import input_error
from kvplan.models.arch import kv_bytes_per_token_all_ranks, kv_bytes_per_token_per_rank
from kvplan.models.hardware import GBIT_BYTES, GIB, Node
from kvplan.sim.context import D2P, Ctx
from kvplan.sim.node_config import (
    AggregatedConfig,
    DecodeConfig,
    DriverConfig,
    PrefillConfig,
    RetentionConfig,
    RouterConfig,
)
from kvplan.sim.retention import read_margin_s
from kvplan.sim.scenario import LeaseRetention, Scenario, TtlEvictableRetention


def router_config(scenario: Scenario, n_prefill: int, n_decode: int, seed: int = 0) -> RouterConfig:
    """The router's TTL, routing and instance counts; lease retention renews through it instead of its TTL."""
    pol = scenario.policy
    lease = isinstance(pol.retention, LeaseRetention) and scenario.deployment.mode != "aggregated"
    # lease retention (sim/retention_policy.py): heartbeats pass through the router, which keeps the entry as
    # long as the lease, so its own TTL does not apply
    return RouterConfig(math.inf if lease else pol.router_ttl_s, scenario.deployment.routing, n_prefill, n_decode,
                        renews_leases=lease, seed=seed)


def prefill_config(scenario: Scenario, ctx: Ctx) -> PrefillConfig:
    """A prefill engine's slice (P's TP: its cost model and KV bytes)."""
    dep, pol = scenario.deployment, scenario.policy
    bs = ctx.block_size
    return PrefillConfig(
        max_num_seqs=dep.max_num_seqs,
        max_num_batched_tokens=dep.max_num_batched_tokens,
        async_scheduling=dep.async_scheduling,
        kv_post_overlaps_forward=dep.kv_post_overlaps_forward,
        block_size=bs,
        capacity_blocks=ctx.prefill_cache_tokens // bs,
        prefix_caching=dep.prefill_prefix_caching,
        bytes_per_block=kv_bytes_per_token_all_ranks(ctx.arch, ctx.p_tp) * bs,
        costs=ctx.costs.prefill,
        kv_recompute_threshold_tokens=pol.kv_recompute_threshold_tokens,
        read_margin_s=read_margin_s(pol.expiry_safety_margin_s, pol.clock_skew_s),
        fail_on_decline=pol.kv_load_failure_policy == "fail",
        kv_lease_duration_s=pol.kv_lease_duration_s,
        # D's first heartbeat comes at most the D leg plus one interval after P's finish; a handoff stage (a queue,
        # prompt-sized) between the legs bounds it no longer, so P keeps the lease deadlines (it can lapse)
        d_leg_s=ctx.costs.overhead.d_leg_s if dep.handoff is None else math.inf,
    )


def retention_config(scenario: Scenario, node: Node, ctx: Ctx) -> RetentionConfig:
    """D's retention policy with the offload tier sized from ``policy.offload`` or the hardware preset."""
    pol = scenario.policy
    ret = pol.retention
    lease = ret if isinstance(ret, LeaseRetention) else None
    host_tokens: int | None = None
    host_per_byte_s = ctx.per_byte_s
    if pol.offload is not None:
        off = pol.offload
        gib = off.host_capacity_gib if off.host_capacity_gib is not None else node.host_kv_gib
        if gib <= 0:
            raise input_error("policy.offload.host_capacity_gib", f"hardware '{node.name}' has no host KV preset",
                              "give host_capacity_gib")
        host_tokens = int(gib * GIB // kv_bytes_per_token_all_ranks(ctx.arch, ctx.d_tp))
        gbps = off.host_bandwidth_gbps if off.host_bandwidth_gbps is not None else node.host_to_nic_gbps
        if gbps <= 0:
            raise input_error("policy.offload.host_bandwidth_gbps", f"hardware '{node.name}' has no host bandwidth "
                              "preset", "give host_bandwidth_gbps")
        # the read's bytes through its busiest NIC stand for all of it: scale the node's host bandwidth by
        # total / bottleneck bytes (= D's TP for equal TP), as if every rank drew on the same host memory
        plan = ctx.plans[D2P]
        share = plan.total_bytes_per_token / plan.bottleneck_bytes_per_token
        host_per_byte_s = max(ctx.per_byte_s, share / (gbps * GBIT_BYTES))
    return RetentionConfig(
        ttl_s=pol.decoder_kv_blocks_ttl_s,
        evictable=isinstance(ret, TtlEvictableRetention),
        lease=lease is not None,
        lease_s=lease.lease_s if lease is not None else 0.0,
        heartbeat_s=lease.heartbeat_s if lease is not None else 0.0,
        idle_timeout_s=lease.idle_timeout_s if lease is not None else 0.0,
        client_knows_end=lease.client_knows_end if lease is not None else True,
        host_capacity_tokens=host_tokens,
        host_per_byte_s=host_per_byte_s,
    )


def decode_config(scenario: Scenario, node: Node, ctx: Ctx) -> DecodeConfig:
    """A decode engine's slice (D's TP: its cost model)."""
    dep, pol = scenario.deployment, scenario.policy
    assert ctx.d_costs is not None
    return DecodeConfig(
        block_size=ctx.block_size,
        capacity_blocks=ctx.decode_capacity_blocks,
        prefix_caching=dep.decode_prefix_caching,
        watermark_blocks=int(dep.kv_watermark * ctx.decode_capacity_blocks),
        max_num_seqs=dep.max_num_seqs,
        max_num_batched_tokens=dep.max_num_batched_tokens,
        async_scheduling=dep.async_scheduling,
        kv_post_overlaps_forward=dep.kv_post_overlaps_forward,
        exact_steps=scenario.simulation.decode_mode == "exact",
        costs=ctx.d_costs,
        bidirectional=pol.bidirectional,
        p2d_threshold_tokens=pol.kv_recompute_threshold_tokens if ctx.threshold_applies_to_p2d else 0,
        decode_nodes=dep.decode_nodes,
        retention=retention_config(scenario, node, ctx),
    )


def aggregated_config(scenario: Scenario, ctx: Ctx) -> AggregatedConfig:
    """An aggregated replica's slice; refuses per-role TP sizes (one engine runs both phases)."""
    dep = scenario.deployment
    for name in ("prefill_tensor_parallel_size", "decode_tensor_parallel_size"):
        v = getattr(dep, name, None)
        if v is not None and v != dep.tensor_parallel_size:
            raise input_error(f"deployment.{name}", "an aggregated replica runs both phases at one TP",
                              "use deployment.tensor_parallel_size only")
    return AggregatedConfig(
        max_num_seqs=dep.max_num_seqs,
        max_num_batched_tokens=dep.max_num_batched_tokens,
        block_size=ctx.block_size,
        capacity_blocks=ctx.decode_capacity_blocks,
        prefix_caching=dep.prefill_prefix_caching,
        watermark_blocks=int(dep.kv_watermark * ctx.decode_capacity_blocks),
        costs=ctx.costs,
    )


def driver_config(scenario: Scenario, ctx: Ctx) -> DriverConfig:
    """The proxy legs from P's overhead costs; aggregated mode has one leg (proxy -> engine, first chunk back)."""
    oh = ctx.costs.overhead
    send = scenario.policy.send_conversation_id
    if scenario.deployment.mode == "aggregated":  # handoff is refused in aggregated mode (sim/scenario_handoff.py)
        return DriverConfig(p_leg_s=oh.d_leg_s, d_leg_s=0.0, send_conversation_id=send)
    ho = scenario.deployment.handoff
    bw = ho.bandwidth_bytes_per_s if ho is not None else None
    return DriverConfig(
        p_leg_s=oh.p_leg_s, d_leg_s=oh.d_leg_s, send_conversation_id=send, n_decode=scenario.deployment.decode_nodes,
        handoff=ho is not None, handoff_fixed_s=ho.fixed_s if ho is not None else 0.0,
        handoff_per_token_s=kv_bytes_per_token_per_rank(ctx.arch, 1) / bw if bw else 0.0,
        handoff_serialised=ho is not None and ho.serialised,
    )
