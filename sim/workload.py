"""Workload generation: every random draw of a run, made up front from named, independent streams.

One ``numpy.random.SeedSequence(seed)`` spawns one generator per source in a fixed order (arrivals,
turns, prefix, user tokens, output tokens, turn gaps, routing), so changing one knob leaves the other
streams untouched (common random numbers across what-if runs) and a run is reproducible bit for bit.
Drawing everything vectorised up front is also what keeps the simulator fast.
"""

from __future__ import annotations

import csv
import io
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from kvplan.errors import input_error
from kvplan.inputfile import read_text
from kvplan.sim.conversation_plan import ConversationPlan
from kvplan.sim.history import combine_reuse, history_reuse
from kvplan.sim.scenario import (
    MAX_EMPIRICAL_VALUES,
    MAX_SIM_TIME_S,
    MAX_TOKENS,
    MAX_TOTAL_TURNS,
    MAX_TURNS_PER_CONVERSATION,
    ClosedLoopArrival,
    Constant,
    Dist,
    Empirical,
    Exponential,
    LogNormal,
    TraceSource,
    Uniform,
    Workload,
)

STREAMS = ("arrivals", "turns", "prefix", "user", "output", "gaps", "routing")
MAX_EMPIRICAL_FILE_BYTES = 64 * 1024**2


def load_empirical_values(path: str | Path, column: str | None = None) -> np.ndarray:
    """Read non-negative numbers from a text file (one per line) or a CSV column: a regular file of at most
    64 MiB (not ``/proc``, a device or a FIFO), UTF-8, at most ``MAX_EMPIRICAL_VALUES`` values; every
    malformed line, over-long field or non-finite value is a one-line error naming the file and line."""
    p = Path(path)
    label = f"empirical path '{p}'"
    text = read_text(p, MAX_EMPIRICAL_FILE_BYTES, label)
    values: list[float] = []
    reader = csv.reader(io.StringIO(text))
    col_idx = 0
    header_seen = False  # one header at most: after it, a non-number in the column is a bad value, not a header
    while True:
        try:
            row = next(reader)
        except StopIteration:
            break
        except csv.Error as exc:
            raise input_error(f"{p}: line {reader.line_num}", f"malformed CSV ({exc})") from None
        lineno = reader.line_num
        if not row or not row[0].strip() or row[0].lstrip().startswith("#"):
            continue
        if not header_seen and not values and (lineno == 1 or column is not None):
            if _as_float(row[col_idx] if col_idx < len(row) else "") is None:  # header line
                header_seen = True
                if column is not None:
                    if column not in row:
                        raise input_error(f"{p}: line {lineno}", f"no column '{column[:40]}' in the header") from None
                    col_idx = row.index(column)
                continue
        v = _as_float(row[col_idx]) if col_idx < len(row) else None
        if v is None:
            raise input_error(f"{p}: line {lineno}", f"not a number: {row[col_idx:col_idx + 1]!r:.60}") from None
        if not np.isfinite(v) or v < 0:
            raise input_error(f"{p}: line {lineno}", f"value {v} must be finite and >= 0")
        values.append(v)
        if len(values) > MAX_EMPIRICAL_VALUES:
            raise input_error(f"{p}", f"more than {MAX_EMPIRICAL_VALUES} values", "subsample it")
    if not values:
        raise input_error(label, "no numeric values found")
    return np.asarray(values, dtype=float)


def _as_float(text: str) -> float | None:
    """``float(text)`` for a number of at most 64 characters, else ``None`` (a header or junk)."""
    text = text.strip()
    if not text or len(text) > 64:
        return None
    try:
        return float(text)
    except ValueError:
        return None


#: Per-draw bounds of each workload distribution, also applied to values read from an empirical file:
#: (field, lowest value, highest value, unit).
_FILE_BOUNDS = (
    ("turns", 1.0, MAX_TURNS_PER_CONVERSATION, "turns"),
    ("prefix_tokens", 0.0, MAX_TOKENS, "tokens"),
    ("user_tokens", 0.0, MAX_TOKENS, "tokens"),
    ("output_tokens", 1.0, MAX_TOKENS, "tokens"),
    ("turn_gap_s", 0.0, MAX_SIM_TIME_S, "s"),
)


