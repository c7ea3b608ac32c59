"""Scenario: the frozen, validated description of one simulation (YAML top-level sections).

Sections: ``model``, ``hardware``, ``profile``, ``deployment``, ``policy``, ``workload``, optional
``costs`` (inline overrides of cost-model components) and ``seed``. Every field has units in its name
and its description is the CLI help text (``kvplan simulate --help``). Unknown fields are errors.
Never mutate a scenario: build variants with :func:`with_overrides`, which re-validates.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationError, ValidationInfo, field_validator, model_validator

from kvplan.errors import KvplanInputError, input_error
from kvplan.inputfile import decode_text, is_kernel_file
from kvplan.models.arch import MODEL_PRESETS
from kvplan.models.costs import DecodeCost, OverheadCost, PrefillCost, TransferCost
from kvplan.models.hardware import HARDWARE_PRESETS
from kvplan.safe_yaml import load_yaml_text
from kvplan.sim.scenario_base import _Frozen, number_string_hint
from kvplan.sim.scenario_handoff import Handoff
from kvplan.sim.scenario_retention import (  # the policy.retention and policy.offload sections, re-exported
    LeaseRetention as LeaseRetention,
)
from kvplan.sim.scenario_retention import (
    Offload,
    Retention,
    TtlRetention,
)
from kvplan.sim.scenario_retention import TtlEvictableRetention as TtlEvictableRetention
from kvplan.traces.trace import MAX_TRACE_RECORDS, TRACE_FORMAT_TEXT

MAX_SCENARIO_BYTES = 4 * 1024**2
MAX_EMPIRICAL_VALUES = 1_000_000
MAX_INLINE_EMPIRICAL_VALUES = 100_000  # ~1 MiB of YAML; larger samples belong in an empirical 'path' file
# Simulated time must stay where float64 still resolves the link's 1 ns completion slack (sim/link.py EPS_S):
# the spacing of doubles is 1.9e-9 s below 2**24 s and 3.7e-9 s above, where a sub-nanosecond remainder
# no longer advances the clock (livelock). Arrivals and turn gaps are bounded to 1e7 s (116 days) before
# any work; the engine refuses a run whose clock still reaches 2**24 s (overload + long TTL).
MAX_SIM_TIME_S = 1e7
MAX_CONVERSATIONS = 1_000_000
# a streamed run (kvplan simulate) costs ~0.4 KiB per turn (plan, driver lists, exact summary columns): under
# 4 GiB at the limit (benchmarks/bench_scale.py); an in-memory run (api.run, keep=True) ~1 KiB per turn
MAX_TOTAL_TURNS = MAX_TRACE_RECORDS
MAX_TURNS_PER_CONVERSATION = 100_000
MAX_TOKENS = 10_000_000  # per request, far above any context limit (requests beyond max_model_len are cut)
MAX_THRESHOLD_TOKENS = 2**31 - 1  # kv_recompute_threshold (an int32 in vLLM's config); above any context: never pull
MAX_SEED = 2**63 - 1  # a signed 64-bit integer: the seed columns of turns/sweep results are int64
MAX_LOGNORMAL_SIGMA = 10.0
MAX_TIME_SCALE = 1e6


# --- distributions ---------------------------------------------------------------------------------------


class Constant(_Frozen):
    """Always ``value``."""

    dist: Literal["constant"] = "constant"
    value: float = Field(ge=0, description="The value.")


class Exponential(_Frozen):
    """Exponential with the given ``mean``."""

    dist: Literal["exponential"]
    mean: float = Field(gt=0, description="Mean.")


class LogNormal(_Frozen):
    """Log-normal with the given ``median`` (exp(mu)) and ``sigma`` of the underlying normal."""

    dist: Literal["lognormal"]
    median: float = Field(gt=0, description="Median = exp(mu).")
    sigma: float = Field(ge=0, le=MAX_LOGNORMAL_SIGMA, description="Standard deviation of log(value) (<= 10).")


class Uniform(_Frozen):
    """Uniform on [``low``, ``high``]."""

    dist: Literal["uniform"]
    low: float = Field(ge=0, description="Lower bound.")
    high: float = Field(ge=0, description="Upper bound (>= low).")

    @model_validator(mode="after")
    def _order(self) -> Uniform:
        if self.high < self.low:
            raise ValueError("high must be >= low")
        return self


class Empirical(_Frozen):
    """Resample uniformly from ``values``, or from a file of numbers (one per line, or a CSV column)."""

    dist: Literal["empirical"]
    values: tuple[float, ...] | None = Field(default=None, description="The sample to resample from.")
    path: str | None = Field(default=None, description="Text/CSV file of values (first numeric column).")
    column: str | None = Field(default=None, description="CSV column to use (default: the first).")

    @model_validator(mode="after")
    def _one_source(self) -> Empirical:
        if (self.values is None) == (self.path is None):
            raise ValueError("give exactly one of 'values' or 'path'")
        if self.values is not None:
            if not self.values:
                raise ValueError("'values' is empty; give at least one value (or a file of them with 'path:')")
            if len(self.values) > MAX_INLINE_EMPIRICAL_VALUES:
                raise ValueError(
                    f"{len(self.values):,} inline values (more than {MAX_INLINE_EMPIRICAL_VALUES:,}); "
                    "put them in a file and give 'path:'"
                )
            if any((not math.isfinite(v)) or v < 0 for v in self.values):
                raise ValueError("'values' must be finite and >= 0")
        return self


Dist = Annotated[Constant | Exponential | LogNormal | Uniform | Empirical, Field(discriminator="dist")]


def dist_upper(dist: Any) -> float | None:
    """A scale no draw is expected to exceed by much (its value, mean, median, high or sample maximum);
    ``None`` for a sample in a file (checked when read)."""
    if isinstance(dist, Constant):
        return dist.value
    if isinstance(dist, Exponential):
        return dist.mean
    if isinstance(dist, LogNormal):
        return dist.median
    if isinstance(dist, Uniform):
        return dist.high
    if isinstance(dist, Empirical) and dist.values is not None:
        return max(dist.values)
    return None


def dist_mean_inline(dist: Any) -> float | None:
    """The mean of a distribution given inline (``None`` for a file sample)."""
    if isinstance(dist, Constant):
        return dist.value
    if isinstance(dist, Exponential):
        return dist.mean
    if isinstance(dist, LogNormal):
        return float(dist.median * math.exp(min(dist.sigma, 10.0) ** 2 / 2))
    if isinstance(dist, Uniform):
        return (dist.low + dist.high) / 2
    if isinstance(dist, Empirical) and dist.values is not None:
        return math.fsum(dist.values) / len(dist.values)
    return None


# --- sections ---------------------------------------------------------------------------------------------


def _number_not_bool_or_text(v: Any) -> Any:
    """Refuse a YAML bool or a string where a number is meant (pydantic's lax mode would read ``true`` as 1 and
    ``"0.5"`` as 0.5): the fields added for vLLM's memory accounting, max_model_len, history and shared prefixes."""
    if isinstance(v, bool | str):
        raise ValueError(f"{v!r} is not a number (a YAML bool or string); give a plain number")
    return v


