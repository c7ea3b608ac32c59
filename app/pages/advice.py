"""Advice: the recommended TTL, threshold and router TTL with their rationale and a copyable config."""

from __future__ import annotations

import json
import os

import streamlit as st

from kvplan.app import dash_state as ds
from kvplan.app import dash_sweeps as sw
from kvplan.app import figures
from kvplan.errors import KvplanInputError

ds.page_guard()

scenario = ds.scenario_sidebar()
st.title("Advice: decoder_kv_blocks_ttl and kv_recompute_threshold")
if scenario is None:
    st.stop()
st.caption(sw.advice_caption(scenario) + " The advisor (`kvplan recommend --no-policies`, the same call) simulates it "
           "with bidirectional off, at vLLM's defaults and over the TTL grid the screen keeps, each TTL at its own router "
           "TTL, then the threshold candidates at the chosen TTL (seeded replications, common random numbers).")
c1, c2, c3 = st.columns(3)
# the CLI's bounds (kvplan recommend: --slo-ttft-p90-ms <= 1e10, --decode-hbm-budget-gib <= 1e9)
slo = c1.number_input("SLO: TTFT p90 (ms), 0 = none", min_value=0.0, max_value=1e10, value=0.0, step=50.0,
                      key="advice_slo")
budget = c2.number_input("decode HBM budget for retention (GiB), 0 = none", min_value=0.0, max_value=1e9, value=0.0,
                         step=10.0, key="advice_budget")
reps = c3.number_input("replications", min_value=1, max_value=20, value=sw.DEFAULT_REPLICATIONS, key="advice_reps")
args = (float(slo) or None, float(budget) or None, int(reps))
key = sw.advice_key(scenario, *args)
if st.button("Recommend", type="primary", key="advice_run"):
    bar = st.progress(0.0, text="simulating the sweeps behind the advice")
    try:
        st.session_state[key] = sw.recommendation_dict(scenario, *args, progress=sw.progress_adapter(bar, "advice"),
                                                       workers=os.cpu_count() or 1)
    except KvplanInputError as exc:
        ds.show_error(exc)
    bar.empty()
rec = st.session_state.get(key)
if rec is None:
    st.info("Press Recommend to run the sweeps for the sidebar scenario.")
    st.stop()
view = sw.advice_view(rec)
for col, (label, value) in zip(st.columns(len(view.settings)), view.settings, strict=True):
    col.metric(label, value)
for caveat in view.caveats:
    st.warning(caveat)
st.subheader("Why")
st.markdown("\n".join(f"- {line}" for line in view.rationale) or "(no rationale given)")
left, right = st.columns(2)
left.dataframe(view.comparison)
curve = rec.get("ttl_curve") or []
off = (rec.get("bidirectional_off") or {}).get("ttft_mean_s")
right.plotly_chart(figures.ttl_curve(curve, float(rec["decoder_kv_blocks_ttl_s"]), off), key="ttl_curve")
st.subheader("Deployable config")
for title, code in view.configs:
    st.caption(title)
    st.code(code, language="bash", wrap_lines=True)
if view.router_how:
    st.caption(f"Router: {view.router_how}")
with st.expander("Rules and assumptions"):
    st.markdown("\n".join(f"- {line}" for line in view.method))
with st.expander("Full recommendation JSON"):
    st.code(json.dumps(rec, indent=2, sort_keys=True), language="json")
