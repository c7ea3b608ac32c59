"""Plotly figure builders of the dashboard: plain functions of frames and dicts, no Streamlit.

Every builder takes what the public API returns (``Result.turns``, ``Result.summary``,
``Result.pinned_series()``, sweep frames, reproduce rows) and returns a ``plotly.graph_objects.Figure``.
Times are shown in ms, s or min by their size (:func:`time_unit`) and memory in GiB; the units are in every axis
title.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go

MS_PER_S = 1000.0

#: TTFT components in stacking order: (label, ``turns`` columns summed). Their sum is ``ttft_s``
#: (the identity documented in ``sim/results.py``); "proxy + API overhead" is the profile's fixed
#: per-leg overhead, shown so that the stack adds up to the TTFT.
TTFT_COMPONENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("queue (P + D)", ("prefill_queue_s", "d_queue_s")),
    ("KV pull D->P", ("kv_pull_s",)),
    ("prefill compute", ("prefill_s",)),
    ("P->D transfer", ("p2d_transfer_s",)),
    ("first decode step", ("first_decode_s",)),
    ("proxy + API overhead", ("overhead_s",)),
)

#: Every decision of ``turns.decision``, in display order.
DECISIONS: tuple[str, ...] = ("local", "pull", "host_pull", "recompute_below_threshold", "miss", "expired", "error")

_COMPONENT_COLOURS = ("#9e9e9e", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#d3d3d3")
_DECISION_COLOURS = {
    "local": "#2ca02c",
    "pull": "#1f77b4",
    "host_pull": "#17becf",
    "recompute_below_threshold": "#ff7f0e",
    "miss": "#7f7f7f",
    "expired": "#d62728",
    "error": "#8c0000",
}


def _layout(fig: go.Figure, title: str, x_title: str, y_title: str, **kw: Any) -> go.Figure:
    fig.update_layout(
        title=title,
        xaxis_title=x_title,
        yaxis_title=y_title,
        margin={"l": 60, "r": 20, "t": 50, "b": 40},
        # legend under the plot, so that long legends never cover the title
        legend={"orientation": "h", "yanchor": "top", "y": -0.22, "xanchor": "left", "x": 0.0},
        **kw,
    )
    return fig


def ok_ttft_ms(turns: pd.DataFrame) -> np.ndarray:
    """TTFT in ms of the turns that got a first token (errors excluded), sorted ascending."""
    ok = turns[turns["decision"] != "error"]["ttft_s"].dropna().to_numpy(dtype=float)
    return np.sort(ok * MS_PER_S)


#: Decimals of a time in each unit of :func:`time_unit`, as :func:`kvplan.units.human_s` prints it.
_UNIT_DECIMALS = {"ms": 1, "s": 2, "min": 1}


def ttft_distribution(runs: Mapping[str, pd.DataFrame]) -> go.Figure:
    """Empirical CDF of TTFT per labelled run (e.g. ``{"ON": turns, "OFF": turns}``), p90 marked; in ms, s or min by
    the largest TTFT shown (:func:`time_unit`), so a saturated run's minutes are not millions of ms.

    Errors have no first token and are left out of the CDF (the hover says how many).
    """
    fig = go.Figure()
    per_run = {label: ok_ttft_ms(turns) / MS_PER_S for label, turns in runs.items()}
    scale, unit = time_unit([float(x[-1]) for x in per_run.values() if len(x)])
    digits = _UNIT_DECIMALS[unit]
    for i, (label, turns) in enumerate(runs.items()):
        x = per_run[label] * scale
        errors = int((turns["decision"] == "error").sum())
        if len(x) == 0:
            continue
        y = np.arange(1, len(x) + 1) / len(x)
        colour = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd")[i % 4]
        fig.add_trace(
            go.Scatter(
                x=x, y=y, mode="lines", line={"shape": "hv", "color": colour}, name=f"{label} ({len(x)} turns)",
                hovertemplate=f"{label}: %{{x:.{digits}f}} {unit}, %{{y:.0%}} of turns<extra>{errors} errors "
                              "excluded</extra>",
            )
        )
        p90 = float(np.percentile(x, 90))
        fig.add_vline(x=p90, line={"dash": "dot", "color": colour, "width": 1},
                      annotation_text=f"{label} p90 {p90:.{digits}f} {unit}", annotation_font_color=colour,
                      annotation_position=("top left", "bottom right", "top right", "bottom left")[i % 4])
    return _layout(fig, "TTFT distribution: bidirectional ON vs OFF", f"TTFT ({unit})", "fraction of turns",
                   yaxis={"range": [0, 1.02], "tickformat": ".0%"})


def ttft_split_frame(turns: pd.DataFrame) -> pd.DataFrame:
    """Mean TTFT components (ms) per decision and over all turns; errors excluded.

    Rows: each decision present, then ``all``; columns: the labels of :data:`TTFT_COMPONENTS`,
    ``turns`` and ``ttft_ms`` (mean TTFT, equal to the sum of the components).
    """
    ok = turns[turns["decision"] != "error"]
    rows: list[dict[str, Any]] = []
    groups: list[tuple[str, pd.DataFrame]] = [(d, ok[ok["decision"] == d]) for d in DECISIONS]
    groups.append(("all", ok))
    for name, sub in groups:
        if sub.empty:
            continue
        row: dict[str, Any] = {"group": name, "turns": int(len(sub))}
        for label, cols in TTFT_COMPONENTS:
            row[label] = float(sub[list(cols)].sum(axis=1).mean() * MS_PER_S)
        row["ttft_ms"] = float(sub["ttft_s"].mean() * MS_PER_S)
        rows.append(row)
    return pd.DataFrame(rows).set_index("group") if rows else pd.DataFrame()


def ttft_split(turns: pd.DataFrame) -> go.Figure:
    """Stacked bars of the mean TTFT split per decision: queue, KV pull, prefill, P->D, first decode, overhead."""
    frame = ttft_split_frame(turns)
    fig = go.Figure()
    # in ms, s or min by the largest mean TTFT of a group (time_unit), as the CDF beside it
    scale, unit = time_unit([] if frame.empty else [float(frame["ttft_ms"].max()) / MS_PER_S])
    if not frame.empty:
        x = [f"{g} ({n})" for g, n in zip(frame.index, frame["turns"], strict=True)]
        for (label, _cols), colour in zip(TTFT_COMPONENTS, _COMPONENT_COLOURS, strict=True):
            fig.add_trace(
                go.Bar(x=x, y=frame[label] / MS_PER_S * scale, name=label, marker_color=colour,
                       hovertemplate=f"{label}: %{{y:.{_UNIT_DECIMALS[unit]}f}} {unit}<extra></extra>")
            )
    return _layout(fig, "TTFT split per P decision (mean; turns in brackets)", "P decision",
                   f"mean TTFT component ({unit})", barmode="stack")


def decision_mix(summaries: Mapping[str, Mapping[str, Any]]) -> go.Figure:
    """Grouped bars of the decision counts (every decision, zeros included) per labelled summary."""
    fig = go.Figure()
    for i, (label, summary) in enumerate(summaries.items()):
        counts = summary.get("decisions", {})
        fig.add_trace(
            go.Bar(
                x=list(DECISIONS), y=[int(counts.get(d, 0)) for d in DECISIONS], name=label,
                marker_color=("#1f77b4", "#bdbdbd", "#d62728")[i % 3],
                hovertemplate=f"{label}: %{{x}} %{{y}} turns<extra></extra>",
            )
        )
    fig.update_xaxes(tickvals=list(DECISIONS), ticktext=[d.replace("_below_", "<br>below ") for d in DECISIONS],
                     tickangle=0)
    return _layout(fig, "Decision mix (turns per P decision)", "decision", "turns", barmode="group")


def pinned_kv(pinned: pd.DataFrame, capacity_gib: float, t_end_s: float, label: str = "pinned") -> go.Figure:
    """Retained (pinned) decode KV over time (GiB, all decode nodes) against the decode KV capacity.

    ``pinned`` is ``Result.pinned_series()`` (step samples ``t_s, pinned_gib``); the curve starts at 0
    at t = 0 and is held to ``t_end_s``.
    """
    t = [0.0, *pinned["t_s"].astype(float).tolist()]
    v = [0.0, *pinned["pinned_gib"].astype(float).tolist()]
    if t_end_s > t[-1]:
        t.append(float(t_end_s))
        v.append(v[-1])
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(x=t, y=v, mode="lines", line={"shape": "hv", "color": "#1f77b4"}, fill="tozeroy", name=label,
                   hovertemplate="t=%{x:.1f} s: %{y:.1f} GiB pinned<extra></extra>")
    )
    if math.isfinite(capacity_gib) and capacity_gib > 0:
        fig.add_hline(y=capacity_gib, line={"dash": "dash", "color": "#d62728"},
                      annotation_text=f"decode KV capacity {capacity_gib:,.0f} GiB", annotation_position="top left")
    peak = max(v) if v else 0.0
    share = f" (peak {peak / capacity_gib:.1%} of capacity)" if capacity_gib > 0 else ""
    return _layout(fig, f"Decode KV pinned by retention{share}", "simulated time (s)", "pinned decode KV (GiB)",
                   yaxis={"rangemode": "tozero"})


def _axis_position(values: Sequence[float], x: float) -> float:
    """Fractional index of ``x`` on an ordered categorical axis of ``values`` (log-interpolated)."""
    vals = np.asarray(values, dtype=float)
    if len(vals) == 1:
        return 0.0
    idx = np.arange(len(vals), dtype=float)
    # log1p keeps 0 on the axis and spaces 1 s .. 900 s the way the eye expects
    return float(np.interp(np.log1p(max(x, 0.0)), np.log1p(vals), idx))


def grid_heatmap(
    grid: pd.DataFrame,
    value: str,
    title: str,
    colorbar_title: str,
    marks: Mapping[str, tuple[float, float]] | None = None,
    scale: float = 1.0,
    reverse: bool = False,
) -> go.Figure:
    """Heatmap of ``grid[value] * scale`` over TTL (x) and threshold (y), with labelled points marked.

    ``grid`` has one row per point with ``ttl_s``, ``threshold_tokens``, ``value`` and optionally
    ``<value>_ci95``, ``hit_rate`` and ``errors`` (shown on hover). Axes are ordered categories (the grid is usually
    geometric); ``marks`` maps a label to a ``(ttl_s, threshold_tokens)`` point, placed between
    categories by log interpolation when it is not on the grid.
    """
    ttls = sorted(grid["ttl_s"].astype(float).unique())
    ths = sorted(grid["threshold_tokens"].astype(float).unique())
    z = np.full((len(ths), len(ttls)), np.nan)
    text = np.full((len(ths), len(ttls)), "", dtype=object)
    cis: list[float] = []
    for _, row in grid.iterrows():
        i, j = ths.index(float(row["threshold_tokens"])), ttls.index(float(row["ttl_s"]))
        z[i, j] = float(row[value]) * scale
        extra = []
        ci = float(row.get(f"{value}_ci95", math.nan)) * scale
        if math.isfinite(ci):
            extra.append(f"95% CI +/- {ci:.1f}")
            cis.append(abs(ci))
        if "hit_rate" in row:
            extra.append(f"hit rate {float(row['hit_rate']):.0%}")
        if "errors" in row:
            extra.append(f"errors {float(row['errors']):g}")
        text[i, j] = ", ".join(extra)
    # differences within the noise (the replications' CI, or 1% of the level) are not drawn as colour
    zrange: dict[str, float] = {}
    finite = z[np.isfinite(z)]
    if finite.size:
        mid = float(finite.mean())
        noise = max(max(cis, default=0.0), 0.01 * abs(mid))
        if noise > 0 and float(finite.max() - finite.min()) < noise:
            zrange = {"zmin": mid - noise, "zmax": mid + noise}
            title = f"{title} (every point within noise: +/- {noise:.3g})"
    fig = go.Figure(
        go.Heatmap(
            z=z, x=list(range(len(ttls))), y=list(range(len(ths))), text=text, **zrange,
            colorscale="Viridis", reversescale=reverse, colorbar={"title": colorbar_title},
            customdata=np.dstack(np.meshgrid(ttls, ths)),
            hovertemplate="TTL %{customdata[0]:g} s, threshold %{customdata[1]:g} tokens: %{z:.1f}"
                          "<br>%{text}<extra></extra>",
        )
    )
    symbols = ("star", "x", "diamond", "circle")
    for k, (label, (ttl, th)) in enumerate((marks or {}).items()):
        fig.add_trace(
            go.Scatter(
                x=[_axis_position(ttls, ttl)], y=[_axis_position(ths, th)], mode="markers+text",
                marker={"symbol": symbols[k % len(symbols)], "size": 16, "color": "white",
                        "line": {"color": "black", "width": 2}},
                text=[label], textposition="top center", textfont={"color": "white"}, name=f"{label} ({ttl:g} s, {th:g})",
                hovertemplate=f"{label}: TTL {ttl:g} s, threshold {th:g} tokens<extra></extra>",
            )
        )
    fig.update_xaxes(tickvals=list(range(len(ttls))), ticktext=[f"{v:g}" for v in ttls])
    fig.update_yaxes(tickvals=list(range(len(ths))), ticktext=[f"{v:g}" for v in ths])
    return _layout(fig, title, "decoder_kv_blocks_ttl (s)", "kv_recompute_threshold (tokens)")


def residual_scatter(frame: pd.DataFrame, title: str = "Fit residuals") -> go.Figure:
    """Residuals (observed - predicted, ms) against x, one colour per metric.

    ``frame`` has columns ``metric``, ``x``, ``observed``, ``predicted`` (ms, as ``calibration.fit`` reports
    residuals of times).
    """
    fig = go.Figure()
    for metric, sub in frame.groupby("metric", sort=True):
        fig.add_trace(go.Scatter(x=sub["x"], y=sub["observed"] - sub["predicted"], mode="markers", name=str(metric),
                                 hovertemplate=f"{metric}: x=%{{x}}, residual %{{y:.2f}}<extra></extra>"))
    fig.add_hline(y=0, line={"color": "black", "width": 1})
    return _layout(fig, title, "x (tokens, context or batch)", "observed - predicted (ms)")


def parsed_points(frame: pd.DataFrame, x: str, y: str, colour: str | None, title: str, x_title: str,
                  y_title: str) -> go.Figure:
    """Scatter of a parsed trace's points (e.g. TTFT vs input length), one colour per ``colour`` value."""
    fig = go.Figure()
    groups = frame.groupby(colour, sort=True) if colour else [("points", frame)]
    for name, sub in groups:
        fig.add_trace(go.Scatter(x=sub[x], y=sub[y], mode="markers", name=str(name), marker={"size": 6, "opacity": 0.7}))
    return _layout(fig, title, x_title, y_title, legend_title_text=colour or "")


