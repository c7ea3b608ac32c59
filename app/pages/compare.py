"""Compare: the serving alternatives side by side at equal GPUs, workload and seeds (``kvplan compare``)."""

from __future__ import annotations

import json

import streamlit as st

from kvplan.app import dash_compare as dc
from kvplan.app import dash_state as ds
from kvplan.app import dash_sweeps as sw
from kvplan.app import figures
from kvplan.errors import KvplanInputError
from kvplan.plan import compare as cmp
from kvplan.plan.pricing import COST_BASIS

ds.page_guard()

scenario = ds.scenario_sidebar()
st.title("Compare: retention off, TTL, lease, evictable pins, offload, aggregated serving")
if scenario is None:
    st.stop()
st.caption(dc.compare_caption(scenario))
names = dc.compare_policy_choices()
default, left_out = dc.default_policy_selection(scenario, names)  # as `kvplan compare`'s default list
for line in left_out:
    st.caption(line)
# a keyed multiselect keeps its value when its default changes: a sidebar change that makes a selected policy
# impossible (per-role TP with no TP for aggregated replicas) drops it from the selection, as from the default
dc.drop_left_out(st.session_state, scenario, names)
c1, c2 = st.columns([3, 1])
chosen = c1.multiselect("policies", names, default=default,
                        key="compare_policies",
                        help="aggregated:prefix_aware / aggregated:session_affinity route the aggregated replicas "
                             "KV-aware (llm-d style) instead of the sidebar's routing.")
reps = c2.number_input("replications", min_value=1, max_value=20, value=sw.DEFAULT_REPLICATIONS, key="compare_reps")
key = json.dumps([ds.scenario_key(scenario), chosen, int(reps)])
if st.button("Compare", type="primary", key="compare_run"):
    bar = st.progress(0.0, text="simulating every policy")
    try:
        advice = st.session_state.get(sw.advice_key(scenario, None, None, int(reps)))  # the Advice page's, if run
        try:
            advice = cmp.reusable_recommendation(advice, scenario, int(reps)) if advice is not None else None
        except KvplanInputError:  # not the one compare would compute: compare runs the advisor itself
            advice = None
        st.session_state[key] = cmp.compare(scenario, chosen, replications=int(reps),
                                            progress=sw.progress_adapter(bar, "compare"), recommendation=advice)
    except KvplanInputError as exc:
        ds.show_error(exc)
    bar.empty()
rows = st.session_state.get(key)
if rows is None:
    st.info("Choose policies and press Compare.")
    st.stop()
best = cmp.best_policy(rows)
st.markdown(dc.best_policy_text(best))
warnings, notes = dc.compare_warnings(rows)
for line in warnings:
    st.warning(line)
st.dataframe(dc.compare_display_frame(rows), hide_index=True)
for line in notes:
    st.caption(line)
st.caption(COST_BASIS)
st.plotly_chart(figures.compare_figure(rows), key="compare_figure")
st.markdown("\n".join(f"- **{r['policy']}**: {r['description']}" + "".join(f"; {n}" for n in r["notes"]) for r in rows))
with st.expander("best-policy rule"):
    st.write(best["rule"])
with st.expander("JSON (as `kvplan compare --json`)"):
    st.code(cmp.compare_json(rows), language="json")
