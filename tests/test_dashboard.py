"""Dashboard pages with Streamlit's ``AppTest`` (every page); the pure helpers are in test_dashboard_helpers.py.

Widget changes are checked against the model itself: the metric a page shows after a change must be
what ``kvplan.sim.api.run`` says for the same scenario (TTL 1 s with the benchmark's ~16 s turn gaps
means no follow-up turn finds its KV; a threshold above every pull means every pull becomes a recompute).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from kvplan.app import dash_state as ds
from kvplan.app import dash_upload as du
from kvplan.app.cmd_dashboard import DASHBOARD_SCRIPT
from kvplan.sim.api import run
from kvplan.sim.defaults import published_benchmark
from kvplan.sim.scenario import with_overrides
from kvplan.units import human_s

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "traces"
PROFILE = ROOT / "models" / "profiles" / "p5en-qwen3-32b.json"
TIMEOUT_S = 60


def _app() -> AppTest:
    at = AppTest.from_file(str(DASHBOARD_SCRIPT), default_timeout=TIMEOUT_S)
    at.run()
    assert not at.exception, at.exception
    return at


def _metrics(at: AppTest) -> dict[str, Any]:
    return {m.label: m for m in at.metric}


def _model(**overrides: Any) -> dict[str, Any]:
    sc = published_benchmark()
    if overrides:
        sc = with_overrides(sc, overrides)
    return run(sc).summary


def _page(at: AppTest, file: str) -> AppTest:
    at.switch_page(f"pages/{file}").run()
    assert not at.exception, at.exception
    return at


def _plotly_count(at: AppTest) -> int:
    return len(at.get("plotly_chart"))


# --- What-if ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def whatif_base() -> dict[str, Any]:
    return _model()


def test_whatif_default_matches_model(whatif_base: dict[str, Any]) -> None:
    at = _app()
    m = _metrics(at)
    assert m["Hit rate"].value == f"{whatif_base['hit_rate']:.1%}" == "100.0%"
    assert m["TTFT mean"].value == human_s(whatif_base['ttft_mean_s'])
    assert m["Errors"].value == "0"
    # the default scenario is the vLLM defaults: no deltas
    assert all(not x.delta for x in at.metric)
    assert _plotly_count(at) == 4
    assert not at.error


def test_whatif_ttl_one_second_drops_hit_rate(whatif_base: dict[str, Any]) -> None:
    at = _app()
    at.number_input(key="sc_ttl").set_value(1.0).run()
    assert not at.exception
    expected = _model(**{"policy.decoder_kv_blocks_ttl_s": 1.0})
    m = _metrics(at)
    # the benchmark's turns come ~16 s apart: with a 1 s TTL every retained block expires first
    assert expected["hit_rate"] == 0.0
    assert m["Hit rate"].value == "0.0%"
    assert m["Hit rate"].delta == "-100.0 pp"
    assert m["Errors"].value == str(expected["errors"])
    assert m["Pinned decode KV mean"].value == f"{expected['pinned_kv_gib_mean']:,.1f} GiB"
    assert expected["pinned_kv_gib_mean"] < whatif_base["pinned_kv_gib_mean"]
    assert m["Pinned decode KV mean"].delta.startswith("-")


def test_whatif_ttl_between_gaps_is_partial() -> None:
    # a TTL inside the spread of the benchmark's turn gaps (the first one the model calls partial)
    ttl, expected = next((t, m) for t in (5.0, 8.0, 10.0, 12.0, 15.0, 20.0)
                         if 0.0 < (m := _model(**{"policy.decoder_kv_blocks_ttl_s": t}))["hit_rate"] < 1.0)
    at = _app()
    at.number_input(key="sc_ttl").set_value(ttl).run()
    m = _metrics(at)
    assert m["Hit rate"].value == f"{expected['hit_rate']:.1%}"
    assert m["Errors"].value == str(expected["errors"])


def test_whatif_threshold_above_pulls_recomputes(whatif_base: dict[str, Any]) -> None:
    at = _app()
    at.number_input(key="sc_threshold").set_value(100_000).run()
    assert not at.exception
    expected = _model(**{"policy.kv_recompute_threshold_tokens": 100_000})
    m = _metrics(at)
    assert expected["decisions"]["pull"] == 0 and expected["decisions"]["recompute_below_threshold"] == 40
    # recomputing ~24k tokens costs more than pulling them: TTFT goes up
    assert expected["ttft_mean_s"] > whatif_base["ttft_mean_s"]
    assert m["TTFT mean"].value == human_s(expected['ttft_mean_s'])
    assert m["TTFT mean"].delta.startswith("+")
    # and no pinned KV is read any more, but it is still released by the notification
    assert m["Hit rate"].value == f"{expected['hit_rate']:.1%}"


def test_whatif_bidirectional_off_and_custom_gap() -> None:
    at = _app()
    at.toggle(key="sc_bidir").set_value(False).run()
    off = _model(**{"policy.bidirectional": False})
    assert _metrics(at)["TTFT mean"].value == human_s(off['ttft_mean_s'])
    at.toggle(key="sc_bidir").set_value(True).run()
    at.selectbox(key="sc_workload").select(ds.CUSTOM).run()
    assert not at.exception
    # custom starts from the published benchmark: same numbers
    assert _metrics(at)["Hit rate"].value == "100.0%"
    # a think time longer than the TTL: nothing is left to pull
    at.number_input(key="sc_gap_value").set_value(600.0).run()
    assert not at.exception
    assert _metrics(at)["Hit rate"].value == "0.0%"


def test_whatif_preset_workload() -> None:
    presets = ds.preset_names()
    if "chat" not in presets:
        pytest.skip("kvplan.sim.presets is not in this build")
    assert presets[0] == ds.PUBLISHED and presets[-2:] == [ds.CUSTOM, ds.TRACE] and ds.PRESET_PUBLISHED not in presets
    at = _app()
    at.selectbox(key="sc_workload").select("chat").run()
    at.number_input(key="sc_preset_conversations").set_value(200).run()
    assert not at.exception and not at.error
    sc = ds.build_scenario(ds.ScenarioInputs(workload="chat", preset_conversations=200))
    assert sc.workload.conversations == 200 and sc.policy.decoder_kv_blocks_ttl_s == 480.0
    assert _metrics(at)["Hit rate"].value == f"{run(sc).summary['hit_rate']:.1%}"


@pytest.mark.parametrize("model", ["glm-5-fp8", "llama-3.3-70b"])
def test_whatif_other_models(model: str) -> None:
    at = _app()
    at.selectbox(key="sc_model").select(model).run()
    assert not at.exception and not at.error
    expected = run(published_benchmark(model=model)).summary
    assert _metrics(at)["TTFT mean"].value == human_s(expected['ttft_mean_s'])
    # a profile extrapolated from another model says so
    assert bool(at.warning) == bool(expected["extrapolated"])


def test_whatif_bad_deployment_is_one_line_error() -> None:
    at = _app()
    # GLM-5-FP8's 94 GB of weights per GPU at TP8 do not fit an 80 GB H100 (p5)
    at.selectbox(key="sc_model").select("glm-5-fp8").run()
    at.selectbox(key="sc_hardware").select("p5").run()
    assert not at.exception
    assert at.error and len(at.error[0].value.splitlines()) == 1 and "weights do not fit" in at.error[0].value


# --- Explorer ----------------------------------------------------------------------------------------------------


def test_explorer_grid_runs_on_button() -> None:
    at = _page(_app(), "explorer.py")
    assert _plotly_count(at) == 0  # nothing runs before the button
    at.text_input(key="grid_ttls").set_value("1, 480")
    at.text_input(key="grid_thresholds").set_value("64, 32768")
    if not at.checkbox(key="grid_with_advice").disabled:
        at.checkbox(key="grid_with_advice").uncheck()
    at.button(key="grid_run").click().run()
    assert not at.exception and not at.error
    assert _plotly_count(at) == 2
    grid = at.dataframe[0].value
    assert len(grid) == 4
    hit = {(r.ttl_s, r.threshold_tokens): r.hit_rate for r in grid.itertuples()}
    assert hit[(1.0, 64.0)] == 0.0 and hit[(480.0, 64.0)] == 1.0
    p90 = dict(zip(zip(grid["ttl_s"], grid["threshold_tokens"], strict=True), grid["ttft_p90_s"].tolist(), strict=True))
    expected = _model(**{"policy.kv_recompute_threshold_tokens": 32768})
    assert math.isclose(p90[(480.0, 32768.0)], expected["ttft_p90_s"])
    # TTL 1 s: the router keeps no entry (TTL 0), so every turn is a miss rather than a declined read
    errors = {(r.ttl_s, r.threshold_tokens): r.errors for r in grid.itertuples()}
    assert errors[(1.0, 64.0)] == 0


def test_explorer_bad_grid_is_one_line_error() -> None:
    at = _page(_app(), "explorer.py")
    at.text_input(key="grid_ttls").set_value("1, ten").run()
    assert not at.exception
    assert "'ten' is not a number" in at.error[0].value


# --- Calibration ---------------------------------------------------------------------------------------------------


def test_calibration_malformed_upload_errors_and_app_keeps_working() -> None:
    at = _page(_app(), "calibration.py")
    at.file_uploader(key="calib_traces").set_value([
        ("bad.json", b'{"date": "2025', "application/json"),
        ("multiturn_small.json", (TRACES / "multiturn_small.json").read_bytes(), "application/json"),
    ]).run()
    assert not at.exception
    assert len(at.error) == 1
    msg = at.error[0].value
    assert msg.startswith("bad.json") and len(msg.splitlines()) == 1 and "/tmp" not in msg
    table = at.dataframe[0].value
    assert list(table["file"]) == ["multiturn_small.json"] and list(table["format"]) == ["multiturn"]
    # the rest of the app is unaffected
    at = _page(at, "whatif.py")
    assert _metrics(at)["Hit rate"].value == "100.0%"
    at.number_input(key="sc_ttl").set_value(1.0).run()
    assert _metrics(at)["Hit rate"].value == "0.0%"


def test_calibration_binary_upload_is_refused() -> None:
    at = _page(_app(), "calibration.py")
    at.file_uploader(key="calib_traces").set_value(("x.pkl", b"\x80\x04\x95\x00\x00", "application/octet-stream")).run()
    assert not at.exception
    assert "x.pkl" in at.error[0].value and "NUL" in at.error[0].value


def test_calibration_profile_upload_feeds_other_pages() -> None:
    at = _page(_app(), "calibration.py")
    at.file_uploader(key="calib_profile").set_value(("mine.json", PROFILE.read_bytes(), "application/json")).run()
    assert not at.exception and not at.error
    params = at.dataframe[0].value
    assert "prefill.per_token_s" in set(params["parameter"])
    assert at.get("download_button")
    at.button(key="calib_use").click().run()
    assert ds.SESSION_PROFILE in at.session_state
    at = _page(at, "whatif.py")
    choice = "session: p5en-qwen3-32b"
    assert choice in at.selectbox(key="sc_profile").options
    at.selectbox(key="sc_profile").select(choice).run()
    assert not at.exception and not at.error
    # same parameters as the shipped profile: same numbers
    assert _metrics(at)["Hit rate"].value == "100.0%"


def _points_csv(tmp_path: Path) -> bytes:
    import sys

    import numpy as np

    sys.path.insert(0, str(ROOT / "tests"))
    from synthetic_traces import write_points_csv

    path = tmp_path / "points.csv"
    write_points_csv(path, np.random.default_rng(7),
                     lambda new, cached: 0.01 + 3.0e-5 * new + 4.0e-10 * new * cached,  # physically possible
                     lambda tokens: 0.012 + 4.0e-6 * tokens)
    return path.read_bytes()


def test_calibration_fit_from_uploaded_points(tmp_path: Path) -> None:
    at = _page(_app(), "calibration.py")
    at.file_uploader(key="calib_traces").set_value(("points.csv", _points_csv(tmp_path), "text/csv")).run()
    assert not at.exception and not at.error
    assert at.dataframe[0].value["format"].tolist() == ["points"]
    at.button(key="calib_fit").click().run()
    assert not at.exception and not at.error
    params = at.dataframe[1].value
    fitted = params[params["status"] == "fitted"].set_index("parameter")["value"]
    assert fitted["prefill.per_token_s"] == pytest.approx(3.0e-5, rel=0.1)
    assert _plotly_count(at) >= 2  # the parsed points and the residuals
    assert "MAPE (%)" in at.dataframe[2].value.columns
    assert at.get("download_button")
    at.button(key="calib_use").click().run()
    at = _page(at, "whatif.py")
    choice = next(o for o in at.selectbox(key="sc_profile").options if o.startswith("session: "))
    at.selectbox(key="sc_profile").select(choice).run()
    assert not at.exception and not at.error
    profile_path = du.session_profile_path(at.session_state[ds.SESSION_PROFILE])
    expected = run(with_overrides(published_benchmark(), {"profile": profile_path})).summary
    assert _metrics(at)["TTFT mean"].value == human_s(expected['ttft_mean_s'])


def test_calibration_bad_profile_upload() -> None:
    at = _page(_app(), "calibration.py")
    at.file_uploader(key="calib_profile").set_value(("p.json", b'{"name": 3}', "application/json")).run()
    assert not at.exception
    assert at.error and at.error[0].value.startswith("p.json")


# --- Reproduce and Advice (need the other issues' modules) ------------------------------------------------------------


def test_reproduce_page_runs() -> None:
    at = _page(_app(), "reproduce.py")
    assert not at.error
    assert _plotly_count(at) == 2
    from kvplan.calibration.reproduce import reproduce_rows

    expected = reproduce_rows(model="qwen3-32b")
    table = at.dataframe[-1].value
    assert {"series", "prompt_tokens", "published_ms", "simulated_ms", "rel_error_pct"} <= set(table.columns)
    assert len(table) == len(expected)
    assert table["simulated_ms"].tolist() == pytest.approx([r["simulated_ms"] for r in expected])
    at.selectbox(key="repro_model").select("glm-5-fp8").run()
    assert not at.exception and not at.error
    assert set(at.dataframe[-1].value["model"]) == {"glm-5-fp8"}


def test_reproduce_with_a_profile_of_another_model_is_one_line_error() -> None:
    at = _page(_app(), "calibration.py")
    at.file_uploader(key="calib_profile").set_value(("q.json", PROFILE.read_bytes(), "application/json")).run()
    at.button(key="calib_use").click().run()
    at = _page(at, "reproduce.py")
    at.selectbox(key="repro_profile").select("session profile").run()
    assert not at.exception and not at.error  # a qwen3-32b profile for qwen3-32b
    at.selectbox(key="repro_model").select("glm-5-fp8").run()
    assert not at.exception
    assert len(at.error) == 1 and "qwen3-32b" in at.error[0].value and "\n" not in at.error[0].value


def test_advice_page_runs() -> None:
    at = _page(_app(), "advice.py")
    at.number_input(key="advice_reps").set_value(1)
    at.button(key="advice_run").click().run(timeout=120)
    assert not at.exception and not at.error
    from kvplan.plan.advice import recommend

    rec = json.loads(recommend(published_benchmark(), replications=1).to_json())
    shown = {m.label: m.value for m in at.metric}
    assert shown["decoder_kv_blocks_ttl"] == f"{rec['decoder_kv_blocks_ttl_s']:g} s"
    assert shown["kv_recompute_threshold"] == f"{rec['kv_recompute_threshold_tokens']} tokens"
    flags = [c.value for c in at.code if c.value.startswith("--kv-transfer-config")]
    assert len(flags) == 2
    # prefill first, then decode, exactly the advisor's JSON
    assert [json.loads(f.split("'")[1]) for f in flags] == [rec["kv_transfer_config"][r] for r in ("prefill", "decode")]
    assert _plotly_count(at) == 1


# --- Compare ---------------------------------------------------------------------------------------------------


def test_compare_page_matches_the_api() -> None:
    """The page shows compare's rows in human time units, its best policy, the cost basis, a caption naming the
    sidebar's deployment, and offers aggregated replicas with prefix-aware routing."""
    at = _page(_app(), "compare.py")
    policies = ["off", "lease", "aggregated", "aggregated:prefix_aware"]
    at.multiselect(key="compare_policies").set_value(policies)
    at.number_input(key="compare_reps").set_value(1)
    at.button(key="compare_run").click().run(timeout=120)
    assert not at.exception and not at.error
    from kvplan.plan.compare import best_policy, compare
    from kvplan.plan.pricing import COST_BASIS
    from kvplan.units import human_s

    rows = compare(published_benchmark(), policies, replications=1)
    shown = at.dataframe[0].value
    # the 24k-token pulls of the published benchmark make compare add lease with cross-layer blocks
    assert list(shown["policy"]) == [r["policy"] for r in rows] == [*policies, "lease+cross_layer"]
    assert list(shown["TTFT p90"]) == [human_s(r["ttft_p90_s"]) for r in rows]  # "1.23 s", never "1234.5 ms"
    assert all(not v.endswith(" ms") or float(v.split()[0]) < 1000 for v in shown["TTFT p90"])
    assert any(f"Best policy: {best_policy(rows)['policy']}" in m.value for m in at.markdown)
    captions = [c.value for c in at.caption]
    assert COST_BASIS in captions and any(c.startswith("1P1D TP8 (16 GPUs") for c in captions), captions
    assert _plotly_count(at) == 1


