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
    """The rows as a table (``calibration.figures.rows_frame``), relative error in percent."""
    frame = calibration_figures.rows_frame(rows)
    if "rel_error" in frame:
        frame = frame.assign(rel_error_pct=pd.to_numeric(frame["rel_error"], errors="coerce") * 100.0)
        frame = frame.drop(columns=["rel_error"])
    return frame


def reproduce_ratios(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """``calibration.reproduce.ratio_checks`` (ON/OFF TTFT ratio at the longest prompt) as a table."""
    return pd.DataFrame(reproduce.ratio_checks(rows))
