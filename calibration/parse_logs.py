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
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kvplan.errors import input_error
from kvplan.inputfile import DEFAULT_MAX_BYTES, PathLike, file_label, read_text

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf)"
_VLLM_PREFIX = re.compile(
    r"(?:\((?P<proc>[^()]*)\)\s+)?(?P<level>DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL)\s+"
    r"(?P<date>\d{2}-\d{2})\s+(?P<time>\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)\s+\[?[^\]\s]+:\d+\]"
)
_PROXY_PREFIX = re.compile(
    r"^(?P<date>\d{4}-\d{2}-\d{2})[ T](?P<time>\d{2}:\d{2}:\d{2}(?:[.,]\d+)?)\s+"
    r"\[(?P<level>[A-Z]+)\]\s+[\w.\-]+:"
)
_KV = re.compile(r"KV Transfer metrics:\s*(?P<body>.*)$")
_KV_PAIR = re.compile(r"^\s*(?P<key>[A-Za-z0-9 ()/_.\-]+?)\s*=\s*(?P<val>\S*)\s*$")
_STATS = re.compile(
    r"(?:Engine (?P<engine>\d+):\s*)?Avg prompt throughput:\s*(?P<prompt>" + _NUM + r") tokens/s,\s*"
    r"Avg generation throughput:\s*(?P<gen>" + _NUM + r") tokens/s(?P<rest>.*)$"
)
_STATS_FIELDS = {  # column -> pattern on the rest of the stats line
    "running_reqs": re.compile(r"Running:\s*(" + _NUM + r") reqs"),
    "waiting_reqs": re.compile(r"(?:Waiting|Pending):\s*(" + _NUM + r") reqs"),
    "swapped_reqs": re.compile(r"Swapped:\s*(" + _NUM + r") reqs"),
    "preemptions": re.compile(r"Preemptions:\s*(" + _NUM + r")"),
    "gpu_kv_cache_usage_pct": re.compile(r"GPU KV cache usage:\s*(" + _NUM + r")%"),
    "prefix_cache_hit_rate_pct": re.compile(r"(?<!External )Prefix cache hit rate:\s*(" + _NUM + r")%"),
    "external_prefix_cache_hit_rate_pct": re.compile(r"External prefix cache hit rate:\s*(" + _NUM + r")%"),
}
_RELEASE = re.compile(
    r"Releasing expired KV blocks for request (?P<req>\S+) which were retrieved by (?P<n>\d+) decode "
    r"worker\(s\) within (?P<s>" + _NUM + r") seconds"
)
_DECLINE = re.compile(r"Declining expired remote read for (?P<req>\S+) from engine (?P<eng>.+?)\.?\s*$")
_REQ = r"(?:\[(?P<req>[^\]]+)\]\s+)?"
_CONV = r"conv=(?P<conv>\S+?):\s+"
_PREFILL = re.compile(r"\[(?P<req>[^\]]+)\]\s+Prefill done in\s*(?P<ms>" + _NUM + r")\s*ms")
_HIT = re.compile(_REQ + _CONV + r"cache HIT \(age=(?P<age>" + _NUM + r")s\)")
_MISS = re.compile(_REQ + _CONV + r"cache MISS")
_STALE = re.compile(
    _REQ + _CONV + r"stale cache entry \(age=(?P<age>" + _NUM + r")s\s*>\s*ttl=(?P<ttl>" + _NUM + r")s\)"
)
_CACHED = re.compile(
    _REQ + _CONV + r"cached D blocks \(remote_request_id=(?P<rid>[^,()]+),\s*blocks=(?P<blocks>\d+)\)"
)
_SEND = re.compile(_REQ + _CONV + r"sending D's cached blocks to P \(remote_request_id=(?P<rid>[^()]+)\)")