def check_empirical_files(workload: Workload) -> None:
    """Apply the per-draw bounds of inline distributions to the values of every empirical ``path`` file, and
    the total-turn bound to the mean of a turns file, before any draw."""
    for name, low, high, unit in _FILE_BOUNDS:
        dist = getattr(workload, name)
        if not isinstance(dist, Empirical) or dist.path is None:
            continue
        vals = load_empirical_values(dist.path, dist.column)
        lo, hi = float(vals.min()), float(vals.max())
        if hi > high or lo < low:
            bad = hi if hi > high else lo
            raise input_error(f"workload.{name}.path", f"'{dist.path}' holds {bad:.4g} {unit}, outside "
                              f"[{low:g}, {high:.4g}] {unit}", "filter the file")
        if name == "turns" and workload.conversations * float(vals.mean()) > MAX_TOTAL_TURNS:
            raise input_error("workload.turns.path", f"conversations x mean turns of '{dist.path}' = "
                              f"{workload.conversations * float(vals.mean()):,.0f} turns (more than {MAX_TOTAL_TURNS:,})",
                              "lower workload.conversations")


def sample(dist: Dist, rng: np.random.Generator, n: int) -> np.ndarray:
    """Draw ``n`` values of a scenario distribution (float array, not yet rounded)."""
    if isinstance(dist, Constant):
        return np.full(n, dist.value, dtype=float)
    if isinstance(dist, Exponential):
        return rng.exponential(dist.mean, n)
    if isinstance(dist, LogNormal):
        return rng.lognormal(np.log(dist.median), dist.sigma, n)
    if isinstance(dist, Uniform):
        return rng.uniform(dist.low, dist.high, n)
    if isinstance(dist, Empirical):
        vals = np.asarray(dist.values, dtype=float) if dist.values is not None else load_empirical_values(
            dist.path or "", dist.column
        )
        return vals[rng.integers(0, len(vals), n)]
    raise TypeError(f"unknown distribution {dist!r}")  # pragma: no cover - pydantic forbids it


def dist_mean(dist: Dist) -> float:
    """Mean of a scenario distribution (for analytic screens and advice)."""
    if isinstance(dist, Constant):
        return dist.value
    if isinstance(dist, Exponential):
        return dist.mean
    if isinstance(dist, LogNormal):
        return float(dist.median * np.exp(dist.sigma**2 / 2))
    if isinstance(dist, Uniform):
        return (dist.low + dist.high) / 2
    vals = np.asarray(dist.values, dtype=float) if dist.values is not None else load_empirical_values(
        dist.path or "", dist.column
    )
    return float(vals.mean())


