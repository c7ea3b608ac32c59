"""Which cost profile a deployment uses: calibrated profile, or kernel prior plus calibrated residuals (pure).

:func:`resolve_profile` ``(arch, node, tp, requested) -> (profile, notes)`` is the one rule, used by the
simulator (``sim/engine.py::resolve``), ``kvplan cost`` and ``kvplan calibrate``:

1. ``requested`` (a profile name or path) of the same model and TP: used as it is.
2. Otherwise the shipped calibrated profile ``<instance>-<model>`` when its TP matches.
3. Otherwise **GPU compute** from the (model, GPU, TP) prior (kernel-derived, ``models/priors/``; an
   analytic roofline estimate, marked *assumed*, when no prior exists) **plus the residuals** of a
   calibrated profile (engine per-step CPU overheads, proxy/HTTP overheads, transfer latencies): the
   requested profile, else the one calibrated on this instance family for the same attention kind,
   else the nearest calibration (same attention kind first). The transfer's bandwidth term is always the
   instance's line rate (``models/hardware.py``).

**Corrections stay where they were measured.** A calibration's GPU corrections of the prefill kernels
(``provenance.prefill_gpu_scales``, e.g. the P5en Qwen3-32B fit's linear x 1.415, attention x 0.675) are a
measurement of *that* model on *that* GPU (the served vLLM version's kernels against aiconfigurator's);
they are applied only when the borrowing deployment has the same model and GPU
(e.g. the same engine on a TCP twin of the instance). The prefill corrections also carry over to other
TPs of the same model on the same GPU, with the reason given in :func:`gpu_corrections` (tested against
the kernel data's TP ratios); on another model or GPU the kernel prior stands alone. Only residuals that
are not model compute are borrowed.

The returned profile's ``component_status`` says for each part whether it is calibrated, kernel-derived
or assumed, and what is borrowed from where.

A profile of status ``unreliable`` (a fit that failed its self-check, ``kvplan calibrate``) is refused
unless the caller allows it (``--allow-unreliable-profile`` / ``simulation.allow_unreliable_profile``).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import input_error
from kvplan.models.arch import MODEL_PRESETS, ModelArch
from kvplan.models.bounds import (
    active_weight_bytes_per_gpu,
    check_bounds,
    context_bytes_per_token_per_rank,
    gemm_dtype,
    physical_bounds,
)
from kvplan.models.costs import (
    CostModel,
    DecodeCost,
    PrefillCost,
    causal_pairs,
    prefill_gpu_step_s,
    scale_decode_gpu,
    scale_prefill_gpu,
)
from kvplan.models.hardware import GPU, HARDWARE_PRESETS, Node, gpu_key
from kvplan.models.profile import Profile, default_profile_name, load_prior, load_profile, shipped_profiles

#: Roofline efficiencies of the analytic fallback prior (used only without a kernel-derived prior), each an
#: assumption: prefill GEMMs at 50 % of the dense peak, attention at 60 %, decode reading weights and KV at
#: 80 % of HBM bandwidth.
LINEAR_EFFICIENCY = 0.5
ATTENTION_EFFICIENCY = 0.6
HBM_EFFICIENCY = 0.8
#: Residual parameters a calibration contributes on top of a compute prior.
RESIDUALS = ("prefill.overhead_s", "decode.overhead_s", "overhead", "transfer")


def analytic_prior(arch: ModelArch, gpu: GPU, tp: int) -> CostModel:
    """Roofline compute costs at the stated efficiencies (assumed; for GPUs or models without kernel data)."""
    from kvplan.models.arch import attention_flops_per_pair, linear_flops_per_token

    peak = gpu.peak_flops(gemm_dtype(arch))
    att_peak = gpu.peak_flops("fp8" if arch.attention == "mla" else "bf16")
    bw = gpu.hbm_bandwidth_bytes_per_s
    w = active_weight_bytes_per_gpu(arch, tp)
    return CostModel(
        prefill=PrefillCost(
            per_token_s=linear_flops_per_token(arch) / (tp * peak * LINEAR_EFFICIENCY),
            weight_read_s=w / (bw * HBM_EFFICIENCY),
            attention_s=attention_flops_per_pair(arch) / (tp * att_peak * ATTENTION_EFFICIENCY),
        ),
        decode=DecodeCost(
            fixed_s=w / (bw * HBM_EFFICIENCY),
            per_seq_s=linear_flops_per_token(arch) / (tp * peak * LINEAR_EFFICIENCY),
            per_context_token_s=context_bytes_per_token_per_rank(arch, tp) / (bw * HBM_EFFICIENCY),
        ),
    )


#: Step size at which :func:`pcie_tp_note` compares a PCIe-only GPU's prefill across TP sizes.
PCIE_NOTE_TOKENS = 8192


def pcie_tp_note(arch: ModelArch, gpu: GPU, tp: int, prefill: PrefillCost) -> str:
    """``""``, or a note when the kernel prior's ``prefill`` on a GPU without NVLink is slower than a smaller TP's.

    aiconfigurator's all-reduce tables for such a GPU are measured over PCIe and slow down with the number of
    GPUs (L40S, ``systems/data/l40s/comm``: about 19 GB/s bus bandwidth at TP2, 4-5 at TP4, 1.5-2 at TP8, README
    *Costs*), so at TP4/TP8 the prefill's two all-reduces per layer outweigh the GEMMs it splits. The prior is
    that data (fitted within its ``fit_report`` error), not an extrapolation; the note says so where the costs
    are shown (``component_status``), with the 8k-token step at this TP and at the fastest smaller TP.
    """
    if gpu.nvlink_bytes_per_s > 0 or tp <= 1:
        return ""
    n = PCIE_NOTE_TOKENS
    pairs = causal_pairs(n, 0)
    here = prefill_gpu_step_s(prefill, n, pairs)
    smaller = [(prefill_gpu_step_s(p.costs.prefill, n, pairs), t) for t in range(1, tp)
               if (p := load_prior(arch.name, gpu_key(gpu), t)) is not None]
    if not smaller or here <= min(smaller)[0]:
        return ""
    best, best_tp = min(smaller)
    return (f"PCIe only: an {n}-token prefill step takes {here:.2f} s at TP{tp} vs {best:.2f} s at TP{best_tp} "
            f"(x{here / best:.1f}): aiconfigurator's measured all-reduce on {gpu.name} slows with the GPU count "
            f"(kernel data, not a kvplan extrapolation; README, Costs)")


def compute_prior(arch: ModelArch, gpu: GPU, tp: int) -> tuple[CostModel, str]:
    """GPU compute costs of (arch, GPU, TP) and their status: the shipped kernel prior, else the roofline."""
    key = gpu_key(gpu)
    prior = load_prior(arch.name, key, tp) if arch.name in MODEL_PRESETS and MODEL_PRESETS[arch.name] == arch else None
    if prior is not None:
        db = prior.provenance.get("database", {})
        return prior.costs, (f"kernel-derived (prior {prior.name}: aiconfigurator vLLM {db.get('version', '?')} "
                             f"{db.get('system', '?')})")
    return analytic_prior(arch, gpu, tp), (
        f"assumed (roofline: GEMM {LINEAR_EFFICIENCY:.0%} / attention {ATTENTION_EFFICIENCY:.0%} of peak, "
        f"{HBM_EFFICIENCY:.0%} of HBM; no kernel prior for {arch.name} on {gpu.name} TP{tp})")


def _family(node_name: str) -> str:
    return node_name[: -len("-tcp")] if node_name.endswith("-tcp") else node_name


def residual_source(arch: ModelArch, node: Node) -> Profile | None:
    """The calibrated profile whose residuals a deployment without its own calibration borrows.

    Order: same instance family and model; same family and attention kind; same model elsewhere; same
    attention kind elsewhere; any calibration (ties broken by name, so the choice is deterministic).
    """
    cands = [load_profile(n) for n in shipped_profiles()]
    fam = _family(node.name)

    def kind(p: Profile) -> str:
        m = MODEL_PRESETS.get(p.model)
        return m.attention if m is not None else ""

    ranked = sorted(cands, key=lambda p: (
        not (_family(p.hardware) == fam and p.model == arch.name),
        not (_family(p.hardware) == fam and kind(p) == arch.attention),
        p.model != arch.name,
        kind(p) != arch.attention,
        p.name,
    ))
    return ranked[0] if ranked else None


def scaled_prefill(pc: PrefillCost, linear: float, attention: float, arch: ModelArch, node: Node, tp: int) -> PrefillCost:
    """A calibration's prefill GPU corrections applied to another prior, each term held at its physical bound."""
    b = {x.param: x.lower for x in physical_bounds(arch, node, tp)}
    s = scale_prefill_gpu(pc, linear, attention)
    upd: dict[str, object] = {"attention_s": max(s.attention_s, b["prefill.attention_s"]),
                              "per_token_s": max(s.per_token_s, b["prefill.per_token_s"])}
    if s.context_attention_s is not None:
        upd["context_attention_s"] = max(s.context_attention_s, b["prefill.context_attention_s"])
    if s.linear_knots_tokens:
        upd["linear_knots_s"] = tuple(max(v, b["prefill.weight_read_s"], n * b["prefill.per_token_s"])
                                      for n, v in zip(s.linear_knots_tokens, s.linear_knots_s, strict=True))
    elif s.weight_read_s:
        upd["weight_read_s"] = max(s.weight_read_s, b["prefill.weight_read_s"])
    return s.model_copy(update=upd)


