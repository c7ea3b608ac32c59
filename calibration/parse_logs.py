"""Parsers of vLLM engine logs and of the multi-turn disaggregated proxy log (VLLM_BEHAVIOUR.md 2.3-2.4).

Engine lines (any vLLM log; the prefix ``INFO 09-21 12:34:56 [file.py:123]``, optionally after a
process tag such as ``(EngineCore_DP0 pid=123)``, gives the line's time):

* ``KV Transfer metrics: Num successful transfers=<n>, Avg xfer time (ms)=<f>, P90 xfer time (ms)=<f>,
  Avg post time (ms)=<f>, P90 post time (ms)=<f>, Avg MB per transfer=<f>, Throughput (MB/s)=<f>,
  Avg number of descriptors=<f>``: NIXL ``reduce()`` over one logging interval. "MB" is MiB
  (bytes / 2**20); with TP > 1 the observations of all ranks are pooled, so the count is about
  TP x requests and MB per transfer is *per rank*. Newer versions append ``Num failed transfers``
  and ``Num KV expired reqs``; one fork omits the post times (NaN here).
* ``Engine 000: Avg prompt throughput: X tokens/s, Avg generation throughput: Y tokens/s, Running: N
  reqs, Waiting: M reqs, [Preemptions: P,] GPU KV cache usage: Z%, Prefix cache hit rate: W%[, External
  prefix cache hit rate: V%]``.
* ``Releasing expired KV blocks for request <id> which were retrieved by <n> decode worker(s) within
  <s> seconds.`` and ``Declining expired remote read for <id> from engine <id>.``

Proxy lines (``%Y-%m-%d %H:%M:%S [LEVEL] disagg_proxy: ...``): ``[<req>] Prefill done in <N>ms``
(the whole P leg, wall clock), ``conv=<id>: cache HIT (age=<s>s)``, ``[<req>] conv=<id>: cache MISS``,
``conv=<id>: stale cache entry (age=<s>s > ttl=<s>s), discarding``, ``conv=<id>: cached D blocks
(remote_request_id=<id>, blocks=<n>)`` and ``[<req>] conv=<id>: sending D's cached blocks to P
(remote_request_id=<id>)``.

Each parsed line keeps its 1-based ``line`` number, the timestamp text as printed (``log_time``, empty
when the line has no recognised prefix) and ``time_s``, seconds since the first timestamped line of
the file, matched or not (NaN without a timestamp). vLLM's prefix has no year: a year is taken from the
proxy lines of the same file if any, and a date going backwards is read as a new year.
"""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from kvplan.calibration.log_lines import (
    _ANSI,
    _PARSERS,
    _PROXY_PREFIX,
    _STATS_FIELDS,
    _VLLM_PREFIX,
    KV_FIELDS,
    _frame,
)
from kvplan.errors import input_error
from kvplan.inputfile import DEFAULT_MAX_BYTES, PathLike, file_label, read_text

_ORIGIN_SEARCH_LINES = 10_000
_CACHE_EVENTS = ("hit", "miss", "stale", "cached_d_blocks", "send_to_p")
_LINE_COLS = ["line", "log_time", "time_s", "process"]

#: What a log file must contain at least one of (used in the "no matching line" error).
EXPECTED_PATTERNS = (
    "'KV Transfer metrics:'",
    "'Avg prompt throughput:'",
    "'Releasing expired KV blocks'",
    "'Declining expired remote read'",
    "'Prefill done in <N>ms'",
    "'conv=<id>: cache HIT/MISS'",
    "'stale cache entry'",
    "'cached D blocks'",
)


@dataclass(frozen=True, eq=False)
class EngineLog:
    """vLLM engine log lines of interest, one frame per kind (every frame has ``line``, ``log_time``,
    ``time_s`` and ``process``, the ``(EngineCore_DP0 pid=...)`` tag or '').

    Attributes:
        source: the file, as given.
        kv_transfer: one row per ``KV Transfer metrics`` line: ``num_transfers`` (pooled over TP ranks),
            ``avg_xfer_s``, ``p90_xfer_s``, ``avg_post_s``, ``p90_post_s`` (s; NaN if not printed),
            ``avg_mib_per_transfer`` (MiB per rank), ``throughput_mib_s`` (total MiB / summed transfer
            seconds), ``avg_descriptors``, and the failure counters of newer versions (NaN if absent).
        stats: one row per periodic ``Avg prompt throughput`` line: ``engine``, ``prompt_throughput_tok_s``
            (locally computed tokens in recent versions), ``generation_throughput_tok_s``,
            ``running_reqs``, ``waiting_reqs``, ``swapped_reqs``, ``preemptions``,
            ``gpu_kv_cache_usage_pct``, ``prefix_cache_hit_rate_pct``, ``external_prefix_cache_hit_rate_pct``
            (NaN where this vLLM version does not print the field).
        expired_releases: ``request_id``, ``num_decode_workers``, ``within_s`` per release line.
        declined_reads: ``request_id``, ``remote_engine_id`` per declined expired read.
    """

    source: str
    kv_transfer: pd.DataFrame
    stats: pd.DataFrame
    expired_releases: pd.DataFrame
    declined_reads: pd.DataFrame

    @property
    def n_expired_releases(self) -> int:
        """Number of ``Releasing expired KV blocks`` lines."""
        return len(self.expired_releases)

    @property
    def n_declined_reads(self) -> int:
        """Number of ``Declining expired remote read`` lines."""
        return len(self.declined_reads)

    @property
    def is_empty(self) -> bool:
        """True when no engine line of interest was found."""
        return not (
            len(self.kv_transfer) or len(self.stats) or len(self.expired_releases) or len(self.declined_reads)
        )


