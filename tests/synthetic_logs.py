"""Synthetic vLLM engine logs and multi-turn proxy logs (see synthetic_traces)."""

from __future__ import annotations

import datetime as dt
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from synthetic_common import MIB, CachedPrefillFn, TransferFn, _noise, _write_atomic

# --------------------------------------------------------------------------------------------------
# vLLM engine log (NIXL KV Transfer metrics)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class EngineLogTruth:
    """What :func:`write_engine_log` wrote.

    ``intervals``: one row per ``KV Transfer metrics`` line, with the printed values converted to the
    parser's units (``time_s``, ``num_transfers``, ``avg_xfer_s``, ``p90_xfer_s``, ``avg_post_s``,
    ``p90_post_s``, ``avg_mib_per_transfer``, ``throughput_mib_s``, ``avg_descriptors``).
    ``observations``: the raw per-rank transfers (``interval``, ``request``, ``rank``, ``tokens``,
    ``bytes``, ``xfer_s``, ``post_s``, ``descriptors``) before vLLM's ``reduce()``.
    ``stats``: the periodic stats lines (``time_s``, ``prompt_throughput_tok_s``, ``running_reqs``...).
    """

    intervals: pd.DataFrame
    observations: pd.DataFrame
    stats: pd.DataFrame
    n_expired_releases: int
    n_declined_reads: int


def _vllm_prefix(stamp: dt.datetime, process: str, source: str, level: str = "INFO") -> str:
    tag = f"({process}) " if process else ""
    return f"{tag}{level} {stamp:%m-%d %H:%M:%S} [{source}]"