class Deployment(_Frozen):
    """Where and how vLLM runs (xPyD, TP, scheduler limits, caches, routing)."""

    # added with vLLM's memory accounting, max_model_len and async scheduling (sim/scenario_base.py: old
    # fingerprints stay)
    OMIT_AT_DEFAULT = frozenset(
        {"kv_cache_dtype", "cudagraph_memory_profiling", "max_model_len", "async_scheduling", "handoff", "kv_transport",
         "kv_post_overlaps_forward"}
    )

    prefill_nodes: int = Field(default=1, gt=0, le=256, description="Prefill instances (one node each).")
    decode_nodes: int = Field(default=1, gt=0, le=256, description="Decode instances (one node each).")
    tensor_parallel_size: int = Field(default=8, gt=0, le=64, description="TP size of every instance (unless per role).")
    prefill_tensor_parallel_size: int | None = Field(
        default=None, gt=0, le=64, description="TP of the prefill instances (default: tensor_parallel_size)."
    )
    decode_tensor_parallel_size: int | None = Field(
        default=None, gt=0, le=64, description="TP of the decode instances (default: tensor_parallel_size)."
    )
    max_num_seqs: int = Field(default=1024, gt=0, le=65_536, description="vLLM --max-num-seqs (P and D).")
    max_num_batched_tokens: int = Field(
        default=8192, gt=0, le=MAX_TOKENS, description="vLLM --max-num-batched-tokens (>= max_num_seqs)."
    )
    prefill_prefix_caching: bool = Field(default=True, description="Prefix caching on P (vLLM default on).")
    decode_prefix_caching: bool = Field(default=True, description="Prefix caching on D (vLLM default on).")
    routing: Literal["round_robin", "sticky", "session_affinity", "prefix_aware", "random"] = Field(
        default="round_robin",
        description="Instance choice: round_robin (reference proxy), sticky / session_affinity (per conversation), "
        "prefix_aware (longest cached prefix, ties to the least loaded), random (uniform per request, seeded: a "
        "Kubernetes ClusterIP Service, kube-proxy iptables mode).",
    )
    mode: Literal["disaggregated", "aggregated"] = Field(
        default="disaggregated",
        description="disaggregated: P/D nodes; aggregated: `replicas` vLLM engines doing both phases (no transfer).",
    )
    replicas: int = Field(
        default=1, gt=0, le=512, description="Aggregated mode: engines (one node of TP GPUs each); P/D counts unused."
    )
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0, le=1,
        description="vLLM --gpu-memory-utilization: the share of the device's total memory the engine sizes its KV pool in.",
    )
    kv_cache_dtype: Literal["auto", "bf16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla"] = Field(
        default="auto",
        description="vLLM --kv-cache-dtype (auto: the model preset's; fp8 halves KV bytes per token, pool and transfers).",
    )
    cudagraph_memory_profiling: bool = Field(
        default=False,
        description="VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 (vLLM >= 0.19 default): CUDA-graph memory leaves the pool.",
    )
    decode_kv_capacity_tokens: int | None = Field(
        default=None, gt=0, le=10**12, description="Override D's KV pool (tokens); default from HBM and weights."
    )
    prefill_kv_capacity_tokens: int | None = Field(
        default=None, gt=0, le=10**12, description="Override P's prefix-cache pool (tokens); default from HBM."
    )
    cross_layer_blocks: bool = Field(default=False, description="enable_cross_layers_blocks (fewer descriptors).")
    link: str | None = Field(default=None, description="Override the hardware's link preset (e.g. tcp).")
    kv_transport: Literal["rdma", "tcp"] = Field(
        default="rdma",
        description="Who moves the KV bytes of a NIXL read: rdma (the NIC: EFA/LIBFABRIC, verbs) or tcp (UCX's TCP "
                    "transport, UCX_TLS without an RDMA transport: the bytes move in progress calls on one locked UCX "
                    "worker that the reader's post and checks share with NIXL's progress thread, so its engine thread is "
                    "busy for the read's wire time; transfer.thread_per_byte_s = the link's per_byte_s).",
    )
    kv_post_overlaps_forward: bool = Field(
        default=True,
        description="Whether a reader engine's read posting (start_load_kv: make_prepped_xfer + transfer) runs while "
                    "the step's forward is on the GPU (vLLM PR #53333, current vLLM: the step ends when both are done); "
                    "false: it runs before the forward is launched, so the step lasts the posting work plus the forward "
                    "(vLLM before that PR, e.g. neuralmagic/vllm disagg_pd_dev @ 8beac5e, gpu_model_runner.execute_model "
                    "calls start_load_kv in maybe_setup_kv_connector before self.model).",
    )
    max_model_len: int | None = Field(
        default=None, ge=2, le=MAX_TOKENS, description="vLLM --max-model-len: context limit of this deployment (default: "
        "the model's; at most it). Requests beyond it are cut (synthetic) or skipped/truncated (traces).",
    )
    kv_watermark: float = Field(
        default=0.0, ge=0, lt=1,
        description="vLLM SchedulerConfig.watermark: fraction of D's (or an aggregated replica's) KV blocks kept free "
                    "when admitting.",
    )
    async_scheduling: bool = Field(
        default=False,
        description="vLLM --async-scheduling (PR #19970; the default in current vLLM): the scheduler plans step N+1 "
                    "while step N runs, so a request arriving (or a receive finishing) during a step joins one step "
                    "later (P and D engines; aggregated replicas do not model it). Off here: the shipped profiles were "
                    "calibrated without it.",
    )

    handoff: Handoff | None = Field(
        default=None,
        description="A serialised prefill-to-decode handoff stage of a non-vLLM P/D stack (sim/scenario_handoff.py; "
                    "e.g. Dynamo + TensorRT-LLM's cache transceiver); null: vLLM's proxy sequence only.",
    )

    _numbers = field_validator("gpu_memory_utilization", "max_model_len", mode="before")(_number_not_bool_or_text)

    @model_validator(mode="after")
    def _vllm_scheduler_rules(self) -> Deployment:
        # vLLM SchedulerConfig._verify_args (vllm/config/scheduler.py) refuses to start otherwise
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise ValueError(
                f"max_num_batched_tokens ({self.max_num_batched_tokens}) must be >= max_num_seqs ({self.max_num_seqs}),"
                " as vLLM requires; raise max_num_batched_tokens or lower max_num_seqs"
            )
        if self.handoff is not None and self.mode == "aggregated":
            raise ValueError("handoff is a stage between the P and D legs; aggregated mode has none (drop handoff "
                             "or use mode: disaggregated)")
        return self


