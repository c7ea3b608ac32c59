"""Parser of ``vllm bench serve --save-result [--save-detailed]`` result files (VLLM_BEHAVIOUR.md 2.1).

The file is one JSON object: header keys (``date``, ``backend``, ``model_id``, ``request_rate``...),
aggregates (``duration`` in s, ``completed``, throughputs), percentile summaries in **ms**
(``mean_ttft_ms``, ``p99_itl_ms``...) and, with ``--save-detailed``, per-request arrays in
**seconds** (``ttfts``, ``itls`` as a list of lists, ``latencies``, ``start_times`` on the client's
``time.perf_counter()`` clock). Older spellings seen in real files are accepted: ``request_goodput:``
(the trailing-colon typo of 2024-2025 vLLM) and ``request_inthroughput`` (early 2024).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
import pandas as pd

from kvplan.errors import input_error
from kvplan.inputfile import (
    DEFAULT_MAX_BYTES,
    PathLike,
    check_integral,
    file_label,
    find_non_finite,
    integer,
    is_number,
    load_json,
    median,
    number,
    number_array,
    short_repr,
)

#: Old key spellings found in real result files -> the current name.
KEY_ALIASES: Mapping[str, str] = MappingProxyType(
    {
        "request_goodput:": "request_goodput",  # vLLM typo kept for a year (llm-d exp-7 files have it)
        "request_inthroughput": "request_throughput",  # early-2024 benchmark_serving.py
    }
)

# Percentile summaries: mean_ttft_ms, median_itl_ms, std_e2el_ms, p99_tpot_ms, p99.9_ttft_ms ...
_SUMMARY_KEY = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_([a-z][a-z0-9_]*?)_ms$")

# A median TTFT above this many seconds is not a plausible seconds value: the array holds ms.
_TTFT_SECONDS_IMPLAUSIBLE_S = 60.0
# Same idea for the gap between two streamed chunks and for a whole request.
_ITL_SECONDS_IMPLAUSIBLE_S = 10.0
_LATENCY_SECONDS_IMPLAUSIBLE_S = 3600.0

_PER_REQUEST_FLOAT = {  # JSON array -> (column, minimum, kind)
    "input_lens": ("input_len_tokens", 0.0, "int"),
    "output_lens": ("output_len_tokens", 0.0, "int"),
    "ttfts": ("ttft_s", 0.0, "float"),
    "latencies": ("latency_s", 0.0, "float"),
    "start_times": ("start_time_s", 0.0, "float"),
    "queue_times": ("queue_time_s", 0.0, "float"),
}
_PER_REQUEST_OTHER = ("itls", "errors")
_DROPPED = frozenset({"generated_texts", "input_texts", "infer_input_lens"})
_HEADER_STR = ("date", "endpoint_type", "backend", "label", "model_id", "tokenizer_id")
_AGG_FLOAT = {
    "request_throughput": "request_throughput_req_s",
    "request_goodput": "request_goodput_req_s",
    "output_throughput": "output_throughput_tok_s",
    "total_token_throughput": "total_token_throughput_tok_s",
    "max_output_tokens_per_s": "max_output_tokens_per_s",
}
_AGG_INT = ("completed", "failed", "total_input_tokens", "total_output_tokens", "max_concurrent_requests")
_REQUIRED = ("duration", "completed")


@dataclass(frozen=True, eq=False)
class BenchServeResult:
    """One ``vllm bench serve`` result: header, aggregates, ms summaries and optional per-request data.

    Attributes:
        source: the file, as given.
        date, backend, model_id, tokenizer_id, endpoint_type, label: header strings (``None`` if absent).
        num_prompts: requests the client sent.
        request_rate_req_s: offered rate; ``math.inf`` for ``"inf"`` (all at once).
        burstiness: gamma shape of the arrivals (1 = Poisson).
        max_concurrency: client concurrency cap, ``None`` if unlimited.
        duration_s: wall time of the benchmark.
        completed, failed: successful / failed requests (``failed`` is absent in older files: ``None``).
        total_input_tokens, total_output_tokens: token totals of the successful requests.
        request_throughput_req_s, request_goodput_req_s, output_throughput_tok_s,
        total_token_throughput_tok_s, max_output_tokens_per_s, max_concurrent_requests: aggregates
            (``None`` when the file does not have them).
        summary_ms: percentile summaries in **milliseconds**, index = metric (``ttft``, ``tpot``, ``itl``,
            ``e2el``...), columns = statistic (``mean``, ``median``, ``std``, ``p99``...), NaN where the
            file has no such key.
        requests: one row per request when per-request arrays are present, else ``None``. Columns
            (only those whose arrays exist, plus ``ok``): ``input_len_tokens``, ``output_len_tokens``,
            ``ttft_s``, ``latency_s``, ``start_time_s`` (client ``perf_counter`` seconds, not epoch),
            ``queue_time_s``, ``itl_count``, ``itl_sum_s``, ``error`` and ``ok`` (no error string).
        itls_s: per-request inter-token gaps in seconds (one array per request) or ``None``.
        extra: every other key of the file (``--metadata`` pairs, ``timestamp``, ...), unvalidated.
    """

    source: str
    date: str | None
    backend: str | None
    model_id: str | None
    tokenizer_id: str | None
    endpoint_type: str | None
    label: str | None
    num_prompts: int | None
    request_rate_req_s: float | None
    burstiness: float | None
    max_concurrency: int | None
    duration_s: float
    completed: int
    failed: int | None
    total_input_tokens: int | None
    total_output_tokens: int | None
    request_throughput_req_s: float | None
    request_goodput_req_s: float | None
    output_throughput_tok_s: float | None
    total_token_throughput_tok_s: float | None
    max_output_tokens_per_s: float | None
    max_concurrent_requests: int | None
    summary_ms: pd.DataFrame
    requests: pd.DataFrame | None
    itls_s: tuple[np.ndarray, ...] | None
    extra: Mapping[str, Any]

    @property
    def has_requests(self) -> bool:
        """True when the file carried per-request arrays (``--save-detailed`` or ``latencies``)."""
        return self.requests is not None

    def summary(self, metric: str, stat: str) -> float:
        """Return one summary value in ms, e.g. ``summary("ttft", "p99")``; KeyError if the file lacks it."""
        cell: Any = self.summary_ms.loc[metric, stat]
        value = float(cell)
        if math.isnan(value):
            raise KeyError(f"{stat}_{metric}_ms")
        return value


def parse_bench_serve(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> BenchServeResult:
    """Parse a ``vllm bench serve --save-result`` JSON file (with or without ``--save-detailed``).

    Aggregates-only files (no per-request arrays) are valid and give ``requests=None``. Raises
    :class:`~kvplan.errors.KvplanInputError` naming the file and the field for: invalid or truncated
    JSON, a missing ``duration``/``completed``, NaN/Infinity, negative times or counts, empty or
    mismatched per-request arrays, ``ttft > latency``, and arrays whose values look like milliseconds.
    """
    where = file_label(path)
    raw, has_non_finite = load_json(path, max_bytes)
    if not isinstance(raw, dict):
        raise input_error(
            where,
            f"top-level JSON value is {short_repr(raw)}, not an object",
            "pass the file written by 'vllm bench serve --save-result' (a multi-turn stats file is a list)",
        )
    data = _fields(where, raw)
    completed = integer(where, "completed", data["completed"])
    if completed == 0:
        raise input_error(
            where, "field 'completed' is 0: no request succeeded, there is nothing to calibrate on"
        )
    if has_non_finite:
        _refuse_non_finite(where, data)
    duration_s = number(where, "duration", data["duration"])
    if duration_s <= 0:
        raise input_error(where, f"field 'duration' is {duration_s:g}, must be positive (seconds)")

    summary = _summary_frame(where, data, duration_s)
    requests, itls = _per_request(where, data, completed)
    if requests is not None and "ttft_s" in requests and "ttft" in summary.index:
        _cross_check_ttft(where, requests, summary)

    extra = _extra_fields(data)
    return BenchServeResult(
        source=where,
        date=_opt_str(where, data, "date"),
        backend=_opt_str(where, data, "backend"),
        model_id=_opt_str(where, data, "model_id"),
        tokenizer_id=_opt_str(where, data, "tokenizer_id"),
        endpoint_type=_opt_str(where, data, "endpoint_type"),
        label=_opt_str(where, data, "label"),
        num_prompts=_opt_int(where, data, "num_prompts"),
        request_rate_req_s=_request_rate(where, data.get("request_rate")),
        burstiness=_opt_float(where, data, "burstiness"),
        max_concurrency=_opt_int(where, data, "max_concurrency"),
        duration_s=duration_s,
        completed=completed,
        failed=_opt_int(where, data, "failed"),
        total_input_tokens=_opt_int(where, data, "total_input_tokens"),
        total_output_tokens=_opt_int(where, data, "total_output_tokens"),
        request_throughput_req_s=_opt_float(where, data, "request_throughput"),
        request_goodput_req_s=_opt_float(where, data, "request_goodput"),
        output_throughput_tok_s=_opt_float(where, data, "output_throughput"),
        total_token_throughput_tok_s=_opt_float(where, data, "total_token_throughput"),
        max_output_tokens_per_s=_opt_float(where, data, "max_output_tokens_per_s"),
        max_concurrent_requests=_opt_int(where, data, "max_concurrent_requests"),
        summary_ms=summary,
        requests=requests,
        itls_s=itls,
        extra=MappingProxyType(extra),
    )


def _fields(where: str, raw: dict[str, Any]) -> dict[str, Any]:
    """The file's fields under their current names (:data:`KEY_ALIASES`), the required ones checked."""
    data = {KEY_ALIASES.get(key, key): value for key, value in raw.items()}
    if not any(k in data for k in ("duration", "completed", "ttfts", "mean_ttft_ms", "request_throughput")):
        raise input_error(
            where,
            "no vllm bench serve fields found (expected 'duration', 'completed', 'mean_ttft_ms', ...)",
            "pass the JSON written by 'vllm bench serve --save-result'",
        )
    for key in _REQUIRED:
        if key not in data:
            raise input_error(
                where, f"missing required field '{key}'", "pass the unmodified --save-result file"
            )
    return data