def write_engine_log(
    path: os.PathLike[str] | str,
    rng: np.random.Generator,
    transfer_fn: TransferFn,
    request_tokens: Sequence[int],
    *,
    bytes_per_token_per_rank: int,
    tp: int = 8,
    requests_per_interval: int = 4,
    interval_s: float = 10.0,
    post_fn: TransferFn | None = None,
    regions_per_rank: int = 128,
    block_size_tokens: int = 16,
    noise_frac: float = 0.05,
    n_expired: int = 2,
    n_declined: int = 1,
    process: str = "EngineCore_DP0 pid=4242",
    start: dt.datetime = dt.datetime(2026, 9, 21, 12, 0, 0),
) -> EngineLogTruth:
    """Write a vLLM engine log with ``KV Transfer metrics`` lines from a known transfer-time function.

    Requests are pulled ``requests_per_interval`` at a time; each is read by all ``tp`` ranks, so one
    request gives ``tp`` observations (vLLM pools ranks): per-rank bytes
    ``tokens * bytes_per_token_per_rank``, ``xfer_s = transfer_fn(tokens) * noise`` (per rank),
    ``post_s = post_fn(tokens) * noise`` (default 5 % of the transfer), descriptors
    ``regions_per_rank * ceil(tokens / block_size_tokens)``. Each interval prints NIXL ``reduce()``
    exactly: count, mean and P90 (numpy percentile) of the times in ms rounded to 3 decimals, MiB per
    transfer, total MiB / total transfer seconds, mean descriptors rounded to 1 decimal. Startup lines,
    HTTP access lines, periodic ``Engine 000`` stats lines and ``n_expired`` / ``n_declined``
    expiry lines are mixed in.
    """
    post = post_fn if post_fn is not None else (lambda tok: 0.05 * transfer_fn(tok))
    lines = [
        f"{_vllm_prefix(start, '', 'api_server.py:1885')} vLLM API server version 0.29.0",
        f"{_vllm_prefix(start, process, 'core.py:93')} Initializing a V1 LLM engine (v0.29.0) with config: "
        f"model='Qwen/Qwen3-32B', tensor_parallel_size={tp}",
        f"{_vllm_prefix(start, process, 'nixl_connector.py:812', 'WARNING')} Using LIBFABRIC backend",
    ]
    obs_rows: list[dict[str, Any]] = []
    kv_rows: list[dict[str, Any]] = []
    stat_rows: list[dict[str, Any]] = []
    tokens_all = [int(t) for t in request_tokens]
    n_intervals = math.ceil(len(tokens_all) / requests_per_interval)
    expired_at = set(rng.choice(n_intervals, size=min(n_expired, n_intervals), replace=False).tolist())
    declined_at = set(rng.choice(n_intervals, size=min(n_declined, n_intervals), replace=False).tolist())
    n_exp = n_dec = 0
    for k in range(n_intervals):
        stamp = start + dt.timedelta(seconds=(k + 1) * interval_s)
        batch = tokens_all[k * requests_per_interval : (k + 1) * requests_per_interval]
        xfer: list[float] = []
        post_s: list[float] = []
        nbytes: list[int] = []
        descs: list[int] = []
        for j, tok in enumerate(batch):
            request = k * requests_per_interval + j
            lines.append(
                f'INFO:     10.0.0.7:{40000 + request} - "POST /v1/chat/completions HTTP/1.1" 200 OK'
            )
            for rank in range(tp):
                x = transfer_fn(tok) * _noise(rng, noise_frac)
                p = post(tok) * _noise(rng, noise_frac)
                b = tok * bytes_per_token_per_rank
                d = regions_per_rank * math.ceil(tok / block_size_tokens)
                xfer.append(x)
                post_s.append(p)
                nbytes.append(b)
                descs.append(d)
                obs_rows.append(
                    {
                        "interval": k,
                        "request": request,
                        "rank": rank,
                        "tokens": tok,
                        "bytes": b,
                        "xfer_s": x,
                        "post_s": p,
                        "descriptors": d,
                    }
                )
        x_arr, p_arr = np.asarray(xfer), np.asarray(post_s)
        mib = np.asarray(nbytes, dtype=np.float64) / MIB
        printed = {  # NIXL stats.py reduce(), value for value
            "Num successful transfers": len(xfer),
            "Avg xfer time (ms)": round(float(x_arr.mean()) * 1e3, 3),
            "P90 xfer time (ms)": round(float(np.percentile(x_arr, 90)) * 1e3, 3),
            "Avg post time (ms)": round(float(p_arr.mean()) * 1e3, 3),
            "P90 post time (ms)": round(float(np.percentile(p_arr, 90)) * 1e3, 3),
            "Avg MB per transfer": round(float(mib.sum() / len(xfer)), 3),
            "Throughput (MB/s)": round(float(mib.sum() / x_arr.sum()), 3),
            "Avg number of descriptors": round(float(np.mean(descs)), 1),
        }
        body = ", ".join(f"{key}={value}" for key, value in printed.items())
        lines.append(f"{_vllm_prefix(stamp, process, 'metrics.py:127')} KV Transfer metrics: {body}")
        kv_rows.append(
            {
                "time_s": (k + 1) * interval_s,
                "num_transfers": printed["Num successful transfers"],
                "avg_xfer_s": printed["Avg xfer time (ms)"] * 1e-3,
                "p90_xfer_s": printed["P90 xfer time (ms)"] * 1e-3,
                "avg_post_s": printed["Avg post time (ms)"] * 1e-3,
                "p90_post_s": printed["P90 post time (ms)"] * 1e-3,
                "avg_mib_per_transfer": printed["Avg MB per transfer"],
                "throughput_mib_s": printed["Throughput (MB/s)"],
                "avg_descriptors": printed["Avg number of descriptors"],
            }
        )
        prompt_tput = round(sum(batch) / interval_s, 1)
        running, waiting = len(batch), int(rng.integers(0, 3))
        usage, hit = round(float(rng.uniform(1, 60)), 1), round(float(rng.uniform(0, 90)), 1)
        lines.append(
            f"{_vllm_prefix(stamp, process, 'loggers.py:123')} Engine 000: Avg prompt throughput: "
            f"{prompt_tput} tokens/s, Avg generation throughput: 42.0 tokens/s, Running: {running} reqs, "
            f"Waiting: {waiting} reqs, GPU KV cache usage: {usage}%, Prefix cache hit rate: {hit}%, "
            f"External prefix cache hit rate: 50.0%"
        )
        stat_rows.append(
            {
                "time_s": (k + 1) * interval_s,
                "prompt_throughput_tok_s": prompt_tput,
                "running_reqs": running,
                "waiting_reqs": waiting,
                "gpu_kv_cache_usage_pct": usage,
                "prefix_cache_hit_rate_pct": hit,
            }
        )
        if k in expired_at:
            n_exp += 1
            lines.append(
                f"{_vllm_prefix(stamp, process, 'pull_scheduler.py:402', 'WARNING')} Releasing expired KV "
                f"blocks for request cmpl-{k:04d}-0 which were retrieved by 1 decode worker(s) within 480 "
                f"seconds."
            )
        if k in declined_at:
            n_dec += 1
            lines.append(
                f"{_vllm_prefix(stamp, process, 'pull_scheduler.py:455', 'WARNING')} Declining expired "
                f"remote read for cmpl-{k:04d}-1 from engine 7c1e9a.",
            )
    _write_atomic(path, "\n".join(lines) + "\n")
    return EngineLogTruth(
        intervals=pd.DataFrame(kv_rows),
        observations=pd.DataFrame(obs_rows),
        stats=pd.DataFrame(stat_rows),
        n_expired_releases=n_exp,
        n_declined_reads=n_dec,
    )


