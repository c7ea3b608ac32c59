"""Readers of the four trace formats (module docstring of :mod:`kvplan.traces`) and :func:`load_trace`."""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import pandas as pd

from kvplan.errors import KvplanInputError, input_error
from kvplan.inputfile import DEFAULT_MAX_BYTES, _short, check_file, decode_head, json_loads
from kvplan.traces.sessions import _chains, _frame, _link_sessions, link_prefix_chains
from kvplan.traces.trace import (
    AZURE_HEADER,
    CLOCK_RESTART_S,
    CSV_HEADER,
    DEFAULT_MIN_BLOCKS,
    LMBENCH_HEADER,
    MAX_TRACE_RECORDS,
    MOONCAKE_BLOCK_TOKENS,
    TRACE_FORMATS,
    Trace,
    TraceFormat,
    _check_sorted,
    _count,
    _get,
    _json_array,
    _json_lines,
    _no_records,
    _number,
    _read_source,
)

log = logging.getLogger(__name__)

#: How much of a trace file :func:`detect_trace_format` reads to tell its format.
HEAD_BYTES = 65536


def _read_mooncake(text: str, label: str, min_blocks: int) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Parse and validate Mooncake JSONL, then reconstruct conversations (module docstring)."""
    ts: list[float] = []
    lines: list[int] = []
    n_in: list[int] = []
    n_out: list[int] = []
    hashes: list[list[int]] = []
    for lineno, obj in _json_lines(text, label):
        t, i_len, o_len, ids = _mooncake_record(obj, f"{label}: line {lineno}")
        ts.append(t)
        lines.append(lineno)
        n_in.append(i_len)
        n_out.append(o_len)
        hashes.append(ids)
    if not ts:
        raise _no_records(label)
    _check_sorted(ts, lines, label, "timestamp", "ms")
    parents = link_prefix_chains(hashes, n_in, min_blocks=min_blocks)
    root, turn = _chains(parents)
    inputs = np.asarray(n_in, dtype=np.int64)
    linkable = inputs // MOONCAKE_BLOCK_TOKENS >= min_blocks
    arrival = np.asarray(ts, dtype=float) / 1000.0
    df = _frame(
        np.arange(len(ts)),
        [str(r) for r in root.tolist()],
        turn,
        arrival - arrival[0],
        inputs,
        np.asarray(n_out),
        parents,
        np.full(len(ts), np.nan),
        linkable,
    )
    return df, _linking_report(parents, root, turn, linkable, min_blocks)


def _mooncake_record(obj: dict[str, Any], where: str) -> tuple[float, int, int, list[int]]:
    """One checked Mooncake line: timestamp (ms), input and output lengths, one block id per 512 tokens."""
    t = _number(_get(obj, "timestamp", where), "timestamp", where)
    if t < 0:
        raise input_error(where, f"field 'timestamp' is negative ({t:g} ms)")
    i_len = _count(_get(obj, "input_length", where), "input_length", where)
    o_len = _count(_get(obj, "output_length", where), "output_length", where)
    ids = _get(obj, "hash_ids", where)
    if not isinstance(ids, list):
        raise input_error(where, f"field 'hash_ids' is {_short(ids)}, not a list of block ids")
    expected = -(-i_len // MOONCAKE_BLOCK_TOKENS)
    if len(ids) != expected:
        raise input_error(
            where,
            f"field 'hash_ids' has {len(ids)} ids but input_length {i_len} needs "
            f"ceil({i_len}/512) = {expected}",
            "one id per 512-token block, the partial last block included",
        )
    for k, v in enumerate(ids):
        if isinstance(v, bool) or not isinstance(v, int):
            raise input_error(where, f"field 'hash_ids' entry {k} is {_short(v)}, not an integer id")
    return t, i_len, o_len, ids


def _linking_report(parents: np.ndarray, root: np.ndarray, turn: np.ndarray, linkable: np.ndarray,
                    min_blocks: int) -> dict[str, Any]:
    """The Mooncake reconstruction statistics kept in ``Trace.linking``."""
    n = len(parents)
    children = np.bincount(parents[parents >= 0], minlength=n)
    sizes = np.bincount(np.unique(root, return_inverse=True)[1])
    return {
        "method": "hash-prefix chains: parent's full 512-token blocks are a prefix of the child's hash_ids; "
        "deepest match, then latest parent",
        "block_tokens": MOONCAKE_BLOCK_TOKENS,
        "min_blocks": min_blocks,
        "requests": n,
        "linked_requests": int((parents >= 0).sum()),
        "sessions": int(sizes.size),
        "sessions_with_2plus_requests": int((sizes >= 2).sum()),
        "share_requests_in_multi_request_sessions": float(sizes[sizes >= 2].sum() / n),
        "parents": int((children > 0).sum()),
        "parents_with_2plus_children": int((children > 1).sum()),
        "unlinkable_as_parent": int((~linkable).sum()),
        "max_turn": int(turn.max()),
    }


def _read_ragpulse(text: str, label: str, on_clock_restart: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Parse RAGPulse JSONL (session ids given); sort or append clock segments (module docstring)."""
    ts: list[float] = []
    lines: list[int] = []
    sess: list[str] = []
    n_in: list[int] = []
    n_out: list[int] = []
    for lineno, obj in _json_lines(text, label):
        where = f"{label}: line {lineno}"
        ts.append(_number(_get(obj, "timestamp", where), "timestamp", where, allow_string=True))
        n_in.append(_count(_get(obj, "input_length", where), "input_length", where))
        n_out.append(_count(_get(obj, "output_length", where), "output_length", where))
        sid = _get(obj, "session_id", where)
        if isinstance(sid, bool) or not isinstance(sid, str | int) or not str(sid).strip():
            raise input_error(where, f"field 'session_id' is {_short(sid)}, not a non-empty string")
        sess.append(str(sid))
        lines.append(lineno)
    if not ts:
        raise _no_records(label)
    arrival = np.asarray(ts, dtype=float)
    steps = np.diff(arrival)
    restarts = [lines[int(i) + 1] for i in np.flatnonzero(steps < -CLOCK_RESTART_S)]
    backwards = int((steps < 0).sum())
    if on_clock_restart == "append" and restarts:
        seg_start = np.flatnonzero(steps < -CLOCK_RESTART_S) + 1
        offset = np.zeros(len(arrival))
        for s in seg_start.tolist():
            # the new segment continues after the previous segment's last arrival (lower bound on the truth)
            offset[s:] = arrival[s - 1] + offset[s - 1] - arrival[s]
        arrival = arrival + offset
    if restarts:
        # what was done and what it means for the replay (a newcomer read 'on_clock_restart='sort'' as a setting to
        # change, and no scenario field or option sets it)
        done = ("its segments were sorted together, each from its own time 0: they overlap, so the replay's arrival "
                "rate is their sum (the published RAGPulse file: two weeks overlaid, twice the rate); the Python API's "
                "load_trace(..., on_clock_restart='append') replays them one after the other"
                if on_clock_restart == "sort" else
                "each segment was appended after the previous segment's last arrival (a lower bound on the true gap)")
        log.warning(
            "%s: the clock goes back by more than %.0f s at line(s) %s; on_clock_restart=%r: %s",
            label,
            CLOCK_RESTART_S,
            restarts,
            on_clock_restart,
            done,
        )
    df = _link_sessions(sess, arrival, np.asarray(n_in), np.asarray(n_out))
    notes = {"clock_restarts": restarts, "backwards_steps": backwards, "on_clock_restart": on_clock_restart}
    return df, notes


