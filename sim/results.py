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

from kvplan.sim.events import COLUMNS, DECISION_NAMES, Decision, Ev, EventChunk, col
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


def tpot_series(first_s: pd.Series, last_s: pd.Series, output_tokens: pd.Series) -> pd.Series:
    """Time per output token after the first: ``(last token - first token) / (output - 1)``.

    The definition of vLLM's ``benchmark_serving`` (``tpot = (latency - ttft) / (output_len - 1)``) and of
    the multi-turn benchmark; NaN (empty in ``turns.csv``) for 1-token outputs and unfinished turns.
    """
    steps = output_tokens.astype(float) - 1.0
    return ((last_s - first_s) / steps.where(steps > 0)).astype(float)


# raw per-turn columns gathered from one event kind each: name -> (kind, field of that kind or "t_s"/"node")
_GATHER: dict[str, tuple[Ev, str]] = {
    "arrival_s": (Ev.ARRIVE, "t_s"),
    "prompt_tokens": (Ev.ARRIVE, "prompt_tokens"),
    "output_tokens": (Ev.ARRIVE, "output_tokens"),
    "router_code": (Ev.ROUTER, "router_result"),
    "p_enq": (Ev.P_ENQUEUE, "t_s"),
    "p_node": (Ev.P_ENQUEUE, "node"),
    "decision_code": (Ev.P_DECISION, "decision"),
    "local_hit_tokens": (Ev.P_DECISION, "local_hit_tokens"),
    "pull_t0": (Ev.PULL_START, "t_s"),
    "pulled_tokens": (Ev.PULL_START, "tokens"),
    "d2p_bytes": (Ev.PULL_START, "bytes"),
    "pull_t1": (Ev.PULL_DONE, "t_s"),
    "d2p_xfer_s": (Ev.PULL_DONE, "xfer_s"),
    "p_comp": (Ev.P_COMPUTE, "t_s"),
    "p_done": (Ev.P_DONE, "t_s"),
    "prefill_s": (Ev.P_DONE, "prefill_s"),
    "d_enq": (Ev.D_ENQUEUE, "t_s"),
    "d_node": (Ev.D_ENQUEUE, "node"),
    "d_admit": (Ev.D_ADMIT, "t_s"),
    "d_hit_tokens": (Ev.D_ADMIT, "d_hit_tokens"),
    "p2d_t0": (Ev.P2D_START, "t_s"),
    "p2d_tokens": (Ev.P2D_START, "tokens"),
    "p2d_bytes": (Ev.P2D_START, "bytes"),
    "p2d_t1": (Ev.P2D_DONE, "t_s"),
    "d_first": (Ev.D_FIRST, "t_s"),
    "finish_s": (Ev.D_FINISH, "t_s"),
    "hold_t1": (Ev.P_UNHOLD, "t_s"),
    "itl_p50_s": (Ev.D_ITL, "itl_p50_s"),
    "itl_max_s": (Ev.D_ITL, "itl_max_s"),
}


def _gather(ev: EventChunk, offsets: np.ndarray) -> dict[str, np.ndarray]:
    """One row per arrived turn (sorted by conversation, turn) with the raw columns of :data:`_GATHER`."""
    key = np.asarray(offsets, dtype=np.int64)[ev.conv] + ev.turn.astype(np.int64) - 1
    arrive = ev.kind == int(Ev.ARRIVE)
    key_arr = key[arrive]
    by_key = np.argsort(key_arr, kind="stable")
    rows = key_arr[by_key]
    if len(rows) > 1 and not (rows[1:] > rows[:-1]).all():
        rows = np.unique(rows)  # a turn arrived twice (never in a model run): its rows as np.unique gives them
    n = len(rows)
    pos, inside = _rows_of(rows, key)
    out: dict[str, np.ndarray] = {"conversation_id": ev.conv[arrive][by_key]}
    out["turn"] = ev.turn[arrive][by_key].astype(np.int64)
    columns = {"t_s": ev.t_s, "node": ev.node.astype(np.float64), "a": ev.a, "b": ev.b}
    # the events of each kind, in log order: one stable sort by kind instead of a full-length mask per kind
    # (the same values land in the same rows, later events of a kind overwriting earlier ones as before)
    order = np.argsort(ev.kind, kind="stable")
    order = order[inside[order]]
    sorted_kind = ev.kind[order]
    of_kind: dict[Ev, tuple[np.ndarray, np.ndarray]] = {}

    def events_of(kind: Ev) -> tuple[np.ndarray, np.ndarray]:
        """(positions in the log, rows) of the events of ``kind``."""
        got = of_kind.get(kind)
        if got is None:
            lo, hi = np.searchsorted(sorted_kind, [int(kind), int(kind) + 1])
            idx = order[lo:hi]
            got = of_kind[kind] = (idx, pos[idx])
        return got

    for name, (kind, fname) in _GATHER.items():
        idx, at = events_of(kind)
        raw = fname if fname in ("t_s", "node") else col(kind, fname)
        v = np.full(n, np.nan)
        v[at] = columns[raw][idx]
        out[name] = v
    _, at = events_of(Ev.D_PREEMPT)
    out["d_preemptions"] = np.bincount(at, minlength=n).astype(np.float64) if n else np.zeros(0)
    return out


