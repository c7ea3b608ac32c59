"""Replay selection: time window, time scale, session sampling and the context limit."""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from typing import Any, Literal

import numpy as np
import pandas as pd

from kvplan.errors import input_error
from kvplan.traces.sessions import _frame
from kvplan.traces.trace import Trace

log = logging.getLogger(__name__)


def select(
    trace: Trace,
    time_scale: float = 1.0,
    window_s: tuple[float, float] | None = None,
    sample_sessions: float | None = None,
    seed: int = 0,
    max_context_tokens: int | None = None,
    overlong: Literal["skip", "truncate"] = "skip",
    warn: bool = True,
) -> tuple[Trace, dict[str, Any]]:
    """Select part of a trace for replay; returns ``(new trace, report)`` (pure, no simulation).

    - ``window_s=(start, end)``: keep requests with ``start <= arrival_s < end`` (trace clock).
    - ``sample_sessions``: keep ``round(fraction * sessions)`` whole sessions drawn with
      ``numpy.random.default_rng(seed)`` (at least one).
    - ``max_context_tokens``: a request with ``input + output`` above it is dropped (``overlong='skip'``)
      or cut (``'truncate'``: the input first, down to ``max - output`` but >= 1, then the output).
    - ``time_scale > 1`` speeds arrivals up: ``arrival_s`` is divided by it after selection.
    - ``warn``: log a warning when requests are skipped or truncated at the context limit (a caller that only
      reads the selection, not replaying it, passes False: the replay says it).

    Arrivals are rebased so the first kept request is at 0. A request whose parent was dropped is
    re-attached to its nearest kept ancestor, or starts its session when there is none; turns are
    renumbered. The report counts every dropped, truncated, re-parented and orphaned request.
    """
    where = "select"
    if not (isinstance(time_scale, int | float) and math.isfinite(time_scale) and time_scale > 0):
        raise input_error(
            f"{where}: time_scale", f"is {time_scale!r}", "give a finite number > 0 (2 = twice as fast)"
        )
    if overlong not in ("skip", "truncate"):
        raise input_error(f"{where}: overlong", f"is {overlong!r}", "use 'skip' or 'truncate'")
    df = trace.requests
    n = len(df)
    arrival = df["arrival_s"].to_numpy(dtype=float)
    keep = np.ones(n, dtype=bool)
    report: dict[str, Any] = {
        "input_requests": n,
        "input_sessions": trace.n_sessions,
        "time_scale": float(time_scale),
        "window_s": None,
        "sample_sessions": sample_sessions,
        "seed": seed,
        "max_context_tokens": max_context_tokens,
        "overlong": overlong,
    }
    if window_s is not None:
        keep &= _window_mask(arrival, window_s, report)
    if sample_sessions is not None:
        keep &= _session_mask(df["session_id"].to_numpy(dtype=object), sample_sessions, seed, keep, report)
    n_in = df["input_tokens"].to_numpy(dtype=np.int64).copy()
    n_out = df["output_tokens"].to_numpy(dtype=np.int64).copy()
    report["skipped_overlong"] = 0
    report["truncated_overlong"] = 0
    if max_context_tokens is not None:
        keep, n_in, n_out = _context_limit(keep, n_in, n_out, max_context_tokens, overlong, report, warn)
    rid = df["request_id"].to_numpy(dtype=np.int64)
    new_parent, reparented, orphaned = _reattach(keep, rid, df["parent_request_id"].to_numpy(dtype=np.int64))
    idx = np.flatnonzero(keep)
    if idx.size == 0 and report["skipped_overlong"]:
        raise input_error(where, f"every kept request ({report['skipped_overlong']:,}) is longer than the model's "
                          f"context of {max_context_tokens:,} tokens, so there is nothing to replay",
                          "use workload.trace.overlong: truncate, or a model with a longer context")
    if idx.size == 0:
        raise input_error(
            where, "the selection keeps no request", "widen the window or raise sample_sessions"
        )
    turn = np.ones(n, dtype=np.int64)
    turn_l, np_l = turn.tolist(), new_parent.tolist()
    for i in idx.tolist():
        if np_l[i] >= 0:
            turn_l[i] = turn_l[np_l[i]] + 1
    turn = np.asarray(turn_l, dtype=np.int64)
    parent_id = np.where(new_parent >= 0, rid[np.maximum(new_parent, 0)], -1)
    t0 = arrival[idx[0]]
    out = _frame(
        rid[idx],
        df["session_id"].to_numpy(dtype=object)[idx].tolist(),
        turn[idx],
        (arrival[idx] - t0) / float(time_scale),
        n_in[idx],
        n_out[idx],
        parent_id[idx],
        df["service_s"].to_numpy(dtype=float)[idx],
        df["linkable"].to_numpy(dtype=bool)[idx],
    )
    report.update(
        kept_requests=int(idx.size),
        kept_sessions=int(out["session_id"].nunique()),
        reparented=reparented,
        orphaned=orphaned,
        rebased_by_s=float(t0),
    )
    new = replace(trace, requests=out, notes={**dict(trace.notes), "selection": report})
    return new, report


