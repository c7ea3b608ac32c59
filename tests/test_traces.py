"""Trace readers, conversation reconstruction, replay selection, retention statistics and the workload fit.

Hand-built traces in tests/data/traces/ have exactly known sessions, turns, gaps and follow-up
probabilities; the real Mooncake and RAGPulse files (../shared/external_traces, skipped when absent) are
checked against the numbers in WORKLOADS.md.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import pytest
import yaml
from conftest import need_shared

from kvplan.calibration.workload_fit import empirical, fit_gap_distribution, fit_workload, workload_section
from kvplan.errors import KvplanInputError
from kvplan.sim.scenario import Workload
from kvplan.traces.readers import detect_trace_format, load_trace
from kvplan.traces.select import select
from kvplan.traces.sessions import link_prefix_chains, split_sessions, trace_from_sessions
from kvplan.traces.stats import crude_service_time_s, stats_figure, stats_table, turn_pairs, workload_stats
from kvplan.traces.trace import COLUMNS, Trace

DATA = Path(__file__).resolve().parent / "data" / "traces"
SHARED = Path(os.environ.get("KVPLAN_SHARED") or Path(__file__).resolve().parents[2] / "shared")
MOONCAKE = SHARED / "external_traces" / "mooncake_fast25" / "conversation_trace.jsonl"
MOONCAKE_PAIRS = SHARED / "external_traces" / "mooncake_fast25" / "derived_conversation_turn_pairs.csv"
RAGPULSE = SHARED / "external_traces" / "ragpulse" / "0_trace.jsonl"


def _by_id(trace: Trace) -> pd.DataFrame:
    return trace.requests.set_index("request_id")


# --- hand-built Mooncake ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moon() -> Trace:
    return load_trace(DATA / "mooncake_small.jsonl", "mooncake")


def test_mooncake_small_linking(moon: Trace) -> None:
    df = moon.requests
    assert list(df.columns) == list(COLUMNS)
    assert df["request_id"].tolist() == list(range(10))  # already in arrival order
    m = _by_id(moon)
    # deepest match (3 -> 2, not 0), two children of 2 (3, 4), tie to the latest (6 -> 5, not 0),
    # only the shared first block (7), contexts under 1,024 tokens (1, 9)
    assert m["parent_request_id"].tolist() == [-1, -1, 0, 2, 2, 0, 5, -1, 3, -1]
    assert m["turn"].tolist() == [1, 1, 2, 3, 3, 2, 3, 1, 4, 1]
    assert m["session_id"].tolist() == ["0", "1", "0", "0", "0", "0", "0", "7", "0", "9"]
    assert m["arrival_s"].tolist() == [0, 1, 30, 90, 100, 200, 250, 260, 340, 1000]
    assert m["linkable"].tolist() == [True, False, True, True, True, True, True, True, True, False]
    assert moon.n_sessions == 4
    assert moon.linking is not None
    assert moon.linking["linked_requests"] == 6
    assert moon.linking["sessions"] == 4
    assert moon.linking["parents"] == 4
    assert moon.linking["parents_with_2plus_children"] == 2
    assert moon.format == "mooncake" and len(moon.sha256) == 64


def test_mooncake_min_blocks_3_links_less() -> None:
    tr = load_trace(DATA / "mooncake_small.jsonl", "mooncake", min_blocks=3)
    # only parents with >= 3 full blocks (1,536 tokens) remain: 2 (4 full) and 3 (5 full)
    assert _by_id(tr)["parent_request_id"].tolist() == [-1, -1, -1, 2, 2, -1, -1, -1, 3, -1]


def test_link_prefix_chains_direct() -> None:
    parents = link_prefix_chains([[0, 1, 2], [0, 1, 2, 3], [0, 1, 2, 3, 4]], [1536, 1600, 2100])
    # requests 0 and 1 both have the full blocks [0, 1, 2]: 2 matches both equally deep, the latest wins
    assert parents.tolist() == [-1, 0, 1]


def test_mooncake_small_stats(moon: Trace) -> None:
    st = workload_stats(moon, ttls_s=(30, 60, 120, 300))
    json.dumps(st, allow_nan=False)
    assert st["requests"] == 10 and st["sessions"] == 4 and st["linked_requests"] == 6
    g = st["gap_s"]
    assert g["n"] == 6
    assert g["p50"] == pytest.approx(65.0)  # gaps 30, 50, 60, 70, 200, 250
    assert g["mean"] == pytest.approx(110.0)
    assert g["cdf_at_ttl"] == {
        "30": pytest.approx(1 / 6),
        "60": pytest.approx(3 / 6),
        "120": pytest.approx(4 / 6),
        "300": pytest.approx(1.0),
    }
    f = st["followup"]
    # horizon 300 s, trace end 1000 s: linkable requests arriving <= 700 s: 0, 2, 3, 4, 5, 6, 7, 8
    assert f["eligible_requests"] == 8
    # first-child gaps: 0 -> 30, 2 -> 60, 3 -> 250, 5 -> 50; 4, 6, 7, 8 none
    assert f["within"] == {"30": 1 / 8, "60": 3 / 8, "120": 3 / 8, "300": 4 / 8}
    assert f["any_visible"] == 4 / 8
    assert st["idle_gap_s"] is None  # no service time known, none given
    nt = st["new_tokens_per_turn"]
    assert nt["n"] == 6 and nt["negative_share"] == pytest.approx(3 / 6)  # 500, 300, 350, -100, -310, -100
    assert nt["p50"] == pytest.approx(100.0)
    assert st["output_tokens"]["share_under_threshold"] == pytest.approx(0.6)  # 50, 30, 10, 40, 5, 60 < 64
    assert st["context_by_turn"]["1"] == {"n": 4, "p50": pytest.approx(950.0), "p90": pytest.approx(1380.0)}
    assert st["turns_per_session"]["max"] == 7 and st["turns_per_session"]["max_chain_depth"] == 4


def test_stats_idle_with_service_fn(moon: Trace) -> None:
    st = workload_stats(moon, ttls_s=(60,), service_time_fn=lambda i, o: np.full(np.shape(i), 10.0))
    assert st["idle_gap_s"]["p50"] == pytest.approx(55.0)
    assert st["idle_gap_s"]["service_time"] == "service_time_fn"


def test_stats_table_and_figure(moon: Trace) -> None:
    st = workload_stats(moon, service_time_fn=crude_service_time_s)
    rows = stats_table(st)
    assert all(isinstance(a, str) and isinstance(b, str) for a, b in rows)
    labels = [a for a, _ in rows]
    assert "P(next turn within 480 s)" in labels and "outputs under 64 tokens" in labels
    fig = stats_figure(moon, st)
    assert isinstance(fig, go.Figure)
    assert len(fig.data) == 3  # gap CDF, context p50, context p90
    assert len(fig.layout.shapes) == 7  # one dotted line per TTL


# --- hand-built CSV, RAGPulse, multi-turn -------------------------------------------------------------------


def test_csv_small() -> None:
    tr = load_trace(DATA / "sessions_small.csv")  # detected
    assert tr.format == "csv"
    m = _by_id(tr)
    assert m["session_id"].tolist() == ["a", "b", "a", "c", "b", "a"]
    assert m["arrival_s"].tolist() == [0.0, 5.5, 30.0, 100.0, 105.5, 150.0]
    assert m["turn"].tolist() == [1, 1, 2, 1, 2, 3]
    assert m["parent_request_id"].tolist() == [-1, -1, 0, -1, 1, 2]
    st = workload_stats(tr, ttls_s=(30, 120))
    assert sorted(turn_pairs(tr)["gap_s"].tolist()) == [30.0, 100.0, 120.0]
    assert st["followup"]["eligible_requests"] == 3  # arrivals <= 150 - 120 = 30: a1 (0), b1 (5.5), a2 (30)
    assert st["followup"]["within"] == {
        "30": pytest.approx(1 / 3),
        "120": 1.0,
    }  # first-child gaps 30, 100, 120
    assert st["new_tokens_per_turn"]["p50"] == 50.0  # 50, 50, 70
    assert st["turns_per_session"]["counts"] == {"1": 1, "2": 1, "3": 1}


def test_ragpulse_small() -> None:
    tr = load_trace(DATA / "ragpulse_small.jsonl")
    assert tr.format == "ragpulse"
    df = tr.requests
    assert df["request_id"].tolist() == [0, 2, 1, 3, 4]  # stable sort of the out-of-order line
    assert df["arrival_s"].tolist() == [0, 10, 15, 60, 75]
    assert df["turn"].tolist() == [1, 2, 1, 3, 2]
    assert df["parent_request_id"].tolist() == [-1, 0, -1, 2, 1]
    assert tr.notes["backwards_steps"] == 1 and tr.notes["clock_restarts"] == []
    assert sorted(turn_pairs(tr)["gap_s"].tolist()) == [10.0, 50.0, 60.0]


def test_ragpulse_clock_restart(tmp_path: Path) -> None:
    p = tmp_path / "two_weeks.jsonl"
    rows = [("0", "x"), ("5000", "x"), ("100", "y"), ("200", "x")]
    p.write_text(
        "".join(
            json.dumps({"timestamp": t, "input_length": 10, "output_length": 5, "session_id": s}) + "\n"
            for t, s in rows
        )
    )
    srt = load_trace(p, "ragpulse")
    assert srt.notes["clock_restarts"] == [3]
    assert srt.requests["arrival_s"].tolist() == [0, 100, 200, 5000]
    app = load_trace(p, "ragpulse", on_clock_restart="append")
    # the second segment starts at the first segment's last arrival (5000): 100 -> 5000, 200 -> 5100
    assert app.requests["arrival_s"].tolist() == [0, 5000, 5000, 5100]
    assert app.requests["request_id"].tolist() == [0, 1, 2, 3]
    assert _by_id(app)["parent_request_id"].tolist() == [-1, 0, -1, 1]


def test_multiturn_small() -> None:
    tr = load_trace(DATA / "multiturn_small.json")
    assert tr.format == "multiturn"
    df = tr.requests
    assert df["request_id"].tolist() == [0, 2, 3, 1, 4]
    assert df["arrival_s"].to_numpy() == pytest.approx([0.0, 0.2, 3.2, 4.0, 7.0])
    assert df["session_id"].tolist() == ["c0", "c1", "c1", "c0", "c1"]
    assert df["turn"].tolist() == [1, 1, 2, 2, 3]
    assert df["parent_request_id"].tolist() == [-1, -1, 2, 0, 3]
    pairs = turn_pairs(tr).sort_values("child_pos")
    assert pairs["gap_s"].to_numpy() == pytest.approx([3.0, 4.0, 3.8])
    assert pairs["idle_s"].to_numpy() == pytest.approx([1.0, 2.5, 1.7])  # measured latency_ms subtracted
    st = workload_stats(tr, ttls_s=(2,))
    assert st["idle_gap_s"]["service_time"] == "measured"
    assert st["idle_gap_s"]["p50"] == pytest.approx(1.7)


def test_detect_formats() -> None:
    assert detect_trace_format(DATA / "mooncake_small.jsonl") == "mooncake"
    assert detect_trace_format(DATA / "sessions_small.csv") == "csv"
    assert detect_trace_format(DATA / "ragpulse_small.jsonl") == "ragpulse"
    assert detect_trace_format(DATA / "multiturn_small.json") == "multiturn"
    with pytest.raises(KvplanInputError, match="cannot tell the trace format"):
        detect_trace_format(DATA / "README.md")


# --- malformed inputs ---------------------------------------------------------------------------------------

_MC = '{"timestamp": %s, "input_length": %s, "output_length": %s, "hash_ids": %s}'
_OK1 = _MC % (0, 1500, 10, "[0, 1, 2]")
_OK2 = _MC % (1000, 1100, 10, "[0, 1, 3]")
_CSV_H = "session_id,timestamp_s,input_tokens,output_tokens\n"

MALFORMED = [
    # (id, format, text, expected substrings)
    ("non_json", "mooncake", f"{_OK1}\n{{not json\n", ["line 2", "not valid JSON"]),
    ("not_object", "mooncake", f"{_OK1}\n[1, 2]\n", ["line 2", "not a JSON object"]),
    (
        "missing_field",
        "mooncake",
        '{"timestamp": 0, "input_length": 10, "hash_ids": [0]}\n',
        ["line 1", "missing field 'output_length'"],
    ),
    (
        "hash_len",
        "mooncake",
        f"{_OK1}\n" + _MC % (5, 1100, 1, "[0, 1]") + "\n",
        ["line 2", "'hash_ids'", "ceil(1100/512) = 3"],
    ),
    ("hash_entry", "mooncake", _MC % (0, 600, 1, '[0, "x"]') + "\n", ["line 1", "'hash_ids' entry 1"]),
    (
        "negative",
        "mooncake",
        f"{_OK1}\n{_OK2}\n" + _MC % (2000, 100, -3, "[0]") + "\n",
        ["line 3", "'output_length'", "negative"],
    ),
    ("nan", "mooncake", _MC % (0, "NaN", 5, "[0]") + "\n", ["line 1", "'input_length'", "NaN"]),
    (
        "fraction",
        "mooncake",
        _MC % (0, 100.5, 5, "[0]") + "\n",
        ["line 1", "'input_length'", "not a whole number"],
    ),
    ("unsorted", "mooncake", f"{_OK2}\n\n{_OK1}\n", ["line 3", "'timestamp'", "earlier than", "line 1"]),
    ("blank_only", "mooncake", "\n \n", ["no requests"]),
    ("csv_header", "csv", "session,ts,in,out\na,1,2,3\n", ["line 1", "header", "exactly"]),
    ("csv_fields", "csv", _CSV_H + "a,1,2\n", ["line 2", "3 fields"]),
    ("csv_nan", "csv", _CSV_H + "a,0,1,1\nb,nan,2,3\n", ["line 3", "'timestamp_s'", "NaN"]),
    ("csv_unsorted", "csv", _CSV_H + "a,5,1,1\nb,4,2,3\n", ["line 3", "'timestamp_s'", "earlier than"]),
    ("csv_tokens", "csv", _CSV_H + "a,5,1.5,1\n", ["line 2", "'input_tokens'", "not a whole number"]),
    ("csv_negative", "csv", _CSV_H + "a,5,10,-1\n", ["line 2", "'output_tokens'", "negative"]),
    (
        "rag_session",
        "ragpulse",
        '{"timestamp": "1", "input_length": 5, "output_length": 1, "session_id": "s"}\n'
        '{"timestamp": "2", "input_length": 5, "output_length": 1}\n',
        ["line 2", "missing field 'session_id'"],
    ),
    (
        "rag_timestamp",
        "ragpulse",
        '{"timestamp": "soon", "input_length": 5, "output_length": 1, "session_id": "s"}\n',
        ["line 1", "'timestamp'", "not a number"],
    ),
    (
        "mt_field",
        "multiturn",
        '[\n  {"conversation_id": "c", "start_time_ms": 1.0, "input_num_tokens": 5,\n'
        '   "output_num_tokens": 1, "input_num_turns": 1},\n'
        '  {"conversation_id": "c", "start_time_ms": 2.0,\n'
        '   "input_num_tokens": 5, "input_num_turns": 3}\n]\n',
        ["line 4", "missing field 'output_num_tokens'"],
    ),
    ("mt_truncated", "multiturn", '[\n  {"conversation_id": "c", "start_time_ms": 1.0,\n', ["line", "JSON"]),
    ("mt_not_array", "multiturn", '{"a": 1}\n', ["line 1", "JSON array"]),
]


@pytest.mark.parametrize(("case", "fmt", "text", "needles"), MALFORMED, ids=[c[0] for c in MALFORMED])
def test_malformed(tmp_path: Path, case: str, fmt: str, text: str, needles: list[str]) -> None:
    path = tmp_path / f"{case}.trace"
    path.write_text(text)
    with pytest.raises(KvplanInputError) as info:
        load_trace(path, fmt)
    msg = str(info.value)
    assert "\n" not in msg, msg
    assert str(path) in msg, msg
    for needle in needles:
        assert needle in msg, (needle, msg)


def test_empty_and_oversized_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(KvplanInputError, match="empty"):
        load_trace(empty, "mooncake")
    big = tmp_path / "big.jsonl"
    big.write_text(_OK1 + "\n")
    with pytest.raises(KvplanInputError, match="limit, so it was not read") as info:
        load_trace(big, "mooncake", max_bytes=10)
    assert "\n" not in str(info.value)
    with pytest.raises(KvplanInputError, match="unknown trace format"):
        load_trace(big, "sharegpt")


# --- selection ----------------------------------------------------------------------------------------------


def test_select_overlong_skip_reparents(moon: Trace) -> None:
    sel, rep = select(moon, max_context_tokens=3080, overlong="skip")
    assert rep["skipped_overlong"] == 1  # request 3 has 2,600 + 500 tokens
    assert rep["reparented"] == 1 and rep["orphaned"] == 0  # 8's parent 3 dropped -> attached to 2
    m = _by_id(sel)
    assert 3 not in m.index and m.loc[8, "parent_request_id"] == 2 and m.loc[8, "turn"] == 3
    assert sel.notes["selection"] == rep
    assert moon.n_requests == 10  # the input trace is untouched


def test_select_truncate(moon: Trace) -> None:
    sel, rep = select(moon, max_context_tokens=2500, overlong="truncate")
    assert rep["truncated_overlong"] == 3 and rep["skipped_overlong"] == 0
    m = _by_id(sel)
    assert (m["input_tokens"] + m["output_tokens"]).max() == 2500
    assert rep["truncated_overlong"] == 3  # 3 (3,100), 4 (2,680), 8 (3,060)
    assert m.loc[3, "input_tokens"] == 2000 and m.loc[3, "output_tokens"] == 500  # input cut first


def test_select_window_and_time_scale(moon: Trace) -> None:
    sel, rep = select(moon, window_s=(95, 1001), time_scale=2.0)
    assert rep["dropped_outside_window"] == 4 and rep["kept_requests"] == 6
    assert rep["orphaned"] == 3  # 4, 5 and 8 lose every ancestor
    m = _by_id(sel)
    assert m["arrival_s"].tolist() == [0.0, 50.0, 75.0, 80.0, 120.0, 450.0]  # (t - 100) / 2
    assert m.loc[6, "parent_request_id"] == 5 and m.loc[6, "turn"] == 2
    assert m.loc[[4, 5, 8], "parent_request_id"].tolist() == [-1, -1, -1]


def test_select_sample_sessions_deterministic(moon: Trace) -> None:
    a, rep = select(moon, sample_sessions=0.5, seed=3)
    b, _ = select(moon, sample_sessions=0.5, seed=3)
    assert rep["sessions_sampled"] == 2 and a.n_sessions == 2
    assert a.requests.equals(b.requests)
    kept = set(a.requests["session_id"])
    full = moon.requests[moon.requests["session_id"].isin(kept)]
    assert len(a.requests) == len(full)  # whole sessions only
    with pytest.raises(KvplanInputError, match="sample_sessions"):
        select(moon, sample_sessions=1.5)
    with pytest.raises(KvplanInputError, match="time_scale"):
        select(moon, time_scale=0)


def test_split_sessions() -> None:
    tr = load_trace(DATA / "sessions_small.csv", "csv")
    out, rep = split_sessions(tr, max_gap_s=100)
    assert rep["links_cut"] == 1 and rep["sessions"] == 4  # a2 -> a3 (120 s) is cut
    m = _by_id(out)
    assert m.loc[5, "session_id"] == "a@5" and m.loc[5, "turn"] == 1 and m.loc[5, "parent_request_id"] == -1


# --- workload fit -------------------------------------------------------------------------------------------


def _synthetic(median: float, sigma: float, sessions: int, seed: int) -> Trace:
    rng = np.random.default_rng(seed)
    rows: list[tuple[str, float, int, int]] = []
    for s in range(sessions):
        t = rng.uniform(0, 20_000)
        n_in = int(rng.integers(500, 4000))
        for _ in range(int(rng.integers(1, 5))):
            n_out = int(rng.integers(20, 600))
            rows.append((f"s{s}", t, n_in, n_out))
            t += float(crude_service_time_s(n_in, n_out)) + rng.lognormal(math.log(median), sigma)
            n_in += n_out + int(rng.integers(0, 200))
    rows.sort(key=lambda r: r[1])
    sid, arr, n_in_l, n_out_l = zip(*rows, strict=True)
    return trace_from_sessions(sid, arr, n_in_l, n_out_l, source="synthetic")


def test_fit_recovers_lognormal_idle_gap() -> None:
    tr = _synthetic(median=90.0, sigma=0.8, sessions=2500, seed=7)
    fit = fit_workload(tr, gap_model="fit")
    gap = fit["turn_gap_s"]
    assert gap["dist"] == "lognormal"
    emp = fit_workload(tr)["turn_gap_s"]  # the default keeps the measured idle gaps
    assert emp["dist"] == "empirical" and np.median(emp["values"]) == pytest.approx(90.0, rel=0.05)
    assert gap["median"] == pytest.approx(90.0, rel=0.05)
    assert gap["sigma"] == pytest.approx(0.8, rel=0.05)
    rep = fit["report"]["turn_gap"]
    assert rep["nonpositive_idle"] == 0
    assert (
        rep["fit"]["candidates"]["lognormal"]["ks_statistic"]
        < rep["fit"]["candidates"]["exponential"]["ks_statistic"]
    )
    assert fit["conversations"] == 2500
    starts = tr.requests.groupby("session_id")["arrival_s"].min()
    assert fit["arrival"]["rate_per_s"] == pytest.approx(2499 / (starts.max() - starts.min()))  # starts uniform: 1/8 s
    assert fit["report"]["sha256"] == tr.sha256
    for key in ("turns", "prefix_tokens", "user_tokens", "output_tokens"):
        assert fit[key]["dist"] == "empirical" and len(fit[key]["values"]) <= 2000
    assert yaml.safe_load(yaml.safe_dump(fit)) == fit
    json.dumps(fit, allow_nan=False)


def test_fit_output_validates_as_scenario_workload(moon: Trace) -> None:
    fit = fit_workload(moon)
    section = workload_section(fit)
    assert "report" not in section
    wl = Workload.model_validate(section)
    assert wl.conversations == 4
    assert fit["report"]["user_tokens"]["clipped_share"] == pytest.approx(3 / 6)
    assert min(fit["user_tokens"]["values"]) == 0


def test_empirical_subsample_and_gap_fit_errors() -> None:
    d = empirical(np.arange(10_000), max_values=100, integer=True)
    assert len(d["values"]) == 100 and d["values"][0] == 49 and d["values"][-1] == 9949
    assert empirical([3, 1, 2])["values"] == [1.0, 2.0, 3.0]
    with pytest.raises(KvplanInputError):
        fit_gap_distribution([1.0, -2.0, 3.0])
    exp = fit_gap_distribution(np.random.default_rng(1).exponential(30.0, 4000))
    assert exp["chosen_family"] == "exponential"
    assert exp["chosen"]["mean"] == pytest.approx(30.0, rel=0.05)


# --- real traces (skipped without ../shared) ----------------------------------------------------------------


@pytest.mark.shared_data
def test_real_mooncake_matches_workloads_md() -> None:
    need_shared("external_traces/mooncake_fast25/conversation_trace.jsonl")
    t0 = time.perf_counter()
    tr = load_trace(MOONCAKE)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0, elapsed
    assert tr.format == "mooncake" and tr.n_requests == 12_031
    assert tr.linking is not None
    assert tr.linking["linked_requests"] == pytest.approx(3975, abs=20)
    assert tr.n_sessions == pytest.approx(8056, abs=20)
    assert tr.linking["parents_with_2plus_children"] == 28
    st = workload_stats(tr)
    g = st["gap_s"]  # WORKLOADS.md 3.1: p10 42, p50 126, p90 480, p99 1,471, mean 216 s
    assert g["p10"] == pytest.approx(42, abs=2)
    assert g["p50"] == pytest.approx(126, abs=3)
    assert g["p90"] == pytest.approx(480, abs=10)
    assert g["p99"] == pytest.approx(1471, rel=0.03)
    assert g["mean"] == pytest.approx(216, abs=3)
    assert st["output_tokens"]["share_under_threshold"] == pytest.approx(0.17, abs=0.01)
    wide = workload_stats(tr, ttls_s=(60, 300, 480, 2340), followup_horizon_s=2340)
    # WORKLOADS.md: parents in the first 20 min, n = 3,262: 60 s 0.077, 300 s 0.285, 480 s 0.337
    assert wide["followup"]["eligible_requests"] == pytest.approx(3262, abs=40)
    assert wide["followup"]["within"]["60"] == pytest.approx(0.077, abs=0.005)
    assert wide["followup"]["within"]["300"] == pytest.approx(0.285, abs=0.005)
    assert wide["followup"]["within"]["480"] == pytest.approx(0.337, abs=0.005)


@pytest.mark.shared_data
def test_real_mooncake_pairs_equal_derived_csv() -> None:
    need_shared("external_traces/mooncake_fast25/derived_conversation_turn_pairs.csv")
    tr = load_trace(MOONCAKE, "mooncake")
    ref = pd.read_csv(MOONCAKE_PAIRS)
    df = tr.requests[tr.requests["parent_request_id"] >= 0]
    assert set(zip(df["parent_request_id"], df["request_id"], strict=True)) == set(
        zip(ref["parent_row"], ref["child_row"], strict=True)
    )
    m = _by_id(tr).loc[ref["child_row"]]
    assert (m["turn"].to_numpy() == ref["turn"].to_numpy()).all()
    assert (m["session_id"].astype(int).to_numpy() == ref["session"].to_numpy()).all()


@pytest.mark.shared_data
def test_real_ragpulse() -> None:
    need_shared("external_traces/ragpulse/0_trace.jsonl")
    tr = load_trace(RAGPULSE)
    assert tr.format == "ragpulse" and tr.n_requests == 7106 and tr.n_sessions == 3990
    assert tr.notes["clock_restarts"] == [3801]
    st = workload_stats(tr)
    g = st["gap_s"]  # WORKLOADS.md 3.2: p10 15, p25 23, p50 40, p75 89, p90 300, p95 1,024 s
    assert (g["p10"], g["p50"], g["p75"], g["p95"]) == (15, 40, 89, 1024)
    assert g["p90"] == pytest.approx(300, abs=1)
    assert st["turns_per_session"]["mean"] == pytest.approx(1.78, abs=0.01)
    assert st["turns_per_session"]["single_request_share"] == pytest.approx(0.588, abs=0.002)
    assert st["output_tokens"]["share_under_threshold"] == pytest.approx(0.04, abs=0.005)
    fit = fit_workload(split_sessions(tr, 3600)[0], gap_model="fit")
    assert fit["turn_gap_s"]["dist"] == "lognormal"
    appended = load_trace(RAGPULSE, on_clock_restart="append")
    assert appended.duration_s > 1.9 * tr.duration_s  # two weeks laid end to end


def test_trace_reader_is_the_bounded_reader_of_inputfile(tmp_path: Path) -> None:
    """Traces and text inputs are read, bounded and decoded by one reader; the digest is the file's bytes'."""
    import hashlib

    from kvplan.inputfile import read_bytes, read_text

    good = DATA / "mooncake_small.jsonl"
    assert load_trace(good, "mooncake").sha256 == hashlib.sha256(good.read_bytes()).hexdigest()
    assert read_bytes(good) == good.read_bytes()
    line = '{"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [1]}\n'
    cases = {
        "utf8": (line.encode() + b"\xff\xfe\n", "line 2: byte", 1 << 20),
        "nul": (line.encode() + b"\x00\n", "NUL byte", 1 << 20),
        "big": (line.encode() * 4, "larger than", len(line) * 2),
    }
    for name, (data, needle, limit) in cases.items():
        f = tmp_path / f"{name}.jsonl"
        f.write_bytes(data)
        with pytest.raises(KvplanInputError) as trace_err:
            load_trace(f, "mooncake", max_bytes=limit)
        with pytest.raises(KvplanInputError) as text_err:
            read_text(f, limit)
        assert str(trace_err.value) == str(text_err.value)  # same field, same message
        assert str(trace_err.value).startswith(f"{f}: ") and needle in str(trace_err.value)
    with pytest.raises(KvplanInputError, match=r"^--trace: file not found"):
        read_bytes(tmp_path / "none.jsonl", 10, "--trace")


def test_workload_fit_of_a_trace_with_zero_tokens_simulates(tmp_path: Path) -> None:
    """A trace request with output_tokens 0 is replayed with 1; the fitted workload takes it as 1 too (it wrote an
    empirical output list with a 0 that `simulate` refused: 'a draw of 0 rounds to 0'), and its report counts it."""
    import json

    import yaml

    from kvplan.app.cli import main

    trace = tmp_path / "t.csv"
    trace.write_text("session_id,timestamp_s,input_tokens,output_tokens\na,0,1000,0\nb,5,2000,50\na,10,1300,100\n")
    out = tmp_path / "w.yaml"
    assert main(["workload", "fit", str(trace), "--out", str(out)]) == 0
    wl = yaml.safe_load(out.read_text())["workload"]
    assert min(wl["output_tokens"]["values"]) >= 1
    report = json.loads((tmp_path / "w.fit.json").read_text())
    assert report["output_tokens"]["zero_taken_as_1"] == 1
    assert main(["simulate", str(out), "--out", str(tmp_path / "run")]) == 0


@pytest.mark.parametrize(
    ("head", "needle"),
    [
        (b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03+N-.", "is compressed (gzip), not a text file; decompress it first"),
        (b"\x28\xb5\x2f\xfd\x04\x58\x89\x00\x00", "is compressed (zstd)"),
        (b"PK\x03\x04\x14\x00\x00\x00\x08\x00", "is compressed (zip)"),
        (b"\xfd7zXZ\x00\x00\x04\xe6\xd6\xb4F", "is compressed (xz)"),
        (b"BZh91AY&SY\x8a\x12", "is compressed (bzip2)"),
        (b"session_id,timestamp_s\x00\x00\x01\x02", "NUL byte: this is a binary file, not a text file"),
        (b"session_id,timestamp_s,input_tokens,output_tokens\n\xc3\x28,0,1,1\n", "line 2: byte 50 is not valid UTF-8"),
    ],
)
def test_compressed_or_binary_trace_is_named_as_such(tmp_path: Path, head: bytes, needle: str) -> None:
    """A gzip trace read 'cannot tell the trace format from the first record' with mojibake and no hint."""
    f = tmp_path / "t.csv"
    f.write_bytes(head)
    for fmt in (None, "csv"):  # detected, or the format given (the reader decodes the whole file)
        with pytest.raises(KvplanInputError) as exc:
            load_trace(f, fmt)
        msg = str(exc.value)
        assert msg.startswith(f"{f}: ") and needle in msg and "cannot tell" not in msg and "\n" not in msg, msg


def test_utf8_character_cut_by_the_detection_head_is_not_an_error(tmp_path: Path) -> None:
    from kvplan.traces.readers import HEAD_BYTES

    header = b"session_id,timestamp_s,input_tokens,output_tokens\n"
    pad = HEAD_BYTES - len(header) - len(b"\xc3")  # the 2-byte 'é' of the next row straddles the head's end
    body = b"a" * (pad - len(",0,1,1\n")) + b",0,1,1\n" + "é,1,1,1\n".encode()
    f = tmp_path / "t.csv"
    f.write_bytes(header + body)
    assert detect_trace_format(f) == "csv" and load_trace(f).n_requests == 2


def test_kernel_file_is_not_called_empty_and_never_read(tmp_path: Path) -> None:
    """/proc files report size 0 (stat): 'file is empty' was wrong; they are refused by stat, never opened."""
    special = Path("/proc/self/status")
    if not special.is_file():
        pytest.skip("no procfs")
    with pytest.raises(KvplanInputError, match=r"special file of the kernel .* size is unknown .* not read"):
        load_trace(special)
    empty = tmp_path / "e.csv"
    empty.write_bytes(b"")
    with pytest.raises(KvplanInputError, match="file is empty"):
        load_trace(empty)


def test_an_empty_file_is_empty_where_proc_is_not_mounted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a mounted /proc or /sys counts: on a system without them (a plain folder on the root file system, the
    device of every other file there) an empty file is still 'empty', not 'a special file of the kernel'."""
    empty = tmp_path / "e.csv"
    empty.write_bytes(b"")
    dev = os.stat(empty).st_dev
    real_stat = os.stat
    monkeypatch.setattr(os.path, "ismount", lambda p: False)
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: os.stat_result((0o40755, 0, dev, 2, 0, 0, 0, 0, 0, 0))
                        if os.fspath(p) in ("/proc", "/sys") else real_stat(p, *a, **k))
    with pytest.raises(KvplanInputError, match="file is empty"):
        load_trace(empty)


