"""Patterns and field parsers of single vLLM engine and proxy log lines (used by :mod:`~kvplan.calibration.parse_logs`)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from kvplan.errors import input_error

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
#: Every pattern below is linear in the line's length (a hostile 1 MB line is read in milliseconds): each
#: unbounded run is a single character class that the next literal cannot continue (no lazy ``.+?`` before
#: ``\s*$``, no ``\S+?`` before a separator), and ids are bounded (``{1,MAX_ID}``) where a search restarts
#: at every position; a ``KV Transfer metrics`` pair is split with ``str.partition``, not a regex.
MAX_ID = 512
_KV_KEY = re.compile(r"[A-Za-z0-9 ()/_.\-]+")
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
    r"Releasing expired KV blocks for request (?P<req>\S{1,512}) which were retrieved by (?P<n>\d{1,18}) decode "
    r"worker\(s\) within (?P<s>" + _NUM + r") seconds"
)
_DECLINE = re.compile(r"Declining expired remote read for (?P<req>\S{1,512}) from engine (?P<eng>\S[^\n]{0,511})")
_REQ = r"(?:\[(?P<req>[^\][]{1,512})\]\s{1,64})?"
_CONV = r"conv=(?P<conv>[^\s:=]{1,512}(?::[^\s:=]{1,512}){0,8}):\s{1,64}"
_PREFILL = re.compile(r"\[(?P<req>[^\][]{1,512})\]\s{1,64}Prefill done in\s{0,64}(?P<ms>" + _NUM + r")\s{0,64}ms")
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


def _parse_kv(
    where: str, lineno: int, line: str, base: dict[str, Any], rows: dict[str, list[dict[str, Any]]]
) -> None:
    match = _KV.search(line)
    body = match.group("body") if match else ""
    values: dict[str, str] = {}
    parts = [p for p in body.split(",") if p.strip()]
    for i, part in enumerate(parts):
        key, eq, val = part.partition("=")
        key, val = key.strip(), val.strip()
        if not eq or not _KV_KEY.fullmatch(key) or any(c.isspace() for c in val):
            cut = " (the line looks cut off)" if i == len(parts) - 1 else ""
            raise input_error(
                where,
                f"line {lineno}: cannot read {part.strip()!r} in a 'KV Transfer metrics' line{cut}",
                "pass the complete log",
            )
        values[key] = val
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
    engine = match.group("eng").rstrip().removesuffix(".").rstrip()
    rows["decline"].append(dict(base, request_id=match.group("req"), remote_engine_id=engine))


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
    for event, pattern, literal in (
        ("hit", _HIT, "cache HIT"),
        ("miss", _MISS, "cache MISS"),
        ("stale", _STALE, "stale cache entry"),
        ("cached_d_blocks", _CACHED, "cached D blocks"),
        ("send_to_p", _SEND, "sending D's cached blocks"),
    ):
        match = pattern.search(line) if literal in line else None  # one search per line, not five
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