class Policy(_Frozen):
    """The bidirectional-transfer knobs (``--kv-transfer-config``) and the router's."""

    bidirectional: bool = Field(default=True, description="bidirectional_kv_xfer: D retains, P pulls back.")
    decoder_kv_blocks_ttl_s: float = Field(
        default=480.0, ge=0, le=MAX_SIM_TIME_S,
        description="vLLM's decoder_kv_blocks_ttl, s: how long D pins a finished turn's KV for P to read back, from the "
        "turn's finish, never renewed (<= 1e7 s)."
    )
    kv_recompute_threshold_tokens: int = Field(
        default=64, ge=0, le=MAX_THRESHOLD_TOKENS,
        description="vLLM's kv_recompute_threshold, tokens: P pulls the KV it lacks only if at least this many tokens, "
        "else recomputes them."
    )
    router_ttl_s: float = Field(
        default=450.0, ge=0, le=MAX_SIM_TIME_S,
        description="The router's conversation-entry lifetime, s (the reference proxy hard-codes 450 s; keep it below "
        "decoder_kv_blocks_ttl_s - expiry_safety_margin_s)."
    )
    kv_load_failure_policy: Literal["fail", "recompute"] = Field(
        default="fail",
        description="vLLM's kv_load_failure_policy: a declined or failed read fails the request (fail, vLLM's default) "
        "or recomputes it locally (recompute)."
    )
    expiry_safety_margin_s: float = Field(
        default=5.0, ge=0, le=3600, description="P declines if now+margin>=expiry (<= 1 h)."
    )
    clock_skew_s: float = Field(
        default=0.0, ge=-3600, le=3600, description="P clock minus D clock error after offset estimation (|x| <= 1 h)."
    )
    threshold_applies_to_p2d: bool | None = Field(
        default=None,
        description="D recomputes P->D tails below the threshold (vLLM PR #55801); default: on when bidirectional.",
    )
    send_conversation_id: bool = Field(default=True, description="Client sends conversation_id (else all miss).")
    kv_lease_duration_s: float = Field(
        default=30.0, gt=0, le=86_400,
        description="kv_lease_duration: P holds a prompt's KV this long for D's read, renewed by D's heartbeats.",
    )
    retention: Retention = Field(
        default_factory=TtlRetention, description="D retention: ttl (vLLM), lease (proposal) or ttl_evictable."
    )
    offload: Offload | None = Field(default=None, description="CPU offload tier on D (off by default).")


