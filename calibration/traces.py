"""Real production request traces: readers, conversation reconstruction, replay selection, statistics.

Every reader returns a :class:`Trace`: a frozen wrapper around a pandas frame with one row per request,
sorted by arrival, with the columns

=====================  =======================================================================================
``request_id``         int, 0-based position of the record in the file (file order, blank lines skipped)
``session_id``         str, the conversation (Mooncake: ``request_id`` of the first visible request)
``turn``               int, 1-based position in the conversation (Mooncake: depth in the prefix chain)
``arrival_s``          float, arrival on the trace's own clock, rebased so the first request is at 0
``input_tokens``       int, prompt tokens of the request (the whole resent context)
``output_tokens``      int, generated tokens
``parent_request_id``  int, ``request_id`` of the previous turn, -1 when none
``service_s``          float, measured service time (request start to last token) when the trace has it
                       (vLLM multi-turn ``latency_ms``), otherwise NaN
``linkable``           bool, whether a follow-up of this request could be seen at all (Mooncake: it has at
                       least ``min_blocks`` full blocks; session-id formats: always True)
=====================  =======================================================================================

plus the source path, the format, the sha256 of the bytes read and, for Mooncake, the linking statistics.

Formats (``format=`` of :func:`load_trace`; :func:`detect_trace_format` guesses it from the first line):

``mooncake``
    Mooncake FAST'25 JSONL (kvcache-ai/Mooncake ``FAST25-release/traces``): one object per line with
    ``timestamp`` (integer milliseconds from trace start), ``input_length``, ``output_length`` and
    ``hash_ids``, one id per 512-token block of the prompt, chained: the same id at position *k* means the
    whole prefix up to block *k* is identical. Rules checked on every line: timestamps are non-decreasing in
    file order, lengths are non-negative whole numbers, and ``len(hash_ids) == ceil(input_length / 512)``
    exactly (the last, partial block has an id too).
``multiturn``
    The per-request stats JSON of vLLM's ``benchmarks/multi_turn/benchmark_serving_multi_turn.py
    --stats-json-output``: an array of objects with ``conversation_id``, ``start_time_ms``
    (``time.perf_counter`` in ms, so only differences mean anything), ``input_num_tokens``,
    ``output_num_tokens`` and ``input_num_turns`` (older versions: ``session_id`` instead of
    ``conversation_id``); ``latency_ms`` when present becomes ``service_s``.
    The file is in per-client completion order, so it is sorted (stably) by ``start_time_ms``.
``ragpulse``
    RAGPulse ``0_trace.jsonl`` (flashserve/RAGPulse): ``timestamp`` (a string or number of whole seconds),
    ``input_length``, ``output_length``, ``session_id``; ``hash_ids`` is not read. Timestamps are not
    sorted in the published file, which is sorted stably here (``on_clock_restart="sort"``, as its
    SOURCE.md says). Note: the published file is two consecutive weeks, each counted from 0 (line 3,801
    goes back from 604,453 s to 0; the epoch prefixes of the session ids put the second part 604,800 s
    later), so sorting overlays the two weeks and doubles the apparent arrival rate.
    ``on_clock_restart="append"`` instead starts a new clock segment at every backwards step of more than
    ``CLOCK_RESTART_S`` and appends it after the previous segment's last arrival (a lower bound on the
    true offset). The restarts found are listed in ``Trace.notes["clock_restarts"]`` either way.
``csv``
    A generic CSV whose header is exactly ``session_id,timestamp_s,input_tokens,output_tokens``: one
    request per row, timestamps in seconds (any origin, non-decreasing in file order), whole-number token
    counts. Consecutive requests of a session (by arrival) are consecutive turns.

Every problem raises :class:`kvplan.errors.KvplanInputError` with a one-line message naming the file, the
line and the field: a file above ``max_bytes`` (refused from ``stat`` before reading), an empty file, a
line that is not JSON, a missing field, a negative / NaN / fractional count, a wrong ``hash_ids`` length,
timestamps going backwards (Mooncake, CSV).

Mooncake conversation reconstruction (no session id is published). Request B is taken as the next turn of
an earlier request A (earlier in file order, so A arrives no later than B) when A's *full* 512-token blocks,
``input_length // 512`` of them and at least ``min_blocks`` (default 2), are a prefix of B's ``hash_ids``.
Among candidates the deepest match wins and, at equal depth, the latest A. A's partial last block is left
out because its hash changes once the answer and the next user message are appended; requiring two full
blocks avoids linking every request through the shared first block (id 0 in the conversation trace).
Implementation: an exact prefix trie, a dict ``(parent node, block id) -> node`` grown as the file is read,
and a dict ``node -> latest request whose full blocks end there``; each request walks its own path once,
so the cost is linear in the number of block ids (12,031 requests in well under a second). Limits, all
inherited from the data: turns whose context is under ``512 * min_blocks`` = 1,024 tokens can neither be
linked as a parent nor (if the child is that short) as a child, and show up as one-request sessions; the
one-hour window censors gaps above ~30 min and cuts sessions at both ends (a session that began before
the window starts at "turn 1"); a regenerate or an edit gives a parent two children (28 of 3,932 parents
in the conversation trace); a trimmed or edited context breaks the chain; and the trace is *sampled*
("prioritising requests within the same user session", paper appendix A), so follow-up probabilities are
lower bounds. On ``conversation_trace.jsonl`` this links 3,975 of 12,031 requests into 8,056 sessions.

Statistics (:func:`workload_stats`). Gaps are measured **arrival to arrival** between a request and its
parent, so they include the parent's own prefill, decode and queueing time; the *idle* gap (end of the
response to the next arrival, what a decode-side TTL must cover) is estimated as that gap minus the
parent's service time, measured when the trace has it (``service_s``) or from ``service_time_fn``.
Follow-up probabilities are censored: a request counts only if it is ``linkable`` and arrived at least
``followup_horizon_s`` (default ``max(ttls_s)``) before the last arrival, so that every follow-up within
the horizon would be visible. WORKLOADS.md uses a 2,340 s horizon (parents in the first 20 minutes of the
39-minute Mooncake trace); pass ``followup_horizon_s=2340`` to reproduce it.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import logging
import math
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, cast, get_args

import numpy as np
import pandas as pd

from kvplan.calibration.parse_common import DEFAULT_MAX_BYTES, _short, check_file
from kvplan.errors import input_error

log = logging.getLogger(__name__)

TraceFormat = Literal["mooncake", "multiturn", "ragpulse", "csv", "azure", "lmbench"]
TRACE_FORMATS: tuple[str, ...] = get_args(TraceFormat)

#: Tokens per Mooncake hash block (FAST'25 traces).
MOONCAKE_BLOCK_TOKENS = 512
#: Minimum number of the parent's full blocks that must match before two Mooncake requests are linked.
DEFAULT_MIN_BLOCKS = 2
#: Exact header of the generic CSV format.
CSV_HEADER: tuple[str, ...] = ("session_id", "timestamp_s", "input_tokens", "output_tokens")
#: Header of the Azure LLM inference trace 2023 (Azure/AzurePublicDataset, AzureLLMInferenceTrace_*.csv).
AZURE_HEADER: tuple[str, ...] = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
#: Header of LMCache's LMBench multi-round QA per-request output (LMCache/LMBenchmark multi-round-qa.py).
LMBENCH_HEADER: tuple[str, ...] = (
    "prompt_tokens", "generation_tokens", "ttft", "generation_time", "user_id", "question_id", "launch_time",
    "finish_time",
)
#: Columns of :attr:`Trace.requests`, in order.
COLUMNS: tuple[str, ...] = (
    "request_id",
    "session_id",
    "turn",
    "arrival_s",
    "input_tokens",
    "output_tokens",
    "parent_request_id",
    "service_s",
    "linkable",
)
#: A backwards step of the clock larger than this (seconds) is a restart of the clock (RAGPulse).
CLOCK_RESTART_S = 3600.0
#: TTLs at which follow-up probabilities and the gap CDF are reported (seconds).
DEFAULT_TTLS_S: tuple[float, ...] = (30, 60, 120, 300, 480, 600, 900)
#: Percentiles reported for gaps and token counts.
PERCENTILES: tuple[int, ...] = (10, 25, 50, 75, 90, 95, 99)
#: Turn indices at which the context size is reported.
CONTEXT_TURNS: tuple[int, ...] = (1, 2, 3, 5, 10)
#: Crude service-time estimate (WORKLOADS.md 3.1, illustrative): prefill at this many tokens per second ...
CRUDE_PREFILL_TOKENS_PER_S = 8000.0
#: ... plus this many seconds per generated token (25 tokens/s decode).
CRUDE_DECODE_S_PER_TOKEN = 0.040

#: ``service_time_fn(input_tokens, output_tokens) -> seconds``; called with int64 arrays, must broadcast.
ServiceTimeFn = Callable[[np.ndarray, np.ndarray], Any]

_WS = re.compile(r"[ \t\n\r]*")


def crude_service_time_s(input_tokens: Any, output_tokens: Any) -> Any:
    """Crude service time of a request, ``input / 8000 + 0.040 * output`` seconds (arrays broadcast).

    The illustrative estimate of WORKLOADS.md 3.1 (prefill ~8k tokens/s, decode ~25 tokens/s, no
    queueing): median ~15 s on the Mooncake conversation trace. Use a measured or profiled function
    whenever one is available.
    """
    return np.asarray(input_tokens, dtype=float) / CRUDE_PREFILL_TOKENS_PER_S + CRUDE_DECODE_S_PER_TOKEN * (
        np.asarray(output_tokens, dtype=float)
    )


@dataclass(frozen=True, eq=False)
class Trace:
    """One request trace: ``requests`` (one row per request, sorted by arrival, columns :data:`COLUMNS`).

    ``source`` is the path read, ``format`` one of :data:`TRACE_FORMATS`, ``sha256`` the digest of the
    bytes read, ``linking`` the Mooncake reconstruction statistics (None for session-id formats) and
    ``notes`` anything else the reader or :func:`select` recorded. Treat the frame as read-only:
    :func:`select` returns a new trace.
    """

    requests: pd.DataFrame
    source: str
    format: str
    sha256: str
    linking: Mapping[str, Any] | None = None
    notes: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Check that the frame has the expected columns."""
        missing = [c for c in COLUMNS if c not in self.requests.columns]
        if missing:
            raise input_error(
                f"trace {self.source}", f"frame lacks columns {missing}", f"give {list(COLUMNS)}"
            )

    @property
    def n_requests(self) -> int:
        """Number of requests."""
        return len(self.requests)

    @property
    def n_sessions(self) -> int:
        """Number of distinct sessions (conversations)."""
        return int(self.requests["session_id"].nunique())

    @property
    def duration_s(self) -> float:
        """Time from the first to the last arrival (seconds)."""
        arr = self.requests["arrival_s"].to_numpy(dtype=float)
        return float(arr.max() - arr.min()) if arr.size else 0.0


