"""Fit a profile from the files a real vLLM deployment produces (``kvplan calibrate``).

:func:`calibrate` parses each file with its exact format (``calibration/parsers.py``), turns it into
observations of the pure cost functions, and fits them with :mod:`kvplan.calibration.fit`:

==============  =======================================================================================
file            what it identifies
==============  =======================================================================================
``--points``    prefill rows: ``PrefillCost`` (fixed/step, per token, attention); ``kv_transfer`` rows:
                the NIXL xferDuration per rank (fixed, per descriptor; per byte held at line rate)
``--bench``     per-request TTFT vs input length (prefill, nothing cached) and ITLs vs context (decode,
                batch taken as 1); summary-only files give one mean point each (means of a nonlinear
                function: attention is then not identifiable)
``--multiturn`` TTFT vs (new = input - history, cached = history) and TPOT vs context; token counts are
                content tokens only (no chat template), history is assumed to be a prefix-cache hit
``--log``       engine ``KV Transfer metrics`` lines: xfer (interval means are exact for a linear model;
                weighted by transfer count) and post times; proxy ``Prefill done in`` lines: the P leg,
                joined to a ``--multiturn`` file by conversation id and turn order to get token counts
                (the i-th proxy log with the i-th multi-turn file, or all with a single one)
``--prometheus`` deltas between scrapes: mean prefill time vs mean computed tokens (attention is not
                identifiable from sums), NIXL xfer/post sums vs bytes and descriptors
==============  =======================================================================================

Parameters the data cannot inform are *held* at the base profile's values (the shipped profile of that
model and hardware, or one extrapolated from the same hardware) and every held parameter is named in the
report with the reason. The result is a :class:`~kvplan.models.profile.Profile` with ``uncertainty``,
``fit_report`` (parameters, residuals, MAPE per metric, notes) and ``provenance`` (files and sha256).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvplan.calibration.fit import (
    FitResult,
    combine_reports,
    fit_decode,
    fit_post,
    fit_prefill,
    fit_xfer,
)
from kvplan.calibration.observations import (
    AGGREGATE_REASON,
    Obs,
    bench_obs,
    engine_kv_obs,
    multiturn_obs,
    points_obs,
    post_note,
    prometheus_obs,
    proxy_descriptive,
    proxy_join,
    pull_fn,
)
from kvplan.calibration.parse_bench import BenchServeResult
from kvplan.calibration.parse_logs import VllmLog
from kvplan.calibration.parse_multiturn import MultiTurnStats
from kvplan.calibration.parse_prometheus import PrometheusScrape
from kvplan.calibration.parsers import (
    parse_bench_serve,
    parse_log,
    parse_multiturn_stats,
    parse_points_csv,
    parse_prometheus,
)
from kvplan.calibration.published_priors import costs_from_values
from kvplan.calibration.sim_fit import SELF_CHECK_TOLERANCE
from kvplan.errors import input_error
from kvplan.inputfile import DEFAULT_MAX_BYTES, check_file
from kvplan.models.arch import (
    ModelArch,
    get_model,
)
from kvplan.models.costs import CostModel
from kvplan.models.hardware import Node, get_hardware
from kvplan.models.profile import (
    Profile,
)

DEFAULT_CHUNK_TOKENS = 8192  # vLLM's max_num_batched_tokens on H100/H200-class GPUs


@dataclass(frozen=True)
class CalibrationResult:
    """What :func:`calibrate` returns: the fitted profile, its report and the individual fits."""

    profile: Profile
    report: dict[str, Any]
    fits: tuple[FitResult, ...] = field(default_factory=tuple)


def sha256_of(path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """sha256 of a file (bounded: refuses files larger than ``max_bytes`` before reading them)."""
    check_file(path, max_bytes)
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def base_profile(model: str, hardware: str, tp: int) -> tuple[Profile | None, str]:
    """The profile whose values are held where the data say nothing, and where it comes from
    (:func:`kvplan.models.resolve.resolve_profile`: the calibration, or the kernel prior plus residuals)."""
    from kvplan.models.resolve import resolve_profile

    arch = get_model(model)
    prof, _notes = resolve_profile(arch, get_hardware(hardware), tp, None)
    if prof.status == "calibrated" and not prof.component_status:
        return prof, f"shipped profile {prof.name}"
    return prof, f"{prof.name} ({prof.status_line()})"


# --- the fit -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Parsed:
    """Every input file, parsed, by format."""

    bench: list[BenchServeResult]
    multiturn: list[MultiTurnStats]
    log: list[VllmLog]
    prometheus: list[PrometheusScrape]
    points: list[pd.DataFrame]


def calibrate(
    model: str,
    hardware: str,
    *,
    bench: Sequence[str | os.PathLike[str]] = (),
    multiturn: Sequence[str | os.PathLike[str]] = (),
    log: Sequence[str | os.PathLike[str]] = (),
    prometheus: Sequence[str | os.PathLike[str]] = (),
    points: Sequence[str | os.PathLike[str]] = (),
    tp: int = 8,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    vllm_version: str | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> CalibrationResult:
    """Parse every file, fit what the data identify, hold the rest at the base profile, return the profile.

    Raises :class:`~kvplan.errors.KvplanInputError` (one line, naming the file) on any malformed input, and
    when no file was given or the files hold nothing to fit.
    """
    arch = get_model(model)
    node = get_hardware(hardware)
    files = {"bench": bench, "multiturn": multiturn, "log": log, "prometheus": prometheus, "points": points}
    if not any(files.values()):
        raise input_error("calibrate", "no input file", "give --bench, --multiturn, --log, --prometheus or --points")
    base, base_src = base_profile(arch.name, node.name, tp)
    base_values = _values(base.costs) if base is not None else _values(CostModel())
    lows = physical_lower_bounds(arch, node, tp)
    parsed = _Parsed([parse_bench_serve(f, max_bytes=max_bytes) for f in bench],
                     [parse_multiturn_stats(f, max_bytes=max_bytes) for f in multiturn],
                     [parse_log(f, max_bytes=max_bytes) for f in log],
                     [parse_prometheus(f, max_bytes=max_bytes) for f in prometheus],
                     [parse_points_csv(f, max_bytes=max_bytes) for f in points])
    sources = [{"file": os.fspath(f), "format": kind, "sha256": sha256_of(f, max_bytes)}
               for kind, paths in files.items() for f in paths]
    obs = Obs()
    _direct_observations(parsed, arch, tp, obs)
    xfer, post = _fit_transfer(obs, node.link.bandwidth_bytes_per_s_per_rank, base_values)
    _proxy_observations(parsed, pull_fn(arch, tp, xfer, base_values), obs)
    results = [r for r in (xfer, post) if r is not None] + _fit_engine(obs, base_values, chunk_tokens, lows)
    if not results:
        raise input_error(
            "calibrate", "the files hold no observation to fit",
            "add per-request data (--save-detailed), KV Transfer metrics, a points CSV or a multi-turn file",
        )
    base_costs = base.costs if base is not None else None
    res = _result(results, base_values, base_src, obs, sources, arch, node.name, tp, vllm_version, base_costs,
                  lows["prefill.weight_read_s"])
    reasons = ([UNCHECKED_REASON] if bench or multiturn else []) + fit_misses(results)
    return _unreliable(res, reasons) if reasons else res


#: A direct fit whose residuals leave a metric's MAPE above this (percent) does not reproduce its own input: it is
#: written ``unreliable`` (the tolerance of calibrate --scenario's self-check).
MAX_FIT_MAPE_PCT = SELF_CHECK_TOLERANCE * 100


def fit_misses(results: list[FitResult]) -> list[str]:
    """Why a direct fit does not reproduce the data it was fitted on: a metric whose MAPE exceeds
    :data:`MAX_FIT_MAPE_PCT`, or a fit whose every estimated parameter sits on a bound (the data pushed each one
    as far as it may go: none was fitted)."""
    out = []
    for r in results:
        out += [f"{r.target} {k}: the fitted profile misses its own input by MAPE {v:.1f}% (limit "
                f"{MAX_FIT_MAPE_PCT:g}%)" for k, v in r.mape_pct.items() if math.isfinite(v) and v > MAX_FIT_MAPE_PCT]
        est = [p for p in r.params if p.status != "held"]
        if est and all(p.status == "at_bound" for p in est):
            out.append(f"{r.target}: every estimated parameter is at a bound of the fit "
                       f"({', '.join(p.name for p in est)}): the data ask for values the bounds forbid")
    return out


#: Why a --bench/--multiturn fit without --scenario is not a calibration (issue 19).
UNCHECKED_REASON = (
    "fitted without --scenario: a serving benchmark's TTFT and TPOT contain queueing, KV transfer, proxy legs and "
    "batching, which this direct fit reads as engine time, and no simulation of the measured run checked the "
    "profile; give the deployment with --scenario S.yaml (calibration through the simulator)"
)


def _unreliable(res: CalibrationResult, reasons: list[str]) -> CalibrationResult:
    """The result with status ``unreliable`` and its ``reasons`` (a direct fit of serving statistics that nothing
    has checked, or a fit that does not reproduce its own input)."""
    report = dict(res.report)
    report["unreliable_reasons"] = reasons
    notes = ["FITTED" + n[len("CALIBRATED"):] if n.startswith("CALIBRATED") else n for n in res.profile.notes]
    prof = res.profile.model_copy(update={"status": "unreliable", "fit_report": report,
                                          "notes": [*notes, *("UNRELIABLE: " + r for r in reasons)]})
    return CalibrationResult(profile=prof, report=report, fits=res.fits)


def _direct_observations(parsed: _Parsed, arch: ModelArch, tp: int, obs: Obs) -> None:
    """Points CSVs, bench results, engine KV Transfer metrics and Prometheus scrapes into ``obs``."""
    for frame in parsed.points:
        points_obs(frame, arch, tp, obs)
    for r in parsed.bench:
        bench_obs(r, obs)
    for lg in parsed.log:
        if lg.engine is not None and len(lg.engine.kv_transfer):
            engine_kv_obs(lg.engine.kv_transfer, os.path.basename(lg.source), obs)
    for pr in parsed.prometheus:
        prometheus_obs(pr, obs)


def _fit_transfer(obs: Obs, bandwidth_bytes_per_s: float,
                  base_values: dict[str, float]) -> tuple[FitResult | None, FitResult | None]:
    """The xfer fit (per byte held at the line rate) and the post fit, each when observed."""
    xfer = post = None
    if obs.xfer:
        d, b, y, metric, w = (np.array(v) for v in zip(*obs.xfer, strict=True))
        xfer = fit_xfer(d, b, y, per_byte_s_prior=1.0 / bandwidth_bytes_per_s, held_values=base_values, weights=w,
                        metrics=list(metric))
    if obs.post:
        d, y, w = (np.array(v) for v in zip(*obs.post, strict=True))
        post = fit_post(d, y, held_values=base_values, weights=w)
        bpd = sum(x[1] for x in obs.xfer) / max(sum(x[0] for x in obs.xfer), 1.0)  # bytes per descriptor
        obs.notes.append(post_note(post, xfer, base_values, d, bpd))
    return xfer, post


def _proxy_observations(parsed: _Parsed, pull: Callable[[int], float] | None, obs: Obs) -> None:
    """Proxy P legs joined to multi-turn token counts (minus the modelled pull), then the multi-turn files."""
    proxies = [lg.proxy for lg in parsed.log if lg.proxy is not None]
    mts = parsed.multiturn
    joined = 0
    if proxies and mts:
        if len(mts) != 1 and len(mts) != len(proxies):
            raise input_error(
                "calibrate", f"{len(proxies)} proxy log(s) and {len(mts)} multi-turn file(s) cannot be paired",
                "give one --multiturn per proxy --log, in the same order (or a single --multiturn)",
            )
        for i, proxy in enumerate(proxies):
            joined += proxy_join(proxy, mts[i if len(mts) > 1 else 0], obs, pull)
        obs.notes.append(
            f"proxy 'Prefill done in' joined to multi-turn token counts by conversation and turn order "
            f"({joined} requests); "
            + ("the modelled D->P pull (engine log fit) is subtracted from cache-HIT P legs" if pull is not None
               else "cache-HIT P legs still contain the D->P pull (no engine KV Transfer metrics to subtract it)")
        )
    for proxy in proxies:
        proxy_descriptive(proxy, obs)
    if proxies and not mts:
        obs.notes.append(
            "proxy log without a multi-turn stats file: the P legs have no token counts, so no prefill "
            "parameter is identifiable from them (reported as descriptive statistics only)"
        )
    for m in mts:
        multiturn_obs(m, obs, use_ttft=joined == 0)


def _fit_engine(obs: Obs, base_values: dict[str, float], chunk_tokens: int,
                lows: dict[str, float]) -> list[FitResult]:
    """The prefill and decode fits, when observed."""
    results: list[FitResult] = []
    if obs.prefill:
        new, cached, y, metric, w = (np.array(v) for v in zip(*obs.prefill, strict=True))
        force = {"prefill.attention_s": AGGREGATE_REASON} if obs.prefill_aggregate_only else None
        results.append(
            fit_prefill(new.astype(np.int64), cached.astype(np.int64), y.astype(float), held_values=base_values,
                        chunk_tokens=chunk_tokens, metrics=list(metric), weights=w.astype(float), force_hold=force,
                        lower_bounds=lows)
        )
    if obs.decode:
        batch, ctx, y, metric, w = (np.array(v) for v in zip(*obs.decode, strict=True))
        results.append(
            fit_decode(batch.astype(float), ctx.astype(float), y.astype(float), held_values=base_values,
                       weights=w.astype(float), metrics=list(metric), lower_bounds=lows)
        )
    return results


def _result(results: list[FitResult], base_values: dict[str, float], base_src: str, obs: Obs,
            sources: list[dict[str, Any]], arch: ModelArch, hardware: str, tp: int,
            vllm_version: str | None, base_costs: CostModel | None, weight_read_s: float) -> CalibrationResult:
    """The fitted values over the base profile's, the report and the :class:`Profile`."""
    values = dict(base_values)
    uncertainty: dict[str, float] = {}
    fitted: list[str] = []
    for res in results:
        for p in res.params:
            if p.status == "held":
                continue
            values[p.name] = p.value
            fitted.append(p.name)
            if math.isfinite(p.stderr):
                uncertainty[p.name] = p.stderr
    held = sorted(set(values) - set(fitted))
    report = combine_reports(results)
    report["descriptive"] = obs.descriptive
    report["base_profile"] = base_src
    report["held_from_base"] = held
    report["notes"] = list(obs.notes) + list(report["notes"])
    notes = [
        f"CALIBRATED with kvplan calibrate from {len(sources)} file(s); fitted: {', '.join(sorted(set(fitted)))}",
        f"held at the base profile ({base_src}): {', '.join(held)}" if held else "every parameter fitted",
        *obs.notes,
    ]
    profile = Profile(
        name=f"{hardware}-{arch.name}-calibrated", model=arch.name, hardware=hardware, tensor_parallel_size=tp,
        costs=_simple_where_fitted(costs_from_values(values, base_costs), fitted, weight_read_s),
        uncertainty=uncertainty, fit_report=report,
        provenance={
            "sources": sources,
            "vllm_version": vllm_version or "unknown (not in the files; pass --vllm-version)",
            "model": arch.hf_id or arch.name,
            "hardware": hardware,
            "tensor_parallel_size": tp,
            "method": "kvplan calibrate (calibration/calibrate.py, linear least squares with bounds)",
        },
        status="calibrated", notes=notes,
    )
    return CalibrationResult(profile=profile, report=report, fits=tuple(results))


