"""``kvplan recommend --policies`` reusing the advisor's runs: wall time and run count with and without reuse.

``recommend_with_best_policy`` passes one :class:`kvplan.plan.executor.RunCache` to the advisor and to
``compare``, so compare's ``off`` and ``ttl_recommended`` rows (the same scenario and seeds the advisor ran)
are not simulated again. This script times the call against the pre-reuse path (the advisor, then ``compare``
rerunning every alternative), checks that both give the same recommendation and best policy, and writes
benchmarks/results/recommend_reuse.json. One worker, so that the saving is not hidden by idle workers.

    nice -n 10 .venv/bin/python benchmarks/bench_recommend_reuse.py [--conversations N] [--replications K]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "results" / "recommend_reuse.json"


def scenario(conversations: int) -> dict[str, Any]:
    """Small multi-turn 1P1D Qwen3-32B scenario (the one of tests/test_compare.py, longer)."""
    return {"model": "qwen3-32b", "hardware": "p5en",
            "deployment": {"max_num_seqs": 64, "prefill_prefix_caching": False, "prefill_nodes": 1, "decode_nodes": 1},
            "policy": {"bidirectional": True},
            "workload": {"conversations": conversations, "arrival": {"kind": "poisson", "rate_per_s": 0.5},
                         "turns": {"dist": "uniform", "low": 1, "high": 6},
                         "prefix_tokens": {"dist": "lognormal", "median": 3000, "sigma": 0.5},
                         "user_tokens": {"dist": "uniform", "low": 20, "high": 400},
                         "output_tokens": {"dist": "uniform", "low": 10, "high": 400},
                         "turn_gap_s": {"dist": "exponential", "mean": 20}},
            "seed": 3}


def main() -> None:
    """Time both paths and write the figures."""
    import kvplan.plan.executor as executor
    from kvplan.plan.advice import recommend_simulated
    from kvplan.plan.compare import (
        BEST_CANDIDATES,
        best_policy,
        compare,
        recommend_with_best_policy,
        recommendation_overrides,
    )
    from kvplan.sim.scenario import scenario_from_dict

    ap = argparse.ArgumentParser()
    ap.add_argument("--conversations", type=int, default=120)
    ap.add_argument("--replications", type=int, default=3)
    args = ap.parse_args()
    sc = scenario_from_dict(scenario(args.conversations))
    k = args.replications
    runs = [0]
    real = executor.run_task

    def counting(*a: Any) -> dict[str, Any]:
        runs[0] += 1
        return real(*a)

    executor.run_task = counting  # type: ignore[assignment]
    t0 = time.perf_counter()
    rec = recommend_with_best_policy(sc, replications=k)
    reuse_s, reuse_runs = time.perf_counter() - t0, runs[0]
    runs[0] = 0
    t0 = time.perf_counter()
    plain, simulated = recommend_simulated(sc, replications=k)
    rows = compare(simulated, list(BEST_CANDIDATES), replications=k, recommended=recommendation_overrides(plain))
    plain = replace(plain, best_policy=best_policy(rows))
    rerun_s, rerun_runs = time.perf_counter() - t0, runs[0]
    identical = rec.to_json() == plain.to_json()
    out = {"conversations": args.conversations, "replications": k, "workers": 1,
           "with_reuse_s": round(reuse_s, 2), "with_reuse_runs": reuse_runs,
           "without_reuse_s": round(rerun_s, 2), "without_reuse_runs": rerun_runs,
           "saving_s": round(rerun_s - reuse_s, 2), "saving_fraction": round(1 - reuse_s / rerun_s, 3),
           "identical": identical, "bidirectional": rec.bidirectional, "best_policy": rec.best_policy["policy"],
           "load_average": os.getloadavg()[0]}
    print(json.dumps(out, indent=2))
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    if not identical:
        raise SystemExit("the reused and rerun recommendations differ")


if __name__ == "__main__":
    main()
