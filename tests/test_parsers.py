"""Tests of kvplan.calibration's trace parsers: round trips through the synthetic writers, real files,
the malformed inputs are in test_parsers_malformed.py."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import synthetic_traces as st
from conftest import (
    SHARED,  # noqa: E402 - ../shared (or KVPLAN_SHARED)
    need_shared,
)
from parser_truth import BYTES_PER_TOKEN_PER_RANK, _rng, cached_prefill_s, decode_step_s, prefill_s, transfer_s

from kvplan.calibration.parsers import (
    BenchServeResult,
    MultiTurnStats,
    PrometheusScrape,
    VllmLog,
    detect_format,
    parse_any,
    parse_bench_serve,
    parse_engine_log,
    parse_log,
    parse_multiturn_stats,
    parse_points_csv,
    parse_prometheus,
    parse_proxy_log,
    parse_published_csv,
)
from kvplan.errors import KvplanInputError

LLMD_DIR = SHARED / "external_traces" / "llmd_pd_benchmark_serving_a100"
PUBLISHED = SHARED / "data" / "p5en_published.csv"
DATA = Path(__file__).resolve().parent / "data"
BUNDLED_BENCH = DATA / "llm-d-2p1d__benchmark_2025-05-11_23-39-15.json"


# ---------------------------------------------------------------------------------------------- bench


def test_bench_round_trip_detailed(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    written = st.write_bench_serve(path, _rng(), prefill_s, decode_step_s, n=60, fail_every=12)
    r = parse_bench_serve(path)
    assert isinstance(r, BenchServeResult)
    assert r.completed == written["completed"] == 55
    assert r.failed == 5 and r.num_prompts == 60
    assert r.duration_s == written["duration"]
    assert r.model_id == "Qwen/Qwen3-32B" and r.request_rate_req_s == 4.0
    req = r.requests
    assert req is not None and len(req) == 60
    np.testing.assert_array_equal(req["input_len_tokens"], written["input_lens"])
    np.testing.assert_array_equal(req["output_len_tokens"], written["output_lens"])
    np.testing.assert_array_equal(req["ttft_s"], written["ttfts"])
    np.testing.assert_array_equal(req["latency_s"], written["latencies"])
    np.testing.assert_array_equal(req["start_time_s"], written["start_times"])
    np.testing.assert_array_equal(req["ok"], [e == "" for e in written["errors"]])
    assert r.itls_s is not None
    for got, want in zip(r.itls_s, written["itls"], strict=True):
        np.testing.assert_array_equal(got, want)
    # 2.7: ttft + sum(itls) == latency for successful requests; itl count = output_len - 1.
    ok = req["ok"].to_numpy()
    np.testing.assert_allclose((req["ttft_s"] + req["itl_sum_s"])[ok], req["latency_s"][ok], rtol=1e-12)
    np.testing.assert_array_equal(req["itl_count"][ok], req["output_len_tokens"][ok] - 1)
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std", "p99"):
            assert r.summary(metric, stat) == written[f"{stat}_{metric}_ms"]


def test_bench_aggregates_only_and_infinite_rate(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    written = st.write_bench_serve(
        path,
        _rng(),
        prefill_s,
        decode_step_s,
        n=20,
        detailed=False,
        request_rate_req_s=math.inf,
        percentiles=(95, 99, 99.9),
    )
    r = parse_bench_serve(path)
    assert r.requests is None and r.itls_s is None and not r.has_requests
    assert r.request_rate_req_s == math.inf
    assert r.summary("ttft", "p99.9") == written["p99.9_ttft_ms"]
    assert list(r.summary_ms.columns) == ["mean", "median", "std", "p95", "p99", "p99.9"]


def test_bench_bundled_real_sample() -> None:
    """Real llm-d file (tests/data, Apache-2.0): old 'request_goodput:' key, no 'failed', extra metadata."""
    r = parse_bench_serve(BUNDLED_BENCH)
    assert r.num_prompts == 250 and r.completed == 240 and r.failed is None
    assert r.request_goodput_req_s is None and r.request_rate_req_s == 2.5 and r.burstiness == 50.0
    assert r.max_concurrency is None and r.requests is None
    assert r.extra == {"timestamp": "2025-05-11_23-39-15,model"}
    assert r.summary("ttft", "mean") == pytest.approx(1666.373531112913)
    assert list(r.summary_ms.index) == ["ttft", "tpot", "itl"]
    assert list(r.summary_ms.columns) == ["mean", "median", "std", "p95", "p99"]
    assert detect_format(BUNDLED_BENCH) == "bench"


@pytest.mark.shared_data
def test_bench_real_llmd_files() -> None:
    need_shared("external_traces/llmd_pd_benchmark_serving_a100")
    files = sorted(LLMD_DIR.glob("*.json"))
    assert len(files) == 7
    for path in files:
        r = parse_any(path)
        assert isinstance(r, BenchServeResult), path
        assert r.model_id == "meta-llama/Llama-3.1-8B-Instruct"
        assert r.completed <= (r.num_prompts or 0) and r.requests is None
        assert 500 < r.summary("ttft", "mean") < 2000  # ms, P/D TTFT at 8k-10k input on A100
        assert r.total_input_tokens == r.completed * (8000 if r.num_prompts == 200 else 10000)


# ---------------------------------------------------------------------------------------- multi-turn


def test_multiturn_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "stats.json"
    records = st.write_multiturn_stats(
        path, _rng(), cached_prefill_s, decode_step_s, n_conversations=6, user_turns=5, ttft_missing_every=7
    )
    r = parse_multiturn_stats(path)
    assert isinstance(r, MultiTurnStats)
    assert r.n_requests == 30 and r.n_conversations == 6
    df = r.requests.sort_values("record").reset_index(drop=True)
    want = pd.DataFrame(records)
    missing = want["ttft_ms"].to_numpy() == -1
    assert missing.sum() == 4
    np.testing.assert_array_equal(df["ttft_available"], ~missing)
    np.testing.assert_allclose(df["ttft_s"][~missing], want["ttft_ms"][~missing] / 1000, rtol=1e-15)
    assert df["ttft_s"][missing].isna().all()
    for col in ("tpot", "latency", "start_time"):
        np.testing.assert_allclose(df[f"{col}_s"], want[f"{col}_ms"] / 1000, rtol=1e-15)
    for col in ("input_num_turns", "input_num_tokens", "output_num_tokens", "output_num_chunks", "client_id"):
        np.testing.assert_array_equal(df[col], want[col])
    np.testing.assert_array_equal(df["conversation_id"], want["conversation_id"])
    np.testing.assert_array_equal(df["user_turn"], (want["input_num_turns"] + 1) // 2)
    assert r.requests["start_time_s"].is_monotonic_increasing
    # Turn 1 has no history; later turns have prefix + previous turns cached.
    assert (df.loc[df["user_turn"] == 1, "approx_cached_percent"] == 0).all()
    assert (df.loc[df["user_turn"] > 1, "approx_cached_percent"] > 50).all()


def test_multiturn_old_session_id_key(tmp_path: Path) -> None:
    path = tmp_path / "stats.json"
    st.write_multiturn_stats(path, _rng(), cached_prefill_s, decode_step_s, conversation_key="session_id")
    assert parse_multiturn_stats(path).n_conversations == 10


# ---------------------------------------------------------------------------------------------- logs


def test_engine_log_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "prefill.log"
    tokens = [int(x) for x in _rng(3).integers(1000, 24000, size=22)]
    truth = st.write_engine_log(
        path, _rng(), transfer_s, tokens, bytes_per_token_per_rank=BYTES_PER_TOKEN_PER_RANK, tp=8
    )
    log = parse_engine_log(path)
    kv = log.kv_transfer
    assert len(kv) == 6 and (kv["process"] == "EngineCore_DP0 pid=4242").all()
    for col in truth.intervals.columns:
        np.testing.assert_allclose(kv[col], truth.intervals[col], rtol=1e-12, err_msg=col)
    assert kv["num_transfers"].tolist() == [32] * 5 + [16]  # TP8 pools ranks: 8 x requests
    # MiB per rank x 2**20 / tokens recovers bytes per token per rank (to the 3-decimal rounding).
    per_interval_tokens = truth.observations.groupby("interval")["tokens"].mean().to_numpy()
    np.testing.assert_allclose(
        kv["avg_mib_per_transfer"] * 2**20 / per_interval_tokens, BYTES_PER_TOKEN_PER_RANK, rtol=1e-5
    )
    stats = log.stats
    assert len(stats) == 6 and (stats["engine"] == 0).all()
    for col in truth.stats.columns:
        np.testing.assert_allclose(stats[col], truth.stats[col], err_msg=col)
    assert stats["external_prefix_cache_hit_rate_pct"].eq(50.0).all() and stats["preemptions"].isna().all()
    assert log.n_expired_releases == truth.n_expired_releases == 2
    assert log.n_declined_reads == truth.n_declined_reads == 1
    assert log.expired_releases["within_s"].eq(480).all()
    assert log.declined_reads["remote_engine_id"].eq("7c1e9a").all()


def test_engine_log_line_variants(tmp_path: Path) -> None:
    """Prefix styles and field sets of several vLLM versions, ANSI colours, lines without prefix."""
    body = (
        "Num successful transfers=16, Avg xfer time (ms)=12.5, P90 xfer time (ms)=20.0, "
        "Avg post time (ms)=1.5, P90 post time (ms)=2.0, Avg MB per transfer=100.0, "
        "Throughput (MB/s)=8000.0, Avg number of descriptors=6400.0"
    )
    lines = [
        f"INFO 12-31 23:59:50 [metrics.py:127] KV Transfer metrics: {body}",
        f"\x1b[32mINFO\x1b[0m 01-01 00:00:10 [metrics.py:127] KV Transfer metrics: {body}, "
        f"Num failed transfers=1, Num KV expired reqs=2",
        f"(VllmWorker TP0 pid=77) INFO 01-01 00:00:20 metrics.py:90] KVConnectorType: NixlConnector, "
        f"KV Transfer metrics: {body}",
        f"KV Transfer metrics: {body}",
        "INFO 01-01 00:00:40 [metrics.py:127] KV Transfer metrics: Num successful transfers=0, "
        "Avg xfer time (ms)=0, P90 xfer time (ms)=0, Avg post time (ms)=0, P90 post time (ms)=0, "
        "Avg MB per transfer=0, Throughput (MB/s)=0, Avg number of descriptors=0, Num failed transfers=3, "
        "Num KV expired reqs=0",
        "INFO 01-01 00:00:50 [metrics.py:127] KV Transfer metrics: Num successful transfers=8, "
        "Avg xfer time (ms)=3.0, P90 xfer time (ms)=4.0, Avg MB per transfer=10.0, "
        "Throughput (MB/s)=3333.333, Avg number of descriptors=64.0",
        "INFO 01-01 00:01:00 metrics.py:400] Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: "
        "2.0 tokens/s, Running: 1 reqs, Swapped: 0 reqs, Pending: 3 reqs, GPU KV cache usage: 1.5%, "
        "CPU KV cache usage: 0.0%.",
        "INFO 01-01 00:01:10 [loggers.py:123] Engine 001: Avg prompt throughput: 10.0 tokens/s, "
        "Avg generation throughput: 20.0 tokens/s, Running: 2 reqs, Waiting: 0 reqs, Preemptions: 4, "
        "GPU KV cache usage: 3.0%, Prefix cache hit rate: 75.0%",
        f"INFO 02-30 00:01:20 [metrics.py:127] KV Transfer metrics: {body}",  # impossible date
    ]
    path = tmp_path / "variants.log"
    path.write_text("\n".join(lines) + "\n")
    log = parse_engine_log(path)
    kv = log.kv_transfer
    assert len(kv) == 7 and math.isnan(kv["time_s"][6]) and kv["log_time"][6] == "02-30 00:01:20"
    assert kv["time_s"].tolist()[:3] == [0.0, 20.0, 30.0] and math.isnan(kv["time_s"][3])  # year rollover
    assert kv["process"].tolist()[2] == "VllmWorker TP0 pid=77"
    assert kv["avg_xfer_s"].tolist()[0] == pytest.approx(0.0125)
    assert kv["num_failed_transfers"].tolist()[1] == 1 and math.isnan(kv["num_failed_transfers"][0])
    assert kv["num_transfers"].tolist()[4] == 0
    assert math.isnan(kv["avg_post_s"][5]) and kv["avg_mib_per_transfer"][5] == 10.0
    stats = log.stats
    assert stats["engine"].tolist() == [-1, 1]
    assert stats["waiting_reqs"].tolist() == [3.0, 0.0] and stats["swapped_reqs"].tolist()[0] == 0.0
    assert stats["preemptions"].tolist()[1] == 4.0 and stats["prefix_cache_hit_rate_pct"].tolist()[1] == 75.0


def test_proxy_log_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "proxy.log"
    truth = st.write_proxy_log(
        path, _rng(), cached_prefill_s, n_conversations=4, user_turns=5, stale_after_turn=3
    )
    proxy = parse_proxy_log(path)
    pf = proxy.prefill
    assert pf["request_id"].tolist() == truth.prefill["request_id"].tolist()
    np.testing.assert_allclose(pf["prefill_s"], truth.prefill["prefill_s"], rtol=1e-15)
    np.testing.assert_array_equal(pf["time_s"], truth.prefill["time_s"])
    ev = proxy.cache_events
    for col in ("event", "conversation_id", "request_id", "remote_request_id", "blocks"):
        assert ev[col].tolist() == truth.events[col].tolist(), col
    for col in ("time_s", "age_s", "ttl_s"):
        np.testing.assert_allclose(ev[col], truth.events[col], err_msg=col)
    # 4 conversations x 5 turns; the turn after turn 3 finds a stale entry, so 4 + 4 misses.
    assert proxy.count("miss") == 8 and proxy.count("stale") == 4 and proxy.count("hit") == 12
    assert proxy.count("send_to_p") == 12 and proxy.count("cached_d_blocks") == 20
    # A HIT turn computes only the new tokens: its prefill is much shorter than the MISS turns'.
    joined = pf.merge(truth.prefill[["request_id", "cached_tokens"]], on="request_id")
    assert (
        joined.loc[joined.cached_tokens > 0, "prefill_s"].max()
        < joined.loc[joined.cached_tokens == 0, "prefill_s"].min() * 1.5
    )


def test_parse_log_finds_both_kinds(tmp_path: Path) -> None:
    proxy, engine, both = tmp_path / "proxy.log", tmp_path / "engine.log", tmp_path / "both.log"
    st.write_proxy_log(proxy, _rng(), cached_prefill_s, n_conversations=2, user_turns=2)
    st.write_engine_log(
        engine, _rng(), transfer_s, [4000, 8000], bytes_per_token_per_rank=BYTES_PER_TOKEN_PER_RANK
    )
    both.write_text(
        proxy.read_text() + engine.read_text() + "2026-09-21 12:10:00 [INFO] disagg_proxy: "
        "[r-1] Prefill done in 123ms\n"
    )
    log = parse_log(both)
    assert isinstance(log, VllmLog) and log.engine is not None and log.proxy is not None
    assert len(log.engine.kv_transfer) == 1 and log.proxy.prefill["prefill_s"].iloc[-1] == 0.123
    assert parse_log(proxy).engine is None and parse_log(engine).proxy is None
    with pytest.raises(KvplanInputError, match="no disagg proxy line"):
        parse_proxy_log(engine)
    with pytest.raises(KvplanInputError, match="no vLLM engine line"):
        parse_engine_log(proxy)


# ---------------------------------------------------------------------------------------- prometheus


@pytest.mark.parametrize("separator", ["comment", "none"])
def test_prometheus_round_trip(tmp_path: Path, separator: str) -> None:
    path = tmp_path / "metrics.txt"
    truth = st.write_prometheus(
        path, _rng(), prefill_s, n_requests=120, n_scrapes=3, separator=separator, transfer_fn=transfer_s
    )
    scrape = parse_prometheus(path)
    assert isinstance(scrape, PrometheusScrape) and scrape.n_scrapes == 3
    if separator == "comment":
        np.testing.assert_array_equal(scrape.scrape_times_s, truth.scrape_times_s)
    else:
        assert np.isnan(scrape.scrape_times_s).all()
    assert not any(name.endswith("_created") for name in scrape.names())
    for s in range(3):
        for name, obs in truth.observations[s].items():
            h = scrape.histogram(name, scrape=s, model_name="Qwen/Qwen3-32B")
            bounds = np.array([*truth.buckets[name], math.inf])
            np.testing.assert_array_equal(h.upper_bounds, bounds)
            want = [np.count_nonzero(obs <= b) for b in bounds]
            np.testing.assert_array_equal(h.cumulative_counts, want, err_msg=name)
            assert h.count == obs.size and h.sum == float(obs.sum())
        for (name, lab), value in truth.counters[s].items():
            extra = {"source": lab} if name.endswith("by_source") else {"finished_reason": lab} if lab else {}
            assert scrape.counter(name, scrape=s, **extra) == value
            assert scrape.counter(name + "_total", scrape=s, **extra) == value
        for name, value in truth.gauges[s].items():
            assert scrape.gauge(name, scrape=s, engine="0") == value
    # 2.7: prompt_tokens_by_source sums to prompt_tokens.
    assert scrape.counter("vllm:prompt_tokens_by_source") == scrape.counter("vllm:prompt_tokens")
    delta = scrape.histogram_delta("vllm:nixl_xfer_time_seconds", first=0, last=2)
    first = scrape.histogram("vllm:nixl_xfer_time_seconds", scrape=0)
    assert delta.count == scrape.histogram("vllm:nixl_xfer_time_seconds").count - first.count
    h = scrape.histogram("vllm:time_to_first_token_seconds")
    obs = truth.observations[-1]["vllm:time_to_first_token_seconds"]
    assert h.mean() == pytest.approx(obs.mean(), rel=1e-12)
    assert h.approx_mean() == pytest.approx(obs.mean(), rel=0.3)
    assert h.quantile(0.5) == pytest.approx(np.median(obs), rel=0.3)


def test_prometheus_quantile_and_labels_by_hand(tmp_path: Path) -> None:
    path = tmp_path / "hand.prom"
    path.write_text(
        "# TYPE x_seconds histogram\n"
        'x_seconds_bucket{le="1.0",path="a\\"b,c}"} 2\n'
        'x_seconds_bucket{le="2.0",path="a\\"b,c}"} 6\n'
        'x_seconds_bucket{le="4.0",path="a\\"b,c}"} 10\n'
        'x_seconds_bucket{le="+Inf",path="a\\"b,c}"} 12\n'
        'x_seconds_count{path="a\\"b,c}"} 12\n'
        'x_seconds_sum{path="a\\"b,c}"} 30.0 1700000000000\n'
        "untyped_value 3.5\n"
    )
    s = parse_prometheus(path)
    h = s.histogram("x_seconds", path='a"b,c}')
    assert h.label_dict == {"path": 'a"b,c}'}
    np.testing.assert_array_equal(h.bucket_counts(), [2, 4, 4, 2])
    assert h.mean() == 2.5
    assert h.quantile(0.5) == pytest.approx(1.0 + 1.0 * (6 - 2) / 4)  # rank 6 ends bucket (1,2]
    assert h.quantile(0.25) == pytest.approx(1.0 + (3 - 2) / 4)  # rank 3 in bucket (1,2]
    assert h.quantile(0.1) == pytest.approx(0.6)  # rank 1.2 in the first bucket (0,1]
    assert h.quantile(0.99) == 4.0  # +Inf bucket -> last finite bound
    assert h.approx_mean() == pytest.approx((2 * 0.5 + 4 * 1.5 + 4 * 3.0 + 2 * 4.0) / 12)
    assert s.gauge("untyped_value") == 3.5


# ---------------------------------------------------------------------------------------------- CSVs


def test_points_csv_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "points.csv"
    written = st.write_points_csv(path, _rng(), cached_prefill_s, transfer_s)
    frame = parse_points_csv(path)
    assert list(frame.columns) == ["kind", "tokens", "cached_tokens", "value_ms"]
    pd.testing.assert_frame_equal(frame, written, check_dtype=False)
    assert frame["tokens"].dtype == np.int64 and frame["value_ms"].dtype == np.float64


def test_published_csv_synthetic(tmp_path: Path) -> None:
    path = tmp_path / "published.csv"
    rows = [
        ("Qwen/Qwen3-32B", "ttft_off", 2000, 158.0, "TTFT, OFF"),
        ("Qwen/Qwen3-32B", "kv_transfer_on", 24000, 130.5, ""),
    ]
    written = st.write_published_csv(path, rows)
    pd.testing.assert_frame_equal(parse_published_csv(path), written, check_dtype=False)
    assert detect_format(path) == "published"


@pytest.mark.shared_data
def test_published_csv_real() -> None:
    real = parse_published_csv(need_shared("data/p5en_published.csv"))
    assert len(real) == 20 and set(real["series"]) == {
        "ttft_off",
        "ttft_on",
        "prefill_off",
        "prefill_on",
        "kv_transfer_on",
    }
    qwen = real[(real.model == "Qwen/Qwen3-32B") & (real.series == "kv_transfer_on")]
    assert qwen["value_ms"].tolist() == [30.0, 130.0] and qwen["prompt_tokens"].tolist() == [2000, 24000]


# ------------------------------------------------------------------------------------ detect / parse_any


def test_detect_format_and_parse_any(tmp_path: Path) -> None:
    rng = _rng()
    files = {
        "bench": tmp_path / "a.json",
        "multiturn": tmp_path / "b.json",
        "log": tmp_path / "c.log",
        "prometheus": tmp_path / "d.txt",
        "points": tmp_path / "e.csv",
    }
    st.write_bench_serve(files["bench"], rng, prefill_s, decode_step_s, n=10)
    st.write_multiturn_stats(files["multiturn"], rng, cached_prefill_s, decode_step_s, n_conversations=2)
    st.write_engine_log(
        files["log"], rng, transfer_s, [1000], bytes_per_token_per_rank=BYTES_PER_TOKEN_PER_RANK
    )
    st.write_prometheus(files["prometheus"], rng, prefill_s, n_requests=10, separator="none")
    st.write_points_csv(files["points"], rng, cached_prefill_s, transfer_s, repeats=1)
    expected_types = {
        "bench": BenchServeResult,
        "multiturn": MultiTurnStats,
        "log": VllmLog,
        "prometheus": PrometheusScrape,
        "points": pd.DataFrame,
    }
    for kind, path in files.items():
        assert detect_format(path) == kind
        assert isinstance(parse_any(path), expected_types[kind])
    proxy = tmp_path / "f.log"
    st.write_proxy_log(proxy, rng, cached_prefill_s, n_conversations=1, user_turns=1)
    assert detect_format(proxy) == "log"
    unknown = tmp_path / "notes.txt"
    unknown.write_text("hello world\nthis is not a trace\n")
    with pytest.raises(KvplanInputError, match="cannot tell the format"):
        parse_any(unknown)


def test_writers_are_reproducible(tmp_path: Path) -> None:
    for i in range(2):
        st.write_bench_serve(tmp_path / f"b{i}.json", _rng(11), prefill_s, decode_step_s, n=15)
        st.write_prometheus(
            tmp_path / f"p{i}.txt", _rng(11), prefill_s, n_requests=15, transfer_fn=transfer_s
        )
    assert (tmp_path / "b0.json").read_bytes() == (tmp_path / "b1.json").read_bytes()
    assert (tmp_path / "p0.txt").read_bytes() == (tmp_path / "p1.txt").read_bytes()
