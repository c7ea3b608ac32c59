"""Simulator speed and memory benchmark (issue 2, acceptance 8).

Runs the reference workload (benchmarks/reference.yaml: 1P1D p5en Qwen3-32B, 2,000 conversations x 10
turns, Poisson arrivals near 60% prefill utilisation, bidirectional on) on one core and reports simulated
turns per wall second (simulation plus deriving turns/summary from the event log), then runs 500..8,000
conversations in fresh processes to show how peak memory
(tracemalloc: Python and NumPy allocations) grows with the number of conversations.
Writes benchmarks/results/sim.json.

    .venv/bin/python benchmarks/bench_sim.py
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from kvplan.sim import native

HERE = Path(__file__).resolve().parent
REF = HERE / "reference.yaml"

CHILD = r"""
import resource, sys, time, json, tracemalloc
from kvplan.sim.api import run
from kvplan.sim.scenario import load_scenario, with_overrides
sc = with_overrides(load_scenario(sys.argv[1]), {"workload.conversations": int(sys.argv[2])})
tracemalloc.start()
t = time.perf_counter(); r = run(sc); dt = time.perf_counter() - t
_, peak = tracemalloc.get_traced_memory()
tracemalloc.stop()
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"conversations": int(sys.argv[2]), "turns": len(r.turns), "wall_s_traced": dt,
                  "peak_rss_mib": rss / 1024, "peak_traced_mib": peak / 2**20}))
"""


ONE_RUN = r"""
import json, sys, time
from kvplan.sim.api import run
from kvplan.sim.scenario import load_scenario
sc = load_scenario(sys.argv[1])
run(sc)
t, c = time.perf_counter(), time.process_time(); r = run(sc)
print(json.dumps({"wall_s": time.perf_counter() - t, "cpu_s": time.process_time() - c, "turns": len(r.turns)}))
"""


def _baseline_run(baseline: str) -> dict[str, float]:
    """One reference run of another checkout (``baseline`` holds a ``kvplan`` package) in a fresh process."""
    env = {**os.environ, "PYTHONPATH": baseline}
    out = subprocess.run([sys.executable, "-c", ONE_RUN, str(REF)], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    """Run the benchmark and write the results file.

    ``--baseline DIR`` (a directory holding an unchanged ``kvplan`` package, e.g. from ``git archive``) runs
    that code's reference in turn with this one, so both are measured at the same moment on a shared machine.
    """
    from kvplan.sim.api import run
    from kvplan.sim.scenario import load_scenario

    ap = argparse.ArgumentParser()
    ap.add_argument("--baseline", default=None, help="directory with an unchanged kvplan package to compare against")
    args = ap.parse_args()
    sc = load_scenario(REF)
    run(sc)  # warm-up (imports, caches)
    walls, cpus, base_runs = [], [], []
    for _ in range(3):
        t, c = time.perf_counter(), time.process_time()
        res = run(sc)
        walls.append(time.perf_counter() - t)
        cpus.append(time.process_time() - c)
        if args.baseline:
            base_runs.append(_baseline_run(args.baseline))
    best = min(walls)
    turns = len(res.turns)
    speed = {
        "turns": turns,
        "wall_s_best_of_3": best,
        "wall_s_all": walls,
        "cpu_s_all": cpus,
        "turns_per_cpu_s": turns / min(cpus),
        "turns_per_s": turns / best,
        "prefill_utilization": res.summary["prefill_utilization"],
        "ttft_mean_s": res.summary["ttft_mean_s"],
        "events": len(res.events),
    }
    print(f"reference: {turns} turns in {best:.2f} s -> {turns / best:,.0f} simulated turns per wall second, "
          f"{turns / min(cpus):,.0f} per CPU second (prefill utilisation {res.summary['prefill_utilization']:.1%})")
    if base_runs:
        bt = base_runs[0]["turns"]
        speed["baseline"] = {
            "dir": args.baseline, "runs": base_runs,
            "turns_per_s": bt / min(r["wall_s"] for r in base_runs),
            "turns_per_cpu_s": bt / min(r["cpu_s"] for r in base_runs),
        }
        print(f"baseline at the same moment: {speed['baseline']['turns_per_s']:,.0f} per wall second, "
              f"{speed['baseline']['turns_per_cpu_s']:,.0f} per CPU second")
    mem = []
    for n in (500, 1000, 2000, 4000, 8000):
        out = subprocess.run([sys.executable, "-c", CHILD, str(REF), str(n)], capture_output=True, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        mem.append(row)
        print(f"{n:>5} conversations: {row['turns']:>6} turns, peak traced {row['peak_traced_mib']:.1f} MiB, "
              f"peak RSS {row['peak_rss_mib']:.0f} MiB (process incl. imports)")
    per_conv = [m["peak_traced_mib"] / m["conversations"] for m in mem]
    result = {
        "compiled_build": native.status(),  # sim/native.py: the compiled hot path, or why not
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine()},
        "speed": speed,
        "memory": mem,
        "peak_traced_mib_per_conversation": per_conv,
        "memory_growth_at_most_linear": per_conv[-1] <= per_conv[1] * 1.25,  # MiB/conversation does not grow
        "target_turns_per_s": 14_000,
        "meets_speed_target": speed["turns_per_s"] >= 14_000,
        "meets_speed_target_cpu": speed["turns_per_cpu_s"] >= 14_000,
    }
    (HERE / "results").mkdir(exist_ok=True)
    dest = HERE / "results" / "sim.json"
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(dest)
    print(f"MiB per conversation: {', '.join(f'{x:.3f}' for x in per_conv)}; wrote {dest}")


if __name__ == "__main__":
    main()
