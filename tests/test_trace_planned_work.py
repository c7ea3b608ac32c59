"""A command that replays a trace many times (recommend, compare, capacity, a sweep) is bounded by the turns it plans
like a synthetic workload: a trace counted 0 turns, so ``recommend --trace T --replications 1000 --ttl-grid <50
TTLs>`` planned 100,000+ replays of up to 10,000,000 requests each with no check. The trace's requests (an upper
bound) now count, read once per file version."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.app.cli import main
from kvplan.plan import grid as grid_mod
from kvplan.plan.grid import planned_turns
from kvplan.sim.scenario import scenario_from_dict

TRACE = Path(__file__).parent / "data" / "traces" / "sessions_small.csv"  # 6 requests


def test_a_trace_counts_its_requests() -> None:
    sc = scenario_from_dict({"workload": {"trace": {"path": str(TRACE)}}})
    assert planned_turns(sc) == 6.0


def test_recommend_on_a_trace_is_bounded_before_any_run(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import kvplan.plan.executor as executor

    def boom(*_a: object, **_k: object) -> None:
        raise AssertionError("a simulation started")

    monkeypatch.setattr(executor, "run_row", boom)
    monkeypatch.setattr(grid_mod, "MAX_TURNS", 100)  # 6 requests x (replications x configurations) runs
    assert main(["recommend", "--trace", str(TRACE), "--replications", "5", "--ttl-grid", "30,60", "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: recommend: ") and "x 6 turns = " in err and "simulated turns (more than 100" in err
    assert err.count("\n") == 1


def test_a_sweep_over_a_trace_is_bounded_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(grid_mod, "MAX_TURNS", 10)
    g = tmp_path / "g.yaml"
    g.write_text(f"base: {{workload: {{trace: {{path: {TRACE}}}}}}}\naxes: {{policy.decoder_kv_blocks_ttl_s: [30, 60]}}\n")
    assert main(["sweep", str(g), "--out", str(tmp_path / "r.parquet")]) == 2
    assert "2 points x 1 replications plan 12 simulated turns (more than 10" in capsys.readouterr().err
    assert not (tmp_path / "r.parquet").exists()
