"""``kvplan validate``: the command, its JSON, case selection, bad input, the prediction paths and the data copies."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from kvplan.app.cli import main
from kvplan.calibration.reproduce import reproduce_rows
from kvplan.calibration.validate import (
    SERVING_METRICS,
    case_names,
    load_case,
    markdown_table,
    run_scenario,
    validate,
    validate_case,
)
from kvplan.errors import KvplanInputError
from kvplan.models.costs import decode_step_time_s, prefill_time_s
from kvplan.sim.api import run
from kvplan.sim.engine import resolve
from kvplan.sim.scenario import scenario_from_dict

CASE_KEYS = {
    "name", "title", "kind", "status", "source", "setup", "scenario", "profile", "predicts", "in_sample",
    "not_expressible", "modelled", "points", "summary", "band", "seed_spread",
}
POINT_KEYS = ["label", "metric", "measured", "predicted", "rel_error", "predicted_low", "predicted_high", "in_band",
              "knife_edge", "seed_low", "seed_high", "in_seed_spread"]
REQUIRED = {
    "dynamo-qwen3-32b-prefill", "dynamo-qwen3-32b-decode", "dynamo-qwen3-32b-1p1d", "llmd-1p1d-a100-llama-3.1-8b",
    "p5en-published",
}


def _on_p5en(name: str, **scenario: object) -> dict:
    """A shipped case re-pointed at hardware that resolves today (to exercise its prediction path)."""
    case = load_case(name)
    sc = {**(case.scenario or {}), "hardware": "p5en", **scenario}
    return validate_case(case.model_copy(update={"scenario": sc}))


def test_validate_json_keys_and_every_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out) == ["cases"]
    names = [c["name"] for c in out["cases"]]
    assert names == case_names() and REQUIRED <= set(names)
    for c in out["cases"]:
        assert set(c) == CASE_KEYS, c["name"]
        assert c["source"]["licence"] and c["source"]["repository"] and c["setup"]
        assert set(c["summary"]) == {"points", "predicted", "mape_pct", "max_abs_error_pct"}
        assert c["summary"]["points"] == len(c["points"]) > 0
        for p in c["points"]:
            assert list(p) == POINT_KEYS
            if p["predicted"] is not None:
                assert p["rel_error"] == pytest.approx((p["predicted"] - p["measured"]) / p["measured"], abs=2e-4)
            if p["predicted_low"] is not None:  # the band brackets the point; in_band says where the measurement is
                assert p["predicted_low"] <= p["predicted"] <= p["predicted_high"]
                assert p["in_band"] == (p["predicted_low"] <= p["measured"] <= p["predicted_high"])
            if p["seed_low"] is not None:  # the seed spread holds the prediction (seed 0 is one of its seeds)
                assert p["seed_low"] <= p["predicted"] <= p["seed_high"]
                assert p["in_seed_spread"] == (p["seed_low"] <= p["measured"] <= p["seed_high"])
        spread = c["seed_spread"]
        if c["kind"] == "serving" and c["summary"]["predicted"]:
            assert spread["points_with_spread"] == c["summary"]["predicted"] and spread["seeds"] == [0, 1, 2, 3]
        else:
            assert spread is None and all(p["seed_low"] is None for p in c["points"])
        band = c["band"]
        if c["status"] == "predicted, not fitted":  # every predicted point of a predicted case has its band
            assert band["points_with_band"] == c["summary"]["predicted"] and band["line"].startswith("measured inside")
            assert set(band["scaling"]["factors"]) == {"prefill", "decode"}
        # nothing is skipped silently: a case without predictions says why
        if c["summary"]["predicted"] < c["summary"]["points"]:
            assert c["not_expressible"] and c["status"] == "not expressible"
    pub = next(c for c in out["cases"] if c["name"] == "p5en-published")
    assert pub["status"] == "fitted, in-sample"
    others = [c for c in out["cases"] if c["name"] != "p5en-published"]
    assert all(c["status"] != "fitted, in-sample" for c in others)
    rows = reproduce_rows(published_only=True)
    assert [(p["measured"], p["predicted"]) for p in pub["points"]] == [(r["published_ms"], r["simulated_ms"]) for r in rows]


def test_case_selection_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--json", "--case", "p5en-published", "--case", "dynamo-qwen3-32b-decode"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in out["cases"]] == ["p5en-published", "dynamo-qwen3-32b-decode"]
    assert main(["validate", "--case", "dynamo-qwen3-32b-decode"]) == 0
    text = capsys.readouterr().out
    assert "dynamo-qwen3-32b-decode" in text and "summary:" in text and "not expressible" in text
    assert "p5en-published" not in text


def test_unknown_case_is_one_line_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--case", "p5en-published", "--case", "no-such-case"]) == 2
    cap = capsys.readouterr()
    err = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: --case") and "no-such-case" in err[0]
    assert "p5en-published" in err[0] and "Traceback" not in cap.err and cap.out == ""  # names checked before work


def test_markdown_has_one_row_per_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--markdown"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("| case |") and len(lines) == 2 + len(case_names())
    # the existing columns as they were, the band's and the seed spread's after them
    assert lines[0] == ("| case | status | profile | points predicted | MAPE | max abs error | not expressible | band "
                        "| seeds 0-3 |")
    row = next(ln for ln in lines if ln.startswith("| `llmd-1p1d-a100-llama-3.1-8b`"))
    assert row.rstrip(" |").endswith("/12 within") and "/12 inside |" in row and row.count(" | ") == 8
    fixed = next(ln for ln in lines if ln.startswith("| `mooncake-vllm-1p1d-h800-qwen3-8b`"))
    assert fixed.endswith("| no random part |")
    edge = validate_case(knife_edge_case())
    (cell,) = [ln for ln in markdown_table([edge]).splitlines()[2:]]
    assert cell.rsplit(" | ", 1)[0].endswith("knife edges**")  # the band cell names a case's knife edges


def test_unresolvable_case_keeps_points_and_says_why() -> None:
    r = validate_case(load_case("dynamo-qwen3-32b-prefill").model_copy(update={"scenario": {
        "model": "qwen3-32b", "hardware": "no-such-gpu", "deployment": {"tensor_parallel_size": 1}}}))
    assert r["status"] == "not expressible" and r["summary"]["predicted"] == 0 and len(r["points"]) == 17
    assert r["not_expressible"][0].startswith("no prediction: ") and "no-such-gpu" in r["not_expressible"][0]


def test_llmd_pd_runs_are_simulated_as_the_replicas_that_served_them() -> None:
    """The llm-d "1P1D"/"2P1D" runs' endpoint picker (llm-d-inference-scheduler 0.0.1) ran the demo dual scheduler and
    never asked for P/D: each request was served whole by a random pod. The cases simulate that, say why (citing the
    code), and land where the plain replicas of the same workload land, not at the P/D reading's saturation."""
    for name, n in (("llmd-1p1d-a100-llama-3.1-8b", 2), ("llmd-2p1d-a100-llama-3.1-8b", 3)):
        case = load_case(name)
        sc = run_scenario(case, case.runs[0])
        assert (sc.deployment.mode, sc.deployment.replicas, sc.deployment.routing) == ("aggregated", n, "random")
        why = " ".join(case.modelled)
        assert "dual.NewScheduler" in why and "x-prefiller-url" in why and "abb80872" in why
        assert any("enforce-eager" in x for x in case.not_expressible)  # what is left, named
        r = validate_case(case)
        means = [p for p in r["points"] if p["metric"] == "ttft_mean_ms"]
        assert all(abs(p["rel_error"]) < 0.25 for p in means), means  # the P/D reading missed by +218..+550%


