"""The published P5en points, the benchmark's simulated series and their closed-form surrogate.

The method is described in :mod:`kvplan.calibration.published`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kvplan.errors import input_error
from kvplan.models.arch import (
    get_model,
    kv_bytes_per_token_per_rank,
)
from kvplan.models.costs import CostModel
from kvplan.sim.defaults import published_benchmark
from kvplan.sim.engine import simulate
from kvplan.sim.events import Decision, Ev
from kvplan.sim.scenario import Scenario, scenario_from_dict

MS_PER_S = 1000.0

#: The published series and their acceptance tolerances (relative).
SERIES = ("ttft_off", "ttft_on", "prefill_off", "prefill_on", "kv_transfer_on")
TOLERANCE = {"ttft_off": 0.07, "ttft_on": 0.07, "prefill_off": 0.15, "prefill_on": 0.15, "kv_transfer_on": 0.15}
#: Tolerance of the ON/OFF TTFT ratio at the longest published prompt.
RATIO_TOLERANCE = 0.10
#: Noise assumed for each published point: half its acceptance tolerance (the band is +-2 sigma).
SIGMA_PER_TOLERANCE = 0.5
#: A fitted parameter counts as identified by the data when its posterior spread is below this fraction of
#: its prior spread.
IDENTIFIED_SHRINK = 0.5
#: A log-parameter within this distance of a bound (1 %) counts as on the bound (its standard error is not
#: meaningful there).
AT_BOUND_LOG = 0.01

#: Model ids of the write-up -> kvplan model presets.
MODEL_BY_HF_ID = {"Qwen/Qwen3-32B": "qwen3-32b", "zai-org/GLM-5-FP8": "glm-5-fp8"}
#: Prefix sizes the write-up's reproduction scripts swept (GLM-5-FP8 up to 20000).
PREFIX_SIZES = {
    "qwen3-32b": (2000, 4000, 8000, 12000, 16000, 20000, 24000),
    "glm-5-fp8": (2000, 4000, 8000, 12000, 16000, 20000),
}
HARDWARE = "p5en"
TENSOR_PARALLEL = 8
VLLM_VERSION = "0.29.0"
NIXL_VERSION = "1.4.1"


# --- published points -------------------------------------------------------------------------------------


def published_points(path: str | None = None) -> pd.DataFrame:
    """The published points as a frame (``model`` = kvplan preset name, ``hf_id``, ``series``,
    ``prompt_tokens``, ``value_ms``, ``note``), from ``path`` or the embedded copy."""
    import tempfile
    from pathlib import Path

    from kvplan.calibration.parsers import parse_published_csv
    from kvplan.calibration.published_data import PUBLISHED_CSV

    if path is None:
        with tempfile.TemporaryDirectory() as tmp:
            p = Path(tmp) / "p5en_published.csv"
            p.write_text(PUBLISHED_CSV, encoding="utf-8")
            frame = parse_published_csv(p)
    else:
        frame = parse_published_csv(path)
    unknown = sorted(set(frame["model"]) - set(MODEL_BY_HF_ID))
    if unknown:
        raise input_error(
            str(path), f"model '{unknown[0]}' has no kvplan preset", f"use one of {', '.join(MODEL_BY_HF_ID)}"
        )
    frame = frame.rename(columns={"model": "hf_id"})
    frame.insert(0, "model", frame["hf_id"].map(MODEL_BY_HF_ID))
    return frame


# --- simulated series ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Aggregation:
    """How the published series are computed from simulated turns.

    ``skip_first_turn``: leave the first user turn of each conversation out, as the multi-turn
    benchmark's ``--warmup-step`` does (see the module docstring for why this is the default).
    """

    skip_first_turn: bool = True

    def describe(self) -> str:
        """One line for reports and profile notes."""
        which = "turns 2..5 (first turn = --warmup-step warm-up, not measured)" if self.skip_first_turn else "all turns"
        return (
            f"series over {which}: ttft = mean ttft_s, prefill = mean p_leg_s (arrival to P done), "
            "kv_transfer_on = mean d2p_xfer_s over D->P pulls"
        )


def series_from_turns(turns: pd.DataFrame, bidirectional: bool, aggregation: Aggregation) -> dict[str, float]:
    """The published series (ms) of one simulated run from its ``turns`` frame (``run().turns``)."""
    sel = turns[turns["turn"] >= 2] if aggregation.skip_first_turn else turns
    ok = sel[sel["decision"] != "error"]
    suffix = "on" if bidirectional else "off"
    out = {
        f"ttft_{suffix}": float(ok["ttft_s"].mean()) * MS_PER_S,
        f"prefill_{suffix}": float(ok["p_leg_s"].mean()) * MS_PER_S,
    }
    if bidirectional:
        pulls = ok[ok["decision"] == "pull"]
        out["kv_transfer_on"] = float(pulls["d2p_xfer_s"].mean()) * MS_PER_S if len(pulls) else math.nan
    return out


def series_fast(scenario: Scenario, aggregation: Aggregation) -> dict[str, float]:
    """:func:`series_from_turns` without building the frames: the same simulation, read from its event log.

    About ten times faster than ``run()`` (which derives every per-turn column); used inside the optimiser.
    """
    _, _, ctx = simulate(scenario)
    arrive: dict[tuple[int, int], float] = {}
    p_done: dict[tuple[int, int], float] = {}
    first: dict[tuple[int, int], float] = {}
    xfer: dict[tuple[int, int], float] = {}
    errors: set[tuple[int, int]] = set()
    pull_kind = int(Decision.PULL)
    error_kind = int(Decision.ERROR)
    pulls: set[tuple[int, int]] = set()
    for t, kind, conv, turn, _node, a, _b in ctx.log:
        key = (conv, turn)
        if kind == Ev.ARRIVE:
            arrive[key] = t
        elif kind == Ev.P_DONE:
            p_done[key] = t
        elif kind == Ev.D_FIRST:
            first[key] = t
        elif kind == Ev.PULL_DONE:
            xfer[key] = a
        elif kind == Ev.P_DECISION:
            if a == pull_kind:
                pulls.add(key)
            elif a == error_kind:
                errors.add(key)
    keys = [k for k in arrive if (k[1] >= 2 or not aggregation.skip_first_turn) and k not in errors]
    suffix = "on" if scenario.policy.bidirectional else "off"
    ttft = [first[k] - arrive[k] for k in keys if k in first]
    pleg = [p_done[k] - arrive[k] for k in keys if k in p_done]
    out = {
        f"ttft_{suffix}": float(np.mean(ttft)) * MS_PER_S if ttft else math.nan,
        f"prefill_{suffix}": float(np.mean(pleg)) * MS_PER_S if pleg else math.nan,
    }
    if scenario.policy.bidirectional:
        xs = [xfer[k] for k in keys if k in pulls and k in xfer]
        out["kv_transfer_on"] = float(np.mean(xs)) * MS_PER_S if xs else math.nan
    return out


def benchmark_scenario(
    model: str, prefix_tokens: int, bidirectional: bool, *, costs: CostModel | None = None, profile: str | None = None
) -> Scenario:
    """The published benchmark at one prefix size, with inline ``costs`` or a ``profile`` (name or path)."""
    base = published_benchmark(model, prefix_tokens, bidirectional).model_dump(mode="python", exclude_none=True)
    if costs is not None:
        base["costs"] = costs.model_dump(mode="python")
    if profile is not None:
        base["profile"] = str(profile)
    return scenario_from_dict(base, where="published benchmark")


def simulate_series(
    model: str,
    prefix_sizes: Sequence[int],
    *,
    costs: CostModel | None = None,
    profile: str | None = None,
    aggregation: Aggregation | None = None,
    fast: bool = False,
) -> dict[tuple[str, int], float]:
    """Every published series at each prefix size: ``{(series, prefix_tokens): ms}``.

    ``fast=False`` goes through the public ``kvplan.sim.api.run`` (what ``kvplan reproduce`` reports);
    ``fast=True`` uses :func:`series_fast` (identical numbers, for the optimiser).
    """
    from kvplan.sim.api import run

    agg = aggregation or Aggregation()
    out: dict[tuple[str, int], float] = {}
    for s in prefix_sizes:
        for bidirectional in (True, False):
            sc = benchmark_scenario(model, s, bidirectional, costs=costs, profile=profile)
            series = series_fast(sc, agg) if fast else series_from_turns(run(sc).turns, bidirectional, agg)
            for name, value in series.items():
                out[(name, s)] = value
    return out


# --- closed-form surrogate (stage 1 of the fit) ------------------------------------------------------------

BENCH_TURNS = 5
BENCH_USER_TOKENS = 150
BENCH_OUTPUT_TOKENS = 300


def surrogate_series(
    model: str, prefix_sizes: Sequence[int], costs: CostModel, aggregation: Aggregation | None = None
) -> dict[tuple[str, int], float]:
    """The published series of the benchmark in closed form, each request alone on idle engines.

    Uses the pure cost functions of :mod:`kvplan.models.costs` along the benchmark's turns (prompt of
    user turn k = prefix + 150 k + 300 (k - 1); D keeps the previous context as prefix cache, so its
    P->D pull is the new tail; ON pulls the previous context back to P and recomputes the rest) and adds
    half a decode step to the D leg for the step in progress on a busy D. It ignores the two clients'
    contention, so it is only the starting point of the simulation-based fit (smooth and fast).
    """
    from kvplan.models.arch import descriptors_per_transfer, full_blocks_tokens
    from kvplan.models.costs import decode_step_time_s, prefill_time_s, transfer_time_s, xfer_time_s

    agg = aggregation or Aggregation()
    arch = get_model(model)
    bpt = kv_bytes_per_token_per_rank(arch, TENSOR_PARALLEL)
    chunk = published_benchmark(model).deployment.max_num_batched_tokens
    c = costs
    out: dict[tuple[str, int], float] = {}

    def pull_s(tokens: int) -> float:
        return transfer_time_s(c.transfer, tokens * bpt, descriptors_per_transfer(arch, tokens))

    for s in prefix_sizes:
        first = 2 if agg.skip_first_turn else 1
        acc: dict[str, list[float]] = {k: [] for k in SERIES}
        for k in range(first, BENCH_TURNS + 1):
            prompt = s + BENCH_USER_TOKENS * k + BENCH_OUTPUT_TOKENS * (k - 1)
            step = decode_step_time_s(c.decode, 2, 2 * prompt)
            if k == 1:
                d_tail = prompt
            else:
                prev = prompt - BENCH_USER_TOKENS - BENCH_OUTPUT_TOKENS
                d_tail = prompt - full_blocks_tokens(prev + BENCH_OUTPUT_TOKENS - 1, arch.block_size_tokens)
            d_leg = c.overhead.d_leg_s + pull_s(d_tail) + 1.5 * step
            off = c.overhead.p_leg_s + prefill_time_s(c.prefill, prompt, 0, chunk)
            acc["prefill_off"].append(off)
            acc["ttft_off"].append(off + d_leg)
            if k == 1:
                on = off
            else:
                prev_ctx = prompt - BENCH_USER_TOKENS - 1  # previous prompt + output - 1 (last token has no KV)
                pulled = min(prev_ctx, prompt - 1)
                on = c.overhead.p_leg_s + pull_s(pulled) + prefill_time_s(c.prefill, prompt - pulled, pulled, chunk)
                acc["kv_transfer_on"].append(
                    xfer_time_s(c.transfer, pulled * bpt, descriptors_per_transfer(arch, pulled))
                )
            acc["prefill_on"].append(on)
            acc["ttft_on"].append(on + d_leg)
        for name, vals in acc.items():
            if vals:
                out[(name, s)] = float(np.mean(vals)) * MS_PER_S
    return out


# --- published vs simulated, point by point -------------------------------------------------------------------


def _targets(points: pd.DataFrame, model: str) -> tuple[list[tuple[str, int]], dict[tuple[str, int], float]]:
    sub = points[points["model"] == model]
    if sub.empty:
        present = ", ".join(sorted(set(points["model"])))
        raise input_error("published points", f"no point for model {model}", f"models present: {present}")
    pub = {
        (str(series), int(tokens)): float(value)
        for series, tokens, value in zip(
            sub["series"].tolist(), sub["prompt_tokens"].tolist(), sub["value_ms"].tolist(), strict=True
        )
    }
    return sorted(pub, key=lambda k: (SERIES.index(k[0]), k[1])), pub


def _ratio_keys(pub: Mapping[tuple[str, int], float]) -> tuple[tuple[str, int], tuple[str, int]] | None:
    common = sorted({s for (n, s) in pub if n == "ttft_on"} & {s for (n, s) in pub if n == "ttft_off"})
    if not common:
        return None
    return ("ttft_on", common[-1]), ("ttft_off", common[-1])


def point_rows(
    model: str, pub: Mapping[tuple[str, int], float], sim: Mapping[tuple[str, int], float]
) -> list[dict[str, Any]]:
    """Per published point: ``series, prompt_tokens, published_ms, simulated_ms, rel_error, tolerance, within``."""
    rows = []
    for key in sorted(pub, key=lambda k: (SERIES.index(k[0]), k[1])):
        p, s = pub[key], sim.get(key, math.nan)
        rel = (s - p) / p
        rows.append(
            {
                "model": model,
                "series": key[0],
                "prompt_tokens": key[1],
                "published_ms": p,
                "simulated_ms": round(s, 3),
                "rel_error": round(rel, 5),
                "tolerance": TOLERANCE[key[0]],
                "within": bool(abs(rel) <= TOLERANCE[key[0]]),
            }
        )
    return rows


def d_leg_rows(
    pub: Mapping[tuple[str, int], float], sim: Mapping[tuple[str, int], float]
) -> list[dict[str, Any]]:
    """TTFT minus prefill duration (the D leg: P->D tail transfer + first step + proxy) published vs simulated.

    The published differences are aggregates of different logs; a negative one (TTFT below the P leg) cannot
    be reproduced by any model in which D starts after P.
    """
    rows = []
    for mode in ("on", "off"):
        for s in sorted({t for (n, t) in pub if n == f"ttft_{mode}"}):
            t_key, p_key = (f"ttft_{mode}", s), (f"prefill_{mode}", s)
            if p_key in pub and t_key in sim and p_key in sim:
                rows.append(
                    {
                        "mode": mode,
                        "prompt_tokens": s,
                        "published_ms": pub[t_key] - pub[p_key],
                        "simulated_ms": round(sim[t_key] - sim[p_key], 3),
                    }
                )
    return rows


def ratio_row(pub: Mapping[tuple[str, int], float], sim: Mapping[tuple[str, int], float]) -> dict[str, Any] | None:
    """The ON/OFF TTFT ratio at the longest prompt: published, simulated, relative error, within tolerance."""
    keys = _ratio_keys(pub)
    if keys is None:
        return None
    on, off = keys
    p = pub[on] / pub[off]
    s = sim[on] / sim[off]
    rel = (s - p) / p
    return {
        "prompt_tokens": on[1],
        "published": round(p, 5),
        "simulated": round(s, 5),
        "rel_error": round(rel, 5),
        "tolerance": RATIO_TOLERANCE,
        "within": bool(abs(rel) <= RATIO_TOLERANCE),
    }
