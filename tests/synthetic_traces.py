"""Seeded generators that WRITE trace files in the real vLLM / NIXL formats from known parameters.

Each ``write_*`` function takes the output path, a ``numpy.random.Generator`` (its only source of
randomness: same seed, same bytes) and the "true" timing functions, writes one file exactly as the real
tool would (key names, units, clocks, number formatting; VLLM_BEHAVIOUR.md 2.1-2.5, constraints of 2.7)
and returns the ground truth, so tests can check that parsing gives back what was written and fits can
check that they recover the parameters.

Timing functions (all return SECONDS; write them as pure functions of tokens):

* ``prefill_fn(input_len_tokens) -> s``: prefill of a whole prompt with nothing cached (bench serve).
* ``cached_prefill_fn(new_tokens, cached_tokens) -> s``: compute ``new_tokens`` on top of
  ``cached_tokens`` already in KV (multi-turn benchmark, proxy log, points CSV).
* ``decode_step_fn(context_tokens) -> s``: time of one output token at that context length.
* ``transfer_fn(tokens) -> s``: one rank's NIXL transfer of ``tokens`` tokens of KV.

Writers and what they return:

* :func:`write_bench_serve` -> the JSON object written (``dict``).
* :func:`write_multiturn_stats` -> the list of record dicts written.
* :func:`write_engine_log` -> :class:`EngineLogTruth` (printed interval values + raw per-rank observations).
* :func:`write_proxy_log` -> :class:`ProxyLogTruth` (prefill lines + cache events).
* :func:`write_prometheus` -> :class:`PrometheusTruth` (raw observations, counters, gauges per scrape).
* :func:`write_points_csv` -> the frame written (``kind, tokens, cached_tokens, value_ms``).
* :func:`write_published_csv` -> the frame written.

Noise is multiplicative, ``exp(noise_frac * N(0, 1))``: always positive, never clipped.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

PrefillFn = Callable[[int], float]
CachedPrefillFn = Callable[[int, int], float]
DecodeStepFn = Callable[[int], float]
TransferFn = Callable[[int], float]

MIB = 2**20

# vLLM histogram buckets (VLLM_BEHAVIOUR.md 2.5).
TTFT_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
REQUEST_TIME_BUCKETS_S = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
NIXL_XFER_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_POST_BUCKETS_S = (0.001, *NIXL_XFER_BUCKETS_S)
NIXL_BYTES_BUCKETS = tuple(float(2**k) for k in range(11, 34, 2))
NIXL_DESC_BUCKETS = (
    10.0,
    20.0,
    30.0,
    50.0,
    75.0,
    100.0,
    200.0,
    400.0,
    1000.0,
    2000.0,
    4000.0,
    10000.0,
    20000.0,
    50000.0,
)


def _noise(rng: np.random.Generator, noise_frac: float, size: int | None = None) -> Any:
    """Multiplicative noise exp(noise_frac * N(0,1)) (a float, or an array when ``size`` is given)."""
    if size is None:
        return float(np.exp(noise_frac * rng.standard_normal()))
    return np.exp(noise_frac * rng.standard_normal(size))


def _write_atomic(path: os.PathLike[str] | str, text: str) -> None:
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)
    os.replace(tmp, path)


# --------------------------------------------------------------------------------------------------
# vllm bench serve
# --------------------------------------------------------------------------------------------------


def _summary(values_s: Sequence[float], name: str, percentiles: Sequence[float]) -> dict[str, float]:
    """vLLM's ``process_one_metric``: mean/median/std/pNN of seconds values, written in ms."""
    arr = np.asarray(values_s, dtype=np.float64)
    if arr.size == 0:
        arr = np.zeros(1)
    out = {
        f"mean_{name}_ms": float(np.mean(arr) * 1000),
        f"median_{name}_ms": float(np.median(arr) * 1000),
        f"std_{name}_ms": float(np.std(arr) * 1000),
    }
    for p in percentiles:
        key = str(int(p)) if float(p).is_integer() else str(p)
        out[f"p{key}_{name}_ms"] = float(np.percentile(arr, p) * 1000)
    return out


