"""Malformed inputs to kvplan.calibration's parsers: each must fail with a one-line KvplanInputError."""

from __future__ import annotations

import builtins
import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import synthetic_traces as st
from parser_truth import _rng, cached_prefill_s, decode_step_s, prefill_s

from kvplan.calibration.parsers import (
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

DATA = Path(__file__).resolve().parent / "data"


# ------------------------------------------------------------------------------------- malformed input


def _bench(tmp_path: Path, edit: Callable[[dict], None], name: str = "bench.json") -> Path:
    path = tmp_path / name
    st.write_bench_serve(path, _rng(), prefill_s, decode_step_s, n=12)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path


def _multiturn(tmp_path: Path, edit: Callable[[list], object]) -> Path:
    path = tmp_path / "stats.json"
    st.write_multiturn_stats(path, _rng(), cached_prefill_s, decode_step_s, n_conversations=4, user_turns=3)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))
    return path


def _text(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _prom(tmp_path: Path, counts: tuple[int, int, int], count: int, value_sum: str = "3.0") -> Path:
    return _text(
        tmp_path,
        "metrics.prom",
        "# TYPE vllm:time_to_first_token_seconds histogram\n"
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="0.1"}} {counts[0]}\n'
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="1.0"}} {counts[1]}\n'
        f'vllm:time_to_first_token_seconds_bucket{{engine="0",le="+Inf"}} {counts[2]}\n'
        f'vllm:time_to_first_token_seconds_count{{engine="0"}} {count}\n'
        f'vllm:time_to_first_token_seconds_sum{{engine="0"}} {value_sum}\n',
    )


def _set(key: str, value: object) -> Callable[[dict], None]:
    return lambda d: d.__setitem__(key, value)


KV_OK = (
    "Num successful transfers=8, Avg xfer time (ms)=3.0, P90 xfer time (ms)=4.0, "
    "Avg post time (ms)=0.5, P90 post time (ms)=0.6, Avg MB per transfer=10.0, "
    "Throughput (MB/s)=3333.3, Avg number of descriptors=64.0"
)
POINTS_HEADER = "kind,tokens,cached_tokens,value_ms\n"

