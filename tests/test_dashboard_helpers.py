"""Dashboard helpers without a running app: pure state functions, uploads, figures (issue 5)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import pytest

from kvplan.app import dash_state as ds
from kvplan.app import dash_sweeps as sw
from kvplan.app import dash_upload as du
from kvplan.app import figures
from kvplan.app.cli import main
from kvplan.app.cmd_dashboard import DASHBOARD_SCRIPT, dashboard_url, streamlit_command
from kvplan.errors import KvplanInputError
from kvplan.sim.api import run
from kvplan.sim.defaults import published_benchmark

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "tests" / "data" / "traces"
PROFILE = ROOT / "models" / "profiles" / "p5en-qwen3-32b.json"
TIMEOUT_S = 60


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
        big = ds.default_custom_workload().__class__(**{**ds.default_custom_workload().__dict__, "conversations": 2 * 10**6})
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
    assert view.comparison.loc["TTFT p90", "recommended"] == "500.0 ms +/- 10.0 ms"
    # times in human units (issue 18: not "268,554.9 ms")
    assert sw.format_metric("ttft_p50_s", 268.5549) == "4.5 min" and sw.format_metric("ttft_p50_s", 1.87) == "1.87 s"
    from kvplan.app import figures

    fig = figures.ttl_curve([{"ttl_s": 30, "ttft_mean_s": 270.0, "pinned_kv_gib_mean": 1},
                             {"ttl_s": 90, "ttft_mean_s": 2.0, "pinned_kv_gib_mean": 9}], 90, 273.0)
    assert fig.layout.yaxis.title.text == "mean TTFT (min)" and fig.data[0].y[0] == pytest.approx(4.5)  # not 0.3M ms
    assert figures.time_unit([0.2]) == (1000.0, "ms") and figures.time_unit([3.0]) == (1.0, "s")
    assert view.comparison.loc["hit rate", "bidirectional off"] == "0.0 %"
    assert not any(str(i).endswith("_s") for i in view.comparison.index)  # no ms values under *_s names
    assert view.rationale[-1] == "Binding constraint: turn-gap distribution."
    assert view.caveats == ("short run",) and view.router_how == "set it to 24 s"
    assert [t for t, _ in view.configs] == ["prefill server", "decode server"]
    flag = view.configs[1][1]
    assert flag.startswith("--kv-transfer-config '") and json.loads(flag.split("'")[1])["decoder_kv_blocks_ttl"] == 30
    assert sw.kv_transfer_config_snippets({"a": 1})[0][0] == "prefill and decode servers"
    off = sw.advice_view({**rec, "retention_off": True})  # the knobs apply only if bidirectional is kept on
    assert off.settings[0] == ("bidirectional_kv_xfer", "false (retention off)")
    assert [label for label, _ in off.settings[1:4]] == [
        f"{k} (only if kept on)" for k in ("decoder_kv_blocks_ttl", "kv_recompute_threshold", "router TTL")]
    assert off.router_how.startswith("only if you keep bidirectional_kv_xfer on")
    assert sw.format_metric("pinned_kv_gib_mean", 2.0) == "2.0 GiB" and sw.format_metric("x", None) == "n/a"


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


def test_parameter_table_converts_to_arrow() -> None:
    """A shipped profile's costs mix numbers and knot lists; the table's value column is one type (Streamlit sends it
    as Arrow: the mix failed and logged a traceback on every render of the Calibration page)."""
    import pyarrow as pa

    from kvplan.models.profile import load_profile

    frame = du.parameter_table(load_profile(PROFILE))
    pa.Table.from_pandas(frame)  # raised ArrowInvalid on the mixed column
    values = frame.set_index("parameter")["value"]
    assert values["prefill.linear_knots_tokens"].startswith("[32, 64, 128")
    assert float(values["transfer.per_byte_s"]) > 0  # six significant digits, not rounded to 0


def test_ttft_figures_scale_their_unit_as_the_metrics_do() -> None:
    """A saturated replay's TTFT is minutes (the metrics say '32.0 min'); its CDF and split were drawn in ms
    (millions of them). They now take ms, s or min by the largest value, the unit in the axis title."""
    turns = pd.DataFrame({"decision": ["miss", "pull", "error"], "ttft_s": [1920.0, 600.0, float("nan")],
                          **{c: [0.0, 0.0, 0.0] for _, cols in figures.TTFT_COMPONENTS for c in cols}})
    turns["prefill_queue_s"] = turns["ttft_s"].fillna(0.0)
    cdf = figures.ttft_distribution({"ON": turns})
    assert cdf.layout.xaxis.title.text == "TTFT (min)" and max(cdf.data[0].x) == pytest.approx(32.0)
    split = figures.ttft_split(turns)
    assert split.layout.yaxis.title.text == "mean TTFT component (min)"
    assert max(split.data[0].y) == pytest.approx(32.0)
    small = figures.ttft_distribution({"ON": turns.assign(ttft_s=turns["ttft_s"] / 10_000)})
    assert small.layout.xaxis.title.text == "TTFT (ms)"