def scaled_decode(dc: DecodeCost, factor: float, arch: ModelArch, node: Node, tp: int) -> DecodeCost:
    """:func:`~kvplan.models.costs.scale_decode_gpu` with each term held at its physical bound
    (:func:`kvplan.models.bounds.physical_bounds`: a batch knot at the weight read and the per-sequence floor,
    the per-sequence slope at the dense peak, a context slope at the HBM read of its KV); the decode analogue
    of :func:`scaled_prefill` (``kvplan validate``'s sensitivity band scales decode with it)."""
    b = {x.param: x.lower for x in physical_bounds(arch, node, tp)}
    s = scale_decode_gpu(dc, factor)
    per_seq, ctx = b["decode.per_seq_s"], b["decode.per_context_token_s"]
    upd: dict[str, object] = {"per_seq_s": max(s.per_seq_s, per_seq),
                              "per_context_token_s": max(s.per_context_token_s, ctx),
                              "context_knots_s": tuple(max(v, ctx) for v in s.context_knots_s)}
    if s.batch_knots:
        upd["batch_knots_s"] = tuple(max(v, b["decode.batch_s(1)"], n * per_seq)
                                     for n, v in zip(s.batch_knots, s.batch_knots_s, strict=True))
    elif s.batch_s(1) < b["decode.batch_s(1)"]:  # no knots: the one-sequence step holds the weight read
        upd["fixed_s"] = s.fixed_s + b["decode.batch_s(1)"] - s.batch_s(1)
    return s.model_copy(update=upd)