def test_vllm_replicas_case_is_simulated_in_aggregated_mode() -> None:
    case = load_case("llmd-vllm-replicas-a100-llama-3.1-8b")
    scs = [run_scenario(case, x) for x in case.runs]
    assert [sc.deployment.mode for sc in scs] == ["aggregated", "aggregated"]
    assert [sc.deployment.replicas for sc in scs] == [2, 3]  # the run's own replica count over the case's
    # the ClusterIP Service: kube-proxy picks a backend at random per connection (the case file says why)
    assert all(sc.deployment.tensor_parallel_size == 1 and sc.deployment.routing == "random" for sc in scs)
    assert [sc.workload.arrival.rate_per_s for sc in scs] == [1.8, 2.5]
    # the engine-side prompt lengths of the re-tokenised random-dataset text, not the nominal 10000 (the case says why)
    assert scs[1].workload.prefix_tokens.values == tuple(float(v) for v in case.runs[1].engine_input_tokens or [])
    assert (case.scenario or {})["deployment"]["replicas"] == 2  # the override does not leak into the case
    r = validate_case(case)
    assert r["status"] == "predicted, not fitted" and r["summary"]["predicted"] == 12 and r["profile"]  # ITL: 4 more
    by = {(p["label"], p["metric"]): p["predicted"] for p in r["points"]}
    res = run(scs[1])
    assert by[(case.runs[1].label, "ttft_mean_ms")] == pytest.approx(res.summary["ttft_mean_s"] * 1e3, abs=1e-3)
    assert by[(case.runs[1].label, "tpot_p50_ms")] == pytest.approx(res.summary["tpot_p50_s"] * 1e3, abs=1e-3)
    assert by[(case.runs[1].label, "itl_p99_ms")] == pytest.approx(res.summary["itl_p99_s"] * 1e3, abs=1e-3)