_AZ_H = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
_LM_H = "prompt_tokens,generation_tokens,ttft,generation_time,user_id,question_id,launch_time,finish_time\n"


def test_unsorted_azure_is_refused_like_csv_and_mooncake(tmp_path: Path) -> None:
    """The published Azure traces are sorted: a row earlier than the one before is refused, naming it (it was
    sorted silently, unlike the CSV and Mooncake readers)."""
    f = tmp_path / "az.csv"
    f.write_text(_AZ_H + "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:40.0,396,109\n")
    with pytest.raises(KvplanInputError) as exc:
        load_trace(f)
    assert str(exc.value) == (f"{f}: line 3: field 'TIMESTAMP' is '2023-11-16 18:15:40.0', earlier than "
                              "'2023-11-16 18:15:46.6805900' on line 2; the trace must be sorted by arrival "
                              "(non-decreasing timestamps); sort it first")


def test_unsorted_lmbench_is_sorted_and_counted(tmp_path: Path) -> None:
    """LMBench writes a row when its request finishes (its published files are unsorted by launch_time): sorted
    by arrival, and the rows out of order are counted in the trace's notes; a sorted file has none."""
    f = tmp_path / "lm.csv"
    f.write_text(_LM_H + "75,20,0.04,0.5,403,1,1000.5,1001.1\n75,20,0.04,0.5,403,2,988.5,989.1\n"
                 "75,20,0.04,0.5,404,1,999.0,999.5\n75,20,0.04,0.5,404,2,1003.0,1004.0\n")
    tr = load_trace(f)
    assert tr.requests["arrival_s"].tolist() == [0.0, 10.5, 12.0, 14.5]
    assert tr.notes == {"rows_out_of_order": 1, "first_out_of_order_line": 3, "sorted_by": "launch_time"}
    ok = tmp_path / "ok.csv"
    ok.write_text(_LM_H + "75,20,0.04,0.5,403,1,988.5,989.1\n75,20,0.04,0.5,403,2,1000.5,1001.1\n")
    assert load_trace(ok).notes == {}