class PoissonArrival(_Frozen):
    """Open loop: new conversations arrive as a Poisson stream (or gamma gaps, vLLM ``get_request``'s burstiness)."""

    kind: Literal["poisson"]
    rate_per_s: float = Field(gt=0, le=1e6, description="New conversations per second.")
    burstiness: float = Field(
        default=1.0, gt=0, le=1000,
        description="vLLM benchmark_serving --burstiness: gamma gaps of this shape at the same rate (1 = Poisson).",
    )


class ClosedLoopArrival(_Frozen):
    """vLLM multi-turn benchmark: N clients cycle round-robin over their active conversations."""

    kind: Literal["closed_loop"]
    clients: int = Field(gt=0, le=100_000, description="--num-clients.")
    max_active_conversations: int = Field(
        gt=0, le=MAX_CONVERSATIONS, description="--max-active-conversations (split over clients)."
    )


Arrival = Annotated[PoissonArrival | ClosedLoopArrival, Field(discriminator="kind")]


class TraceSource(_Frozen):
    """Replay a real request trace: its own arrival clock (open loop), tokens and conversation structure."""

    OMIT_AT_DEFAULT = frozenset({"timing", "shared_prefix"})  # added with the weka format (sim/scenario_base.py)

    path: str = Field(description=f"Trace file: {TRACE_FORMAT_TEXT}.")
    format: Literal["mooncake", "multiturn", "ragpulse", "csv", "azure", "lmbench", "weka", "bench"] | None = Field(
        default=None, description="Trace format (default: detected from the content; a directory is weka)."
    )
    timing: Literal["think", "original"] | None = Field(
        default=None, description="weka only: think (default) sends each request think_time after the previous "
        "answer; original replays every request at its recorded t."
    )
    time_scale: float = Field(
        default=1.0, ge=1e-6, le=MAX_TIME_SCALE, description="Speed-up of arrivals (2 = twice as fast)."
    )
    window_s: tuple[float, float] | None = Field(default=None, description="Keep arrivals in [start, end) s.")
    sample_sessions: float | None = Field(default=None, gt=0, le=1, description="Fraction of sessions to keep.")
    overlong: Literal["skip", "truncate"] = Field(
        default="skip", description="Requests beyond the model's context limit: skip or truncate (counted)."
    )
    shared_prefix: bool | None = Field(
        default=None, description="weka only: sessions with the same tool_tokens and system_tokens share those "
        "tokens as a prefix held once per node (sim/shared.py); default off (each session's own).",
    )

    @model_validator(mode="after")
    def _window(self) -> TraceSource:
        if self.window_s is not None and not (0 <= self.window_s[0] < self.window_s[1]):
            raise ValueError("window_s must be [start, end) with 0 <= start < end (seconds)")
        return self