# --- reading ------------------------------------------------------------------------------------------------


def _read_source(path: str | os.PathLike[str], max_bytes: int) -> tuple[str, str]:
    """Return ``(text, sha256)`` of a UTF-8 file of at most ``max_bytes`` (refused from ``stat`` first)."""
    where = os.fspath(path)
    check_file(path, max_bytes)
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise input_error(where, f"cannot read the file ({exc.strerror})") from None
    if len(data) > max_bytes:
        raise input_error(where, f"file grew above max_bytes={max_bytes} while being read", "raise max_bytes")
    digest = hashlib.sha256(data).hexdigest()
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise input_error(
            f"{where}: line {line}", f"byte {exc.start} is not valid UTF-8", "save as UTF-8"
        ) from None
    return text, digest


def _get(obj: Mapping[str, Any], name: str, where: str) -> Any:
    """Return ``obj[name]`` or raise a 'missing field' error."""
    if name not in obj:
        raise input_error(where, f"missing field '{name}'", f"every record needs '{name}'")
    return obj[name]


def _number(value: Any, name: str, where: str, *, allow_string: bool = False) -> float:
    """A finite number (JSON number, or a numeric string when ``allow_string``)."""
    if allow_string and isinstance(value, str):
        try:
            out = float(value.strip())
        except ValueError:
            raise input_error(where, f"field '{name}' is {_short(value)}, not a number") from None
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise input_error(where, f"field '{name}' is {_short(value)}, not a number")
    else:
        out = float(value)
    if not math.isfinite(out):
        raise input_error(where, f"field '{name}' is {out}: NaN/Infinity is not a valid value")
    return out


