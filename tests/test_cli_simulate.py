"""``kvplan simulate``: outputs, reproducibility through the CLI, and the bad-input table (exit 2, one line)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import small

from kvplan.app.cli import main

GOOD = small()


def _write(tmp_path: Path, data: object | str) -> Path:
    p = tmp_path / "sc.yaml"
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def test_simulate_writes_outputs(tmp_path: Path) -> None:
    sc = _write(tmp_path, GOOD)
    out = tmp_path / "out"
    assert main(["simulate", str(sc), "--out", str(out), "--seed", "5", "--format", "both"]) == 0
    turns = (out / "turns.csv").read_text().splitlines()
    header = turns[0].split(",")
    assert list(pd.read_parquet(out / "turns.parquet").columns) == header
    for col in ("conversation_id", "turn", "arrival_s", "prompt_tokens", "local_hit_tokens", "pulled_tokens",
                "recomputed_tokens", "decision", "prefill_queue_s", "kv_pull_s", "prefill_s", "p2d_transfer_s", "ttft_s"):
        assert col in header
    summary = json.loads((out / "summary.json").read_text())
    for key in ("turns", "errors", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "hit_rate", "pulled_tokens",
                "recomputed_tokens", "d2p_bytes", "p2d_bytes", "pinned_kv_gib_mean", "pinned_kv_gib_peak"):
        assert key in summary
    assert summary["turns"] == len(turns) - 1 and summary["seed"] == 5
    out2 = tmp_path / "out2"
    assert main(["simulate", str(sc), "--out", str(out2), "--seed", "5", "--format", "both"]) == 0
    for name in ("turns.csv", "turns.parquet", "summary.json", "pinned.csv", "pinned.parquet"):
        assert (out / name).read_bytes() == (out2 / name).read_bytes(), name
    out3 = tmp_path / "out3"  # the default format: parquet only
    assert main(["simulate", str(sc), "--out", str(out3), "--seed", "5"]) == 0
    assert {p.name for p in out3.iterdir()} == {"turns.parquet", "pinned.parquet", "summary.json", "scenario.yaml",
                                                 ".kvplan-result.json"}
    assert (out3 / "turns.parquet").read_bytes() == (out / "turns.parquet").read_bytes()


def test_simulate_default_scenario(tmp_path: Path) -> None:
    assert main(["simulate", "--out", str(tmp_path / "d")]) == 0
    assert json.loads((tmp_path / "d" / "summary.json").read_text())["turns"] == 50


def _with(path: str, value: object) -> dict:
    data = json.loads(json.dumps(GOOD))
    node = data
    parts = path.split(".")
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value
    return data


BAD = [
    ("unknown top-level field", {**GOOD, "polcy": {}}, "polcy"),
    ("unknown nested field", _with("policy.ttl", 5), "policy.ttl"),
    ("wrong type", _with("policy.decoder_kv_blocks_ttl_s", "long"), "policy.decoder_kv_blocks_ttl_s"),
    ("negative ttl", _with("policy.decoder_kv_blocks_ttl_s", -1), "policy.decoder_kv_blocks_ttl_s"),
    ("negative threshold", _with("policy.kv_recompute_threshold_tokens", -64), "kv_recompute_threshold_tokens"),
    ("zero prefill nodes", _with("deployment.prefill_nodes", 0), "deployment.prefill_nodes"),
    ("zero conversations", _with("workload.conversations", 0), "workload.conversations"),
    ("zero rate", _with("workload.arrival", {"kind": "poisson", "rate_per_s": 0}), "workload.arrival"),
    ("unknown dist", _with("workload.turn_gap_s", {"dist": "pareto", "alpha": 2}), "workload.turn_gap_s"),
    ("lognormal median 0", _with("workload.turn_gap_s", {"dist": "lognormal", "median": 0, "sigma": 1}), "median"),
    ("uniform high < low", _with("workload.user_tokens", {"dist": "uniform", "low": 5, "high": 1}), "user_tokens"),
    ("unknown model", {**GOOD, "model": "gpt-9"}, "unknown model 'gpt-9'"),
    ("unknown hardware", {**GOOD, "hardware": "tpu-v9"}, "unknown hardware 'tpu-v9'"),
    ("model not a name", {**GOOD, "model": 123}, "field 'model': expected a preset name or an inline spec"),
    ("hardware a list", {**GOOD, "hardware": [1.5]}, "field 'hardware': expected a preset name or an inline spec"),
    ("bad failure policy", _with("policy.kv_load_failure_policy", "retry"), "kv_load_failure_policy"),
    ("tp over gpus", _with("deployment.tensor_parallel_size", 16), "tensor_parallel_size"),
    ("not a mapping", "- just\n- a list\n", "expected a mapping"),
    ("empty file", "", "empty scenario"),
    ("truncated yaml", "model: qwen3-32b\npolicy:\n  bidirectional: [true,\n", "YAML error"),
    ("unknown profile", {**GOOD, "profile": "nope-profile"}, "profile"),
    ("empirical file missing", _with("workload.output_tokens", {"dist": "empirical", "path": "/nonexistent.csv"}),
     "nonexistent"),
]


@pytest.mark.parametrize("name,data,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_input_one_line_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, data: object,
                                   needle: str) -> None:
    sc = _write(tmp_path, data)
    out = tmp_path / "out"
    code = main(["simulate", str(sc), "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    assert err.startswith("error: ") and "\n" not in err, err
    assert needle in err, err
    assert "Traceback" not in err
    assert not out.exists()
    assert not any(p.name.startswith(".out") for p in tmp_path.iterdir())


def test_missing_scenario_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(tmp_path / "nope.yaml"), "--out", str(tmp_path / "o")]) == 2
    assert "no such scenario file" in capsys.readouterr().err


def test_bad_flag_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--out", str(tmp_path / "o"), "--seed", "abc"]) == 2


@pytest.mark.parametrize("kind", ["fifo", "dir"])
def test_scenario_that_is_no_regular_file_is_named_as_such(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           kind: str) -> None:
    import os

    p = tmp_path / "sc.yaml"
    if kind == "fifo":
        os.mkfifo(p)  # reading it would block: refused by stat, never opened
    else:
        p.mkdir()
    assert main(["simulate", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert ("is not a regular file" if kind == "fifo" else "is a directory") in err, err
    assert "no such" not in err


def test_trace_zero_lengths_are_replayed_as_1_and_said(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 100, "output_length": 0, "hash_ids": [1]}\n'
                     '{"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}\n')
    out = tmp_path / "o"
    assert main(["simulate", "--trace", str(trace), "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert "on the scenario defaults" in captured.err and "max_num_seqs 1024" in captured.err
    assert "1 trace requests with output_tokens 0 were replayed with 1" in captured.out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["trace"]["output_tokens_zero_replayed_as_1"] == 1
    assert "input_tokens_zero_replayed_as_1" not in summary["trace"]
    assert pd.read_parquet(out / "turns.parquet")["output_tokens"].tolist() == [1, 5]


@pytest.mark.parametrize(("text", "hint"), [("5e-4", "write 5.0e-4"), ("1.0e30", "write 1.0e+30"),
                                            ("2E6", "write 2.0e+6")])
def test_a_yaml_number_string_is_refused_with_the_form_yaml_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                  text: str, hint: str) -> None:
    p = tmp_path / "sc.yaml"
    p.write_text(f"workload:\n  arrival: {{kind: poisson, rate_per_s: {text}}}\n")
    assert main(["simulate", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "rate_per_s" in err and hint in err, err
    assert yaml.safe_load(hint.split()[-1]) == float(text)  # the suggested form is a float to YAML


def test_relative_paths_in_a_scenario_are_its_neighbours(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative trace/empirical path inside a scenario is resolved beside the scenario file, not the working
    directory (which silently replayed another file of the same name), and recorded absolute in the result's
    scenario.yaml, which then replays from anywhere."""
    header = "session_id,timestamp_s,input_tokens,output_tokens\n"
    (tmp_path / "proj" / "traces").mkdir(parents=True)
    (tmp_path / "proj" / "traces" / "t.csv").write_text(header + "a,0,1000,50\na,10,1300,50\na,20,1600,50\n")
    (tmp_path / "proj" / "vals.txt").write_text("2\n3\n")
    sc = tmp_path / "proj" / "sc.yaml"
    sc.write_text("workload:\n  trace: {path: traces/t.csv}\n")
    emp = tmp_path / "proj" / "emp.yaml"
    emp.write_text("workload:\n  conversations: 3\n  turns: {dist: empirical, path: vals.txt}\n")
    (tmp_path / "cwd" / "traces").mkdir(parents=True)
    (tmp_path / "cwd" / "traces" / "t.csv").write_text(header + "z,0,500,10\n")  # the decoy
    monkeypatch.chdir(tmp_path / "cwd")
    out = tmp_path / "o"
    assert main(["simulate", str(sc), "--out", str(out), "--format", "csv"]) == 0
    assert len(pd.read_csv(out / "turns.csv")) == 3  # the neighbour's 3 turns, not the decoy's 1
    recorded = yaml.safe_load((out / "scenario.yaml").read_text())["workload"]["trace"]["path"]
    assert Path(recorded).is_absolute() and Path(recorded) == tmp_path / "proj" / "traces" / "t.csv"
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", str(out / "scenario.yaml"), "--out", str(tmp_path / "again"), "--format", "csv"]) == 0
    assert main(["simulate", str(emp), "--out", str(tmp_path / "e"), "--format", "csv"]) == 0


