"""Calibration through the simulator (``kvplan calibrate --bench F --scenario S.yaml``, issue 19 item 3): the llm-d
2P1D acceptance, the self-check and the ``unreliable`` status, its refusal by ``simulate``, and the old direct
``--bench`` path no longer writing ``calibrated``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import need_shared

from kvplan.app.cli import main
from kvplan.calibration.parsers import parse_bench_serve
from kvplan.calibration.sim_fit import MAX_PRIOR_FACTOR, SELF_CHECK_TOLERANCE, bench_run, simulated_stats
from kvplan.models.profile import load_profile
from kvplan.sim.scenario import load_scenario

DATA = Path(__file__).resolve().parent / "data"
BENCH = DATA / "llm-d-2p1d__benchmark_2025-05-11_23-39-15.json"
SCEN_2P1D = DATA / "llmd-2p1d-a100.scenario.yaml"
SCEN_1P1D = DATA / "llmd-1p1d-a100.scenario.yaml"
MEASURED_TTFT_MS = 1666.374  # the file's mean_ttft_ms
MEASURED_TPOT_MS = 77.427  # the file's mean_tpot_ms
SHARED = Path(os.environ.get("KVPLAN_SHARED") or Path(__file__).resolve().parents[2] / "shared")


def _fit(tmp_path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, dict[str, object], Path, str]:
    out = tmp_path / "fit.json"
    rc = main(["calibrate", "--bench", str(BENCH), "--scenario", str(SCEN_2P1D), "--out", str(out), "--json", *extra])
    cap = capsys.readouterr()
    return rc, (json.loads(cap.out) if rc == 0 else {}), out, cap.err


def _simulated(profile: Path, bench: Path = BENCH, scenario: Path = SCEN_2P1D) -> dict[str, float]:
    sc = load_scenario(scenario).model_copy(update={"profile": str(profile)})
    return simulated_stats(sc, bench_run(parse_bench_serve(bench)), None)


def _measured(src: Path, stats: dict[str, float], out: Path, drop: tuple[str, ...] = ()) -> Path:
    """``src`` (a bench file) with its TTFT/TPOT mean and median replaced by ``stats`` (s; a simulated run's), the
    per-request arrays in ``drop`` removed (they would disagree with those summaries), written to ``out``."""
    raw = json.loads(src.read_text())
    for k in drop:
        raw.pop(k, None)
    raw.update({"mean_ttft_ms": stats["ttft_mean_s"] * 1e3, "median_ttft_ms": stats["ttft_p50_s"] * 1e3,
                "mean_tpot_ms": stats["tpot_mean_s"] * 1e3, "median_tpot_ms": stats["tpot_p50_s"] * 1e3})
    out.write_text(json.dumps(raw))
    return out


def test_llmd_2p1d_fit_reproduces_the_measured_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, report, out, _err = _fit(tmp_path, capsys)
    assert rc == 0
    prof = load_profile(out)
    assert prof.status == "calibrated" and report["status"] == "calibrated" and not report["unreliable_reasons"]
    assert prof.model == "llama-3.1-8b" and prof.hardware == "p4de" and prof.tensor_parallel_size == 1
    # the acceptance: the fitted profile simulated on that run (through the profile file, as simulate would)
    sim = _simulated(out)
    assert sim["ttft_mean_s"] * 1e3 == pytest.approx(MEASURED_TTFT_MS, rel=0.20)
    assert sim["tpot_mean_s"] * 1e3 == pytest.approx(MEASURED_TPOT_MS, rel=0.25)
    # the self-check reports both numbers per metric, and they are what a simulation of the profile gives
    check = {c["metric"]: c for c in report["self_check"]}  # type: ignore[attr-defined]
    assert check["ttft_mean_ms"]["measured_ms"] == pytest.approx(MEASURED_TTFT_MS, rel=1e-6)
    assert check["ttft_mean_ms"]["simulated_ms"] == pytest.approx(sim["ttft_mean_s"] * 1e3, rel=1e-9)
    assert check["tpot_mean_ms"]["simulated_ms"] == pytest.approx(sim["tpot_mean_s"] * 1e3, rel=1e-9)
    assert all(abs(check[m]["rel_error"]) <= SELF_CHECK_TOLERANCE for m in ("ttft_mean_ms", "tpot_mean_ms"))
    # ... on the seed the report names (the scenario's: what _simulated used)
    assert report["fitted_seeds"] == [load_scenario(SCEN_2P1D).seed]
    # what was fitted, within the bounds, and what was held and named
    params = {p["name"]: p for p in report["params"]}  # type: ignore[attr-defined]
    assert params["prefill.gpu_scale"]["status"] == params["decode.gpu_scale"]["status"] == "fitted"
    for p in params.values():
        assert p["lower"] <= p["value"] <= MAX_PRIOR_FACTOR
    # a 42 ms proxy leg in a 1.7 s TTFT of one request shape: not identifiable, held and said so
    assert params["overhead.p_leg_scale"]["status"] == "held" and "not identifiable" in params["overhead.p_leg_scale"][
        "why"]
    assert any(h.startswith("decode.overhead_s: held") for h in report["held"])  # type: ignore[attr-defined]
    assert "calibrated by simulation" in prof.component_status["prefill.gpu"]
    # deterministic: the same fit writes the same bytes
    first = out.read_bytes()
    assert main(["calibrate", "--bench", str(BENCH), "--scenario", str(SCEN_2P1D), "--out", str(out)]) == 0
    assert out.read_bytes() == first


def test_scenario_must_match_the_flags(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _r, out, err = _fit(tmp_path, capsys, "--model", "qwen3-32b")
    assert rc == 2 and "--model" in err and not out.exists()
    args = ["calibrate", "--bench", str(BENCH), "--scenario", str(SCEN_2P1D), "--scenario", str(SCEN_2P1D),
            "--out", str(tmp_path / "x.json")]
    assert main(args) == 2 and "2 scenarios for 1 file" in capsys.readouterr().err


def test_unreachable_fit_is_unreliable_and_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = json.loads(BENCH.read_text())
    # 20 requests far apart (no queueing): a 40 s TTFT for 10k tokens needs a prefill ~40x the A100 kernel prior
    raw.update({"request_rate": 0.05, "num_prompts": 20, "completed": 20, "total_input_tokens": 200000,
                "total_output_tokens": 2000, "mean_ttft_ms": 40000.0, "median_ttft_ms": 40000.0})
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(raw))
    out = tmp_path / "bad_profile.json"
    assert main(["calibrate", "--bench", str(bad), "--scenario", str(SCEN_2P1D), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "WARNING" in err and "unreliable" in err and f"beyond {MAX_PRIOR_FACTOR:.0f}x" in err
    prof = load_profile(out)
    assert prof.status == "unreliable" and prof.fit_report["unreliable_reasons"]
    sc = tmp_path / "s.yaml"
    sc.write_text(SCEN_2P1D.read_text() + f"profile: {out}\nworkload: {{conversations: 5, turns: {{dist: constant, "
                  "value: 1}, output_tokens: {dist: constant, value: 4}}\n")
    assert main(["simulate", str(sc), "--out", str(tmp_path / "run")]) == 2
    msg = capsys.readouterr().err
    assert "unreliable" in msg and "--allow-unreliable-profile" in msg and len(msg.strip().splitlines()) == 1
    assert not (tmp_path / "run" / "summary.json").exists()
    assert main(["simulate", str(sc), "--out", str(tmp_path / "run"), "--allow-unreliable-profile", "--json"]) == 0
    assert main(["cost", "--profile", str(out), "--tokens", "100"]) == 2
    capsys.readouterr()
    # review2: the refusal says "pass --allow-unreliable-profile": compare and capacity take it as simulate does
    cap = ["capacity", str(sc), "--slo-ttft-p90-ms", "60000", "--max-nodes", "2", "--no-max-rate", "--replications", "1",
           "--ttl-grid", "60", "--usd-per-node-hour", "30", "--json"]
    for args in (["compare", str(sc), "--policies", "off", "--replications", "1", "--json"], cap):
        assert main(args) == 2
        msg = capsys.readouterr().err
        assert "unreliable" in msg and len(msg.strip().splitlines()) == 1
        assert main([*args, "--allow-unreliable-profile"]) == 0, args[0]
        capsys.readouterr()
    # recommend names the flag in its refusal too, and takes it
    assert main(["recommend", str(sc), "--no-policies", "--replications", "1", "--ttl-grid", "60", "--json"]) == 2
    msg = capsys.readouterr().err
    assert "unreliable" in msg and "--allow-unreliable-profile" in msg and len(msg.strip().splitlines()) == 1


def test_conflicting_statistics_fail_the_self_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    raw = json.loads(BENCH.read_text())
    raw["mean_tpot_ms"] = raw["median_tpot_ms"] = 2000.0  # a decode this slow fills D's pool: TTFT explodes first
    bad = tmp_path / "slow_decode.json"
    bad.write_text(json.dumps(raw))
    out = tmp_path / "p.json"
    assert main(["calibrate", "--bench", str(bad), "--scenario", str(SCEN_2P1D), "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["status"] == "unreliable" and load_profile(out).status == "unreliable"
    assert any("tpot_mean_ms: simulated" in r and "measured 2000 ms" in r for r in report["unreliable_reasons"])


def test_direct_bench_fit_is_not_calibrated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "old.json"
    assert main(["calibrate", "--bench", str(BENCH), "--model", "llama-3.1-8b", "--hardware", "p4de", "--tp", "1",
                 "--out", str(out)]) == 0
    assert "WARNING" in capsys.readouterr().err
    prof = load_profile(out)
    assert prof.status == "unreliable" and "--scenario" in prof.fit_report["unreliable_reasons"][0]


@pytest.mark.shared_data
def test_a_fit_matching_only_its_own_seed_is_unreliable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ans12: the llm-d 1P1D run 23-05-25 (8k in / 200 out at 1.8 req/s, near P's capacity) was written
    'calibrated' with a self-check of -2.2% on TTFT: on the one seed it was fitted on. The written profile simulated
    on the same run with seeds 1..4 gave TTFT means of 1,664 / 1,383 / 1,047 / 1,243 ms against 1,022 measured
    (+63% / +35% / +2% / +22%). The self-check now also simulates held-out seeds and gates on their mean.
    Since the optimiser's Jacobian steps 0.05 in log scale at every x (aud15), that run's fit (prefill x0.985) holds on
    its held-out seeds too (-4.3%); its sister run 23-00-27 (same setup) is the one fitted to its own seed's queueing:
    -1.2% there, +38.8% over the held-out seeds."""
    from kvplan.calibration.sim_fit import HELD_OUT_SEEDS
    from kvplan.sim.seeds import replication_seeds

    bench = need_shared("external_traces/llmd_pd_benchmark_serving_a100") / "llm-d-1p1d__benchmark_2025-05-11_23-00-27.json"
    out = tmp_path / "p.json"
    assert main(["calibrate", "--bench", str(bench), "--scenario", str(SCEN_1P1D), "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    fitted = {c["metric"]: c for c in report["self_check"]}
    assert fitted["ttft_mean_ms"]["within"]  # on its own seed the fit looks fine
    held = {c["metric"]: c for c in report["held_out_check"]}
    ttft = held["ttft_mean_ms"]
    assert ttft["seeds"] == replication_seeds(0, HELD_OUT_SEEDS) and not ttft["within"] and ttft["gated"]
    # what the held-out rows report is what simulating the written profile with those seeds gives
    sc = load_scenario(SCEN_1P1D).model_copy(update={"profile": str(out)})
    from kvplan.sim.scenario import with_overrides

    sc = with_overrides(sc, {"simulation.allow_unreliable_profile": True})
    run = bench_run(parse_bench_serve(bench))
    per_seed = [simulated_stats(sc.model_copy(update={"seed": s}), run, None)["ttft_mean_s"] * 1e3 for s in ttft["seeds"]]
    assert ttft["simulated_ms_per_seed"] == pytest.approx(per_seed, rel=1e-9)
    assert abs(sum(per_seed) / len(per_seed) / ttft["measured_ms"] - 1) > SELF_CHECK_TOLERANCE
    prof = load_profile(out)
    assert prof.status == "unreliable" and report["status"] == "unreliable"
    assert any("held-out seeds" in r for r in report["unreliable_reasons"])


@pytest.mark.shared_data
def test_four_llmd_files_fit_or_say_why(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = need_shared("external_traces/llmd_pd_benchmark_serving_a100")
    files = sorted(d.glob("llm-d-*p1d__*.json"))
    assert len(files) == 4
    args = ["calibrate"]
    for f in files:
        args += ["--bench", str(f)]
    for f in files:
        args += ["--scenario", str(SCEN_1P1D if "1p1d" in f.name else SCEN_2P1D)]
    out = tmp_path / "four.json"
    assert main([*args, "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    prof = load_profile(out)
    two = [f for f in files if f.name == BENCH.name][0]
    sim = _simulated(out, two) if prof.status != "unreliable" else {}
    within = bool(sim) and abs(sim["ttft_mean_s"] * 1e3 / MEASURED_TTFT_MS - 1) <= 0.20 and abs(
        sim["tpot_mean_s"] * 1e3 / MEASURED_TPOT_MS - 1) <= 0.25
    assert within or (prof.status == "unreliable" and report["unreliable_reasons"])
    for r in report["unreliable_reasons"]:
        assert "simulated" in r or "beyond" in r  # each reason names the metric and both numbers, or the parameter


def test_fit_recovers_known_scales(tmp_path: Path) -> None:
    """Measurements made by simulating known scales on the llm-d 2P1D setup: the fit finds those scales again."""
    from kvplan.calibration.sim_fit import apply_values, fit_scenario, run_scenario
    from kvplan.sim.engine import resolve

    sc = load_scenario(SCEN_2P1D)
    run = bench_run(parse_bench_serve(BENCH))
    base = resolve(run_scenario(sc, run, None)).costs
    truth = {"prefill.gpu_scale": 1.15, "decode.gpu_scale": 1.8, "overhead.p_leg_scale": 1.0}
    st = simulated_stats(sc, run, apply_values(base, truth))
    path = _measured(BENCH, st, tmp_path / "truth.json")
    fit = fit_scenario(sc, [bench_run(parse_bench_serve(path))])
    for name, value in truth.items():
        assert fit.values[name] == pytest.approx(value, rel=0.03), name
    assert fit.profile.status == "calibrated"
    assert all(abs(c["rel_error"]) < 0.01 for c in fit.report["self_check"])


def test_multiturn_file_is_replayed_and_fitted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import numpy as np
    import synthetic_traces as st

    mt = tmp_path / "mt.json"
    # an 8B on an A100 at roughly twice the kernel prior's prefill time; decode 25 ms per token
    st.write_multiturn_stats(mt, np.random.default_rng(3), lambda new, cached: 0.03 + 1.2e-4 * new,
                             lambda ctx: 0.025, n_conversations=8, user_turns=3, prefix_tokens=3000, output_tokens=50)
    scen = tmp_path / "s.yaml"
    scen.write_text("model: llama-3.1-8b\nhardware: p4de\ndeployment: {tensor_parallel_size: 1}\n")
    out = tmp_path / "mt_profile.json"
    assert main(["calibrate", "--multiturn", str(mt), "--scenario", str(scen), "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["runs"][0]["workload"]["trace"]["format"] == "multiturn"
    metrics = {c["metric"] for c in report["self_check"]}
    assert {"ttft_mean_ms", "tpot_mean_ms"} <= metrics
    prof = load_profile(out)
    assert prof.status in ("calibrated", "unreliable") and prof.fit_report["self_check"] == report["self_check"]
    # what the self-check reports is what a simulation of the written profile on the trace gives
    from kvplan.calibration.parsers import parse_multiturn_stats
    from kvplan.calibration.sim_fit import multiturn_run
    from kvplan.sim.scenario import with_overrides

    sc = with_overrides(load_scenario(scen), {"profile": str(out), "simulation.allow_unreliable_profile": True})
    sim = simulated_stats(sc, multiturn_run(parse_multiturn_stats(mt)), None)
    check = {c["metric"]: c for c in report["self_check"]}
    assert check["ttft_mean_ms"]["simulated_ms"] == pytest.approx(sim["ttft_mean_s"] * 1e3, rel=1e-9)
    assert check["tpot_mean_ms"]["simulated_ms"] == pytest.approx(sim["tpot_mean_s"] * 1e3, rel=1e-9)


def test_no_shipped_profile_is_fitted_on_a_validation_case() -> None:
    """``kvplan validate`` reports on these cases: nothing shipped (a default of validate) may be fitted to them."""
    from kvplan.calibration.validate import case_names, load_case
    from kvplan.models.profile import shipped_profiles

    case_files = set()
    for name in case_names():
        case = load_case(name)
        if case.in_sample is None and case.kind != "published":
            case_files |= {Path(p.strip()).name for p in case.source.path.split(",")}
    assert BENCH.name.split("__")[-1] in case_files  # the bundled file is one of validate's llm-d runs
    for name in shipped_profiles():
        for src in load_profile(name).provenance.get("sources", []):
            f = Path(str(src.get("file", "") if isinstance(src, dict) else src)).name
            assert f.split("__")[-1] not in case_files, (name, f)


def _hostile(tmp: Path) -> dict[str, tuple[list[str], str]]:
    bad_yaml = tmp / "bad.yaml"
    bad_yaml.write_text("model: [unclosed\n")
    unknown = tmp / "unknown.yaml"
    unknown.write_text("model: gpt-9\nhardware: p4de\n")
    typo = tmp / "typo.yaml"
    typo.write_text("model: llama-3.1-8b\nhardware: p4de\ndeployment: {tensor_paralel_size: 1}\n")
    other = tmp / "qwen.yaml"
    other.write_text("model: qwen3-32b\nhardware: p5en\ndeployment: {tensor_parallel_size: 8}\n")
    inf = json.loads(BENCH.read_text())
    inf["request_rate"] = "inf"
    inf_path = tmp / "inf.json"
    inf_path.write_text(json.dumps(inf))
    nodep = tmp / "nodep.yaml"  # review2: was fitted on the defaults (TP8 1P1D) and written 'calibrated'
    nodep.write_text("model: llama-3.1-8b\nhardware: p4de\npolicy: {bidirectional: false}\n")
    b = ["--bench", str(BENCH)]
    return {
        "no deployment": ([*b, "--scenario", str(nodep)], "has no 'deployment:'"),
        "second scenario without deployment": ([*b, "--bench", str(BENCH), "--scenario", str(SCEN_2P1D),
                                                "--scenario", str(nodep)], "nodep.yaml"),
        "missing scenario": ([*b, "--scenario", str(tmp / "nope.yaml")], "nope.yaml"),
        "malformed yaml": ([*b, "--scenario", str(bad_yaml)], "bad.yaml"),
        "unknown model": ([*b, "--scenario", str(unknown)], "gpt-9"),
        "misspelt field": ([*b, "--scenario", str(typo)], "tensor_paralel_size"),
        "with points": ([*b, "--points", str(BENCH), "--scenario", str(SCEN_2P1D)], "--points"),
        "no file": (["--scenario", str(SCEN_2P1D)], "--bench F or --multiturn F"),
        "file of another model": ([*b, "--scenario", str(other)], "model_id"),
        "all at once": (["--bench", str(inf_path), "--scenario", str(SCEN_2P1D)], "inf"),
        "tp differs": ([*b, "--scenario", str(SCEN_2P1D), "--tp", "8"], "--tp"),
    }


HOSTILE = ("no deployment", "second scenario without deployment",
           "missing scenario", "malformed yaml", "unknown model", "misspelt field", "with points", "no file",
           "file of another model", "all at once", "tp differs")


@pytest.mark.parametrize("case", HOSTILE)
def test_calibrate_scenario_bad_input(case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = _hostile(tmp_path)
    assert set(table) == set(HOSTILE)
    args, needle = table[case]
    out = tmp_path / "p.json"
    assert main(["calibrate", *args, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists()


def test_heterogeneous_tp_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """ans12: `calibrate --bench F --scenario S` with `tensor_parallel_size: 1, decode_tensor_parallel_size: 2` fitted
    decode x3.277 with D simulated on the TP1 cost model (the fit carries one TP's costs inline, for every role), and
    wrote a TP1 profile: `cost --profile P --tp 1` then applied x3.277 to the TP1 prior (39.1 ms a step against 12.0
    ms), and at TP2, where D ran, applied nothing. A fit writes one TP's profile: heterogeneous TP is refused."""
    scen = tmp_path / "het.yaml"
    scen.write_text("model: llama-3.1-8b\nhardware: p4de\ndeployment: {tensor_parallel_size: 1, "
                    "decode_tensor_parallel_size: 2, prefill_nodes: 2, decode_nodes: 1}\npolicy: {bidirectional: false}\n")
    out = tmp_path / "p.json"
    assert main(["calibrate", "--bench", str(BENCH), "--scenario", str(scen), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "decode_tensor_parallel_size 2 differs from tensor_parallel_size 1" in err[0], err
    assert not out.exists()


@pytest.mark.parametrize("decode_scale", [1.0, 0.9])
def test_fit_at_or_below_the_prior_decode_is_calibrated(decode_scale: float, tmp_path: Path) -> None:
    """A run whose decode is the kernel prior's (or 10% faster: its batch knots are >= 17% above their bounds on the
    A100) is fitted and ``calibrated``. The prior holds ``decode.per_seq_s`` (its slope past the last batch knot) at
    the dense-peak bound, which made the decode scale's floor exactly 1: a fit of the prior's own statistics was
    written ``unreliable`` ("decode.gpu_scale = 1 is pinned at its physical floor"), a faster decode unreachable."""
    from kvplan.calibration.sim_fit import fit_scenario, run_scenario
    from kvplan.models.resolve import scaled_decode
    from kvplan.sim.engine import resolve

    sc = load_scenario(SCEN_2P1D)
    run = bench_run(parse_bench_serve(BENCH))
    rs = resolve(run_scenario(sc, run, None))
    base = rs.costs
    truth = base.model_copy(update={"decode": scaled_decode(base.decode, decode_scale, rs.arch, rs.node, 1)})
    st = simulated_stats(sc, run, truth)
    path = _measured(BENCH, st, tmp_path / "measured.json")
    fit = fit_scenario(sc, [bench_run(parse_bench_serve(path))])
    assert fit.profile.status == "calibrated", fit.report["unreliable_reasons"]
    assert fit.values["decode.gpu_scale"] == pytest.approx(decode_scale, rel=0.02)
    row = next(p for p in fit.report["params"] if p["name"] == "decode.gpu_scale")
    assert row["lower"] < 0.9 and not row["at_physical_floor"]
    assert any("decode.per_seq_s" in n for n in fit.report["notes"])
    # the written costs are physically possible and reproduce the run
    from kvplan.models.bounds import bound_violations

    assert bound_violations(fit.profile.costs, rs.arch, rs.node, 1) == []
    again = simulated_stats(sc, run, fit.profile.costs)
    assert again["tpot_mean_s"] == pytest.approx(st["tpot_mean_s"], rel=0.02)



def test_a_fit_on_a_saturated_run_says_so(tmp_path: Path) -> None:
    """A multi-turn run of Llama-3.1-8B on p5 whose D pool saturates (TTL 60 s, 1.5 conversations/s) simulated with
    prefill x1.5 and decode x1.3 was fitted to decode x1.318 with the prefill held (not identifiable: TTFT is D's
    queue) and written 'calibrated' without a word about the saturation. The report now names it (notes and each
    self-check row's 'saturation'); the llm-d 2P1D run, which saturates nothing, gets no such note."""
    from kvplan.calibration.sim_fit import fit_scenario

    raw = json.loads(BENCH.read_text())
    raw.update({"request_rate": 12.0, "burstiness": 1.0})  # 10k-token prompts on two A100 P nodes: P saturates
    path = tmp_path / "busy.json"
    path.write_text(json.dumps(raw))
    sc = load_scenario(SCEN_2P1D)
    busy = fit_scenario(sc, [bench_run(parse_bench_serve(path))])
    notes = [n for n in busy.report["notes"] if "saturates" in n]
    assert notes and "P compute" in notes[0] and "calibrate on a run below saturation" in notes[0], busy.report["notes"]
    assert all("saturation" in c for c in busy.report["self_check"])
    calm = fit_scenario(sc, [bench_run(parse_bench_serve(BENCH))])
    assert not any("saturates" in n for n in calm.report["notes"])


def test_a_bench_run_is_replayed_as_measured_and_its_fit_reproduces_it(tmp_path: Path) -> None:
    """aud14: calibrate --bench simulated a Poisson draw at the file's rate with lengths drawn apart, not the run the
    file measured: near saturation (prefill x1.5, decode x1.3 at 6 req/s) the fit was x1.631 / x1.342 and its TTFT
    +70.9% over held-out seeds, so the profile could not reproduce its own input. A --save-detailed file's requests
    are now replayed at their send times with their lengths (trace format 'bench'): on a run whose P saturates the
    fit finds the scales that made it, and simulating the written profile on that trace gives the measured TTFT."""
    import numpy as np
    import synthetic_traces as st

    from kvplan.calibration.sim_fit import apply_values, fit_scenario, run_scenario
    from kvplan.sim.engine import resolve

    path = tmp_path / "bench.json"
    st.write_bench_serve(path, np.random.default_rng(5), lambda n: 0.05 + 1e-4 * n, lambda c: 0.02, n=300,
                         request_rate_req_s=5.0, model_id="meta-llama/Llama-3.1-8B-Instruct",
                         input_len_range=(2000, 8000), output_len_range=(50, 200), fail_every=50)
    sc = load_scenario(SCEN_2P1D)
    run = bench_run(parse_bench_serve(path))
    assert run.workload == {"trace": {"path": str(path), "format": "bench"}}
    assert any("replayed as measured (its 294 successful requests" in n for n in run.notes), run.notes
    truth = {"prefill.gpu_scale": 1.5, "decode.gpu_scale": 1.3, "overhead.p_leg_scale": 1.0}
    stats = simulated_stats(sc, run, apply_values(resolve(run_scenario(sc, run, None)).costs, truth))
    _measured(path, stats, path, drop=("ttfts", "itls", "latencies"))  # the synthetic arrays are not the run's
    assert stats["ttft_mean_s"] > 5.0  # P saturates: TTFT is mostly its queue, which depends on the exact arrivals
    fit = fit_scenario(sc, [bench_run(parse_bench_serve(path))])
    for name, value in truth.items():
        assert fit.values[name] == pytest.approx(value, rel=0.02), name
    assert fit.profile.status == "calibrated", fit.report["unreliable_reasons"]
    assert all(c["within"] for c in fit.report["self_check"] + fit.report["held_out_check"])
    # verifiable from the CLI: the written profile simulated on the scenario, the file replayed as a trace, gives the
    # measured TTFT
    from kvplan.models.profile import save_profile

    profile = tmp_path / "p.json"
    save_profile(fit.profile, profile)
    scen = tmp_path / "s.yaml"
    scen.write_text(SCEN_2P1D.read_text() + f"profile: {profile}\n")
    assert main(["simulate", str(scen), "--trace", str(path), "--out", str(tmp_path / "sim")]) == 0
    summary = json.loads((tmp_path / "sim" / "summary.json").read_text())
    assert summary["ttft_mean_s"] == pytest.approx(stats["ttft_mean_s"], rel=0.01)
    assert summary["turns"] == 294


def test_a_long_bench_run_replays_its_first_requests(tmp_path: Path) -> None:
    """More than MAX_FIT_REQUESTS requests: the fit replays the first ones, a time window of the trace's clock."""
    import numpy as np
    import synthetic_traces as st

    from kvplan.calibration.sim_fit import MAX_FIT_REQUESTS
    from kvplan.sim.scenario import Workload
    from kvplan.sim.workload import make_plan

    path = tmp_path / "long.json"
    st.write_bench_serve(path, np.random.default_rng(2), lambda n: 0.05, lambda c: 0.02, n=MAX_FIT_REQUESTS + 100,
                         model_id="meta-llama/Llama-3.1-8B-Instruct", output_len_range=(2, 4))
    run = bench_run(parse_bench_serve(path))
    start, end = run.workload["trace"]["window_s"]
    assert start == 0.0 and end > 0
    plan = make_plan(Workload.model_validate(run.workload), 0, 10**6)
    assert len(plan.prompt_tokens) == MAX_FIT_REQUESTS
    assert any(f"its first {MAX_FIT_REQUESTS} of {MAX_FIT_REQUESTS + 100} successful requests" in n for n in run.notes)