MAX_COUNT = 1e9  # tokens or turns of one request: far above any context limit, and int64-safe


def _count(value: Any, name: str, where: str, *, minimum: int = 0, allow_string: bool = False) -> int:
    """A whole, finite count of at least ``minimum`` (token counts, turns)."""
    out = _number(value, name, where, allow_string=allow_string)
    if out < 0 and minimum >= 0:
        raise input_error(where, f"field '{name}' is negative ({out:g})", "counts must be >= 0")
    if out != math.floor(out):
        raise input_error(where, f"field '{name}' is {out:g}, not a whole number")
    if out < minimum:
        raise input_error(where, f"field '{name}' is {out:g}, must be at least {minimum}")
    if out > MAX_COUNT:
        raise input_error(where, f"field '{name}' is {out:g}, more than {MAX_COUNT:g}", "check the column's units")
    return int(out)


def _json_lines(text: str, label: str) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line number, object)`` for every non-blank line of a JSONL text."""
    for lineno, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line:
            continue
        where = f"{label}: line {lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise input_error(
                where, f"not valid JSON ({exc.msg} at column {exc.colno})", "one JSON object per line"
            ) from None
        except RecursionError:
            raise input_error(where, "JSON nested too deeply") from None
        if not isinstance(obj, dict):
            raise input_error(where, f"is {_short(obj)}, not a JSON object", "one JSON object per line")
        yield lineno, obj


def _json_array(text: str, label: str) -> list[tuple[int, Any]]:
    """Parse a JSON array, returning ``(line where the entry starts, entry)`` for every entry."""
    dec = json.JSONDecoder()
    pos = _WS.match(text, 0).end()  # type: ignore[union-attr]
    if pos >= len(text) or text[pos] != "[":
        line = text.count("\n", 0, pos) + 1
        raise input_error(
            f"{label}: line {line}", "expected a JSON array of request objects", "pass the stats JSON"
        )
    pos += 1
    line, counted = 1 + text.count("\n", 0, pos), pos
    out: list[tuple[int, Any]] = []
    while True:
        pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
        line += text.count("\n", counted, pos)
        counted = pos
        if pos < len(text) and text[pos] == "]" and not out:
            pos += 1
            break
        try:
            obj, end = dec.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise input_error(
                f"{label}: line {exc.lineno}", f"not valid JSON ({exc.msg} at column {exc.colno})"
            ) from None
        except RecursionError:
            raise input_error(f"{label}: line {line}", "JSON nested too deeply") from None
        out.append((line, obj))
        pos = _WS.match(text, end).end()  # type: ignore[union-attr]
        if pos < len(text) and text[pos] == ",":
            pos += 1
            continue
        if pos < len(text) and text[pos] == "]":
            pos += 1
            break
        line_end = text.count("\n", 0, pos) + 1
        raise input_error(
            f"{label}: line {line_end}", "expected ',' or ']' in the JSON array", "the file looks truncated"
        )
    pos = _WS.match(text, pos).end()  # type: ignore[union-attr]
    if pos < len(text):
        raise input_error(
            f"{label}: line {text.count(chr(10), 0, pos) + 1}", "extra data after the JSON array"
        )
    return out


def _check_sorted(times: list[float], lines: list[int], label: str, name: str, unit: str) -> None:
    """Raise on the first timestamp that is earlier than the one before it (file order)."""
    arr = np.asarray(times, dtype=float)
    if arr.size < 2:
        return
    bad = np.flatnonzero(np.diff(arr) < 0)
    if bad.size:
        i = int(bad[0]) + 1
        raise input_error(
            f"{label}: line {lines[i]}",
            f"field '{name}' is {arr[i]:g} {unit}, earlier than {arr[i - 1]:g} {unit} on line {lines[i - 1]}",
            "the trace must be sorted by arrival (non-decreasing timestamps); sort it first",
        )


# --- conversation linking -----------------------------------------------------------------------------------


def link_prefix_chains(
    hash_ids: Sequence[Sequence[int]],
    input_tokens: Sequence[int],
    *,
    min_blocks: int = DEFAULT_MIN_BLOCKS,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
) -> np.ndarray:
    """Parent index of every request (-1 when none) from chained block hashes, in file order.

    B's parent is the earlier request A whose full blocks (``input_tokens[A] // block_tokens``, at least
    ``min_blocks``) are a prefix of ``hash_ids[B]``: the deepest such A, and the latest among equally deep
    ones. Exact (a prefix trie, no hashing of prefixes), linear in the total number of block ids.
    """
    if min_blocks < 1:
        raise input_error("link_prefix_chains: min_blocks", f"is {min_blocks}, must be >= 1")
    trie: dict[tuple[int, int], int] = {}
    latest: dict[int, int] = {}  # trie node -> latest request whose full blocks end at that node
    parents = np.full(len(hash_ids), -1, dtype=np.int64)
    for b, (ids, n_in) in enumerate(zip(hash_ids, input_tokens, strict=True)):
        full = int(n_in) // block_tokens
        node, best, own = 0, -1, -1
        for depth, block in enumerate(ids, start=1):
            key = (node, block)
            nxt = trie.get(key)
            if nxt is None:
                nxt = len(trie) + 1  # node 0 is the root
                trie[key] = nxt
            node = nxt
            if depth >= min_blocks:
                cand = latest.get(node)
                if cand is not None:
                    best = cand  # deeper matches overwrite shallower ones
            if depth == full:
                own = node
        parents[b] = best
        if full >= min_blocks and own > 0:
            latest[own] = b  # registered after the lookup: a request is never its own parent
    return parents


def _chains(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Root index and depth (1-based turn) of every request; parents must precede their children."""
    n = len(parents)
    root = np.arange(n, dtype=np.int64)
    turn = np.ones(n, dtype=np.int64)
    par = parents.tolist()
    root_l, turn_l = root.tolist(), turn.tolist()
    for i, p in enumerate(par):
        if p >= 0:
            root_l[i] = root_l[p]
            turn_l[i] = turn_l[p] + 1
    return np.asarray(root_l, dtype=np.int64), np.asarray(turn_l, dtype=np.int64)