# --------------------------------------------------------------------------------------------------
# disagg_proxy_multiturn.py log
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ProxyLogTruth:
    """What :func:`write_proxy_log` wrote: ``prefill`` (``time_s``, ``request_id``, ``prefill_s`` as
    printed, ``new_tokens``, ``cached_tokens``, ``conversation_id``) and ``events`` (``time_s``,
    ``event``, ``conversation_id``, ``request_id``, ``age_s``, ``ttl_s``, ``remote_request_id``,
    ``blocks``) in file order."""

    prefill: pd.DataFrame
    events: pd.DataFrame


def write_proxy_log(
    path: os.PathLike[str] | str,
    rng: np.random.Generator,
    cached_prefill_fn: CachedPrefillFn,
    *,
    n_conversations: int = 6,
    user_turns: int = 5,
    prefix_tokens: int = 2000,
    user_tokens: int = 150,
    output_tokens: int = 300,
    ttl_s: float = 480.0,
    turn_gap_s_range: tuple[float, float] = (5.0, 60.0),
    stale_after_turn: int = 0,
    block_size_tokens: int = 16,
    start: dt.datetime = dt.datetime(2026, 9, 21, 12, 0, 0),
) -> ProxyLogTruth:
    """Write a ``disagg_proxy_multiturn.py`` log for multi-turn conversations; return the truth.

    Turn 1 of a conversation is a ``cache MISS`` (P prefills the whole prompt); later turns are a
    ``cache HIT`` (age = time since D cached the blocks), P pulls the history from D (``sending D's
    cached blocks to P``) and computes only the new tokens. If ``stale_after_turn`` > 0, the turn after
    it comes after a gap longer than ``ttl_s``: ``stale cache entry ... discarding`` then a MISS. The
    prefill leg takes ``cached_prefill_fn(new, cached)`` (printed in ms with 2 decimals). After D
    answers, ``cached D blocks`` reports ``ceil((prompt + output) / block_size_tokens)`` blocks.
    Timestamps have one-second resolution, like the proxy's log format.
    """
    events: list[tuple[float, int, dict[str, Any]]] = []  # (time, order, record)
    order = 0
    for c in range(n_conversations):
        conv = f"CONV_ID_{c}"
        t = float(rng.uniform(0.0, 30.0))
        cached_at: float | None = None
        remote = ""
        for u in range(1, user_turns + 1):
            req = f"{c:02d}{u:02d}-{int(rng.integers(0, 16**8)):08x}"
            prompt = prefix_tokens + u * user_tokens + (u - 1) * output_tokens
            history = prompt - (prefix_tokens + user_tokens if u == 1 else user_tokens)
            records: list[dict[str, Any]] = []
            hit = False
            if cached_at is not None:
                age = t - cached_at
                if age > ttl_s:
                    records.append({"event": "stale", "age_s": round(age, 1), "ttl_s": ttl_s})
                else:
                    hit = True
                    records.append({"event": "hit", "age_s": round(age, 1)})
                    records.append({"event": "send_to_p", "request_id": req, "remote_request_id": remote})
            if not hit:
                records.append({"event": "miss", "request_id": req})
            cached = history if hit else 0
            prefill_s = cached_prefill_fn(prompt - cached, cached) * _noise(rng, 0.03)
            prefill_ms = float(f"{prefill_s * 1000:.2f}")
            for r in records:
                events.append((t, order, {"conversation_id": conv, **r}))
                order += 1
            t_done = t + prefill_s
            events.append(
                (
                    t_done,
                    order,
                    {
                        "event": "prefill",
                        "request_id": req,
                        "prefill_s": prefill_ms / 1000,
                        "prefill_ms_text": f"{prefill_ms:.2f}",
                        "new_tokens": prompt - cached,
                        "cached_tokens": cached,
                        "conversation_id": conv,
                    },
                )
            )
            order += 1
            t_answer = t_done + 0.03 * output_tokens
            remote = f"cmpl-d-{req}"
            blocks = math.ceil((prompt + output_tokens) / block_size_tokens)
            events.append(
                (
                    t_answer,
                    order,
                    {
                        "event": "cached_d_blocks",
                        "conversation_id": conv,
                        "remote_request_id": remote,
                        "blocks": blocks,
                    },
                )
            )
            order += 1
            cached_at = t_answer
            gap = float(rng.uniform(*turn_gap_s_range))
            if stale_after_turn and u == stale_after_turn:
                gap = ttl_s + 60.0
            t = t_answer + gap
    events.sort(key=lambda e: (e[0], e[1]))
    lines: list[str] = []
    prefill_rows: list[dict[str, Any]] = []
    event_rows: list[dict[str, Any]] = []
    t0 = math.floor(events[0][0])
    for t, _, rec in events:
        stamp = start + dt.timedelta(seconds=math.floor(t))
        prefix = f"{stamp:%Y-%m-%d %H:%M:%S} [INFO] disagg_proxy:"
        time_s = float(math.floor(t) - t0)
        kind = rec["event"]
        conv = rec.get("conversation_id", "")
        if kind == "prefill":
            lines.append(f"{prefix} [{rec['request_id']}] Prefill done in {rec['prefill_ms_text']}ms")
            prefill_rows.append(
                {
                    "time_s": time_s,
                    "request_id": rec["request_id"],
                    "prefill_s": rec["prefill_s"],
                    "new_tokens": rec["new_tokens"],
                    "cached_tokens": rec["cached_tokens"],
                    "conversation_id": conv,
                }
            )
            continue
        row = {
            "time_s": time_s,
            "event": kind,
            "conversation_id": conv,
            "request_id": "",
            "age_s": math.nan,
            "ttl_s": math.nan,
            "remote_request_id": "",
            "blocks": -1,
        }
        if kind == "hit":
            lines.append(f"{prefix} conv={conv}: cache HIT (age={rec['age_s']:.1f}s)")
            row["age_s"] = rec["age_s"]
        elif kind == "miss":
            lines.append(f"{prefix} [{rec['request_id']}] conv={conv}: cache MISS")
            row["request_id"] = rec["request_id"]
        elif kind == "stale":
            lines.append(
                f"{prefix} conv={conv}: stale cache entry (age={rec['age_s']:.1f}s > "
                f"ttl={rec['ttl_s']:.1f}s), discarding"
            )
            row.update(age_s=rec["age_s"], ttl_s=rec["ttl_s"])
        elif kind == "send_to_p":
            lines.append(
                f"{prefix} [{rec['request_id']}] conv={conv}: sending D's cached blocks to P "
                f"(remote_request_id={rec['remote_request_id']})"
            )
            row.update(request_id=rec["request_id"], remote_request_id=rec["remote_request_id"])
        else:
            lines.append(
                f"{prefix} conv={conv}: cached D blocks (remote_request_id={rec['remote_request_id']}, "
                f"blocks={rec['blocks']})"
            )
            row.update(remote_request_id=rec["remote_request_id"], blocks=rec["blocks"])
        event_rows.append(row)
    _write_atomic(path, "\n".join(lines) + "\n")
    return ProxyLogTruth(prefill=pd.DataFrame(prefill_rows), events=pd.DataFrame(event_rows))
