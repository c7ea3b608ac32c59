"""A day of traffic on one laptop (issue 12): 1M (and optionally 10M) simulated turns, streamed.

Runs the reference workload (benchmarks/reference.yaml) scaled to N conversations x 10 turns in a fresh
process each (one core), streaming turns.parquet into a temporary result directory like
``kvplan simulate --out DIR`` does, and reports wall time, peak resident memory (ru_maxrss of the child)
and the output sizes; the machine's load average is recorded with each figure (the machine is shared).
Writes benchmarks/results/scale.json. Each row says whether the compiled build ran (``kvplan native build``,
sim/native.py; ``KVPLAN_NATIVE=0`` measures pure Python).

    .venv/bin/python benchmarks/bench_scale.py              # 1M turns (100,000 conversations)
    .venv/bin/python benchmarks/bench_scale.py 100000 1000000   # also 10M turns (takes minutes)
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REF = HERE / "reference.yaml"
OUT = HERE / "results" / "scale.json"

CHILD = r"""
import json, os, resource, sys, tempfile, time
from pathlib import Path
from kvplan.sim import native
from kvplan.sim.api import run
from kvplan.sim.results import ResultDirWriter
from kvplan.sim.scenario import load_scenario, with_overrides
sc = with_overrides(load_scenario(sys.argv[1]), {"workload.conversations": int(sys.argv[2])})
out = Path(tempfile.mkdtemp(prefix="kvplan-scale-")) / "out"
t = time.perf_counter()
w = ResultDirWriter(out, "parquet")
r = run(sc, keep=False, sink=w.write_turns)
w.commit(r)
dt = time.perf_counter() - t
sizes = {p.name: p.stat().st_size for p in out.iterdir()}
for p in out.iterdir():
    p.unlink()
out.rmdir(); out.parent.rmdir()
print(json.dumps({"conversations": int(sys.argv[2]), "turns": r.summary["turns"], "wall_s": dt,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "ttft_mean_s": r.summary["ttft_mean_s"], "prefill_utilization": r.summary["prefill_utilization"],
                  "output_bytes": sizes, "load_avg_after": os.getloadavg(),
                  "compiled_build": native.status()["active"]}))
"""


def main(sizes: list[int]) -> None:
    """Run each size in a fresh process and write the results file."""
    rows = []
    for n in sizes:
        load = os.getloadavg()
        out = subprocess.run([sys.executable, "-c", CHILD, str(REF), str(n)], capture_output=True, text=True)
        if out.returncode != 0:
            sys.exit(f"{n} conversations failed:\n{out.stderr}")
        row = json.loads(out.stdout.strip().splitlines()[-1])
        row["load_avg_before"] = load
        rows.append(row)
        print(f"{row['turns']:>10,} turns: {row['wall_s']:.1f} s wall, peak RSS {row['peak_rss_mib']:,.0f} MiB, "
              f"turns.parquet {row['output_bytes'].get('turns.parquet', 0) / 2**20:.0f} MiB, "
              f"{'compiled build' if row['compiled_build'] else 'pure Python'} "
              f"(load average before {load[0]:.1f}, after {row['load_avg_after'][0]:.1f} on {os.cpu_count()} cores)")
    old = json.loads(OUT.read_text()).get("runs", []) if OUT.exists() else []
    sizes_run = {r["conversations"] for r in rows}
    rows = sorted([r for r in old if r["conversations"] not in sizes_run] + rows, key=lambda r: r["conversations"])
    result = {
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count()},
        "runs": rows,  # earlier runs of other sizes are kept
        "targets": {"1M_turns_wall_s": 30, "1M_turns_peak_rss_mib": 1024, "10M_turns_peak_rss_mib": 4096},
    }
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main([int(a) for a in sys.argv[1:]] or [100_000])
