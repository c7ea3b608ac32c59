"""aud15: a ``calibrate --scenario`` fit held up by a GPU scale's physical floor is ``unreliable`` even where the
bounded optimiser stops short of that floor. Qwen3-8B, two aggregated TP2 replicas on h800, measured statistics
simulated with decode x0.9 (below the decode floor, x0.948: faster than the HBM bandwidth allows) were fitted to
decode x0.9486, 1.7e-4 above the floor, and the profile was written ``calibrated`` with no word about it (the check
was ``value <= floor * (1 + 1e-6)``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import synthetic_traces as st

from kvplan.calibration.parsers import parse_bench_serve
from kvplan.calibration.sim_fit import apply_values, bench_run, fit_floor, fit_scenario, run_scenario, simulated_stats
from kvplan.sim.engine import resolve
from kvplan.sim.scenario import Scenario, as_scenario

SCENARIO = {"model": "qwen3-8b", "hardware": "h800",
            "deployment": {"mode": "aggregated", "replicas": 2, "tensor_parallel_size": 2}}


def _measured(tmp_path: Path, decode_scale: float | None) -> tuple[Scenario, Path, float]:
    """A bench file whose TTFT/TPOT summaries are the simulated run at prefill x1.3 and ``decode_scale`` (None: 3%
    above the decode floor); the decode floor."""
    path = tmp_path / "bench.json"
    st.write_bench_serve(path, np.random.default_rng(7), lambda n: 0.05 + 1e-4 * n, lambda c: 0.02, n=300,
                         request_rate_req_s=6.0, model_id="Qwen/Qwen3-8B", input_len_range=(1000, 8000),
                         output_len_range=(50, 300))
    sc = as_scenario(SCENARIO)
    run = bench_run(parse_bench_serve(path))
    rs = resolve(run_scenario(sc, run, None))
    floor = fit_floor(rs.costs, rs.arch, rs.node, 2, "decode")
    truth = {"prefill.gpu_scale": 1.3, "decode.gpu_scale": decode_scale or floor * 1.03, "overhead.p_leg_scale": 1.0}
    stats = simulated_stats(sc, run, apply_values(rs.costs, truth))
    raw = json.loads(path.read_text())
    for k in ("ttfts", "itls", "latencies"):
        raw.pop(k)
    raw.update({"mean_ttft_ms": stats["ttft_mean_s"] * 1e3, "median_ttft_ms": stats["ttft_p50_s"] * 1e3,
                "mean_tpot_ms": stats["tpot_mean_s"] * 1e3, "median_tpot_ms": stats["tpot_p50_s"] * 1e3})
    path.write_text(json.dumps(raw))
    return sc, path, floor


def test_a_decode_faster_than_its_floor_is_reported_pinned(tmp_path: Path) -> None:
    sc, path, floor = _measured(tmp_path, 0.9)
    assert 0.9 < floor < 0.97  # the truth is physically impossible
    fit = fit_scenario(sc, [bench_run(parse_bench_serve(path))])
    row = next(p for p in fit.report["params"] if p["name"] == "decode.gpu_scale")
    assert row["value"] < floor * 1.01  # the optimiser ends at (or just above) the floor
    assert row["at_physical_floor"] is True
    assert fit.profile.status == "unreliable"
    assert any("decode.gpu_scale" in r and "physical floor" in r for r in fit.report["unreliable_reasons"])



def test_a_decode_just_above_its_floor_is_calibrated(tmp_path: Path) -> None:
    """The check near the floor is no blanket band: a truth 3% above the floor is fitted there and stays calibrated."""
    sc, path, floor = _measured(tmp_path, None)
    fit = fit_scenario(sc, [bench_run(parse_bench_serve(path))])
    row = next(p for p in fit.report["params"] if p["name"] == "decode.gpu_scale")
    assert row["value"] == pytest.approx(floor * 1.03, rel=0.02)
    assert row["at_physical_floor"] is False
    assert fit.profile.status == "calibrated", fit.report["unreliable_reasons"]
