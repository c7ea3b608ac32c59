"""HTML outputs are reproducible and offline: the same figures give the same bytes (fixed div ids, not plotly's random
UUIDs) and plotly.js is embedded (no CDN: kvplan runs where there is no internet)."""

from __future__ import annotations

from pathlib import Path

import plotly.graph_objects as go

from kvplan.calibration.figures import write_html


def test_the_same_figures_write_the_same_bytes(tmp_path: Path) -> None:
    figs = [go.Figure(go.Scatter(x=[1, 2], y=[3, 4])), go.Figure(go.Bar(x=["a"], y=[1]))]
    a, b = tmp_path / "a.html", tmp_path / "b.html"
    write_html(figs, a)
    write_html(figs, b)
    assert a.read_bytes() == b.read_bytes()
    text = a.read_text()
    assert 'id="kvplan-figure-0"' in text and 'id="kvplan-figure-1"' in text and 'src="https://cdn' not in text


def test_workload_show_html_embeds_plotly(tmp_path: Path) -> None:
    from kvplan.app.cli import main

    trace = Path(__file__).parent / "data" / "traces" / "mooncake_small.jsonl"
    outs = [tmp_path / "w1.html", tmp_path / "w2.html"]
    for out in outs:
        assert main(["workload", "show", str(trace), "--html", str(out)]) == 0
    assert outs[0].read_bytes() == outs[1].read_bytes()
    assert 'src="https://cdn' not in outs[0].read_text()  # plotly.js embedded, not fetched
