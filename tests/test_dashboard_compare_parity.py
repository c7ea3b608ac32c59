"""The Compare page says what ``kvplan compare`` prints for the same scenario, policies and seeds: its health row
(a saturated policy's TTFT measures the queue), its held-KV rows and the notes under its table; the Advice page's
table shows the CIs ``kvplan recommend`` prints; the Reproduce page gives ``kvplan reproduce``'s verdicts; the explorer
says which points ran too short for steady state, as ``kvplan sweep``."""

from __future__ import annotations

from typing import Any

from streamlit.testing.v1 import AppTest

from kvplan.app import dash_state as ds
from kvplan.app.cmd_compare import IDENTICAL_NOTE, health_cell, render_text
from kvplan.app.cmd_dashboard import DASHBOARD_SCRIPT
from kvplan.plan.compare import compare

TIMEOUT_S = 180


def _compare_page(policies: list[str], reps: int, tp: int | None = None) -> AppTest:
    at = AppTest.from_file(str(DASHBOARD_SCRIPT), default_timeout=TIMEOUT_S)
    at.run()
    at.switch_page("pages/compare.py").run()
    if tp is not None:  # on this page: AppTest's switch_page does not carry the sidebar's session-scoped state
        at.selectbox(key="sc_tp").select(tp).run()
    at.multiselect(key="compare_policies").set_value(policies).run()
    at.number_input(key="compare_reps").set_value(reps).run()
    at.button(key="compare_run").click().run()
    assert not at.exception and not at.error, (at.exception, at.error)
    return at


def _cli_row(lines: list[str], label: str) -> str:
    return next(ln for ln in lines if ln.startswith(f"{label:24}"))[24:]


def test_saturated_policy_is_flagged_as_the_cli_does() -> None:
    """TP1 on the published benchmark saturates D's HBM: the CLI's health row says SATURATED and a note explains
    it; the page's table has the same health column and the same warning."""
    sc = ds.build_scenario(ds.ScenarioInputs(tensor_parallel_size=1))
    rows = compare(sc, ["off", "ttl"], replications=1)
    lines = render_text(rows)
    health = [health_cell(r) for r in rows]
    assert any(h.startswith("SATURATED") for h in health)
    assert _cli_row(lines, "health").split() == " ".join(health).split()
    saturated_note = next(ln for ln in lines if ln.startswith("SATURATED: the health section"))
    at = _compare_page(["off", "ttl"], 1, tp=1)
    shown = at.dataframe[0].value
    assert list(shown["health"]) == health
    assert saturated_note in [w.value for w in at.warning]


def test_held_kv_and_identical_replications_as_the_cli() -> None:
    """The published benchmark has no random part: two replications agree exactly, which the CLI says under its
    ±0 CIs; and it prints P's held KV, which the page must show too."""
    sc = ds.build_scenario(ds.ScenarioInputs())
    rows = compare(sc, ["off", "ttl"], replications=2)
    lines = render_text(rows)
    assert any(IDENTICAL_NOTE in ln for ln in lines)
    at = _compare_page(["off", "ttl"], 2)
    shown = at.dataframe[0].value
    for label in ("held KV mean GiB", "held KV peak GiB"):
        cli = _cli_row(lines, label).split()
        assert [c.replace(" ", "") for c in shown[label]] == ["".join(cli[i:i + 2]) for i in range(0, len(cli), 2)]
    assert any(IDENTICAL_NOTE in w.value for w in at.warning)


def test_advice_table_shows_every_ci_as_the_cli() -> None:
    """``kvplan recommend`` prints every TTFT cell with its 95% CI (±0.0 ms when the replications agree); the Advice
    page showed one only where the CI was not exactly 0, so one cell of three read as uncertain."""
    from kvplan.app import dash_sweeps as sw

    rec = sw.recommendation_dict(ds.build_scenario(ds.ScenarioInputs()), None, None, 2)
    table = sw.advice_view(rec).comparison
    for label in ("TTFT p50", "TTFT p90", "TTFT p99", "TTFT mean"):
        cells = list(table.loc[label])
        assert all(" +/- " in c for c in cells), cells
    assert sw.format_metric("ttft_p50_s", 0.1005, 0.0) == "100.5 ms +/- 0.0 ms"
    assert sw.format_metric("ttft_p50_s", 0.1005, float("nan")) == "100.5 ms"