def _frame(
    request_id: np.ndarray,
    session_id: Sequence[str],
    turn: np.ndarray,
    arrival_s: np.ndarray,
    input_tokens: np.ndarray,
    output_tokens: np.ndarray,
    parent: np.ndarray,
    service_s: np.ndarray,
    linkable: np.ndarray,
) -> pd.DataFrame:
    """Assemble the request frame with the documented column order and dtypes."""
    return pd.DataFrame(
        {
            "request_id": np.asarray(request_id, dtype=np.int64),
            "session_id": pd.Series(list(session_id), dtype=str),
            "turn": np.asarray(turn, dtype=np.int64),
            "arrival_s": np.asarray(arrival_s, dtype=float),
            "input_tokens": np.asarray(input_tokens, dtype=np.int64),
            "output_tokens": np.asarray(output_tokens, dtype=np.int64),
            "parent_request_id": np.asarray(parent, dtype=np.int64),
            "service_s": np.asarray(service_s, dtype=float),
            "linkable": np.asarray(linkable, dtype=bool),
        },
        columns=list(COLUMNS),
    )


def _link_sessions(
    session: Sequence[str],
    arrival_s: np.ndarray,
    input_tokens: np.ndarray,
    output_tokens: np.ndarray,
    service_s: np.ndarray | None = None,
) -> pd.DataFrame:
    """Frame for session-id formats: stable sort by arrival, consecutive requests of a session are turns."""
    n = len(session)
    arrival = np.asarray(arrival_s, dtype=float)
    order = np.argsort(arrival, kind="stable")
    ids = np.arange(n, dtype=np.int64)[order]
    sess = pd.Series(np.asarray(session, dtype=object)[order], dtype=str)
    grouped = pd.Series(ids).groupby(sess.to_numpy(), sort=False)
    turn = grouped.cumcount().to_numpy() + 1
    parent = grouped.shift(1).fillna(-1).to_numpy().astype(np.int64)
    svc = np.full(n, np.nan) if service_s is None else np.asarray(service_s, dtype=float)[order]
    arr = arrival[order]
    return _frame(
        ids,
        sess.tolist(),
        turn,
        arr - (arr[0] if n else 0.0),
        np.asarray(input_tokens)[order],
        np.asarray(output_tokens)[order],
        parent,
        svc,
        np.ones(n, dtype=bool),
    )


def _no_records(label: str) -> Exception:
    return input_error(label, "no requests found (only blank lines)", "pass a non-empty trace")