def _rows_of(rows: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(row of each ``key`` in the sorted unique ``rows``, whether it is one of them); the row is meaningless
    where it is not. A lookup table over the keys' span when that is small (turn keys of one chunk are a
    window of the run's), else binary search."""
    n = len(rows)
    if n and len(key):
        lo, hi = int(min(rows[0], key.min())), int(max(rows[-1], key.max()))
        if hi - lo <= 4 * len(key) + 4096:
            lut = np.full(hi - lo + 1, -1, dtype=np.int64)
            lut[rows - lo] = np.arange(n)
            pos = lut[key - lo]
            inside = pos >= 0
            return pos, inside
    pos = np.searchsorted(rows, key)
    inside = pos < n
    inside[inside] = rows[pos[inside]] == key[inside]
    return pos, inside


def turn_columns(ev: EventChunk, offsets: np.ndarray) -> pd.DataFrame:
    """Per-turn records (``turns.csv``) of the turns arriving in ``ev``, sorted by (conversation, turn).

    ``offsets`` are the plan's flat turn offsets per conversation (the key that orders the rows).
    TTFT identity: ``ttft_s = overhead_s + prefill_queue_s + kv_pull_s + prefill_s + d_queue_s +
    p2d_transfer_s + first_decode_s``. ``prefill_queue_s`` is arrival at P's engine to the start of this
    turn's prefill compute minus the D->P pull wait (vLLM's queue metric would include the pull).
    Token identity: ``prompt = local_hit + pulled + recomputed + failed`` (failed > 0 only on errors).
    ``tpot_s`` = (finish - first token) / (output - 1), empty for 1-token outputs (:func:`tpot_series`).
    ``itl_p50_s``/``itl_max_s``: median and longest gap between the turn's streamed tokens (``sim/itl.py``,
    within 0.5 %), empty without a gap.
    """
    g = _gather(ev, offsets)  # NumPy columns: the arithmetic below is pandas' (NaN-propagating) on arrays

    def zero_nan(x: np.ndarray) -> np.ndarray:
        return np.where(np.isnan(x), 0.0, x)

    def as_int(name: str, x: np.ndarray) -> np.ndarray:
        if np.isnan(x).any():  # what pandas' astype refused
            raise ValueError(f"turn column {name} has missing values")
        return x.astype(np.int64)

    err = g["decision_code"] == int(Decision.ERROR)
    for c in (
        "pulled_tokens", "d2p_bytes", "p2d_bytes", "p2d_tokens", "d_hit_tokens", "local_hit_tokens", "d_preemptions",
    ):
        g[c] = zero_nan(g[c])
    g["kv_pull_s"] = zero_nan(g["pull_t1"] - g["pull_t0"])
    g["prefill_queue_s"] = g["p_comp"] - g["p_enq"] - g["kv_pull_s"]
    g["overhead_s"] = (g["p_enq"] - g["arrival_s"]) + (g["d_enq"] - g["p_done"])
    g["d_queue_s"] = g["d_admit"] - g["d_enq"]
    g["p2d_transfer_s"] = zero_nan(g["p2d_t1"] - g["p2d_t0"])
    ready = np.where(np.isnan(g["p2d_t1"]), g["d_admit"], g["p2d_t1"])
    g["first_decode_s"] = g["d_first"] - ready
    g["ttft_s"] = g["d_first"] - g["arrival_s"]
    g["p_leg_s"] = g["p_done"] - g["arrival_s"]
    g["p_hold_s"] = zero_nan(g["hold_t1"] - g["p_done"])
    steps = g["output_tokens"] - 1.0  # tpot_series on arrays
    g["tpot_s"] = (g["finish_s"] - g["d_first"]) / np.where(steps > 0, steps, np.nan)
    local = g["local_hit_tokens"]
    g["failed_tokens"] = np.where(err, g["prompt_tokens"] - local, 0.0)
    g["recomputed_tokens"] = np.where(err, 0.0, g["prompt_tokens"] - local - g["pulled_tokens"])
    for c in (
        "prompt_tokens", "output_tokens", "local_hit_tokens", "pulled_tokens", "recomputed_tokens", "failed_tokens",
        "d_hit_tokens", "p2d_tokens", "d2p_bytes", "p2d_bytes", "d_preemptions",
    ):
        g[c] = as_int(c, g[c])
    g["d_node"] = np.where(np.isnan(g["d_node"]), -1.0, g["d_node"]).astype(np.int64)
    g["p_node"] = np.where(np.isnan(g["p_node"]), -1.0, g["p_node"]).astype(np.int64)
    g["conversation_id"] = g["conversation_id"].astype(np.int64)
    names = {int(k): v for k, v in DECISION_NAMES.items()}
    if not len(g["turn"]):  # no turn: the frame (and its dtypes) as pandas maps an empty column
        df = pd.DataFrame({c: g[c] for c in TURN_COLUMNS if c not in ("decision", "router")})
        df["decision"] = pd.Series(g["decision_code"]).map(names)
        df["router"] = pd.Series(g["router_code"]).map(ROUTER_NAMES)
        return df[TURN_COLUMNS]
    cols: dict[str, Any] = {**g, "decision": _names(g["decision_code"], names),
                            "router": _names(g["router_code"], ROUTER_NAMES)}
    return pd.DataFrame({c: cols[c] for c in TURN_COLUMNS})  # built in column order: no reindexing copy


def _names(codes: np.ndarray, names: dict[int, str]) -> pd.Series:
    """``pd.Series(codes).map(names)`` (NaN where a code has no name) by one comparison per name."""
    out = np.full(len(codes), np.nan, dtype=object)
    for code, name in names.items():
        out[codes == code] = name
    return pd.Series(out)


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
    "ResultDirWriter",
    "json_safe",
    "result_file_names",
    "summary_json_bytes",
    "turns_arrow_schema",
    "turns_csv_bytes",
    "write_result_dir",
]