class Workload(_Frozen):
    """Multi-turn conversations. Token and turn counts drawn from distributions are rounded to integers."""

    # added with workload.history and shared prefixes (sim/scenario_base.py: old fingerprints stay)
    OMIT_AT_DEFAULT = frozenset({"history", "history_kept_share", "shared_prefix_tokens", "shared_prefix_groups",
                                 "first_turn_user_tokens"})

    conversations: int = Field(default=100, gt=0, le=MAX_CONVERSATIONS, description="Conversations to simulate.")
    arrival: Arrival = Field(
        default=PoissonArrival(kind="poisson", rate_per_s=0.1), description="poisson or closed_loop."
    )
    turns: Dist = Field(default=Constant(value=5), description="User turns per conversation (>= 1).")
    prefix_tokens: Dist = Field(default=Constant(value=2000), description="System+tools+documents on turn 1.")
    user_tokens: Dist = Field(default=Constant(value=150), description="New user/tool tokens per turn.")
    first_turn_user_tokens: bool = Field(
        default=True, description="Turn 1's prompt is prefix_tokens plus a user_tokens draw (true, the default) or "
        "prefix_tokens alone (false: prefix_tokens is the whole first prompt, as `kvplan workload fit` measures it "
        "from a trace). The draw is made either way, so the other draws of a seed do not move.",
    )
    output_tokens: Dist = Field(default=Constant(value=300), description="Response tokens (>= 1).")
    turn_gap_s: Dist = Field(
        default=Constant(value=0.0), description="End of a response to the next turn's arrival (think/tool time)."
    )
    trace: TraceSource | None = Field(
        default=None, description="Replay a trace instead: replaces every synthetic field above."
    )
    history: Literal["verbatim", "prompt_only", "partial"] | None = Field(
        default=None, description="What of the previous turn the next prompt repeats token for token (sim/history.py): "
        "verbatim (default: prompt and output), prompt_only (the output is re-rendered, e.g. reasoning dropped) or "
        "partial (the first history_kept_share of the previous context).",
    )
    history_kept_share: float | None = Field(
        default=None, ge=0, le=1, description="history: partial only: share of the previous context (prompt + output) "
        "the next prompt repeats as its prefix.",
    )

    shared_prefix_tokens: int | None = Field(
        default=None, ge=0, le=MAX_TOKENS, description="Tokens at the start of every conversation's first prompt "
        "(within prefix_tokens) that all conversations of a group share (system prompt, tool definitions): computed, "
        "stored and pinned once per node (sim/shared.py).",
    )
    shared_prefix_groups: int | None = Field(
        default=None, ge=1, le=MAX_CONVERSATIONS, description="Groups sharing a prefix each (conversation c in "
        "group c mod groups; default 1: one prefix shared by all).",
    )

    _numbers = field_validator("history_kept_share", "shared_prefix_tokens", "shared_prefix_groups",
                               mode="before")(_number_not_bool_or_text)

    @model_validator(mode="after")
    def _history(self) -> Workload:
        if self.shared_prefix_groups is not None and self.shared_prefix_tokens is None:
            raise ValueError("shared_prefix_groups needs shared_prefix_tokens (the tokens each group shares)")
        if self.shared_prefix_tokens is not None and self.trace is not None and self.trace.shared_prefix:
            raise ValueError("shared_prefix_tokens and trace.shared_prefix both set the shared prefix; keep one "
                             "(trace.shared_prefix: the trace's tool_tokens + system_tokens)")
        top = _true_upper(self.prefix_tokens)
        if self.trace is None and self.shared_prefix_tokens is not None and top is not None \
                and self.shared_prefix_tokens > top:
            raise ValueError(f"shared_prefix_tokens ({self.shared_prefix_tokens}) exceeds every conversation's "
                             f"prefix_tokens (at most {top:g}): the shared prefix is part of the first prompt's prefix; "
                             "lower shared_prefix_tokens or raise prefix_tokens")
        if (self.history == "partial") != (self.history_kept_share is not None):
            raise ValueError("history_kept_share goes with history: partial, and history: partial needs it "
                             "(e.g. history_kept_share: 0.5)")
        return self

    @model_validator(mode="after")
    def _sizes(self) -> Workload:
        """Bound what the run may cost before any draw: per-draw ranges, total turns, simulated time span."""
        for name, limit, unit in _DIST_LIMITS:
            hi = dist_upper(getattr(self, name))
            if hi is not None and hi > limit:
                raise ValueError(f"{name}: {hi:.4g} {unit} is beyond the limit of {limit:.4g} {unit}")
        for name in ("turns", "output_tokens"):  # vLLM samples at least one token; a conversation has a turn
            low = _dist_lowest(getattr(self, name))
            if low is not None and low < 0.5:
                raise ValueError(f"{name}: a draw of {low:g} rounds to 0; every value must be >= 1 "
                                 f"(vLLM generates at least one token, a conversation has at least one turn)")
        if self.trace is not None:
            return self
        mean_turns = dist_mean_inline(self.turns)
        if mean_turns is not None and self.conversations * max(1.0, mean_turns) > MAX_TOTAL_TURNS:
            raise ValueError(
                f"conversations x mean turns = {self.conversations * max(1.0, mean_turns):,.0f} turns (more than "
                f"{MAX_TOTAL_TURNS:,}); lower conversations or turns, or split the run into a sweep's replications"
            )
        mean_gap = dist_mean_inline(self.turn_gap_s)
        span = 0.0
        if isinstance(self.arrival, PoissonArrival):
            span = self.conversations / self.arrival.rate_per_s
        if mean_gap is not None and mean_turns is not None:
            span = max(span, mean_gap * max(mean_turns - 1.0, 0.0))
        if span > MAX_SIM_TIME_S:
            raise ValueError(
                f"arrivals and turn gaps span about {span:.3g} s of simulated time (more than {MAX_SIM_TIME_S:.0e} s, "
                "which float time cannot resolve to the nanosecond); raise arrival.rate_per_s or shorten turn_gap_s"
            )
        return self


