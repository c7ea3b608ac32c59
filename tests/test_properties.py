"""Property-based tests (hypothesis): every input parser refuses bad input with a one-line KvplanInputError
(never another exception), and the simulator keeps its invariants on random valid scenarios.

Run time is kept modest: few examples, no deadline (a simulation is not a microbenchmark).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvplan.calibration.parse_csv import parse_points_csv
from kvplan.calibration.traces import load_trace
from kvplan.errors import KvplanInputError
from kvplan.plan.grid import grid_from_dict
from kvplan.safe_yaml import load_yaml_text
from kvplan.sim.api import run
from kvplan.sim.events import Ev
from kvplan.sim.scenario import scenario_from_dict

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SIMS = settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])

numbers: st.SearchStrategy[Any] = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**80), max_value=2**80),
    st.sampled_from([0, 1, -1, 1e-300, 1e300, 2**63, "abc", "", None, True, [], {}]),
)

FIELDS = {
    "deployment": ["prefill_nodes", "decode_nodes", "tensor_parallel_size", "max_num_seqs", "max_num_batched_tokens",
                   "gpu_memory_utilization", "decode_kv_capacity_tokens", "prefill_kv_capacity_tokens"],
    "policy": ["decoder_kv_blocks_ttl_s", "kv_recompute_threshold_tokens", "router_ttl_s", "expiry_safety_margin_s",
               "clock_skew_s"],
    "workload": ["conversations"],
}
DISTS = ["turns", "prefix_tokens", "user_tokens", "output_tokens", "turn_gap_s"]


@st.composite
def hostile_scenarios(draw: st.DrawFn) -> dict[str, Any]:
    data: dict[str, Any] = {"workload": {"conversations": 5}}
    for section, names in FIELDS.items():
        for name in draw(st.lists(st.sampled_from(names), max_size=3, unique=True)):
            data.setdefault(section, {})[name] = draw(numbers)
    for name in draw(st.lists(st.sampled_from(DISTS), max_size=2, unique=True)):
        kind = draw(st.sampled_from(["constant", "exponential", "lognormal", "uniform", "empirical", "bogus"]))
        params = {"constant": ["value"], "exponential": ["mean"], "lognormal": ["median", "sigma"],
                  "uniform": ["low", "high"], "empirical": ["values"], "bogus": ["x"]}[kind]
        d: dict[str, Any] = {"dist": kind}
        for p in params:
            d[p] = draw(st.lists(numbers, max_size=4)) if p == "values" else draw(numbers)
        data["workload"][name] = d
    if draw(st.booleans()):
        data["workload"]["arrival"] = {"kind": "poisson", "rate_per_s": draw(numbers)}
    return data


@FAST
@given(hostile_scenarios())
def test_scenario_fields_validate_or_refuse_in_one_line(data: dict[str, Any]) -> None:
    try:
        sc = scenario_from_dict(data)
    except KvplanInputError as exc:
        assert "\n" not in str(exc) and str(exc)
        return
    # whatever validates is finite and within the bounds a run can afford
    dumped = json.dumps(sc.model_dump(mode="json"))
    assert "Infinity" not in dumped and "NaN" not in dumped


yaml_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(st.text(max_size=8), children, max_size=4)),
    max_leaves=20,
)


@FAST
@given(st.dictionaries(st.sampled_from(["base", "axes", "replications", "seed", "bogus"]), yaml_values, max_size=4))
def test_grid_files_validate_or_refuse_in_one_line(data: dict[str, Any]) -> None:
    text = yaml.safe_dump(data)
    try:
        parsed = load_yaml_text(text, "g.yaml")
        grid_from_dict(parsed, where="g.yaml")
    except KvplanInputError as exc:
        assert "\n" not in str(exc)


@FAST
@given(st.text(max_size=400))
def test_yaml_loader_never_raises_anything_else(text: str) -> None:
    try:
        load_yaml_text(text, "x.yaml")
    except KvplanInputError as exc:
        assert "\n" not in str(exc)


cells = st.one_of(st.integers(min_value=-5, max_value=10**6), st.floats(allow_nan=True, allow_infinity=True),
                  st.sampled_from(["", "x", "1e300", "nan", "-0", "2023-11-16 18:15:46.6805900"]))
HEADERS = {
    "csv": "session_id,timestamp_s,input_tokens,output_tokens",
    "azure": "TIMESTAMP,ContextTokens,GeneratedTokens",
    "lmbench": "prompt_tokens,generation_tokens,ttft,generation_time,user_id,question_id,launch_time,finish_time",
}


def _check_trace(tmp: Path, name: str, text: str, fmt: str | None) -> None:
    p = tmp / name
    p.write_text(text)
    try:
        tr = load_trace(p, fmt)
    except KvplanInputError as exc:
        assert "\n" not in str(exc)
        return
    df = tr.requests
    assert (df["input_tokens"] >= 0).all() and np.isfinite(df["arrival_s"]).all()
    assert (np.diff(df["arrival_s"].to_numpy()) >= 0).all()


@FAST
@given(st.sampled_from(sorted(HEADERS)), st.lists(st.lists(cells, min_size=2, max_size=9), max_size=6), st.booleans())
def test_csv_trace_parsers(tmp_path_factory: Any, fmt: str, rows: list[list[Any]], detect: bool) -> None:
    text = HEADERS[fmt] + "\n" + "".join(",".join(str(c) for c in r) + "\n" for r in rows)
    _check_trace(tmp_path_factory.mktemp("t"), "t.csv", text, None if detect else fmt)


json_records = st.lists(
    st.dictionaries(
        st.sampled_from(["timestamp", "input_length", "output_length", "hash_ids", "session_id", "conversation_id",
                         "start_time_ms", "input_num_tokens", "output_num_tokens", "input_num_turns"]),
        st.one_of(cells, st.lists(st.integers(min_value=-2, max_value=50), max_size=6), st.dictionaries(
            st.text(max_size=5), st.lists(st.integers(), max_size=3), max_size=2)),
        max_size=10,
    ),
    max_size=6,
)


@FAST
@given(st.sampled_from(["mooncake", "ragpulse", "multiturn", None]), json_records)
def test_json_trace_parsers(tmp_path_factory: Any, fmt: str | None, records: list[dict[str, Any]]) -> None:
    if fmt == "multiturn":
        text = json.dumps(records)
    else:
        text = "".join(json.dumps(r) + "\n" for r in records)
    _check_trace(tmp_path_factory.mktemp("t"), "t.jsonl", text, fmt)


@FAST
@given(st.lists(st.tuples(st.sampled_from(["prefill", "kv_transfer", "x"]), cells, cells, cells), max_size=6))
def test_points_csv_parser(tmp_path_factory: Any, rows: list[tuple[Any, ...]]) -> None:
    p = tmp_path_factory.mktemp("p") / "p.csv"
    p.write_text("kind,tokens,cached_tokens,value_ms\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    try:
        df = parse_points_csv(p)
    except KvplanInputError as exc:
        assert "\n" not in str(exc)
        return
    assert np.isfinite(df["value_ms"]).all() and (df["value_ms"] > 0).all()


# --- invariants of the simulator on random valid scenarios ------------------------------------------------------


@st.composite
def valid_scenarios(draw: st.DrawFn) -> dict[str, Any]:
    ttl = draw(st.sampled_from([0.0, 5.0, 30.0, 120.0, 480.0]))
    return {
        "deployment": {
            "prefill_nodes": draw(st.integers(1, 2)), "decode_nodes": draw(st.integers(1, 2)), "max_num_seqs": 64,
            "prefill_prefix_caching": draw(st.booleans()), "decode_prefix_caching": draw(st.booleans()),
            "decode_kv_capacity_tokens": draw(st.sampled_from([None, 40_000, 200_000])),
            "routing": draw(st.sampled_from(["round_robin", "sticky"])),
        },
        "policy": {"bidirectional": draw(st.booleans()), "decoder_kv_blocks_ttl_s": ttl,
                   "router_ttl_s": max(ttl - 1, 0.0), "kv_recompute_threshold_tokens": draw(st.sampled_from([0, 64, 5000])),
                   "kv_load_failure_policy": draw(st.sampled_from(["fail", "recompute"]))},
        "workload": {
            "conversations": draw(st.integers(5, 30)),
            "arrival": {"kind": "poisson", "rate_per_s": draw(st.sampled_from([0.2, 1.0, 4.0]))},
            "turns": {"dist": "uniform", "low": 1, "high": draw(st.integers(1, 5))},
            "prefix_tokens": {"dist": "lognormal", "median": draw(st.sampled_from([500, 3000])), "sigma": 0.5},
            "user_tokens": {"dist": "uniform", "low": 10, "high": 300},
            "output_tokens": {"dist": "uniform", "low": 1, "high": 300},
            "turn_gap_s": {"dist": "exponential", "mean": draw(st.sampled_from([1.0, 10.0, 40.0]))},
        },
        "seed": draw(st.integers(0, 1000)),
    }


# found by test_simulator_invariants: a turn waiting on D for a pin's expiry was never admitted (its wake-up
# landed an ulp before the deadline; tests/test_retention.py has the small deterministic case)
LOST_WAKE_193: dict[str, Any] = {
    "deployment": {"prefill_nodes": 1, "decode_nodes": 2, "max_num_seqs": 64, "prefill_prefix_caching": False,
                   "decode_prefix_caching": False, "decode_kv_capacity_tokens": 40_000, "routing": "sticky"},
    "policy": {"bidirectional": True, "decoder_kv_blocks_ttl_s": 120.0, "router_ttl_s": 119.0,
               "kv_recompute_threshold_tokens": 0, "kv_load_failure_policy": "fail"},
    "workload": {"conversations": 22, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                 "turns": {"dist": "uniform", "low": 1, "high": 4},
                 "prefix_tokens": {"dist": "lognormal", "median": 3000, "sigma": 0.5},
                 "user_tokens": {"dist": "uniform", "low": 10, "high": 300},
                 "output_tokens": {"dist": "uniform", "low": 1, "high": 300},
                 "turn_gap_s": {"dist": "exponential", "mean": 1.0}},
    "seed": 193,
}


@SIMS
@given(valid_scenarios())
@example(LOST_WAKE_193)
def test_simulator_invariants(data: dict[str, Any]) -> None:
    r = run(data)
    t, ev, s = r.turns, r.events, r.summary
    # token conservation on every turn
    assert (t["prompt_tokens"] == t["local_hit_tokens"] + t["pulled_tokens"] + t["recomputed_tokens"]
            + t["failed_tokens"]).all()
    # no block leak: every pin is released exactly once, nothing outstanding at the end
    pins, unpins = ev[ev["kind"] == int(Ev.PIN)], ev[ev["kind"] == int(Ev.UNPIN)]
    assert s["pins_outstanding"] == 0 and len(unpins) == len(pins) == sum(s["releases"].values())
    assert pins["a"].sum() == unpins["a"].sum()
    # pinned <= capacity on every decode node at every instant
    cap = s["decode_kv_capacity_tokens"]
    delta = pd.concat([pins.assign(d=pins["a"], o=1), unpins.assign(d=-unpins["a"], o=0)])
    for _, g in delta.sort_values(["t_s", "o"], kind="stable").groupby("node"):
        assert g["d"].cumsum().max() <= cap
    # no pull after expiry minus the safety margin: every read starts before D's deadline - margin
    margin = data["policy"].get("expiry_safety_margin_s", 5.0)
    expiry = {(int(c), int(k)): float(b) for c, k, b in pins[["conv", "turn", "b"]].itertuples(index=False)}
    for c, k, t0 in ev[ev["kind"] == int(Ev.PULL_START)][["conv", "turn", "t_s"]].itertuples(index=False):
        assert t0 + margin < expiry[(int(c), int(k) - 1)] + 1e-9
    # TTFT identity
    parts = ["overhead_s", "prefill_queue_s", "kv_pull_s", "prefill_s", "d_queue_s", "p2d_transfer_s", "first_decode_s"]
    ok = t[t["decision"] != "error"]
    assert np.isfinite(ok["ttft_s"]).all() and np.isfinite(ok["finish_s"]).all()  # every turn not refused finishes
    np.testing.assert_allclose(ok[parts].sum(axis=1), ok["ttft_s"], rtol=0, atol=1e-6)


@SIMS
@given(st.integers(0, 500), st.sampled_from([0.5, 2.0]))
def test_ttft_monotone_in_load_with_common_random_numbers(seed: int, rate: float) -> None:
    """Same seed (common random numbers: arrival draws scale with 1/rate), twice the load: TTFT never drops.

    Bidirectional off, no prefix cache and one sequence per step (``max_num_seqs: 1``): a tandem of FCFS
    single servers (P, then D), where compressing the arrivals can only add waiting (Lindley recursion,
    pathwise). With batching the property does not hold pathwise: at 4x the load two prompts can share a step
    and its fixed overhead, and a quantile can fall (seed 206, rate 0.5 at max_num_seqs 8: TTFT p90 0.3539 ->
    0.3508 s, found by Hypothesis on the session-start code as well), so the test no longer claims it there."""
    base: dict[str, Any] = {
        "deployment": {"max_num_seqs": 1, "max_num_batched_tokens": 8192, "prefill_prefix_caching": False},
        "policy": {"bidirectional": False},
        "workload": {"conversations": 40, "arrival": {"kind": "poisson", "rate_per_s": rate},
                     "turns": {"dist": "constant", "value": 1},
                     "prefix_tokens": {"dist": "uniform", "low": 1000, "high": 8000},
                     "output_tokens": {"dist": "uniform", "low": 10, "high": 200}},
        "seed": seed,
    }
    lo = run(base).summary
    hi = run({**base, "workload": {**base["workload"], "arrival": {"kind": "poisson", "rate_per_s": rate * 4}}}).summary
    assert hi["ttft_mean_s"] >= lo["ttft_mean_s"] * (1 - 1e-9)
    assert hi["ttft_p90_s"] >= lo["ttft_p90_s"] * (1 - 1e-9)
    assert math.isfinite(hi["ttft_mean_s"])