def time_unit(values_s: Sequence[float]) -> tuple[float, str]:
    """(scale, unit) that shows seconds in human units: ms below 1 s, s below 2 min, else min (by the largest)."""
    finite = [abs(float(v)) for v in values_s if v is not None and math.isfinite(float(v))]
    top = max(finite, default=0.0)
    if top < 1.0:
        return MS_PER_S, "ms"
    if top < 120.0:
        return 1.0, "s"
    return 1 / 60, "min"


def ttl_curve(curve: Sequence[Mapping[str, Any]], chosen_ttl_s: float | None = None,
              baseline_ttft_mean_s: float | None = None) -> go.Figure:
    """The advisor's TTL sweep: mean TTFT (left, in ms, s or min by its size: :func:`time_unit`) and pinned decode
    KV (GiB, right) against the TTL.

    ``curve`` rows carry ``ttl_s``, ``ttft_mean_s`` and ``pinned_kv_gib_mean`` (``plan.advice``'s
    ``ttl_curve``); the chosen TTL is a vertical line, TTFT with bidirectional off a horizontal one.
    """
    from plotly.subplots import make_subplots

    frame = pd.DataFrame(list(curve))
    times = [*(frame["ttft_mean_s"].tolist() if not frame.empty else []),
             *([baseline_ttft_mean_s] if baseline_ttft_mean_s is not None else [])]
    scale, unit = time_unit(times)
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    if not frame.empty:
        frame = frame.sort_values("ttl_s")
        fig.add_trace(go.Scatter(x=frame["ttl_s"], y=frame["ttft_mean_s"] * scale, mode="lines+markers",
                                 name=f"mean TTFT ({unit})", line={"color": "#1f77b4"},
                                 hovertemplate=f"TTL %{{x:g}} s: %{{y:.3g}} {unit}<extra></extra>"), secondary_y=False)
        fig.add_trace(go.Scatter(x=frame["ttl_s"], y=frame["pinned_kv_gib_mean"], mode="lines+markers",
                                 name="pinned decode KV mean (GiB)", line={"color": "#ff7f0e", "dash": "dot"},
                                 hovertemplate="TTL %{x:g} s: %{y:.1f} GiB<extra></extra>"), secondary_y=True)
    if chosen_ttl_s is not None and chosen_ttl_s > 0:
        # plotly.js places shapes on a log axis by data value, but annotations by log10 of it
        fig.add_vline(x=chosen_ttl_s, line={"color": "#2ca02c", "dash": "dash"})
        fig.add_annotation(x=math.log10(chosen_ttl_s), y=1.0, xref="x", yref="paper", text=f"recommended {chosen_ttl_s:g} s",
                           showarrow=False, xanchor="right", yanchor="top")
    if baseline_ttft_mean_s is not None and math.isfinite(baseline_ttft_mean_s):
        fig.add_hline(y=baseline_ttft_mean_s * scale, line={"color": "#d62728", "dash": "dot"},
                      annotation_text="bidirectional off", annotation_position="bottom right")
    fig.update_xaxes(type="log", title_text="decoder_kv_blocks_ttl (s)")
    fig.update_yaxes(title_text=f"mean TTFT ({unit})", secondary_y=False)
    fig.update_yaxes(title_text="pinned decode KV mean (GiB)", secondary_y=True, rangemode="tozero")
    return _layout(fig, "TTL sweep behind the advice", "decoder_kv_blocks_ttl (s)", f"mean TTFT ({unit})")