def _read_multiturn(text: str, label: str) -> pd.DataFrame:
    """Parse vLLM multi-turn benchmark stats JSON (sessions by ``conversation_id``)."""
    entries = _json_array(text, label)
    if not entries:
        raise _no_records(label)
    ts: list[float] = []
    sess: list[str] = []
    n_in: list[int] = []
    n_out: list[int] = []
    svc: list[float] = []
    for lineno, obj in entries:
        where = f"{label}: line {lineno}"
        if not isinstance(obj, dict):
            raise input_error(where, f"entry is {_short(obj)}, not a JSON object")
        # older versions of the benchmark call the field session_id
        key = "session_id" if "session_id" in obj and "conversation_id" not in obj else "conversation_id"
        cid = _get(obj, key, where)
        if isinstance(cid, bool) or not isinstance(cid, str | int) or not str(cid).strip():
            raise input_error(where, f"field '{key}' is {_short(cid)}, not a non-empty string")
        sess.append(str(cid))
        ts.append(_number(_get(obj, "start_time_ms", where), "start_time_ms", where))
        n_in.append(_count(_get(obj, "input_num_tokens", where), "input_num_tokens", where))
        n_out.append(_count(_get(obj, "output_num_tokens", where), "output_num_tokens", where))
        _count(_get(obj, "input_num_turns", where), "input_num_turns", where, minimum=1)
        lat = obj.get("latency_ms")
        if lat is None:
            svc.append(math.nan)
        else:
            value = _number(lat, "latency_ms", where)
            svc.append(value / 1000.0 if value >= 0 else math.nan)  # vLLM writes -1 when unknown
    return _link_sessions(
        sess, np.asarray(ts) / 1000.0, np.asarray(n_in), np.asarray(n_out), np.asarray(svc, dtype=float)
    )