def _dist_lowest(dist: Any) -> float | None:
    """The lowest value an inline distribution can draw when it has one (None: unbounded or from a file)."""
    if isinstance(dist, Constant):
        return float(dist.value)
    if isinstance(dist, Uniform):
        return float(dist.high)  # the whole range below 0.5 is the problem; a low end of 0 is just a tail
    if isinstance(dist, Empirical) and dist.values is not None and len(dist.values):
        return float(min(dist.values))
    return None


def _true_upper(dist: Any) -> float | None:
    """The largest value a distribution can draw when it has one (constant, uniform, inline empirical)."""
    if isinstance(dist, Constant | Uniform) or (isinstance(dist, Empirical) and dist.values is not None):
        return dist_upper(dist)
    return None


_DIST_LIMITS = (
    ("turns", MAX_TURNS_PER_CONVERSATION, "turns"),
    ("prefix_tokens", MAX_TOKENS, "tokens"),
    ("user_tokens", MAX_TOKENS, "tokens"),
    ("output_tokens", MAX_TOKENS, "tokens"),
    ("turn_gap_s", MAX_SIM_TIME_S, "s"),
)


_COST_COMPONENTS: dict[str, type[BaseModel]] = {
    "prefill": PrefillCost, "transfer": TransferCost, "decode": DecodeCost, "overhead": OverheadCost,
}


#: Largest magnitude of an inline cost parameter (seconds or seconds per unit), checked before conversion.
MAX_COST_VALUE = 1e6
#: Longest knot list of an inline cost parameter (the shipped priors have 13).
MAX_COST_KNOTS = 256


def _check_cost_value(comp: str, key: str, value: Any) -> None:
    """Refuse, before any conversion, what an inline cost parameter cannot be: a bool, a string (YAML 1.1
    reads ``5e-4`` as a string; write ``5.0e-4``), a non-finite or huge number, or a long or non-numeric
    knot list. The knot lists (``*_knots*``) are lists of numbers; everything else one number or null."""
    where = f"costs.{comp}.{key}"
    if isinstance(value, list | tuple):
        if "knots" not in key:
            raise ValueError(f"{where} is a list; give one number")
        if len(value) > MAX_COST_KNOTS:
            raise ValueError(f"{where} has {len(value)} knots, more than {MAX_COST_KNOTS}")
        for i, item in enumerate(value):
            _check_cost_value(comp, f"{key}[{i}]", item)
        return
    if value is None and key == "context_attention_s":
        return
    if isinstance(value, str):
        raise ValueError(f"{where} {number_string_hint(value)}")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where} is {type(value).__name__}, not a number")
    if isinstance(value, int) and abs(value) > 10**15:  # before float(): a 4,000-digit int overflows
        raise ValueError(f"{where} = an integer of {value.bit_length()} bits is larger than {MAX_COST_VALUE:g}")
    if not (math.isfinite(value) and abs(value) <= MAX_COST_VALUE):
        raise ValueError(f"{where} = {value} must be a finite number of at most {MAX_COST_VALUE:g} "
                         "(seconds or seconds/unit)")


class CostOverrides(_Frozen):
    """Inline cost parameters: each named parameter replaces the profile's, the others stay the profile's."""

    prefill: dict[str, Any] | None = Field(default=None, description="Prefill parameters to replace.")
    transfer: dict[str, Any] | None = Field(default=None, description="Transfer parameters to replace.")
    decode: dict[str, Any] | None = Field(default=None, description="Decode parameters to replace.")
    overhead: dict[str, Any] | None = Field(default=None, description="Overhead parameters to replace.")

    @field_validator("prefill", "transfer", "decode", "overhead")
    @classmethod
    def _known_parameters(cls, v: dict[str, Any] | None, info: ValidationInfo) -> dict[str, Any] | None:
        if v is None:
            return None
        comp = str(info.field_name)
        model = _COST_COMPONENTS[comp]
        known = set(model.model_fields)
        for key in v:
            if key not in known:
                raise ValueError(f"unknown parameter '{key}' of costs.{comp}; known: {', '.join(sorted(known))}")
        for key, value in v.items():
            _check_cost_value(comp, key, value)
        typed = model.model_validate(v)  # types and ranges of the named parameters
        # the typed values (floats, tuples), so the compiled build and the bounds never see a list or a string
        return {key: getattr(typed, key) for key in v}


class Simulation(_Frozen):
    """Engine options (not properties of the system)."""

    OMIT_AT_DEFAULT = frozenset({"allow_unreliable_profile"})  # added with calibrate --scenario (sim/scenario_base.py)

    decode_mode: Literal["fast", "exact"] = Field(
        default="fast", description="fast: jump between batch changes; exact: one event per decode step."
    )
    allow_unreliable_profile: bool = Field(
        default=False, description="Use a profile of status 'unreliable' (a calibration that failed its self-check)."
    )