def make_plan(workload: Workload, seed: int, max_model_len: int) -> ConversationPlan:
    """Draw every conversation of ``workload`` from ``seed``.

    Token and turn counts are rounded to integers (turns >= 1, outputs >= 1, user tokens >= 0). A
    conversation whose context would exceed ``max_model_len`` (vLLM rejects such a request) ends at the
    last turn that fits; the count is reported as ``truncated_conversations``, never silently.
    """
    if workload.trace is not None:
        plan = plan_from_trace(workload.trace, seed, max_model_len)
        if workload.history is not None:
            reuse = history_reuse(workload, plan.prompt_tokens, plan.output_tokens, plan.offsets)
            plan = replace(plan, reuse_tokens=combine_reuse(plan.reuse_tokens, reuse))
        if workload.shared_prefix_tokens is not None:
            group, shared = shared_groups(workload, plan.prompt_tokens[plan.offsets[:-1]])
            plan = replace(plan, shared_group=group, shared_tokens=shared)
        return plan
    check_empirical_files(workload)
    seqs = np.random.SeedSequence(seed).spawn(len(STREAMS))
    rng = {name: np.random.default_rng(s) for name, s in zip(STREAMS, seqs, strict=True)}
    n = workload.conversations
    if isinstance(workload.arrival, ClosedLoopArrival):
        start = np.full(n, np.nan)
    else:
        a = workload.arrival
        if a.burstiness == 1.0:
            start = np.cumsum(rng["arrivals"].exponential(1.0 / a.rate_per_s, n))
        else:  # vLLM benchmarks get_request: gamma(shape=burstiness, scale=1 / (rate x burstiness))
            start = np.cumsum(rng["arrivals"].gamma(a.burstiness, 1.0 / (a.rate_per_s * a.burstiness), n))
    # draws are clipped into int64-safe ranges before rounding (a long lognormal tail would overflow to
    # garbage); a token count at MAX_TOKENS is beyond every context limit and is cut like any overlong turn
    turns = np.rint(np.clip(sample(workload.turns, rng["turns"], n), 1, MAX_TURNS_PER_CONVERSATION)).astype(np.int64)
    total = int(turns.sum())
    if total > MAX_TOTAL_TURNS:
        raise input_error(
            "workload.turns", f"the drawn conversations have {total:,} turns (more than {MAX_TOTAL_TURNS:,})",
            "lower workload.conversations or workload.turns",
        )
    prefix = _tokens(sample(workload.prefix_tokens, rng["prefix"], n), 0)
    user = _tokens(sample(workload.user_tokens, rng["user"], total), 0)
    out = _tokens(sample(workload.output_tokens, rng["output"], total), 1)
    gaps = np.clip(sample(workload.turn_gap_s, rng["gaps"], total), 0.0, 2 * MAX_SIM_TIME_S)
    _check_span(start, gaps, turns, workload)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(turns, out=offsets[1:])
    # prompt_k = prefix + sum_{j<=k} user_j + sum_{j<k} out_j, per conversation (vectorised segment cumsum)
    conv_of_turn = np.repeat(np.arange(n), turns)
    inc = user.copy()
    inc[1:] += out[:-1]
    first = offsets[:-1]
    inc[first] = (user[first] + prefix) if workload.first_turn_user_tokens else prefix
    csum = np.cumsum(inc)
    base = np.zeros(n, dtype=np.int64)
    base[1:] = csum[first[1:] - 1]
    prompt = csum - base[conv_of_turn]
    prompt = np.maximum(prompt, 1)
    # end conversations before the first turn whose prompt + output exceeds the context limit
    too_long = (prompt + out) > max_model_len
    truncated = 0
    if too_long.any():
        keep_turns = turns.copy()
        bad_conv = np.unique(conv_of_turn[too_long])
        for c in bad_conv:
            seg = too_long[offsets[c] : offsets[c + 1]]
            keep_turns[c] = int(np.argmax(seg))
        truncated = int(len(bad_conv))
        mask = np.repeat(np.arange(n), turns)  # conversation of each turn
        k_in_conv = np.arange(total) - offsets[mask]
        keep = k_in_conv < keep_turns[mask]
        prompt, out, gaps = prompt[keep], out[keep], gaps[keep]
        turns = keep_turns
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(turns, out=offsets[1:])
        if not len(prompt):  # every first prompt + output is beyond the limit: refuse an empty run
            raise input_error(
                "deployment.max_model_len", f"every conversation's first turn (prompt + output) exceeds the context "
                f"limit of {max_model_len:,} tokens, so no request would run",
                "raise deployment.max_model_len (at most the model's) or lower prefix_tokens / output_tokens",
            )
    prompt, out = prompt.astype(np.int64), out.astype(np.int64)
    group, shared = shared_groups(workload, prefix)
    return ConversationPlan(
        start_s=start,
        turns=turns,
        offsets=offsets,
        prompt_tokens=prompt,
        output_tokens=out,
        gap_s=gaps.astype(float),
        truncated_conversations=truncated,
        reuse_tokens=history_reuse(workload, prompt, out, offsets),
        shared_group=group,
        shared_tokens=shared,
    )