def write_bench_serve(
    path: os.PathLike[str] | str,
    rng: np.random.Generator,
    prefill_fn: PrefillFn,
    decode_step_fn: DecodeStepFn,
    n: int = 100,
    *,
    input_len_range: tuple[int, int] = (256, 8192),
    output_len_range: tuple[int, int] = (8, 64),
    request_rate_req_s: float = 4.0,
    noise_frac: float = 0.03,
    detailed: bool = True,
    fail_every: int = 0,
    percentiles: Sequence[float] = (99,),
    model_id: str = "Qwen/Qwen3-32B",
    start_time_s: float = 5000.0,
) -> dict[str, Any]:
    """Write a ``vllm bench serve --save-result [--save-detailed]`` JSON file; return the object written.

    Request i arrives after Poisson gaps (``request_rate_req_s``; ``math.inf`` writes ``"inf"`` and
    starts everything at once) with ``input_len`` uniform in ``input_len_range`` and ``output_len``
    in ``output_len_range``; ``ttft = prefill_fn(input_len) * noise``; gap k between chunks is
    ``decode_step_fn(input_len + k) * noise``; ``latency = ttft + sum(itls)`` exactly, as the client
    measures them (no queueing between requests is modelled). Every ``fail_every``-th request fails
    (vLLM keeps it in the arrays with ttft 0, no gaps, an error string). ``detailed=False`` writes
    aggregates and summaries only, like the real llm-d files.
    """
    lo, hi = input_len_range
    input_lens = rng.integers(lo, hi + 1, size=n)
    output_lens = rng.integers(output_len_range[0], output_len_range[1] + 1, size=n)
    if math.isinf(request_rate_req_s):
        gaps = np.zeros(n)
    else:
        gaps = rng.exponential(1.0 / request_rate_req_s, size=n)
    starts = start_time_s + np.cumsum(gaps)
    ttfts: list[float] = []
    itls: list[list[float]] = []
    latencies: list[float] = []
    out_lens: list[int] = []
    errors: list[str] = []
    for i in range(n):
        failed = fail_every > 0 and (i + 1) % fail_every == 0
        if failed:
            ttfts.append(0.0)
            itls.append([])
            latencies.append(0.0)
            out_lens.append(0)
            errors.append("Bad Request: synthetic failure")
            continue
        ttft = prefill_fn(int(input_lens[i])) * _noise(rng, noise_frac)
        steps = [decode_step_fn(int(input_lens[i]) + k) for k in range(1, int(output_lens[i]))]
        gaps_i = [float(s) for s in np.asarray(steps, dtype=np.float64) * _noise(rng, noise_frac, len(steps))]
        ttfts.append(float(ttft))
        itls.append(gaps_i)
        latencies.append(float(ttft + sum(gaps_i)))
        out_lens.append(int(output_lens[i]))
        errors.append("")
    ok = [e == "" for e in errors]
    completed = sum(ok)
    end = max(s + lat for s, lat in zip(starts, latencies, strict=True))
    duration = float(end - starts[0] + 0.05)
    total_in = int(sum(int(x) for x, good in zip(input_lens, ok, strict=True) if good))
    total_out = int(sum(x for x, good in zip(out_lens, ok, strict=True) if good))
    ok_ttfts = [t for t, good in zip(ttfts, ok, strict=True) if good]
    tpots = [
        (lat - t) / (o - 1)
        for t, lat, o, good in zip(ttfts, latencies, out_lens, ok, strict=True)
        if good and o > 1
    ]
    all_itls = [g for gaps_i, good in zip(itls, ok, strict=True) if good for g in gaps_i]
    e2els = [lat for lat, good in zip(latencies, ok, strict=True) if good]
    result: dict[str, Any] = {
        "date": "20260921-120000",
        "endpoint_type": "openai",
        "backend": "vllm",
        "label": None,
        "model_id": model_id,
        "tokenizer_id": model_id,
        "num_prompts": n,
        "request_rate": "inf" if math.isinf(request_rate_req_s) else request_rate_req_s,
        "burstiness": 1.0,
        "max_concurrency": None,
        "duration": duration,
        "completed": completed,
        "failed": n - completed,
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": completed / duration,
        "request_goodput": None,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
    }
    if detailed:
        result.update(
            {
                "input_lens": [int(x) for x in input_lens],
                "output_lens": out_lens,
                "ttfts": ttfts,
                "itls": itls,
                "start_times": [float(s) for s in starts],
                "latencies": latencies,
                "generated_texts": [
                    "" if not good else "x" * o for good, o in zip(ok, out_lens, strict=True)
                ],
                "errors": errors,
            }
        )
    for name, values in (("ttft", ok_ttfts), ("tpot", tpots), ("itl", all_itls), ("e2el", e2els)):
        result.update(_summary(values, name, percentiles))
    _write_atomic(path, json.dumps(result))
    return result


