"""The dashboard in a real browser: ``streamlit run`` on a free localhost port, driven by Playwright in
Debian's headless Chromium (``/usr/bin/chromium``; Playwright never downloads a browser here).

Skips only when ``/usr/bin/chromium`` or the ``playwright`` package is absent; CI installs both
(``apt-get install -y chromium`` and ``pip install playwright``, the ``dev`` extra). Set
``KVPLAN_DOCS_SCREENSHOT=1`` to also write the README's screenshot to ``docs/whatif.png``.
"""

from __future__ import annotations

import importlib.util
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvplan.app import dash_state as ds
from kvplan.app.cmd_dashboard import running_dashboard

CHROMIUM = Path("/usr/bin/chromium")
# Headless flags that work on a closed network and as root (see the machine notes): no sandbox, no GPU,
# no background connections Chromium would try (and fail) to make.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
ROOT = Path(__file__).resolve().parents[1]
HEALTH_TIMEOUT_S = 60.0
RENDER_TIMEOUT_MS = 30_000
RERENDER_TIMEOUT_MS = 10_000

if not CHROMIUM.exists():
    pytest.skip(f"{CHROMIUM} is absent (apt-get install -y chromium)", allow_module_level=True)
if importlib.util.find_spec("playwright") is None:
    pytest.skip("the playwright package is absent (pip install playwright)", allow_module_level=True)

