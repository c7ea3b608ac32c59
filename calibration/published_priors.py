"""Priors of the published-benchmark fit: one :class:`ParamSpec` per cost parameter, from hardware and physics.

The method is described in :mod:`kvplan.calibration.published`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from kvplan.calibration.published_series import BENCH_OUTPUT_TOKENS, BENCH_TURNS, BENCH_USER_TOKENS, TOLERANCE
from kvplan.models.arch import ModelArch
from kvplan.models.costs import CostModel, scale_prefill_gpu
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
INFORMATIVE = math.log(2.0)  # a factor of two
DECODE_STEP_OVERHEAD_S = 5e-4  # vLLM V1 engine-core CPU time per decode step left after async scheduling
POST_FIXED_S = 1e-3  # NIXL postDuration floor (IB example: 1.56 ms for 56 descriptors, VLLM_BEHAVIOUR 4)
POLL_S = 5e-4  # idle-engine polling latency; a busy engine's step boundary is simulated explicitly


LINEAR_SCALE = "prefill.linear_scale"
ATTENTION_SCALE = "prefill.attention_scale"
#: Prior spread of the prefill GPU-time corrections: the kernel data are vLLM 0.24 (aiconfigurator), the
#: published runs vLLM 0.29; a +-25 % (1 sigma) version/setup difference is assumed.
GPU_SCALE_SIGMA = math.log(1.25)


def gpu_scale_lower(arch: ModelArch, node: Node, tp: int, compute: CostModel, name: str) -> float:
    """The smallest factor ``name`` keeping every prefill term at or above its physical bound (bisection)."""
    from kvplan.models.bounds import bound_violations

    def ok(k: float) -> bool:
        return not bound_violations(costs_from_values({name: k}, compute), arch, node, tp)

    lo, hi = 0.05, 1.0
    if ok(lo):
        return lo
    for _ in range(40):
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi


def published_priors(arch: ModelArch, node: Node, tp: int) -> list[ParamSpec]:
    """Priors and bounds of the **residual** parameters fitted on top of the compute prior.

    GPU compute (every prefill and decode kernel term) is held at the (model, GPU, TP) kernel-derived prior
    (:func:`kvplan.models.resolve.compute_prior`). Fitted with weak priors: the engine's per-step CPU overhead
    on P (``prefill.overhead_s``), the proxy/HTTP legs (``overhead.p_leg_s``, ``overhead.d_leg_s``) and the
    transfer latencies (``transfer.fixed_s``, ``transfer.per_descriptor_s``, and ``transfer.prep_per_descriptor_s``
    for request creation; the post is inside xferDuration).
    Fixed: the bandwidth term (1 / line rate), post floor, polling, handshake and D's per-step overhead.
    """
    line_rate = node.link.bandwidth_bytes_per_s_per_rank
    return [
        ParamSpec(LINEAR_SCALE, 1.0, GPU_SCALE_SIGMA, 0.05, 4.0,
                  "correction of the kernel-derived prefill linear layers for the served vLLM version (fitted; its "
                  "lower bound keeps every term physically possible)"),
        ParamSpec(ATTENTION_SCALE, 1.0, GPU_SCALE_SIGMA, 0.05, 4.0,
                  "correction of the kernel-derived prefill attention for the served vLLM version (fitted; its lower "
                  "bound keeps it physically possible)"),
        ParamSpec("overhead.p_leg_s", 0.05, WEAK, 1e-4, 1.0, "proxy + HTTP + tokenisation + chat template (fitted)"),
        ParamSpec("overhead.d_leg_s", 0.005, WEAK, 1e-4, 0.5, "proxy -> D + first SSE chunk back (fitted)"),
        ParamSpec("prefill.overhead_s", 0.005, WEAK, 1e-4, 0.5,
                  "engine CPU time per prefill step: scheduler, input preparation, sampling (fitted)"),
        ParamSpec("transfer.fixed_s", 0.005, WEAK, 1e-5, 0.1, "per NIXL READ, in xferDuration (fitted)"),
        ParamSpec("transfer.per_descriptor_s", 5e-7, WEAK, 1e-9, 1e-5, "per descriptor, in xferDuration (fitted)"),
        ParamSpec("transfer.prep_per_descriptor_s", 1e-6, WEAK, 1e-9, 2e-5,
                  "per descriptor, NIXL request creation before the post (makeXferReq/prepXfer), outside "
                  "xferDuration (fitted: identified only by prefill ON minus kv_transfer_on, an effective value)"),
        ParamSpec("transfer.post_per_descriptor_s", 0.0, None, 0, 0,
                  "not identifiable (no postDuration is published); the post is part of xferDuration and enters "
                  "no modelled time (models/costs.py TransferCost)"),
        ParamSpec("transfer.per_byte_s", 1.0 / line_rate, None, 0, 0, f"1 / line rate per GPU ({node.link.description})"),
        ParamSpec("transfer.post_fixed_s", POST_FIXED_S, None, 0, 0, "NIXL post floor (~1 ms)"),
        ParamSpec("transfer.poll_s", POLL_S, None, 0, 0,
                  "idle-engine polling (~0.5 ms); a busy engine's step boundary is already simulated"),
        ParamSpec("transfer.handshake_s", 0.0, None, 0, 0, "one-off per pair; paid during the benchmark's warm-up"),
        ParamSpec("decode.overhead_s", DECODE_STEP_OVERHEAD_S, INFORMATIVE, 1e-5, 5e-3,
                  "engine CPU time per decode step not hidden by async scheduling (prior 0.5 ms; fitted)"),
    ]


def costs_from_values(values: Mapping[str, float], base: CostModel | None = None) -> CostModel:
    """``base`` (default: all zero) with the parameters ``{'component.param': value}`` replaced; ``prefill.gpu_scale``
    and ``prefill.attention_scale`` multiply the base's prefill linear-layer and attention terms
    (:func:`kvplan.models.costs.scale_prefill_gpu`)."""
    b = base or CostModel()
    vals = dict(values)
    lin, att = vals.pop(LINEAR_SCALE, 1.0), vals.pop(ATTENTION_SCALE, 1.0)
    if (lin, att) != (1.0, 1.0):
        b = b.model_copy(update={"prefill": scale_prefill_gpu(b.prefill, lin, att)})
    parts: dict[str, dict[str, float]] = {"prefill": {}, "transfer": {}, "decode": {}, "overhead": {}}
    for key, value in vals.items():
        comp, param = key.split(".", 1)
        parts[comp][param] = float(value)
    return CostModel(
        prefill=b.prefill.model_copy(update=parts["prefill"]),
        transfer=b.transfer.model_copy(update=parts["transfer"]),
        decode=b.decode.model_copy(update=parts["decode"]),
        overhead=b.overhead.model_copy(update=parts["overhead"]),
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