def _read_mooncake(text: str, label: str, min_blocks: int) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Parse and validate Mooncake JSONL, then reconstruct conversations (module docstring)."""
    ts: list[float] = []
    lines: list[int] = []
    n_in: list[int] = []
    n_out: list[int] = []
    hashes: list[list[int]] = []
    for lineno, obj in _json_lines(text, label):
        where = f"{label}: line {lineno}"
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
    children = np.bincount(parents[parents >= 0], minlength=len(ts))
    sizes = np.bincount(np.unique(root, return_inverse=True)[1])
    linking = {
        "method": "hash-prefix chains: parent's full 512-token blocks are a prefix of the child's hash_ids; "
        "deepest match, then latest parent",
        "block_tokens": MOONCAKE_BLOCK_TOKENS,
        "min_blocks": min_blocks,
        "requests": len(ts),
        "linked_requests": int((parents >= 0).sum()),
        "sessions": int(sizes.size),
        "sessions_with_2plus_requests": int((sizes >= 2).sum()),
        "share_requests_in_multi_request_sessions": float(sizes[sizes >= 2].sum() / len(ts)),
        "parents": int((children > 0).sum()),
        "parents_with_2plus_children": int((children > 1).sum()),
        "unlinkable_as_parent": int((~linkable).sum()),
        "max_turn": int(turn.max()),
    }
    return df, linking


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
        log.warning(
            "%s: the clock goes back by more than %.0f s at line(s) %s; on_clock_restart=%r",
            label,
            CLOCK_RESTART_S,
            restarts,
            on_clock_restart,
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
        raise _no_records(label)
    _check_sorted(ts, lines, label, "timestamp_s", "s")
    return _link_sessions(sess, np.asarray(ts), np.asarray(n_in), np.asarray(n_out))


def _csv_records(text: str, label: str, header: tuple[str, ...]) -> Iterator[tuple[str, list[str]]]:
    """``(where, fields)`` of every data row of a CSV whose first line must be exactly ``header``."""
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
            yield where, [c.strip() for c in row]
    except csv.Error as exc:
        raise input_error(f"{label}: line {reader.line_num}", f"malformed CSV ({exc})") from None


def _azure_time_s(text: str, where: str) -> float:
    """``2023-11-16 18:17:03.9799600`` (UTC, 7 fractional digits) as POSIX seconds."""
    import datetime as _dt

    head, _, frac = text.partition(".")
    try:
        t = _dt.datetime.strptime(head, "%Y-%m-%d %H:%M:%S").replace(tzinfo=_dt.UTC)
        f = float("0." + frac) if frac else 0.0
    except ValueError:
        raise input_error(where, f"field 'TIMESTAMP' is {_short(text)}, not 'YYYY-MM-DD HH:MM:SS.fffffff'") from None
    return t.timestamp() + f


def _read_azure(text: str, label: str) -> pd.DataFrame:
    """Azure LLM inference trace 2023: one request per row, no conversations (every request is its own session)."""
    ts: list[float] = []
    n_in: list[int] = []
    n_out: list[int] = []
    for where, row in _csv_records(text, label, AZURE_HEADER):
        ts.append(_azure_time_s(row[0], where))
        n_in.append(_count(row[1], "ContextTokens", where, allow_string=True))
        n_out.append(_count(row[2], "GeneratedTokens", where, allow_string=True))
    if not ts:
        raise _no_records(label)
    return _link_sessions([str(i) for i in range(len(ts))], np.asarray(ts), np.asarray(n_in), np.asarray(n_out))


def _read_lmbench(text: str, label: str) -> pd.DataFrame:
    """LMBench multi-round QA output: sessions by ``user_id``, arrival ``launch_time`` (epoch s), service
    ``finish_time - launch_time`` (measured)."""
    ts: list[float] = []
    sess: list[str] = []
    n_in: list[int] = []
    n_out: list[int] = []
    svc: list[float] = []
    for where, row in _csv_records(text, label, LMBENCH_HEADER):
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
        raise _no_records(label)
    return _link_sessions(sess, np.asarray(ts), np.asarray(n_in), np.asarray(n_out), np.asarray(svc))


def detect_trace_format(path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES) -> TraceFormat:
    """Guess the format of a trace file from its first record (see the module docstring)."""
    label = os.fspath(path)
    check_file(path, max_bytes)
    with open(path, "rb") as fh:
        head = fh.read(65536).decode("utf-8-sig", errors="replace")
    stripped = head.lstrip()
    if stripped.startswith("["):
        return "multiturn"
    first = stripped.split("\n", 1)[0].strip()
    if first.startswith("{"):
        try:
            obj = json.loads(first)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            if "session_id" in obj and "timestamp" in obj:
                return "ragpulse"
            if {"timestamp", "input_length", "hash_ids"} <= obj.keys():
                return "mooncake"
    elif tuple(c.strip() for c in first.split(",")) == CSV_HEADER:
        return "csv"
    elif tuple(c.strip() for c in first.split(",")) == AZURE_HEADER:
        return "azure"
    elif tuple(c.strip() for c in first.split(",")) == LMBENCH_HEADER:
        return "lmbench"
    raise input_error(
        label,
        f"cannot tell the trace format from the first record {first[:60]!r}",
        "expected a CSV with the header " + ",".join(CSV_HEADER) + " (or Azure's " + ",".join(AZURE_HEADER)
        + ", or LMBench's " + ",".join(LMBENCH_HEADER[:2]) + ",...), Mooncake JSONL (timestamp, input_length, "
        "output_length, hash_ids), RAGPulse JSONL (with session_id) or a multi-turn stats JSON array; or set "
        "the format (workload.trace.format, --format)",
    )


def load_trace(
    path: str | os.PathLike[str],
    format: TraceFormat | None = None,  # noqa: A002 - the documented name of the argument
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
    text, digest = _read_source(path, max_bytes)
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
        df = _read_lmbench(text, label)
    else:
        df = _read_csv(text, label)
    return Trace(requests=df, source=label, format=fmt, sha256=digest, linking=linking, notes=notes)


def trace_from_sessions(
    session_id: Sequence[Any],
    arrival_s: Sequence[float] | np.ndarray,
    input_tokens: Sequence[int] | np.ndarray,
    output_tokens: Sequence[int] | np.ndarray,
    *,
    source: str = "<memory>",
) -> Trace:
    """Build a :class:`Trace` from in-memory columns (session-id linking, as for the CSV format).

    For synthetic traces and tests; ``sha256`` is the digest of the equivalent CSV text.
    """
    n = len(session_id)
    if not (len(arrival_s) == len(input_tokens) == len(output_tokens) == n) or n == 0:
        raise input_error(source, "columns must be non-empty and of equal length")
    arr = np.asarray(arrival_s, dtype=float)
    n_in = np.asarray(input_tokens, dtype=np.int64)
    n_out = np.asarray(output_tokens, dtype=np.int64)
    if not np.isfinite(arr).all() or (n_in < 0).any() or (n_out < 0).any():
        raise input_error(source, "arrivals must be finite and token counts >= 0")
    sess = [str(s) for s in session_id]
    buf = io.StringIO()
    buf.write(",".join(CSV_HEADER) + "\n")
    for row in zip(sess, arr.tolist(), n_in.tolist(), n_out.tolist(), strict=True):
        buf.write(f"{row[0]},{row[1]!r},{row[2]},{row[3]}\n")
    digest = hashlib.sha256(buf.getvalue().encode()).hexdigest()
    return Trace(requests=_link_sessions(sess, arr, n_in, n_out), source=source, format="csv", sha256=digest)


# --- replay selection ---------------------------------------------------------------------------------------


def select(
    trace: Trace,
    time_scale: float = 1.0,
    window_s: tuple[float, float] | None = None,
    sample_sessions: float | None = None,
    seed: int = 0,
    max_context_tokens: int | None = None,
    overlong: Literal["skip", "truncate"] = "skip",
) -> tuple[Trace, dict[str, Any]]:
    """Select part of a trace for replay; returns ``(new trace, report)`` (pure, no simulation).

    - ``window_s=(start, end)``: keep requests with ``start <= arrival_s < end`` (trace clock).
    - ``sample_sessions``: keep ``round(fraction * sessions)`` whole sessions drawn with
      ``numpy.random.default_rng(seed)`` (at least one).
    - ``max_context_tokens``: a request with ``input + output`` above it is dropped (``overlong='skip'``)
      or cut (``'truncate'``: the input first, down to ``max - output`` but >= 1, then the output).
    - ``time_scale > 1`` speeds arrivals up: ``arrival_s`` is divided by it after selection.

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
        start, end = (float(window_s[0]), float(window_s[1]))
        if not (math.isfinite(start) and math.isfinite(end) and start < end):
            raise input_error(
                f"{where}: window_s", f"is {window_s!r}", "give (start, end) seconds with start < end"
            )
        in_window = (arrival >= start) & (arrival < end)
        report["window_s"] = [start, end]
        report["dropped_outside_window"] = int((~in_window).sum())
        keep &= in_window
    sessions = df["session_id"].to_numpy(dtype=object)
    if sample_sessions is not None:
        if not (isinstance(sample_sessions, int | float) and 0 < sample_sessions <= 1):
            raise input_error(
                f"{where}: sample_sessions", f"is {sample_sessions!r}", "give a fraction in (0, 1]"
            )
        uniq = pd.unique(pd.Series(sessions))  # order of first arrival: deterministic
        k = max(1, round(sample_sessions * len(uniq)))
        chosen = np.random.default_rng(seed).permutation(len(uniq))[:k]
        picked = pd.Series(sessions).isin(set(uniq[chosen].tolist())).to_numpy()
        report["sessions_sampled"] = int(k)
        report["dropped_by_session_sampling"] = int((keep & ~picked).sum())
        keep &= picked
    n_in = df["input_tokens"].to_numpy(dtype=np.int64).copy()
    n_out = df["output_tokens"].to_numpy(dtype=np.int64).copy()
    report["skipped_overlong"] = 0
    report["truncated_overlong"] = 0
    if max_context_tokens is not None:
        if not (isinstance(max_context_tokens, int) and max_context_tokens >= 2):
            raise input_error(
                f"{where}: max_context_tokens", f"is {max_context_tokens!r}", "give an integer >= 2"
            )
        too_long = keep & (n_in + n_out > max_context_tokens)
        if overlong == "skip":
            keep &= ~too_long
            report["skipped_overlong"] = int(too_long.sum())
        else:
            cut_in = np.maximum(1, max_context_tokens - n_out)
            n_in = np.where(too_long, np.minimum(n_in, cut_in), n_in)
            n_out = np.where(too_long, np.minimum(n_out, max_context_tokens - n_in), n_out)
            report["truncated_overlong"] = int(too_long.sum())
        if too_long.any():
            log.warning(
                "select: %d request(s) over %d tokens were %s",
                int(too_long.sum()),
                max_context_tokens,
                "skipped" if overlong == "skip" else "truncated",
            )
    # re-attach to the nearest kept ancestor (parents precede children in arrival order)
    rid = df["request_id"].to_numpy(dtype=np.int64)
    ppos = pd.Index(rid).get_indexer(df["parent_request_id"].to_numpy(dtype=np.int64))
    anc = np.full(n, -1, dtype=np.int64)  # nearest kept ancestor-or-self, as a position
    new_parent = np.full(n, -1, dtype=np.int64)
    keep_l, ppos_l, anc_l, new_l = keep.tolist(), ppos.tolist(), anc.tolist(), new_parent.tolist()
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
    new_parent = np.asarray(new_l, dtype=np.int64)
    idx = np.flatnonzero(keep)
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


