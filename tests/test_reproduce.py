"""kvplan reproduce and cost on the shipped calibration, and the published fit's determinism."""


from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest
from conftest import need_shared

from kvplan.app.cli import main
from kvplan.calibration.published import (
    RATIO_TOLERANCE,
    TOLERANCE,
    Aggregation,
    benchmark_scenario,
    fit_published,
    series_fast,
    series_from_turns,
)
from kvplan.calibration.published_data import PUBLISHED_CSV, PUBLISHED_SHA256
from kvplan.models.arch import QWEN3_32B, descriptors_per_transfer, kv_bytes_per_token_per_rank
from kvplan.models.costs import (
    decode_step_time_s,
    prefill_time_s,
    prep_time_s,
    xfer_time_s,
)
from kvplan.models.profile import load_profile
from kvplan.sim.api import run

REPO = Path(__file__).resolve().parents[1]
BPT = kv_bytes_per_token_per_rank(QWEN3_32B, 8)  # Qwen3-32B KV bytes per token per rank at TP8


def test_reproduce_json_meets_tolerances(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 20
    for r in rows:
        assert list(r) == ["model", "series", "prompt_tokens", "published_ms", "simulated_ms", "rel_error"]
        assert abs(r["rel_error"]) <= TOLERANCE[r["series"]], r
        assert r["rel_error"] == pytest.approx((r["simulated_ms"] - r["published_ms"]) / r["published_ms"], abs=1e-4)
    for model, longest in (("qwen3-32b", 24000), ("glm-5-fp8", 20000)):
        v = {r["series"]: r for r in rows if r["model"] == model and r["prompt_tokens"] == longest}
        pub = v["ttft_on"]["published_ms"] / v["ttft_off"]["published_ms"]
        sim = v["ttft_on"]["simulated_ms"] / v["ttft_off"]["simulated_ms"]
        assert abs(sim / pub - 1) <= RATIO_TOLERANCE


def test_reproduce_one_model_table_and_html(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    html = tmp_path / "fig.html"
    assert main(["reproduce", "--model", "glm-5-fp8", "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert "glm-5-fp8" in out and "qwen3-32b" not in out.split("aggregation")[0].replace("p5en-qwen", "")
    text = html.read_text(encoding="utf-8")
    assert text.count("plotly-graph-div") >= 2 and "TTFT vs prompt length" in text
    assert "https://cdn" not in text.split("<script")[1][:200]  # plotly.js embedded, no network


def test_reproduce_bad_profile_model(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["reproduce", "--model", "glm-5-fp8", "--profile", "p5en-qwen3-32b"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_cost_json_keys(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cost", "--profile", "p5en-qwen3-32b", "--tokens", "2000", "--cached-tokens", "8000", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert list(out)[:3] == ["prefill_s", "kv_transfer_s", "kv_xfer_s"]
    assert {"prefill_s", "kv_transfer_s", "kv_xfer_s", "kv_pull_visible_s", "decode_step_s"} <= set(out)
    c = load_profile("p5en-qwen3-32b").costs
    assert out["prefill_s"] == pytest.approx(prefill_time_s(c.prefill, 2000, 8000))
    d = descriptors_per_transfer(QWEN3_32B, 2000)
    assert out["kv_xfer_s"] == pytest.approx(xfer_time_s(c.transfer, 2000 * BPT, d))
    # the visible pull is request creation + xferDuration (post included) + the step that notices completion
    assert out["kv_pull_visible_s"] == pytest.approx(out["kv_xfer_s"] + prep_time_s(c.transfer, d) + c.transfer.poll_s)
    assert out["kv_transfer_s"] == out["kv_pull_visible_s"]
    assert out["decode_step_s"] == pytest.approx(decode_step_time_s(c.decode, 1, 10000))
    assert 0 < out["kv_transfer_s"] < out["prefill_s"]
    assert main(["cost", "--profile", "p5en-glm-5-fp8", "--tokens", "100"]) == 0
    assert "KV transfer of 100 tokens" in capsys.readouterr().out


def test_fast_series_equal_run_series() -> None:
    for bidirectional in (True, False):
        for agg in (Aggregation(True), Aggregation(False)):
            sc = benchmark_scenario("glm-5-fp8", 4000, bidirectional, profile="p5en-glm-5-fp8")
            fast = series_fast(sc, agg)
            slow = series_from_turns(run(sc).turns, bidirectional, agg)
            assert fast.keys() == slow.keys()
            for k in fast:
                assert fast[k] == pytest.approx(slow[k], rel=1e-12)


def test_published_fit_is_deterministic_and_matches_shipped() -> None:
    a = fit_published("qwen3-32b")
    b = fit_published("qwen3-32b")
    assert a.profile.model_dump() == b.profile.model_dump()
    shipped = load_profile("p5en-qwen3-32b")
    for comp, params in shipped.costs.model_dump().items():
        for name, value in params.items():
            assert getattr(getattr(a.profile.costs, comp), name) == pytest.approx(value, rel=1e-3, abs=1e-15), name
    assert a.report["all_within_tolerance"]
    # with the cold first turn averaged in, GLM-5's prefill_on at 20k is out of reach (documented finding)
    bound = a.report["first_turn_included_bound"]
    assert bound is not None
    glm = load_profile("p5en-glm-5-fp8")
    assert glm.fit_report["first_turn_included_bound"]["exceeds_tolerance"] == 1.0


@pytest.mark.parametrize("model", ["qwen3-32b", "glm-5-fp8"])
def test_shipped_published_profile_is_what_its_command_writes(model: str, tmp_path: Path) -> None:
    """The shipped P5en profile is byte for byte what README's command writes with today's simulator: a change of the
    model that moves a fit must ship the refitted profile (GLM-5-FP8's went stale by ~1e-4 after 74779aa's decode fix,
    unseen by the 1e-3 tolerance above)."""
    out = tmp_path / f"p5en-{model}.json"
    root = Path(str(resources.files("kvplan")))
    assert main(["calibrate", "--published", str(root / "calibration" / "data" / "p5en_published.csv"), "--model", model,
                 "--hardware", "p5en", "--out", str(out)]) == 0
    shipped = root / "models" / "profiles" / f"p5en-{model}.json"
    assert out.read_bytes() == shipped.read_bytes(), f"regenerate {shipped.name} with README's calibrate command"


def test_shipped_profiles_are_self_contained() -> None:
    for name in ("p5en-qwen3-32b", "p5en-glm-5-fp8"):
        prof = load_profile(name)
        assert prof.status == "calibrated" and prof.tensor_parallel_size == 8
        src = prof.provenance["sources"][0]
        assert src["sha256"] == PUBLISHED_SHA256
        assert prof.provenance["vllm_version"] == "0.29.0" and prof.provenance["nixl_version"] == "1.4.1"
        assert prof.uncertainty and prof.notes and prof.fit_report["points"]
        assert all(p["within"] for p in prof.fit_report["points"])


def test_embedded_published_points_match_files() -> None:
    copy = REPO / "calibration" / "data" / "p5en_published.csv"
    assert copy.read_text(encoding="utf-8") == PUBLISHED_CSV


@pytest.mark.shared_data
def test_embedded_published_points_match_shared_original() -> None:
    original = need_shared("data/p5en_published.csv")
    assert original.read_text(encoding="utf-8") == PUBLISHED_CSV
