"""The :class:`Trace` frame every reader returns, the format names and the checked-field helpers the readers share."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
import pandas as pd

from kvplan.errors import input_error
from kvplan.inputfile import _short, decode_text, json_loads, read_bytes

TraceFormat = Literal["mooncake", "multiturn", "ragpulse", "csv", "azure", "lmbench", "weka", "bench"]
TRACE_FORMATS: tuple[str, ...] = get_args(TraceFormat)

#: Tokens per Mooncake hash block (FAST'25 traces).
MOONCAKE_BLOCK_TOKENS = 512
#: Minimum number of the parent's full blocks that must match before two Mooncake requests are linked.
DEFAULT_MIN_BLOCKS = 2
#: Every format a trace may have, as the help texts name them (one per :data:`TraceFormat`, same order).
TRACE_FORMAT_TEXT = ("Mooncake JSONL, multi-turn stats JSON, RAGPulse JSONL, CSV (session_id,timestamp_s,input_tokens,"
                     "output_tokens), Azure LLM 2023 CSV, LMBench multi-round QA CSV, weka (AgentX kv-cache-tester) "
                     "JSON or a directory of them, vllm bench serve --save-result --save-detailed JSON")
#: Exact header of the generic CSV format.
CSV_HEADER: tuple[str, ...] = ("session_id", "timestamp_s", "input_tokens", "output_tokens")
#: Header of the Azure LLM inference trace 2023 (Azure/AzurePublicDataset, AzureLLMInferenceTrace_*.csv).
AZURE_HEADER: tuple[str, ...] = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
#: Header of LMCache's LMBench multi-round QA per-request output (LMCache/LMBenchmark multi-round-qa.py).
LMBENCH_HEADER: tuple[str, ...] = (
    "prompt_tokens", "generation_tokens", "ttft", "generation_time", "user_id", "question_id", "launch_time",
    "finish_time",
)
#: Tokens or turns of one request: far above any context limit, and int64-safe.
MAX_COUNT = 1e9
#: Most requests one trace may hold: the simulator's bound on the turns of a run (``sim.scenario``
#: ``MAX_TOTAL_TURNS`` is this number), checked on the text before any record is parsed.
MAX_TRACE_RECORDS = 10_000_000
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
_WS = re.compile(r"[ \t\n\r]*")


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


def at_least_one_token(tokens: np.ndarray) -> tuple[np.ndarray, int]:
    """A trace's token counts as kvplan uses them, and how many were raised: a request is at least one prompt token
    and one generated token (vLLM samples at least one: ``max_tokens >= 1``), so a trace's 0 (Mooncake logs
    ``output_length`` 0 for some requests) is taken as 1 by the replay (sim/workload.py) and by ``workload fit``."""
    return np.maximum(tokens, 1), int(np.count_nonzero(tokens < 1))


def _read_source(path: str | os.PathLike[str], max_bytes: int) -> tuple[str, str]:
    """Return ``(text, sha256)`` of a UTF-8 file of at most ``max_bytes``: the bounded reader of
    :mod:`kvplan.inputfile` (refused from ``stat`` first), the digest of the bytes read."""
    where = os.fspath(path)
    data = read_bytes(path, max_bytes, where)
    return decode_text(data, where), hashlib.sha256(data).hexdigest()


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
            obj, _ = json_loads(line, where)  # NaN/Infinity are refused field by field below
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


def _check_sorted(times: list[float], lines: list[int], label: str, name: str, unit: str,
                  shown: list[str] | None = None) -> None:
    """Raise on the first timestamp that is earlier than the one before it (file order); ``shown``: the
    timestamps as the file writes them, for the message (default: ``times`` and ``unit``)."""
    arr = np.asarray(times, dtype=float)
    if arr.size < 2:
        return
    bad = np.flatnonzero(np.diff(arr) < 0)
    if bad.size:
        i = int(bad[0]) + 1
        now, before = (repr(shown[i]), repr(shown[i - 1])) if shown else (f"{arr[i]:g} {unit}", f"{arr[i - 1]:g} {unit}")
        raise input_error(
            f"{label}: line {lines[i]}",
            f"field '{name}' is {now}, earlier than {before} on line {lines[i - 1]}",
            "the trace must be sorted by arrival (non-decreasing timestamps); sort it first",
        )
def _no_records(label: str, header_only: bool = False) -> Exception:
    """The one-line error of a trace without a request: blank, or (a CSV format) its header line and nothing after."""
    if header_only:
        return input_error(label, "no requests found (only its header line)", "add the requests below the header")
    return input_error(label, "no requests found (only blank lines)", "pass a non-empty trace")
