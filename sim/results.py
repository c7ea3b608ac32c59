"""Everything a run reports, derived from its event log (pure functions of it), and the writers.

``turns`` has one row per turn; ``summary`` the headline metrics; ``pinned_series`` the retained decode
KV over time. Writers use a fixed column order and float format and write atomically (temp + rename),
so the same scenario and seed give byte-identical files and a killed run never leaves a complete-looking
result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from kvplan.sim.events import COLUMNS, DECISION_NAMES, EventChunk
from kvplan.sim.quantiles import ALPHA
from kvplan.sim.result_files import (  # the result files; writers re-exported (see __all__)
    FLOAT_FORMAT,
    GIB,
    RELEASE_NAMES,
    ROUTER_NAMES,
    TURN_COLUMNS,
    ResultDirWriter,
    json_safe,
    result_file_names,
    summary_json_bytes,
    turns_arrow_schema,
    turns_csv_bytes,
    write_result_dir,
)
from kvplan.sim.scenario import Scenario
from kvplan.sim.stream import RunStream
from kvplan.sim.summary import Summary


def events_frame(ev: EventChunk) -> pd.DataFrame:
    """The event log as a frame with columns ``t_s, kind, conv, turn, node, a, b`` (integer columns as int64)."""
    ints = ("kind", "conv", "turn", "node")
    # the columns converted before the frame is built (one array each, no block consolidation and re-cast),
    # and the float columns taken over from the chunk rather than copied (the run's log is not used again)
    return pd.DataFrame({c: np.asarray(v, dtype=np.int64) if c in ints else np.asarray(v)
                         for c, v in zip(COLUMNS, ev, strict=True)}, copy=False)


def pinned_frame(t: np.ndarray, tokens: np.ndarray, bytes_per_token: int) -> pd.DataFrame:
    """Retained (pinned) decode KV over time, summed over every decode node and GPU.

    Step-function samples ``t_s, pinned_tokens, pinned_gib`` after each change (releases before pins at
    equal times), from the change points :class:`~kvplan.sim.stream.RunStream` accumulates.
    """
    out = pd.DataFrame({"t_s": t, "pinned_tokens": tokens})
    out["pinned_gib"] = out["pinned_tokens"] * bytes_per_token / GIB
    return out


def held_frame(t: np.ndarray, held_bytes: np.ndarray, tokens_per_byte: float) -> pd.DataFrame:
    """KV P holds for D's reads (under lease) over time, summed over prefill nodes and GPUs.

    Step-function samples ``t_s, held_tokens, held_gib`` after each change (releases before holds at
    equal times); tokens from bytes at the run's mean tokens per held byte.
    """
    out = pd.DataFrame({"t_s": t, "held_tokens": np.rint(held_bytes * tokens_per_byte)})
    out["held_gib"] = held_bytes / GIB
    return out


def _time_weighted_mean(t: np.ndarray, v: np.ndarray, t_end: float) -> float:
    if not len(t) or t_end <= 0:
        return 0.0
    dt = np.diff(np.append(t, max(t_end, t[-1])))
    return float((v * dt).sum() / t_end)


SeriesStats = Callable[[float], dict[str, float]]


def summarize(stream: RunStream, series_stats: SeriesStats, extra: dict[str, Any]) -> Summary:
    """Headline metrics (``summary.json``) from a finished run's streaming aggregates. See the README.

    Counts and token sums are exact. Up to :data:`~kvplan.sim.quantiles.EXACT_PERCENTILE_MAX_TURNS` planned
    turns, means and percentiles are computed over the kept columns in the rows' order, so they equal the
    one-shot computation over ``turns.csv`` (``percentile_method: exact``); above it, means come from exact
    counts and sums and percentiles from a mergeable quantile sketch within ``percentile_relative_error``
    (``percentile_method: sketch``, :mod:`kvplan.sim.quantiles`). ``series_stats(t_end)`` gives
    the pinned/held metrics; it is called once the turn columns a streamed run no longer needs are freed.
    """
    agg = stream.agg
    cols = agg.cols
    t_end = stream.t_max if np.isfinite(stream.t_max) else 0.0
    n_turns = stream.counts["turns"]
    decisions = {name: int(agg.decisions.get(name, 0)) for name in DECISION_NAMES.values()}
    c = stream.counts
    ttft, tpot = cols["ttft"], cols["tpot"]
    metrics: dict[str, Any] = {
        "turns": int(n_turns),
        "conversations": int(c["conversations"]),
        "errors": int(decisions["error"]),
        "ttft_mean_s": ttft.mean(float("nan")),
        "ttft_p50_s": ttft.percentile(50),
        "ttft_p90_s": ttft.percentile(90),
        "ttft_p99_s": ttft.percentile(99),
        "hit_rate": float(agg.reused / agg.follow_up) if agg.follow_up else 0.0,
        "reuse_rate": float(agg.reused_kv / agg.follow_up) if agg.follow_up else 0.0,
        "pull_rate": float(decisions["pull"] / n_turns) if n_turns else 0.0,
        "follow_up_turns": int(agg.follow_up),
        "decisions": decisions,
        **{k: int(agg.sums.get(k, 0)) for k in agg.SUM_COLS},
        "kv_pull_mean_s": cols["kv_pull"].mean(0.0),
        "d2p_xfer_mean_s": cols["d2p_xfer"].mean(0.0),
        "p_leg_mean_s": cols["p_leg"].mean(float("nan")),
        "prefill_queue_mean_s": cols["prefill_queue"].mean(float("nan")),
        "pins": int(c["pins"]),
        "releases": {RELEASE_NAMES[k]: int(n) for k, n in stream.releases.items()},
        "pins_outstanding": int(c["pins"] - c["unpins"]),
        "sim_end_s": t_end,
        "d_preemptions": int(c["d_preemptions"]),
        "d_preempted_recompute_tokens": int(stream.d_recompute_tokens),
        "p_lease_expiries": int(c["p_lease_expiries"]),
        "p2d_failed_reads": int(c["p2d_failed_reads"]),
        "tpot_mean_s": tpot.mean(float("nan")),
        "tpot_p50_s": tpot.percentile(50),
        "tpot_p90_s": tpot.percentile(90),
        "itl_p50_s": stream.itl.percentile(50),
        "itl_p90_s": stream.itl.percentile(90),
        "itl_p99_s": stream.itl.percentile(99),
        "percentile_method": "exact" if agg.exact else "sketch",
        "percentile_relative_error": 0.0 if agg.exact else ALPHA,
    }
    if not stream.keep_turns:
        agg.drop_summary_columns()  # a streamed run's peak memory is here: free what is no longer needed
    metrics.update(series_stats(t_end))
    return Summary(**metrics, run=dict(extra))


def stream_pinned(stream: RunStream, bytes_per_token: int) -> pd.DataFrame:
    """The pinned series of a finished stream (its change points consumed; the frame wraps one array, no copy)."""
    arr = np.empty((len(stream.pinned), 3), order="F")  # t_s, pinned_tokens, pinned_gib
    _, tokens = stream.pinned.steps(arr)
    gib = arr[:, 2]
    np.multiply(tokens, bytes_per_token, out=gib)
    gib /= GIB  # = pinned_frame's tokens * bytes_per_token / GIB, bit for bit
    return pd.DataFrame(arr, columns=["t_s", "pinned_tokens", "pinned_gib"], copy=False)


def stream_held(stream: RunStream) -> pd.DataFrame:
    """The held series of a finished stream."""
    t, held = stream.held.steps()
    ratio = stream.unhold_tokens / stream.unhold_bytes if stream.unhold_bytes > 0 else 0.0
    return held_frame(t, held, ratio)


@dataclass
class Result:
    """What ``run`` returns: the scenario, the event log (kept runs) and everything derived from it.

    ``events`` and ``turns`` are empty frames for a streamed run (``run(..., keep=False)``), whose turns
    went to the sink as the run went.
    """

    scenario: Scenario
    seed: int
    events: pd.DataFrame
    turns: pd.DataFrame
    summary: dict[str, Any]
    bytes_per_token_all_ranks: int
    notes: list[str] = field(default_factory=list)
    pinned: pd.DataFrame | None = None
    stats: Summary | None = None  # the typed summary (``summary`` is its ``to_dict()``, the summary.json content)
    held: pd.DataFrame | None = None

    def pinned_series(self) -> pd.DataFrame:
        """Retained decode KV over time (GiB summed over decode nodes and GPUs)."""
        return self.pinned if self.pinned is not None else pinned_frame(np.zeros(0), np.zeros(0), 1)

    def held_series(self) -> pd.DataFrame:
        """KV P holds under lease for D's reads over time (GiB summed over prefill nodes and GPUs)."""
        return self.held if self.held is not None else held_frame(np.zeros(0), np.zeros(0), 0.0)

    def with_run_context(self, more: dict[str, Any]) -> Result:
        """The same result with more run-context keys in its summary (e.g. ``health``, computed from it)."""
        import dataclasses

        if self.stats is None:
            return dataclasses.replace(self, summary={**self.summary, **more})
        stats = dataclasses.replace(self.stats, run={**self.stats.run, **more})
        return dataclasses.replace(self, summary=stats.to_dict(), stats=stats)


