"""Plotly figure builders of the calibration (no Streamlit: ``kvplan reproduce --html`` and the dashboard).

They mirror the write-up's charts: TTFT against prompt length with bidirectional transfer ON and OFF,
and the prefill duration split into recompute and D->P KV transfer. Inputs are the rows of
:func:`kvplan.calibration.reproduce.reproduce_rows` (simulated curves at every prefix size, published end
points as markers).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from kvplan.atomic import atomic_write_bytes

ON_COLOUR = "#1f77b4"
OFF_COLOUR = "#d62728"
XFER_COLOUR = "#2ca02c"


def rows_frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Rows as a frame with numeric ``prompt_tokens``, ``published_ms``, ``simulated_ms``, ``rel_error``."""
    columns = ["model", "series", "prompt_tokens", "published_ms", "simulated_ms", "rel_error"]
    frame = pd.DataFrame(list(rows), columns=columns)
    for col in ("prompt_tokens", "published_ms", "simulated_ms", "rel_error"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    return frame


def _series(frame: pd.DataFrame, name: str) -> pd.DataFrame:
    return frame[frame["series"] == name].sort_values("prompt_tokens")


def ttft_figure(rows: Sequence[Mapping[str, Any]], model: str) -> go.Figure:
    """TTFT vs prompt length (prefix size), ON and OFF: simulated lines, published end points as markers."""
    frame = rows_frame([r for r in rows if r["model"] == model])
    fig = go.Figure()
    for name, label, colour in (("ttft_off", "OFF (recompute)", OFF_COLOUR), ("ttft_on", "ON (D->P pull)", ON_COLOUR)):
        sub = _series(frame, name)
        fig.add_trace(
            go.Scatter(x=sub["prompt_tokens"], y=sub["simulated_ms"], mode="lines+markers", name=f"{label}: kvplan",
                       line={"color": colour}, hovertemplate="%{x} tokens: %{y:.0f} ms<extra></extra>")
        )
        pub = sub.dropna(subset=["published_ms"])
        fig.add_trace(
            go.Scatter(x=pub["prompt_tokens"], y=pub["published_ms"], mode="markers", name=f"{label}: published",
                       marker={"color": colour, "symbol": "diamond-open", "size": 13, "line": {"width": 2}},
                       hovertemplate="published %{y:.0f} ms at %{x} tokens<extra></extra>")
        )
    fig.update_layout(
        title=f"{model} on p5en (1P1D, TP8): TTFT vs prompt length",
        xaxis_title="prefix size (tokens)", yaxis_title="mean TTFT (ms)", template="plotly_white",
        legend={"orientation": "h", "y": -0.2},
    )
    return fig


def prefill_split_figure(rows: Sequence[Mapping[str, Any]], model: str) -> go.Figure:
    """Prefill duration per prefix size: OFF (recompute only) next to ON split into KV transfer + the rest.

    ON bars stack the simulated D->P xferDuration (``kv_transfer_on``) and the remainder of the P leg
    (recompute of the suffix plus request overheads); markers are the published values.
    """
    frame = rows_frame([r for r in rows if r["model"] == model])
    off = _series(frame, "prefill_off")
    on = _series(frame, "prefill_on").set_index("prompt_tokens")
    kv = _series(frame, "kv_transfer_on").set_index("prompt_tokens")
    x = [str(int(t)) for t in on.index]
    rest = on["simulated_ms"] - kv["simulated_ms"].reindex(on.index).fillna(0.0)
    fig = go.Figure()
    fig.add_trace(go.Bar(x=[str(int(t)) for t in off["prompt_tokens"]], y=off["simulated_ms"],
                         name="OFF: recompute (kvplan)", marker_color=OFF_COLOUR, offsetgroup="off"))
    fig.add_trace(go.Bar(x=x, y=kv["simulated_ms"].reindex(on.index), name="ON: D->P KV transfer (kvplan)",
                         marker_color=XFER_COLOUR, offsetgroup="on"))
    fig.add_trace(go.Bar(x=x, y=rest, name="ON: recompute + overheads (kvplan)", marker_color=ON_COLOUR,
                         offsetgroup="on", base=kv["simulated_ms"].reindex(on.index).fillna(0.0)))
    for name, colour, label in (("prefill_off", OFF_COLOUR, "OFF published"), ("prefill_on", ON_COLOUR, "ON published"),
                                ("kv_transfer_on", XFER_COLOUR, "KV transfer published")):
        pub = _series(frame, name).dropna(subset=["published_ms"])
        fig.add_trace(go.Scatter(x=[str(int(t)) for t in pub["prompt_tokens"]], y=pub["published_ms"], mode="markers",
                                 name=label, marker={"color": colour, "symbol": "diamond-open", "size": 13,
                                                     "line": {"width": 2, "color": "black"}}))
    fig.update_layout(
        title=f"{model} on p5en: prefill duration split into recompute and KV transfer",
        xaxis_title="prefix size (tokens)", yaxis_title="prefill duration (ms)", barmode="group",
        template="plotly_white", legend={"orientation": "h", "y": -0.2},
    )
    return fig


def reproduce_figures(rows: Sequence[Mapping[str, Any]], model: str | None = None) -> list[go.Figure]:
    """Both figures for ``model`` (for every model in ``rows`` when ``None``)."""
    models = [model] if model is not None else list(dict.fromkeys(str(r["model"]) for r in rows))
    figs: list[go.Figure] = []
    for m in models:
        figs += [ttft_figure(rows, m), prefill_split_figure(rows, m)]
    return figs


def write_html(figures: Sequence[go.Figure], path: str | Path, title: str = "kvplan reproduce", *,
               overwrite: bool = False, inputs: Sequence[Any] = ()) -> Path:
    """Write the figures into one self-contained HTML file (plotly.js embedded: no network), atomically, under
    kvplan's output rule (``overwrite`` replaces a file kvplan did not write; never one of ``inputs``)."""
    out = Path(path)
    parts = [
        # a fixed div id per figure: plotly's default is a random UUID, and the same run must give the same bytes
        fig.to_html(full_html=False, include_plotlyjs=(i == 0), div_id=f"kvplan-figure-{i}")
        for i, fig in enumerate(figures)
    ]
    html = f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title></head><body>" + "".join(parts)
    html += "</body></html>\n"
    return atomic_write_bytes(out, html.encode("utf-8"), flag="--html", overwrite=overwrite, inputs=inputs)