# --- vllm bench serve results as traces -----------------------------------------------------------------------


def _bench_file(tmp_path: Path, pretty: bool = False, **over: Any) -> Path:
    obj: dict[str, object] = {"date": "20260921-120000", "backend": "vllm", "completed": 3, "request_throughput": 1.0,
                              "duration": 3.0, "start_times": [5000.0, 5000.5, 5001.25, 5002.0],
                              "input_lens": [100, 200, 300, 400], "output_lens": [10, 0, 30, 40],
                              "latencies": [0.5, 0.0, 0.7, 0.8], "errors": ["", "Bad Request", "", ""]}
    obj.update(over)
    p = tmp_path / "bench.json"
    p.write_text(json.dumps(obj, indent=2 if pretty else None))
    return p


@pytest.mark.parametrize("pretty", [False, True])
def test_a_bench_serve_result_is_a_trace_of_its_requests(tmp_path: Path, pretty: bool) -> None:
    """`vllm bench serve --save-result --save-detailed` (one JSON object, one line or indented): each successful
    request is a single-turn session at its send time (start_times), with its lengths and latency as service time."""
    p = _bench_file(tmp_path, pretty)
    assert detect_trace_format(p) == "bench"
    tr = load_trace(p)
    df = tr.requests
    assert tr.format == "bench" and len(df) == 3 and tr.notes["failed_requests_left_out"] == 1
    assert df["arrival_s"].tolist() == [0.0, 1.25, 2.0]  # the trace's clock starts at its first request
    assert df["input_tokens"].tolist() == [100, 300, 400] and df["output_tokens"].tolist() == [10, 30, 40]
    assert df["service_s"].tolist() == [0.5, 0.7, 0.8] and (df["turn"] == 1).all() and df["session_id"].nunique() == 3
    # sent out of list order (a --max-concurrency semaphore): replayed in send order, counted
    late = load_trace(_bench_file(tmp_path, start_times=[5000.0, 5000.5, 5003.0, 5002.0]))
    assert late.requests["arrival_s"].tolist() == [0.0, 2.0, 3.0]
    assert late.requests["input_tokens"].tolist() == [100, 400, 300] and late.notes["requests_out_of_send_order"] == 1


