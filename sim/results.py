"""Everything a run reports, derived from its event log (pure functions of it), and the writers.

``turns`` has one row per turn; ``summary`` the headline metrics; ``pinned_series`` the retained decode
KV over time. Writers use a fixed column order and float format and write atomically (temp + rename),
so the same scenario and seed give byte-identical files and a killed run never leaves a complete-looking
result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from kvplan.atomic import check_result_dir, write_result_dir_files
from kvplan.sim.events import COLUMNS, DECISION_NAMES, Decision, Ev, HoldRelease, Release, RouterResult
from kvplan.sim.scenario import Scenario

GIB = 1024**3
ROUTER_NAMES = {int(v): v.name.lower() for v in RouterResult}
RELEASE_NAMES = {int(v): v.name.lower() for v in Release}

TURN_COLUMNS = [
    "conversation_id",
    "turn",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "p_node",
    "d_node",
    "router",
    "decision",
    "local_hit_tokens",
    "pulled_tokens",
    "recomputed_tokens",
    "failed_tokens",
    "d_hit_tokens",
    "p2d_tokens",
    "overhead_s",
    "prefill_queue_s",
    "kv_pull_s",
    "prefill_s",
    "d_queue_s",
    "p2d_transfer_s",
    "first_decode_s",
    "ttft_s",
    "p_leg_s",
    "d2p_xfer_s",
    "finish_s",
    "d2p_bytes",
    "p2d_bytes",
    "d_preemptions",
    "p_hold_s",
    "tpot_s",
]


def events_frame(log: list[tuple[Any, ...]]) -> pd.DataFrame:
    """The event log as a frame with columns ``t_s, kind, conv, turn, node, a, b`` (kind as int)."""
    if not log:
        return pd.DataFrame({c: pd.Series(dtype=float) for c in COLUMNS})
    arr = np.array(log, dtype=float)
    df = pd.DataFrame(arr, columns=list(COLUMNS))
    for c in ("kind", "conv", "turn", "node"):
        df[c] = df[c].astype(np.int64)
    return df


def _by_turn(ev: pd.DataFrame, kind: Ev, cols: dict[str, str]) -> pd.DataFrame:
    sub = ev[ev["kind"] == int(kind)]
    out = sub[["conv", "turn", *cols.keys()]].rename(columns=cols)
    return out.set_index(["conv", "turn"])


def tpot_series(first_s: pd.Series, last_s: pd.Series, output_tokens: pd.Series) -> pd.Series:
    """Time per output token after the first: ``(last token - first token) / (output - 1)``.

    The definition of vLLM's ``benchmark_serving`` (``tpot = (latency - ttft) / (output_len - 1)``) and of
    the multi-turn benchmark; NaN (empty in ``turns.csv``) for 1-token outputs and unfinished turns.
    """
    steps = output_tokens.astype(float) - 1.0
    return ((last_s - first_s) / steps.where(steps > 0)).astype(float)


def turns_frame(ev: pd.DataFrame) -> pd.DataFrame:
    """Per-turn records (``turns.csv``), one row per turn that arrived, sorted by (conversation, turn).

    TTFT identity: ``ttft_s = overhead_s + prefill_queue_s + kv_pull_s + prefill_s + d_queue_s +
    p2d_transfer_s + first_decode_s``. ``prefill_queue_s`` is arrival at P's engine to the start of this
    turn's prefill compute minus the D->P pull wait (vLLM's queue metric would include the pull).
    Token identity: ``prompt = local_hit + pulled + recomputed + failed`` (failed > 0 only on errors).
    ``tpot_s`` = (finish - first token) / (output - 1), empty for 1-token outputs (:func:`tpot_series`).
    """
    base = _by_turn(ev, Ev.ARRIVE, {"t_s": "arrival_s", "a": "prompt_tokens", "b": "output_tokens"})
    parts = [
        _by_turn(ev, Ev.ROUTER, {"a": "router_code"}),
        _by_turn(ev, Ev.P_ENQUEUE, {"t_s": "p_enq", "node": "p_node"}),
        _by_turn(ev, Ev.P_DECISION, {"a": "decision_code", "b": "local_hit_tokens"}),
        _by_turn(ev, Ev.PULL_START, {"t_s": "pull_t0", "a": "pulled_tokens", "b": "d2p_bytes"}),
        _by_turn(ev, Ev.PULL_DONE, {"t_s": "pull_t1", "a": "d2p_xfer_s"}),
        _by_turn(ev, Ev.P_COMPUTE, {"t_s": "p_comp"}),
        _by_turn(ev, Ev.P_DONE, {"t_s": "p_done", "a": "prefill_s"}),
        _by_turn(ev, Ev.D_ENQUEUE, {"t_s": "d_enq", "node": "d_node"}),
        _by_turn(ev, Ev.D_ADMIT, {"t_s": "d_admit", "a": "d_hit_tokens"}),
        _by_turn(ev, Ev.P2D_START, {"t_s": "p2d_t0", "a": "p2d_tokens", "b": "p2d_bytes"}),
        _by_turn(ev, Ev.P2D_DONE, {"t_s": "p2d_t1"}),
        _by_turn(ev, Ev.D_FIRST, {"t_s": "d_first"}),
        _by_turn(ev, Ev.D_FINISH, {"t_s": "finish_s"}),
        _by_turn(ev, Ev.P_UNHOLD, {"t_s": "hold_t1"}),
    ]
    pre_ev = ev[ev["kind"] == int(Ev.D_PREEMPT)]
    if len(pre_ev):
        parts.append(pre_ev.groupby(["conv", "turn"]).size().rename("d_preemptions").to_frame())
    df = base.join(list[pd.DataFrame | pd.Series](parts), how="left").sort_index().reset_index()
    df = df.rename(columns={"conv": "conversation_id"})
    if "d_preemptions" not in df:
        df["d_preemptions"] = 0.0
    err = df["decision_code"] == int(Decision.ERROR)
    for c in (
        "pulled_tokens", "d2p_bytes", "p2d_bytes", "p2d_tokens", "d_hit_tokens", "local_hit_tokens", "d_preemptions",
    ):
        df[c] = df[c].fillna(0.0)
    df["kv_pull_s"] = (df["pull_t1"] - df["pull_t0"]).fillna(0.0)
    df["prefill_queue_s"] = df["p_comp"] - df["p_enq"] - df["kv_pull_s"]
    df["overhead_s"] = (df["p_enq"] - df["arrival_s"]) + (df["d_enq"] - df["p_done"])
    df["d_queue_s"] = df["d_admit"] - df["d_enq"]
    df["p2d_transfer_s"] = (df["p2d_t1"] - df["p2d_t0"]).fillna(0.0)
    ready = df["p2d_t1"].fillna(df["d_admit"])
    df["first_decode_s"] = df["d_first"] - ready
    df["ttft_s"] = df["d_first"] - df["arrival_s"]
    df["p_leg_s"] = df["p_done"] - df["arrival_s"]
    df["p_hold_s"] = (df["hold_t1"] - df["p_done"]).fillna(0.0)
    df["tpot_s"] = tpot_series(df["d_first"], df["finish_s"], df["output_tokens"])
    local = df["local_hit_tokens"]
    df["failed_tokens"] = np.where(err, df["prompt_tokens"] - local, 0.0)
    df["recomputed_tokens"] = np.where(err, 0.0, df["prompt_tokens"] - local - df["pulled_tokens"])
    names = {int(k): v for k, v in DECISION_NAMES.items()}
    df["decision"] = df["decision_code"].map(names)
    df["router"] = df["router_code"].map(ROUTER_NAMES)
    for c in (
        "prompt_tokens", "output_tokens", "local_hit_tokens", "pulled_tokens", "recomputed_tokens", "failed_tokens",
        "d_hit_tokens", "p2d_tokens", "d2p_bytes", "p2d_bytes", "d_preemptions",
    ):
        df[c] = df[c].astype(np.int64)
    df["d_node"] = df["d_node"].fillna(-1).astype(np.int64)
    df["p_node"] = df["p_node"].fillna(-1).astype(np.int64)
    return df[TURN_COLUMNS]


def pinned_series(ev: pd.DataFrame, bytes_per_token: int) -> pd.DataFrame:
    """Retained (pinned) decode KV over time, summed over every decode node and GPU.

    Returns step-function samples ``t_s, pinned_tokens, pinned_gib`` after each change (releases before
    pins at equal times).
    """
    pin = ev[ev["kind"] == int(Ev.PIN)][["t_s", "a"]]
    unpin = ev[ev["kind"] == int(Ev.UNPIN)][["t_s", "a"]]
    d = pd.concat(
        [pin.assign(delta=pin["a"], order=1), unpin.assign(delta=-unpin["a"], order=0)], ignore_index=True
    ).sort_values(["t_s", "order"], kind="stable")
    tokens = d["delta"].cumsum().to_numpy()
    out = pd.DataFrame({"t_s": d["t_s"].to_numpy(), "pinned_tokens": tokens})
    out["pinned_gib"] = out["pinned_tokens"] * bytes_per_token / GIB
    return out


def held_series(ev: pd.DataFrame) -> pd.DataFrame:
    """KV P holds for D's reads (under lease) over time, summed over prefill nodes and GPUs.

    Step-function samples ``t_s, held_tokens, held_gib`` after each change (releases before holds at
    equal times).
    """
    hold = ev[ev["kind"] == int(Ev.P_DONE)][["t_s", "conv", "turn", "b"]]  # P_DONE's b: bytes now held
    unhold = ev[ev["kind"] == int(Ev.P_UNHOLD)][["t_s", "conv", "turn", "a"]]
    unhold = unhold.merge(hold[["conv", "turn", "b"]], on=["conv", "turn"], how="left")
    tokens_per_byte = float(unhold["a"].sum() / unhold["b"].sum()) if len(unhold) and unhold["b"].sum() > 0 else 0.0
    d = pd.concat(
        [hold.assign(db=hold["b"], order=1), unhold.assign(db=-unhold["b"], order=0)], ignore_index=True
    ).sort_values(["t_s", "order"], kind="stable")
    held = d["db"].cumsum().to_numpy()  # bytes at P's TP, logged with each P_DONE
    out = pd.DataFrame({"t_s": d["t_s"].to_numpy(), "held_tokens": np.rint(held * tokens_per_byte)})
    out["held_gib"] = held / GIB
    return out


def _time_weighted_mean(series: pd.DataFrame, t_end: float, col: str) -> float:
    if series.empty or t_end <= 0:
        return 0.0
    t = series["t_s"].to_numpy()
    v = series[col].to_numpy()
    dt = np.diff(np.append(t, max(t_end, t[-1])))
    return float((v * dt).sum() / t_end)


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else float("nan")


def summarize(
    ev: pd.DataFrame, turns: pd.DataFrame, scenario: Scenario, bytes_per_token_all_ranks: int, extra: dict[str, Any]
) -> dict[str, Any]:
    """Headline metrics (``summary.json``). See the README for each definition."""
    ok = turns[turns["decision"] != "error"]
    ttft = ok["ttft_s"].dropna().to_numpy()
    follow = turns[turns["turn"] >= 2]
    reused = follow["decision"].isin(["pull", "local", "recompute_below_threshold", "host_pull"])
    t_end = float(ev["t_s"].max()) if len(ev) else 0.0
    series = pinned_series(ev, bytes_per_token_all_ranks)
    held = held_series(ev)
    unpin = ev[ev["kind"] == int(Ev.UNPIN)]
    releases = {RELEASE_NAMES[k]: int((unpin["b"] == k).sum()) for k in RELEASE_NAMES}
    pull = turns[turns["decision"] == "pull"]
    decisions = {name: int((turns["decision"] == name).sum()) for name in DECISION_NAMES.values()}
    summary: dict[str, Any] = {
        "turns": int(len(turns)),
        "conversations": int(turns["conversation_id"].nunique()),
        "errors": int(decisions["error"]),
        "ttft_mean_s": float(ttft.mean()) if len(ttft) else float("nan"),
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p90_s": _pct(ttft, 90),
        "ttft_p99_s": _pct(ttft, 99),
        "hit_rate": float(reused.mean()) if len(follow) else 0.0,
        "pull_rate": float(len(pull) / len(turns)) if len(turns) else 0.0,
        "follow_up_turns": int(len(follow)),
        "decisions": decisions,
        "pulled_tokens": int(turns["pulled_tokens"].sum()),
        "recomputed_tokens": int(turns["recomputed_tokens"].sum()),
        "local_hit_tokens": int(turns["local_hit_tokens"].sum()),
        "failed_tokens": int(turns["failed_tokens"].sum()),
        "prompt_tokens": int(turns["prompt_tokens"].sum()),
        "d2p_bytes": int(turns["d2p_bytes"].sum()),
        "p2d_bytes": int(turns["p2d_bytes"].sum()),
        "kv_pull_mean_s": float(pull["kv_pull_s"].mean()) if len(pull) else 0.0,
        "d2p_xfer_mean_s": float(pull["d2p_xfer_s"].mean()) if len(pull) else 0.0,
        "p_leg_mean_s": float(ok["p_leg_s"].mean()) if len(ok) else float("nan"),
        "prefill_queue_mean_s": float(ok["prefill_queue_s"].mean()) if len(ok) else float("nan"),
        "pinned_kv_gib_mean": _time_weighted_mean(series, t_end, "pinned_gib"),
        "pinned_kv_gib_peak": float(series["pinned_gib"].max()) if len(series) else 0.0,
        "pins": int((ev["kind"] == int(Ev.PIN)).sum()),
        "releases": releases,
        "pins_outstanding": int((ev["kind"] == int(Ev.PIN)).sum() - len(unpin)),
        "sim_end_s": t_end,
        "d_preemptions": int((ev["kind"] == int(Ev.D_PREEMPT)).sum()),
        "d_preempted_recompute_tokens": int(ev.loc[ev["kind"] == int(Ev.D_RECOMPUTE), "a"].sum()),
        "p_held_kv_gib_mean": _time_weighted_mean(held, t_end, "held_gib"),
        "p_held_kv_gib_peak": float(held["held_gib"].max()) if len(held) else 0.0,
        "p_lease_expiries": int(((ev["kind"] == int(Ev.P_UNHOLD)) & (ev["b"] == int(HoldRelease.LAPSED))).sum()),
        "p2d_failed_reads": int((ev["kind"] == int(Ev.P2D_FAILED)).sum()),
    }
    tpot = ok["tpot_s"].dropna().to_numpy()
    summary["tpot_mean_s"] = float(tpot.mean()) if len(tpot) else float("nan")
    summary["tpot_p50_s"] = _pct(tpot, 50)
    summary["tpot_p90_s"] = _pct(tpot, 90)
    summary.update(extra)
    return summary


@dataclass
class Result:
    """What ``run`` returns: the scenario, the event log and everything derived from it."""

    scenario: Scenario
    seed: int
    events: pd.DataFrame
    turns: pd.DataFrame
    summary: dict[str, Any]
    bytes_per_token_all_ranks: int
    notes: list[str] = field(default_factory=list)

    def pinned_series(self) -> pd.DataFrame:
        """Retained decode KV over time (GiB summed over decode nodes and GPUs)."""
        return pinned_series(self.events, self.bytes_per_token_all_ranks)

    def held_series(self) -> pd.DataFrame:
        """KV P holds under lease for D's reads over time (GiB summed over prefill nodes and GPUs)."""
        return held_series(self.events)