def _gpu_of(profile: Profile) -> GPU | None:
    node = HARDWARE_PRESETS.get(profile.hardware)
    return node.gpu if node is not None else None


@dataclass(frozen=True)
class Corrections:
    """A calibration's GPU corrections that apply to one deployment, and what they are said to be."""

    linear: float
    attention: float
    decode: float
    source: str
    scope: str


def gpu_corrections(residual: Profile, arch: ModelArch, node: Node, tp: int) -> Corrections | None:
    """The GPU corrections of ``residual`` that apply to ``arch`` on ``node`` at ``tp``; ``None`` elsewhere.

    Only the model and GPU they were fitted on. The prefill corrections carry over to other TPs of that model
    on that GPU: they are the ratio of the served vLLM's prefill kernels to the kernel prior's for the same
    GEMM and attention shapes (TP divides the heads and the GEMM width, it does not change the kernels), so
    the kernel prior's TP ratios are kept (``tests/test_corrections.py`` checks the TP1/TP8 ratios against
    the kernel data for every shipped model). A decode scale (``calibrate --scenario``) applies only at the TP
    it was fitted on: it absorbs engine-side time (eager mode, scheduling) whose share changes with TP.
    """
    sc = residual.provenance.get("prefill_gpu_scales") or {}
    dscale = residual.provenance.get("decode_gpu_scale")
    if (not sc and dscale is None) or residual.model != arch.name or _gpu_of(residual) != node.gpu:
        return None
    same_tp = residual.tensor_parallel_size == tp
    where = f"{residual.name} ({residual.model} on {residual.hardware} TP{residual.tensor_parallel_size})"
    scope = "same model, GPU and TP" if same_tp else (
        f"same model and GPU; TP{residual.tensor_parallel_size} -> TP{tp}: the served vLLM's prefill kernel "
        "correction, taken as TP-independent, so the TP ratios are the kernel prior's")
    return Corrections(float(sc.get("linear", 1.0)), float(sc.get("attention", 1.0)),
                       float(dscale) if dscale is not None and same_tp else 1.0, where, scope)


