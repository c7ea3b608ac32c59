"""The dashboard's sidebar sets per-role tensor parallel sizes and ``max_num_seqs``, validated as the YAML fields are.

Pure part: :func:`kvplan.app.dash_state.build_scenario` from :class:`ScenarioInputs`; page part: Streamlit's
``AppTest`` (no browser), the What-if page's figures checked against ``kvplan.sim.api.run`` of the same scenario.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from streamlit.testing.v1 import AppTest

from kvplan.app import dash_state as ds
from kvplan.app.cmd_dashboard import DASHBOARD_SCRIPT
from kvplan.errors import KvplanInputError
from kvplan.sim.api import run
from kvplan.sim.defaults import published_benchmark
from kvplan.sim.scenario import load_scenario
from kvplan.units import human_s

TIMEOUT_S = 120


def test_build_scenario_sets_per_role_tp_and_max_num_seqs() -> None:
    sc = ds.build_scenario(ds.ScenarioInputs(prefill_tensor_parallel_size=4, decode_tensor_parallel_size=8,
                                             max_num_seqs=16))
    dep = sc.deployment
    assert (dep.prefill_tensor_parallel_size, dep.decode_tensor_parallel_size, dep.max_num_seqs) == (4, 8, 16)
    assert ds.tp_text(sc) == "P TP4 / D TP8, max_num_seqs 16"
    # not set: the YAML fields' defaults and the workload's own max_num_seqs (the published benchmark's 8)
    default = ds.build_scenario(ds.ScenarioInputs())
    assert default == published_benchmark()
    assert default.deployment.prefill_tensor_parallel_size is None and default.deployment.max_num_seqs == 8
    preset = ds.build_scenario(ds.ScenarioInputs(workload="chat", max_num_seqs=32, preset_conversations=10))
    assert preset.deployment.max_num_seqs == 32


@pytest.mark.parametrize(("field", "inputs", "message"), [
    ("prefill_tensor_parallel_size", {"prefill_tensor_parallel_size": 65}, "less than or equal to 64"),
    ("decode_tensor_parallel_size", {"decode_tensor_parallel_size": 128}, "less than or equal to 64"),
    ("max_num_seqs", {"max_num_seqs": 70_000}, "less than or equal to 65536"),
    ("max_num_seqs", {"max_num_seqs": 10_000}, "max_num_batched_tokens (8192) must be >= max_num_seqs (10000)"),
])
def test_bad_values_are_the_yaml_fields_errors(tmp_path: Path, field: str, inputs: dict[str, int],
                                               message: str) -> None:
    """The same value in a scenario file and in the sidebar: the same one-line refusal, naming the field."""
    with pytest.raises(KvplanInputError) as dash:
        ds.build_scenario(ds.ScenarioInputs(**inputs))  # type: ignore[arg-type]
    data = published_benchmark().model_dump(mode="json", exclude_none=True)
    data["deployment"][field] = inputs[field]
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(KvplanInputError) as cli:
        load_scenario(path)
    for exc in (dash.value, cli.value):
        text = str(exc)
        assert len(text.splitlines()) == 1 and message in text and field in text, text


def _app() -> AppTest:
    at = AppTest.from_file(str(DASHBOARD_SCRIPT), default_timeout=TIMEOUT_S)
    at.run()
    assert not at.exception, at.exception
    return at


def test_whatif_page_runs_the_per_role_tp_and_max_num_seqs_set_in_the_sidebar() -> None:
    at = _app()
    at.number_input(key="sc_p_tp").set_value(4).run()
    at.number_input(key="sc_d_tp").set_value(8).run()
    at.number_input(key="sc_max_num_seqs").set_value(2).run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    expected = run(ds.build_scenario(ds.ScenarioInputs(prefill_tensor_parallel_size=4, decode_tensor_parallel_size=8,
                                                       max_num_seqs=2))).summary
    assert any("P TP4 / D TP8, max_num_seqs 2" in c.value for c in at.caption), [c.value for c in at.caption]
    m = {x.label: x for x in at.metric}
    assert m["TTFT mean"].value == human_s(expected["ttft_mean_s"])
    # the settings change the run: at the published benchmark's defaults TTFT differs
    assert expected["ttft_mean_s"] != run(published_benchmark()).summary["ttft_mean_s"]


def test_sidebar_refuses_a_per_role_tp_no_scenario_file_could_hold() -> None:
    at = _app()
    at.number_input(key="sc_d_tp").set_value(65).run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and len(errors[0].splitlines()) == 1, errors
    assert "deployment.decode_tensor_parallel_size" in errors[0] and "less than or equal to 64" in errors[0]
