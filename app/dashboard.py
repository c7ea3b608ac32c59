"""kvplan's Streamlit dashboard: ``streamlit run app/dashboard.py`` or ``kvplan dashboard [--port N]``.

The entry point only declares the pages (``st.navigation``); each page under ``app/pages/`` lays out
what ``app/dash_state.py`` computes with the public API and ``app/figures.py`` draws.
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

import kvplan.sim.engine  # noqa: F401 - first: the engine installs the compiled hot path (sim/engine.py)

PAGES_DIR = Path(__file__).resolve().parent / "pages"

#: (file, title, icon, url path) of every page, in menu order; the first is the default.
PAGES: tuple[tuple[str, str, str, str], ...] = (
    ("whatif.py", "What-if", ":material/tune:", "whatif"),
    ("explorer.py", "TTL x threshold explorer", ":material/grid_on:", "explorer"),
    ("calibration.py", "Calibration", ":material/upload_file:", "calibration"),
    ("reproduce.py", "Reproduce P5en", ":material/compare:", "reproduce"),
    ("advice.py", "Advice", ":material/lightbulb:", "advice"),
    ("compare.py", "Compare policies", ":material/view_column:", "compare"),
)

st.set_page_config(page_title="kvplan", page_icon=":material/swap_horiz:", layout="wide")
navigation = st.navigation(
    [
        st.Page(PAGES_DIR / file, title=title, icon=icon, url_path=url, default=(i == 0))
        for i, (file, title, icon, url) in enumerate(PAGES)
    ]
)
navigation.run()
