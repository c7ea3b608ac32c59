"""Dashboard reproduce page state: the published P5en points against the simulator (``kvplan reproduce``)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from kvplan.calibration import figures as calibration_figures
from kvplan.calibration import reproduce

#: Models with published P5en points.
PUBLISHED_MODELS = ("qwen3-32b", "glm-5-fp8")


@st.cache_data(max_entries=32, show_spinner=False)
def reproduce_cached(model: str, profile: str | None) -> list[dict[str, Any]]:
    """The published-vs-simulated rows for ``model`` (and a profile name or path), cached on those strings."""
    return [dict(r) for r in reproduce.reproduce_rows(model=model, profile=profile)]


def reproduce_figures(rows: list[dict[str, Any]], model: str) -> list[Any]:
    """The published P5en charts against the simulator's, drawn by ``calibration.figures`` (as
    ``kvplan reproduce --html``): TTFT vs prompt length ON/OFF and the prefill split."""
    return list(calibration_figures.reproduce_figures(rows, model))


def reproduce_table(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The rows as a table (``calibration.figures.rows_frame``), relative error in percent, and for a published point
    its acceptance tolerance (%) and whether it is within it, as ``kvplan reproduce`` prints them (None elsewhere)."""
    frame = calibration_figures.rows_frame(rows)
    if "rel_error" in frame:
        frame = frame.assign(rel_error_pct=pd.to_numeric(frame["rel_error"], errors="coerce") * 100.0)
        frame = frame.drop(columns=["rel_error"])
    published = [r.get("published_ms") is not None and r.get("rel_error") is not None for r in rows]
    frame["tolerance_pct"] = [reproduce.TOLERANCE[str(r["series"])] * 100.0 if p else None
                              for r, p in zip(rows, published, strict=True)]
    frame["within_tolerance"] = [reproduce.within_tolerance(r) if p else None for r, p in zip(rows, published, strict=True)]
    return frame


def reproduce_notes(rows: list[dict[str, Any]], profile: str | None) -> list[str]:
    """What ``kvplan reproduce`` prints under its table: the points outside their tolerance, each model's profile
    (name, status and where each part comes from) and the turns aggregated."""
    from kvplan.models.profile import load_profile

    out = [f"{r['model']} {r['series']} at {r['prompt_tokens']} tokens: {float(r['rel_error']):+.1%}, outside its "
           f"±{reproduce.TOLERANCE[str(r['series'])]:.0%} tolerance" for r in rows
           if r.get("published_ms") is not None and r.get("rel_error") is not None and not reproduce.within_tolerance(r)]
    for m in dict.fromkeys(str(r["model"]) for r in rows if r.get("published_ms") is not None):
        prof = load_profile(profile if profile is not None else f"p5en-{m}")
        out.append(f"{m}: profile {prof.name} ({prof.status}; {prof.status_line()})")
    out.append("aggregation: turns 2..5 (the first turn of each conversation is the benchmark's warm-up)")
    return out


def reproduce_ratios(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """``calibration.reproduce.ratio_checks`` (ON/OFF TTFT ratio at the longest prompt) as a table."""
    return pd.DataFrame(reproduce.ratio_checks(rows))