def shared_groups(workload: Workload, prefix: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``shared_group`` / ``shared_tokens`` of the plan (sim/shared.py): conversation ``c`` in group
    ``c mod shared_prefix_groups``, sharing ``min(shared_prefix_tokens, its prefix)`` tokens; nothing without them."""
    if workload.shared_prefix_tokens is None:
        return None, None
    groups = workload.shared_prefix_groups or 1
    return (np.arange(len(prefix), dtype=np.int64) % groups,
            np.minimum(np.asarray(prefix, dtype=np.int64), workload.shared_prefix_tokens))


def _tokens(x: np.ndarray, low: int) -> np.ndarray:
    return np.rint(np.clip(x, low, MAX_TOKENS)).astype(np.int64)


def _check_span(start: np.ndarray, gaps: np.ndarray, turns: np.ndarray, workload: Workload) -> None:
    """Refuse a plan whose arrivals alone outlast the resolvable simulated time (see ``MAX_SIM_TIME_S``)."""
    conv = np.repeat(np.arange(len(turns)), turns)
    per_conv = np.bincount(conv, weights=gaps, minlength=len(turns)) if len(gaps) else np.zeros(len(turns))
    if isinstance(workload.arrival, ClosedLoopArrival):
        span = float(per_conv.sum()) / workload.arrival.clients
    else:
        span = float(np.max(start + per_conv)) if len(turns) else 0.0
    if span > MAX_SIM_TIME_S:
        raise input_error(
            "workload.turn_gap_s / workload.arrival",
            f"the drawn arrivals span {span:.3g} s of simulated time (more than {MAX_SIM_TIME_S:.0e} s, which "
            "float time cannot resolve to the nanosecond)", "raise the arrival rate or shorten the turn gaps",
        )


def plan_from_trace(source: TraceSource, seed: int, max_model_len: int) -> ConversationPlan:
    """Turn a real trace into a plan: sessions are conversations, every request keeps its own arrival time.

    Tokens per turn follow the trace (``input_tokens`` is the whole prompt, outputs at least 1). Requests
    with ``input + output`` above ``max_model_len`` are skipped or truncated as ``source.overlong`` says,
    and counted in ``trace_report``. ``seed`` only drives session sampling.
    """
    from kvplan.traces.readers import detect_trace_format, load_trace
    from kvplan.traces.select import select
    from kvplan.traces.trace import at_least_one_token

    fmt = source.format if source.format is not None else detect_trace_format(source.path)
    if fmt == "weka":
        from kvplan.sim.weka_plan import plan_from_weka

        return plan_from_weka(source, seed, max_model_len)
    if source.timing is not None:
        raise input_error(f"workload.trace '{source.path}': timing", f"applies to format weka only, not {fmt}",
                          "remove it (other formats replay their own clock)")
    if source.shared_prefix:
        raise input_error(f"workload.trace '{source.path}': shared_prefix", f"applies to format weka only, not {fmt}",
                          "remove it, or set workload.shared_prefix_tokens for a prefix shared by every session")
    trace = load_trace(source.path, fmt)
    sel, report = select(
        trace,
        time_scale=source.time_scale,
        window_s=source.window_s,
        sample_sessions=source.sample_sessions,
        seed=seed,
        max_context_tokens=max_model_len,
        overlong=source.overlong,
    )
    df = sel.requests
    if df.empty:
        raise input_error(f"workload.trace '{source.path}'", "no request left after window, sampling and context limit")
    codes, uniques = pd.factorize(df["session_id"], sort=False)  # conversation ids in order of first arrival
    order = np.lexsort((df["arrival_s"].to_numpy(), codes))
    codes = codes[order]
    n = len(uniques)
    turns = np.bincount(codes, minlength=n).astype(np.int64)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(turns, out=offsets[1:])
    arrival = df["arrival_s"].to_numpy(dtype=float)[order]
    if len(arrival) and not float(np.max(arrival)) <= MAX_SIM_TIME_S:
        raise input_error(
            f"workload.trace '{source.path}'", f"arrivals span {float(np.max(arrival)):.3g} s after time_scale "
            f"(more than {MAX_SIM_TIME_S:.0e} s of simulated time)", "raise time_scale or set window_s",
        )
    # a 0 of the trace is replayed as 1 (traces.trace.at_least_one_token), and said
    prompt, prompt_zeros = at_least_one_token(df["input_tokens"].to_numpy(dtype=np.int64)[order])
    out, out_zeros = at_least_one_token(df["output_tokens"].to_numpy(dtype=np.int64)[order])
    report = dict(report)
    report.update({"format": sel.format, "sha256": sel.sha256, "source": sel.source,
                   "requests_replayed": int(len(df)), "sessions_replayed": int(n)})
    unsorted = sel.notes.get("rows_out_of_order")
    if unsorted:  # an LMBench file (written in finishing order) sorted by arrival; said, and counted only then
        report["rows_out_of_order_sorted"] = int(unsorted)
    for name, zeros in (("input_tokens", prompt_zeros), ("output_tokens", out_zeros)):
        if zeros:  # only when it happened: reports of traces without zeros are unchanged
            report[f"{name}_zero_replayed_as_1"] = zeros
    return ConversationPlan(
        start_s=arrival[offsets[:-1]],
        turns=turns,
        offsets=offsets,
        prompt_tokens=prompt,
        output_tokens=out,
        gap_s=np.zeros(len(prompt)),
        truncated_conversations=0,
        arrival_s=arrival,
        trace_report=report,
    )