def split_sessions(trace: Trace, max_gap_s: float) -> tuple[Trace, dict[str, Any]]:
    """Cut every parent link whose arrival-to-arrival gap exceeds ``max_gap_s``; returns ``(trace, report)``.

    A request cut from its parent starts a new session ``"<session_id>@<request_id>"`` (its descendants
    follow it) and turns are renumbered. Use it before :func:`workload_stats` or fitting when a revisit
    after hours or days should count as a new conversation (RAGPulse has gaps of days).
    """
    if not (isinstance(max_gap_s, int | float) and max_gap_s > 0):
        raise input_error("split_sessions: max_gap_s", f"is {max_gap_s!r}", "give seconds > 0")
    df = trace.requests
    n = len(df)
    rid = df["request_id"].to_numpy(dtype=np.int64)
    ppos = pd.Index(rid).get_indexer(df["parent_request_id"].to_numpy(dtype=np.int64))
    arr = df["arrival_s"].to_numpy(dtype=float)
    gap = np.where(ppos >= 0, arr - arr[np.maximum(ppos, 0)], 0.0)
    cut = (ppos >= 0) & (gap > max_gap_s)
    ppos = np.where(cut, -1, ppos)
    sess = df["session_id"].to_numpy(dtype=object)
    root_l, turn_l, ppos_l = list(range(n)), [1] * n, ppos.tolist()
    for i in range(n):  # parents precede children in arrival order
        p = ppos_l[i]
        if p >= 0:
            root_l[i] = root_l[p]
            turn_l[i] = turn_l[p] + 1
    new_sess = [str(sess[i]) if not cut[r] else f"{sess[i]}@{rid[r]}" for i, r in enumerate(root_l)]
    out = _frame(
        rid,
        new_sess,
        np.asarray(turn_l),
        arr,
        df["input_tokens"].to_numpy(),
        df["output_tokens"].to_numpy(),
        np.where(ppos >= 0, rid[np.maximum(ppos, 0)], -1),
        df["service_s"].to_numpy(dtype=float),
        df["linkable"].to_numpy(dtype=bool),
    )
    report = {
        "max_gap_s": float(max_gap_s),
        "links_cut": int(cut.sum()),
        "sessions": int(out["session_id"].nunique()),
    }
    return replace(trace, requests=out, notes={**dict(trace.notes), "split_sessions": report}), report


# --- statistics ---------------------------------------------------------------------------------------------


def json_ready(value: Any) -> Any:
    """Convert numpy scalars/arrays and NaN to plain JSON-serialisable Python values (NaN -> None)."""
    if isinstance(value, Mapping):
        return {str(k): json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple | np.ndarray):
        return [json_ready(v) for v in value]
    if isinstance(value, np.bool_ | bool):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        f = float(value)
        return f if math.isfinite(f) else None
    return value


def _key(t: float) -> str:
    """Dictionary key of a TTL or turn (``'30'``, ``'2.5'``)."""
    return f"{float(t):g}"


def percentile_summary(values: Any, percentiles: Sequence[int] = PERCENTILES) -> dict[str, Any]:
    """``{'n', 'p10', ..., 'mean'}`` of a sample (None values when it is empty)."""
    arr = np.asarray(values, dtype=float)
    arr = arr[np.isfinite(arr)]
    out: dict[str, Any] = {"n": int(arr.size)}
    qs = np.percentile(arr, list(percentiles)) if arr.size else [None] * len(percentiles)
    for p, q in zip(percentiles, qs, strict=True):
        out[f"p{p}"] = None if q is None else float(q)
    out["mean"] = float(arr.mean()) if arr.size else None
    return out


def _service_s(df: pd.DataFrame, pos: np.ndarray, fn: ServiceTimeFn | None) -> tuple[np.ndarray, str]:
    """Service time of the requests at ``pos``: measured where known, else ``fn``; NaN when neither."""
    measured = df["service_s"].to_numpy(dtype=float)[pos]
    if fn is None:
        return measured, "measured" if np.isfinite(measured).any() else "none"
    est = np.broadcast_to(
        np.asarray(
            fn(
                df["input_tokens"].to_numpy(dtype=np.int64)[pos],
                df["output_tokens"].to_numpy(dtype=np.int64)[pos],
            ),
            dtype=float,
        ),
        pos.shape,
    )
    src = "measured + service_time_fn" if np.isfinite(measured).any() else "service_time_fn"
    return np.where(np.isfinite(measured), measured, est), src