class Scenario(_Frozen):
    """One what-if: model, hardware, profile, deployment, policy, workload, cost overrides, seed."""

    model: str | dict[str, Any] = Field(default="qwen3-32b", description=f"Model preset ({', '.join(MODEL_PRESETS)}) "
                                        "or an inline spec.")
    hardware: str | dict[str, Any] = Field(
        default="p5en", description="Hardware preset, an instance of GPUs and its network ("
        + ", ".join(f"{n.name}: {n.gpus_per_node}x {n.gpu.name}" for k, n in HARDWARE_PRESETS.items()
                    if not k.endswith("-tcp")) + "; each with a -tcp twin on the UCX/TCP fallback) or an inline spec.")
    profile: str | None = Field(default=None, description="Profile name or JSON path (default: <hw>-<model>).")
    deployment: Deployment = Field(default_factory=Deployment, description="Deployment.")
    policy: Policy = Field(default_factory=Policy, description="Bidirectional transfer policy.")
    workload: Workload = Field(default_factory=Workload, description="Workload.")
    costs: CostOverrides = Field(default_factory=CostOverrides, description="Inline cost overrides.")
    simulation: Simulation = Field(default_factory=Simulation, description="Engine options.")
    seed: int = Field(default=0, ge=0, le=MAX_SEED, description="Root seed of every random stream.")

    @model_validator(mode="after")
    def _consistent(self) -> Scenario:
        """Refuse combinations that would run as something else in silence: an aggregated engine has no D
        retention, so a lease/ttl_evictable retention or a CPU offload tier there would change nothing."""
        if self.deployment.mode == "aggregated":
            if self.policy.retention.kind != "ttl":
                raise ValueError(f"[[policy.retention]] kind {self.policy.retention.kind} has no effect in "
                                 "deployment.mode aggregated (no decode node retains KV); remove it or use disaggregated")
            if self.policy.offload is not None:
                raise ValueError("[[policy.offload]] has no effect in deployment.mode aggregated (no decode node "
                                 "retains KV); remove it or use disaggregated")
        return self


# --- loading ----------------------------------------------------------------------------------------------


def _format_validation_error(exc: ValidationError, where: str) -> KvplanInputError:
    err = exc.errors()[0]
    raw = tuple(err["loc"])
    if len(raw) == 2 and raw[0] in _PRESET_OR_SPEC and raw[1] in ("str", "dict[str,any]"):
        # ``model`` / ``hardware``: a preset name or an inline spec (pydantic tags the union member it tried)
        from kvplan.models.arch import MODEL_PRESETS
        from kvplan.models.hardware import HARDWARE_PRESETS

        names = MODEL_PRESETS if raw[0] == "model" else HARDWARE_PRESETS
        return input_error(f"{where}: field '{raw[0]}'", f"expected a preset name or an inline spec (a mapping), got "
                           f"{type(err.get('input')).__name__}", f"use one of {', '.join(names)} or an inline spec")
    # drop pydantic's union-member tags (e.g. 'constant') from the location
    loc = ".".join(str(p) for p in err["loc"] if not (isinstance(p, str) and p in _UNION_TAGS))
    msg = str(err["msg"]).removeprefix("Value error, ")
    if msg.startswith("[[") and "]]" in msg:  # scenario_base._Frozen names the field inside its section
        key, msg = msg[2:].split("]]", 1)
        loc, msg = (f"{loc}.{key}" if loc else key), msg.strip()
    if err["type"] == "extra_forbidden":
        msg = "unknown field (check the spelling; `kvplan simulate --help` lists every field)"
    elif err["type"] == "union_tag_invalid":
        msg = f"{msg}"
    return input_error(f"{where}: field '{loc}'" if loc else where, msg)


_PRESET_OR_SPEC = ("model", "hardware")  # fields typed ``str | dict``: a preset name or an inline spec

# ("ttl" is left out: it is also a plausible misspelt field name, e.g. ``policy.ttl``)
_UNION_TAGS = {"constant", "exponential", "lognormal", "uniform", "empirical", "poisson", "closed_loop", "lease",
               "ttl_evictable"}


def scenario_from_dict(data: Any, where: str = "scenario") -> Scenario:
    """Validate a mapping into a :class:`Scenario`, raising a one-line :class:`KvplanInputError`."""
    if not isinstance(data, dict):
        raise input_error(where, "expected a mapping with sections model, hardware, deployment, policy, workload")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        raise _format_validation_error(exc, where) from None