def test_reproduce_page_gives_the_clis_verdicts(capsys: Any) -> None:
    """``kvplan reproduce`` prints each published point's tolerance and whether it is within it, the profile and the
    turns aggregated; the Reproduce page showed only the relative error."""
    from kvplan.app.cli import main

    assert main(["reproduce", "--model", "qwen3-32b"]) == 0
    cli = capsys.readouterr().out.splitlines()
    verdicts = [ln.split("│")[-2].strip() for ln in cli if ln.startswith("│ qwen3-32b")]
    at = AppTest.from_file(str(DASHBOARD_SCRIPT), default_timeout=TIMEOUT_S)
    at.run()
    at.switch_page("pages/reproduce.py").run()
    assert not at.exception and not at.error
    table = at.dataframe[1].value
    published = table[table["published_ms"].notna()]
    assert len(verdicts) == len(published) > 0
    assert ["yes" if v else "NO" for v in published["within_tolerance"]] == verdicts
    captions = [c.value for c in at.caption]
    notes = [ln for ln in cli if ln.startswith(("qwen3-32b: profile", "aggregation:"))]
    assert len(notes) == 2 and all(line in captions for line in notes), (notes, captions)


def test_compare_table_shows_every_ci_the_cli_prints() -> None:
    """With two replications the CLI prints a CI beside every figure (shares as a range within 0-100%); the page
    showed the times' CIs only. The pure frame against render_text, cell for cell (spaces aside)."""
    from kvplan.app.dash_compare import compare_display_frame

    rows = compare(ds.build_scenario(ds.ScenarioInputs()), ["off", "ttl"], replications=2)
    lines, shown = render_text(rows), compare_display_frame(rows)
    for cli_label, label in (("pinned KV mean GiB", "pinned KV mean GiB"), ("held KV peak GiB", "held KV peak GiB"),
                             ("errors", "errors"), ("preemptions", "preemptions"), ("hit rate %", "hit rate")):
        cli = _cli_row(lines, cli_label).split()
        cells = [c.replace(" ", "").replace("%", "") for c in shown[label]]
        assert cells == ["".join(cli[i:i + 2]) for i in range(0, len(cli), 2)], (cli_label, cli, cells)


def test_explorer_says_which_points_ran_too_short() -> None:
    """500 conversations of the chat preset do not reach steady state at TTL 30 s or 900 s: ``kvplan sweep`` lists
    such points as not_steady (its screen table, plan.sweep.screen_report) and says so; the explorer said nothing."""
    from kvplan.app import dash_sweeps as sw
    from kvplan.plan.sweep import aggregate, grid_from_dict, run_grid, screen_report

    sc = ds.build_scenario(ds.ScenarioInputs(workload="chat", prefill_prefix_caching=True, preset_conversations=500))
    cli = []
    for ttl in (30.0, 900.0):
        g = grid_from_dict({"base": sw.ttl_base(sc, ttl).model_dump(mode="json"),
                            "axes": {"policy.kv_recompute_threshold_tokens": [64]}, "replications": 1}, where="test")
        cli += list(screen_report(g, aggregate(run_grid(g), g))["not_steady"])
    assert all(cli) and len(cli) == 2
    at = AppTest.from_file(str(DASHBOARD_SCRIPT), default_timeout=TIMEOUT_S)
    at.run()
    at.switch_page("pages/explorer.py").run()
    at.selectbox(key="sc_workload").select("chat").run()
    at.number_input(key="sc_preset_conversations").set_value(500).run()
    at.text_input(key="grid_ttls").input("30, 900").run()
    at.text_input(key="grid_thresholds").input("64").run()
    at.checkbox(key="grid_with_advice").set_value(False).run()
    at.button(key="grid_run").click().run()
    assert not at.exception and not at.error
    assert list(at.dataframe[0].value["not_steady"]) == cli
    assert any(w.value.startswith("2 of 2 points ran too short for steady state") for w in at.warning)