def turn_pairs(trace: Trace, service_time_fn: ServiceTimeFn | None = None) -> pd.DataFrame:
    """One row per (parent -> child) pair: gap, idle gap, parent/child tokens and new tokens.

    ``gap_s`` is arrival to arrival; ``idle_s = gap_s - parent service time`` (measured ``service_s`` where
    the trace has it, else ``service_time_fn``; NaN when neither); ``new_tokens = child_in - parent_in -
    parent_out`` (negative when the context was trimmed or edited).
    """
    df = trace.requests
    ppos = pd.Index(df["request_id"].to_numpy()).get_indexer(df["parent_request_id"].to_numpy())
    child = np.flatnonzero(ppos >= 0)
    parent = ppos[child]
    arr = df["arrival_s"].to_numpy(dtype=float)
    n_in = df["input_tokens"].to_numpy(dtype=np.int64)
    n_out = df["output_tokens"].to_numpy(dtype=np.int64)
    gap = arr[child] - arr[parent]
    svc, _ = _service_s(df, parent, service_time_fn)
    return pd.DataFrame(
        {
            "parent_pos": parent,
            "child_pos": child,
            "turn": df["turn"].to_numpy(dtype=np.int64)[child],
            "parent_arrival_s": arr[parent],
            "gap_s": gap,
            "idle_s": gap - svc,
            "parent_input": n_in[parent],
            "parent_output": n_out[parent],
            "child_input": n_in[child],
            "child_output": n_out[child],
            "new_tokens": n_in[child] - n_in[parent] - n_out[parent],
        }
    )


def workload_stats(
    trace: Trace,
    ttls_s: Sequence[float] = DEFAULT_TTLS_S,
    threshold_tokens: int = 64,
    *,
    service_time_fn: ServiceTimeFn | None = None,
    followup_horizon_s: float | None = None,
) -> dict[str, Any]:
    """Retention statistics of a trace as a JSON-serialisable dict (definitions in the module docstring).

    Keys: ``source``, ``requests``, ``sessions``, ``linked_requests``, ``turns_per_session``, ``gap_s``
    (arrival to arrival, percentiles, mean and CDF at each TTL), ``idle_gap_s`` (gap minus the parent's
    service time; None without a measured service time or ``service_time_fn``), ``followup`` (censoring
    rule, eligible requests, P(next turn within T) for each TTL), ``context_by_turn``,
    ``new_tokens_per_turn``, ``input_tokens``, ``output_tokens`` (with the share under
    ``threshold_tokens``).
    """
    ttls = [float(t) for t in ttls_s]
    if not ttls or any((not math.isfinite(t)) or t <= 0 for t in ttls):
        raise input_error("workload_stats: ttls_s", f"is {list(ttls_s)!r}", "give positive finite seconds")
    df = trace.requests
    n = len(df)
    pairs = turn_pairs(trace, service_time_fn)
    arr = df["arrival_s"].to_numpy(dtype=float)
    sessions = df.groupby("session_id", sort=False)
    sizes = sessions.size().to_numpy()
    depth = sessions["turn"].max().to_numpy()
    gaps = pairs["gap_s"].to_numpy(dtype=float)
    gap = percentile_summary(gaps)
    gap["definition"] = "arrival to arrival (includes the parent's own service time and queueing)"
    gap["cdf_at_ttl"] = {_key(t): float((gaps <= t).mean()) if gaps.size else None for t in ttls}
    idle_vals = pairs["idle_s"].to_numpy(dtype=float)
    _, svc_src = _service_s(df, pairs["parent_pos"].to_numpy(dtype=np.int64), service_time_fn)
    idle: dict[str, Any] | None = None
    if np.isfinite(idle_vals).any():
        idle = percentile_summary(idle_vals)
        idle["definition"] = "arrival-to-arrival gap minus the parent's service time"
        idle["service_time"] = svc_src
        idle["negative_share"] = float((idle_vals[np.isfinite(idle_vals)] < 0).mean())
        idle["cdf_at_ttl"] = {_key(t): float((idle_vals <= t).mean()) for t in ttls}
    # follow-up within T, censored: only requests that could have a visible child within the horizon
    horizon = float(followup_horizon_s) if followup_horizon_s is not None else max(ttls)
    end = float(arr.max()) if n else 0.0
    first_gap = np.full(n, np.inf)
    if len(pairs):
        np.minimum.at(first_gap, pairs["parent_pos"].to_numpy(dtype=np.int64), gaps)
    eligible = df["linkable"].to_numpy(dtype=bool) & (arr <= end - horizon)
    fg = first_gap[eligible]
    followup: dict[str, Any] = {
        "rule": f"linkable requests arriving at least the horizon ({horizon:g} s) before the last arrival "
        f"({end:g} s); next turn = the earliest child",
        "horizon_s": horizon,
        "eligible_requests": int(eligible.sum()),
        "within_horizon": float((fg <= horizon).mean()) if fg.size else None,
        "any_visible": float(np.isfinite(fg).mean()) if fg.size else None,
        "within": {_key(t): (float((fg <= t).mean()) if fg.size else None) for t in ttls},
    }
    turn_col = df["turn"].to_numpy(dtype=np.int64)
    n_in = df["input_tokens"].to_numpy(dtype=float)
    context = {}
    for k in CONTEXT_TURNS:
        vals = n_in[turn_col == k]
        context[str(k)] = {
            "n": int(vals.size),
            "p50": float(np.percentile(vals, 50)) if vals.size else None,
            "p90": float(np.percentile(vals, 90)) if vals.size else None,
        }
    new_tok = pairs["new_tokens"].to_numpy(dtype=float)
    new_stats = percentile_summary(new_tok)
    new_stats["negative_share"] = float((new_tok < 0).mean()) if new_tok.size else None
    outs = df["output_tokens"].to_numpy(dtype=float)
    out_stats = percentile_summary(outs)
    out_stats["threshold_tokens"] = int(threshold_tokens)
    out_stats["share_under_threshold"] = float((outs < threshold_tokens).mean()) if n else None
    counts = np.bincount(sizes) if sizes.size else np.zeros(1, dtype=np.int64)
    stats = {
        "source": {"path": trace.source, "format": trace.format, "sha256": trace.sha256},
        "requests": n,
        "sessions": int(sizes.size),
        "linked_requests": int(len(pairs)),
        "duration_s": trace.duration_s,
        "sessions_with_2plus_requests": int((sizes >= 2).sum()),
        "share_requests_in_multi_request_sessions": float(sizes[sizes >= 2].sum() / n) if n else None,
        "turns_per_session": {
            "definition": "requests per session",
            "mean": float(sizes.mean()) if sizes.size else None,
            "p50": float(np.percentile(sizes, 50)) if sizes.size else None,
            "p90": float(np.percentile(sizes, 90)) if sizes.size else None,
            "p99": float(np.percentile(sizes, 99)) if sizes.size else None,
            "max": int(sizes.max()) if sizes.size else None,
            "single_request_share": float((sizes == 1).mean()) if sizes.size else None,
            "max_chain_depth": int(depth.max()) if depth.size else None,
            "counts": {str(k): int(c) for k, c in enumerate(counts) if c},
        },
        "gap_s": gap,
        "idle_gap_s": idle,
        "followup": followup,
        "context_by_turn": context,
        "new_tokens_per_turn": new_stats,
        "input_tokens": percentile_summary(n_in),
        "output_tokens": out_stats,
    }
    return cast(dict[str, Any], json_ready(stats))