#: ``KV Transfer metrics`` key -> (column, factor to the column's unit, required?)
KV_FIELDS: dict[str, tuple[str, float, bool]] = {
    "Num successful transfers": ("num_transfers", 1.0, True),
    "Avg xfer time (ms)": ("avg_xfer_s", 1e-3, True),
    "P90 xfer time (ms)": ("p90_xfer_s", 1e-3, True),
    "Avg post time (ms)": ("avg_post_s", 1e-3, False),
    "P90 post time (ms)": ("p90_post_s", 1e-3, False),
    "Avg MB per transfer": ("avg_mib_per_transfer", 1.0, True),
    "Throughput (MB/s)": ("throughput_mib_s", 1.0, True),
    "Avg number of descriptors": ("avg_descriptors", 1.0, True),
    "Num failed transfers": ("num_failed_transfers", 1.0, False),
    "Num failed recvs": ("num_failed_recvs", 1.0, False),
    "Num failed notifications": ("num_failed_notifications", 1.0, False),
    "Num KV expired reqs": ("num_kv_expired_reqs", 1.0, False),
}
# How far into the file to look for the first timestamp (else the first matched line's stamp is used).
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


def _value(where: str, lineno: int, field: str, text: str, *, minimum: float = 0.0) -> float:
    """Parse one number printed in a log line: finite and at least ``minimum``."""
    try:
        out = float(text)
    except ValueError:
        raise input_error(where, f"line {lineno}: '{field}' is {text!r}, not a number") from None
    if not math.isfinite(out):
        raise input_error(
            where, f"line {lineno}: '{field}' is {text}: NaN/Infinity is not a valid measurement"
        )
    if out < minimum:
        raise input_error(where, f"line {lineno}: '{field}' is negative ({out:g})")
    return out


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


def _parse_kv(
    where: str, lineno: int, line: str, base: dict[str, Any], rows: dict[str, list[dict[str, Any]]]
) -> None:
    match = _KV.search(line)
    body = match.group("body") if match else ""
    values: dict[str, str] = {}
    parts = [p for p in body.split(",") if p.strip()]
    for i, part in enumerate(parts):
        pair = _KV_PAIR.match(part)
        if pair is None:
            cut = " (the line looks cut off)" if i == len(parts) - 1 else ""
            raise input_error(
                where,
                f"line {lineno}: cannot read {part.strip()!r} in a 'KV Transfer metrics' line{cut}",
                "pass the complete log",
            )
        values[pair.group("key")] = pair.group("val")
    row = dict(base)
    for key, (column, factor, required) in KV_FIELDS.items():
        if key not in values:
            if required:
                raise input_error(
                    where,
                    f"line {lineno}: 'KV Transfer metrics' line lacks '{key}'",
                    "the line may be cut; pass the complete log",
                )
            row[column] = math.nan
            continue
        row[column] = _value(where, lineno, key, values[key]) * factor
    if row["num_transfers"] != int(row["num_transfers"]):
        raise input_error(where, f"line {lineno}: 'Num successful transfers' is {row['num_transfers']:g}")
    rows["kv"].append(row)


def _parse_stats(
    where: str, lineno: int, line: str, base: dict[str, Any], rows: dict[str, list[dict[str, Any]]]
) -> None:
    match = _STATS.search(line)
    if match is None:
        raise input_error(where, f"line {lineno}: cannot read the 'Avg prompt throughput' stats line")
    row = dict(base)
    row["engine"] = int(match.group("engine")) if match.group("engine") else -1
    row["prompt_throughput_tok_s"] = _value(where, lineno, "Avg prompt throughput", match.group("prompt"))
    row["generation_throughput_tok_s"] = _value(
        where, lineno, "Avg generation throughput", match.group("gen")
    )
    rest = match.group("rest")
    for column, pattern in _STATS_FIELDS.items():
        found = pattern.search(rest)
        row[column] = _value(where, lineno, column, found.group(1)) if found else math.nan
    rows["stats"].append(row)


