"""Reproduce: the published P5en charts (bidirectional KV transfer write-up) against the simulator's."""

from __future__ import annotations

import streamlit as st

from kvplan.app import dash_reproduce as dr
from kvplan.app import dash_state as ds
from kvplan.app import dash_upload as du
from kvplan.errors import KvplanInputError

ds.page_guard()

st.title("Reproduce the published P5en measurements")
st.caption("1P1D p5en TP8, prefix caching off on P, 10 conversations x 5 turns, 2 clients; ON = bidirectional "
           "KV transfer with vLLM's defaults. Published: the write-up's end points; kvplan: the simulated benchmark.")
c1, c2 = st.columns(2)
model = c1.selectbox("model", dr.PUBLISHED_MODELS, key="repro_model")
session = st.session_state.get(ds.SESSION_PROFILE)
choices = ["shipped profile", *(["session profile"] if session else [])]
which = c2.selectbox("profile", choices, key="repro_profile")
profile = du.session_profile_path(session) if which == "session profile" and session else None
try:
    with st.spinner("simulating the published benchmark at every prefix size"):
        rows = dr.reproduce_cached(model, profile)
    figs = dr.reproduce_figures(rows, model)
except KvplanInputError as exc:
    ds.show_error(exc)
    st.stop()
for i, fig in enumerate(figs):
    st.plotly_chart(fig, key=f"repro{i}")
st.markdown("**ON/OFF TTFT ratio at the longest published prompt**")
st.dataframe(dr.reproduce_ratios(rows), hide_index=True)
st.markdown("**Every point** (published end points; kvplan at every prefix size of the sweep)")
st.dataframe(dr.reproduce_table(rows), hide_index=True)
notes = dr.reproduce_notes(rows, profile)
for line in notes:  # a point outside its tolerance is a warning (the CLI's "NO"), the rest notes
    if "outside its" in line:
        st.warning(line)
    else:
        st.caption(line)