def test_prefill_curve_is_the_resolved_cost_function() -> None:
    r = _on_p5en("dynamo-qwen3-32b-prefill")
    sc = scenario_from_dict({"model": "qwen3-32b", "hardware": "p5en", "deployment": {"tensor_parallel_size": 1}})
    rs = resolve(sc)
    assert r["profile"] == f"{rs.profile.name} ({rs.profile.status})"
    for p, (isl, ms) in zip(r["points"], load_case("dynamo-qwen3-32b-prefill").points, strict=True):
        assert p["measured"] == pytest.approx(ms, abs=1e-4)
        want = prefill_time_s(rs.costs.prefill, int(isl), 0, sc.deployment.max_num_batched_tokens) * 1e3
        assert p["predicted"] == pytest.approx(want, abs=1e-4)
    assert r["summary"]["predicted"] == 17 and r["summary"]["mape_pct"] > 0


def test_decode_curve_is_the_resolved_step_cost() -> None:
    r = _on_p5en("dynamo-qwen3-32b-decode")
    rs = resolve(scenario_from_dict({"model": "qwen3-32b", "hardware": "p5en", "deployment": {"tensor_parallel_size": 1}}))
    for p, (b, ctx, _ms) in zip(r["points"], load_case("dynamo-qwen3-32b-decode").points, strict=True):
        assert p["predicted"] == pytest.approx(decode_step_time_s(rs.costs.decode, int(b), b * ctx) * 1e3, abs=1e-4)


def test_serving_run_is_a_simulation_of_the_setup() -> None:
    case = load_case("dynamo-qwen3-32b-1p1d")
    case = case.model_copy(update={"scenario": {**(case.scenario or {}), "hardware": "p5en"}})
    r = validate_case(case)
    assert r["summary"]["predicted"] == sum(len(x.measured) for x in case.runs)
    by = {(p["label"], p["metric"]): p["predicted"] for p in r["points"]}
    for x in case.runs:
        sc = run_scenario(case, x)
        w = sc.workload
        assert w.conversations == x.requests and w.turns.value == 1 and w.prefix_tokens.value == x.input_tokens
        assert w.output_tokens.value == x.output_tokens and w.arrival.kind == "closed_loop"
        assert w.arrival.clients == w.arrival.max_active_conversations == x.arrival["clients"]
        res = run(sc)
        for metric in x.measured:
            key = SERVING_METRICS[metric]
            if key == "latency":
                ok = res.turns[res.turns["decision"] != "error"]
                want = float((ok["finish_s"] - ok["arrival_s"]).mean())
            else:
                want = res.summary[key]
            assert by[(x.label, metric)] == pytest.approx(want * 1e3, abs=1e-3)
    # a closed loop at higher concurrency queues more: TTFT grows with the clients
    ttft = [by[(x.label, "ttft_mean_ms")] for x in case.runs]
    assert ttft == sorted(ttft) and ttft[-1] > ttft[0]
    # the case's handoff stage (Dynamo + TensorRT-LLM's serialised KV receive) is in every TTFT: without it each one
    # is lower by at least the stage's 1.39 s at one client
    ho = sc.deployment.handoff
    assert ho is not None and ho.serialised
    bare = {**(case.scenario or {}), "deployment": {**(case.scenario or {})["deployment"], "handoff": None}}
    one = run(run_scenario(case.model_copy(update={"scenario": bare}), case.runs[0])).summary["ttft_mean_s"] * 1e3
    assert by[(case.runs[0].label, "ttft_mean_ms")] - one > 1000 * 2048 * 262_144 / ho.bandwidth_bytes_per_s - 1


def test_open_loop_run_keeps_rate_and_burstiness() -> None:
    case = load_case("llmd-1p1d-a100-llama-3.1-8b")
    case = case.model_copy(update={"scenario": {**(case.scenario or {}), "model": "qwen3-32b", "hardware": "p5en",
                                                "deployment": {"tensor_parallel_size": 8}}})
    sc = run_scenario(case, case.runs[0])
    assert sc.workload.arrival.kind == "poisson" and sc.workload.arrival.rate_per_s == 1.8
    assert sc.workload.arrival.burstiness == 50
    r = validate_case(case)
    assert r["status"] == "predicted, not fitted" and r["summary"]["predicted"] == 12  # 8 + 4 ITL points


def test_validate_is_deterministic() -> None:
    assert validate(["p5en-published", "dynamo-qwen3-32b-1p1d"]) == validate(["p5en-published", "dynamo-qwen3-32b-1p1d"])


# --- the shipped values are the sources' values --------------------------------------------------------------