@dataclass(frozen=True, eq=False)
class ProxyLog:
    """Lines of ``disagg_proxy_multiturn.py`` (every frame has ``line``, ``log_time``, ``time_s``).

    Attributes:
        source: the file, as given.
        prefill: ``request_id`` and ``prefill_s`` (the proxy's whole P leg, wall clock) per
            ``Prefill done`` line.
        cache_events: ``event`` (``hit``, ``miss``, ``stale``, ``cached_d_blocks``, ``send_to_p``),
            ``conversation_id``, ``request_id`` ('' if the line has none), ``age_s``, ``ttl_s`` (NaN
            unless printed), ``remote_request_id`` ('' unless printed), ``blocks`` (-1 unless printed).
            Join ``prefill`` to a conversation through ``request_id`` of the ``miss``/``send_to_p`` lines.
    """

    source: str
    prefill: pd.DataFrame
    cache_events: pd.DataFrame

    def count(self, event: str) -> int:
        """Number of cache events of one kind, e.g. ``count("hit")``."""
        if event not in _CACHE_EVENTS:
            raise ValueError(f"unknown cache event {event!r}; expected one of {_CACHE_EVENTS}")
        return int((self.cache_events["event"] == event).sum())

    @property
    def is_empty(self) -> bool:
        """True when no proxy line was found."""
        return not (len(self.prefill) or len(self.cache_events))


@dataclass(frozen=True, eq=False)
class VllmLog:
    """What :func:`parse_log` found in one file: engine lines, proxy lines, or both (``None`` if absent)."""

    source: str
    engine: EngineLog | None
    proxy: ProxyLog | None


