"""Observations of the pure cost functions, collected from each parsed file (for :mod:`~kvplan.calibration.calibrate`)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvplan.calibration.fit import (
    FitResult,
)
from kvplan.calibration.parse_bench import BenchServeResult
from kvplan.calibration.parse_logs import ProxyLog
from kvplan.calibration.parse_multiturn import MultiTurnStats
from kvplan.calibration.parse_prometheus import PrometheusScrape
from kvplan.models.arch import (
    ModelArch,
    descriptors_per_transfer,
    kv_bytes_per_token_per_rank,
    kv_regions_per_rank,
)

MIB = 2**20
AGGREGATE_REASON = "only sums/means per interval are observed; the attention term of a mean is not the mean's"


@dataclass
class Obs:
    """Observations collected from all files, per cost component."""

    prefill: list[tuple[int, int, float, str, float]] = field(default_factory=list)  # new, cached, s, metric, w
    prefill_aggregate_only: bool = True
    xfer: list[tuple[float, float, float, str, float]] = field(default_factory=list)  # desc, bytes, s, metric, w
    post: list[tuple[float, float, float]] = field(default_factory=list)  # desc, s, w
    decode: list[tuple[float, float, float, str, float]] = field(default_factory=list)  # batch, ctx, s, metric, w
    notes: list[str] = field(default_factory=list)
    descriptive: dict[str, Any] = field(default_factory=dict)


# --- collecting observations ---------------------------------------------------------------------------------


def bench_obs(r: BenchServeResult, obs: Obs) -> None:
    """A ``vllm bench serve`` result: TTFT vs input length (prefill) and ITLs vs context (decode)."""
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


def multiturn_obs(m: MultiTurnStats, obs: Obs, use_ttft: bool) -> None:
    """A multi-turn stats file: TTFT vs (new, cached) tokens (unless the proxy join used it) and TPOT vs context."""
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


def proxy_join(proxy: ProxyLog, m: MultiTurnStats, obs: Obs, pull_s: Any) -> int:
    """Proxy P legs joined to a multi-turn file by conversation and turn order; returns the requests joined."""
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


def engine_kv_obs(kv: pd.DataFrame, label: str, obs: Obs) -> None:
    """Engine ``KV Transfer metrics`` intervals: xfer and post time vs descriptors and bytes."""
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


def prometheus_obs(p: PrometheusScrape, obs: Obs) -> None:
    """Prometheus scrape deltas: mean prefill time vs mean computed tokens, NIXL xfer/post sums."""
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


def pull_fn(arch: ModelArch, tp: int, xfer: FitResult | None, base: dict[str, float]) -> Any:
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


def post_note(
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


def points_obs(frame: pd.DataFrame, arch: ModelArch, tp: int, obs: Obs) -> None:
    """A points CSV: prefill rows (new, cached tokens -> s) and kv_transfer rows (NIXL xferDuration per rank)."""
    bpt = kv_bytes_per_token_per_rank(arch, tp)
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


def proxy_descriptive(proxy: ProxyLog, obs: Obs) -> None:
    """Descriptive statistics of a proxy log's P legs (requests, mean, hits, misses, stale)."""
    legs = proxy.prefill["prefill_s"].to_numpy()
    obs.descriptive[f"proxy_p_leg:{os.path.basename(proxy.source)}"] = {
        "requests": int(legs.size),
        "mean_ms": float(legs.mean() * 1000) if legs.size else None,
        "hits": proxy.count("hit"),
        "misses": proxy.count("miss"),
        "stale": proxy.count("stale"),
    }