def _refuse_non_finite(where: str, data: Mapping[str, Any]) -> None:
    """NaN/Infinity anywhere but ``request_rate`` (where ``inf`` means "all at once") is an error."""
    for key, value in data.items():
        if key == "request_rate":
            continue
        found = find_non_finite(value, key)
        if found is not None:
            raise input_error(where, f"field '{found}' is NaN/Infinity, not a valid measurement")


def _extra_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """Fields kvplan does not read (kept in ``extra``), without the per-percentile summary keys."""
    known = set(_HEADER_STR) | set(_AGG_FLOAT) | set(_AGG_INT) | set(_PER_REQUEST_FLOAT)
    known |= set(_PER_REQUEST_OTHER) | {"num_prompts", "request_rate", "burstiness", "max_concurrency", "duration"}
    return {k: v for k, v in data.items() if k not in known and k not in _DROPPED and not _SUMMARY_KEY.match(k)}


def _opt_str(where: str, data: Mapping[str, Any], key: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise input_error(where, f"field '{key}' is {short_repr(value)}, not a string")
    return value


def _opt_float(where: str, data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    return None if value is None else number(where, key, value)


def _opt_int(where: str, data: Mapping[str, Any], key: str) -> int | None:
    value = data.get(key)
    return None if value is None else integer(where, key, value)


def _request_rate(where: str, value: Any) -> float | None:
    """``request_rate`` is a number or the string ``"inf"`` (some writers emit ``Infinity``)."""
    if value is None:
        return None
    if isinstance(value, str):
        if value.strip().lower() in ("inf", "infinity"):
            return math.inf
        raise input_error(where, f"field 'request_rate' is {short_repr(value)}, expected a number or \"inf\"")
    if is_number(value) and value == math.inf:
        return math.inf
    rate = number(where, "request_rate", value)
    if rate <= 0:
        raise input_error(where, f"field 'request_rate' is {rate:g}, must be positive (req/s) or \"inf\"")
    return rate


def _summary_frame(where: str, data: Mapping[str, Any], duration_s: float) -> pd.DataFrame:
    """Collect ``<stat>_<metric>_ms`` keys into a metric x statistic frame (ms)."""
    cells: dict[str, dict[str, float]] = {}
    for key, value in data.items():
        match = _SUMMARY_KEY.match(key)
        if match is None or value is None:
            continue
        stat, metric = match.group(1), match.group(2)
        cells.setdefault(metric, {})[stat] = number(where, key, value)
    frame = pd.DataFrame.from_dict(cells, orient="index", dtype=np.float64)
    frame.index.name = "metric"
    frame.columns.name = "stat"
    # A latency statistic longer than the whole run means one of the two has the wrong unit.
    limit_ms = duration_s * 1000.0 * 1.01 + 1.0
    for metric in ("ttft", "e2el"):
        if metric not in frame.index:
            continue
        for stat, value in zip(frame.columns, frame.loc[metric].to_numpy(dtype=np.float64), strict=True):
            if stat != "std" and not math.isnan(value) and value > limit_ms:
                raise input_error(
                    where,
                    f"field '{stat}_{metric}_ms' is {value:g} ms, longer than the whole benchmark "
                    f"('duration' {duration_s:g} s): one of them has the wrong unit",
                    "summaries must be in ms and 'duration' in s",
                )
    return frame


def _per_request(
    where: str, data: Mapping[str, Any], completed: int
) -> tuple[pd.DataFrame | None, tuple[np.ndarray, ...] | None]:
    """Validate the per-request arrays that are present and build the request frame."""
    present = [k for k in (*_PER_REQUEST_FLOAT, *_PER_REQUEST_OTHER) if data.get(k) is not None]
    if not present:
        return None, None
    for key in present:
        if not isinstance(data[key], list):
            raise input_error(where, f"field '{key}' is {short_repr(data[key])}, not a list")
        if not data[key]:
            raise input_error(where, f"field '{key}' is an empty list", "re-run with --save-detailed")
    ref = present[0]
    n = len(data[ref])
    for key in present[1:]:
        if len(data[key]) != n:
            raise input_error(
                where,
                f"field '{key}' has {len(data[key])} entries but '{ref}' has {n}",
                "per-request arrays must have one entry per request; re-run with --save-detailed",
            )
    columns: dict[str, Any] = {}
    for key, (column, minimum, kind) in _PER_REQUEST_FLOAT.items():
        if key in present:
            arr = number_array(where, key, data[key], minimum=minimum)
            columns[column] = check_integral(where, key, arr) if kind == "int" else arr
    itls: tuple[np.ndarray, ...] | None = None
    if "itls" in present:
        itls = _itls(where, data["itls"])
        columns["itl_count"] = np.array([a.size for a in itls], dtype=np.int64)
        columns["itl_sum_s"] = np.array([float(a.sum()) for a in itls], dtype=np.float64)
    if "errors" in present:
        errors = data["errors"]
        for i, e in enumerate(errors):
            if e is not None and not isinstance(e, str):
                raise input_error(where, f"field 'errors' entry {i} is {short_repr(e)}, not a string")
        columns["error"] = ["" if e is None else e for e in errors]
        ok = np.array([not e for e in errors], dtype=bool)
        if int(ok.sum()) != completed:
            raise input_error(
                where,
                f"field 'completed' is {completed} but 'errors' marks {int(ok.sum())} of {n} requests as "
                f"successful",
                "the file was edited or merged; use the unmodified result",
            )
    else:
        ok = np.ones(n, dtype=bool)
    if n < completed:
        raise input_error(where, f"per-request arrays have {n} entries but 'completed' is {completed}")
    columns["ok"] = ok
    frame = pd.DataFrame(columns)
    frame.index.name = "request"
    _check_request_units(where, frame, itls)
    return frame, itls


def _itls(where: str, values: list[Any]) -> tuple[np.ndarray, ...]:
    """Validate ``itls``: a list (one per request) of lists of non-negative gaps in seconds."""
    out: list[np.ndarray] = []
    for i, gaps in enumerate(values):
        if not isinstance(gaps, list):
            raise input_error(where, f"field 'itls' entry {i} is {short_repr(gaps)}, not a list of gaps")
        for j, v in enumerate(gaps):
            if not is_number(v):
                raise input_error(where, f"field 'itls' entry {i} gap {j} is {short_repr(v)}, not a number")
        arr = np.asarray(gaps, dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(arr) | (arr < 0))
        if bad.size:
            j = int(bad[0])
            raise input_error(
                where, f"field 'itls' entry {i} gap {j} is {arr[j]:g}: must be a finite time >= 0"
            )
        out.append(arr)
    return tuple(out)


def _check_request_units(where: str, frame: pd.DataFrame, itls: tuple[np.ndarray, ...] | None) -> None:
    """Catch millisecond values in the seconds arrays and TTFTs longer than their request."""
    ok = frame["ok"].to_numpy()
    if "ttft_s" in frame and ok.any():
        med = median(frame["ttft_s"].to_numpy()[ok])
        if med > _TTFT_SECONDS_IMPLAUSIBLE_S:
            raise input_error(
                where,
                f"field 'ttfts' has median {med:g}: that looks like milliseconds, but vllm bench serve "
                f"writes seconds",
                "divide the array by 1000 or re-export it in seconds",
            )
    if "latency_s" in frame and ok.any():
        med = median(frame["latency_s"].to_numpy()[ok])
        if med > _LATENCY_SECONDS_IMPLAUSIBLE_S:
            raise input_error(
                where,
                f"field 'latencies' has median {med:g}: that looks like milliseconds, but the file "
                f"stores seconds",
                "divide the array by 1000",
            )
    if itls is not None:
        gaps = [a for a, good in zip(itls, ok, strict=True) if good and a.size]
        if gaps:
            med = median(np.concatenate(gaps))
            if med > _ITL_SECONDS_IMPLAUSIBLE_S:
                raise input_error(
                    where,
                    f"field 'itls' has median gap {med:g}: that looks like milliseconds, but the file stores "
                    f"seconds",
                    "divide the gaps by 1000",
                )
    if "ttft_s" in frame and "latency_s" in frame:
        ttft = frame["ttft_s"].to_numpy()
        lat = frame["latency_s"].to_numpy()
        bad = np.flatnonzero(ok & (ttft > lat * (1 + 1e-9) + 1e-6))
        if bad.size:
            i = int(bad[0])
            raise input_error(
                where,
                f"field 'ttfts' entry {i} is {ttft[i]:g} s but 'latencies' entry {i} is {lat[i]:g} s: "
                f"the first token cannot come after the end of the request",
                "check that both arrays are in seconds",
            )


def _cross_check_ttft(where: str, requests: pd.DataFrame, summary: pd.DataFrame) -> None:
    """The per-request TTFTs (s) and the ``median_ttft_ms`` summary must agree to within a factor 10."""
    if "median" not in summary.columns:
        return
    cell: Any = summary.loc["ttft", "median"]
    stated = float(cell)
    ok = requests["ok"].to_numpy()
    if math.isnan(stated) or stated <= 0 or not ok.any():
        return
    from_array_ms = median(requests["ttft_s"].to_numpy()[ok]) * 1000.0
    if from_array_ms <= 0:
        return
    ratio = from_array_ms / stated
    if ratio > 10 or ratio < 0.1:
        raise input_error(
            where,
            f"field 'ttfts' (median {from_array_ms / 1000:g} s) disagrees with 'median_ttft_ms' "
            f"({stated:g} ms) by a factor {ratio:.3g}: one of them has the wrong unit",
            "per-request arrays are in seconds, summaries in ms",
        )
