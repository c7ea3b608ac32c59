"""Time of calibration through the simulator on the llm-d 2P1D file (issue 19).

Runs ``kvplan calibrate --bench tests/data/llm-d-2p1d__benchmark_2025-05-11_23-39-15.json --scenario
tests/data/llmd-2p1d-a100.scenario.yaml --out P --json`` in a fresh process (imports included), twice, checks
that both runs write byte-identical profiles, and records the wall time, the number of simulations and the
self-check (measured vs simulated means). Writes benchmarks/results/calibrate_scenario.json. Target: well under
a minute on 2 cores (the fit simulates the 250-request run about 40 times).

    .venv/bin/python benchmarks/bench_calibrate_scenario.py
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BENCH = REPO / "tests" / "data" / "llm-d-2p1d__benchmark_2025-05-11_23-39-15.json"
SCENARIO = REPO / "tests" / "data" / "llmd-2p1d-a100.scenario.yaml"
LIMIT_S = 60.0


def main() -> None:
    """Run the benchmark and write the results file."""
    walls, digests, report = [], [], {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(2):
            out = Path(tmp) / f"p{rep}.json"
            cmd = [sys.executable, "-m", "kvplan.app.cli", "calibrate", "--bench", str(BENCH), "--scenario",
                   str(SCENARIO), "--out", str(out), "--json"]
            t = time.perf_counter()
            done = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=REPO)
            walls.append(time.perf_counter() - t)
            digests.append(hashlib.sha256(out.read_bytes()).hexdigest())
            report = json.loads(done.stdout)
    result = {
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count()},
        "command": f"kvplan calibrate --bench {BENCH.relative_to(REPO)} --scenario {SCENARIO.relative_to(REPO)}",
        "wall_s": walls,
        "simulations": report["simulations"],
        "deterministic": digests[0] == digests[1],
        "status": report["status"],
        "params": {p["name"]: {"value": p["value"], "status": p["status"]} for p in report["params"]},
        "self_check": [{k: c[k] for k in ("metric", "measured_ms", "simulated_ms", "rel_error")}
                       for c in report["self_check"]],
        "limit_s": LIMIT_S,
        "meets_limit": max(walls) < LIMIT_S,
    }
    print(f"{walls[0]:.1f} s / {walls[1]:.1f} s, {result['simulations']} simulations, deterministic "
          f"{result['deterministic']}, status {result['status']}")
    for c in result["self_check"]:
        print(f"  {c['metric']}: measured {c['measured_ms']:.2f} ms, simulated {c['simulated_ms']:.2f} ms "
              f"({c['rel_error']:+.1%})")
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "calibrate_scenario.json").write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