def _num(v: Any) -> float:
    return float(v) if isinstance(v, int | float) and math.isfinite(float(v)) else math.nan


def compare_figure(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """``kvplan compare`` side by side: TTFT p50/p90/p99 (ms, ± 95% CI), hit rate, pinned KV and TPOT per policy."""
    from plotly.subplots import make_subplots

    names = [str(r["policy"]) for r in rows]
    fig = make_subplots(rows=2, cols=2, subplot_titles=("TTFT (ms)", "hit rate (%)", "pinned decode KV (GiB)",
                                                        "TPOT mean (ms)"))

    def bar(key: str, label: str, scale: float, row: int, col: int, colour: str) -> None:
        y = [_num(r.get(key)) * scale for r in rows]
        err = [_num(r.get(f"{key}_ci95")) * scale for r in rows]
        fig.add_trace(go.Bar(x=names, y=y, name=label, marker_color=colour,
                             error_y={"type": "data", "array": [0.0 if math.isnan(e) else e for e in err]}),
                      row=row, col=col)

    for key, label, colour in (("ttft_p50_s", "TTFT p50", "#1f77b4"), ("ttft_p90_s", "TTFT p90", "#ff7f0e"),
                               ("ttft_p99_s", "TTFT p99", "#d62728")):
        bar(key, label, MS_PER_S, 1, 1, colour)
    bar("hit_rate", "hit rate", 100.0, 1, 2, "#2ca02c")
    bar("pinned_kv_gib_mean", "pinned KV mean", 1.0, 2, 1, "#9467bd")
    bar("pinned_kv_gib_peak", "pinned KV peak", 1.0, 2, 1, "#c5b0d5")
    bar("tpot_mean_s", "TPOT mean", MS_PER_S, 2, 2, "#8c564b")
    fig.update_layout(barmode="group", height=720)
    gpus = sorted({int(r["gpus"]) for r in rows})
    return _layout(fig, f"kvplan compare: {len(rows)} policies on {', '.join(map(str, gpus))} GPUs", "", "")