def check_copies(shared: Path) -> None:
    """Every shipped measured value equals the one in ../shared/external_traces (the copies are faithful)."""
    ext = shared / "external_traces"
    dyn = ext / "dynamo_profiler_qwen3_32b"
    with open(dyn / "prefill_ttft_vs_isl.online_all.csv", encoding="utf-8") as fh:
        rows = [(int(r["prefill_isl"]), float(r["prefill_ttft_ms"])) for r in csv.DictReader(fh)]
    assert [(int(a), b) for a, b in load_case("dynamo-qwen3-32b-prefill").points] == rows
    with open(dyn / "decode_itl.online_all.csv", encoding="utf-8") as fh:
        dec = [(float(r["context_length"]), float(r["itl_ms"]), float(r["thpt_per_gpu_tok_s"])) for r in csv.DictReader(fh)]
    for (b, ctx, itl), (c2, itl2, thpt) in zip(load_case("dynamo-qwen3-32b-decode").points, dec, strict=True):
        assert (ctx, itl) == (c2, itl2) and b == round(thpt * itl2 / 1000)
    levels = {"concurrency 1": "idle", "concurrency 4": "medium", "concurrency 7": "saturation", "concurrency 8": "overload"}
    for r in load_case("dynamo-qwen3-32b-1p1d").runs:
        with open(dyn / "validation" / f"{levels[r.label]}_profile_export_aiperf.csv", encoding="utf-8") as fh:
            table = {row[0]: row for row in csv.reader(fh) if row}
        assert r.measured["ttft_mean_ms"] == float(table["Time to First Token (ms)"][1])
        assert r.measured["ttft_p50_ms"] == float(table["Time to First Token (ms)"][8])
        assert r.measured["tpot_mean_ms"] == float(table["Inter Token Latency (ms)"][1])
        assert r.measured["latency_mean_ms"] == float(table["Request Latency (ms)"][1])
    llmd = ext / "llmd_pd_benchmark_serving_a100"
    for name, prefix in (("llmd-1p1d-a100-llama-3.1-8b", "llm-d-1p1d"), ("llmd-2p1d-a100-llama-3.1-8b", "llm-d-2p1d")):
        for r in load_case(name).runs:
            stamp = r.label.split()[-1]
            (path,) = llmd.glob(f"{prefix}__benchmark_*_{stamp}.json")
            d = json.loads(path.read_text(encoding="utf-8"))
            assert r.measured == pytest.approx({"ttft_mean_ms": d["mean_ttft_ms"], "ttft_p50_ms": d["median_ttft_ms"],
                                                "tpot_mean_ms": d["mean_tpot_ms"], "tpot_p50_ms": d["median_tpot_ms"],
                                                "itl_p50_ms": d["median_itl_ms"], "itl_p99_ms": d["p99_itl_ms"]},
                                               abs=1e-3)
            assert r.requests == d["num_prompts"] and r.arrival["rate_per_s"] == d["request_rate"]
            assert r.arrival["burstiness"] == d["burstiness"]
            assert r.input_tokens * d["completed"] == d["total_input_tokens"]
    reps = load_case("llmd-vllm-replicas-a100-llama-3.1-8b")
    for r, stamp in zip(reps.runs, ("vllm-2replicas__benchmark_2025-05-11_22-45-40",
                                    "vllm-3replicas__benchmark_2025-05-12_00-03-23"), strict=True):
        d = json.loads((llmd / f"{stamp}.json").read_text(encoding="utf-8"))
        assert r.measured == pytest.approx({"ttft_mean_ms": d["mean_ttft_ms"], "ttft_p50_ms": d["median_ttft_ms"],
                                            "tpot_mean_ms": d["mean_tpot_ms"], "tpot_p50_ms": d["median_tpot_ms"],
                                            "itl_p50_ms": d["median_itl_ms"], "itl_p99_ms": d["p99_itl_ms"]}, abs=1e-3)
        assert r.requests == d["num_prompts"] and r.arrival["rate_per_s"] == d["request_rate"]
        assert r.arrival["burstiness"] == d["burstiness"] and r.input_tokens * d["completed"] == d["total_input_tokens"]


    moon = ext / "mooncake_pd_kv_transfer_tables" / "vllm_mooncake_1p1d_qwen3-8b_h800_tp8.csv"
    with open(moon, encoding="utf-8") as fh:
        want = [(int(r["prompt_len_tokens"]), float(r["mean_ttft_ms"])) for r in csv.DictReader(fh)]
    assert [(r.input_tokens, r.measured["ttft_mean_ms"]) for r in load_case("mooncake-vllm-1p1d-h800-qwen3-8b").runs] == want


def test_shipped_values_match_the_sources(shared_dir: Path) -> None:
    check_copies(shared_dir)


def test_a_run_kvplan_cannot_simulate_is_reported_not_fatal() -> None:
    case = load_case("dynamo-qwen3-32b-1p1d")
    big = case.runs[0].model_copy(update={"label": "too long", "input_tokens": 10_000_000})
    case = case.model_copy(update={"scenario": {**(case.scenario or {}), "hardware": "p5en"},
                                   "runs": [big, case.runs[1]]})
    r = validate_case(case)
    assert any(w.startswith("no prediction for too long: ") for w in r["not_expressible"])
    assert all(p["predicted"] is None for p in r["points"] if p["label"] == "too long")
    assert all(p["predicted"] is not None for p in r["points"] if p["label"] != "too long")