def parse_log(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> VllmLog:
    """Parse a log that may hold vLLM engine lines, proxy lines or both; the CLI's entry point.

    Raises :class:`~kvplan.errors.KvplanInputError` if no line matches any known pattern, or a matching
    line is malformed (the message names the file and the line number).
    """
    engine, proxy = _scan(path, max_bytes)
    if engine.is_empty and proxy.is_empty:
        raise input_error(
            file_label(path),
            "no vLLM engine or proxy line found (expected one of " + ", ".join(EXPECTED_PATTERNS) + ")",
            "pass the engine log (stdout of vllm serve) or the disagg proxy log",
        )
    return VllmLog(
        source=file_label(path),
        engine=None if engine.is_empty else engine,
        proxy=None if proxy.is_empty else proxy,
    )


def parse_engine_log(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> EngineLog:
    """Parse the engine lines of a vLLM log; error if the file has none."""
    engine, _ = _scan(path, max_bytes)
    if engine.is_empty:
        raise input_error(
            file_label(path),
            "no vLLM engine line found (expected one of " + ", ".join(EXPECTED_PATTERNS[:4]) + ")",
            "pass the vllm serve log of the node that initiates the NIXL reads",
        )
    return engine


def parse_proxy_log(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> ProxyLog:
    """Parse the lines of ``disagg_proxy_multiturn.py``; error if the file has none."""
    _, proxy = _scan(path, max_bytes)
    if proxy.is_empty:
        raise input_error(
            file_label(path),
            "no disagg proxy line found (expected one of " + ", ".join(EXPECTED_PATTERNS[4:]) + ")",
            "pass the log of disagg_proxy_multiturn.py",
        )
    return proxy


class _Clock:
    """Turns printed timestamps into seconds since the first one (see the module docstring)."""

    def __init__(self, default_year: int) -> None:
        self.year = default_year
        self.last_vllm: dt.datetime | None = None
        self.origin: dt.datetime | None = None

    def vllm(self, mmdd: str, hms: str) -> dt.datetime:
        month, day = int(mmdd[:2]), int(mmdd[3:])
        stamp = dt.datetime(self.year, month, day) + _hms(hms)
        if self.last_vllm is not None and (self.last_vllm - stamp).days > 180:
            self.year += 1  # 12-31 -> 01-01
            stamp = dt.datetime(self.year, month, day) + _hms(hms)
        self.last_vllm = stamp
        return stamp

    def seconds(self, stamp: dt.datetime | None) -> float:
        if stamp is None:
            return math.nan
        if self.origin is None:
            self.origin = stamp
        return (stamp - self.origin).total_seconds()


def _hms(text: str) -> dt.timedelta:
    h, m, s = text.replace(",", ".").split(":")
    return dt.timedelta(hours=int(h), minutes=int(m), seconds=float(s))


def _scan(path: PathLike, max_bytes: int) -> tuple[EngineLog, ProxyLog]:
    """One pass over the file collecting every kind of line."""
    where = file_label(path)
    text = read_text(path, max_bytes)
    lines = text.splitlines()
    first_proxy = next((m for m in map(_PROXY_PREFIX.match, lines) if m is not None), None)
    clock = _Clock(int(first_proxy.group("date")[:4]) if first_proxy else 2000)  # 2000: a leap year
    for line in lines[:_ORIGIN_SEARCH_LINES]:  # time origin: the first timestamped line (server start)
        origin = _stamp(clock, _ANSI.sub("", line))[1]
        if origin is not None:
            clock.seconds(origin)
            break
    rows: dict[str, list[dict[str, Any]]] = {
        k: [] for k in ("kv", "stats", "release", "decline", "prefill", "cache")
    }

    for lineno, line in enumerate(lines, start=1):
        if "\x1b" in line:
            line = _ANSI.sub("", line)
        kind = _classify(line)
        if kind is None:
            continue
        base, stamp = _stamp(clock, line)
        base["line"] = lineno
        base["time_s"] = clock.seconds(stamp)
        _PARSERS[kind](where, lineno, line, base, rows)

    engine = EngineLog(
        source=where,
        kv_transfer=_frame(rows["kv"], _LINE_COLS + [c for c, _, _ in KV_FIELDS.values()]),
        stats=_frame(
            rows["stats"],
            _LINE_COLS + ["engine", "prompt_throughput_tok_s", "generation_throughput_tok_s", *_STATS_FIELDS],
        ),
        expired_releases=_frame(
            rows["release"], _LINE_COLS + ["request_id", "num_decode_workers", "within_s"]
        ),
        declined_reads=_frame(rows["decline"], _LINE_COLS + ["request_id", "remote_engine_id"]),
    )
    proxy_cols = ["line", "log_time", "time_s"]
    proxy = ProxyLog(
        source=where,
        prefill=_frame(rows["prefill"], proxy_cols + ["request_id", "prefill_s"]),
        cache_events=_frame(
            rows["cache"],
            proxy_cols
            + ["event", "conversation_id", "request_id", "age_s", "ttl_s", "remote_request_id", "blocks"],
        ),
    )
    return engine, proxy


def _stamp(clock: _Clock, line: str) -> tuple[dict[str, Any], dt.datetime | None]:
    """Read the proxy or vLLM prefix of a line: (``log_time``/``process`` fields, time or None).

    An impossible date such as ``02-30`` keeps its ``log_time`` text but gets no time (NaN ``time_s``)."""
    base: dict[str, Any] = {"log_time": "", "process": ""}
    try:
        pm = _PROXY_PREFIX.match(line)
        if pm is not None:
            base["log_time"] = f"{pm.group('date')} {pm.group('time')}"
            return base, dt.datetime.fromisoformat(pm.group("date")) + _hms(pm.group("time"))
        vm = _VLLM_PREFIX.search(line)
        if vm is not None:
            base["log_time"] = f"{vm.group('date')} {vm.group('time')}"
            base["process"] = vm.group("proc") or ""
            return base, clock.vllm(vm.group("date"), vm.group("time"))
    except ValueError:
        return base, None
    return base, None


def _classify(line: str) -> str | None:
    """Cheap substring test before any regex (most log lines match nothing)."""
    if "KV Transfer metrics" in line:
        return "kv"
    if "Avg prompt throughput" in line:
        return "stats"
    if "Releasing expired KV blocks" in line:
        return "release"
    if "Declining expired remote read" in line:
        return "decline"
    if "Prefill done in" in line:
        return "prefill"
    if "conv=" in line and ("cache " in line or "cached D blocks" in line or "sending D's cached" in line):
        return "cache"
    return None
