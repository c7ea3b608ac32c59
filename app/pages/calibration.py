"""Calibration: upload vLLM traces, fit a profile, inspect residuals, download it and use it on the other pages."""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from kvplan.app import dash_state as ds
from kvplan.app import dash_upload as du
from kvplan.app import figures
from kvplan.errors import KvplanInputError
from kvplan.models.arch import MODEL_PRESETS
from kvplan.models.hardware import HARDWARE_PRESETS

ds.page_guard()


def show(where: Any, frame: pd.DataFrame, key: str) -> None:
    """A table with every float at its real precision (six significant digits)."""
    config = {c: st.column_config.NumberColumn(format=du.FLOAT_FORMAT) for c in du.float_columns(frame)}
    where.dataframe(frame, hide_index=True, key=key, column_config=config)


st.title("Calibration")
st.caption(f"Traces in the formats of `kvplan calibrate`: {', '.join(du.CALIBRATE_FORMATS)} "
           f"(format detected from the content; at most {du.MAX_UPLOAD_MB} MiB per file; nothing is evaluated).")
# a new uploader key empties it: earlier uploads do not pile up across fits
gen = int(st.session_state.get("calib_upload_gen", 0))
uploads = st.file_uploader("vLLM traces", accept_multiple_files=True, max_upload_size=du.MAX_UPLOAD_MB,
                           key="calib_traces" if gen == 0 else f"calib_traces_{gen}")
if uploads and st.button("Remove all uploads", key="calib_clear"):
    st.session_state["calib_upload_gen"] = gen + 1
    st.session_state["kvplan_parsed_uploads"] = {}
    st.rerun()
cache = st.session_state.setdefault("kvplan_parsed_uploads", {})
traces, errors = du.parse_uploads([(f.name, f.getvalue()) for f in uploads or []], cache)
for message in errors:
    st.error(message)
if traces:
    st.dataframe(pd.DataFrame([{"file": t.name, "format": t.fmt, "content": t.summary} for t in traces]),
                 hide_index=True)
    for i, t in enumerate(traces):
        pts = du.trace_points(t)
        if pts is not None:
            frame, x, y, colour, xt, yt = pts
            st.plotly_chart(figures.parsed_points(frame, x, y, colour, f"{t.name} ({t.fmt})", xt, yt), key=f"pts{i}")

st.subheader("Fit a profile")
c1, c2, c3 = st.columns(3)
model = c1.selectbox("model", list(MODEL_PRESETS), key="calib_model")
hardware = c2.selectbox("hardware", list(HARDWARE_PRESETS), key="calib_hardware")
tp = c3.selectbox("tensor parallel size (measured)", du.TP_CHOICES, index=len(du.TP_CHOICES) - 1, key="calib_tp")
if st.button("Fit", type="primary", disabled=not traces, key="calib_fit"):
    with st.spinner("fitting"):
        try:
            st.session_state["kvplan_fitted_profile"] = du.profile_json(du.fit_profile(traces, model, hardware, int(tp)))
        except KvplanInputError as exc:
            ds.show_error(exc)

st.subheader("Or upload a profile JSON")
prof_upload = st.file_uploader("kvplan profile (.json)", type=["json"], max_upload_size=8, key="calib_profile")
if prof_upload is not None:
    try:
        st.session_state["kvplan_fitted_profile"] = du.profile_json(
            du.load_uploaded_profile(prof_upload.name, prof_upload.getvalue()))
    except KvplanInputError as exc:
        ds.show_error(exc)

fitted = st.session_state.get("kvplan_fitted_profile")
if fitted:
    profile = du.profile_from_json(fitted)
    st.markdown(f"**Profile `{profile.name}`**: {profile.model} on {profile.hardware}, TP{profile.tensor_parallel_size}, "
                f"status {profile.status}")
    if profile.status == "unreliable":
        reasons = profile.fit_report.get("unreliable_reasons") or ["see the fit report"]
        st.warning("This profile is **unreliable** (its fit failed the self-check); simulations refuse it unless "
                   "allowed: " + "; ".join(str(r) for r in reasons))
    show(st, du.parameter_table(profile), "calib_params")
    check = du.self_check_table(profile)
    if check is not None:
        st.markdown("**Self-check**: the fitted profile simulated on the measured run(s); means within "
                    f"{float(profile.fit_report.get('self_check_tolerance', 0.15)):.0%} gate the status")
        show(st, check, "calib_self_check")
    held_out = du.held_out_table(profile)
    if held_out is not None:
        st.markdown("**Held-out seeds**: the fitted profile simulated with seeds the fit did not use; their mean "
                    "gates the status too")
        show(st, held_out, "calib_held_out")
    left, right = st.columns(2)
    residuals = du.residual_frame(profile)
    if residuals is not None:
        left.plotly_chart(figures.residual_scatter(residuals), key="residuals")
    mape = du.mape_table(profile)
    if mape is not None:
        right.markdown("**Error report**: mean absolute percentage error per metric")
        show(right, mape, "calib_mape")
    st.markdown("\n".join(f"- {note}" for note in du.report_notes(profile)))
    with st.expander("Full fit report (JSON)"):
        st.json(profile.fit_report or {"note": "this profile has no fit report"})
    c1, c2 = st.columns(2)
    c1.download_button("Download profile JSON", fitted, file_name=f"{du.safe_name(profile.name)}.json",
                       mime="application/json", key="calib_download")
    if c2.button("Use this profile on the other pages", key="calib_use"):
        st.session_state[ds.SESSION_PROFILE] = fitted
    if st.session_state.get(ds.SESSION_PROFILE) == fitted:
        st.success(f"In use: choose 'session: {profile.name}' as the sidebar profile on What-if, Explorer and Advice.")