def test_sidebar_prefix_caching_default_is_the_clis() -> None:
    """P prefix caching starts as the CLI sets it for the chosen workload, and follows a new workload choice."""
    from kvplan.sim.presets import preset_scenario

    at = _app()
    assert at.checkbox(key="sc_p_cache").value is published_benchmark().deployment.prefill_prefix_caching is False
    at.selectbox(key="sc_workload").set_value("chat").run()
    assert not at.exception
    assert at.checkbox(key="sc_p_cache").value is preset_scenario("chat").deployment.prefill_prefix_caching is True


def test_whatif_policy_selector_runs_the_variant() -> None:
    at = _app()
    at.selectbox(key="whatif_policy").set_value("aggregated (same GPUs)").run()
    assert not at.exception and not at.error
    from kvplan.plan.compare import policy_run

    sc = published_benchmark()
    summary = run(with_overrides(sc, policy_run("aggregated", sc).overrides)).summary
    shown = _metrics(at)
    ttft = next(m for label, m in shown.items() if "p90" in label.lower())
    assert ttft.value == next(m.value for m in ds.headline_metrics(summary, summary) if "p90" in m.label.lower())


def test_calibration_page_shows_the_self_check(tmp_path: Path) -> None:
    from kvplan.app.cli import main

    out = tmp_path / "llmd.json"
    data = ROOT / "tests" / "data"
    assert main(["calibrate", "--bench", str(data / "llm-d-2p1d__benchmark_2025-05-11_23-39-15.json"), "--scenario",
                 str(data / "llmd-2p1d-a100.scenario.yaml"), "--out", str(out)]) == 0
    report = json.loads(out.read_text())["fit_report"]
    at = _page(_app(), "calibration.py")
    at.file_uploader(key="calib_profile").set_value(("llmd.json", out.read_bytes(), "application/json")).run()
    assert not at.exception and not at.error and not at.warning
    frames = [d.value for d in at.dataframe]
    check = next(f for f in frames if "simulated (ms)" in f.columns)
    # both numbers per metric, unrounded (the grid formats them at six significant digits)
    assert check["measured (ms)"].tolist() == pytest.approx([c["measured_ms"] for c in report["self_check"]])
    assert check["simulated (ms)"].tolist() == pytest.approx([c["simulated_ms"] for c in report["self_check"]])
    # ans12: and the held-out seeds whose mean gates the status too (the CLI prints them; the page did not)
    held = next(f for f in frames if "simulated mean (ms)" in f.columns)
    assert held["simulated mean (ms)"].tolist() == pytest.approx([c["simulated_ms"] for c in report["held_out_check"]])
    assert (held["seeds"] == 3).all()
    params = next(f for f in frames if "parameter" in f.columns).set_index("parameter")
    assert params.loc["prefill.gpu_scale", "value"] == pytest.approx(report["params"][0]["value"])
    # the same profile marked unreliable: the page says so, with the reason
    raw = json.loads(out.read_text())
    raw["status"] = "unreliable"
    raw["fit_report"]["unreliable_reasons"] = ["ttft_mean_ms: simulated 1 ms vs measured 2 ms"]
    at.file_uploader(key="calib_profile").set_value(("bad.json", json.dumps(raw).encode(), "application/json")).run()
    assert not at.exception
    assert at.warning and "unreliable" in at.warning[0].value and "measured 2 ms" in at.warning[0].value


