"""A fit that does not reproduce the data it was fitted on is not a calibration: calibrate --points/--log/--prometheus
and --published write it ``unreliable`` with the reasons (as calibrate --scenario's self-check does), and simulate
refuses it without --allow-unreliable-profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvplan.app.cli import main
from kvplan.calibration.published import PUBLISHED_TP, _misses

# Prefill times no engine of Qwen3-32B on a p5en can reach (8k tokens in 6 ms): the fit pins every parameter at its
# physical bound and misses its own points by ~600%.
IMPOSSIBLE = "kind,tokens,cached_tokens,value_ms\nprefill,1000,0,2\nprefill,2000,0,3\nprefill,4000,0,4\nprefill,8000,0,6\n"


def test_a_direct_fit_missing_its_own_points_is_unreliable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pts = tmp_path / "pts.csv"
    pts.write_text(IMPOSSIBLE)
    out = tmp_path / "p.json"
    assert main(["calibrate", "--points", str(pts), "--model", "qwen3-32b", "--hardware", "p5en", "--out", str(out)]) == 0
    prof = json.loads(out.read_text())
    assert prof["status"] == "unreliable"
    reasons = prof["fit_report"]["unreliable_reasons"]
    assert any("misses its own input by MAPE" in r for r in reasons)
    assert any("every estimated parameter is at a bound" in r for r in reasons)
    capsys.readouterr()
    sc = tmp_path / "s.yaml"
    sc.write_text(f"model: qwen3-32b\nhardware: p5en\nprofile: {out}\nworkload: {{conversations: 5}}\n")
    assert main(["simulate", str(sc), "--out", str(tmp_path / "o")]) == 2  # refused without the flag
    assert "unreliable" in capsys.readouterr().err


def test_a_good_direct_fit_stays_calibrated(tmp_path: Path) -> None:
    from kvplan.calibration.calibrate import fit_misses
    from kvplan.calibration.fit import FitResult, ParamEstimate

    ok = FitResult("prefill", (ParamEstimate("prefill.per_token_s", 1e-5, 1e-7, "fitted"),
                               ParamEstimate("prefill.fixed_s", 0.0, float("nan"), "at_bound")), (), {"ttft": 2.0}, 8, 6)
    assert fit_misses([ok]) == []
    bad = FitResult("prefill", ok.params, (), {"ttft": 15.5}, 8, 6)
    assert len(fit_misses([bad])) == 1


def test_published_fit_out_of_tolerance_is_unreliable_and_named_by_tp() -> None:
    report = {"points": [{"model": "qwen3-32b", "series": "ttft_on", "prompt_tokens": 2000, "simulated_ms": 200.0,
                          "published_ms": 122.0, "rel_error": 0.64, "tolerance": 0.07, "within": False},
                         {"model": "qwen3-32b", "series": "ttft_off", "prompt_tokens": 2000, "simulated_ms": 158.0,
                          "published_ms": 158.0, "rel_error": 0.0, "tolerance": 0.07, "within": True}],
              "ttft_ratio_at_longest_prompt": {"prompt_tokens": 24000, "rel_error": 0.2, "tolerance": 0.1,
                                               "within": False}}
    reasons = _misses(report)
    assert len(reasons) == 2 and "ttft_on at 2000 tokens" in reasons[0] and "ON/OFF" in reasons[1]
    assert PUBLISHED_TP == 8


def test_the_shipped_published_fits_are_within_tolerance() -> None:
    from kvplan.models.profile import load_profile

    for name in ("p5en-qwen3-32b", "p5en-glm-5-fp8"):
        prof = load_profile(name)
        assert prof.status == "calibrated" and _misses(prof.fit_report) == []
        assert "unreliable_reasons" not in prof.fit_report
