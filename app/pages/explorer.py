"""TTL x threshold explorer: TTFT p90 and pinned decode HBM over a grid, recommended point and defaults marked."""

from __future__ import annotations

import os

import streamlit as st

from kvplan.app import dash_state as ds
from kvplan.app import dash_sweeps as sw
from kvplan.app import figures
from kvplan.errors import KvplanInputError

ds.page_guard()

scenario = ds.scenario_sidebar()
st.title("TTL x threshold explorer")
st.caption("Every grid point is the sidebar scenario with bidirectional on, that decoder_kv_blocks_ttl and "
           "kv_recompute_threshold, and a router TTL that expires before the blocks (TTL - 5 s margin - 1 s, as the "
           "advisor sets it), simulated (as `kvplan sweep` does) when you press the button.")
if scenario is None:
    st.stop()
c1, c2 = st.columns(2)
ttl_text = c1.text_input("decoder_kv_blocks_ttl values (s)", sw.DEFAULT_GRID_TTLS, key="grid_ttls")
th_text = c2.text_input("kv_recompute_threshold values (tokens)", sw.DEFAULT_GRID_THRESHOLDS, key="grid_thresholds")
c1, c2, c3 = st.columns(3)
reps = c1.number_input("replications per point", min_value=1, max_value=10, value=1, key="grid_reps")
workers = c2.number_input("worker processes", min_value=1, max_value=os.cpu_count() or 1, value=1, key="grid_workers",
                          help="1 runs in this process (fastest for small scenarios).")
with_advice = c3.checkbox("also compute the recommendation", value=True,
                          key="grid_with_advice", help="What `kvplan recommend` says for the sidebar scenario.")
try:
    spec = sw.grid_spec(scenario, sw.parse_number_list(ttl_text, "TTL values"),
                        sw.parse_number_list(th_text, "threshold values", integer=True), int(reps))
except KvplanInputError as exc:
    ds.show_error(exc)
    st.stop()
advice_key = sw.advice_key(scenario, None, None, sw.DEFAULT_REPLICATIONS)
if st.button(f"Run the grid ({spec.n_runs} simulations)", type="primary", key="grid_run"):
    bar = st.progress(0.0, text="simulating the grid")
    try:
        st.session_state[spec.state_key] = sw.grid_frame(spec, lambda f, t: bar.progress(f, text=t), int(workers))
        if with_advice:
            st.session_state[advice_key] = sw.recommendation_dict(
                scenario, None, None, sw.DEFAULT_REPLICATIONS, progress=sw.progress_adapter(bar, "recommendation"))
    except KvplanInputError as exc:
        ds.show_error(exc)
    bar.empty()

grid = st.session_state.get(spec.state_key)
if grid is None:
    st.info("Set the grid and press the button.")
    st.stop()
if (short := sw.not_steady_warning(grid)) is not None:
    st.warning(short)
marks = sw.grid_marks(scenario, st.session_state.get(advice_key))
ttft_stat = st.segmented_control("TTFT statistic", list(sw.TTFT_STATS), default="p90", key="grid_ttft_stat",
                                 help="The benchmark's p90 is set by its first turns (always a miss); mean shows reuse.")
ttft_col = sw.TTFT_STATS.get(str(ttft_stat), "ttft_p90_s")
left, right = st.columns(2)
left.plotly_chart(figures.grid_heatmap(grid, ttft_col, f"TTFT {ttft_stat or 'p90'} (ms), turns without error", "ms",
                                       marks, scale=1000.0, reverse=True), key="heat_ttft")
right.plotly_chart(figures.grid_heatmap(grid, "pinned_kv_gib_mean", "Pinned decode KV, time-weighted mean (GiB)",
                                        "GiB", marks, reverse=True), key="heat_hbm")
st.dataframe(sw.grid_display(grid), hide_index=True)
