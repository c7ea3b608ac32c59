"""Synthetic Prometheus scrapes of vLLM and NIXL metrics (see synthetic_traces)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from synthetic_common import (
    NIXL_BYTES_BUCKETS,
    NIXL_DESC_BUCKETS,
    NIXL_POST_BUCKETS_S,
    NIXL_XFER_BUCKETS_S,
    REQUEST_TIME_BUCKETS_S,
    TTFT_BUCKETS_S,
    PrefillFn,
    TransferFn,
    _noise,
    _write_atomic,
)

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
