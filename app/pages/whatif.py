"""What-if: one scenario against the vLLM defaults and against bidirectional transfer off."""

from __future__ import annotations

import math

import streamlit as st

from kvplan.app import dash_state as ds
from kvplan.app import figures
from kvplan.errors import KvplanInputError
from kvplan.sim.summary import profile_label

ds.page_guard()

scenario = ds.scenario_sidebar()
st.title("What-if: bidirectional KV transfer")
if scenario is None:
    st.stop()
POLICIES = {"as in the sidebar": None, "lease": "lease", "ttl_evictable": "ttl_evictable", "offload": "offload",
            "aggregated (same GPUs)": "aggregated", "off": "off"}
choice = st.selectbox("serving policy (kvplan compare's variants of the sidebar scenario)", list(POLICIES),
                      key="whatif_policy")
sidebar = scenario
try:
    name = POLICIES[choice]
    if name is not None:
        from kvplan.plan.compare import policy_run
        from kvplan.sim.scenario import with_overrides

        scenario = with_overrides(scenario, policy_run(name, scenario).overrides)
    w = ds.whatif(scenario, sidebar)  # the deltas against the sidebar's deployment at vLLM's defaults
except KvplanInputError as exc:
    ds.show_error(exc)
    st.stop()

s = w.current.summary
dep = scenario.deployment
aggregated = dep.mode == "aggregated"
shape = f"{dep.replicas} aggregated replicas" if aggregated else f"{dep.prefill_nodes}P{dep.decode_nodes}D"
st.caption(
    f"{s['model']} on {s['hardware']}, {shape} "
    f"{ds.tp_text(scenario)}, {profile_label(s)}; "
    f"{s['turns']} turns in {s['conversations']} conversations. Deltas: this scenario minus the same one at "
    f"{ds.defaults_text()}."
)
warnings, notes = ds.health_warnings(s)
for line in ds.context_limit_lines(s):  # the workload the run replayed is not the one asked for: said first
    st.warning(line)
for line in ds.no_effect_lines(w.current.notes):  # a sidebar setting the run ignored (the CLI's "warning:" lines)
    st.warning(line)
for line in warnings:
    st.warning(line)
for line in notes:
    st.caption(line)
for line in ds.run_notes(s):  # the CLI's "note:" lines on the replayed trace and the percentiles
    st.caption(f"note: {line}")
if (unreliable := ds.unreliable_profile_warning(s)) is not None:
    st.warning(unreliable)
if s.get("extrapolated"):
    st.warning("Profile not calibrated on this deployment: " + "; ".join(
        f"{k}: {v}" for k, v in sorted((s.get("profile_components") or {}).items())))
metrics = ds.headline_metrics(s, w.defaults.summary)
per_row = math.ceil(len(metrics) / 2)  # two rows: times first, then reuse, errors and pinned KV
for col, m in zip(st.columns(per_row) + st.columns(per_row), metrics, strict=False):
    col.metric(m.label, m.value, m.delta, delta_color=m.delta_color, help=m.help,
               delta_arrow="auto" if m.delta else "off")

on_s, off_s = w.on.summary, w.off.summary
if aggregated:  # no P->D or D->P transfer: bidirectional on and off are the same run
    st.info("Aggregated serving moves no KV between P and D nodes: bidirectional transfer ON and OFF do not apply "
            "(the ON/OFF distribution below is one run twice).")
else:
    st.info(ds.on_off_text(on_s, off_s))
left, right = st.columns(2)
left.plotly_chart(figures.ttft_distribution({"ON": w.on.turns, "OFF": w.off.turns}), key="ttft_cdf")
right.plotly_chart(figures.ttft_split(w.current.turns), key="ttft_split")
left, right = st.columns(2)
left.plotly_chart(
    figures.decision_mix({"this scenario": s, "vLLM defaults": w.defaults.summary}), key="decision_mix"
)
right.plotly_chart(
    figures.pinned_kv(w.current.pinned, float(s["decode_kv_capacity_gib"]), float(s["sim_end_s"])), key="pinned"
)
with st.expander("Assumptions"):
    st.markdown("\n".join(f"- {note}" for note in w.current.notes) or "(none)")
# the per-turn table is heavy for the browser: drawn only on request, so widget changes re-render fast
if st.toggle("show the per-turn records", key="whatif_turns"):
    st.dataframe(w.current.turns, hide_index=True)
st.caption(f"Four simulations (this scenario, ON, OFF, vLLM defaults), each cached on its scenario: "
           f"{w.elapsed_s * 1000:.0f} ms for this render.")