def _values(costs: CostModel) -> dict[str, float]:
    """The scalar parameters of ``costs`` as ``{'component.param': value}`` (knot tables are not scalars)."""
    out: dict[str, float] = {}
    for comp, params in costs.model_dump(mode="python").items():
        for name, value in params.items():
            if isinstance(value, int | float):
                out[f"{comp}.{name}"] = float(value)
    return out


def physical_lower_bounds(arch: ModelArch, node: Node, tp: int) -> dict[str, float]:
    """Lower bounds of the fitted parameters (models/bounds.py): nothing faster than peak FLOP/s or HBM bandwidth."""
    from kvplan.models.bounds import physical_bounds

    b = {x.param: x.lower for x in physical_bounds(arch, node, tp)}
    return {
        "prefill.per_token_s": b["prefill.per_token_s"],
        "prefill.attention_s": b["prefill.attention_s"],
        "prefill.weight_read_s": b["prefill.weight_read_s"],
        "decode.fixed_s": b["decode.batch_s(1)"],
        "decode.per_context_token_s": b["decode.per_context_token_s"],
    }


def _simple_where_fitted(costs: CostModel, fitted: list[str], weight_read_s: float) -> CostModel:
    """Drop the base's measured knot tables where these traces fitted the simple form instead (the fitted
    ``per_token_s`` / ``per_seq_s`` / ``per_context_token_s`` then mean what the simple formula says; the
    context knots are per batch knot, so they go with the batch knots); the linear layers keep the
    physical weight-read floor ``weight_read_s``."""
    pf = {"prefill.fixed_s", "prefill.per_token_s", "prefill.attention_s"}
    df = {"decode.fixed_s", "decode.per_seq_s"}
    upd: dict[str, Any] = {}
    if pf & set(fitted):
        upd["prefill"] = costs.prefill.model_copy(update={"linear_knots_tokens": (), "linear_knots_s": (),
                                                          "context_attention_s": None,
                                                          "weight_read_s": weight_read_s})
    if df & set(fitted):
        upd["decode"] = costs.decode.model_copy(update={"batch_knots": (), "batch_knots_s": (), "context_knots_s": ()})
    elif "decode.per_context_token_s" in fitted and costs.decode.context_knots_s:
        upd["decode"] = costs.decode.model_copy(update={"context_knots_s": ()})
    return costs.model_copy(update=upd) if upd else costs


def report_lines(result: CalibrationResult) -> list[tuple[str, str, str, str, str]]:
    """Rows ``(parameter, value, stderr, relative stderr, status)`` of every fitted or held parameter."""
    rows = []
    for res in result.fits:
        for p in res.params:
            finite = math.isfinite(p.stderr)
            se = f"{p.stderr:.3g}" if finite else "-"
            rel = f"{p.stderr / p.value:.1%}" if finite and p.value > 0 else "-"
            rows.append((p.name, f"{p.value:.6g}", se, rel, p.status))
    return rows

