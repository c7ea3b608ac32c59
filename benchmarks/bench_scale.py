"""A day of traffic on one laptop (issue 12): 1M (and optionally 10M) simulated turns, streamed.

Runs the reference workload (benchmarks/reference.yaml) scaled to N conversations x 10 turns in a fresh
process each, streaming turns.parquet into a temporary result directory like ``kvplan simulate --out DIR``
does (the event loop and the derivation on the main thread, Parquet row groups encoded on a second thread:
sim/result_files.py ``BackgroundWrites``), and reports wall time, CPU time (all threads, and the main thread's
by phase), peak resident memory (ru_maxrss of the child, threads included) and the output sizes; the machine's
load average is recorded with each figure (the machine is shared: a busy second core serialises the two threads).
Each size is followed by raw SimPy processing as many events as that run put on SimPy's queue
(benchmarks/simpy_yardstick.py, its own process), and the ratio of the two CPU times.
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
sys.path.insert(0, sys.argv[3])
from simpy_yardstick import count_events
from kvplan.sim import native
from kvplan.sim.api import run
from kvplan.sim.results import ResultDirWriter
from kvplan.sim.scenario import load_scenario, with_overrides
from kvplan.sim.events import EventLog
from kvplan.sim.stream import RunStream
# phase timings: the main thread's CPU in the derivation (RunStream.consume) and in the log's flushes, by wrappers
# around the two methods (a few hundred calls, no effect on the run); the rest of the main thread is the event loop,
# the plan and the end of the run; the process's CPU beyond the main thread's is the row-group encoding thread's
phase = {"derive_cpu_s": 0.0, "flush_cpu_s": 0.0}
def timed(cls, name, key):
    inner = getattr(cls, name)
    def wrapper(self, *a):
        t0 = time.thread_time()
        try:
            return inner(self, *a)
        finally:
            phase[key] += time.thread_time() - t0
    setattr(cls, name, wrapper)
timed(RunStream, "consume", "derive_cpu_s")
timed(EventLog, "flush", "flush_cpu_s")
sc = with_overrides(load_scenario(sys.argv[1]), {"workload.conversations": int(sys.argv[2])})
out = Path(tempfile.mkdtemp(prefix="kvplan-scale-")) / "out"
t, c, m = time.perf_counter(), time.process_time(), time.thread_time()
w = ResultDirWriter(out, "parquet")
n_events, r = count_events(sc, keep=False, sink=w.write_turns)
t_run, m_run = time.perf_counter(), time.thread_time()
w.commit(r)
dt, dc, dm = time.perf_counter() - t, time.process_time() - c, time.thread_time() - m
phase["end_cpu_s"] = dm - (m_run - m)  # ResultDirWriter.commit: pinned.parquet, summary.json, the move
phase["loop_and_rest_cpu_s"] = (m_run - m) - phase["derive_cpu_s"] - phase["flush_cpu_s"]
phase["other_threads_cpu_s"] = dc - dm
sizes = {p.name: p.stat().st_size for p in out.iterdir()}
for p in out.iterdir():
    p.unlink()
out.rmdir(); out.parent.rmdir()
print(json.dumps({"conversations": int(sys.argv[2]), "turns": r.summary["turns"], "wall_s": dt,
                  "cpu_s": dc, "simpy_events": n_events,
                  "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "ttft_mean_s": r.summary["ttft_mean_s"], "prefill_utilization": r.summary["prefill_utilization"],
                  "output_bytes": sizes, "load_avg_after": os.getloadavg(),
                  "compiled_build": native.status()["active"], "main_thread_cpu_s": dm, "phases": phase}))
"""


RAW = r"""
import json, resource, sys
sys.path.insert(0, sys.argv[2])
from simpy_yardstick import raw_simpy_cpu_s
dt = raw_simpy_cpu_s(int(sys.argv[1]))
print(json.dumps({"cpu_s": dt, "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _child(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{args} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(sizes: list[int]) -> None:
    """Run each size in a fresh process, then raw SimPy for the same event count, and write the results file."""
    rows = []
    for n in sizes:
        load = os.getloadavg()
        row = _child(CHILD, str(REF), str(n), str(HERE))
        row["load_avg_before"] = load
        raw = _child(RAW, str(row["simpy_events"]), str(HERE))  # benchmarks/simpy_yardstick.py, right after
        row["raw_simpy"] = {**raw, "events": row["simpy_events"], "ratio_cpu": row["cpu_s"] / raw["cpu_s"]}
        rows.append(row)
        print(f"{row['turns']:>10,} turns: {row['wall_s']:.1f} s wall, peak RSS {row['peak_rss_mib']:,.0f} MiB, "
              f"turns.parquet {row['output_bytes'].get('turns.parquet', 0) / 2**20:.0f} MiB, "
              f"{'compiled build' if row['compiled_build'] else 'pure Python'} "
              f"(load average before {load[0]:.1f}, after {row['load_avg_after'][0]:.1f} on {os.cpu_count()} cores)")
        ph = row.get("phases", {})
        print(f"{'':>10}  main thread {row['main_thread_cpu_s']:.1f} CPU s: event loop, plan and run end "
              f"{ph.get('loop_and_rest_cpu_s', 0):.1f}, derivation {ph.get('derive_cpu_s', 0):.1f}, log flushes "
              f"{ph.get('flush_cpu_s', 0):.1f}, result files {ph.get('end_cpu_s', 0):.1f}; other threads (row-group "
              f"encoding) {ph.get('other_threads_cpu_s', 0):.1f}")
        print(f"{'':>10}  raw SimPy, same {row['simpy_events']:,} events: {raw['cpu_s']:.1f} CPU s against "
              f"{row['cpu_s']:.1f} -> ratio {row['raw_simpy']['ratio_cpu']:.2f}x")
    old = json.loads(OUT.read_text()).get("runs", []) if OUT.exists() else []
    sizes_run = {r["conversations"] for r in rows}
    rows = sorted([r for r in old if r["conversations"] not in sizes_run] + rows, key=lambda r: r["conversations"])
    result = {
        "machine": {"python": platform.python_version(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count()},
        "runs": rows,  # earlier runs of other sizes are kept
        "targets": {"1M_turns_wall_s": 30, "1M_turns_peak_rss_mib": 1024, "10M_turns_peak_rss_mib": 4096,
                    "issue23_1M_turns_wall_s": 15, "issue23_1M_turns_peak_rss_mb": 400},
    }
    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description="1M (and optionally 10M) simulated turns, streamed; writes " + str(OUT))
    ap.add_argument("conversations", nargs="*", type=int, default=[100_000],
                    help="conversation counts to run, 10 turns each (default 100000 = 1M turns)")
    main(ap.parse_args().conversations)
