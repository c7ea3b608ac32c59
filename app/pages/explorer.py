"""TTL x threshold explorer: TTFT p90 and pinned decode HBM over a grid, recommended point and defaults marked."""

from __future__ import annotations

import streamlit as st

from kvplan.app import dash_state as ds
from kvplan.app import figures
from kvplan.errors import KvplanInputError

scenario = ds.scenario_sidebar()
st.title("TTL x threshold explorer")
st.caption("Every grid point is the sidebar scenario with bidirectional on, that TTL and threshold, and the router "
           "TTL capped at the decode TTL. Points are simulated on the button (cached per scenario).")
if scenario is None:
    st.stop()
c1, c2 = st.columns(2)
ttl_text = c1.text_input("decoder_kv_blocks_ttl values (s)", ds.DEFAULT_GRID_TTLS, key="grid_ttls")
th_text = c2.text_input("kv_recompute_threshold values (tokens)", ds.DEFAULT_GRID_THRESHOLDS, key="grid_thresholds")
with_advice = st.checkbox("also compute the recommendation (kvplan.sim.advice)", value=ds.recommend_fn() is not None,
                          disabled=ds.recommend_fn() is None, key="grid_with_advice")
try:
    points = ds.grid_points(scenario, ds.parse_number_list(ttl_text, "TTL values"),
                            ds.parse_number_list(th_text, "threshold values", integer=True))
except KvplanInputError as exc:
    ds.show_error(exc)
    st.stop()
grid_key = ds.grid_state_key(points)
if st.button(f"Run the grid ({len(points)} points)", type="primary", key="grid_run"):
    bar = st.progress(0.0, text="simulating the grid")
    try:
        st.session_state[grid_key] = ds.grid_frame(points, progress=lambda f, t: bar.progress(f, text=t))
        if with_advice:
            key = ds.advice_key(scenario, None, None, ds.DEFAULT_REPLICATIONS)
            st.session_state[key] = ds.recommendation_dict(
                scenario, None, None, ds.DEFAULT_REPLICATIONS, progress=ds.progress_adapter(bar, "recommendation"))
    except KvplanInputError as exc:
        ds.show_error(exc)
    bar.empty()

grid = st.session_state.get(grid_key)
if grid is None:
    st.info("Set the grid and press the button.")
    st.stop()
marks = ds.grid_marks(scenario, st.session_state.get(ds.advice_key(scenario, None, None, ds.DEFAULT_REPLICATIONS)))
if ds.recommend_fn() is None:
    st.info("Recommended point: not available yet (kvplan.sim.advice is not in this build); vLLM defaults marked.")
left, right = st.columns(2)
left.plotly_chart(figures.grid_heatmap(grid, "ttft_p90_s", "TTFT p90 (ms), turns without error", "ms", marks,
                                       scale=1000.0, reverse=True), key="heat_ttft")
right.plotly_chart(figures.grid_heatmap(grid, "pinned_kv_gib_mean", "Pinned decode KV, time-weighted mean (GiB)",
                                        "GiB", marks, reverse=True), key="heat_hbm")
st.dataframe(grid, hide_index=True)
