"""The per-turn records of ``turns.csv``, derived from a run's event log (a pure function of it).

:func:`turn_columns` gathers one row per arrived turn from the events of each kind and composes the TTFT and
token identities; :class:`kvplan.sim.stream.RunStream` calls it on every finished chunk of conversations, and
:mod:`kvplan.sim.results` builds the summary from the stream. The column order is
:data:`kvplan.sim.result_files.TURN_COLUMNS`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from kvplan.sim.events import DECISION_NAMES, Decision, Ev, EventChunk, col
from kvplan.sim.result_files import ROUTER_NAMES, TURN_COLUMNS


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
        # a turn arrived twice (never in a model run, possible in a replayed log): one row per turn
        first = np.concatenate(([True], rows[1:] != rows[:-1]))
        rows, by_key = rows[first], by_key[first]
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
    return turns_frame(turn_arrays(ev, offsets))


def turn_arrays(ev: EventChunk, offsets: np.ndarray) -> dict[str, np.ndarray]:
    """The columns of :func:`turn_columns` as NumPy arrays, ``decision``/``router`` as their codes
    (``decision_code``/``router_code``, float, NaN where missing), with the raw gathered columns beside them:
    what the streamed derivation sorts and folds before a frame is built (:func:`turns_frame`)."""
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
    return g


#: the columns :func:`turns_frame` reads from :func:`turn_arrays`' output
ARRAY_COLUMNS = [c for c in TURN_COLUMNS if c not in ("decision", "router")] + ["decision_code", "router_code"]


def turns_frame(g: dict[str, np.ndarray]) -> pd.DataFrame:
    """The ``turns.csv`` frame of :func:`turn_arrays`' columns (codes named)."""
    names = {int(k): v for k, v in DECISION_NAMES.items()}
    if not len(g["turn"]):  # no turn: the frame (and its dtypes) as pandas maps an empty column
        df = pd.DataFrame({c: g[c] for c in TURN_COLUMNS if c not in ("decision", "router")})
        df["decision"] = pd.Series(g["decision_code"]).map(names)
        df["router"] = pd.Series(g["router_code"]).map(ROUTER_NAMES)
        return df[TURN_COLUMNS]
    cols: dict[str, Any] = {**g, "decision": _names(g["decision_code"], names),
                            "router": _names(g["router_code"], ROUTER_NAMES)}
    # built in column order (no reindexing copy), one block per column: the arrays are fresh and nobody writes them
    return pd.DataFrame({c: cols[c] for c in TURN_COLUMNS}, copy=False)


def _names(codes: np.ndarray, names: dict[int, str]) -> pd.Series:
    """``pd.Series(codes).map(names)`` (NaN where a code has no name) by one comparison per name."""
    out = np.full(len(codes), np.nan, dtype=object)
    for code, name in names.items():
        out[codes == code] = name
    return pd.Series(out)
