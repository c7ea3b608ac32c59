"""Physical bounds of cost parameters: nothing faster than the GPU's peak FLOP/s, HBM bandwidth or the line rate.

Each bound is a lower limit on a time parameter, from work that the step must do on ``tp`` GPUs:

* ``prefill.per_token_s >= linear FLOPs per token / (tp x dense peak)`` (2 x active parameters; the
  peak of the checkpoint's GEMM dtype, FP8 for FP8 checkpoints);
* ``prefill.attention_s`` and ``prefill.context_attention_s >= attention FLOPs per pair / (tp x dense
  peak)`` (BF16 peak unless the KV cache
  or the attention kernel is FP8: MLA/DSA models use the FP8 peak);
* a one-token prefill step's linear layers and a batch-1 decode step ``>=`` the active weights per GPU /
  HBM bandwidth (every step reads them at least once); with measured knots, every knot ``>=`` the larger
  of that and its tokens' linear FLOPs at peak (the bound is convex, so the interpolation between knots
  respects it too); ``decode.per_seq_s >=`` the linear FLOPs per token at peak;
* ``decode.per_context_token_s`` (or, with measured knots, every ``decode.context_knots_s``) ``>=`` the KV
  bytes read per context token per rank / HBM bandwidth (MLA with a DSA indexer: the indexer keys, the part
  that grows with context);
* ``transfer.per_byte_s >= 1 / line rate per rank``.

Engine CPU overheads and proxy overheads have no physical floor beyond 0. A profile that breaks a bound
fails to load (:func:`check_bounds`), with a one-line error naming the parameter and the bound.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from kvplan.errors import input_error
from kvplan.models.arch import ModelArch, attention_flops_per_pair, kv_bytes_per_token_per_rank, linear_flops_per_token
from kvplan.models.costs import CostModel, TransferCost
from kvplan.models.hardware import Node

#: Relative slack for rounding in stored profiles (a bound is a bound; this only absorbs float printing).
REL_SLACK = 1e-6


@dataclass(frozen=True)
class Bound:
    """The lower limit of one parameter and why."""

    param: str
    lower: float
    why: str


def gemm_dtype(arch: ModelArch) -> str:
    """``fp8`` when the checkpoint stores about one byte per parameter, else ``bf16``."""
    return "fp8" if arch.weight_bytes_total / arch.params_total < 1.5 else "bf16"


def active_weight_bytes_per_gpu(arch: ModelArch, tp: int) -> float:
    """Bytes of the weights a batch-1 step must read on one GPU: active parameters x bytes per parameter / tp."""
    return arch.params_active * (arch.weight_bytes_total / arch.params_total) / tp


def context_bytes_per_token_per_rank(arch: ModelArch, tp: int) -> float:
    """KV bytes a decode step reads per context token on one rank (DSA models: the indexer keys)."""
    if arch.attention == "mla" and arch.indexer_bytes_per_token_layer:
        return float(arch.num_layers * arch.indexer_bytes_per_token_layer)
    return float(kv_bytes_per_token_per_rank(arch, tp))


def physical_bounds(arch: ModelArch, node: Node, tp: int) -> list[Bound]:
    """Every scalar lower bound on the cost parameters of ``arch`` on ``node`` at TP ``tp``.

    ``prefill.weight_read_s`` bounds a one-token step's linear layers; ``decode.batch_s(1)`` a batch-1 step.
    """
    gpu = node.gpu
    dtype = gemm_dtype(arch)
    peak = gpu.peak_flops(dtype)
    att_dtype = "fp8" if arch.attention == "mla" or arch.kv_cache_dtype != "bf16" else "bf16"
    att_peak = gpu.peak_flops(att_dtype)
    bw = gpu.hbm_bandwidth_bytes_per_s
    w = active_weight_bytes_per_gpu(arch, tp)
    kv = context_bytes_per_token_per_rank(arch, tp)
    line = node.link.bandwidth_bytes_per_s_per_rank
    tf = 1e12
    flops_tok = linear_flops_per_token(arch) / tp
    per_tok = (f"{flops_tok / 1e9:.3g} GFLOP per token per GPU at the {gpu.name} dense {dtype.upper()} peak "
               f"{peak / tf:.0f} TFLOP/s")
    att = (f"{attention_flops_per_pair(arch) / tp / 1e3:.4g} kFLOP per pair per GPU at the {gpu.name} dense "
           f"{att_dtype.upper()} peak {att_peak / tf:.0f} TFLOP/s")
    wr = f"{w / 1e9:.3g} GB of active weights per GPU at the {gpu.name} HBM bandwidth {bw / 1e12:.2f} TB/s"
    return [
        Bound("prefill.per_token_s", flops_tok / peak, per_tok),
        Bound("prefill.attention_s", attention_flops_per_pair(arch) / (tp * att_peak), att),
        Bound("prefill.context_attention_s", attention_flops_per_pair(arch) / (tp * att_peak), att),
        Bound("prefill.weight_read_s", w / bw, wr),
        Bound("decode.batch_s(1)", w / bw, "a batch-1 step reads " + wr),
        Bound("decode.per_seq_s", flops_tok / peak, per_tok),
        Bound("decode.per_context_token_s", kv / bw, f"{kv:.0f} B of KV read per context token per rank at "
              f"{bw / 1e12:.2f} TB/s"),
        Bound("transfer.per_byte_s", 1.0 / line, f"the line rate {line / 1e9:.3g} GB/s per rank of {node.name}"),
    ]


def _checks(costs: CostModel, bounds: dict[str, Bound]) -> list[tuple[str, float, float, str]]:
    """``(param, value, lower, why)`` for every bound that applies to these costs."""
    pc, dc = costs.prefill, costs.decode
    out: list[tuple[str, float, float, str]] = []
    b = bounds
    per_tok = b["prefill.per_token_s"].lower
    out.append(("prefill.attention_s", pc.attention_s, b["prefill.attention_s"].lower, b["prefill.attention_s"].why))
    out.append(("prefill.context_attention_s", pc.ctx_attention_s, b["prefill.context_attention_s"].lower,
                b["prefill.context_attention_s"].why))
    w = b["prefill.weight_read_s"]
    if pc.linear_knots_tokens:
        for i, (n, t) in enumerate(zip(pc.linear_knots_tokens, pc.linear_knots_s, strict=True)):
            out.append((f"prefill.linear_knots_s[{i}] ({n} tokens)", t, max(w.lower, n * per_tok),
                        f"max of {w.why} and {b['prefill.per_token_s'].why}"))
        out.append(("prefill.per_token_s", pc.per_token_s, per_tok, b["prefill.per_token_s"].why))
    else:
        out.append(("prefill.per_token_s", pc.per_token_s, per_tok, b["prefill.per_token_s"].why))
        out.append(("prefill.weight_read_s", pc.fixed_s + pc.linear_s(1), w.lower, "a one-token step: " + w.why))
    d1 = b["decode.batch_s(1)"]
    if dc.batch_knots:
        for i, (n, t) in enumerate(zip(dc.batch_knots, dc.batch_knots_s, strict=True)):
            out.append((f"decode.batch_knots_s[{i}] (batch {n})", t, max(d1.lower, n * per_tok),
                        f"max of {d1.why} and {b['decode.per_seq_s'].why}"))
        out.append(("decode.per_seq_s", dc.per_seq_s, per_tok, b["decode.per_seq_s"].why))
    else:
        out.append(("decode.fixed_s", dc.batch_s(1), d1.lower, d1.why))
    ctx = b["decode.per_context_token_s"]
    if dc.context_knots_s:
        for i, (n, t) in enumerate(zip(dc.batch_knots, dc.context_knots_s, strict=True)):
            out.append((f"decode.context_knots_s[{i}] (batch {n})", t, ctx.lower, ctx.why))
    else:
        out.append(("decode.per_context_token_s", dc.per_context_token_s, ctx.lower, ctx.why))
    tb = b["transfer.per_byte_s"]
    if costs.transfer != TransferCost():  # a compute-only prior has no transfer term to bound
        out.append(("transfer.per_byte_s", costs.transfer.per_byte_s, tb.lower, tb.why))
    return out


def bound_violations(costs: CostModel, arch: ModelArch, node: Node, tp: int) -> list[str]:
    """One line per parameter below its physical bound (empty when the costs are physically possible).

    A compute term at exactly 0 is "not modelled" only for the whole component: a prefill or decode with
    every parameter 0 (an inline what-if) is not checked; any other zero is checked like any value.
    """
    bounds = {bd.param: bd for bd in physical_bounds(arch, node, tp)}
    out = []
    for param, value, lower, why in _checks(costs, bounds):
        comp = param.split(".", 1)[0]
        if comp in ("prefill", "decode") and _is_blank(getattr(costs, comp)):
            continue
        if value < lower * (1 - REL_SLACK):
            out.append(f"{param} = {value:.4g} s is below its physical bound {lower:.4g} s ({why})")
    return out



def floor_scale(costs: CostModel, arch: ModelArch, node: Node, tp: int, component: str) -> float:
    """The smallest factor by which the GPU terms of ``component`` (``prefill`` or ``decode``) may be multiplied
    and every bound of that component still hold (every checked term is linear in the GPU terms; the CPU
    ``overhead_s`` is not part of any check). 0 when the component has no bounded term."""
    bounds = {bd.param: bd for bd in physical_bounds(arch, node, tp)}
    ratios = [lower / value for param, value, lower, _why in _checks(costs, bounds)
              if param.startswith(component + ".") and value > 0]
    return max(ratios, default=0.0)

def _is_blank(component: BaseModel) -> bool:
    return component == type(component)()


def check_bounds(costs: CostModel, arch: ModelArch, node: Node, tp: int, where: str) -> None:
    """Raise a one-line input error naming the first parameter below its physical bound, if any."""
    bad = bound_violations(costs, arch, node, tp)
    if bad:
        raise input_error(f"{where}: {bad[0].split(' = ')[0]}", bad[0],
                          "refit the profile (kvplan calibrate / kvplan profile derive) or fix the value")