def build_result(
    scenario: Scenario, seed: int, log: list[tuple[Any, ...]], bytes_all_ranks: int, extra: dict[str, Any],
    notes: list[str],
) -> Result:
    """Derive turns and summary from a finished run's log."""
    ev = events_frame(log)
    turns = turns_frame(ev)
    summary = summarize(ev, turns, scenario, bytes_all_ranks, extra)
    return Result(scenario, seed, ev, turns, summary, bytes_all_ranks, notes)



# --- writers ---------------------------------------------------------------------------------------------

FLOAT_FORMAT = "%.9f"


def turns_csv_bytes(turns: pd.DataFrame) -> bytes:
    """``turns.csv`` content with fixed column order and float format."""
    return turns.to_csv(index=False, float_format=FLOAT_FORMAT, lineterminator="\n").encode()


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def json_safe(v: Any) -> Any:
    """A JSON-ready copy: tuples to lists, NumPy scalars to Python, NaN and infinities to None."""
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [json_safe(x) for x in v]
    if isinstance(v, np.generic):
        return json_safe(v.item())
    if isinstance(v, float) and not np.isfinite(v):
        return None
    return v


def summary_json_bytes(summary: dict[str, Any]) -> bytes:
    """``summary.json`` content (sorted keys, NaN written as null)."""
    return (json.dumps(json_safe(summary), indent=2, sort_keys=True, default=_json_default) + "\n").encode()


