"""The Compare page's default selection leaves out what ``kvplan compare``'s default list leaves out, and says why:
with the per-role TP the sidebar now sets (P TP2, D TP4, tensor_parallel_size 8), ``aggregated`` has no TP of the
scenario's (plan/capacity.py replica_tp), and pressing Compare on the old default selection failed as a whole."""

from __future__ import annotations

from streamlit.testing.v1 import AppTest

from kvplan.app import dash_compare as dc
from kvplan.app import dash_state as ds
from kvplan.app.cmd_dashboard import DASHBOARD_SCRIPT
from kvplan.plan.compare import default_left_out

TIMEOUT_S = 120


def test_default_selection_is_the_clis_default_list() -> None:
    names = dc.compare_policy_choices()
    published = ds.build_scenario(ds.ScenarioInputs())
    chosen, said = dc.default_policy_selection(published, names)
    assert "aggregated" in chosen and said == [] and "ttl_recommended" not in chosen
    split = ds.build_scenario(ds.ScenarioInputs(prefill_tensor_parallel_size=2, decode_tensor_parallel_size=4))
    chosen, said = dc.default_policy_selection(split, names)
    assert "aggregated" not in chosen and "off" in chosen
    (why,) = [x["why"] for x in default_left_out(split, names) if x["policy"] == "aggregated"]
    assert said == [f"aggregated not selected: {why}"]


def test_compare_page_leaves_aggregated_out_for_a_tp_no_replica_runs() -> None:
    at = AppTest.from_file(str(DASHBOARD_SCRIPT), default_timeout=TIMEOUT_S)
    at.run()
    at.switch_page("pages/compare.py").run()  # AppTest's switch_page does not carry the sidebar's state: set it here
    assert "aggregated" in at.multiselect(key="compare_policies").value
    at.number_input(key="sc_p_tp").set_value(2).run()
    at.number_input(key="sc_d_tp").set_value(4).run()
    assert not at.exception, at.exception
    chosen = at.multiselect(key="compare_policies").value
    assert "aggregated" not in chosen and "off" in chosen, chosen
    captions = [c.value for c in at.caption]
    assert any(c.startswith("aggregated not selected: the scenario's prefill TP 2 and decode TP 4 differ")
               for c in captions), captions
    # selected again by hand: refused in one line naming the fix, as `kvplan compare --policies aggregated` is
    at.multiselect(key="compare_policies").set_value(["off", "aggregated"]).run()
    at.number_input(key="compare_reps").set_value(1).run()
    at.button(key="compare_run").click().run()
    assert not at.exception, at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and len(errors[0].splitlines()) == 1, errors
    assert errors[0].startswith("--policies aggregated: the scenario's prefill TP 2 and decode TP 4 differ")
    assert "set deployment.tensor_parallel_size to 2 or 4" in errors[0]
