"""A vllm bench serve trace with a negative per-request latency (helper in15): it was read as a negative service time,
which `kvplan workload show` and `workload fit` subtract from the arrival-to-arrival gap (an idle gap longer than the
gap itself). vllm bench serve measures latency as finish - send, never negative: refused in one line naming the
request and the field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvplan.errors import KvplanInputError
from kvplan.traces.readers import load_trace


def _bench(latencies: list[float]) -> str:
    return json.dumps({"date": "x", "backend": "vllm", "model_id": "m", "num_prompts": 2, "start_times": [0.0, 1.0],
                       "input_lens": [100, 200], "output_lens": [10, 20], "latencies": latencies,
                       "errors": ["", ""]})


def test_negative_latency_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "b.json"
    p.write_text(_bench([1.0, -5.0]))
    with pytest.raises(KvplanInputError, match=r"b\.json: request 1: field 'latencies' is negative \(-5 s\)"):
        load_trace(p)


def test_zero_and_positive_latencies_are_service_times(tmp_path: Path) -> None:
    p = tmp_path / "b.json"
    p.write_text(_bench([0.0, 2.5]))
    assert load_trace(p).requests["service_s"].tolist() == [0.0, 2.5]