def compose(compute: CostModel, residual: Profile | None, node: Node, arch: ModelArch, tp: int) -> CostModel:
    """Compute costs with a calibration's residuals (engine and proxy overheads, transfer latencies; its GPU
    corrections only where :func:`gpu_corrections` says they apply); the transfer's bandwidth term is the
    node's line rate."""
    per_byte = 1.0 / node.link.bandwidth_bytes_per_s_per_rank
    if residual is None:
        tc = compute.transfer.model_copy(update={"per_byte_s": per_byte})
        return compute.model_copy(update={"transfer": tc})
    r = residual.costs
    sc = gpu_corrections(residual, arch, node, tp)
    prefill = compute.prefill
    decode = compute.decode
    if sc is not None:
        prefill = scaled_prefill(prefill, sc.linear, sc.attention, arch, node, tp)
        decode = scale_decode_gpu(decode, sc.decode)
    return CostModel(
        prefill=prefill.model_copy(update={"overhead_s": r.prefill.overhead_s}),
        decode=decode.model_copy(update={"overhead_s": r.decode.overhead_s}),
        transfer=r.transfer.model_copy(update={"per_byte_s": per_byte}),
        overhead=r.overhead,
    )


def _residual_status(residual: Profile | None, arch: ModelArch, node: Node) -> str:
    """Whether the residuals are this deployment's own calibration or borrowed."""
    if residual is None:
        return "assumed 0 (no calibration to borrow from)"
    own = residual.model == arch.name and residual.hardware == node.name
    where = f"{residual.name} ({residual.model} on {residual.hardware} TP{residual.tensor_parallel_size})"
    return f"calibrated ({where})" if own else f"assumed: transferred from the calibration {where} (not model compute)"


def _correction_status(residual: Profile | None, arch: ModelArch, node: Node, tp: int, part: str) -> str:
    """What ``prefill.gpu`` / ``decode.gpu`` borrows from the residual calibration's GPU corrections, exactly."""
    if residual is None:
        return ""
    key = "prefill_gpu_scales" if part == "prefill" else "decode_gpu_scale"
    if residual.provenance.get(key) is None:
        return ""
    where = f"{residual.name} ({residual.model} on {residual.hardware} TP{residual.tensor_parallel_size})"
    sc = gpu_corrections(residual, arch, node, tp)
    if sc is None or (part == "decode" and sc.decode == 1.0):
        return (f"; no calibration correction (the {part} GPU corrections of {where} apply only to the model and "
                "GPU they were fitted on" + (", at its TP" if part == "decode" else "") + ")")
    if part == "decode":
        return f", x {sc.decode:.4g} borrowed from {sc.source} ({sc.scope})"
    return f", linear x {sc.linear:.3f}, attention x {sc.attention:.3f} borrowed from {sc.source} ({sc.scope})"