def _parse_release(
    where: str, lineno: int, line: str, base: dict[str, Any], rows: dict[str, list[dict[str, Any]]]
) -> None:
    match = _RELEASE.search(line)
    if match is None:
        raise input_error(where, f"line {lineno}: cannot read the 'Releasing expired KV blocks' line")
    row = dict(base, request_id=match.group("req"), num_decode_workers=int(match.group("n")))
    row["within_s"] = _value(where, lineno, "within seconds", match.group("s"))
    rows["release"].append(row)


def _parse_decline(
    where: str, lineno: int, line: str, base: dict[str, Any], rows: dict[str, list[dict[str, Any]]]
) -> None:
    match = _DECLINE.search(line)
    if match is None:
        raise input_error(where, f"line {lineno}: cannot read the 'Declining expired remote read' line")
    rows["decline"].append(dict(base, request_id=match.group("req"), remote_engine_id=match.group("eng")))


def _parse_prefill(
    where: str, lineno: int, line: str, base: dict[str, Any], rows: dict[str, list[dict[str, Any]]]
) -> None:
    match = _PREFILL.search(line)
    if match is None:
        raise input_error(where, f"line {lineno}: cannot read the 'Prefill done in <N>ms' line")
    row = {k: base[k] for k in ("line", "log_time", "time_s")}
    row["request_id"] = match.group("req")
    row["prefill_s"] = _value(where, lineno, "Prefill done in", match.group("ms")) / 1000.0
    rows["prefill"].append(row)


def _parse_cache(
    where: str, lineno: int, line: str, base: dict[str, Any], rows: dict[str, list[dict[str, Any]]]
) -> None:
    row: dict[str, Any] = {k: base[k] for k in ("line", "log_time", "time_s")}
    row.update(age_s=math.nan, ttl_s=math.nan, remote_request_id="", blocks=-1)
    for event, pattern in (
        ("hit", _HIT),
        ("miss", _MISS),
        ("stale", _STALE),
        ("cached_d_blocks", _CACHED),
        ("send_to_p", _SEND),
    ):
        match = pattern.search(line)
        if match is None:
            continue
        groups = match.groupdict()
        row["event"] = event
        row["conversation_id"] = groups["conv"]
        row["request_id"] = groups.get("req") or ""
        if groups.get("age") is not None:
            row["age_s"] = _value(where, lineno, "age", groups["age"])
        if groups.get("ttl") is not None:
            row["ttl_s"] = _value(where, lineno, "ttl", groups["ttl"])
        if groups.get("rid") is not None:
            row["remote_request_id"] = groups["rid"].strip()
        if groups.get("blocks") is not None:
            row["blocks"] = int(groups["blocks"])
        rows["cache"].append(row)
        return
    # 'conv=' and 'cache ' but none of the known messages: some other proxy line (e.g. a warning).


_PARSERS: dict[str, Callable[[str, int, str, dict[str, Any], dict[str, list[dict[str, Any]]]], None]] = {
    "kv": _parse_kv,
    "stats": _parse_stats,
    "release": _parse_release,
    "decline": _parse_decline,
    "prefill": _parse_prefill,
    "cache": _parse_cache,
}


def _frame(rows: list[dict[str, Any]], columns: list[str]) -> pd.DataFrame:
    """Build a frame with fixed columns (also when empty) and sensible dtypes."""
    frame = pd.DataFrame(rows, columns=columns)
    for col in frame.columns:
        if col in ("line", "blocks", "engine", "num_decode_workers"):
            frame[col] = frame[col].astype(np.int64)
        elif col in (
            "log_time",
            "process",
            "request_id",
            "conversation_id",
            "event",
            "remote_request_id",
            "remote_engine_id",
        ):
            frame[col] = frame[col].astype(str)
        else:
            frame[col] = frame[col].astype(np.float64)
    if "num_transfers" in frame:
        frame["num_transfers"] = frame["num_transfers"].astype(np.int64)
    return frame