# --------------------------------------------------------------------------------------------------
# multi-turn benchmark --stats-json-output
# --------------------------------------------------------------------------------------------------


def write_multiturn_stats(
    path: os.PathLike[str] | str,
    rng: np.random.Generator,
    cached_prefill_fn: CachedPrefillFn,
    decode_step_fn: DecodeStepFn,
    *,
    n_conversations: int = 10,
    user_turns: int = 5,
    prefix_tokens: int = 2000,
    user_tokens: int = 150,
    output_tokens: int = 300,
    n_clients: int = 2,
    cache_history: bool = True,
    noise_frac: float = 0.03,
    ttft_missing_every: int = 0,
    t0_ms: float = 1.0e7,
    conversation_key: str = "conversation_id",
) -> list[dict[str, Any]]:
    """Write a ``benchmark_serving_multi_turn.py --stats-json-output`` JSON array; return its records.

    Conversation ``CONV_ID_i`` belongs to client ``i % n_clients``; each client sends one request at a
    time, cycling round-robin over its conversations (no think time, as the tool without
    ``--request-rate``). User turn u (1-based) sends ``input_num_turns = 2u - 1`` messages of
    ``prefix_tokens + u * user_tokens + (u - 1) * output_tokens`` content tokens (the prefix is in the
    first user message); its history is everything but the last user message. TTFT is
    ``cached_prefill_fn(new, cached) * noise`` with ``cached = history`` if ``cache_history`` else 0;
    chunks carry one token, so ``output_num_chunks = output_tokens - 1`` (the tool counts the gaps)
    and ``tpot_ms = (latency_ms - ttft_ms) / (output_tokens - 1)``. Every ``ttft_missing_every``-th
    record gets ``ttft_ms = -1``. Records are written in completion order, start times on a
    ``perf_counter_ns() / 1e6`` clock starting near ``t0_ms``. ``conversation_key="session_id"``
    writes the older field name.
    """
    records: list[dict[str, Any]] = []
    for client in range(n_clients):
        convs = [c for c in range(n_conversations) if c % n_clients == client]
        clock_ms = t0_ms + float(rng.uniform(0.0, 50.0))
        for u in range(1, user_turns + 1):
            for c in convs:
                input_tokens = prefix_tokens + u * user_tokens + (u - 1) * output_tokens
                question = prefix_tokens + user_tokens if u == 1 else user_tokens
                history = input_tokens - question
                cached = history if cache_history else 0
                ttft_s = cached_prefill_fn(input_tokens - cached, cached) * _noise(rng, noise_frac)
                steps = np.array([decode_step_fn(input_tokens + k) for k in range(1, output_tokens)])
                decode_s = float((steps * _noise(rng, noise_frac, steps.size)).sum())
                ttft_ms = ttft_s * 1000.0
                latency_ms = ttft_ms + decode_s * 1000.0
                records.append(
                    {
                        "ttft_ms": ttft_ms,
                        "tpot_ms": (latency_ms - ttft_ms) / (output_tokens - 1) if output_tokens > 1 else 0.0,
                        "latency_ms": latency_ms,
                        "start_time_ms": clock_ms,
                        "input_num_turns": 2 * u - 1,
                        "input_num_tokens": input_tokens,
                        "output_num_tokens": output_tokens,
                        "output_num_chunks": output_tokens - 1,
                        "output_num_first_chunk_tokens": 1,
                        "approx_cached_percent": 100.0 * history / input_tokens,
                        conversation_key: f"CONV_ID_{c}",
                        "client_id": client,
                    }
                )
                clock_ms += latency_ms + float(rng.uniform(0.5, 3.0))  # client-side overhead between requests
    records.sort(key=lambda r: r["start_time_ms"] + r["latency_ms"])
    if ttft_missing_every > 0:
        for i in range(ttft_missing_every - 1, len(records), ttft_missing_every):
            records[i]["ttft_ms"] = -1.0
    _write_atomic(path, json.dumps(records, indent=1))
    return records


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