def test_whatif_variant_deltas_are_against_vllm_defaults() -> None:
    """The what-if page's deltas 'against the vLLM defaults' kept the chosen variant's retention: lease's pinned KV
    mean (48.0 GiB on the published benchmark) showed no delta, compared with lease at 480 s, where vLLM's defaults
    hold 61.4 GiB. The baseline is now the sidebar's deployment at vLLM's defaults (fixed TTL, no offload, failure
    policy fail), as `kvplan simulate` of it gives; and an aggregated variant is not said to have an ON/OFF effect."""
    from kvplan.plan.compare import policy_run

    at = _app()
    at.selectbox(key="whatif_policy").set_value("lease").run()
    assert not at.exception and not at.error
    sc = published_benchmark()
    lease = run(with_overrides(sc, policy_run("lease", sc).overrides)).summary
    vllm = run(with_overrides(sc, ds.vllm_defaults_overrides())).summary
    assert lease["pinned_kv_gib_mean"] < vllm["pinned_kv_gib_mean"] - 5
    shown = _metrics(at)["Pinned decode KV mean"]
    assert shown.value == f"{lease['pinned_kv_gib_mean']:,.1f} GiB"
    assert shown.delta == f"{lease['pinned_kv_gib_mean'] - vllm['pinned_kv_gib_mean']:+,.1f} GiB"
    at.selectbox(key="whatif_policy").set_value("aggregated (same GPUs)").run()
    assert not at.exception
    assert "aggregated replicas" in at.caption[0].value
    assert not any("ON vs OFF" in i.value for i in at.info)
    assert any("do not apply" in i.value for i in at.info)


def test_whatif_hit_rate_is_defined_as_the_cli_defines_it() -> None:
    """The what-if's 'Hit rate' help said 'follow-up turns that reused KV (pulled from D, local hit, or recomputed
    below the threshold)', but the figure is summary.json's hit_rate, the follow-ups whose context was still held: on
    RAGPulse's fitted workload 90.2% against a reuse rate of 100% (P's prefix cache), and on the published benchmark
    with a threshold above every prompt 100% 'reused' where nothing is (reuse rate 0%). The help now says what the
    figure counts, and the reuse rate is shown beside it."""
    at = _app()
    at.number_input(key="sc_threshold").set_value(1_000_000).run()  # every held context below it: recomputed
    assert not at.exception
    summary = _model(**{"policy.kv_recompute_threshold_tokens": 1_000_000})
    assert summary["hit_rate"] == 1.0 and summary["reuse_rate"] == 0.0  # held, yet nothing reused (P's cache off)
    m = _metrics(at)
    assert "still held" in m["Hit rate"].help and "reused KV" not in m["Hit rate"].help
    assert m["Hit rate"].value == f"{summary['hit_rate']:.1%}"
    assert m["Reuse rate"].value == f"{summary['reuse_rate']:.1%}"