def test_case_with_a_key_given_twice_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import kvplan.calibration.validate as v

    shipped = (v._cases_dir() / "p5en-published.yaml").read_text(encoding="utf-8")
    (tmp_path / "p5en-published.yaml").write_text(shipped + "kind: serving\n", encoding="utf-8")
    monkeypatch.setattr(v, "_cases_dir", lambda: tmp_path)
    with pytest.raises(KvplanInputError, match="kind"):
        load_case("p5en-published")


# --- engine-side prompt lengths (a run's engine_input_tokens) -------------------------------------------------

LLMD = ("llmd-1p1d-a100-llama-3.1-8b", "llmd-2p1d-a100-llama-3.1-8b", "llmd-vllm-replicas-a100-llama-3.1-8b")


def test_llmd_runs_carry_engine_side_prompt_lengths() -> None:
    for name in LLMD:
        case = load_case(name)
        assert any("engine_input_tokens" in m for m in case.modelled), name  # the case says what and why
        for r in case.runs:
            vals = r.engine_input_tokens or []
            assert len(vals) == 100 and r.engine_input_tokens_source, (name, r.label)
            # the re-tokenised text is longer than the nominal length the client reported (which input_tokens keeps)
            assert r.input_tokens in (8000, 10000) and min(vals) > r.input_tokens
            assert 1.03 < sum(vals) / len(vals) / r.input_tokens < 1.06


