"""The What-if page says what ``kvplan simulate`` prints for the same scenario and seed: its notes and warnings
after the table (the workload cut at the model's context limit, settings without effect, trace notes), and its
figures with the CLI's labels and rules (e.g. no hit rate without follow-up turns)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from streamlit.testing.v1 import AppTest

from kvplan.app import dash_state as ds
from kvplan.app.cmd_dashboard import DASHBOARD_SCRIPT
from kvplan.app.output import print_summary
from kvplan.sim.api import run
from kvplan.sim.defaults import trace_replay_scenario

TIMEOUT_S = 120
TRACE = "replay a trace file"


def _app() -> AppTest:
    at = AppTest.from_file(str(DASHBOARD_SCRIPT), default_timeout=TIMEOUT_S)
    at.run()
    assert not at.exception, at.exception
    return at


def _cli_lines(result: Any, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """What ``kvplan simulate`` prints after a run (``print_summary``, the same function)."""
    capsys.readouterr()
    print_summary(result, None)
    return capsys.readouterr().out.splitlines()


def _upload_trace(at: AppTest, name: str, text: str) -> AppTest:
    at.selectbox(key="sc_workload").select(TRACE).run()
    at.file_uploader(key="sc_trace_upload").set_value((name, text.encode(), "text/csv")).run()
    assert not at.exception, at.exception
    return at


#: A generic CSV trace: one request per session (no follow-up turn), one output of 0 tokens, one request longer
#: than Qwen3-32B's 40,960-token context.
SINGLE_TURNS = ("session_id,timestamp_s,input_tokens,output_tokens\n"
                "a,0,1000,100\nb,1.5,500,50\nc,3,2000,0\nd,4,200000,20\n")


def test_conversations_cut_at_the_context_limit_are_said(capsys: pytest.CaptureFixture[str]) -> None:
    """The coding-agent preset's conversations grow past Qwen3-32B's context: the CLI's note is on the page."""
    sc = ds.build_scenario(ds.ScenarioInputs(workload="coding-agent", prefill_prefix_caching=True))
    result = run(sc)
    n = result.summary["truncated_conversations"]
    assert n > 0
    cli = [ln.removeprefix("note: ") for ln in _cli_lines(result, capsys) if "context limit" in ln]
    assert cli == [f"{n} conversations ended early at the model's context limit"]
    at = _app()
    at.selectbox(key="sc_workload").select("coding-agent").run()
    assert not at.exception, at.exception
    assert cli[0] in [w.value for w in at.warning]