def read_yaml_file(path: str | Path, what: str = "scenario",
                   hint: str = "see `kvplan simulate --help` for the fields") -> Any:
    """The parsed content of a scenario or grid YAML file (size-bounded, safe loader, one-line errors)."""
    p = Path(path)
    if not p.is_file():
        if p.is_dir():
            raise input_error(str(p), f"is a directory, not a {what} file", f"pass the {what} YAML file itself")
        if p.exists():  # a FIFO, socket or device: reading it could block or never end
            raise input_error(str(p), f"is not a regular file, so it was not read as a {what}",
                              "copy it to a regular YAML file first")
        raise input_error(str(p), f"no such {what} file")
    st = p.stat()
    if st.st_size == 0 and is_kernel_file(st):  # /proc/kmsg blocked the read forever; /proc/self/status parsed
        raise input_error(str(p), f"is a special file of the kernel (/proc, /sys), not a {what} file, so it was not "
                          "read", "copy its content to a regular YAML file first")
    if st.st_size > MAX_SCENARIO_BYTES:
        raise input_error(str(p), f"{what} larger than 4 MiB", "put large samples in an empirical 'path' file")
    data = p.read_bytes()
    # compressed, UTF-16/32, binary (a NUL byte) or not UTF-8 (naming the line): decoding with replacement characters
    # called a binary file 'invalid YAML (truncated or mis-indented file?)' and turned a Latin-1 'é' in a value into
    # U+FFFD silently
    text = decode_text(data, str(p))
    if not text.strip():
        raise input_error(str(p), f"empty {what} file", hint)
    data = load_yaml_text(text, str(p))
    if data is None:
        raise input_error(str(p), f"empty {what} file", hint)
    return data


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario YAML file (size-bounded, safe loader, one-line errors). A relative file path
    inside it (``workload.trace.path``, an empirical distribution's ``path``, a ``profile`` JSON) is the file's
    neighbour: :func:`resolve_relative_paths`."""
    data = read_yaml_file(path)
    if isinstance(data, dict):
        data = resolve_relative_paths(data, Path(path).parent)
    return scenario_from_dict(data, where=str(Path(path)))


def _near(value: str, base_dir: Path) -> str:
    """``value`` resolved beside the scenario: absolute as given; relative, the file in ``base_dir`` when it exists
    there, else the one relative to the working directory when that exists (what older scenarios relied on), else
    the path in ``base_dir`` (so that the error names where it was looked for). A path found is made absolute, so
    the ``scenario.yaml`` a result records replays from anywhere."""
    p = Path(value)
    if p.is_absolute() or not value:
        return value
    near = base_dir / p
    if near.exists():
        return os.path.abspath(near)
    if p.exists():
        return os.path.abspath(p)
    return str(near)


def resolve_relative_paths(data: dict[str, Any], base_dir: Path) -> dict[str, Any]:
    """A copy of scenario mapping ``data`` whose relative file paths are resolved by :func:`_near`: the trace's,
    every empirical distribution's and a ``profile`` that names a JSON file (a preset name stays a name)."""

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            out = {k: walk(v) for k, v in node.items()}
            if out.get("dist") == "empirical" and isinstance(out.get("path"), str):
                out["path"] = _near(out["path"], base_dir)
            return out
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    out = walk(data)
    wl = out.get("workload")
    trace = wl.get("trace") if isinstance(wl, dict) else None
    if isinstance(trace, dict) and isinstance(trace.get("path"), str):
        trace["path"] = _near(trace["path"], base_dir)
    prof = out.get("profile")
    if isinstance(prof, str) and (prof.endswith(".json") or "/" in prof or os.sep in prof):
        out["profile"] = _near(prof, base_dir)
    return out


def as_scenario(scenario: Scenario | Mapping[str, Any] | str | Path) -> Scenario:
    """The one way a scenario argument (object, mapping or YAML path) becomes a validated :class:`Scenario`."""
    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, Mapping):
        return scenario_from_dict(dict(scenario))
    return load_scenario(scenario)


def with_overrides(scenario: Scenario, overrides: dict[str, Any]) -> Scenario:
    """A new validated scenario with dotted-path overrides applied (e.g. ``policy.decoder_kv_blocks_ttl_s``)."""
    data = scenario.model_dump(mode="python", exclude_none=False)
    for dotted, value in overrides.items():
        node: Any = data
        parts = dotted.split(".")
        for part in parts[:-1]:
            if not isinstance(node, dict) or part not in node or not isinstance(node[part], dict):
                if isinstance(node, dict) and node.get(part) is None and part in node:
                    node[part] = {}
                else:
                    raise input_error(f"override '{dotted}'", f"no section '{part}' in the scenario")
            node = node[part]
        node[parts[-1]] = value
    return scenario_from_dict(data, where="scenario with overrides")


def field_help() -> list[tuple[str, str, str]]:
    """Every scenario field as (dotted path, default, description), for ``--help`` and the docs."""
    rows: list[tuple[str, str, str]] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name, f in model.model_fields.items():
            ann = f.annotation
            sub = ann if isinstance(ann, type) and issubclass(ann, BaseModel) else None
            if sub is not None and sub not in (Scenario,):
                walk(sub, f"{prefix}{name}.")
                continue
            default = "" if f.is_required() else repr(f.get_default(call_default_factory=True))
            if hasattr(f.get_default(call_default_factory=True), "model_dump"):
                default = str(f.get_default(call_default_factory=True).model_dump())
            rows.append((f"{prefix}{name}", default, f.description or ""))

    walk(Scenario, "")
    return rows
