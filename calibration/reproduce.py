"""Reproduce the published P5en measurements with the simulator (``kvplan reproduce``, the dashboard page).

:func:`reproduce_rows` simulates the published benchmark at every prefix size of the write-up's sweep,
ON and OFF, through the public ``run()`` API with a profile (the shipped one by default) and returns one
row per (model, series, prefix size): ``model, series, prompt_tokens, published_ms, simulated_ms,
rel_error`` (``published_ms`` and ``rel_error`` are ``None`` where the write-up gives no number: only the
end points of each curve are published). Pure: no printing, no files; the published points are the
embedded copy (:mod:`kvplan.calibration.published_data`), so nothing outside the package is read.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from kvplan.calibration.published import (
    PREFIX_SIZES,
    RATIO_TOLERANCE,
    SERIES,
    TOLERANCE,
    Aggregation,
    published_points,
    simulate_series,
)
from kvplan.errors import input_error
from kvplan.models.profile import Profile, default_profile_name, load_profile

#: The keys of every row, in order (``kvplan reproduce --json`` prints exactly these).
ROW_KEYS = ("model", "series", "prompt_tokens", "published_ms", "simulated_ms", "rel_error")
HARDWARE = "p5en"


def _profile_for(model: str | None, profile: str | Path | None) -> tuple[list[str], dict[str, str], Profile | None]:
    if profile is None:
        models = [model] if model is not None else list(PREFIX_SIZES)
        for m in models:
            if m not in PREFIX_SIZES:
                raise input_error("model", f"no published P5en points for '{m}'", f"use one of {', '.join(PREFIX_SIZES)}")
        return models, {m: default_profile_name(m, HARDWARE) for m in models}, None
    prof = load_profile(profile)
    if model is not None and model != prof.model:
        raise input_error(
            "profile", f"'{profile}' is a profile of {prof.model}, not {model}", "give a profile of the chosen model"
        )
    if prof.model not in PREFIX_SIZES:
        raise input_error(
            "profile", f"'{profile}' is a profile of {prof.model}, which has no published P5en points",
            f"use a profile of {' or '.join(PREFIX_SIZES)}",
        )
    return [prof.model], {prof.model: str(profile)}, prof


def reproduce_rows(
    model: str | None = None,
    profile: str | Path | None = None,
    *,
    published_only: bool = False,
    include_first_turn: bool = False,
) -> list[dict[str, Any]]:
    """Published vs simulated rows for ``model`` (both published models when ``None``).

    ``profile`` is a profile name or JSON path (default: the shipped ``p5en-<model>``). With
    ``published_only`` only the published end points are returned (what ``kvplan reproduce`` prints);
    otherwise every prefix size of the sweep, with ``published_ms``/``rel_error`` ``None`` in between.
    ``include_first_turn`` averages over every turn instead of turns 2..5 (see
    :class:`~kvplan.calibration.published.Aggregation`).
    """
    models, profiles, _ = _profile_for(model, profile)
    points = published_points()
    agg = Aggregation(skip_first_turn=not include_first_turn)
    rows: list[dict[str, Any]] = []
    for m in models:
        sub = points[points["model"] == m]
        pub = {
            (str(s), int(t)): float(v)
            for s, t, v in zip(sub["series"].tolist(), sub["prompt_tokens"].tolist(), sub["value_ms"].tolist(), strict=True)
        }
        sizes = sorted(set(PREFIX_SIZES[m]) | {t for _, t in pub})
        sim = simulate_series(m, sizes, profile=profiles[m], aggregation=agg)
        for series in SERIES:
            for s in sizes:
                p = pub.get((series, s))
                if published_only and p is None:
                    continue
                v = sim.get((series, s), math.nan)
                rows.append(
                    {
                        "model": m,
                        "series": series,
                        "prompt_tokens": s,
                        "published_ms": p,
                        "simulated_ms": round(v, 3) if math.isfinite(v) else None,
                        "rel_error": round((v - p) / p, 5) if p is not None and math.isfinite(v) else None,
                    }
                )
    return rows


def ratio_checks(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per model, the ON/OFF TTFT ratio at the longest published prompt: published, simulated, error."""
    out = []
    for m in dict.fromkeys(r["model"] for r in rows):
        on = {r["prompt_tokens"]: r for r in rows if r["model"] == m and r["series"] == "ttft_on" and r["published_ms"]}
        off = {r["prompt_tokens"]: r for r in rows if r["model"] == m and r["series"] == "ttft_off" and r["published_ms"]}
        common = sorted(set(on) & set(off))
        if not common:
            continue
        t = common[-1]
        p = on[t]["published_ms"] / off[t]["published_ms"]
        s = on[t]["simulated_ms"] / off[t]["simulated_ms"]
        rel = (s - p) / p
        out.append(
            {"model": m, "prompt_tokens": t, "published": round(p, 5), "simulated": round(s, 5), "rel_error": round(rel, 5),
             "within": abs(rel) <= RATIO_TOLERANCE}
        )
    return out


def within_tolerance(row: dict[str, Any]) -> bool | None:
    """Whether a row meets its acceptance tolerance (``None`` for rows without a published value)."""
    if row["rel_error"] is None:
        return None
    return bool(abs(row["rel_error"]) <= TOLERANCE[row["series"]])
