"""Priors of the published-benchmark fit: one :class:`ParamSpec` per cost parameter, from hardware and physics.

The method is described in :mod:`kvplan.calibration.published`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from kvplan.calibration.published_series import BENCH_OUTPUT_TOKENS, BENCH_TURNS, BENCH_USER_TOKENS, TOLERANCE
from kvplan.models.arch import (
    ModelArch,
    attention_flops_per_pair,
    kv_bytes_per_token_per_rank,
    linear_flops_per_token,
    weights_bytes_per_gpu,
)
from kvplan.models.costs import CostModel, DecodeCost, OverheadCost, PrefillCost, TransferCost
from kvplan.models.hardware import Node

# --- priors --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ParamSpec:
    """One cost parameter of the published fit: its prior value, spread and bounds.

    ``sigma_log`` is the prior standard deviation of ``ln(p)`` (``None``: fixed at ``prior``, not fitted).
    ``lower``/``upper`` bound the fitted value. ``source`` says where the prior comes from.
    """

    name: str
    prior: float
    sigma_log: float | None
    lower: float
    upper: float
    source: str

    @property
    def fitted(self) -> bool:
        """True when the parameter is estimated (not fixed)."""
        return self.sigma_log is not None


WEAK = math.log(10.0)  # an order of magnitude: lets the data decide
INFORMATIVE = math.log(2.0)  # a factor of two: physics estimate with an uncertain efficiency
HBM_EFFICIENCY = 0.8  # fraction of HBM bandwidth a decode step reaches (memory-bound GEMV)
ALLREDUCE_S = 10e-6  # one small TP all-reduce over NVLink (vLLM custom one-shot all-reduce, latency-bound), s
STEP_OVERHEAD_S = 1e-3  # vLLM V1 scheduling + sampling + launch per step with CUDA graphs, s
ATTENTION_EFFICIENCY_BF16 = 0.65  # measured FlashAttention prefill on H200 (aiconfigurator vLLM 0.24 table)
ATTENTION_EFFICIENCY_SPARSE = 0.30  # DSA indexer scan (FP8) + sparse MLA: no measurement, a guess
LINEAR_EFFICIENCY = 0.5  # prefill GEMM MFU, order of magnitude only (the data fit it)
POST_FIXED_S = 1e-3  # NIXL postDuration floor (IB example: 1.56 ms for 56 descriptors, VLLM_BEHAVIOUR 4)
POLL_S = 5e-4  # idle-engine polling latency; a busy engine's step boundary is simulated explicitly
GLM_DECODE_STEP_S = 0.020  # batch-1 MoE+MLA+DSA step: far above the HBM bound; an assumption
PER_SEQ_S = 5e-5  # sampling and bookkeeping per running sequence in a decode step


def published_priors(arch: ModelArch, node: Node, tp: int) -> list[ParamSpec]:
    """Priors and bounds of every cost parameter for ``arch`` on ``node`` at TP ``tp`` (from physics/hardware).

    Fitted with weak priors (the end points identify them): ``overhead.p_leg_s``, ``overhead.d_leg_s``,
    ``prefill.per_token_s``, ``transfer.fixed_s``, ``transfer.per_descriptor_s``,
    ``transfer.post_per_descriptor_s``. Fitted with informative priors (partly confounded with the
    others): ``prefill.attention_s`` (attention FLOPs per pair at a measured kernel efficiency) and
    ``prefill.fixed_s`` (one read of the weights per step plus launch overhead). Fixed: the bytes/bandwidth
    split of the transfer (line rate), post floor, polling, handshake, and every decode parameter.
    """
    gpu = node.gpu
    mla = arch.attention == "mla"
    peak = gpu.fp8_dense_flops if mla else gpu.bf16_dense_flops
    att_eff = ATTENTION_EFFICIENCY_SPARSE if mla else ATTENTION_EFFICIENCY_BF16
    per_token = linear_flops_per_token(arch) / (tp * peak * LINEAR_EFFICIENCY)
    attention = attention_flops_per_pair(arch) / (tp * peak * att_eff)
    w_gpu = weights_bytes_per_gpu(arch, tp)
    step_fixed = w_gpu / gpu.hbm_bandwidth_bytes_per_s + STEP_OVERHEAD_S
    allreduces = 2 * arch.num_layers * ALLREDUCE_S
    if mla:
        # batch 1 reads the active experts only; real MoE/MLA/DSA steps are far slower than that bound
        decode_fixed = GLM_DECODE_STEP_S
        decode_src = "assumption: ~20 ms per batch-1 step of a 744B-A40B MoE with MLA+DSA at TP8 (not measured)"
        # DSA reads at most index_topk latent tokens; the indexer K cache (per token) is what grows
        ctx_bytes = arch.num_layers * arch.indexer_bytes_per_token_layer
    else:
        decode_fixed = w_gpu / (gpu.hbm_bandwidth_bytes_per_s * HBM_EFFICIENCY) + allreduces + STEP_OVERHEAD_S
        decode_src = (
            f"weights per GPU / ({HBM_EFFICIENCY:.0%} of HBM bandwidth) + 2 all-reduces per layer x "
            f"{ALLREDUCE_S * 1e6:.0f} us + {STEP_OVERHEAD_S * 1e3:.0f} ms step overhead"
        )
        ctx_bytes = kv_bytes_per_token_per_rank(arch, tp)
    per_ctx = ctx_bytes / (gpu.hbm_bandwidth_bytes_per_s * HBM_EFFICIENCY)
    line_rate = node.link.bandwidth_bytes_per_s_per_rank
    return [
        ParamSpec("overhead.p_leg_s", 0.05, WEAK, 1e-4, 1.0, "proxy + HTTP + tokenisation + chat template (fitted)"),
        ParamSpec("overhead.d_leg_s", 0.005, WEAK, 1e-4, 0.5, "proxy -> D + first SSE chunk back (fitted)"),
        ParamSpec("prefill.per_token_s", per_token, WEAK, per_token / 30, per_token * 30,
                  f"linear FLOPs per token / (TP x peak x {LINEAR_EFFICIENCY:.0%}) (fitted)"),
        ParamSpec("prefill.attention_s", attention, INFORMATIVE, attention / 20, attention * 20,
                  f"attention FLOPs per pair / (TP x peak x {att_eff:.0%})"),
        ParamSpec("prefill.fixed_s", step_fixed, INFORMATIVE, step_fixed / 20, step_fixed * 20,
                  "weights per GPU / HBM bandwidth + 1 ms step overhead"),
        ParamSpec("transfer.fixed_s", 0.005, WEAK, 1e-5, 0.1, "per NIXL READ, in xferDuration (fitted)"),
        ParamSpec("transfer.per_descriptor_s", 5e-7, WEAK, 1e-9, 1e-5, "per descriptor, in xferDuration (fitted)"),
        ParamSpec("transfer.post_per_descriptor_s", 1e-6, WEAK, 1e-9, 2e-5,
                  "per descriptor, in postDuration (fitted; 3.2 us seen in vllm #34054)"),
        ParamSpec("transfer.per_byte_s", 1.0 / line_rate, None, 0, 0, f"1 / line rate per GPU ({node.link.description})"),
        ParamSpec("transfer.post_fixed_s", POST_FIXED_S, None, 0, 0, "NIXL post floor (~1 ms)"),
        ParamSpec("transfer.poll_s", POLL_S, None, 0, 0,
                  "idle-engine polling (~0.5 ms); a busy engine's step boundary is already simulated"),
        ParamSpec("transfer.handshake_s", 0.0, None, 0, 0, "one-off per pair; paid during the benchmark's warm-up"),
        ParamSpec("decode.fixed_s", decode_fixed, None, 0, 0, decode_src),
        ParamSpec("decode.per_seq_s", PER_SEQ_S, None, 0, 0, "sampling and bookkeeping per sequence (~50 us)"),
        ParamSpec("decode.per_context_token_s", per_ctx, None, 0, 0,
                  "KV bytes read per context token per rank / (80% of HBM bandwidth)"),
    ]


def costs_from_values(values: Mapping[str, float]) -> CostModel:
    """A :class:`CostModel` from ``{'component.param': value}`` (missing parameters are 0)."""
    parts: dict[str, dict[str, float]] = {"prefill": {}, "transfer": {}, "decode": {}, "overhead": {}}
    for key, value in values.items():
        comp, param = key.split(".", 1)
        parts[comp][param] = float(value)
    return CostModel(
        prefill=PrefillCost(**parts["prefill"]),
        transfer=TransferCost(**parts["transfer"]),
        decode=DecodeCost(**parts["decode"]),
        overhead=OverheadCost(**parts["overhead"]),
    )


def first_turn_bound(points: pd.DataFrame, model: str) -> dict[str, float] | None:
    """An approximate lower bound on ``prefill_on`` at the longest prompt if the first turn were averaged in.

    With the cold first turn included, ``prefill_on(L) >= (T1 + 4 x (xfer(L) + a)) / 5`` where ``T1`` is the
    turn-1 P leg (>= ``prefill_off(L)`` minus the growth of four turns, bounded here by the OFF curve's
    slope) and ``a`` the per-request P overhead (>= the OFF curve's intercept: the chord of a convex curve
    undershoots it). Approximate because it takes the published OFF points at face value and the OFF curve
    as linear between them. Returns the published value, the bound and whether the bound exceeds the +15 %
    tolerance, or ``None`` without the needed points.
    """
    sub = points[points["model"] == model].set_index(["series", "prompt_tokens"])["value_ms"]
    sizes = sorted({int(t) for _, t in sub.index})
    if len(sizes) < 2:
        return None
    lo, hi = sizes[0], sizes[-1]
    try:
        off_lo, off_hi = float(sub[("prefill_off", lo)]), float(sub[("prefill_off", hi)])
        on_hi, kv_hi = float(sub[("prefill_on", hi)]), float(sub[("kv_transfer_on", hi)])
    except KeyError:
        return None
    turns, user, output = BENCH_TURNS, BENCH_USER_TOKENS, BENCH_OUTPUT_TOKENS
    # mean prompt of the 5 turns = prefix + 150 + 2 x 450; turn 1 = prefix + 150
    mean_extra = user + (turns - 1) / 2 * (user + output)
    slope = (off_hi - off_lo) / (hi - lo)  # ms per token, linear in the prompt (attention >= 0 only raises it)
    intercept = off_lo - slope * (lo + mean_extra)
    t1 = off_hi - slope * (turns - 1) / 2 * (user + output)
    bound = (t1 + (turns - 1) * (kv_hi * (1 - TOLERANCE["kv_transfer_on"]) + max(intercept, 0.0))) / turns
    return {
        "prompt_tokens": float(hi),
        "published_prefill_on_ms": on_hi,
        "lower_bound_ms": bound,
        "bound_over_published": bound / on_hi,
        "exceeds_tolerance": float(bound > on_hi * (1 + TOLERANCE["prefill_on"])),
    }