def _latency_s(value: Any, where: str) -> float:
    """A bench request's ``latencies`` entry as its service time (NaN when absent): vllm bench serve measures it as
    finish - send, so a negative one is refused (it would lengthen the idle gaps workload show/fit report)."""
    if value is None:
        return math.nan
    out = _number(value, "latencies", where)
    if out < 0:
        raise input_error(where, f"field 'latencies' is negative ({out:g} s)",
                          "a request's latency is its service time in seconds (>= 0); check the file")
    return out


def _read_bench(text: str, label: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """A ``vllm bench serve --save-result --save-detailed`` result (VLLM_BEHAVIOUR.md 2.1) as a trace of single-turn
    requests: ``start_times`` (the client's ``time.perf_counter()`` seconds at each request's send), ``input_lens``,
    ``output_lens`` and ``latencies`` (the request's service time, when present); every request is its own session
    (the benchmark's prompts share no conversation). Requests its ``errors`` marks failed are left out (the
    benchmark's statistics leave them out too), counted in the notes; requests are replayed in send order (a
    client-side semaphore, ``--max-concurrency``, may send them out of list order: sorted, counted)."""
    try:
        obj, _ = json_loads(text, label)
    except json.JSONDecodeError as exc:
        raise input_error(label, f"is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(obj, dict):
        raise input_error(label, f"is {_short(obj)}, not a vllm bench serve result object")
    missing = [k for k in ("start_times", "input_lens", "output_lens") if k not in obj]
    if missing:
        raise input_error(label, f"has no per-request '{missing[0]}'",
                          "save the benchmark with --save-result --save-detailed (per-request arrays)")
    n = None
    arrays: dict[str, list[Any]] = {}
    for key in ("start_times", "input_lens", "output_lens", "latencies", "errors"):
        v = obj.get(key)
        if v is None and key in ("latencies", "errors"):
            continue
        if not isinstance(v, list):
            raise input_error(label, f"field '{key}' is {_short(v)}, not a list (one entry per request)")
        if n is None:
            n = len(v)
        elif len(v) != n:
            raise input_error(label, f"field '{key}' has {len(v)} entries but 'start_times' has {n}",
                              "every per-request array has one entry per request")
        arrays[key] = v
    if not n:
        raise input_error(label, "holds no request ('start_times' is empty)", "pass a run that sent requests")
    if n > MAX_TRACE_RECORDS:
        raise input_error(label, f"holds {n:,} requests, more than the {MAX_TRACE_RECORDS:,} a run replays",
                          "cut the run before replaying it")
    errors = arrays.get("errors")
    ok = [not e for e in errors] if errors is not None else [True] * n
    ts: list[float] = []
    n_in: list[int] = []
    n_out: list[int] = []
    svc: list[float] = []
    for i in range(n):
        if not ok[i]:
            continue
        where = f"{label}: request {i}"
        ts.append(_number(arrays["start_times"][i], "start_times", where))
        n_in.append(_count(arrays["input_lens"][i], "input_lens", where))
        n_out.append(_count(arrays["output_lens"][i], "output_lens", where))
        svc.append(_latency_s(arrays["latencies"][i] if "latencies" in arrays else None, where))
    if not ts:
        raise input_error(label, f"every one of its {n} requests failed ('errors')", "pass a run with successes")
    t = np.asarray(ts, dtype=float)
    order = np.argsort(t, kind="stable")
    notes: dict[str, Any] = {"failed_requests_left_out": n - len(ts)}
    back = int(np.count_nonzero(np.diff(t) < 0))
    if back:
        notes["requests_out_of_send_order"] = back
        notes["sorted_by"] = "start_times"
    return _link_sessions([f"r{int(i)}" for i in order], t[order], np.asarray(n_in)[order], np.asarray(n_out)[order],
                          np.asarray(svc, dtype=float)[order]), notes


def _read_csv(text: str, label: str) -> pd.DataFrame:
    """Parse the generic CSV (header ``session_id,timestamp_s,input_tokens,output_tokens``)."""
    reader = csv.reader(io.StringIO(text))
    header: list[str] | None = None
    ts: list[float] = []
    lines: list[int] = []
    sess: list[str] = []
    n_in: list[int] = []
    n_out: list[int] = []
    try:
        for row in reader:
            lineno = reader.line_num
            if not row or all(not c.strip() for c in row):
                continue
            where = f"{label}: line {lineno}"
            if header is None:
                header = [c.strip() for c in row]
                if tuple(header) != CSV_HEADER:
                    raise input_error(
                        where,
                        f"header is {','.join(header)[:80]!r}",
                        f"the first line must be exactly {','.join(CSV_HEADER)}",
                    )
                continue
            if len(row) != len(CSV_HEADER):
                raise input_error(
                    where, f"has {len(row)} fields, expected {len(CSV_HEADER)} ({','.join(CSV_HEADER)})"
                )
            sid = row[0].strip()
            if not sid:
                raise input_error(where, "field 'session_id' is empty")
            sess.append(sid)
            ts.append(_number(row[1], "timestamp_s", where, allow_string=True))
            n_in.append(_count(row[2], "input_tokens", where, allow_string=True))
            n_out.append(_count(row[3], "output_tokens", where, allow_string=True))
            lines.append(lineno)
    except csv.Error as exc:
        raise input_error(f"{label}: line {reader.line_num}", f"malformed CSV ({exc})") from None
    if header is None or not ts:
        raise _no_records(label, header_only=header is not None)
    _check_sorted(ts, lines, label, "timestamp_s", "s")
    return _link_sessions(sess, np.asarray(ts), np.asarray(n_in), np.asarray(n_out))


def _csv_records(text: str, label: str, header: tuple[str, ...]) -> Iterator[tuple[int, list[str]]]:
    """``(line number, fields)`` of every data row of a CSV whose first line must be exactly ``header``."""
    reader = csv.reader(io.StringIO(text))
    seen = False
    try:
        for row in reader:
            if not row or all(not c.strip() for c in row):
                continue
            where = f"{label}: line {reader.line_num}"
            if not seen:
                if tuple(c.strip() for c in row) != header:
                    raise input_error(where, f"header is {','.join(row)[:80]!r}",
                                      f"the first line must be exactly {','.join(header)}")
                seen = True
                continue
            if len(row) != len(header):
                raise input_error(where, f"has {len(row)} fields, expected {len(header)} ({','.join(header)})")
            yield reader.line_num, [c.strip() for c in row]
    except csv.Error as exc:
        raise input_error(f"{label}: line {reader.line_num}", f"malformed CSV ({exc})") from None


def _azure_time_s(text: str, where: str) -> float:
    """``2023-11-16 18:17:03.9799600`` (UTC, 7 fractional digits) as POSIX seconds."""
    import datetime as _dt

    head, _, frac = text.partition(".")
    try:
        t = _dt.datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=_dt.UTC)
        if frac and not (frac.isascii() and frac.isdigit()):  # float('0.5e9') would add 5e8 s to the second
            raise ValueError(frac)
        f = float("0." + frac) if frac else 0.0
    except ValueError:
        raise input_error(where, f"field 'TIMESTAMP' is {_short(text)}, not 'YYYY-MM-DD HH:MM:SS.fffffff'") from None
    return t.timestamp() + f


def _read_azure(text: str, label: str) -> pd.DataFrame:
    """Azure LLM inference trace 2023: one request per row, no conversations (every request is its own session)."""
    ts: list[float] = []
    lines: list[int] = []
    shown: list[str] = []
    n_in: list[int] = []
    n_out: list[int] = []
    for lineno, row in _csv_records(text, label, AZURE_HEADER):
        where = f"{label}: line {lineno}"
        ts.append(_azure_time_s(row[0], where))
        lines.append(lineno)
        shown.append(row[0])
        n_in.append(_count(row[1], "ContextTokens", where, allow_string=True))
        n_out.append(_count(row[2], "GeneratedTokens", where, allow_string=True))
    if not ts:
        raise _no_records(label, header_only=bool(text.strip()))
    # refused like the CSV and Mooncake formats (the published Azure traces are sorted): a request out of order
    # is more likely a damaged or concatenated file than something to reorder silently
    _check_sorted(ts, lines, label, "TIMESTAMP", "", shown)
    return _link_sessions([str(i) for i in range(len(ts))], np.asarray(ts), np.asarray(n_in), np.asarray(n_out))


def _read_lmbench(text: str, label: str) -> tuple[pd.DataFrame, dict[str, Any]]:
    """LMBench multi-round QA output: sessions by ``user_id``, arrival ``launch_time`` (epoch s), service
    ``finish_time - launch_time`` (measured).

    The benchmark writes a row when its request finishes, so ``launch_time`` is not sorted in its files (the
    published llm-d runs: 16 of 52 rows earlier than the row before): the rows are sorted by arrival, and the
    rows earlier than the one before them are counted in ``Trace.notes["rows_out_of_order"]`` (with the
    first one's line), which the trace report of a replay repeats."""
    ts: list[float] = []
    lines: list[int] = []
    sess: list[str] = []
    n_in: list[int] = []
    n_out: list[int] = []
    svc: list[float] = []
    for lineno, row in _csv_records(text, label, LMBENCH_HEADER):
        where = f"{label}: line {lineno}"
        lines.append(lineno)
        n_in.append(_count(row[0], "prompt_tokens", where, allow_string=True))
        n_out.append(_count(row[1], "generation_tokens", where, allow_string=True))
        if not row[4]:
            raise input_error(where, "field 'user_id' is empty")
        sess.append(row[4])
        t0 = _number(row[6], "launch_time", where, allow_string=True)
        t1 = _number(row[7], "finish_time", where, allow_string=True)
        ts.append(t0)
        svc.append(t1 - t0 if t1 >= t0 else math.nan)
    if not ts:
        raise _no_records(label, header_only=bool(text.strip()))
    back = np.flatnonzero(np.diff(np.asarray(ts, dtype=float)) < 0) + 1
    notes: dict[str, Any] = {}
    if back.size:  # only when it happened: a sorted file's trace (and replay report) is unchanged
        notes = {"rows_out_of_order": int(back.size), "first_out_of_order_line": lines[int(back[0])],
                 "sorted_by": "launch_time"}
    return _link_sessions(sess, np.asarray(ts), np.asarray(n_in), np.asarray(n_out), np.asarray(svc)), notes


def detect_trace_format(path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES) -> TraceFormat:
    """Guess the format of a trace file from its first record (see the module docstring)."""
    label = os.fspath(path)
    if os.path.isdir(path):
        return "weka"  # a folder of kv-cache-tester traces (the only format read from a directory)
    check_file(path, max_bytes)
    with open(path, "rb") as fh:
        raw = fh.read(HEAD_BYTES)
    # compressed, binary (NUL) or not UTF-8: said as such, not as an unknown format quoting mojibake
    head = decode_head(raw, label, complete=len(raw) < HEAD_BYTES)
    stripped = head.lstrip()
    if stripped.startswith("["):
        return "multiturn"
    first = stripped.split("\n", 1)[0].strip()
    if first.startswith("{"):
        try:
            obj, _ = json_loads(first, label)
        except (json.JSONDecodeError, KvplanInputError):
            obj = None
        if isinstance(obj, dict):
            if {"start_times", "input_lens", "output_lens"} <= obj.keys():  # vllm bench serve --save-detailed
                return "bench"
            if "session_id" in obj and "timestamp" in obj:
                return "ragpulse"
            if {"timestamp", "input_length", "hash_ids"} <= obj.keys():
                return "mooncake"
        if _looks_weka(stripped):
            return "weka"
        if _looks_bench(stripped):
            return "bench"
    else:
        header = tuple(c.strip() for c in first.split(","))
        known: dict[tuple[str, ...], TraceFormat] = {CSV_HEADER: "csv", AZURE_HEADER: "azure", LMBENCH_HEADER: "lmbench"}
        if header in known:
            return known[header]
    raise input_error(
        label,
        f"cannot tell the trace format from the first record {first[:60]!r}",
        "expected a CSV with the header " + ",".join(CSV_HEADER) + " (or Azure's " + ",".join(AZURE_HEADER)
        + ", or LMBench's " + ",".join(LMBENCH_HEADER[:2]) + ",...), Mooncake JSONL (timestamp, input_length, "
        "output_length, hash_ids), RAGPulse JSONL (with session_id) or a multi-turn stats JSON array; or set "
        "the format (a scenario's workload.trace.format; --format of `kvplan workload show/fit`)",
    )


def _looks_weka(head: str) -> bool:
    """A kv-cache-tester trace: one JSON object (often one long line) with a ``requests`` list of hashed requests."""
    return '"requests"' in head and ('"hash_ids"' in head or '"block_size"' in head)


def _looks_bench(head: str) -> bool:
    """A ``vllm bench serve`` result: one JSON object whose header keys (written before the per-request arrays)
    include the run's aggregates."""
    return '"completed"' in head and ('"request_throughput"' in head or '"input_lens"' in head)


def check_record_count(text: str, label: str, fmt: str) -> None:
    """Refuse, before any record is parsed, a trace with more records than a run replays
    (:data:`MAX_TRACE_RECORDS`): its lines are counted (a multi-turn JSON array: its objects), which costs
    one pass over the text, so a 100 MB file of 12 million one-token requests is refused in a fraction of a
    second instead of being built into frames that need gigabytes."""
    if fmt == "bench":  # one JSON object of per-request arrays: counted when parsed (_read_bench)
        return
    n = text.count("{") if fmt == "multiturn" else text.count("\n") + (not text.endswith("\n"))
    if n > MAX_TRACE_RECORDS + 1:  # + a CSV header
        unit = "objects" if fmt == "multiturn" else "lines"
        raise input_error(label, f"holds {n:,} {unit}, more than the {MAX_TRACE_RECORDS:,} requests a run replays",
                          "cut the trace (a time window or a sample of its sessions) before replaying it")


def load_trace(
    path: str | os.PathLike[str],
    format: TraceFormat | str | None = None,  # noqa: A002 - the documented name of the argument; checked below
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    min_blocks: int = DEFAULT_MIN_BLOCKS,
    on_clock_restart: Literal["sort", "append"] = "sort",
) -> Trace:
    """Read a request trace (``format`` one of :data:`TRACE_FORMATS`, or None to detect it).

    ``min_blocks`` applies to Mooncake linking, ``on_clock_restart`` to RAGPulse (module docstring).
    Files above ``max_bytes`` (default 256 MiB) are refused before reading. Raises
    :class:`~kvplan.errors.KvplanInputError` with a one-line message naming file, line and field.
    """
    label = os.fspath(path)
    fmt = format if format is not None else detect_trace_format(path, max_bytes)
    if fmt not in TRACE_FORMATS:
        raise input_error(label, f"unknown trace format {fmt!r}", f"use one of {', '.join(TRACE_FORMATS)}")
    if on_clock_restart not in ("sort", "append"):
        raise input_error(label, f"on_clock_restart is {on_clock_restart!r}", "use 'sort' or 'append'")
    if fmt == "weka":
        from kvplan.traces.weka import read_weka, to_trace

        return to_trace(read_weka(path, max_bytes))
    text, digest = _read_source(path, max_bytes)
    check_record_count(text, label, fmt)
    linking: dict[str, Any] | None = None
    notes: dict[str, Any] = {}
    if fmt == "mooncake":
        df, linking = _read_mooncake(text, label, min_blocks)
    elif fmt == "ragpulse":
        df, notes = _read_ragpulse(text, label, on_clock_restart)
    elif fmt == "multiturn":
        df = _read_multiturn(text, label)
    elif fmt == "azure":
        df = _read_azure(text, label)
    elif fmt == "lmbench":
        df, notes = _read_lmbench(text, label)
    elif fmt == "bench":
        df, notes = _read_bench(text, label)
    else:
        df = _read_csv(text, label)
    return Trace(requests=df, source=label, format=fmt, sha256=digest, linking=linking, notes=notes)