def test_hit_rate_without_follow_up_turns_reads_n_a(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Only first turns: the table says the hit rate does not apply (it read 0.0%); summary.json keeps 0.0."""
    trace = tmp_path / "t.csv"
    trace.write_text("session_id,timestamp_s,input_tokens,output_tokens\na,0,300,20\nb,1,400,30\n")
    out = tmp_path / "o"
    assert main(["simulate", "--trace", str(trace), "--out", str(out)]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if "hit rate" in ln)
    assert "n/a (no follow-up turns)" in row and "%" not in row, row
    summary = json.loads((out / "summary.json").read_text())
    assert summary["follow_up_turns"] == 0 and summary["hit_rate"] == 0.0
    two = tmp_path / "two.csv"
    two.write_text("session_id,timestamp_s,input_tokens,output_tokens\na,0,300,20\na,5,400,30\n")
    assert main(["simulate", "--trace", str(two), "--out", str(tmp_path / "o2")]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if "hit rate" in ln)
    assert "n/a" not in row and "%" in row, row


def test_unsorted_lmbench_rows_are_counted_in_the_trace_report_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "lm.csv"
    trace.write_text("prompt_tokens,generation_tokens,ttft,generation_time,user_id,question_id,launch_time,finish_time\n"
                     "75,20,0.04,0.5,403,1,1000.5,1001.1\n75,20,0.04,0.5,403,2,988.5,989.1\n")
    out = tmp_path / "o"
    assert main(["simulate", "--trace", str(trace), "--out", str(out)]) == 0
    assert "note: 1 trace rows were earlier than the row before them; the trace was replayed sorted by arrival" in (
        capsys.readouterr().out)
    assert json.loads((out / "summary.json").read_text())["trace"]["rows_out_of_order_sorted"] == 1
    trace.write_text("prompt_tokens,generation_tokens,ttft,generation_time,user_id,question_id,launch_time,finish_time\n"
                     "75,20,0.04,0.5,403,1,988.5,989.1\n75,20,0.04,0.5,403,2,1000.5,1001.1\n")
    assert main(["simulate", "--trace", str(trace), "--out", str(tmp_path / "o2")]) == 0
    assert "replayed sorted" not in capsys.readouterr().out
    assert "rows_out_of_order_sorted" not in json.loads((tmp_path / "o2" / "summary.json").read_text())["trace"]


def test_reuse_rate_counts_kv_reused_not_router_hits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A threshold above every pull: each follow-up is a router hit (hit rate 100%) that recomputes everything, so
    nothing is reused; summary.json's reuse_rate and the table say 0%, as the sweep row's run_extras reuse_rate."""
    from kvplan.plan.executor import run_extras
    from kvplan.sim.api import run

    sc = {"model": "qwen3-32b", "hardware": "p5en",
          "deployment": {"prefill_nodes": 1, "decode_nodes": 1, "prefill_prefix_caching": False},
          "policy": {"bidirectional": True, "kv_recompute_threshold_tokens": 1_000_000},
          "workload": {"conversations": 20, "turns": {"dist": "constant", "value": 3}}}
    r = run(sc)
    assert r.summary["hit_rate"] == 1.0 and r.summary["reuse_rate"] == 0.0 == run_extras(r)["reuse_rate"]
    on = run({**sc, "policy": {"bidirectional": True}})
    assert on.summary["reuse_rate"] == run_extras(on)["reuse_rate"] > 0.9
    p = tmp_path / "sc.yaml"
    p.write_text(yaml.safe_dump(sc))
    assert main(["simulate", str(p), "--out", str(tmp_path / "o")]) == 0
    assert re.search(r"reuse rate[^\n]*0\.0%", capsys.readouterr().out)


@pytest.mark.parametrize("with_scenario", [False, True])
def test_a_relative_trace_flag_is_recorded_absolute_and_replays_from_anywhere(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_scenario: bool) -> None:
    """``simulate --trace t.csv`` recorded ``path: t.csv`` in the result's scenario.yaml (the README promises every
    file path recorded absolute), so replaying that scenario.yaml from another directory failed: no t.csv beside it
    nor in the new working directory."""
    import shutil

    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(Path(__file__).parent / "data" / "traces" / "sessions_small.csv", work / "t.csv")
    monkeypatch.chdir(work)
    args = ["simulate", *(["s.yaml"] if with_scenario else []), "--trace", "t.csv", "--out", "a"]
    if with_scenario:
        (work / "s.yaml").write_text("policy: {decoder_kv_blocks_ttl_s: 60}\n")
    assert main(args) == 0
    recorded = yaml.safe_load((work / "a" / "scenario.yaml").read_text())["workload"]["trace"]["path"]
    assert recorded == str(work / "t.csv")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["simulate", str(work / "a" / "scenario.yaml"), "--out", "b"]) == 0
    for name in ("turns.parquet", "pinned.parquet", "summary.json", "scenario.yaml"):
        assert (elsewhere / "b" / name).read_bytes() == (work / "a" / name).read_bytes(), name


@pytest.mark.parametrize(("field", "text", "hint"), [
    ("workload:\n  conversations", '"8"', "is the string '8', not a number (it is quoted): write 8 without quotes"),
    ("policy:\n  decoder_kv_blocks_ttl_s", "'480'", "(it is quoted): write 480 without quotes"),
    ("policy:\n  decoder_kv_blocks_ttl_s", "'4.8e2'", "a signed exponent: write 4.8e+2"),  # YAML 1.1 reads no 4.8e2
])
def test_a_quoted_number_is_told_to_lose_its_quotes(tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str,
                                                     text: str, hint: str) -> None:
    """``conversations: "8"`` was told "YAML 1.1 reads a float only with a dot and a signed exponent: write 8.0e+0",
    a fix for another problem (and a float for a count): the number is fine, its quotes are not."""
    p = tmp_path / "sc.yaml"
    p.write_text(f"{field}: {text}\n")
    assert main(["simulate", str(p), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert hint in err and err.count("\n") == 1, err
