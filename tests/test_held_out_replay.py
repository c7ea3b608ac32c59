"""The held-out-seed check of a fit through the simulator says when it holds no evidence: a replayed run (a
``--save-detailed`` bench file, a multi-turn stats file) draws nothing from the seed, so its 'held-out seeds' gave
exactly the fitted seed's statistics and only repeated the self-check, at 3 extra simulations per run, while the
report presented it as an independent check (found by helper rev15)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import synthetic_traces as st

from kvplan.calibration.parsers import parse_bench_serve
from kvplan.calibration.sim_fit import (
    HELD_OUT_SEEDS,
    MeasuredRun,
    bench_run,
    held_out_check,
    run_scenario,
    self_check,
)
from kvplan.sim.engine import resolve
from kvplan.sim.scenario import load_scenario
from kvplan.sim.seeds import replication_seeds

SCEN_2P1D = Path(__file__).parent / "data" / "llmd-2p1d-a100.scenario.yaml"


def test_a_replayed_run_has_no_held_out_evidence_and_says_so(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    st.write_bench_serve(path, np.random.default_rng(5), lambda n: 0.05 + 1e-4 * n, lambda c: 0.02, n=60,
                         request_rate_req_s=2.0, model_id="meta-llama/Llama-3.1-8B-Instruct",
                         input_len_range=(1000, 3000), output_len_range=(20, 60))
    sc = load_scenario(SCEN_2P1D)
    run = bench_run(parse_bench_serve(path))
    assert run.workload["trace"]["format"] == "bench"
    costs = resolve(run_scenario(sc, run, None)).costs
    check = self_check([sc], [run], costs)
    rows, sims = held_out_check([sc], [run], costs, check)
    assert sims == 1 and rows and all(r["seed_independent"] and len(r["seeds"]) == 1 for r in rows)
    fitted = {c["metric"]: c["simulated_ms"] for c in check}
    assert all(r["simulated_ms"] == fitted[r["metric"]] for r in rows)


def test_a_drawn_run_keeps_every_held_out_seed(tmp_path: Path) -> None:
    sc = load_scenario(SCEN_2P1D)
    workload = {"conversations": 60, "arrival": {"kind": "poisson", "rate_per_s": 2.0},
                "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 2000},
                "user_tokens": {"dist": "constant", "value": 100}, "output_tokens": {"dist": "constant", "value": 50}}
    run = MeasuredRun("drawn", "drawn", workload, {"ttft_mean_s": 0.2, "tpot_mean_s": 0.02})
    costs = resolve(run_scenario(sc, run, None)).costs
    check = self_check([sc], [run], costs)
    rows, sims = held_out_check([sc], [run], costs, check)
    assert sims == HELD_OUT_SEEDS
    assert all(r["seeds"] == replication_seeds(sc.seed, HELD_OUT_SEEDS) and "seed_independent" not in r for r in rows)
    assert len({v for r in rows for v in r["simulated_ms_per_seed"]}) > 2  # the seeds do differ
