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

import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
from synthetic_common import CachedPrefillFn, DecodeStepFn, PrefillFn, TransferFn, _noise, _write_atomic

# engine/proxy logs and Prometheus scrapes are in their own modules; re-exported here
from synthetic_logs import EngineLogTruth, ProxyLogTruth, write_engine_log, write_proxy_log  # noqa: F401
from synthetic_prometheus import PrometheusTruth, format_histogram, write_prometheus  # noqa: F401

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
