"""Acceptance 5 of issue 13: every file of the hostile-input table, uploaded to the dashboard (Calibration page:
trace uploader + Fit, profile uploader; What-if: trace replay path), shows a one-line error or a result, never
a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest
from test_hostile import CASES

from kvplan.app.cmd_dashboard import DASHBOARD_SCRIPT

TRACES = Path(__file__).parent / "data" / "traces"
MAX_BYTES = 2 * 1024**2  # the 5 MiB scenario is a size test of the CLI; uploads have their own limit


def _files(tmp: Path) -> list[tuple[str, bytes]]:
    out: list[tuple[str, bytes]] = []
    for case in CASES:
        for name, content in case.files.items():
            text = content(tmp) if callable(content) else content
            data = text.encode()
            if len(data) <= MAX_BYTES:
                out.append((f"{case.id.replace(' ', '_')}__{name}", data))
    return out


FILES = _files(Path("/nonexistent"))


def _no_traceback(at: AppTest) -> None:
    assert not at.exception, at.exception
    for e in at.error:
        assert "Traceback" not in e.value and len(e.value.splitlines()) == 1, e.value


@pytest.fixture(scope="module")
def calibration_app() -> AppTest:
    at = AppTest.from_file(str(DASHBOARD_SCRIPT), default_timeout=120)
    at.run()
    at.switch_page("pages/calibration.py").run()
    return at


def test_table_has_files() -> None:
    assert len(FILES) >= 40


@pytest.mark.parametrize("name,data", FILES, ids=[n for n, _ in FILES])
def test_calibration_upload_and_fit_never_traceback(calibration_app: AppTest, name: str, data: bytes) -> None:
    at = calibration_app
    at.file_uploader(key="calib_traces").set_value([(name, data, "application/octet-stream")]).run()
    _no_traceback(at)
    assert at.error or at.dataframe  # the upload is either refused in one line or parsed and listed
    fit = at.button(key="calib_fit")
    if not fit.disabled:
        fit.click().run()
        _no_traceback(at)
    at.file_uploader(key="calib_profile").set_value((name + ".json", data, "application/json")).run()
    _no_traceback(at)
    at.file_uploader(key="calib_profile").set_value(None).run()
    at.file_uploader(key="calib_traces").set_value([]).run()


TRACE_FILES = [(n, d) for n, d in FILES if n.endswith((".csv", ".jsonl"))]


@pytest.mark.parametrize("name,data", TRACE_FILES, ids=[n for n, _ in TRACE_FILES])
def test_whatif_trace_replay_never_tracebacks(name: str, data: bytes) -> None:
    at = AppTest.from_file(str(DASHBOARD_SCRIPT), default_timeout=120)
    at.run()
    at.selectbox(key="sc_workload").select("replay a trace file").run()
    at.file_uploader(key="sc_trace_upload").set_value((name, data, "application/octet-stream")).run()
    _no_traceback(at)
    assert at.error or at.metric  # an error naming the problem, or a result


def test_calibration_uploads_can_be_cleared() -> None:
    at = AppTest.from_file(str(DASHBOARD_SCRIPT), default_timeout=120)
    at.run()
    at.switch_page("pages/calibration.py").run()
    at.file_uploader(key="calib_traces").set_value(
        [("multiturn_small.json", (TRACES / "multiturn_small.json").read_bytes(), "application/json")]).run()
    assert at.dataframe and not at.exception
    at.button(key="calib_clear").click().run()
    assert not at.exception and not at.dataframe  # nothing listed any more
    assert at.session_state["calib_upload_gen"] == 1


def test_advice_page_bounds_the_slo_and_budget_as_the_cli() -> None:
    """in15: the Advice page passed an SLO or HBM budget of 1e308 to recommend(), which the CLI refuses above 1e10 ms
    and 1e9 GiB (``kvplan recommend``): the inputs carry the CLI's bounds."""
    at = AppTest.from_file(str(DASHBOARD_SCRIPT), default_timeout=120)
    at.run()
    at.switch_page("pages/advice.py").run()
    slo, budget = at.number_input(key="advice_slo"), at.number_input(key="advice_budget")
    assert slo.max == 1e10 and budget.max == 1e9