# --------------------------------------------------------------------------------------------------
# Prometheus text exposition
# --------------------------------------------------------------------------------------------------


@dataclass
class PrometheusTruth:
    """What :func:`write_prometheus` wrote, per scrape (cumulative, as Prometheus exposes it).

    ``observations[s][metric]``: raw observations of each histogram up to scrape ``s``;
    ``counters[s][(name, source_or_reason)]`` and ``gauges[s][name]``: values written;
    ``buckets[metric]``: the finite bucket bounds used; ``scrape_times_s``: the unix times written.
    """

    observations: list[dict[str, np.ndarray]] = field(default_factory=list)
    counters: list[dict[tuple[str, str], float]] = field(default_factory=list)
    gauges: list[dict[str, float]] = field(default_factory=list)
    buckets: dict[str, tuple[float, ...]] = field(default_factory=dict)
    scrape_times_s: list[float] = field(default_factory=list)


def _fmt(value: float) -> str:
    """prometheus_client's float formatting: repr, and +Inf/-Inf/NaN spelled the Go way."""
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if math.isnan(value):
        return "NaN"
    return repr(float(value))


def _labels(pairs: dict[str, str]) -> str:
    esc = {k: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for k, v in pairs.items()}
    return "{" + ",".join(f'{k}="{v}"' for k, v in esc.items()) + "}"


def format_histogram(
    name: str,
    doc: str,
    labels: dict[str, str],
    bounds: Sequence[float],
    observations: np.ndarray,
    created: float,
) -> list[str]:
    """Exposition lines of one histogram (HELP, TYPE, buckets incl. +Inf, _count, _sum, _created)."""
    obs = np.asarray(observations, dtype=np.float64)
    out = [f"# HELP {name} {doc}", f"# TYPE {name} histogram"]
    for b in (*bounds, math.inf):
        count = float(np.count_nonzero(obs <= b))
        out.append(f"{name}_bucket{_labels({**labels, 'le': _fmt(b)})} {_fmt(count)}")
    out.append(f"{name}_count{_labels(labels)} {_fmt(float(obs.size))}")
    out.append(f"{name}_sum{_labels(labels)} {_fmt(float(obs.sum()))}")
    # prometheus_client writes creation times as a separate gauge family.
    out += [
        f"# HELP {name}_created {doc}",
        f"# TYPE {name}_created gauge",
        f"{name}_created{_labels(labels)} {_fmt(created)}",
    ]
    return out