@pytest.mark.parametrize("over, needle", [
    ({"start_times": None}, "field 'start_times' is null, not a list"),
    ({"input_lens": [1, 2]}, "field 'input_lens' has 2 entries but 'start_times' has 4"),
    ({"start_times": [], "input_lens": [], "output_lens": [], "latencies": [], "errors": []}, "holds no request"),
    ({"errors": ["x", "y", "z", "w"]}, "every one of its 4 requests failed"),
    ({"output_lens": [10, 0, 30.5, 40]}, "request 2: field 'output_lens' is 30.5, not a whole number"),
])
def test_a_bad_bench_trace_is_one_line(tmp_path: Path, over: dict[str, Any], needle: str) -> None:
    with pytest.raises(KvplanInputError, match=needle):
        load_trace(_bench_file(tmp_path, False, **over), "bench")


def test_a_bench_result_without_per_request_arrays_says_how_to_save_one(tmp_path: Path) -> None:
    p = tmp_path / "agg.json"
    p.write_text(json.dumps({"date": "x", "backend": "vllm", "completed": 3, "request_throughput": 1.0}))
    assert detect_trace_format(p) == "bench"
    with pytest.raises(KvplanInputError, match="has no per-request 'start_times'.*--save-detailed"):
        load_trace(p)


@pytest.mark.parametrize("header", ["session_id,timestamp_s,input_tokens,output_tokens",
                                    "TIMESTAMP,ContextTokens,GeneratedTokens",
                                    "prompt_tokens,generation_tokens,ttft,generation_time,user_id,question_id,"
                                    "launch_time,finish_time"])
