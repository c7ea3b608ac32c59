"""Trace parsers of kvplan's calibration: one entry point per real vLLM/NIXL output format.

Every parser reads one file with its exact units and clock, validates it, and returns a typed result
(frozen dataclasses holding numpy arrays or pandas frames, units in the field names). Every failure is
a :class:`kvplan.errors.KvplanInputError` whose one-line message names the file, the line or field,
and the problem. Files larger than ``max_bytes`` (default 256 MiB) are refused before being read;
nothing is ever evaluated or unpickled.

* ``bench``: ``vllm bench serve --save-result [--save-detailed]`` JSON -> :func:`parse_bench_serve`
* ``multiturn``: ``benchmark_serving_multi_turn.py --stats-json-output`` -> :func:`parse_multiturn_stats`
* ``log``: vLLM engine log and/or ``disagg_proxy_multiturn.py`` log -> :func:`parse_log`
  (or :func:`parse_engine_log` / :func:`parse_proxy_log`)
* ``prometheus``: Prometheus text exposition, one or more scrapes -> :func:`parse_prometheus`
* ``points``: CSV ``kind,tokens,cached_tokens,value_ms`` -> :func:`parse_points_csv`
* ``published``: CSV ``model,series,prompt_tokens,value_ms,note`` -> :func:`parse_published_csv`

:func:`detect_format` sniffs which of these a file is and :func:`parse_any` parses it.
"""

from __future__ import annotations

import re
from typing import TypeAlias

import pandas as pd

from kvplan.calibration.parse_bench import KEY_ALIASES, BenchServeResult, parse_bench_serve
from kvplan.calibration.parse_csv import (
    POINT_KINDS,
    POINTS_COLUMNS,
    PUBLISHED_COLUMNS,
    PUBLISHED_SERIES,
    parse_points_csv,
    parse_published_csv,
)
from kvplan.calibration.parse_logs import (
    EngineLog,
    ProxyLog,
    VllmLog,
    parse_engine_log,
    parse_log,
    parse_proxy_log,
)
from kvplan.calibration.parse_multiturn import MultiTurnStats, parse_multiturn_stats
from kvplan.calibration.parse_prometheus import HistogramSeries, PrometheusScrape, parse_prometheus
from kvplan.errors import input_error
from kvplan.inputfile import (
    DEFAULT_MAX_BYTES,
    PathLike,
    check_file,
    file_label,
    refuse_compressed,
    refuse_wide_encoding,
)

#: The format names :func:`detect_format` returns.
FORMATS = ("bench", "multiturn", "log", "prometheus", "points", "published")

#: Bytes read from the start of a file by :func:`detect_format`.
SNIFF_BYTES = 16 * 1024

ParseResult: TypeAlias = BenchServeResult | MultiTurnStats | VllmLog | PrometheusScrape | pd.DataFrame

_LOG_MARKERS = (
    "KV Transfer metrics",
    "Avg prompt throughput",
    "Releasing expired KV blocks",
    "Declining expired remote read",
    "Prefill done in",
    "disagg_proxy",
)
_LOG_PREFIX = re.compile(
    r"^(?:\([^()]*\)\s+)?(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}"
    r"|^\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?\s+\[[A-Z]+\]",
    re.MULTILINE,
)
_PROM_SAMPLE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{.*\})?\s+[-+0-9.eEnaNIf]+(?:\s+-?\d+)?\s*$")


def detect_format(path: PathLike) -> str:
    """Tell which supported format a file holds by sniffing its first :data:`SNIFF_BYTES` bytes.

    Returns one of :data:`FORMATS`. Raises :class:`~kvplan.errors.KvplanInputError` when the file is
    missing, empty, binary, or matches none of them (the message lists what is expected).
    """
    where = file_label(path)
    check_file(path, max_bytes=2**63 - 1)  # existence and type only; the parsers enforce max_bytes
    with open(path, "rb") as fh:
        head_bytes = fh.read(SNIFF_BYTES)
    # a gzip'd log or a UTF-16 export ('Unicode' in Windows editors) is named as such, with the fix, not as binary
    refuse_compressed(head_bytes, where)
    refuse_wide_encoding(head_bytes, where)
    if b"\x00" in head_bytes:
        raise input_error(where, "contains NUL bytes: this is a binary file, not a trace")
    head = head_bytes.decode("utf-8", errors="replace").lstrip("\ufeff \t\r\n")
    if head.startswith("{"):
        return "bench"
    if head.startswith("["):
        return "multiturn"
    lines = [ln.strip() for ln in head.splitlines() if ln.strip()]
    first = next((ln for ln in lines if not ln.startswith("#")), "")
    header = tuple(f.strip() for f in first.split(","))
    if header == POINTS_COLUMNS:
        return "points"
    if header == PUBLISHED_COLUMNS:
        return "published"
    if any(marker in head for marker in _LOG_MARKERS) or _LOG_PREFIX.search(head):
        return "log"
    complete = lines[:-1] if len(head_bytes) == SNIFF_BYTES else lines  # the last line may be cut
    if any(ln.startswith(("# TYPE", "# HELP", "# scrape")) for ln in lines) or (
        complete and all(ln.startswith("#") or _PROM_SAMPLE.match(ln) for ln in complete)
    ):
        return "prometheus"
    raise input_error(
        where,
        f"cannot tell the format from the first {min(len(head_bytes), SNIFF_BYTES)} bytes",
        "expected a vllm bench serve JSON object, a multi-turn stats JSON array, a vLLM or disagg proxy log, "
        "Prometheus text, a CSV with header 'kind,tokens,cached_tokens,value_ms' or "
        "'model,series,prompt_tokens,value_ms,note'",
    )


def parse_any(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> ParseResult:
    """Detect the format of ``path`` (:func:`detect_format`) and parse it with the matching parser.

    The size limit is checked first, so an oversized upload fails on its size, unread."""
    check_file(path, max_bytes)
    kind = detect_format(path)
    if kind == "bench":
        return parse_bench_serve(path, max_bytes=max_bytes)
    if kind == "multiturn":
        return parse_multiturn_stats(path, max_bytes=max_bytes)
    if kind == "log":
        return parse_log(path, max_bytes=max_bytes)
    if kind == "prometheus":
        return parse_prometheus(path, max_bytes=max_bytes)
    if kind == "points":
        return parse_points_csv(path, max_bytes=max_bytes)
    return parse_published_csv(path, max_bytes=max_bytes)


__all__ = [
    "DEFAULT_MAX_BYTES",
    "FORMATS",
    "KEY_ALIASES",
    "POINTS_COLUMNS",
    "POINT_KINDS",
    "PUBLISHED_COLUMNS",
    "PUBLISHED_SERIES",
    "SNIFF_BYTES",
    "BenchServeResult",
    "EngineLog",
    "HistogramSeries",
    "MultiTurnStats",
    "ParseResult",
    "PrometheusScrape",
    "ProxyLog",
    "VllmLog",
    "detect_format",
    "parse_any",
    "parse_bench_serve",
    "parse_engine_log",
    "parse_log",
    "parse_multiturn_stats",
    "parse_points_csv",
    "parse_prometheus",
    "parse_proxy_log",
    "parse_published_csv",
]