def test_run_scenario_draws_the_prompt_from_engine_input_tokens() -> None:
    case = load_case("llmd-1p1d-a100-llama-3.1-8b")
    x = case.runs[0]
    sc = run_scenario(case, x)
    assert sc.workload.prefix_tokens.dist == "empirical"
    assert sc.workload.prefix_tokens.values == tuple(float(v) for v in x.engine_input_tokens or [])
    res = run(sc)
    drawn = res.turns["prompt_tokens"]
    assert len(drawn) == x.requests and set(drawn) <= set(x.engine_input_tokens or []) and drawn.nunique() > 20
    assert run(run_scenario(case, x)).turns["prompt_tokens"].tolist() == drawn.tolist()  # seeded
    nominal = run_scenario(case, x.model_copy(update={"engine_input_tokens": None, "engine_input_tokens_source": None}))
    assert nominal.workload.prefix_tokens.dist == "constant" and nominal.workload.prefix_tokens.value == x.input_tokens


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        ("    engine_input_tokens: []\n    engine_input_tokens_source: x\n", "engine_input_tokens"),
        ("    engine_input_tokens: [8300, 0]\n    engine_input_tokens_source: x\n", "engine_input_tokens"),
        ("    engine_input_tokens: [8300, '8400']\n    engine_input_tokens_source: x\n", "engine_input_tokens"),
        ("    engine_input_tokens: [8300, 8400.5]\n    engine_input_tokens_source: x\n", "engine_input_tokens"),
        ("    engine_input_tokens: [8300, 8400]\n", "engine_input_tokens_source"),
        ("    engine_input_tokens_source: derived\n", "engine_input_tokens_source"),
        ("    engine_input_tokens: [8300]\n    engine_input_tokens_source: ' '\n", "engine_input_tokens_source"),
    ],
)
def test_malformed_engine_input_tokens_is_one_line_exit_2(
    edit: str, needle: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import kvplan.calibration.validate as v

    name = "llmd-1p1d-a100-llama-3.1-8b"
    lines = (v._cases_dir() / f"{name}.yaml").read_text(encoding="utf-8").splitlines(keepends=True)
    kept, skip = [], False
    for ln in lines:  # the shipped case without its engine lengths, then the edit under its first run
        if ln.startswith("    engine_input_tokens"):
            skip = True
            continue
        if skip and ln.startswith("      "):
            continue
        skip = False
        kept.append(ln)
    at = next(i for i, ln in enumerate(kept) if ln.startswith("    output_tokens:")) + 1
    (tmp_path / f"{name}.yaml").write_text("".join(kept[:at]) + edit + "".join(kept[at:]), encoding="utf-8")
    monkeypatch.setattr(v, "_cases_dir", lambda: tmp_path)
    assert main(["validate", "--case", name]) == 2
    cap = capsys.readouterr()
    err = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert len(err) == 1 and needle in err[0] and "Traceback" not in cap.err and cap.out == "", err


# --- the sensitivity band --------------------------------------------------------------------------------------


def _by(r: dict) -> dict:
    return {(p["label"], p["metric"]): p for p in r["points"]}


def test_band_is_the_simulation_at_the_priors_stated_error() -> None:
    """The band's sides are simulations of the run with the resolved GPU compute x(1 -/+ e), e the prior's own
    stated worst fit error per component, through the scenario's inline costs (resolved like any other)."""
    from kvplan.calibration.validate_band import band_spec
    from kvplan.models.hardware import gpu_key
    from kvplan.models.profile import load_prior

    case = load_case("llmd-1p1d-a100-llama-3.1-8b")
    r = validate_case(case)
    x = case.runs[0]
    sc = run_scenario(case, x)
    rs = resolve(sc)
    prior = load_prior("llama-3.1-8b", gpu_key(rs.node.gpu), 1)
    assert prior is not None
    spec = band_spec(rs)
    assert spec.error == {"prefill": prior.fit_report["prefill_max_abs_rel_error"],
                          "decode": prior.fit_report["decode_max_abs_rel_error"]}
    assert r["band"]["scaling"]["error"] == spec.error and prior.name in r["band"]["line"]
    low, high = (run(run_scenario(case, x, spec.costs(rs.costs, k))).summary for k in (0, 1))
    p = _by(r)[(x.label, "ttft_mean_ms")]
    # TTFT grows with the GPU compute: the sides bracket the point strictly, and are those runs
    assert p["predicted_low"] == pytest.approx(low["ttft_mean_s"] * 1e3, abs=1e-3)
    assert p["predicted_high"] == pytest.approx(high["ttft_mean_s"] * 1e3, abs=1e-3)
    assert p["predicted_low"] < p["predicted"] < p["predicted_high"]
    # the scaled costs are what the band run resolved: prefill x(1 - e) where no term meets its bound
    lo_sc = run_scenario(case, x, spec.costs(rs.costs, 0))
    assert resolve(lo_sc).costs.prefill.linear_knots_s[-1] == pytest.approx(
        rs.costs.prefill.linear_knots_s[-1] * (1 - spec.error["prefill"]), rel=1e-12)
    assert lo_sc.seed == sc.seed  # same seed: common random numbers
    assert validate_case(case)["points"] == r["points"]  # deterministic


def knife_edge_case() -> Any:
    """The llm-d 1P1D runs read as the P/D deployment their yamls describe (one P, one D, KV over TCP), which is not
    what they ran (the case file: the gateway image did no P/D): kvplan's A100 prior puts that P at utilisation ~1.05,
    where TTFT depends sharply on the prefill cost, a knife edge for the band to find."""
    case = load_case("llmd-1p1d-a100-llama-3.1-8b")
    pd = {"model": "llama-3.1-8b", "hardware": "p4de", "policy": {"bidirectional": False},
          "deployment": {"tensor_parallel_size": 1, "prefill_nodes": 1, "decode_nodes": 1, "kv_transport": "tcp",
                         "kv_post_overlaps_forward": False}}
    return case.model_copy(update={"scenario": pd})


def test_knife_edge_1p1d_is_wider_than_a_stable_case() -> None:
    """A P/D reading of the 1P1D runs puts P at utilisation ~1.05: its TTFT band is far wider (relative) than the
    plain replicas', and flagged; the replicas' TTFT moves about as much as the prefill kernels are scaled."""
    edge = _by(validate_case(knife_edge_case()))
    stable = _by(validate_case(load_case("llmd-vllm-replicas-a100-llama-3.1-8b")))
    e = edge[("run 23-00-27", "ttft_mean_ms")]
    s = stable[("2 replicas, 8000/200 at 1.8 req/s", "ttft_mean_ms")]
    width_e = e["predicted_high"] / e["predicted_low"]
    width_s = s["predicted_high"] / s["predicted_low"]
    assert width_e > 1.4 and width_s < 1.1 and width_e - 1 > 4 * (width_s - 1)
    assert e["knife_edge"] is True and s["knife_edge"] is False and e["in_band"] is False
    band = validate_case(knife_edge_case())["band"]
    assert "run 23-00-27 ttft_mean_ms" in band["knife_edges"] and "KNIFE EDGE" in band["line"]
    assert validate_case(load_case("llmd-1p1d-a100-llama-3.1-8b"))["band"]["knife_edges"] == []  # as it ran


def test_curve_band_is_the_cost_function_at_the_scaled_costs() -> None:
    from kvplan.calibration.validate_band import band_spec

    r = validate_case(load_case("dynamo-qwen3-32b-prefill"))
    sc = scenario_from_dict(dict(load_case("dynamo-qwen3-32b-prefill").scenario or {}))
    rs = resolve(sc)
    spec = band_spec(rs)
    chunk = sc.deployment.max_num_batched_tokens
    for p, (isl, _ms) in zip(r["points"], load_case("dynamo-qwen3-32b-prefill").points, strict=True):
        lo, hi = (prefill_time_s(spec.costs(rs.costs, k).prefill, int(isl), 0, chunk) * 1e3 for k in (0, 1))
        assert (p["predicted_low"], p["predicted_high"]) == (pytest.approx(lo, abs=1e-4), pytest.approx(hi, abs=1e-4))
        assert p["knife_edge"] is False  # a cost function is linear in the GPU terms: no amplification
    d = validate_case(load_case("dynamo-qwen3-32b-decode"))
    assert all(p["predicted_low"] < p["predicted"] < p["predicted_high"] for p in d["points"])


def test_band_error_option_widens_the_band_and_bad_values_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    name = "llmd-1p1d-a100-llama-3.1-8b"
    assert main(["validate", "--json", "--case", name, "--band-error", "0.05"]) == 0
    wide = json.loads(capsys.readouterr().out)["cases"][0]
    assert wide["band"]["scaling"]["error"] == {"prefill": 0.05, "decode": 0.05}
    assert "--band-error" in wide["band"]["line"]
    p = _by(wide)[("run 23-00-27", "ttft_mean_ms")]
    default = _by(validate_case(load_case(name)))[("run 23-00-27", "ttft_mean_ms")]
    assert p["predicted_low"] < default["predicted_low"] and p["predicted_high"] > default["predicted_high"]
    assert p["predicted_high"] / p["predicted_low"] > default["predicted_high"] / default["predicted_low"]
    for bad in ("0", "1.5", "nan"):
        assert main(["validate", "--case", name, "--band-error", bad]) == 2
        cap = capsys.readouterr()
        err = [ln for ln in cap.err.splitlines() if ln.strip()]
        assert len(err) == 1 and err[0].startswith("error: --band-error") and "Traceback" not in cap.err


def test_text_output_has_the_band_column_and_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--case", "llmd-1p1d-a100-llama-3.1-8b"]) == 0
    out = capsys.readouterr().out
    assert "band" in out.splitlines()[2] and "KNIFE EDGE" in out and "  band: measured inside the band at" in out


def test_scaled_decode_holds_terms_at_their_physical_bound() -> None:
    from kvplan.models.arch import get_model
    from kvplan.models.bounds import bound_violations, physical_bounds
    from kvplan.models.hardware import get_hardware
    from kvplan.models.resolve import scaled_decode

    arch, node = get_model("llama-3.1-8b"), get_hardware("p4de")
    rs = resolve(scenario_from_dict({"model": "llama-3.1-8b", "hardware": "p4de",
                                     "deployment": {"tensor_parallel_size": 1}}))
    b = {x.param: x.lower for x in physical_bounds(arch, node, 1)}
    assert rs.costs.decode.per_seq_s == pytest.approx(b["decode.per_seq_s"])  # the A100 prior sits at this bound
    low = scaled_decode(rs.costs.decode, 0.5, arch, node, 1)
    assert low.per_seq_s == pytest.approx(b["decode.per_seq_s"])  # held
    assert low.batch_knots_s[-1] == pytest.approx(max(rs.costs.decode.batch_knots_s[-1] * 0.5, b["decode.batch_s(1)"]))
    assert not bound_violations(rs.costs.model_copy(update={"decode": low}), arch, node, 1)
    high = scaled_decode(rs.costs.decode, 1.1, arch, node, 1)
    assert high.batch_knots_s == pytest.approx(tuple(v * 1.1 for v in rs.costs.decode.batch_knots_s))


def test_compute_without_a_stated_error_uses_the_named_assumption() -> None:
    from kvplan.calibration.validate_band import ASSUMED_GPU_REL_ERROR, band_spec

    # A100 40 GB has no kernel prior: the roofline fallback states no error
    rs = resolve(scenario_from_dict({"model": "llama-3.1-8b", "hardware": "p4d", "deployment": {"tensor_parallel_size": 1}}))
    assert rs.profile.component_status["prefill.gpu"].startswith("assumed")
    spec = band_spec(rs)
    assert spec.error == {"prefill": ASSUMED_GPU_REL_ERROR, "decode": ASSUMED_GPU_REL_ERROR}
    assert all("ASSUMED_GPU_REL_ERROR" in v for v in spec.source.values())


def test_published_and_unresolvable_cases_have_no_band() -> None:
    assert validate(["p5en-published"])[0]["band"]["scaling"] is None
    r = validate_case(load_case("dynamo-qwen3-32b-prefill").model_copy(update={"scenario": {
        "model": "qwen3-32b", "hardware": "no-such-gpu", "deployment": {"tensor_parallel_size": 1}}}))
    assert r["band"]["scaling"] is None and all(p["predicted_low"] is None for p in r["points"])


def test_heterogeneous_tp_run_has_no_band_and_says_why() -> None:
    case = load_case("dynamo-qwen3-32b-1p1d")
    sc = dict(case.scenario or {})
    sc["deployment"] = {**sc["deployment"], "prefill_tensor_parallel_size": 2}
    r = validate_case(case.model_copy(update={"scenario": sc, "runs": case.runs[:1]}))
    assert r["summary"]["predicted"] == len(case.runs[0].measured)  # the point is predicted
    assert all(p["predicted_low"] is None for p in r["points"])
    assert r["band"]["line"].startswith("no band") and "different TP" in r["band"]["line"]


def test_seed_spread_is_the_run_under_other_seeds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A serving run's seed spread is the lowest and highest of its simulations under seeds 0-3 (what a finite run's
    random parts, here uniform random routing and sampled prompt lengths, move); a run whose random parts are none
    (closed loop, fixed lengths) says every seed gives the same. Repeated runs of one setup are simulated once."""
    import kvplan.sim.api as api

    calls: list[int] = []
    real = api.run

    def counting(sc: Any, seed: int | None = None, **kw: Any) -> Any:
        calls.append(-1 if seed is None else seed)
        return real(sc, seed, **kw)

    monkeypatch.setattr(api, "run", counting)
    case = load_case("llmd-1p1d-a100-llama-3.1-8b")
    r = validate_case(case)
    assert len(case.runs) == 2 and case.runs[0].model_dump(exclude={"label", "measured"}) == case.runs[1].model_dump(
        exclude={"label", "measured"})
    assert sorted(calls) == [0, 0, 0, 1, 2, 3]  # one setup: nominal + 2 band sides (seed 0) + seeds 1-3, once
    by = _by(r)
    x = case.runs[0]
    draws = [real(run_scenario(case, x, seed=k), k).summary["tpot_mean_s"] * 1e3 for k in (0, 1, 2, 3)]
    p = by[(x.label, "tpot_mean_ms")]
    assert p["seed_low"] == pytest.approx(min(draws), abs=1e-3) and p["seed_high"] == pytest.approx(max(draws), abs=1e-3)
    assert p["seed_high"] > p["seed_low"]  # random routing moves it
    assert by[(case.runs[1].label, "tpot_mean_ms")]["seed_low"] == p["seed_low"]  # the repeated run: the same draws
    assert r["seed_spread"]["deterministic"] is False and "one draw" in r["seed_spread"]["line"]
    assert run_scenario(case, x, seed=2).seed == 2
    fixed = validate_case(load_case("mooncake-vllm-1p1d-h800-qwen3-8b"))
    assert fixed["seed_spread"]["deterministic"] is True and "same prediction" in fixed["seed_spread"]["line"]
    assert all(p["seed_low"] == p["seed_high"] == p["predicted"] for p in fixed["points"])


def test_seed_fields_need_every_draw() -> None:
    from kvplan.calibration.validate import seed_fields

    assert seed_fields(5.0, [4.0, 6.0, 5.5, 4.5]) == {"seed_low": 4.0, "seed_high": 6.0, "in_seed_spread": True}
    assert seed_fields(7.0, [4.0, 6.0, 5.5, 4.5])["in_seed_spread"] is False
    assert seed_fields(5.0, [4.0, None, 5.5, 4.5]) == {"seed_low": None, "seed_high": None, "in_seed_spread": None}


def test_text_output_has_the_seed_column_only_where_seeds_differ(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--case", "llmd-2p1d-a100-llama-3.1-8b", "--case", "mooncake-vllm-1p1d-h800-qwen3-8b"]) == 0
    out = capsys.readouterr().out
    llmd, mooncake = out.split("mooncake-vllm-1p1d-h800-qwen3-8b:")

    def header(text: str) -> str:
        return next(line for line in text.splitlines() if "point" in line and "measured" in line)

    assert "seeds 0-3" in header(llmd) and "seed spread: measured within" in llmd
    assert "band" in header(mooncake) and "seeds 0-3" not in header(mooncake)
    assert "every seed gives the same prediction" in mooncake


def test_a_case_given_twice_runs_once(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--case", "dynamo-qwen3-32b-decode", "--case", "p5en-published", "--case", "dynamo-qwen3-32b-decode"]
    assert main(["validate", "--json", *args]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [c["name"] for c in out["cases"]] == ["dynamo-qwen3-32b-decode", "p5en-published"]
    assert main(["validate", "--markdown", *args]) == 0
    rows = capsys.readouterr().out.strip().splitlines()[2:]
    assert [r.split("`")[1] for r in rows] == ["dynamo-qwen3-32b-decode", "p5en-published"]


def test_json_and_markdown_together_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--json", "--markdown", "--case", "dynamo-qwen3-32b-decode"]) == 2
    cap = capsys.readouterr()
    err = [ln for ln in cap.err.splitlines() if ln.strip()]
    assert len(err) == 1 and err[0].startswith("error: --json --markdown") and cap.out == "", cap
