"""Moved to :mod:`kvplan.traces` (trace readers sit below ``kvplan.sim`` in the layer contract).

A re-export kept so that code written against the old path still imports; new code imports
:mod:`kvplan.traces.readers`, ``.sessions``, ``.select``, ``.stats`` and ``.trace`` directly.
"""

from __future__ import annotations

from kvplan.traces.readers import detect_trace_format, load_trace
from kvplan.traces.select import select
from kvplan.traces.sessions import link_prefix_chains, split_sessions, trace_from_sessions
from kvplan.traces.stats import (
    CONTEXT_TURNS,
    CRUDE_DECODE_S_PER_TOKEN,
    CRUDE_PREFILL_TOKENS_PER_S,
    DEFAULT_TTLS_S,
    PERCENTILES,
    ServiceTimeFn,
    crude_service_time_s,
    json_ready,
    percentile_summary,
    stats_figure,
    stats_table,
    turn_pairs,
    workload_stats,
)
from kvplan.traces.trace import (
    CLOCK_RESTART_S,
    COLUMNS,
    CSV_HEADER,
    DEFAULT_MIN_BLOCKS,
    MOONCAKE_BLOCK_TOKENS,
    TRACE_FORMATS,
    Trace,
    TraceFormat,
)

__all__ = [
    "CLOCK_RESTART_S", "COLUMNS", "CONTEXT_TURNS", "CRUDE_DECODE_S_PER_TOKEN", "CRUDE_PREFILL_TOKENS_PER_S",
    "CSV_HEADER", "DEFAULT_MIN_BLOCKS", "DEFAULT_TTLS_S", "MOONCAKE_BLOCK_TOKENS", "PERCENTILES", "ServiceTimeFn",
    "TRACE_FORMATS", "Trace", "TraceFormat", "crude_service_time_s", "detect_trace_format", "json_ready",
    "link_prefix_chains", "load_trace", "percentile_summary", "select", "split_sessions", "stats_figure",
    "stats_table", "trace_from_sessions", "turn_pairs", "workload_stats",
]
