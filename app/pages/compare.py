"""Compare: the serving alternatives side by side at equal GPUs, workload and seeds (``kvplan compare``)."""

from __future__ import annotations

import json

import streamlit as st

from kvplan.app import dash_state as ds
from kvplan.app import dash_sweeps as sw
from kvplan.app import figures
from kvplan.errors import KvplanInputError
from kvplan.sim import compare as cmp

ds.page_guard()

scenario = ds.scenario_sidebar()
st.title("Compare: retention off, TTL, lease, evictable pins, offload, aggregated serving")
if scenario is None:
    st.stop()
st.caption("kvplan.sim.compare.compare simulates the sidebar scenario under each policy on the same GPUs, workload and "
           "seeds (seed + k for replication k). ttl_recommended reuses the Advice page's recommendation for this "
           "scenario (no SLO, no budget, the same replications) when there is one, else first runs the advisor's "
           "sweeps (slow).")
names = [n for n in cmp.DEFAULT_POLICIES if cmp.implemented(n)]
c1, c2 = st.columns([3, 1])
chosen = c1.multiselect("policies", names, default=[n for n in names if n != "ttl_recommended"], key="compare_policies")
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
st.dataframe(cmp.compare_frame(rows), hide_index=True)
st.plotly_chart(figures.compare_figure(rows), key="compare_figure")
st.markdown("\n".join(f"- **{r['policy']}**: {r['description']}" + "".join(f"; {n}" for n in r["notes"]) for r in rows))
with st.expander("JSON (as `kvplan compare --json`)"):
    st.code(cmp.compare_json(rows), language="json")
