"""The newcomer frictions of issue 13: each resolved as a user would expect (CLI level)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from kvplan.app.cli import main
from kvplan.app.cmd_dashboard import streamlit_command
from kvplan.calibration.traces import detect_trace_format, load_trace

DATA = Path(__file__).parent / "data" / "traces"
SMALL: dict = {
    "deployment": {"max_num_seqs": 64, "prefill_prefix_caching": False},
    "workload": {"conversations": 8, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                 "turns": {"dist": "constant", "value": 2}, "prefix_tokens": {"dist": "constant", "value": 1000},
                 "user_tokens": {"dist": "constant", "value": 50}, "output_tokens": {"dist": "constant", "value": 20},
                 "turn_gap_s": {"dist": "exponential", "mean": 5}},
}


def test_workload_fit_output_runs_in_simulate_and_is_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "w.yaml"
    assert main(["workload", "fit", str(DATA / "sessions_small.csv"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    # quiet: the fitted values stay in the files; besides the summary lines, only what the fitted workload does not
    # reproduce (one line) and why (one line per reason)
    lines = [ln for ln in printed.splitlines() if not ln.startswith("  why: ")]
    assert len(lines) <= 4 and "wrote" in printed and '"f"' not in printed
    assert set(yaml.safe_load(out.read_text())) == {"workload"}
    report = json.loads((tmp_path / "w.fit.json").read_text())
    assert report and '"f"' not in json.dumps(report)
    assert main(["simulate", str(out), "--out", str(tmp_path / "o")]) == 0
    capsys.readouterr()
    assert main(["workload", "fit", str(DATA / "sessions_small.csv"), "--out", str(tmp_path / "w2.yaml"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads((tmp_path / "w2.fit.json").read_text())


def test_sweep_prints_a_summary_table_and_writes_csv(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump({"base": SMALL, "axes": {"policy.decoder_kv_blocks_ttl_s": [1, 60]}}))
    out, csv = tmp_path / "r.parquet", tmp_path / "r.csv"
    assert main(["sweep", str(grid), "--out", str(out), "--workers", "1", "--csv", str(csv)]) == 0
    text = capsys.readouterr().out
    assert "per-point means" in text and "TTFT p90" in text and "policy.decoder_kv_blocks_ttl_s" in text
    summ = pd.read_csv(csv)
    assert list(summ["policy.decoder_kv_blocks_ttl_s"]) == [1, 60]
    assert summ["hit_rate_mean"].iloc[0] < summ["hit_rate_mean"].iloc[1]
    assert f"{summ['hit_rate_mean'].iloc[1]:.1%}" in text


def test_sweep_out_must_be_parquet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump({"base": SMALL}))
    assert main(["sweep", str(grid), "--out", str(tmp_path / "r.csv")]) == 2
    assert ".parquet" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.yaml"]


def test_usage_errors_are_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--profile", "p5en-qwen3-32b", "--tokens", "abc"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.startswith("error: kvplan cost: ") and "--tokens" in err


def test_trace_format_error_names_the_headers(tmp_path: Path) -> None:
    bad = tmp_path / "t.csv"
    bad.write_text("a,b,c\n1,2,3\n")
    with pytest.raises(Exception, match="session_id,timestamp_s,input_tokens,output_tokens") as exc:
        detect_trace_format(bad)
    assert "format=" not in str(exc.value)


def test_azure_and_lmbench_csvs_are_recognised(tmp_path: Path) -> None:
    az = tmp_path / "az.csv"
    az.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                  "2023-11-16 18:15:50.9951690,396,109\n")
    tr = load_trace(az)
    assert tr.format == "azure" and tr.n_sessions == 2
    assert tr.requests["arrival_s"].tolist() == pytest.approx([0.0, 4.314579])
    lm = tmp_path / "lm.csv"
    lm.write_text("prompt_tokens,generation_tokens,ttft,generation_time,user_id,question_id,launch_time,finish_time\n"
                  "21073.0,100.0,1.9,1.6,103,1,1000.0,1003.5\n21202.0,100.0,1.9,1.6,103,2,1030.0,1034.0\n")
    tr = load_trace(lm)
    assert tr.format == "lmbench" and tr.n_sessions == 1
    assert tr.requests["turn"].tolist() == [1, 2] and tr.requests["service_s"].tolist() == [3.5, 4.0]


def test_real_azure_and_lmbench_files(shared_dir: Path) -> None:
    az = shared_dir / "external_traces" / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv"
    lm = shared_dir / "external_traces" / "llmd_lmbench_multiround" / "llama8b_vllm_long_input_qps0.5.csv"
    if not (az.is_file() and lm.is_file()):
        pytest.skip("shared Azure / LMBench traces not available")
    assert load_trace(az).format == "azure" and load_trace(az).n_requests == 19_366
    t = load_trace(lm)
    assert t.format == "lmbench" and t.n_requests == 52 and t.requests["turn"].max() == 4
    assert t.notes["rows_out_of_order"] == 16  # written in finishing order: sorted by arrival, and counted


def test_dashboard_hides_the_deploy_button_and_refuses_a_busy_port() -> None:
    cmd = streamlit_command(8501, "localhost")
    assert cmd[cmd.index("--client.toolbarMode") + 1] == "minimal"


def test_capacity_names_the_closest_deployment_when_nothing_meets_the_slo(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["capacity", "--rate", "0.5", "--slo-ttft-p90-ms", "1", "--max-nodes", "3", "--replications", "1",
            "--workers", "1", "--conversations", "60", "--json"]
    assert main(args) == 0
    plan = json.loads(capsys.readouterr().out)
    on = plan["with_bidirectional"]
    assert on["meets_slo"] is False and on["closest_xpyd"] in ("1P1D", "1P2D", "2P1D")
    assert on["closest_ttft_p90_ms"] > 1 and "closest tried" in on["note"]
    assert plan["turns_per_conversation"] > 1  # never NaN


def test_reproduce_prints_the_tolerance(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "--model", "qwen3-32b"]) == 0
    text = capsys.readouterr().out
    assert "tolerance" in text and "±7%" in text


def test_whatif_answers_on_vs_off_in_one_line() -> None:
    from kvplan.app import dash_state as ds

    on = {"ttft_p50_s": 0.122, "ttft_p90_s": 0.2, "hit_rate": 0.8}
    off = {"ttft_p50_s": 0.158, "ttft_p90_s": 0.25, "hit_rate": 0.0}
    text = ds.on_off_text(on, off)
    assert "TTFT p50 122.0 ms vs 158.0 ms (-23%)" in text and "hit rate 80.0% vs 0.0%" in text


def test_advice_marker_sits_at_the_recommended_ttl() -> None:
    from kvplan.app import figures

    fig = figures.ttl_curve([{"ttl_s": 1, "ttft_mean_s": 0.3, "pinned_kv_gib_mean": 1},
                             {"ttl_s": 300, "ttft_mean_s": 0.2, "pinned_kv_gib_mean": 9}], chosen_ttl_s=30)
    line = [s for s in fig.layout.shapes if s.x0 == s.x1][0]
    assert line.x0 == 30  # shapes: data value on a log axis
    note = [a for a in fig.layout.annotations if "recommended" in a.text][0]
    assert note.x == pytest.approx(1.4771, abs=1e-3)  # annotations: log10 of it


def test_p5en_tcp_is_usable_and_pulls_slower() -> None:
    from kvplan.sim.api import run

    data = {**SMALL, "deployment": {"max_num_seqs": 64, "prefill_prefix_caching": False}}
    efa = run({**data, "hardware": "p5en"}).summary
    tcp = run({**data, "hardware": "p5en-tcp"})
    # p5en's compute prior and calibrated residuals, with the TCP link's line rate (models/resolve.py)
    assert "p5en-qwen3-32b" in tcp.summary["profile"]
    assert tcp.summary["kv_pull_mean_s"] > 3 * efa["kv_pull_mean_s"] > 0  # 0.3 GB/s vs ~50 GB/s per rank + fixed costs


def test_heatmap_does_not_paint_noise() -> None:
    from kvplan.app import figures

    grid = pd.DataFrame({"ttl_s": [30, 60, 30, 60], "threshold_tokens": [64, 64, 128, 128],
                         "v": [1.0902, 1.0905, 1.0908, 1.0910], "v_ci95": [0.004] * 4})
    fig = figures.grid_heatmap(grid, "v", "p90", "ms", scale=1000)
    hm = fig.data[0]
    noise = 0.01 * 1090.625  # 1% of the level exceeds the 4 ms CI here
    assert hm.zmin == pytest.approx(1090.625 - noise) and hm.zmax == pytest.approx(1090.625 + noise)
    assert "within noise" in fig.layout.title.text
    grid["v"] = [1.0, 1.5, 2.0, 2.5]
    fig = figures.grid_heatmap(grid, "v", "p90", "ms", scale=1000)
    assert fig.data[0].zmin is None  # real differences keep the automatic colour range


def test_dashboard_headline_scales_long_times() -> None:
    from kvplan.app import dash_state as ds

    cur = {"ttft_p50_s": 4385.95, "ttft_p90_s": 0.25, "ttft_mean_s": 0.9, "hit_rate": 0.1, "errors": 0}
    base = {"ttft_p50_s": 1.31, "ttft_p90_s": 0.25, "ttft_mean_s": 0.8, "hit_rate": 0.1, "errors": 0}
    m = {x.label: x for x in ds.headline_metrics(cur, base)}
    assert m["TTFT p50"].value == "73.1 min" and m["TTFT p50"].delta == "+73.1 min"
    assert m["TTFT mean"].value == "900.0 ms" and m["TTFT mean"].delta == "+100.0 ms"
