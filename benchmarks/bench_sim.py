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

import json
import platform
import subprocess
import sys
import time
from pathlib import Path

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


def main() -> None:
    """Run the benchmark and write the results file."""
    from kvplan.sim.api import run
    from kvplan.sim.scenario import load_scenario

    sc = load_scenario(REF)
    run(sc)  # warm-up (imports, caches)
    walls = []
    for _ in range(3):
        t = time.perf_counter()
        res = run(sc)
        walls.append(time.perf_counter() - t)
    best = min(walls)
    turns = len(res.turns)
    speed = {
        "turns": turns,
        "wall_s_best_of_3": best,
        "wall_s_all": walls,
        "turns_per_s": turns / best,
        "prefill_utilization": res.summary["prefill_utilization"],
        "ttft_mean_s": res.summary["ttft_mean_s"],
        "events": len(res.events),
    }
    print(f"reference: {turns} turns in {best:.2f} s -> {turns / best:,.0f} simulated turns per wall second "
          f"(prefill utilisation {res.summary['prefill_utilization']:.1%})")
    mem = []
    for n in (500, 1000, 2000, 4000, 8000):
        out = subprocess.run([sys.executable, "-c", CHILD, str(REF), str(n)], capture_output=True, text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
        mem.append(row)
        print(f"{n:>5} conversations: {row['turns']:>6} turns, peak traced {row['peak_traced_mib']:.1f} MiB, "
              f"peak RSS {row['peak_rss_mib']:.0f} MiB (process incl. imports)")
    per_conv = [m["peak_traced_mib"] / m["conversations"] for m in mem]
    result = {
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine()},
        "speed": speed,
        "memory": mem,
        "peak_traced_mib_per_conversation": per_conv,
        "memory_growth_at_most_linear": per_conv[-1] <= per_conv[1] * 1.25,  # MiB/conversation does not grow
        "target_turns_per_s": 10_000,
        "meets_speed_target": speed["turns_per_s"] >= 10_000,
    }
    (HERE / "results").mkdir(exist_ok=True)
    dest = HERE / "results" / "sim.json"
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(dest)
    print(f"MiB per conversation: {', '.join(f'{x:.3f}' for x in per_conv)}; wrote {dest}")


if __name__ == "__main__":
    main()