from playwright.sync_api import Browser, FilePayload, Page, expect, sync_playwright  # noqa: E402
from playwright.sync_api import TimeoutError as PlaywrightTimeout  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``streamlit run`` of the dashboard (the command ``kvplan dashboard`` runs) on a free localhost port."""
    log = tmp_path_factory.mktemp("streamlit") / "server.log"
    with running_dashboard(log=log, timeout_s=HEALTH_TIMEOUT_S) as url:
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1440, "height": 1700})
    try:
        yield context.new_page()
    finally:
        context.close()


def _metric(page: Page, label: str) -> Any:
    return page.get_by_test_id("stMetric").filter(has_text=label).get_by_test_id("stMetricValue")


def _expected(**inputs: Any) -> dict[str, str]:
    """What the what-if page must show for these sidebar inputs, from the model in this process."""
    w = ds.whatif(ds.build_scenario(ds.ScenarioInputs(**inputs)))
    return {m.label: m.value for m in ds.headline_metrics(w.current.summary, w.defaults.summary)}


def _choose_workload(page: Page, option: str) -> None:
    """Pick ``option`` in the sidebar's workload box once the page's first run is over: a click while it still ran
    was undone by the rerun's redraw and the option never appeared (a clean-clone CI run timed out there once); the
    box is opened again if the option does not show."""
    expect(_metric(page, "TTFT mean")).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    page.wait_for_function("() => !document.querySelector('[data-stale=true]')", timeout=RENDER_TIMEOUT_MS)
    box = page.get_by_test_id("stSidebar").get_by_test_id("stSelectbox").filter(has_text="workload").first
    option_el = page.get_by_role("option", name=option)
    for _ in range(3):
        box.click()
        try:
            option_el.click(timeout=RERENDER_TIMEOUT_MS)
            return
        except PlaywrightTimeout:
            continue
    raise AssertionError(f"the workload box never offered {option!r}")


def _wait_charts(page: Page, n: int) -> None:
    page.wait_for_function(
        "n => document.querySelectorAll('[data-testid=stPlotlyChart] .main-svg').length >= n", arg=n,
        timeout=RENDER_TIMEOUT_MS,
    )
    # nothing left from the previous run (Streamlit marks stale elements while a rerun is under way)
    page.wait_for_function("() => !document.querySelector('[data-stale=true]')", timeout=RENDER_TIMEOUT_MS)


def test_deep_link_on_a_fresh_server_uses_the_dashboard_navigation(server: str, page: Page) -> None:
    # first request of the server process, straight to a page URL (see dash_state.page_guard)
    page.goto(f"{server}/explorer")
    expect(page.get_by_role("heading", name="TTL x threshold explorer")).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    nav = page.get_by_test_id("stSidebarNav")
    expect(nav.get_by_text("TTL x threshold explorer", exact=True)).to_be_visible()
    expect(nav.get_by_text("What-if", exact=True)).to_be_visible()
    expect(nav.get_by_text("explorer", exact=True)).to_have_count(0)


def test_whatif_ttl_change_rerenders(server: str, page: Page, tmp_path: Path) -> None:
    page.goto(f"{server}/")
    default = _expected()
    expect(_metric(page, "Hit rate")).to_have_text(default["Hit rate"], timeout=RENDER_TIMEOUT_MS)
    expect(_metric(page, "TTFT mean")).to_have_text(default["TTFT mean"])
    _wait_charts(page, 4)
    page.screenshot(path=str(tmp_path / "whatif.png"))
    if os.environ.get("KVPLAN_DOCS_SCREENSHOT"):
        (ROOT / "docs").mkdir(exist_ok=True)
        page.screenshot(path=str(ROOT / "docs" / "whatif.png"))

    ttl = page.get_by_role("spinbutton", name="decoder_kv_blocks_ttl (s)", exact=True)
    ttl.fill("1")
    t0 = time.perf_counter()
    ttl.press("Enter")
    changed = _expected(ttl_s=1.0)
    assert changed["Hit rate"] == "0.0%"
    expect(_metric(page, "Hit rate")).to_have_text(changed["Hit rate"], timeout=RERENDER_TIMEOUT_MS)
    expect(_metric(page, "TTFT mean")).to_have_text(changed["TTFT mean"], timeout=RERENDER_TIMEOUT_MS)
    expect(_metric(page, "Errors")).to_have_text(changed["Errors"], timeout=RERENDER_TIMEOUT_MS)
    _wait_charts(page, 4)
    elapsed = time.perf_counter() - t0
    delta = page.get_by_test_id("stMetric").filter(has_text="Hit rate").get_by_test_id("stMetricDelta")
    expect(delta).to_contain_text("-100.0 pp")
    page.screenshot(path=str(tmp_path / "whatif_ttl1.png"))
    assert (tmp_path / "whatif_ttl1.png").stat().st_size > 10_000
    print(f"re-render after the TTL change: {elapsed:.2f} s")


def test_malformed_upload_shows_error_and_app_keeps_working(server: str, page: Page, tmp_path: Path) -> None:
    page.goto(f"{server}/calibration")
    dropzone = page.get_by_test_id("stFileUploaderDropzoneInput").first
    broken: FilePayload = {"name": "broken.json", "mimeType": "application/json", "buffer": b'{"date": "20'}
    dropzone.set_input_files([broken])
    error = page.get_by_test_id("stAlertContentError").first
    expect(error).to_contain_text("broken.json", timeout=RERENDER_TIMEOUT_MS)
    assert len(error.inner_text().strip().splitlines()) == 1
    page.screenshot(path=str(tmp_path / "calibration_error.png"))
    page.get_by_test_id("stSidebarNav").get_by_text("What-if", exact=True).click()
    expect(_metric(page, "Hit rate")).to_have_text(_expected()["Hit rate"], timeout=RENDER_TIMEOUT_MS)


def test_advice_recommended_ttl_marker_sits_at_its_ttl_on_the_log_axis(page: Page, tmp_path: Path) -> None:
    """The dashed 'recommended' line of the Advice chart is drawn at the recommended TTL (30 s), not at
    log10(30) ~ 1.5 s, and its label sits on it (plotly.js renders the chart in the browser)."""
    from kvplan.app import figures

    fig = figures.ttl_curve([{"ttl_s": t, "ttft_mean_s": 0.3 - t / 3000, "pinned_kv_gib_mean": t / 10}
                             for t in (1, 10, 30, 120, 480, 900)], chosen_ttl_s=30, baseline_ttft_mean_s=0.35)
    html = tmp_path / "advice.html"
    html.write_text(fig.to_html(include_plotlyjs=True, full_html=True, div_id="chart"))
    page.goto(html.as_uri())
    page.wait_for_function("() => document.querySelector('#chart .main-svg')", timeout=RENDER_TIMEOUT_MS)
    got = page.evaluate("""() => {
        const gd = document.getElementById('chart');
        const xa = gd._fullLayout.xaxis;
        const line = [...gd.querySelectorAll('.shapelayer path')].map(p => p.getBBox())
            .find(b => b.width < 1 && b.height > 50);
        const note = [...gd.querySelectorAll('.annotation')].find(a => a.textContent.includes('recommended'));
        const nb = note.getBoundingClientRect(), svg = gd.querySelector('.main-svg').getBoundingClientRect();
        return {line_x: line.x, want_x: xa._offset + xa.d2p(30), bad_x: xa._offset + xa.d2p(Math.log10(30)),
                note_right: nb.right - svg.left};
    }""")
    assert abs(got["line_x"] - got["want_x"]) < 2, got
    assert abs(got["line_x"] - got["bad_x"]) > 20, got
    assert abs(got["note_right"] - got["want_x"]) < 12, got  # the label ends at the line (xanchor right)


def test_compare_chart_bars_sit_at_their_values(page: Page, tmp_path: Path) -> None:
    """The Compare chart draws each policy's TTFT p90 bar up to its value (ms) with its 95% CI whisker, in
    policy order, and the hit-rate panel in percent (plotly.js renders the chart in the browser)."""
    from kvplan.app import figures

    rows = [
        {"policy": "off", "gpus": 16, "ttft_p50_s": 0.10, "ttft_p90_s": 0.30, "ttft_p90_s_ci95": 0.02,
         "ttft_p99_s": 0.5, "hit_rate": 0.0, "pinned_kv_gib_mean": 0.0, "pinned_kv_gib_peak": 0.0, "tpot_mean_s": 0.005},
        {"policy": "ttl", "gpus": 16, "ttft_p50_s": 0.08, "ttft_p90_s": 0.20, "ttft_p90_s_ci95": 0.01,
         "ttft_p99_s": 0.4, "hit_rate": 0.6, "pinned_kv_gib_mean": 30.0, "pinned_kv_gib_peak": 40.0,
         "tpot_mean_s": 0.005},
        {"policy": "lease", "gpus": 16, "ttft_p50_s": 0.07, "ttft_p90_s": 0.15, "ttft_p90_s_ci95": 0.01,
         "ttft_p99_s": 0.3, "hit_rate": 0.55, "pinned_kv_gib_mean": 5.0, "pinned_kv_gib_peak": 9.0,
         "tpot_mean_s": 0.005},
    ]
    fig = figures.compare_figure(rows)
    html = tmp_path / "compare.html"
    html.write_text(fig.to_html(include_plotlyjs=True, full_html=True, div_id="chart"))
    page.goto(html.as_uri())
    page.wait_for_function("() => document.querySelector('#chart .main-svg')", timeout=RENDER_TIMEOUT_MS)
    got = page.evaluate("""() => {
        const gd = document.getElementById('chart');
        const traces = [...gd.querySelectorAll('.barlayer .trace')];
        const box = el => el.getBoundingClientRect();
        const svg = box(gd.querySelector('.main-svg'));
        const p90 = gd._fullData.findIndex(t => t.name === 'TTFT p90');
        const hit = gd._fullData.findIndex(t => t.name === 'hit rate');
        const ya = gd._fullLayout[gd._fullData[p90].yaxis.replace('y', 'yaxis')];
        const yh = gd._fullLayout[gd._fullData[hit].yaxis.replace('y', 'yaxis')];
        const tops = t => [...traces[t].querySelectorAll('.point path')].map(p => box(p).top - svg.top);
        const xs = t => [...traces[t].querySelectorAll('.point path')].map(p => (box(p).left + box(p).right) / 2);
        const whiskers = [...traces[p90].querySelectorAll('.errorbar')].length;
        return {p90_tops: tops(p90), p90_want: [300, 200, 150].map(v => ya._offset + ya.d2p(v)),
                hit_tops: tops(hit).slice(1), hit_want: [60, 55].map(v => yh._offset + yh.d2p(v)),
                xs: xs(p90), whiskers};
    }""")
    for top, want in zip(got["p90_tops"], got["p90_want"], strict=True):
        assert abs(top - want) < 2, got
    for top, want in zip(got["hit_tops"], got["hit_want"], strict=True):
        assert abs(top - want) < 2, got
    assert got["xs"] == sorted(got["xs"]), got  # off, ttl, lease from left to right
    assert got["whiskers"] == 3, got


SECRET = "KVPLAN-BROWSER-SECRET-41c7"


@pytest.fixture(scope="module")
def served_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path, Path]]:
    """The dashboard with ``--serve-dir`` a temporary directory holding one non-trace file with a secret
    marker; another secret file sits outside it."""
    base = tmp_path_factory.mktemp("served")
    root = base / "served"
    root.mkdir()
    (root / "notes.txt").write_text(f"root:{SECRET}:19000:0:99999:7:::\n")
    outside = base / "outside-secret.csv"
    outside.write_text(f"{SECRET},1,2\n")
    with running_dashboard(log=base / "server.log", timeout_s=HEALTH_TIMEOUT_S, serve_dir=root) as url:
        yield url, root, outside


def _type_server_path(page: Page, typed: str, needle: str) -> tuple[str, str]:
    """Type ``typed`` into the What-if sidebar's server-path box; (the error, the page's whole text)."""
    box = page.get_by_role("textbox", name="trace file (path on this server)")
    box.fill(typed)
    box.press("Enter")
    # this path's answer (in the sidebar, or on the page once the replay failed), not the previous one
    error = page.get_by_test_id("stAlertContentError").filter(has_text=needle).first
    expect(error).to_be_visible(timeout=RENDER_TIMEOUT_MS)
    page.wait_for_function("() => !document.querySelector('[data-stale=true]')", timeout=RENDER_TIMEOUT_MS)
    assert len(error.inner_text().strip().splitlines()) == 1
    return error.inner_text(), str(page.evaluate("() => document.body.innerText"))


def test_typed_server_paths_never_show_file_content(served_server: tuple[str, Path, Path], page: Page) -> None:
    url, root, outside = served_server
    page.goto(f"{url}/")
    _choose_workload(page, "replay a trace file")
    expect(page.get_by_role("textbox", name="trace file (path on this server)")).to_be_visible(
        timeout=RERENDER_TIMEOUT_MS)
    shadow = Path("/etc/shadow").read_text(errors="replace") if os.access("/etc/shadow", os.R_OK) else ""
    passwd = Path("/etc/passwd").read_text(errors="replace")
    for typed in ("/etc/shadow", "/etc/passwd", str(outside), "../outside-secret.csv", "notes.txt",
                  "/proc/self/environ", str(root / "notes.txt")):
        inside = typed in ("notes.txt", str(root / "notes.txt"))
        err, text = _type_server_path(page, typed, "notes.txt" if inside else typed)
        if not inside:
            assert "not a regular file under the directory this dashboard serves" in err, (typed, err)
        assert SECRET not in text, (typed, text[-500:])
        assert "root:" not in text and "/bin/" not in text, (typed, text[-500:])
        for line in (shadow + passwd).splitlines()[:5]:
            assert line not in text, (typed, line)
    page.screenshot(path=str(root.parent / "served_refused.png"))


def test_dashboard_without_serve_dir_offers_no_server_path(server: str, page: Page) -> None:
    page.goto(f"{server}/")
    _choose_workload(page, "replay a trace file")
    expect(page.get_by_text("Server paths are off")).to_be_visible(timeout=RERENDER_TIMEOUT_MS)
    expect(page.get_by_role("textbox", name="trace file (path on this server)")).to_have_count(0)
