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
model and hardware, or the kernel prior plus calibrated residuals, models/resolve.py) and every held
parameter is named in the report with the reason. The result is a :class:`~kvplan.models.profile.Profile`
with ``uncertainty``, ``fit_report`` (parameters, residuals, MAPE per metric, notes) and ``provenance`` (files and sha256).
"""

from __future__ import annotations

import hashlib
import math
import os
from collections.abc import Sequence
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
from kvplan.calibration.parse_bench import BenchServeResult
from kvplan.calibration.parse_logs import ProxyLog
from kvplan.calibration.parse_multiturn import MultiTurnStats
from kvplan.calibration.parse_prometheus import PrometheusScrape
from kvplan.calibration.parsers import (
    parse_bench_serve,
    parse_log,
    parse_multiturn_stats,
    parse_points_csv,
    parse_prometheus,
)
from kvplan.errors import input_error
from kvplan.inputfile import DEFAULT_MAX_BYTES, check_file
from kvplan.models.arch import (
    ModelArch,
    descriptors_per_transfer,
    get_model,
    kv_bytes_per_token_per_rank,
    kv_regions_per_rank,
)
from kvplan.models.costs import CostModel
from kvplan.models.hardware import Node, get_hardware
from kvplan.models.profile import (
    Profile,
)

MIB = 2**20
DEFAULT_CHUNK_TOKENS = 8192  # vLLM's max_num_batched_tokens on H100/H200-class GPUs
AGGREGATE_REASON = "only sums/means per interval are observed; the attention term of a mean is not the mean's"


@dataclass(frozen=True)
class CalibrationResult:
    """What :func:`calibrate` returns: the fitted profile, its report and the individual fits."""

    profile: Profile
    report: dict[str, Any]
    fits: tuple[FitResult, ...] = field(default_factory=tuple)


@dataclass
class _Obs:
    """Observations collected from all files, per cost component."""

    prefill: list[tuple[int, int, float, str, float]] = field(default_factory=list)  # new, cached, s, metric, w
    prefill_aggregate_only: bool = True
    xfer: list[tuple[float, float, float, str, float]] = field(default_factory=list)  # desc, bytes, s, metric, w
    post: list[tuple[float, float, float]] = field(default_factory=list)  # desc, s, w
    decode: list[tuple[float, float, float, str, float]] = field(default_factory=list)  # batch, ctx, s, metric, w
    notes: list[str] = field(default_factory=list)
    descriptive: dict[str, Any] = field(default_factory=dict)


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


# --- collecting observations ---------------------------------------------------------------------------------


def _bench(r: BenchServeResult, obs: _Obs) -> None:
    label = os.path.basename(r.source)
    req = r.requests
    if req is not None and {"input_len_tokens", "ttft_s"} <= set(req.columns):
        ok = req[req["ok"] & (req["ttft_s"] > 0)]
        for n, t in zip(ok["input_len_tokens"].tolist(), ok["ttft_s"].tolist(), strict=True):
            obs.prefill.append((int(n), 0, float(t), "bench_ttft", 1.0))
        obs.prefill_aggregate_only = False
        if r.itls_s is not None:
            lens = req["input_len_tokens"].tolist()
            for i, gaps in enumerate(r.itls_s):
                if not bool(req["ok"].iloc[i]) or gaps.size == 0:
                    continue
                good = gaps > 0
                ctx = lens[i] + np.arange(1, gaps.size + 1)
                for c, g in zip(ctx[good].tolist(), gaps[good].tolist(), strict=True):
                    obs.decode.append((1.0, float(c), float(g), "bench_itl", 1.0))
        obs.notes.append(
            f"{label}: TTFT taken as prefill of the whole prompt (no prefix cache, no queueing); ITLs as "
            "batch-1 decode steps at the request's own context"
        )
        return
    if r.completed <= 0 or not r.total_input_tokens:
        obs.notes.append(f"{label}: no completed request with token counts; nothing to fit")
        return
    mean_in = r.total_input_tokens / r.completed
    mean_out = (r.total_output_tokens or 0) / r.completed
    weight = math.sqrt(r.completed)
    try:
        ttft_ms = r.summary("ttft", "mean")
        obs.prefill.append((int(round(mean_in)), 0, ttft_ms / 1000.0, "bench_mean_ttft", weight))
    except KeyError:
        pass
    try:
        tpot_ms = r.summary("tpot", "mean")
        if tpot_ms > 0:
            obs.decode.append((1.0, mean_in + mean_out / 2, tpot_ms / 1000.0, "bench_mean_tpot", weight))
    except KeyError:
        pass
    obs.notes.append(
        f"{label}: summary only (no --save-detailed): mean TTFT at the mean input length "
        f"({mean_in:.0f} tokens) and mean TPOT; queueing at {r.request_rate_req_s} req/s is included"
    )


def _multiturn(m: MultiTurnStats, obs: _Obs, use_ttft: bool) -> None:
    label = os.path.basename(m.source)
    df = m.requests
    hist = np.rint(df["approx_cached_percent"].to_numpy() * df["input_num_tokens"].to_numpy() / 100.0)
    new = df["input_num_tokens"].to_numpy() - hist
    if use_ttft:
        ok = df["ttft_available"].to_numpy() & (new > 0)
        for n, c, t in zip(new[ok].tolist(), hist[ok].tolist(), df["ttft_s"].to_numpy()[ok].tolist(), strict=True):
            obs.prefill.append((int(n), int(c), float(t), "multiturn_ttft", 1.0))
        obs.prefill_aggregate_only = False
    out = df["output_num_tokens"].to_numpy()
    tpot = df["tpot_s"].to_numpy()
    good = (out > 1) & (tpot > 0)
    ctx = df["input_num_tokens"].to_numpy() + out / 2.0
    for c, t in zip(ctx[good].tolist(), tpot[good].tolist(), strict=True):
        obs.decode.append((1.0, float(c), float(t), "multiturn_tpot", 1.0))
    obs.notes.append(
        f"{label}: input_num_tokens are content tokens (no chat template); the history is assumed to be a "
        "prefix-cache hit (cached), the last user message new; TPOT = batch-1 decode step at mid-response context"
    )


def _proxy_join(proxy: ProxyLog, m: MultiTurnStats, obs: _Obs, pull_s: Any) -> int:
    """Join proxy P legs to multi-turn token counts by (conversation, turn order); returns rows joined."""
    ev = proxy.cache_events
    kind_of = {}
    conv_of = {}
    for e, conv, rid in zip(ev["event"].tolist(), ev["conversation_id"].tolist(), ev["request_id"].tolist(), strict=True):
        if rid and e in ("miss", "send_to_p"):
            conv_of[rid] = conv
            kind_of[rid] = "hit" if e == "send_to_p" else "miss"
    pre = proxy.prefill.copy()
    pre["conversation_id"] = pre["request_id"].map(conv_of)
    pre["kind"] = pre["request_id"].map(kind_of)
    pre = pre.dropna(subset=["conversation_id"]).sort_values("line")
    pre["k"] = pre.groupby("conversation_id").cumcount()
    req = m.requests.sort_values("start_time_s").copy()
    req["k"] = req.groupby("conversation_id").cumcount()
    joined = pre.merge(req, on=["conversation_id", "k"], how="inner")
    n = 0
    for kind, leg, tokens, pct in zip(
        joined["kind"].tolist(),
        joined["prefill_s"].tolist(),
        joined["input_num_tokens"].tolist(),
        joined["approx_cached_percent"].tolist(),
        strict=True,
    ):
        hist = int(round(pct * tokens / 100.0)) if kind == "hit" else 0
        seconds = float(leg) - (pull_s(hist) if (pull_s is not None and hist > 0) else 0.0)
        if tokens - hist <= 0 or seconds <= 0:
            continue
        obs.prefill.append((int(tokens - hist), hist, seconds, "proxy_p_leg", 1.0))
        n += 1
    if n:
        obs.prefill_aggregate_only = False
    return n


def _engine_kv(kv: pd.DataFrame, label: str, obs: _Obs) -> None:
    cols = ("num_transfers", "avg_xfer_s", "avg_post_s", "avg_descriptors", "avg_mib_per_transfer")
    for count, xfer, post, desc, mib in zip(*(kv[c].astype(float).tolist() for c in cols), strict=True):
        if count <= 0 or not math.isfinite(xfer) or xfer <= 0:
            continue
        w = math.sqrt(count)
        obs.xfer.append((desc, mib * MIB, xfer, "log_kv_xfer", w))
        if math.isfinite(post) and post > 0:
            obs.post.append((desc, post, w))
    obs.notes.append(
        f"{label}: KV Transfer metrics are per-rank observations pooled over TP ranks (MB = MiB per rank); "
        "interval means fitted with weight sqrt(count); the printed Throughput is not used (it divides by "
        "summed, overlapping transfer time)"
    )


def _prometheus(p: PrometheusScrape, obs: _Obs) -> None:
    label = os.path.basename(p.source)
    n = p.n_scrapes
    pairs = [(i - 1, i) for i in range(1, n)] if n > 1 else [(-1, 0)]
    used = 0
    for first, last in pairs:
        try:
            h = p.histogram("vllm:request_prefill_time_seconds", scrape=last)
            h = h if first < 0 else h.minus(p.histogram("vllm:request_prefill_time_seconds", scrape=first))
            local = p.counter("vllm:prompt_tokens_by_source", scrape=last, source="local_compute")
            ext = p.counter("vllm:prompt_tokens_by_source", scrape=last, source="external_kv_transfer")
            if first >= 0:
                local -= p.counter("vllm:prompt_tokens_by_source", scrape=first, source="local_compute")
                ext -= p.counter("vllm:prompt_tokens_by_source", scrape=first, source="external_kv_transfer")
        except (KeyError, ValueError):
            continue
        if h.count <= 0 or h.sum <= 0 or local <= 0:
            continue
        obs.prefill.append(
            (int(round(local / h.count)), int(round(ext / h.count)), h.sum / h.count, "prom_prefill", math.sqrt(h.count))
        )
        used += 1
        try:
            xs = p.histogram("vllm:nixl_xfer_time_seconds", scrape=last)
            bs = p.histogram("vllm:nixl_bytes_transferred", scrape=last)
            ds = p.histogram("vllm:nixl_num_descriptors", scrape=last)
            ps = p.histogram("vllm:nixl_post_time_seconds", scrape=last)
            if first >= 0:
                xs = xs.minus(p.histogram("vllm:nixl_xfer_time_seconds", scrape=first))
                bs = bs.minus(p.histogram("vllm:nixl_bytes_transferred", scrape=first))
                ds = ds.minus(p.histogram("vllm:nixl_num_descriptors", scrape=first))
                ps = ps.minus(p.histogram("vllm:nixl_post_time_seconds", scrape=first))
        except (KeyError, ValueError):
            continue
        if xs.count > 0 and xs.sum > 0 and ds.count > 0:
            w = math.sqrt(xs.count)
            obs.xfer.append((ds.sum / ds.count, bs.sum / max(bs.count, 1.0), xs.sum / xs.count, "prom_nixl_xfer", w))
            if ps.count > 0 and ps.sum > 0:
                obs.post.append((ds.sum / ds.count, ps.sum / ps.count, w))
    if used == 0:
        obs.notes.append(f"{label}: no vllm:request_prefill_time_seconds with prompt_tokens_by_source to fit")
    else:
        obs.notes.append(
            f"{label}: {used} scrape interval(s): mean prefill time (SCHEDULED -> first token) vs mean locally "
            "computed tokens on top of the mean external (pulled) tokens"
        )


# --- the fit -------------------------------------------------------------------------------------------------


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
    sources: list[dict[str, Any]] = []
    obs = _Obs()
    parsed_bench = [parse_bench_serve(f, max_bytes=max_bytes) for f in bench]
    parsed_mt = [parse_multiturn_stats(f, max_bytes=max_bytes) for f in multiturn]
    parsed_log = [parse_log(f, max_bytes=max_bytes) for f in log]
    parsed_prom = [parse_prometheus(f, max_bytes=max_bytes) for f in prometheus]
    parsed_pts = [parse_points_csv(f, max_bytes=max_bytes) for f in points]
    for kind, paths in files.items():
        for f in paths:
            sources.append({"file": os.fspath(f), "format": kind, "sha256": sha256_of(f, max_bytes)})
    bpt = kv_bytes_per_token_per_rank(arch, tp)
    for frame in parsed_pts:
        pre = frame[frame["kind"] == "prefill"]
        for n, c, v in zip(pre["tokens"].tolist(), pre["cached_tokens"].tolist(), pre["value_ms"].tolist(), strict=True):
            obs.prefill.append((int(n), int(c), float(v) / 1000.0, "points_prefill", 1.0))
        if len(pre):
            obs.prefill_aggregate_only = False
        kv = frame[frame["kind"] == "kv_transfer"]
        for n, v in zip(kv["tokens"].tolist(), kv["value_ms"].tolist(), strict=True):
            obs.xfer.append((float(descriptors_per_transfer(arch, int(n))), float(n * bpt), v / 1000.0, "points_kv", 1.0))
        if len(kv):
            obs.notes.append(
                f"points kv_transfer rows read as NIXL xferDuration per rank of {arch.name} at TP{tp} "
                f"({bpt} B/token/rank, {kv_regions_per_rank(arch)} regions x blocks of {arch.block_size_tokens})"
            )
    for r in parsed_bench:
        _bench(r, obs)
    for lg in parsed_log:
        if lg.engine is not None and len(lg.engine.kv_transfer):
            _engine_kv(lg.engine.kv_transfer, os.path.basename(lg.source), obs)
    for pr in parsed_prom:
        _prometheus(pr, obs)
    results: list[FitResult] = []
    line_rate = 1.0 / node.link.bandwidth_bytes_per_s_per_rank
    xfer_fit = None
    if obs.xfer:
        d, b, y, metric, w = (np.array(v) for v in zip(*obs.xfer, strict=True))
        xfer_fit = fit_xfer(d, b, y, per_byte_s_prior=line_rate, held_values=base_values, weights=w,
                            metrics=list(metric))
        results.append(xfer_fit)
    if obs.post:
        d, y, w = (np.array(v) for v in zip(*obs.post, strict=True))
        post_fit = fit_post(d, y, held_values=base_values, weights=w)
        results.append(post_fit)
        bpd = sum(x[1] for x in obs.xfer) / max(sum(x[0] for x in obs.xfer), 1.0)  # bytes per descriptor
        obs.notes.append(_post_note(post_fit, xfer_fit, base_values, d, bpd))
    proxies = [lg.proxy for lg in parsed_log if lg.proxy is not None]
    joined = 0
    if proxies and parsed_mt:
        if len(parsed_mt) != 1 and len(parsed_mt) != len(proxies):
            raise input_error(
                "calibrate",
                f"{len(proxies)} proxy log(s) and {len(parsed_mt)} multi-turn file(s) cannot be paired",
                "give one --multiturn per proxy --log, in the same order (or a single --multiturn)",
            )
        pull = _pull_fn(arch, tp, xfer_fit, base_values)
        for i, proxy in enumerate(proxies):
            joined += _proxy_join(proxy, parsed_mt[i if len(parsed_mt) > 1 else 0], obs, pull)
        obs.notes.append(
            f"proxy 'Prefill done in' joined to multi-turn token counts by conversation and turn order "
            f"({joined} requests); "
            + ("the modelled D->P pull (engine log fit) is subtracted from cache-HIT P legs" if pull is not None
               else "cache-HIT P legs still contain the D->P pull (no engine KV Transfer metrics to subtract it)")
        )
    for proxy in proxies:
        legs = proxy.prefill["prefill_s"].to_numpy()
        obs.descriptive[f"proxy_p_leg:{os.path.basename(proxy.source)}"] = {
            "requests": int(legs.size),
            "mean_ms": float(legs.mean() * 1000) if legs.size else None,
            "hits": proxy.count("hit"),
            "misses": proxy.count("miss"),
            "stale": proxy.count("stale"),
        }
    if proxies and not parsed_mt:
        obs.notes.append(
            "proxy log without a multi-turn stats file: the P legs have no token counts, so no prefill "
            "parameter is identifiable from them (reported as descriptive statistics only)"
        )
    for m in parsed_mt:
        _multiturn(m, obs, use_ttft=joined == 0)
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
    if not results:
        raise input_error(
            "calibrate", "the files hold no observation to fit",
            "add per-request data (--save-detailed), KV Transfer metrics, a points CSV or a multi-turn file",
        )
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
    from kvplan.calibration.published import costs_from_values

    costs = _simple_where_fitted(costs_from_values(values, base.costs if base is not None else None), fitted,
                                 lows["prefill.weight_read_s"])
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
        name=f"{node.name}-{arch.name}-calibrated",
        model=arch.name,
        hardware=node.name,
        tensor_parallel_size=tp,
        costs=costs,
        uncertainty=uncertainty,
        fit_report=report,
        provenance={
            "sources": sources,
            "vllm_version": vllm_version or "unknown (not in the files; pass --vllm-version)",
            "model": arch.hf_id or arch.name,
            "hardware": node.name,
            "tensor_parallel_size": tp,
            "method": "kvplan calibrate (calibration/calibrate.py, linear least squares with bounds)",
        },
        status="calibrated",
        notes=notes,
    )
    return CalibrationResult(profile=profile, report=report, fits=tuple(results))


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


def _values(costs: CostModel) -> dict[str, float]:
    """The scalar parameters of ``costs`` as ``{'component.param': value}`` (knot tables are not scalars)."""
    out: dict[str, float] = {}
    for comp, params in costs.model_dump(mode="python").items():
        for name, value in params.items():
            if isinstance(value, int | float):
                out[f"{comp}.{name}"] = float(value)
    return out


def _simple_where_fitted(costs: CostModel, fitted: list[str], weight_read_s: float) -> CostModel:
    """Drop the base's measured knot tables where these traces fitted the simple form instead (the fitted
    ``per_token_s`` / ``per_seq_s`` then mean what the simple formula says); the linear layers keep the
    physical weight-read floor ``weight_read_s``."""
    pf = {"prefill.fixed_s", "prefill.per_token_s", "prefill.attention_s"}
    df = {"decode.fixed_s", "decode.per_seq_s"}
    upd: dict[str, Any] = {}
    if pf & set(fitted):
        upd["prefill"] = costs.prefill.model_copy(update={"linear_knots_tokens": (), "linear_knots_s": (),
                                                          "context_attention_s": None,
                                                          "weight_read_s": weight_read_s})
    if df & set(fitted):
        upd["decode"] = costs.decode.model_copy(update={"batch_knots": (), "batch_knots_s": ()})
    return costs.model_copy(update=upd) if upd else costs


def _pull_fn(arch: ModelArch, tp: int, xfer: FitResult | None, base: dict[str, float]) -> Any:
    """Visible D->P pull time of ``tokens`` from the fitted transfer (``None`` without an engine-log fit).

    NIXL's xferDuration (the engine log's ``Avg xfer time``) already contains the post
    (``models/costs.py`` TransferCost), so the visible pull is request creation (base profile) +
    xferDuration + the step that notices it (``poll_s``, base profile); the post is not added again.
    """
    if xfer is None:
        return None
    xv = xfer.values()
    bpt = kv_bytes_per_token_per_rank(arch, tp)

    def pull(tokens: int) -> float:
        d = descriptors_per_transfer(arch, tokens)
        return (
            xv["transfer.fixed_s"] + xv["transfer.per_descriptor_s"] * d + xv["transfer.per_byte_s"] * tokens * bpt
            + base.get("transfer.prep_fixed_s", 0.0) + base.get("transfer.prep_per_descriptor_s", 0.0) * d
            + base.get("transfer.poll_s", 0.0)
        )

    return pull


def _post_note(
    post: FitResult, xfer: FitResult | None, base: dict[str, float], descriptors: np.ndarray, bytes_per_desc: float
) -> str:
    """How the fitted post relates to xferDuration (it is part of it: never added to the pull)."""
    pv = post.values()
    xv = {**base, **(xfer.values() if xfer is not None else {})}
    d = np.array([float(descriptors.min()), float(descriptors.max())])
    post_s = pv["transfer.post_fixed_s"] + pv["transfer.post_per_descriptor_s"] * d
    xfer_s = (
        xv.get("transfer.fixed_s", 0.0) + xv.get("transfer.per_descriptor_s", 0.0) * d
        + xv.get("transfer.per_byte_s", 0.0) * bytes_per_desc * d
    )
    note = (
        "NIXL postDuration fitted for reporting only: it is part of xferDuration (both timed from postXferReq), "
        "so the modelled pull never adds it"
    )
    if bool(np.any(post_s > xfer_s)):
        note += (
            f"; WARNING: the fitted post ({post_s.max() * 1e3:.2f} ms) exceeds the fitted xferDuration at these "
            "descriptor counts, which NIXL's timing makes impossible (check the log)"
        )
    return note


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