def _window_mask(arrival: np.ndarray, window_s: tuple[float, float], report: dict[str, Any]) -> np.ndarray:
    start, end = (float(window_s[0]), float(window_s[1]))
    if not (math.isfinite(start) and math.isfinite(end) and start < end):
        raise input_error("select: window_s", f"is {window_s!r}", "give (start, end) seconds with start < end")
    in_window = (arrival >= start) & (arrival < end)
    report["window_s"] = [start, end]
    report["dropped_outside_window"] = int((~in_window).sum())
    return in_window


def _session_mask(sessions: np.ndarray, fraction: float, seed: int, keep: np.ndarray,
                  report: dict[str, Any]) -> np.ndarray:
    if not (isinstance(fraction, int | float) and 0 < fraction <= 1):
        raise input_error("select: sample_sessions", f"is {fraction!r}", "give a fraction in (0, 1]")
    uniq = pd.unique(pd.Series(sessions))  # order of first arrival: deterministic
    k = max(1, round(fraction * len(uniq)))
    chosen = np.random.default_rng(seed).permutation(len(uniq))[:k]
    picked = pd.Series(sessions).isin(set(uniq[chosen].tolist())).to_numpy()
    report["sessions_sampled"] = int(k)
    report["dropped_by_session_sampling"] = int((keep & ~picked).sum())
    return picked


def overlong_message(n: int, total: int, max_tokens: int, overlong: str) -> str:
    """The warning of a replay that skipped or truncated ``n`` of ``total`` requests at the ``max_tokens`` context
    limit. Its first clause is what earlier versions logged ("select: N request(s) over L tokens were skipped"; tests
    and scripts match it); the rest says out of how many, what the limit is and which setting changes it (a newcomer
    read "select:" as nothing of theirs)."""
    verb = "skipped" if overlong == "skip" else "truncated"
    fix = ("workload.trace.overlong: truncate replays them cut to it, a model with a longer context replays them whole"
           if overlong == "skip" else "a model with a longer context replays them whole")
    return (f"select: {n} request(s) over {max_tokens} tokens were {verb} (trace replay: {n:,} of its {total:,} "
            f"requests have prompt + output beyond the context limit, deployment.max_model_len or else the model's; "
            f"{fix})")


def _context_limit(keep: np.ndarray, n_in: np.ndarray, n_out: np.ndarray, max_tokens: int, overlong: str,
                   report: dict[str, Any], warn: bool = True) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Skip or truncate requests with ``input + output > max_tokens`` (counted in ``report``; logged if ``warn``)."""
    if not (isinstance(max_tokens, int) and max_tokens >= 2):
        raise input_error("select: max_context_tokens", f"is {max_tokens!r}", "give an integer >= 2")
    too_long = keep & (n_in + n_out > max_tokens)
    if overlong == "skip":
        keep = keep & ~too_long
        report["skipped_overlong"] = int(too_long.sum())
    else:
        cut_in = np.maximum(1, max_tokens - n_out)
        n_in = np.where(too_long, np.minimum(n_in, cut_in), n_in)
        n_out = np.where(too_long, np.minimum(n_out, max_tokens - n_in), n_out)
        report["truncated_overlong"] = int(too_long.sum())
    if warn and too_long.any() and keep.any():  # all skipped: select() refuses the trace in one line instead
        log.warning("%s", overlong_message(int(too_long.sum()), int(report["input_requests"]), max_tokens, overlong))
    return keep, n_in, n_out


def _reattach(keep: np.ndarray, rid: np.ndarray, parent_rid: np.ndarray) -> tuple[np.ndarray, int, int]:
    """Each kept request's nearest kept ancestor (a position, -1 for none; parents precede children in
    arrival order), and the counts of re-parented and orphaned requests."""
    n = len(keep)
    ppos = pd.Index(rid).get_indexer(parent_rid)
    keep_l, ppos_l = keep.tolist(), ppos.tolist()
    anc_l = [-1] * n  # nearest kept ancestor-or-self, as a position
    new_l = [-1] * n
    reparented = orphaned = 0
    for i in range(n):
        p = ppos_l[i]
        up = anc_l[p] if p >= 0 else -1
        if keep_l[i]:
            new_l[i] = up
            anc_l[i] = i
            if p >= 0 and not keep_l[p]:
                if up >= 0:
                    reparented += 1
                else:
                    orphaned += 1
        else:
            anc_l[i] = up
    return np.asarray(new_l, dtype=np.int64), reparented, orphaned