def write_prometheus(
    path: os.PathLike[str] | str,
    rng: np.random.Generator,
    prefill_fn: PrefillFn,
    *,
    n_requests: int = 200,
    n_scrapes: int = 1,
    separator: str = "comment",
    input_len_range: tuple[int, int] = (500, 20000),
    cached_fraction_range: tuple[float, float] = (0.0, 0.9),
    transfer_fn: TransferFn | None = None,
    bytes_per_token_per_rank: int = 32768,
    tp: int = 8,
    model_name: str = "Qwen/Qwen3-32B",
    engine: str = "0",
    t0_unix: float = 1_790_000_000.0,
    scrape_interval_s: float = 15.0,
    noise_frac: float = 0.03,
) -> PrometheusTruth:
    """Write ``n_scrapes`` scrapes of a vLLM ``/metrics`` endpoint (prefill node with NIXL) to one file.

    Each request has a prompt uniform in ``input_len_range``, a fraction of it (uniform in
    ``cached_fraction_range``) arrives by external KV transfer and the rest is computed:
    ``prefill = prefill_fn(computed) * noise``, queue time uniform 1-50 ms (plus the pull when there is
    one), TTFT = queue + prefill. With ``transfer_fn`` each pulled request adds ``tp`` NIXL
    observations (per-rank transfer time, 5 % post time, ``tokens * bytes_per_token_per_rank`` bytes,
    128 descriptors per 16-token block). Scrape s holds the first ``(s+1)/n_scrapes`` of the requests,
    so every counter and bucket is cumulative. ``separator="comment"`` writes ``# scrape <unix_ts>``
    lines, ``"none"`` just repeats the exposition.
    """
    lo, hi = input_len_range
    prompt = rng.integers(lo, hi + 1, size=n_requests)
    frac = rng.uniform(*cached_fraction_range, size=n_requests)
    external = np.floor(prompt * frac).astype(np.int64)
    computed = prompt - external
    prefill = np.array([prefill_fn(int(c)) for c in computed]) * _noise(rng, noise_frac, n_requests)
    xfer_req = np.zeros(n_requests)
    nixl: list[list[tuple[float, float, float, float]]] = [[] for _ in range(n_requests)]
    if transfer_fn is not None:
        for i in range(n_requests):
            if external[i] <= 0:
                continue
            for _ in range(tp):
                x = transfer_fn(int(external[i])) * _noise(rng, noise_frac)
                nixl[i].append(
                    (
                        x,
                        0.05 * x,
                        float(external[i] * bytes_per_token_per_rank),
                        float(128 * math.ceil(external[i] / 16)),
                    )
                )
            xfer_req[i] = max(o[0] for o in nixl[i])
    queue = rng.uniform(0.001, 0.05, size=n_requests) + xfer_req
    ttft = queue + prefill
    labels = {"engine": engine, "model_name": model_name}
    truth = PrometheusTruth(
        buckets={
            "vllm:time_to_first_token_seconds": TTFT_BUCKETS_S,
            "vllm:request_prefill_time_seconds": REQUEST_TIME_BUCKETS_S,
            "vllm:request_queue_time_seconds": REQUEST_TIME_BUCKETS_S,
            "vllm:nixl_xfer_time_seconds": NIXL_XFER_BUCKETS_S,
            "vllm:nixl_post_time_seconds": NIXL_POST_BUCKETS_S,
            "vllm:nixl_bytes_transferred": NIXL_BYTES_BUCKETS,
            "vllm:nixl_num_descriptors": NIXL_DESC_BUCKETS,
        }
    )
    created = t0_unix - 3600.0
    text: list[str] = []
    for s in range(n_scrapes):
        upto = (s + 1) * n_requests // n_scrapes
        ts = t0_unix + s * scrape_interval_s
        flat = [o for req in nixl[:upto] for o in req]
        obs = {
            "vllm:time_to_first_token_seconds": ttft[:upto],
            "vllm:request_prefill_time_seconds": prefill[:upto],
            "vllm:request_queue_time_seconds": queue[:upto],
            "vllm:nixl_xfer_time_seconds": np.array([o[0] for o in flat]),
            "vllm:nixl_post_time_seconds": np.array([o[1] for o in flat]),
            "vllm:nixl_bytes_transferred": np.array([o[2] for o in flat]),
            "vllm:nixl_num_descriptors": np.array([o[3] for o in flat]),
        }
        counters = {
            ("vllm:prompt_tokens", ""): float(prompt[:upto].sum()),
            ("vllm:prompt_tokens_by_source", "local_compute"): float(computed[:upto].sum()),
            ("vllm:prompt_tokens_by_source", "local_cache_hit"): 0.0,
            ("vllm:prompt_tokens_by_source", "external_kv_transfer"): float(external[:upto].sum()),
            ("vllm:request_success", "length"): float(upto),
            ("vllm:request_success", "stop"): 0.0,
        }
        gauges = {
            "vllm:num_requests_running": float(rng.integers(0, 8)),
            "vllm:num_requests_waiting": 0.0,
            "vllm:kv_cache_usage_perc": round(float(rng.uniform(0, 1)), 4),
        }
        truth.observations.append(obs)
        truth.counters.append(counters)
        truth.gauges.append(gauges)
        truth.scrape_times_s.append(ts)
        if separator == "comment":
            text.append(f"# scrape {ts:.3f}")
        text += [
            "# HELP python_gc_objects_collected_total Objects collected during gc",
            "# TYPE python_gc_objects_collected_total counter",
            'python_gc_objects_collected_total{generation="0"} 12345.0',
            'python_gc_objects_collected_total{generation="1"} 678.0',
        ]
        for gname, gvalue in gauges.items():
            text += [
                f"# HELP {gname} gauge",
                f"# TYPE {gname} gauge",
                f"{gname}{_labels(labels)} {_fmt(gvalue)}",
            ]
        text += [
            "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
            "# TYPE vllm:cache_config_info gauge",
            f'vllm:cache_config_info{{block_size="16",enable_prefix_caching="False",engine="{engine}"}} 1.0',
        ]
        for cname in dict.fromkeys(name for name, _ in counters):
            samples = [(lab, v) for (n, lab), v in counters.items() if n == cname]
            key = {"vllm:prompt_tokens_by_source": "source", "vllm:request_success": "finished_reason"}.get(
                cname
            )
            series = [({**labels, key: lab} if key else labels, v) for lab, v in samples]
            text += [f"# HELP {cname}_total counter", f"# TYPE {cname}_total counter"]
            text += [f"{cname}_total{_labels(lab)} {_fmt(v)}" for lab, v in series]
            text += [f"# HELP {cname}_created counter", f"# TYPE {cname}_created gauge"]
            text += [f"{cname}_created{_labels(lab)} {_fmt(created)}" for lab, _ in series]
        for hname, values in obs.items():
            text += format_histogram(hname, "histogram", labels, truth.buckets[hname], values, created)
    _write_atomic(path, "\n".join(text) + "\n")
    return truth