def result_file_names(extra_files: dict[str, bytes] | None = None) -> list[str]:
    """The files :func:`write_result_dir` writes into a result directory."""
    return ["turns.csv", "summary.json", "pinned.csv", "scenario.yaml", *(extra_files or {})]


def write_result_dir(
    result: Result, out: str | Path, extra_files: dict[str, bytes] | None = None, overwrite: bool = False
) -> Path:
    """Write ``turns.csv``, ``summary.json``, ``pinned.csv`` and ``scenario.yaml`` into ``out``.

    A new directory appears only when complete; an existing non-empty one is refused unless ``overwrite``,
    which replaces only kvplan's own files there and keeps every other file (:mod:`kvplan.atomic`).
    """
    import yaml

    check_result_dir(out, result_file_names(extra_files), overwrite)
    files = {
        "turns.csv": turns_csv_bytes(result.turns),
        "pinned.csv": result.pinned_series().to_csv(index=False, float_format=FLOAT_FORMAT, lineterminator="\n").encode(),
        "scenario.yaml": yaml.safe_dump(
            result.scenario.model_dump(mode="json", exclude_none=True), sort_keys=False
        ).encode(),
        **(extra_files or {}),
        "summary.json": summary_json_bytes(result.summary),  # last: its presence means the rest is there
    }
    return write_result_dir_files(out, files, overwrite)
