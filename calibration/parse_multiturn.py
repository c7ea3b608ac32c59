"""Parser of ``benchmark_serving_multi_turn.py --stats-json-output`` files (VLLM_BEHAVIOUR.md 2.2).

The file is a JSON array with one object per completed request (all requests: the tool does not drop
warm-up turns here). Times are in **ms**: ``ttft_ms`` (corrected to a single-token TTFT, ``-1`` when
unavailable), ``tpot_ms``, ``latency_ms`` and ``start_time_ms`` (``perf_counter_ns() / 1e6``, a
monotonic clock, not epoch). ``input_num_turns`` counts *messages* (1, 3, 5, ...), so the user turn is
``1 + (input_num_turns - 1) // 2``. ``input_num_tokens`` counts message contents only (no chat
template). Older versions of the tool name the conversation field ``session_id``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kvplan.errors import input_error
from kvplan.inputfile import (
    DEFAULT_MAX_BYTES,
    PathLike,
    check_array,
    file_label,
    find_non_finite,
    is_number,
    load_json,
    median,
    short_repr,
)

#: Fields of one record -> (minimum, whole number?)
_NUMERIC_FIELDS: dict[str, tuple[float, bool]] = {
    "ttft_ms": (-1.0, False),
    "tpot_ms": (0.0, False),
    "latency_ms": (0.0, False),
    "start_time_ms": (0.0, False),
    "input_num_turns": (1.0, True),
    "input_num_tokens": (0.0, True),
    "output_num_tokens": (0.0, True),
    "output_num_chunks": (0.0, True),
    "output_num_first_chunk_tokens": (0.0, True),
    "approx_cached_percent": (0.0, False),
    "client_id": (0.0, True),
}
_CONVERSATION_ALIASES = ("conversation_id", "session_id")
_MS_PER_S = 1000.0
# No LLM serves a stream faster than 0.5 ms per output token (2000 tok/s per request): a median
# latency_ms / output_num_tokens below that means the "ms" fields hold seconds.
_MS_PER_OUTPUT_TOKEN_IMPLAUSIBLE = 0.5


@dataclass(frozen=True, eq=False)
class MultiTurnStats:
    """Per-request statistics of one multi-turn benchmark run.

    Attributes:
        source: the file, as given.
        requests: one row per request, sorted by ``start_time_s`` (``record`` keeps the file order).
            Columns: ``record``, ``conversation_id`` (str), ``client_id``, ``input_num_turns``,
            ``user_turn`` (1-based user request index within the conversation), ``input_num_tokens``
            (content tokens only), ``output_num_tokens``, ``output_num_chunks``,
            ``output_num_first_chunk_tokens``, ``approx_cached_percent`` (100 x history / input),
            ``ttft_s`` (NaN where the tool wrote -1), ``ttft_available``, ``tpot_s``, ``latency_s``,
            ``start_time_s`` and ``end_time_s`` (client ``perf_counter`` seconds).
    """

    source: str
    requests: pd.DataFrame

    @property
    def n_requests(self) -> int:
        """Number of requests in the file."""
        return len(self.requests)

    @property
    def n_conversations(self) -> int:
        """Number of distinct conversations."""
        return int(self.requests["conversation_id"].nunique())


def _refuse_non_finite(where: str, raw: list[Any]) -> None:
    for i, rec in enumerate(raw):
        for key, value in rec.items() if isinstance(rec, dict) else ():
            if find_non_finite(value, key) is not None:
                raise input_error(where, f"record {i}: field '{key}' is NaN/Infinity, not a valid measurement")


def _records(where: str, raw: list[Any]) -> tuple[dict[str, list[Any]], list[str]]:
    """The numeric fields column by column and the conversation ids, every record checked."""
    columns: dict[str, list[Any]] = {k: [] for k in _NUMERIC_FIELDS}
    conversations: list[str] = []
    for i, rec in enumerate(raw):
        if not isinstance(rec, dict):
            raise input_error(where, f"record {i} is {short_repr(rec)}, not an object")
        for field in _NUMERIC_FIELDS:
            if field not in rec:
                raise input_error(
                    where, f"record {i}: missing required field '{field}'", "pass the unmodified stats file"
                )
            value = rec[field]
            if not is_number(value):
                raise input_error(where, f"record {i}: field '{field}' is {short_repr(value)}, not a number")
            columns[field].append(value)
        conv = next((rec[k] for k in _CONVERSATION_ALIASES if k in rec), None)
        if conv is None:
            raise input_error(where, f"record {i}: missing required field 'conversation_id'")
        if not isinstance(conv, str | int) or isinstance(conv, bool):
            raise input_error(
                where, f"record {i}: field 'conversation_id' is {short_repr(conv)}, not a string"
            )
        conversations.append(str(conv))
    return columns, conversations


def _checked_arrays(where: str, columns: dict[str, list[Any]]) -> dict[str, np.ndarray]:
    """Each numeric field as a float array, checked for its minimum and, where it counts, whole numbers."""
    arrays: dict[str, np.ndarray] = {}
    for field, (minimum, whole) in _NUMERIC_FIELDS.items():
        arr = np.asarray(columns[field], dtype=np.float64)
        check_array(where, field, arr, minimum=minimum, label="in record")
        if whole:
            frac = np.flatnonzero(arr != np.floor(arr))
            if frac.size:
                i = int(frac[0])
                raise input_error(where, f"record {i}: field '{field}' is {arr[i]:g}, not a whole number")
        arrays[field] = arr
    return arrays


def parse_multiturn_stats(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> MultiTurnStats:
    """Parse a ``--stats-json-output`` JSON array into seconds columns plus a ``user_turn`` index.

    Raises :class:`~kvplan.errors.KvplanInputError` naming the file, the record and the field for:
    invalid or truncated JSON, an empty array, a missing field, non-numbers, NaN/Infinity, negative
    times, even ``input_num_turns``, values that look like seconds instead of ms, a TTFT after the end
    of its request, and a conversation whose turn repeats or starts before the previous turn.
    """
    where = file_label(path)
    raw, has_non_finite = load_json(path, max_bytes)
    if not isinstance(raw, list):
        raise input_error(
            where,
            f"top-level JSON value is {short_repr(raw)}, not an array of request records",
            "pass the file written by benchmark_serving_multi_turn.py --stats-json-output",
        )
    if not raw:
        raise input_error(where, "the array of request records is empty", "re-run the benchmark")
    if has_non_finite:
        _refuse_non_finite(where, raw)
    columns, conversations = _records(where, raw)
    arrays = _checked_arrays(where, columns)

    _validate(where, arrays, conversations)

    ttft_ms = arrays["ttft_ms"]
    available = ttft_ms >= 0
    turns = arrays["input_num_turns"].astype(np.int64)
    frame = pd.DataFrame(
        {
            "record": np.arange(len(raw), dtype=np.int64),
            "conversation_id": pd.Series(conversations, dtype=str),
            "client_id": arrays["client_id"].astype(np.int64),
            "input_num_turns": turns,
            "user_turn": 1 + (turns - 1) // 2,
            "input_num_tokens": arrays["input_num_tokens"].astype(np.int64),
            "output_num_tokens": arrays["output_num_tokens"].astype(np.int64),
            "output_num_chunks": arrays["output_num_chunks"].astype(np.int64),
            "output_num_first_chunk_tokens": arrays["output_num_first_chunk_tokens"].astype(np.int64),
            "approx_cached_percent": arrays["approx_cached_percent"],
            "ttft_s": np.where(available, ttft_ms / _MS_PER_S, np.nan),
            "ttft_available": available,
            "tpot_s": arrays["tpot_ms"] / _MS_PER_S,
            "latency_s": arrays["latency_ms"] / _MS_PER_S,
            "start_time_s": arrays["start_time_ms"] / _MS_PER_S,
            "end_time_s": (arrays["start_time_ms"] + arrays["latency_ms"]) / _MS_PER_S,
        }
    )
    frame = frame.sort_values("start_time_s", kind="stable").reset_index(drop=True)
    return MultiTurnStats(source=where, requests=frame)


def _validate(where: str, a: dict[str, np.ndarray], conversations: list[str]) -> None:
    """Cross-field checks: sentinel, units, parity of turns, TTFT <= latency, per-conversation order."""
    ttft = a["ttft_ms"]
    odd = np.flatnonzero((ttft < 0) & (ttft != -1.0))
    if odd.size:
        i = int(odd[0])
        raise input_error(
            where, f"record {i}: field 'ttft_ms' is {ttft[i]:g}; only -1 may mark a missing TTFT"
        )
    per_token = median(a["latency_ms"] / np.maximum(a["output_num_tokens"], 1.0))
    if per_token < _MS_PER_OUTPUT_TOKEN_IMPLAUSIBLE:
        raise input_error(
            where,
            f"field 'latency_ms' is a median {per_token:g} per output token: that looks like seconds, but "
            f"the stats file stores ms",
            "multiply the time fields by 1000",
        )
    turns = a["input_num_turns"]
    even = np.flatnonzero(turns % 2 == 0)
    if even.size:
        i = int(even[0])
        raise input_error(
            where,
            f"record {i}: field 'input_num_turns' is {turns[i]:g}; it counts messages sent and must be odd "
            f"(1, 3, 5, ...)",
        )
    late = np.flatnonzero((ttft >= 0) & (ttft > a["latency_ms"] * (1 + 1e-9) + 1e-3))
    if late.size:
        i = int(late[0])
        raise input_error(
            where,
            f"record {i}: field 'ttft_ms' ({ttft[i]:g}) is larger than 'latency_ms' ({a['latency_ms'][i]:g})",
        )
    pct = a["approx_cached_percent"]
    over = np.flatnonzero(pct > 100.0 + 1e-9)
    if over.size:
        i = int(over[0])
        raise input_error(where, f"record {i}: field 'approx_cached_percent' is {pct[i]:g}, above 100")
    order = pd.DataFrame({"conv": conversations, "turns": turns, "start": a["start_time_ms"]})
    order["record"] = np.arange(len(order))
    order = order.sort_values(["conv", "turns"], kind="stable")
    same_conv = order["conv"].to_numpy()[1:] == order["conv"].to_numpy()[:-1]
    dup = np.flatnonzero(same_conv & (np.diff(order["turns"].to_numpy()) == 0))
    if dup.size:
        rec = int(order["record"].to_numpy()[dup[0] + 1])
        raise input_error(
            where,
            f"record {rec}: conversation {conversations[rec]!r} has input_num_turns {int(turns[rec])} twice",
            "the file looks like two runs concatenated; pass one run per file",
        )
    back = np.flatnonzero(same_conv & (np.diff(order["start"].to_numpy()) <= 0))
    if back.size:
        rec = int(order["record"].to_numpy()[back[0] + 1])
        raise input_error(
            where,
            f"record {rec}: conversation {conversations[rec]!r} turn with input_num_turns {int(turns[rec])} "
            f"starts (start_time_ms {a['start_time_ms'][rec]:g}) before its previous turn",
            "start_time_ms must increase within a conversation; do not mix runs",
        )