# --------------------------------------------------------------------------------------------------
# CSVs
# --------------------------------------------------------------------------------------------------


def write_points_csv(
    path: os.PathLike[str] | str,
    rng: np.random.Generator,
    cached_prefill_fn: CachedPrefillFn,
    transfer_fn: TransferFn,
    *,
    prefill_points: Sequence[tuple[int, int]] = (
        (2000, 0),
        (8000, 0),
        (16000, 0),
        (24000, 0),
        (300, 2000),
        (300, 12000),
        (300, 24000),
    ),
    transfer_tokens: Sequence[int] = (2000, 8000, 16000, 24000),
    repeats: int = 3,
    noise_frac: float = 0.03,
) -> pd.DataFrame:
    """Write a points CSV (``kind,tokens,cached_tokens,value_ms``) and return the frame written.

    Each ``(new, cached)`` prefill point and each transfer size is measured ``repeats`` times:
    ``value_ms = 1000 * fn(...) * noise``, written with 4 decimals (the frame holds the same values).
    """
    rows: list[dict[str, Any]] = []
    for _ in range(repeats):
        for new, cached in prefill_points:
            value = round(1000.0 * cached_prefill_fn(new, cached) * _noise(rng, noise_frac), 4)
            rows.append({"kind": "prefill", "tokens": new, "cached_tokens": cached, "value_ms": value})
        for tok in transfer_tokens:
            value = round(1000.0 * transfer_fn(tok) * _noise(rng, noise_frac), 4)
            rows.append({"kind": "kv_transfer", "tokens": tok, "cached_tokens": 0, "value_ms": value})
    frame = pd.DataFrame(rows, columns=["kind", "tokens", "cached_tokens", "value_ms"])
    lines = ["kind,tokens,cached_tokens,value_ms"]
    lines += [f"{r.kind},{r.tokens},{r.cached_tokens},{r.value_ms:.4f}" for r in frame.itertuples()]
    _write_atomic(path, "\n".join(lines) + "\n")
    return frame


def write_published_csv(
    path: os.PathLike[str] | str, rows: Sequence[tuple[str, str, int, float, str]]
) -> pd.DataFrame:
    """Write a published-figures CSV (``model,series,prompt_tokens,value_ms,note``) from rows; return it.

    Notes are written verbatim (quoted by the csv rules only if they contain a comma or a quote)."""
    import csv
    import io

    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["model", "series", "prompt_tokens", "value_ms", "note"])
    for row in rows:
        writer.writerow(
            [
                row[0],
                row[1],
                row[2],
                repr(float(row[3])) if not float(row[3]).is_integer() else int(row[3]),
                row[4],
            ]
        )
    _write_atomic(path, buf.getvalue())
    return pd.DataFrame(list(rows), columns=["model", "series", "prompt_tokens", "value_ms", "note"])