def test_trace_requests_beyond_the_context_limit_are_said(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A trace request longer than the model's context is skipped: the CLI logs it, the page says it too."""
    path = tmp_path / "single.csv"
    path.write_text(SINGLE_TURNS)
    with caplog.at_level(logging.WARNING):
        summary = run(trace_replay_scenario(str(path))).summary
    assert "select: 1 request(s) over 40960 tokens were skipped" in caplog.text
    assert summary["trace"]["skipped_overlong"] == 1
    at = _upload_trace(_app(), "single.csv", SINGLE_TURNS)
    assert "1 trace request(s) over 40,960 tokens were skipped (the model's context limit)" in [
        w.value for w in at.warning]


def test_a_setting_without_effect_is_a_warning(capsys: pytest.CaptureFixture[str]) -> None:
    """A decode TTL with bidirectional transfer off does nothing: the CLI warns, and so does the page (not only in
    the collapsed list of assumptions)."""
    sc = ds.build_scenario(ds.ScenarioInputs(bidirectional=False, ttl_s=100.0))
    cli = [ln.removeprefix("warning: ") for ln in _cli_lines(run(sc), capsys) if ln.startswith("warning: no effect:")]
    assert len(cli) == 1 and "decoder_kv_blocks_ttl_s = 100 s" in cli[0]
    at = _app()
    at.toggle(key="sc_bidir").set_value(False).run()
    at.number_input(key="sc_ttl").set_value(100.0).run()
    assert not at.exception, at.exception
    assert cli[0] in [w.value for w in at.warning]


def test_no_follow_up_turn_means_no_hit_rate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace of single-request sessions has no follow-up turn: the CLI prints 'n/a (no follow-up turns)' for the
    hit and reuse rates (summary.json's 0.0 is a placeholder), and the page must not show 0.0%."""
    path = tmp_path / "single.csv"
    path.write_text(SINGLE_TURNS)
    result = run(trace_replay_scenario(str(path)))
    assert result.summary["follow_up_turns"] == 0
    cli = [ln for ln in _cli_lines(result, capsys) if "rate (follow-ups" in ln]
    assert len(cli) == 2 and all("n/a (no follow-up turns)" in ln for ln in cli)
    at = _upload_trace(_app(), "single.csv", SINGLE_TURNS)
    metrics = {m.label: m for m in at.metric}
    for label in ("Hit rate", "Reuse rate"):
        assert metrics[label].value == "n/a (no follow-up turns)" and not metrics[label].delta
    assert "hit rate n/a (no follow-up turns) vs n/a (no follow-up turns)" in at.info[0].value


def test_trace_notes_are_on_the_page(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A trace request with 0 output tokens is replayed with 1: the CLI's note is on the page, word for word."""
    path = tmp_path / "single.csv"
    path.write_text(SINGLE_TURNS)
    cli = [ln for ln in _cli_lines(run(trace_replay_scenario(str(path))), capsys) if ln.startswith("note: 1 trace")]
    assert len(cli) == 1 and "output_tokens 0 were replayed with 1" in cli[0]
    at = _upload_trace(_app(), "single.csv", SINGLE_TURNS)
    assert cli[0] in [c.value for c in at.caption]


def test_run_notes_say_sorted_rows_and_sketched_percentiles() -> None:
    notes = ds.run_notes({"trace": {"rows_out_of_order_sorted": 3}, "percentile_method": "sketch",
                          "percentile_relative_error": 0.005})
    assert notes == ["3 trace rows were earlier than the row before them; the trace was replayed sorted by arrival",
                     "percentiles: quantile sketch, within 0.5% relative"]
    assert ds.run_notes({"trace": {}, "percentile_method": "exact"}) == []


def _cli_row(lines: list[str], label: str) -> list[str]:
    """The values of one row of ``kvplan simulate``'s table, split at ' / '."""
    row = next(ln for ln in lines if label in ln)
    return row.split(label)[1].strip(" │┃").split(" / ")


def test_tpot_is_shown_as_the_cli_prints_it(capsys: pytest.CaptureFixture[str]) -> None:
    """The CLI prints TPOT mean / p50 / p90 for every run; the page shows TPOT mean and p90 with the same text."""
    from kvplan.sim.defaults import published_benchmark

    tpot = _cli_row(_cli_lines(run(published_benchmark()), capsys), "TPOT mean / p50 / p90")
    metrics = {m.label: m.value for m in _app().metric}
    assert (metrics["TPOT mean"], metrics["TPOT p90"]) == (tpot[0], tpot[2])


def test_a_missing_figure_reads_n_a() -> None:
    """TPOT is None when every output is one token: 'n/a', no delta, no exception."""
    m = {x.label: x for x in ds.headline_metrics({"tpot_mean_s": None, "tpot_p90_s": None, "ttft_p50_s": 0.1},
                                                  {"tpot_mean_s": 0.005, "ttft_p50_s": 0.1})}
    assert m["TPOT mean"].value == "n/a" and m["TPOT mean"].delta is None


def test_trace_replay_is_the_clis(capsys: pytest.CaptureFixture[str]) -> None:
    """An uploaded trace replays on the deployment ``kvplan simulate --trace F`` uses (``trace_replay_scenario``,
    P prefix caching on), so the page's figures are the CLI's; the Mooncake sample reuses P's prefix cache."""
    path = Path(__file__).parent / "data" / "traces" / "mooncake_small.jsonl"
    result = run(trace_replay_scenario(str(path)))
    assert result.summary["local_hit_tokens"] > 0  # prefix caching on P matters for this trace
    ttft = _cli_row(_cli_lines(result, capsys), "TTFT mean / p50 / p90 / p99")
    at = _upload_trace(_app(), path.name, path.read_text())
    assert at.checkbox(key="sc_p_cache").value is True
    metrics = {m.label: m.value for m in at.metric}
    assert [metrics["TTFT mean"], metrics["TTFT p50"], metrics["TTFT p90"]] == ttft[:3]


def test_an_unreliable_profile_can_be_allowed_as_in_the_cli(tmp_path: Path) -> None:
    """The refusal of an 'unreliable' profile names --allow-unreliable-profile; the sidebar offers the same switch,
    and a run on such a profile says so above its figures."""
    import json

    profile = json.loads((Path(__file__).parents[1] / "models" / "profiles" / "p5en-qwen3-32b.json").read_text())
    profile.update(name="refit", status="unreliable")
    profile.setdefault("fit_report", {})["unreliable_reasons"] = ["self-check off by 40%"]
    at = _app()
    at.switch_page("pages/calibration.py").run()
    at.file_uploader(key="calib_profile").set_value(("refit.json", json.dumps(profile).encode(), "application/json"))
    at.run()
    at.button(key="calib_use").click().run()
    at.switch_page("pages/whatif.py").run()
    at.selectbox(key="sc_profile").select("session: refit").run()
    assert not at.exception
    assert "--allow-unreliable-profile" in at.error[0].value and not at.metric
    at.checkbox(key="sc_allow_unreliable").check().run()
    assert not at.exception and not at.error
    assert at.metric and any("Profile refit is unreliable" in w.value for w in at.warning)