MALFORMED: dict[str, tuple[Callable[[Path], Path], Callable[[Path], object], tuple[str, ...]]] = {
    "bench truncated JSON": (
        lambda t: _text(
            t, "bench.json", json.dumps({"duration": 10.0, "completed": 3, "ttfts": [0.1, 0.2]})[:-9]
        ),
        parse_bench_serve,
        ("line 1", "truncated"),
    ),
    "bench ttfts in ms": (
        lambda t: _bench(
            t,
            lambda d: d.update(
                ttfts=[x * 1000 for x in d["ttfts"]], latencies=[x * 1000 for x in d["latencies"]]
            ),
        ),
        parse_bench_serve,
        ("field 'ttfts'", "looks like milliseconds"),
    ),
    "bench empty array": (
        lambda t: _bench(t, _set("ttfts", [])),
        parse_bench_serve,
        ("field 'ttfts'", "empty"),
    ),
    "bench mismatched lengths": (
        lambda t: _bench(t, lambda d: d["ttfts"].pop()),
        parse_bench_serve,
        ("field 'ttfts' has 11 entries but 'input_lens' has 12", "--save-detailed"),
    ),
    "bench negative ttft": (
        lambda t: _bench(t, lambda d: d["ttfts"].__setitem__(4, -0.5)),
        parse_bench_serve,
        ("field 'ttfts' entry 4", "negative"),
    ),
    "bench NaN": (
        lambda t: _text(t, "bench.json", '{"duration": 10.0, "completed": 2, "mean_ttft_ms": NaN}'),
        parse_bench_serve,
        ("field 'mean_ttft_ms'", "NaN"),
    ),
    "bench missing field": (
        lambda t: _bench(t, lambda d: d.pop("duration")),
        parse_bench_serve,
        ("missing required field 'duration'",),
    ),
    "bench ttft after end": (
        lambda t: _bench(t, lambda d: d["ttfts"].__setitem__(2, d["latencies"][2] + 1.0)),
        parse_bench_serve,
        ("field 'ttfts' entry 2", "'latencies' entry 2"),
    ),
    "bench not a number": (
        lambda t: _bench(t, _set("duration", "12 s")),
        parse_bench_serve,
        ("field 'duration'", "not a number"),
    ),
    "bench summary longer than the run": (
        lambda t: _bench(t, _set("duration", 0.05)),
        parse_bench_serve,
        ("_ttft_ms", "'duration'", "wrong unit"),
    ),
    "multiturn missing field": (
        lambda t: _multiturn(t, lambda d: d[3].pop("latency_ms")),
        parse_multiturn_stats,
        ("record 3", "missing required field 'latency_ms'"),
    ),
    "multiturn seconds in ms fields": (
        lambda t: _multiturn(
            t, lambda d: [r.update(latency_ms=r["latency_ms"] / 1000, ttft_ms=r["ttft_ms"] / 1000) for r in d]
        ),
        parse_multiturn_stats,
        ("field 'latency_ms'", "looks like seconds"),
    ),
    "multiturn negative start time": (
        lambda t: _multiturn(t, lambda d: d[5].update(start_time_ms=-3.0)),
        parse_multiturn_stats,
        ("field 'start_time_ms' in record 5", "negative"),
    ),
    "multiturn even turn count": (
        lambda t: _multiturn(t, lambda d: d[2].update(input_num_turns=4)),
        parse_multiturn_stats,
        ("record 2", "input_num_turns", "odd"),
    ),
    "multiturn empty array": (
        lambda t: _text(t, "stats.json", "[]"),
        parse_multiturn_stats,
        ("array of request records is empty",),
    ),
    "multiturn Infinity": (
        lambda t: _text(t, "stats.json", '[{"ttft_ms": Infinity}]'),
        parse_multiturn_stats,
        ("record 0: field 'ttft_ms'", "NaN/Infinity"),
    ),
    "log without matching lines": (
        lambda t: _text(
            t, "server.log", "INFO 09-21 12:00:00 [api_server.py:1] vLLM API server version 0.29.0\n"
        ),
        parse_log,
        ("no vLLM engine or proxy line found", "KV Transfer metrics", "Prefill done in"),
    ),
    "log NaN in KV metrics": (
        lambda t: _text(
            t,
            "engine.log",
            "line one\n"
            + "INFO 09-21 12:00:00 [m.py:1] KV Transfer metrics: "
            + KV_OK.replace("=3.0", "=nan")
            + "\n",
        ),
        parse_log,
        ("line 2", "Avg xfer time (ms)", "NaN"),
    ),
    "log KV line cut short": (
        lambda t: _text(
            t, "engine.log", "INFO 09-21 12:00:00 [m.py:1] KV Transfer metrics: " + KV_OK[:60] + "\n"
        ),
        parse_log,
        ("line 1", "'P90 xfer'", "cut off"),
    ),
    "log KV line without a field": (
        lambda t: _text(t, "engine.log", "KV Transfer metrics: " + KV_OK.split(", P90 xfer")[0] + "\n"),
        parse_log,
        ("line 1", "lacks 'P90 xfer time (ms)'"),
    ),
    "log negative prefill": (
        lambda t: _text(
            t, "proxy.log", "2026-09-21 12:00:00 [INFO] disagg_proxy: [r1] Prefill done in -5ms\n"
        ),
        parse_log,
        ("line 1", "Prefill done in", "negative"),
    ),
    "prometheus buckets decreasing": (
        lambda t: _prom(t, (5, 3, 7), 7),
        parse_prometheus,
        ("line 3", "le=1", "must not decrease"),
    ),
    "prometheus +Inf differs from count": (
        lambda t: _prom(t, (1, 3, 7), 9),
        parse_prometheus,
        ("line 5", "_count 9", "+Inf bucket holds 7"),
    ),
    "prometheus NaN": (lambda t: _prom(t, (1, 3, 7), 7, "NaN"), parse_prometheus, ("line 6", "NaN")),
    "prometheus negative": (
        lambda t: _text(t, "m.prom", "vllm:num_requests_running 1\nvllm:num_requests_waiting -2\n"),
        parse_prometheus,
        ("line 2", "vllm:num_requests_waiting", "negative"),
    ),
    "prometheus garbage line": (
        lambda t: _text(t, "m.prom", "vllm:x 1\nthis is { not prometheus\n"),
        parse_prometheus,
        ("line 2",),
    ),
    "points bad header": (
        lambda t: _text(t, "points.csv", "kind,tokens,value_ms\nprefill,100,3.0\n"),
        parse_points_csv,
        ("line 1", "header", "kind,tokens,cached_tokens,value_ms"),
    ),
    "points non-numeric": (
        lambda t: _text(t, "points.csv", POINTS_HEADER + "prefill,1000,0,25.0\nprefill,2000,0,fast\n"),
        parse_points_csv,
        ("line 3", "column 'value_ms'", "not a number"),
    ),
    "points NaN": (
        lambda t: _text(t, "points.csv", POINTS_HEADER + "kv_transfer,1000,0,nan\n"),
        parse_points_csv,
        ("line 2", "value_ms", "NaN"),
    ),
    "points unknown kind": (
        lambda t: _text(t, "points.csv", POINTS_HEADER + "decode,1000,0,5\n"),
        parse_points_csv,
        ("line 2", "column 'kind'", "prefill, kv_transfer"),
    ),
    "points in seconds": (
        lambda t: _text(t, "points.csv", POINTS_HEADER + "prefill,8000,0,0.29\nprefill,24000,0,0.97\n"),
        parse_points_csv,
        ("line 2", "looks like seconds"),
    ),
    "points negative cached tokens": (
        lambda t: _text(t, "points.csv", POINTS_HEADER + "prefill,100,-5,3.0\n"),
        parse_points_csv,
        ("line 2", "cached_tokens", "negative"),
    ),
    "points header only": (
        lambda t: _text(t, "points.csv", POINTS_HEADER),
        parse_points_csv,
        ("no data rows",),
    ),
    "published unknown series": (
        lambda t: _text(t, "pub.csv", "model,series,prompt_tokens,value_ms,note\nQwen,ttft_maybe,2000,12,\n"),
        parse_published_csv,
        ("line 2", "column 'series'", "ttft_off"),
    ),
    "binary file": (lambda t: _text(t, "x.json", "{\x00}"), parse_bench_serve, ("NUL", "binary")),
    "empty file": (lambda t: _text(t, "x.log", ""), parse_log, ("file is empty",)),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_input_is_one_line_error(tmp_path: Path, case: str) -> None:
    make, parser, fragments = MALFORMED[case]
    path = make(tmp_path)
    with pytest.raises(KvplanInputError) as info:
        parser(path)
    message = str(info.value)
    assert "\n" not in message and message.count(str(path)) >= 1, message
    assert message.startswith(f"{path}: "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


ALL_PARSERS = [
    parse_bench_serve,
    parse_multiturn_stats,
    parse_log,
    parse_engine_log,
    parse_proxy_log,
    parse_prometheus,
    parse_points_csv,
    parse_published_csv,
    parse_any,
]


@pytest.mark.parametrize("parser", ALL_PARSERS, ids=lambda p: p.__name__)
def test_oversized_file_refused_before_reading(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parser: Callable[[Path], object]
) -> None:
    path = tmp_path / "huge.json"
    with open(path, "wb") as fh:
        fh.truncate(2 * 1024**3)  # sparse: 2 GiB of size, no disk
    real_open = builtins.open

    def guarded_open(file: object, *args: object, **kwargs: object) -> object:
        if os.fspath(file) == os.fspath(path):  # type: ignore[call-overload]
            raise AssertionError("the oversized file was opened")
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(builtins, "open", guarded_open)
    start = time.perf_counter()
    with pytest.raises(KvplanInputError) as info:
        parser(path)
    monkeypatch.undo()
    assert time.perf_counter() - start < 0.5
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    assert "2.0 GiB (2147483648 bytes)" in message and "256.0 MiB limit" in message and "max_bytes" in message


def test_max_bytes_parameter_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    st.write_bench_serve(path, _rng(), prefill_s, decode_step_s, n=5)
    with pytest.raises(KvplanInputError, match="larger than the 1.0 KiB limit"):
        parse_bench_serve(path, max_bytes=1024)
    assert parse_bench_serve(path, max_bytes=10**6).completed == 5
    with pytest.raises(KvplanInputError, match="file not found"):
        parse_any(tmp_path / "nope.json")
    with pytest.raises(KvplanInputError, match="is a directory"):
        parse_log(tmp_path)