def check_reliable(profile: Profile, allow_unreliable: bool, where: str) -> None:
    """Refuse a profile whose fit failed its self-check (status ``unreliable``) unless allowed."""
    if profile.status == "unreliable" and not allow_unreliable:
        got = [str(x) for x in profile.fit_report.get("unreliable_reasons", [])]
        more = f" (+{len(got) - 1} more in its fit_report)" if len(got) > 1 else ""
        why = got[0] + more if got else "see its fit_report"
        raise input_error(where, f"profile {profile.name} is marked unreliable by its calibration ({why})",
                          "refit it, or pass --allow-unreliable-profile (simulation.allow_unreliable_profile: true)")


def resolve_profile(arch: ModelArch, node: Node, tp: int, requested: str | None,
                    allow_unreliable: bool = False) -> tuple[Profile, list[str]]:
    """The profile a deployment of ``arch`` on ``node`` at TP ``tp`` uses, and notes saying what it is made of.

    A requested profile of status ``unreliable`` raises a one-line input error unless ``allow_unreliable``.
    """
    notes: list[str] = []
    base: Profile | None = load_profile(requested) if requested is not None else None
    if base is not None:
        check_reliable(base, allow_unreliable, "profile")
    if (base is not None and base.model == arch.name and base.hardware == node.name and base.tensor_parallel_size == tp
            and base.status != "prior"):
        check_bounds(base.costs, arch, node, tp, f"profile {base.name}")
        return base, [*base.notes]
    if base is None:
        name = default_profile_name(arch.name, node.name)
        if name in shipped_profiles():
            prof = load_profile(name)
            if prof.tensor_parallel_size == tp:
                return prof, [*prof.notes]
    if base is not None and base.status == "prior" and base.model == arch.name and base.tensor_parallel_size == tp:
        compute, compute_status = base.costs, f"kernel-derived (requested prior {base.name})"
    else:
        compute, compute_status = compute_prior(arch, node.gpu, tp)
    pcie = pcie_tp_note(arch, node.gpu, tp, compute.prefill) if compute_status.startswith("kernel-derived") else ""
    if pcie:
        notes.append(pcie)
    residual = base if base is not None and base.status != "prior" else residual_source(arch, node)
    costs = compose(compute, residual, node, arch, tp)
    check_bounds(costs, arch, node, tp, f"resolved costs of {arch.name} on {node.name} TP{tp}")
    res_status = _residual_status(residual, arch, node)
    status = {
        "prefill.gpu": compute_status + (f"; {pcie}" if pcie else "") + _correction_status(residual, arch, node, tp,
                                                                                           "prefill"),
        "decode.gpu": compute_status + _correction_status(residual, arch, node, tp, "decode"),
        "prefill.overhead_s": res_status,
        "decode.overhead_s": res_status,
        "overhead": res_status,
        "transfer.latency": res_status,
        "transfer.per_byte_s": f"hardware data (1 / line rate of {node.name})",
    }
    calibrated = all(v.startswith("calibrated") for k, v in status.items() if k != "transfer.per_byte_s")
    name = f"{arch.name}-{node.name}-tp{tp}" + (f"+{residual.name}" if residual is not None else "")
    notes.append(f"COMPOSED profile {name}: GPU compute {compute_status}; residuals (engine and proxy overheads, "
                 f"transfer latencies) {res_status}")
    prof = Profile(
        name=name,
        model=arch.name,
        hardware=node.name,
        tensor_parallel_size=tp,
        costs=costs,
        status="calibrated" if calibrated else "composed",
        component_status=status,
        provenance={"compute": compute_status, "residuals_from": residual.name if residual is not None else None},
        # the residuals' calibration notes describe that calibration's run (its model, hardware and benchmark), not
        # this deployment: said so, or --verbose read "Assumed: TP8 on each p5en" under a Llama-3.3-70B run on p5
        notes=notes + ([f"of the calibration {residual.name} ({residual.model} on {residual.hardware} "
                        f"TP{residual.tensor_parallel_size}), whose residuals this profile borrows: {n}"
                        for n in residual.notes] if residual is not None else []),
    )
    return prof, list(prof.notes)