def _fmt(x: Any, digits: int = 0) -> str:
    """Format a number with thousands separators (``-`` for None)."""
    if x is None:
        return "-"
    return f"{float(x):,.{digits}f}"


def stats_table(stats: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Rows ``(label, value)`` of :func:`workload_stats` output, for printing."""
    rows: list[tuple[str, str]] = [
        ("source", f"{stats['source']['path']} ({stats['source']['format']})"),
        ("requests", _fmt(stats["requests"])),
        (
            "sessions",
            f"{_fmt(stats['sessions'])} ({_fmt(stats['sessions_with_2plus_requests'])} with >= 2 requests)",
        ),
        ("linked requests (have a parent)", _fmt(stats["linked_requests"])),
        ("duration", f"{_fmt(stats['duration_s'])} s"),
    ]
    tps = stats["turns_per_session"]
    rows.append(
        (
            "requests per session",
            f"mean {_fmt(tps['mean'], 2)}, p50 {_fmt(tps['p50'])}, p90 {_fmt(tps['p90'])}, "
            f"p99 {_fmt(tps['p99'])}, max {_fmt(tps['max'])}",
        )
    )
    pcts = "/".join(f"p{p}" for p in PERCENTILES)
    for key, label in (("gap_s", "gap arrival-to-arrival"), ("idle_gap_s", "idle gap (gap - service)")):
        g = stats.get(key)
        if not g:
            continue
        rows.append((f"{label} {pcts} (s)", " / ".join(_fmt(g[f"p{p}"]) for p in PERCENTILES)))
        rows.append((f"{label} mean, n", f"{_fmt(g['mean'])} s, n = {_fmt(g['n'])}"))
    f = stats["followup"]
    rows.append(("follow-up censoring", f"{f['rule']}; n = {_fmt(f['eligible_requests'])}"))
    for t, p in f["within"].items():
        rows.append((f"P(next turn within {t} s)", _fmt(p, 3)))
    rows.append((f"P(next turn within horizon {f['horizon_s']:g} s)", _fmt(f["within_horizon"], 3)))
    for t, c in stats["context_by_turn"].items():
        rows.append(
            (f"context turn {t} p50 / p90", f"{_fmt(c['p50'])} / {_fmt(c['p90'])} (n = {_fmt(c['n'])})")
        )
    nt = stats["new_tokens_per_turn"]
    rows.append(
        (
            "new tokens per turn p10/p50/p90/p99",
            " / ".join(_fmt(nt[f"p{p}"]) for p in (10, 50, 90, 99))
            + f" ({_fmt(nt['negative_share'], 3)} negative)",
        )
    )
    out = stats["output_tokens"]
    rows.append(("output tokens p10/p50/p90/p99", " / ".join(_fmt(out[f"p{p}"]) for p in (10, 50, 90, 99))))
    rows.append((f"outputs under {out['threshold_tokens']} tokens", _fmt(out["share_under_threshold"], 3)))
    return rows


def stats_figure(trace: Trace, stats: Mapping[str, Any]) -> Any:
    """Plotly figure: gap CDF (log x, TTLs marked) and context p50/p90 by turn. No Streamlit."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=2, subplot_titles=("inter-turn gap CDF", "context by turn"))
    pairs = turn_pairs(trace)
    gaps = np.sort(pairs["gap_s"].to_numpy(dtype=float))
    if gaps.size:
        y = np.arange(1, gaps.size + 1) / gaps.size
        fig.add_trace(
            go.Scatter(x=np.maximum(gaps, 1e-3), y=y, mode="lines", name="gap (arrival to arrival)"), 1, 1
        )
    for t in stats["gap_s"].get("cdf_at_ttl", {}):
        fig.add_vline(x=float(t), line_dash="dot", line_color="grey", row=1, col=1)
        fig.add_annotation(
            x=math.log10(float(t)), y=1.02, text=f"{t} s", showarrow=False, row=1, col=1, font_size=9
        )
    fig.update_xaxes(type="log", title_text="seconds", row=1, col=1)
    fig.update_yaxes(title_text="fraction of gaps <= x", range=[0, 1.05], row=1, col=1)
    df = trace.requests
    by_turn = df.groupby("turn")["input_tokens"]
    sizes = by_turn.size()
    turns = [int(k) for k in sizes.index][:30]
    if turns:
        q = by_turn.quantile(np.array([0.5, 0.9])).unstack()
        fig.add_trace(
            go.Scatter(x=turns, y=q.loc[turns, 0.5], mode="lines+markers", name="context p50"), 1, 2
        )
        fig.add_trace(
            go.Scatter(x=turns, y=q.loc[turns, 0.9], mode="lines+markers", name="context p90"), 1, 2
        )
    fig.update_xaxes(title_text="turn", row=1, col=2)
    fig.update_yaxes(title_text="input tokens", row=1, col=2)
    fig.update_layout(
        title_text=f"{os.path.basename(trace.source)}: {trace.n_sessions:,} sessions, "
        f"{len(pairs):,} linked turns"
    )
    return fig


__all__ = [
    "COLUMNS",
    "CSV_HEADER",
    "DEFAULT_MIN_BLOCKS",
    "DEFAULT_TTLS_S",
    "MOONCAKE_BLOCK_TOKENS",
    "TRACE_FORMATS",
    "ServiceTimeFn",
    "Trace",
    "TraceFormat",
    "crude_service_time_s",
    "detect_trace_format",
    "json_ready",
    "link_prefix_chains",
    "load_trace",
    "percentile_summary",
    "select",
    "split_sessions",
    "stats_figure",
    "stats_table",
    "trace_from_sessions",
    "turn_pairs",
    "workload_stats",
]