def test_a_csv_trace_with_only_its_header_says_so(tmp_path: Path, header: str) -> None:
    """dash14: a header-only CSV was refused as 'no requests found (only blank lines)'."""
    p = tmp_path / "h.csv"
    p.write_text(header + "\n")
    with pytest.raises(KvplanInputError, match=r"no requests found \(only its header line\); add the requests"):
        load_trace(p)
    p.write_text("\n\n")
    with pytest.raises(KvplanInputError, match=r"only blank lines"):
        load_trace(p, "csv")


def test_a_weka_replay_reports_the_context_limit_its_skips_are_against() -> None:
    """dash14: a weka replay's trace report had the overlong counts without the limit (traces.select's reports have
    max_context_tokens), so the dashboard's line said '1 trace request(s) were skipped' without 'over N tokens'."""
    from kvplan.app.dash_metrics import context_limit_lines
    from kvplan.sim.api import run
    from kvplan.sim.scenario import scenario_from_dict

    sc = scenario_from_dict({"deployment": {"max_model_len": 1700},
                             "workload": {"trace": {"path": str(DATA / "weka_small.json")}}})
    s = run(sc).summary
    assert s["trace"]["max_context_tokens"] == 1700 and s["trace"]["skipped_overlong"] >= 1
    n = s["trace"]["skipped_overlong"]
    assert f"{n:,} trace request(s) over 1,700 tokens were skipped (the model's context limit)" in context_limit_lines(s)
