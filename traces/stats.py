"""Retention statistics of a trace: gaps, follow-up probabilities by TTL, context growth, tables and figures."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import numpy as np
import pandas as pd

from kvplan.errors import input_error
from kvplan.traces.trace import Trace

#: TTLs at which follow-up probabilities and the gap CDF are reported (seconds).
DEFAULT_TTLS_S: tuple[float, ...] = (30, 60, 120, 300, 480, 600, 900)
#: Percentiles reported for gaps and token counts.
PERCENTILES: tuple[int, ...] = (10, 25, 50, 75, 90, 95, 99)
#: Turn indices at which the context size is reported.
CONTEXT_TURNS: tuple[int, ...] = (1, 2, 3, 5, 10)
#: Crude service-time estimate (WORKLOADS.md 3.1, illustrative): prefill at this many tokens per second ...
CRUDE_PREFILL_TOKENS_PER_S = 8000.0
#: ... plus this many seconds per generated token (25 tokens/s decode).
CRUDE_DECODE_S_PER_TOKEN = 0.040

#: ``service_time_fn(input_tokens, output_tokens) -> seconds``; called with int64 arrays, must broadcast.
ServiceTimeFn = Callable[[np.ndarray, np.ndarray], Any]


def crude_service_time_s(input_tokens: Any, output_tokens: Any) -> Any:
    """Crude service time of a request, ``input / 8000 + 0.040 * output`` seconds (arrays broadcast).

    The illustrative estimate of WORKLOADS.md 3.1 (prefill ~8k tokens/s, decode ~25 tokens/s, no
    queueing): median ~15 s on the Mooncake conversation trace. Use a measured or profiled function
    whenever one is available.
    """
    return np.asarray(input_tokens, dtype=float) / CRUDE_PREFILL_TOKENS_PER_S + CRUDE_DECODE_S_PER_TOKEN * (
        np.asarray(output_tokens, dtype=float)
    )


def json_ready(value: Any) -> Any:
    """Convert numpy scalars/arrays and NaN to plain JSON-serialisable Python values (NaN -> None)."""
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [json_ready(v) for v in value]
    if isinstance(value, np.bool_ | bool):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        f = float(value)
        return f if math.isfinite(f) else None
    return value


def _key(t: float) -> str:
    """Dictionary key of a TTL or turn (``'30'``, ``'2.5'``)."""
    return f"{float(t):g}"


def percentile_summary(values: Any, percentiles: Sequence[int] = PERCENTILES) -> dict[str, Any]:
    """``{'n', 'p10', ..., 'mean'}`` of a sample (None values when it is empty)."""
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    out: dict[str, Any] = {"n": int(arr.size)}
    qs = np.percentile(arr, list(percentiles)) if arr.size else [None] * len(percentiles)
    for p, q in zip(percentiles, qs, strict=True):
        out[f"p{p}"] = None if q is None else float(q)
    out["mean"] = float(arr.mean()) if arr.size else None
    return out


def _service_s(df: pd.DataFrame, pos: np.ndarray, fn: ServiceTimeFn | None) -> tuple[np.ndarray, str]:
    """Service time of the requests at ``pos``: measured where known, else ``fn``; NaN when neither."""
    measured = df["service_s"].to_numpy(dtype=float)[pos]
    if fn is None:
        return measured, "measured" if np.isfinite(measured).any() else "none"
    est = np.broadcast_to(
        np.asarray(
            fn(
                df["input_tokens"].to_numpy(dtype=np.int64)[pos],
                df["output_tokens"].to_numpy(dtype=np.int64)[pos],
            ),
            dtype=float,
        ),
        pos.shape,
    )
    src = "measured + service_time_fn" if np.isfinite(measured).any() else "service_time_fn"
    return np.where(np.isfinite(measured), measured, est), src


def turn_pairs(trace: Trace, service_time_fn: ServiceTimeFn | None = None) -> pd.DataFrame:
    """One row per (parent -> child) pair: gap, idle gap, parent/child tokens and new tokens.

    ``gap_s`` is arrival to arrival; ``idle_s = gap_s - parent service time`` (measured ``service_s`` where
    the trace has it, else ``service_time_fn``; NaN when neither); ``new_tokens = child_in - parent_in -
    parent_out`` (negative when the context was trimmed or edited).
    """
    df = trace.requests
    ppos = pd.Index(df["request_id"].to_numpy()).get_indexer(df["parent_request_id"].to_numpy())
    child = np.flatnonzero(ppos >= 0)
    parent = ppos[child]
    arr = df["arrival_s"].to_numpy(dtype=float)
    n_in = df["input_tokens"].to_numpy(dtype=np.int64)
    n_out = df["output_tokens"].to_numpy(dtype=np.int64)
    gap = arr[child] - arr[parent]
    svc, _ = _service_s(df, parent, service_time_fn)
    return pd.DataFrame(
        {
            "parent_pos": parent,
            "child_pos": child,
            "turn": df["turn"].to_numpy(dtype=np.int64)[child],
            "parent_arrival_s": arr[parent],
            "gap_s": gap,
            "idle_s": gap - svc,
            "parent_input": n_in[parent],
            "parent_output": n_out[parent],
            "child_input": n_in[child],
            "child_output": n_out[child],
            "new_tokens": n_in[child] - n_in[parent] - n_out[parent],
        }
    )


def workload_stats(
    trace: Trace,
    ttls_s: Sequence[float] = DEFAULT_TTLS_S,
    threshold_tokens: int = 64,
    *,
    service_time_fn: ServiceTimeFn | None = None,
    followup_horizon_s: float | None = None,
) -> dict[str, Any]:
    """Retention statistics of a trace as a JSON-serialisable dict (definitions in the module docstring).

    Keys: ``source``, ``requests``, ``sessions``, ``linked_requests``, ``turns_per_session``, ``gap_s``
    (arrival to arrival, percentiles, mean and CDF at each TTL), ``idle_gap_s`` (gap minus the parent's
    service time; None without a measured service time or ``service_time_fn``), ``followup`` (censoring
    rule, eligible requests, P(next turn within T) for each TTL), ``context_by_turn``,
    ``new_tokens_per_turn``, ``input_tokens``, ``output_tokens`` (with the share under
    ``threshold_tokens``).
    """
    ttls = [float(t) for t in ttls_s]
    if not ttls or any((not math.isfinite(t)) or t <= 0 for t in ttls):
        raise input_error("workload_stats: ttls_s", f"is {list(ttls_s)!r}", "give positive finite seconds")
    df = trace.requests
    n = len(df)
    pairs = turn_pairs(trace, service_time_fn)
    sizes = df.groupby("session_id", sort=False).size().to_numpy()
    n_in = df["input_tokens"].to_numpy(dtype=float)
    outs = df["output_tokens"].to_numpy(dtype=float)
    out_stats = percentile_summary(outs)
    out_stats["threshold_tokens"] = int(threshold_tokens)
    out_stats["share_under_threshold"] = float((outs < threshold_tokens).mean()) if n else None
    new_tok = pairs["new_tokens"].to_numpy(dtype=float)
    new_stats = percentile_summary(new_tok)
    new_stats["negative_share"] = float((new_tok < 0).mean()) if new_tok.size else None
    stats = {
        "source": {"path": trace.source, "format": trace.format, "sha256": trace.sha256},
        "requests": n,
        "sessions": int(sizes.size),
        "linked_requests": int(len(pairs)),
        "duration_s": trace.duration_s,
        "sessions_with_2plus_requests": int((sizes >= 2).sum()),
        "share_requests_in_multi_request_sessions": float(sizes[sizes >= 2].sum() / n) if n else None,
        "turns_per_session": _session_stats(df, sizes),
        "gap_s": _gap_stats(pairs, ttls),
        "idle_gap_s": _idle_stats(df, pairs, ttls, service_time_fn),
        "followup": _followup_stats(df, pairs, ttls, followup_horizon_s),
        "context_by_turn": _context_stats(df),
        "new_tokens_per_turn": new_stats,
        "input_tokens": percentile_summary(n_in),
        "output_tokens": out_stats,
    }
    return cast(dict[str, Any], json_ready(stats))


def _session_stats(df: pd.DataFrame, sizes: np.ndarray) -> dict[str, Any]:
    """Requests per session: mean, percentiles, single-request share, deepest chain, the histogram."""
    depth = df.groupby("session_id", sort=False)["turn"].max().to_numpy()
    counts = np.bincount(sizes) if sizes.size else np.zeros(1, dtype=np.int64)
    return {
        "definition": "requests per session",
        "mean": float(sizes.mean()) if sizes.size else None,
        "p50": float(np.percentile(sizes, 50)) if sizes.size else None,
        "p90": float(np.percentile(sizes, 90)) if sizes.size else None,
        "p99": float(np.percentile(sizes, 99)) if sizes.size else None,
        "max": int(sizes.max()) if sizes.size else None,
        "single_request_share": float((sizes == 1).mean()) if sizes.size else None,
        "max_chain_depth": int(depth.max()) if depth.size else None,
        "counts": {str(k): int(c) for k, c in enumerate(counts) if c},
    }


def _gap_stats(pairs: pd.DataFrame, ttls: list[float]) -> dict[str, Any]:
    """Arrival-to-arrival gaps: percentiles and the CDF at each TTL."""
    gaps = pairs["gap_s"].to_numpy(dtype=float)
    gap = percentile_summary(gaps)
    gap["definition"] = "arrival to arrival (includes the parent's own service time and queueing)"
    gap["cdf_at_ttl"] = {_key(t): float((gaps <= t).mean()) if gaps.size else None for t in ttls}
    return gap


def _idle_stats(df: pd.DataFrame, pairs: pd.DataFrame, ttls: list[float],
                service_time_fn: ServiceTimeFn | None) -> dict[str, Any] | None:
    """Idle gaps (gap minus the parent's service time), None without any service time."""
    idle_vals = pairs["idle_s"].to_numpy(dtype=float)
    if not np.isfinite(idle_vals).any():
        return None
    _, svc_src = _service_s(df, pairs["parent_pos"].to_numpy(dtype=np.int64), service_time_fn)
    idle = percentile_summary(idle_vals)
    idle["definition"] = "arrival-to-arrival gap minus the parent's service time"
    idle["service_time"] = svc_src
    idle["negative_share"] = float((idle_vals[np.isfinite(idle_vals)] < 0).mean())
    idle["cdf_at_ttl"] = {_key(t): float((idle_vals <= t).mean()) for t in ttls}
    return idle


def _followup_stats(df: pd.DataFrame, pairs: pd.DataFrame, ttls: list[float],
                    followup_horizon_s: float | None) -> dict[str, Any]:
    """P(next turn within T), censored: only requests that could have a visible child within the horizon."""
    n = len(df)
    arr = df["arrival_s"].to_numpy(dtype=float)
    horizon = float(followup_horizon_s) if followup_horizon_s is not None else max(ttls)
    end = float(arr.max()) if n else 0.0
    first_gap = np.full(n, np.inf)
    if len(pairs):
        np.minimum.at(first_gap, pairs["parent_pos"].to_numpy(dtype=np.int64), pairs["gap_s"].to_numpy(dtype=float))
    eligible = df["linkable"].to_numpy(dtype=bool) & (arr <= end - horizon)
    fg = first_gap[eligible]
    return {
        "rule": f"linkable requests arriving at least the horizon ({horizon:g} s) before the last arrival "
        f"({end:g} s); next turn = the earliest child",
        "horizon_s": horizon,
        "eligible_requests": int(eligible.sum()),
        "within_horizon": float((fg <= horizon).mean()) if fg.size else None,
        "any_visible": float(np.isfinite(fg).mean()) if fg.size else None,
        "within": {_key(t): (float((fg <= t).mean()) if fg.size else None) for t in ttls},
    }


def _context_stats(df: pd.DataFrame) -> dict[str, Any]:
    """Prompt size at each turn index of :data:`CONTEXT_TURNS`."""
    turn_col = df["turn"].to_numpy(dtype=np.int64)
    n_in = df["input_tokens"].to_numpy(dtype=float)
    context = {}
    for k in CONTEXT_TURNS:
        vals = n_in[turn_col == k]
        context[str(k)] = {
            "n": int(vals.size),
            "p50": float(np.percentile(vals, 50)) if vals.size else None,
            "p90": float(np.percentile(vals, 90)) if vals.size else None,
        }
    return context


def _fmt(x: Any, digits: int = 0) -> str:
    """Format a number with thousands separators (``-`` for None)."""
    if x is None:
        return "-"
    return f"{float(x):,.{digits}f}"


def stats_table(stats: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Rows ``(label, value)`` of :func:`workload_stats` output, for printing."""
    rows: list[tuple[str, str]] = [
        ("source", f"{stats['source']['path']} ({stats['source']['format']})"),
        ("requests", _fmt(stats["requests"])),
        (
            "sessions",
            f"{_fmt(stats['sessions'])} ({_fmt(stats['sessions_with_2plus_requests'])} with >= 2 requests)",
        ),
        ("linked requests (have a parent)", _fmt(stats["linked_requests"])),
        ("duration", f"{_fmt(stats['duration_s'])} s"),
    ]
    tps = stats["turns_per_session"]
    rows.append(
        (
            "requests per session",
            f"mean {_fmt(tps['mean'], 2)}, p50 {_fmt(tps['p50'])}, p90 {_fmt(tps['p90'])}, "
            f"p99 {_fmt(tps['p99'])}, max {_fmt(tps['max'])}",
        )
    )
    pcts = "/".join(f"p{p}" for p in PERCENTILES)
    for key, label in (("gap_s", "gap arrival-to-arrival"), ("idle_gap_s", "idle gap (gap - service)")):
        g = stats.get(key)
        if not g:
            continue
        rows.append((f"{label} {pcts} (s)", " / ".join(_fmt(g[f"p{p}"]) for p in PERCENTILES)))
        rows.append((f"{label} mean, n", f"{_fmt(g['mean'])} s, n = {_fmt(g['n'])}"))
    f = stats["followup"]
    rows.append(("follow-up censoring", f"{f['rule']}; n = {_fmt(f['eligible_requests'])}"))
    for t, p in f["within"].items():
        rows.append((f"P(next turn within {t} s)", _fmt(p, 3)))
    rows.append((f"P(next turn within horizon {f['horizon_s']:g} s)", _fmt(f["within_horizon"], 3)))
    for t, c in stats["context_by_turn"].items():
        rows.append(
            (f"context turn {t} p50 / p90", f"{_fmt(c['p50'])} / {_fmt(c['p90'])} (n = {_fmt(c['n'])})")
        )
    nt = stats["new_tokens_per_turn"]
    rows.append(
        (
            "new tokens per turn p10/p50/p90/p99",
            " / ".join(_fmt(nt[f"p{p}"]) for p in (10, 50, 90, 99))
            + f" ({_fmt(nt['negative_share'], 3)} negative)",
        )
    )
    out = stats["output_tokens"]
    rows.append(("output tokens p10/p50/p90/p99", " / ".join(_fmt(out[f"p{p}"]) for p in (10, 50, 90, 99))))
    rows.append((f"outputs under {out['threshold_tokens']} tokens", _fmt(out["share_under_threshold"], 3)))
    return rows


def stats_figure(trace: Trace, stats: Mapping[str, Any]) -> Any:
    """Plotly figure: gap CDF (log x, TTLs marked) and context p50/p90 by turn. No Streamlit."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("inter-turn gap CDF", "context by turn"))
    pairs = turn_pairs(trace)
    gaps = np.sort(pairs["gap_s"].to_numpy(dtype=float))
    if gaps.size:
        y = np.arange(1, gaps.size + 1) / gaps.size
        fig.add_trace(
            go.Scatter(x=np.maximum(gaps, 1e-3), y=y, mode="lines", name="gap (arrival to arrival)"), 1, 1
        )
    for t in stats["gap_s"].get("cdf_at_ttl", {}):
        fig.add_vline(x=float(t), line_dash="dot", line_color="grey", row=1, col=1)
        fig.add_annotation(
            x=math.log10(float(t)), y=1.02, text=f"{t} s", showarrow=False, row=1, col=1, font_size=9
        )
    fig.update_xaxes(type="log", title_text="seconds", row=1, col=1)
    fig.update_yaxes(title_text="fraction of gaps <= x", range=[0, 1.05], row=1, col=1)
    df = trace.requests
    by_turn = df.groupby("turn")["input_tokens"]
    sizes = by_turn.size()
    turns = [int(k) for k in sizes.index][:30]
    if turns:
        q = by_turn.quantile(np.array([0.5, 0.9])).unstack()
        fig.add_trace(
            go.Scatter(x=turns, y=q.loc[turns, 0.5], mode="lines+markers", name="context p50"), 1, 2
        )
        fig.add_trace(
            go.Scatter(x=turns, y=q.loc[turns, 0.9], mode="lines+markers", name="context p90"), 1, 2
        )
    fig.update_xaxes(title_text="turn", row=1, col=2)
    fig.update_yaxes(title_text="input tokens", row=1, col=2)
    fig.update_layout(
        title_text=f"{os.path.basename(trace.source)}: {trace.n_sessions:,} sessions, "
        f"{len(pairs):,} linked turns"
    )
    return fig
