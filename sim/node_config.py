"""What each node of the model is told at construction: frozen, typed slices of the run's constants and policy.

The engine builds them once per run from the scenario, its presets and the resolved sizes
(``sim/node_setup.py``); a node copies the fields it uses into plain attributes in its constructor and never
reads the scenario or a preset itself; the router gets its own, :class:`RouterConfig`.
Nothing here imports a node, the run state (``sim/context.py``) or the scenario.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.models.costs import CostModel, PrefillCost


@dataclass(frozen=True, slots=True)
class PrefillConfig:
    """A prefill engine's constants: vLLM's scheduler limits, its KV pool, the connector's knobs and P's lease."""

    max_num_seqs: int
    max_num_batched_tokens: int
    async_scheduling: bool  # deployment.async_scheduling (vLLM PR #19970)
    kv_post_overlaps_forward: bool  # deployment.kv_post_overlaps_forward: False posts reads before the forward
    block_size: int
    capacity_blocks: int  # P's KV pool
    prefix_caching: bool  # deployment.prefill_prefix_caching
    bytes_per_block: int  # KV bytes of one block over all P's ranks (P_DONE rows)
    costs: PrefillCost  # P's prefill step cost (its TP)
    kv_recompute_threshold_tokens: int
    read_margin_s: float  # a D->P read is declined when now + this >= D's deadline (sim/retention.py :: read_declined)
    fail_on_decline: bool  # kv_load_failure_policy "fail"
    kv_lease_duration_s: float  # P holds a prompt's blocks this long for D's read (PR #41383)
    d_leg_s: float  # proxy -> D leg: D's first heartbeat comes at most this plus one interval after P's finish


@dataclass(frozen=True, slots=True)
class RetentionConfig:
    """D's retention policy (``sim/retention_policy.py``) and its offload tier, sizes already resolved."""

    ttl_s: float  # policy.decoder_kv_blocks_ttl_s
    evictable: bool  # ttl_evictable
    lease: bool  # lease (the four fields below apply)
    lease_s: float = 0.0
    heartbeat_s: float = 0.0
    idle_timeout_s: float = 0.0
    client_knows_end: bool = True
    host_capacity_tokens: int | None = None  # offload tier per decode node (None: no offload)
    host_per_byte_s: float = 0.0  # seconds per byte per rank of a read from D's host memory


@dataclass(frozen=True, slots=True)
class DecodeConfig:
    """A decode engine's constants: its KV pool, batch limits, D's cost model, the P->D rule and retention."""

    block_size: int
    capacity_blocks: int  # D's KV pool
    prefix_caching: bool  # deployment.decode_prefix_caching
    watermark_blocks: int  # deployment.kv_watermark x capacity
    max_num_seqs: int
    max_num_batched_tokens: int  # the chunk of a local recompute
    async_scheduling: bool
    kv_post_overlaps_forward: bool  # deployment.kv_post_overlaps_forward: False posts reads before the forward
    exact_steps: bool  # simulation.decode_mode "exact"
    costs: CostModel  # D's own cost model (its TP)
    bidirectional: bool  # policy.bidirectional: finished requests pin their blocks
    p2d_threshold_tokens: int  # a P->D tail below this is recomputed on D (PR #55801); 0: never
    decode_nodes: int  # pin ids are unique across nodes: idx + k x decode_nodes
    retention: RetentionConfig


@dataclass(frozen=True, slots=True)
class AggregatedConfig:
    """An aggregated replica's constants (prefill and decode in one engine)."""

    max_num_seqs: int
    max_num_batched_tokens: int
    block_size: int
    capacity_blocks: int
    prefix_caching: bool  # deployment.prefill_prefix_caching (the engine's enable_prefix_caching)
    watermark_blocks: int
    costs: CostModel  # the replica's cost model (one TP for both phases)


@dataclass(frozen=True, slots=True)
class DriverConfig:
    """The proxy's legs and whether the client sends a conversation id."""

    p_leg_s: float  # proxy -> the first engine (P, or the aggregated replica) and back
    d_leg_s: float  # proxy -> D and the first streamed chunk back (0 in aggregated mode: one leg)
    send_conversation_id: bool
    n_decode: int = 1
    # deployment.handoff (sim/scenario_handoff.py): a serialised prefill-to-decode stage between the legs
    handoff: bool = False
    handoff_fixed_s: float = 0.0
    handoff_per_token_s: float = 0.0  # the prompt's KV bytes per token / the stage's bandwidth
    handoff_serialised: bool = False


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """The router's slice of the run: its entry TTL, how it picks instances, and whether lookups renew leases."""

    ttl_s: float  # an entry older than this is stale (policy.router_ttl_s; inf under lease retention)
    routing: str  # deployment.routing
    n_prefill: int
    n_decode: int
    renews_leases: bool = False  # lease retention: a hit renews D's lease (the heartbeats pass through the router)
    seed: int = 0  # the run's seed: ``random`` routing draws from its own stream of it (router.router_seed)
