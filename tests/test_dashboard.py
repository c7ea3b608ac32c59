"""Dashboard pages with Streamlit's ``AppTest`` (every page), plus the pure helpers behind them.

Widget changes are checked against the model itself: the metric a page shows after a change must be
what ``kvplan.sim.api.run`` says for the same scenario (TTL 1 s with the benchmark's ~16 s turn gaps
means no follow-up turn finds its KV; a threshold above every pull means every pull becomes a recompute).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
import plotly.graph_objects as go
import pytest
from streamlit.testing.v1 import AppTest

from kvplan.app import dash_state as ds
from kvplan.app import dash_sweeps as sw
from kvplan.app import dash_upload as du
from kvplan.app import figures
from kvplan.app.cli import main
from kvplan.app.cmd_dashboard import DASHBOARD_SCRIPT, dashboard_url, streamlit_command
from kvplan.errors import KvplanInputError
from kvplan.sim.api import run
from kvplan.sim.defaults import published_benchmark
from kvplan.sim.scenario import with_overrides

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
    assert m["TTFT mean"].value == f"{whatif_base['ttft_mean_s'] * 1000:,.1f} ms"
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
    assert m["TTFT mean"].value == f"{expected['ttft_mean_s'] * 1000:,.1f} ms"
    assert m["TTFT mean"].delta.startswith("+")
    # and no pinned KV is read any more, but it is still released by the notification
    assert m["Hit rate"].value == f"{expected['hit_rate']:.1%}"


def test_whatif_bidirectional_off_and_custom_gap() -> None:
    at = _app()
    at.toggle(key="sc_bidir").set_value(False).run()
    off = _model(**{"policy.bidirectional": False})
    assert _metrics(at)["TTFT mean"].value == f"{off['ttft_mean_s'] * 1000:,.1f} ms"
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
    assert presets[0] == ds.PUBLISHED and presets[-1] == ds.CUSTOM and ds.PRESET_PUBLISHED not in presets
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
    assert _metrics(at)["TTFT mean"].value == f"{expected['ttft_mean_s'] * 1000:,.1f} ms"
    # a profile extrapolated from another model says so
    assert bool(at.warning) == bool(expected["extrapolated"])


def test_whatif_bad_deployment_is_one_line_error() -> None:
    at = _app()
    at.selectbox(key="sc_hardware").select("p5").run()
    assert not at.exception
    assert at.error and len(at.error[0].value.splitlines()) == 1


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
    p90 = {(r.ttl_s, r.threshold_tokens): r.ttft_p90_s for r in grid.itertuples()}
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
                     lambda new, cached: 0.01 + 3.0e-5 * new + 1.0e-10 * new * cached,
                     lambda tokens: 0.012 + 4.0e-6 * tokens)
    return path.read_bytes()


def test_calibration_fit_from_uploaded_points(tmp_path: Path) -> None:
    if du.calibrate_fn() is None:
        pytest.skip("kvplan.calibration.calibrate is not in this build")
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
    assert _metrics(at)["TTFT mean"].value == f"{expected['ttft_mean_s'] * 1000:,.1f} ms"


def test_calibration_bad_profile_upload() -> None:
    at = _page(_app(), "calibration.py")
    at.file_uploader(key="calib_profile").set_value(("p.json", b'{"name": 3}', "application/json")).run()
    assert not at.exception
    assert at.error and at.error[0].value.startswith("p.json")


# --- Reproduce and Advice (need the other issues' modules) ------------------------------------------------------------


def test_reproduce_page_runs() -> None:
    at = _page(_app(), "reproduce.py")
    if ds.reproduce_fn() is None:
        assert "Not available yet" in at.info[0].value
        return
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
    if ds.reproduce_fn() is None:
        pytest.skip("kvplan.calibration.reproduce is not in this build")
    at.selectbox(key="repro_profile").select("session profile").run()
    assert not at.exception and not at.error  # a qwen3-32b profile for qwen3-32b
    at.selectbox(key="repro_model").select("glm-5-fp8").run()
    assert not at.exception
    assert len(at.error) == 1 and "qwen3-32b" in at.error[0].value and "\n" not in at.error[0].value


def test_advice_page_runs() -> None:
    at = _page(_app(), "advice.py")
    if sw.recommend_fn() is None:
        assert "Not available yet" in at.info[0].value
        return
    at.number_input(key="advice_reps").set_value(1)
    at.button(key="advice_run").click().run(timeout=120)
    assert not at.exception and not at.error
    from kvplan.sim.advice import recommend

    rec = json.loads(recommend(published_benchmark(), replications=1).to_json())
    shown = {m.label: m.value for m in at.metric}
    assert shown["decoder_kv_blocks_ttl"] == f"{rec['decoder_kv_blocks_ttl_s']:g} s"
    assert shown["kv_recompute_threshold"] == f"{rec['kv_recompute_threshold_tokens']} tokens"
    flags = [c.value for c in at.code if c.value.startswith("--kv-transfer-config")]
    assert len(flags) == 2
    # prefill first, then decode, exactly the advisor's JSON
    assert [json.loads(f.split("'")[1]) for f in flags] == [rec["kv_transfer_config"][r] for r in ("prefill", "decode")]
    assert _plotly_count(at) == 1


# --- pure helpers ------------------------------------------------------------------------------------------------------


def test_build_scenario_defaults_are_the_published_benchmark() -> None:
    assert ds.scenario_key(ds.build_scenario(ds.ScenarioInputs())) == ds.scenario_key(published_benchmark())
    sc = ds.build_scenario(ds.ScenarioInputs(ttl_s=30.0, threshold_tokens=128, decode_nodes=2))
    assert sc.policy.decoder_kv_blocks_ttl_s == 30.0 and sc.policy.kv_recompute_threshold_tokens == 128
    assert sc.deployment.decode_nodes == 2
    assert ds.scenario_from_key(ds.scenario_key(sc)) == sc


def test_custom_workload_round_trip() -> None:
    inputs = ds.ScenarioInputs(workload=ds.CUSTOM, custom=ds.default_custom_workload())
    assert ds.scenario_key(ds.build_scenario(inputs)) == ds.scenario_key(published_benchmark())
    with pytest.raises(KvplanInputError, match="conversations"):
        big = ds.default_custom_workload().__class__(**{**ds.default_custom_workload().__dict__, "conversations": 10**6})
        ds.build_scenario(ds.ScenarioInputs(workload=ds.CUSTOM, custom=big))


def test_headline_metrics_deltas() -> None:
    cur = {"ttft_p50_s": 0.5, "ttft_p90_s": 1.0, "ttft_mean_s": 0.6, "hit_rate": 0.25, "errors": 3,
           "pinned_kv_gib_mean": 2.0, "pinned_kv_gib_peak": 4.0}
    base = {**cur, "ttft_p50_s": 0.4, "hit_rate": 1.0, "errors": 0}
    m = {x.label: x for x in ds.headline_metrics(cur, base)}
    assert m["TTFT p50"].value == "500.0 ms" and m["TTFT p50"].delta == "+100.0 ms"
    assert m["TTFT p50"].delta_color == "inverse" and m["Hit rate"].delta_color == "normal"
    assert m["Hit rate"].delta == "-75.0 pp" and m["Errors"].delta == "+3"
    assert m["TTFT p90"].delta is None
    assert ds.headline_metrics({"ttft_p50_s": float("nan")}, {})[0].value == "n/a"


@pytest.mark.parametrize(
    ("text", "integer", "expected"),
    [("1, 5,30", False, [1.0, 5.0, 30.0]), ("64;0 64", True, [0.0, 64.0]), ("2.5", False, [2.5])],
)
def test_parse_number_list(text: str, integer: bool, expected: list[float]) -> None:
    assert sw.parse_number_list(text, "x", integer=integer) == expected


@pytest.mark.parametrize("text", ["", "a", "-1", "inf", "1.5"])
def test_parse_number_list_errors(text: str) -> None:
    with pytest.raises(KvplanInputError) as exc:
        sw.parse_number_list(text, "thresholds", integer=True)
    assert str(exc.value).startswith("thresholds") and "\n" not in str(exc.value)


def test_grid_spec_and_router_cap() -> None:
    base = published_benchmark()
    spec = sw.grid_spec(base, [10.0, 900.0], [64.0], 2)
    assert spec.n_runs == 4 and spec.state_key == sw.grid_spec(base, [10.0, 900.0], [64.0], 2).state_key
    assert spec.state_key != sw.grid_spec(base, [10.0, 900.0], [64.0], 1).state_key
    # router TTL = min(450, floor(TTL - 5 s margin - 1 s allowance)), never negative
    assert [sw.ttl_base(base, t).policy.router_ttl_s for t in (10.0, 900.0, 3.0)] == [4.0, 450.0, 0.0]
    with pytest.raises(KvplanInputError):
        sw.grid_spec(base, list(range(50)), list(range(50)))
    marks = sw.grid_marks(base, {"decoder_kv_blocks_ttl_s": 30, "kv_recompute_threshold_tokens": 128})
    assert marks == {"recommended": (30.0, 128.0), "vLLM defaults": (480.0, 64.0)}


def test_advice_view_and_config_snippets() -> None:
    rec = {
        "decoder_kv_blocks_ttl_s": 30, "kv_recompute_threshold_tokens": 256, "router_ttl_s": 24,
        "kv_load_failure_policy": "recompute",
        "kv_transfer_config": {"decode": {"kv_connector": "NixlConnector", "decoder_kv_blocks_ttl": 30},
                               "prefill": {"kv_connector": "NixlConnector"}},
        "expected": {"ttft_p90_s": 0.5, "ttft_p90_s_ci95": 0.01, "hit_rate": 0.9, "hit_rate_ci95": None},
        "baseline": {"ttft_p90_s": 0.6, "hit_rate": 0.9}, "bidirectional_off": {"ttft_p90_s": 0.9, "hit_rate": 0.0},
        "rationale": ["TTL: shortest reaching 95% of the benefit"], "binding_constraint": "turn-gap distribution",
        "warnings": ["short run"], "disagreements": [], "router": {"how": "set it to 24 s"},
    }
    view = sw.advice_view(rec)
    assert view.settings[0] == ("decoder_kv_blocks_ttl", "30 s") and view.settings[-1][1] == "recompute"
    assert list(view.comparison.columns) == list(sw.ADVICE_COLUMNS.values())
    assert view.comparison.loc["ttft_p90_s", "recommended"] == "500.0 ms +/- 10.0"
    assert view.comparison.loc["hit_rate", "bidirectional off"] == "0.0 %"
    assert view.rationale[-1] == "Binding constraint: turn-gap distribution."
    assert view.caveats == ("short run",) and view.router_how == "set it to 24 s"
    assert [t for t, _ in view.configs] == ["prefill server", "decode server"]
    flag = view.configs[1][1]
    assert flag.startswith("--kv-transfer-config '") and json.loads(flag.split("'")[1])["decoder_kv_blocks_ttl"] == 30
    assert sw.kv_transfer_config_snippets({"a": 1})[0][0] == "prefill and decode servers"
    assert sw.format_metric("pinned_kv_gib_mean", 2.0) == "2.0 GiB" and sw.format_metric("x", None) == "n/a"


def test_optional_attr(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ds.optional_attr(["no_such_module_here"], "f") is None
    assert ds.optional_attr(["sim.api"], "run") is run
    with pytest.raises(KvplanInputError, match="has no nothing"):
        ds.optional_attr(["sim.api"], "nothing")


# --- uploads ---------------------------------------------------------------------------------------------------------


def test_store_upload_limits_and_names(tmp_path: Path) -> None:
    with pytest.raises(KvplanInputError, match="larger than"):
        du.store_upload("big.json", b"x" * 11, max_bytes=10)
    with pytest.raises(KvplanInputError, match="empty"):
        du.store_upload("e.json", b"")
    assert du.safe_name("../../etc/passwd") == "passwd"
    assert du.safe_name("C:\\x\\my trace.json") == "my_trace.json"
    assert du.safe_name("..") == "upload"
    p = du.store_upload("../evil name.json", b"[]")
    assert p.name == "evil_name.json" and "kvplan-dashboard" in str(p)


def test_parse_uploads_caches_and_reports() -> None:
    cache: dict[str, du.ParsedTrace] = {}
    good = (TRACES / "multiturn_small.json").read_bytes()
    parsed, errors = du.parse_uploads([("m.json", good), ("n.txt", b"hello\nworld\n")], cache)
    assert [t.fmt for t in parsed] == ["multiturn"] and len(errors) == 1 and errors[0].startswith("n.txt")
    assert len(cache) == 1
    again, _ = du.parse_uploads([("m.json", good)], cache)
    assert again[0] is parsed[0]
    assert du.trace_points(parsed[0]) is not None


def test_upload_limit_matches_streamlit_flag() -> None:
    cmd = streamlit_command(8600, "127.0.0.1")
    assert cmd[cmd.index("--server.maxUploadSize") + 1] == str(du.MAX_UPLOAD_MB) == "64"
    assert cmd[cmd.index("--server.headless") + 1] == "true" and cmd[cmd.index("--server.port") + 1] == "8600"
    assert cmd[4] == str(DASHBOARD_SCRIPT) and DASHBOARD_SCRIPT.is_file()
    assert dashboard_url(8600, "0.0.0.0") == "http://localhost:8600"


def test_dashboard_command_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboard", "--help"]) == 0
    assert "--port" in capsys.readouterr().out


# --- figures (no Streamlit) --------------------------------------------------------------------------------------------


def test_figures_from_a_run() -> None:
    res = run(published_benchmark())
    split = figures.ttft_split_frame(res.turns)
    labels = [label for label, _ in figures.TTFT_COMPONENTS]
    # the components add up to the mean TTFT (the identity of sim/results.py)
    assert split[labels].sum(axis=1).to_numpy() == pytest.approx(split["ttft_ms"].to_numpy())
    assert set(split.index) == {"pull", "miss", "all"}
    assert isinstance(figures.ttft_split(res.turns), go.Figure)
    cdf = figures.ttft_distribution({"ON": res.turns})
    assert len(cdf.data) == 1 and cdf.data[0].y[-1] == 1.0
    mix = figures.decision_mix({"a": res.summary})
    assert list(mix.data[0].x) == list(figures.DECISIONS) and sum(mix.data[0].y) == 50
    pinned = figures.pinned_kv(res.pinned_series(), res.summary["decode_kv_capacity_gib"], res.summary["sim_end_s"])
    assert pinned.data[0].y[0] == 0.0 and max(pinned.data[0].y) == pytest.approx(res.summary["pinned_kv_gib_peak"])
    assert "figures" in figures.__name__ and "streamlit" not in figures.__dict__


def test_grid_heatmap_marks_between_categories() -> None:
    grid = pd.DataFrame([{"ttl_s": t, "threshold_tokens": th, "ttft_p90_s": t / 1000 + th / 1e6, "hit_rate": 1.0,
                          "errors": 0} for t in (10.0, 100.0, 1000.0) for th in (0.0, 64.0)])
    fig = figures.grid_heatmap(grid, "ttft_p90_s", "t", "ms", {"here": (100.0, 64.0), "between": (30.0, 0.0)}, 1000.0)
    assert fig.data[0].z.shape == (2, 3)
    assert (fig.data[1].x[0], fig.data[1].y[0]) == (1.0, 1.0)
    assert 0.0 < fig.data[2].x[0] < 1.0


def test_figures_module_does_not_import_streamlit() -> None:
    source = (ROOT / "app" / "figures.py").read_text()
    assert "import streamlit" not in source and "from streamlit" not in source


# --- Compare ---------------------------------------------------------------------------------------------------


def test_compare_page_matches_the_api() -> None:
    at = _page(_app(), "compare.py")
    at.multiselect(key="compare_policies").set_value(["off", "lease", "aggregated"])
    at.number_input(key="compare_reps").set_value(1)
    at.button(key="compare_run").click().run(timeout=120)
    assert not at.exception and not at.error
    from kvplan.sim.compare import compare

    rows = compare(published_benchmark(), ["off", "lease", "aggregated"], replications=1)
    shown = at.dataframe[0].value
    assert list(shown["policy"]) == ["off", "lease", "aggregated"]
    assert list(shown["ttft_p90_s"]) == pytest.approx([r["ttft_p90_s"] for r in rows])
    assert _plotly_count(at) == 1


def test_whatif_policy_selector_runs_the_variant() -> None:
    at = _app()
    at.selectbox(key="whatif_policy").set_value("aggregated (same GPUs)").run()
    assert not at.exception and not at.error
    from kvplan.sim.compare import policy_run

    sc = published_benchmark()
    summary = run(with_overrides(sc, policy_run("aggregated", sc).overrides)).summary
    shown = _metrics(at)
    ttft = next(m for label, m in shown.items() if "p90" in label.lower())
    assert ttft.value == next(m.value for m in ds.headline_metrics(summary, summary) if "p90" in m.label.lower())