def build_result(
    scenario: Scenario, seed: int, stream: RunStream, events: EventChunk | None, bytes_all_ranks: int,
    extra: dict[str, Any], notes: list[str],
) -> Result:
    """Turns, summary and pinned series of a finished (streamed) run."""
    frames: dict[str, pd.DataFrame] = {}

    def series_stats(t_end: float) -> dict[str, float]:
        if stream.keep_turns:
            held = frames["held"] = stream_held(stream)
            ht, hg = held["t_s"].to_numpy(), held["held_gib"].to_numpy()
        elif stream.held_stats is not None:  # a large streamed run: folded in as the run went
            ht = hg = np.zeros(0)
        else:  # the held series itself is not kept for a streamed run: its statistics only, before pinned's frame
            ht, hg = stream.held.steps()
            hg /= GIB
        if stream.held_stats is not None:
            held_mean, held_peak = stream.held_stats.mean_peak(t_end)
        else:
            held_mean, held_peak = _time_weighted_mean(ht, hg, t_end), float(hg.max()) if len(hg) else 0.0
        del ht, hg
        pinned = frames["pinned"] = stream_pinned(stream, bytes_all_ranks)
        t, gib = pinned["t_s"].to_numpy(), pinned["pinned_gib"].to_numpy()
        return {"pinned_kv_gib_mean": _time_weighted_mean(t, gib, t_end),
                "pinned_kv_gib_peak": float(gib.max()) if len(gib) else 0.0,
                "p_held_kv_gib_mean": held_mean, "p_held_kv_gib_peak": held_peak}

    stats = summarize(stream, series_stats, extra)
    ev = events_frame(events if events is not None else EventChunk.empty())
    turns = stream.turns()
    return Result(scenario, seed, ev, turns, stats.to_dict(), bytes_all_ranks, notes, frames["pinned"], stats,
                  frames.get("held"))


#: Re-exported from :mod:`kvplan.sim.result_files`: callers import the writers from here.
__all__ = [
    "FLOAT_FORMAT",
    "ROUTER_NAMES",
    "TURN_COLUMNS",
    "ResultDirWriter",
    "json_safe",
    "result_file_names",
    "summary_json_bytes",
    "turns_arrow_schema",
    "turns_csv_bytes",
    "write_result_dir",
]
