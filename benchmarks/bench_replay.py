"""Replay the whole Mooncake conversation trace (12,031 requests) on p5en Qwen3-32B (issue 6, acceptance 2).

1P1D and 2P2D, bidirectional on (vLLM defaults: TTL 480 s, threshold 64, router 450 s) and off; prints
TTFT, hit rate and pinned decode HBM, and the wall time of each run. Needs ../shared (the trace).
Writes benchmarks/results/replay.json.

    .venv/bin/python benchmarks/bench_replay.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRACE = Path(os.environ.get(
    "KVPLAN_MOONCAKE_TRACE", HERE.parents[1] / "shared" / "external_traces" / "mooncake_fast25" / "conversation_trace.jsonl"
))


def main() -> None:
    """Run the four replays and write the results file."""
    from kvplan.sim.api import run
    from kvplan.sim.scenario import scenario_from_dict

    if not TRACE.is_file():
        sys.exit(f"trace not found: {TRACE} (needs ../shared)")
    rows = []
    total = 0.0
    for p, d in ((1, 1), (2, 2)):
        for bidir in (True, False):
            sc = scenario_from_dict({"model": "qwen3-32b", "hardware": "p5en",
                                     "deployment": {"prefill_nodes": p, "decode_nodes": d},
                                     "policy": {"bidirectional": bidir},
                                     "workload": {"trace": {"path": str(TRACE)}}})
            t = time.perf_counter()
            r = run(sc)
            wall = time.perf_counter() - t
            total += wall
            s = r.summary
            row = {"deployment": f"{p}P{d}D", "bidirectional": bidir, "wall_s": wall, "turns": s["turns"],
                   "skipped_overlong": s["trace"]["skipped_overlong"], "ttft_mean_s": s["ttft_mean_s"],
                   "ttft_p50_s": s["ttft_p50_s"], "ttft_p90_s": s["ttft_p90_s"], "hit_rate": s["hit_rate"],
                   "pinned_kv_gib_mean": s["pinned_kv_gib_mean"], "pinned_kv_gib_peak": s["pinned_kv_gib_peak"],
                   "decode_kv_capacity_gib": s["decode_kv_capacity_gib"],
                   "p_held_kv_gib_mean": s["p_held_kv_gib_mean"], "p_held_kv_gib_peak": s["p_held_kv_gib_peak"],
                   "d_preemptions": s["d_preemptions"], "p_lease_expiries": s["p_lease_expiries"]}
            rows.append(row)
            print(f"{row['deployment']} bidirectional={'on ' if bidir else 'off'}: {wall:5.1f} s wall, "
                  f"{s['turns']} turns ({row['skipped_overlong']} over 32k skipped), TTFT p50 {s['ttft_p50_s']:.2f} s "
                  f"p90 {s['ttft_p90_s']:.2f} s, hit rate {s['hit_rate']:.1%}, pinned mean/peak "
                  f"{s['pinned_kv_gib_mean']:.0f}/{s['pinned_kv_gib_peak']:.0f} GiB of {s['decode_kv_capacity_gib']:.0f}")
    (HERE / "results").mkdir(exist_ok=True)
    dest = HERE / "results" / "replay.json"
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(json.dumps({"runs": rows, "total_wall_s": total}, indent=2) + "\n")
    tmp.replace(dest)
    print(f"total {total:.1f} s; wrote {dest}")


if __name__ == "__main__":
    main()
