"""Replay the 50 AgentX / Weka coding-agent traces (issue 21: speed target, and the README's AgentX results).

Needs ../shared (``external_traces/agentx_weka``, or ``KVPLAN_AGENTX``). Each run happens in this process
pinned to one core (``os.sched_setaffinity``) and is timed (wall and CPU, reading and planning included):

* ``speed``: GLM-5-FP8 on p5en, the acceptance deployment (64P64D, session affinity, TTL and router TTL
  50,000 s: longer than every think time): the target is under 10 s;
* ``1P1D`` and ``4P8D`` at vLLM's defaults (TTL 480 s, threshold 64, router 450 s, failure policy fail), and
  4P8D at a TTL of 1,800 s (recompute on a failed load): TTFT, hit rate and pinned decode KV;
* 4P8D at the defaults with ``shared_prefix: true`` (sessions with equal tool and system tokens share them);
* ``4P8D original``: the same with ``timing: original`` (every request at its recorded t).

Writes benchmarks/results/agentx.json.

    .venv/bin/python benchmarks/bench_agentx.py
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TRACES = Path(os.environ.get("KVPLAN_AGENTX", HERE.parents[1] / "shared" / "external_traces" / "agentx_weka"))
TARGET_S = 10.0


def _scenario(p: int, d: int, policy: dict[str, Any], **trace: Any) -> dict[str, Any]:
    dep: dict[str, Any] = {"prefill_nodes": p, "decode_nodes": d}
    if p > 1 or d > 1:
        dep["routing"] = "session_affinity"
    return {"model": "glm-5-fp8", "hardware": "p5en", "deployment": dep,
            "policy": {"bidirectional": True, **policy},
            "workload": {"trace": {"path": str(TRACES), "format": "weka", **trace}}}


LONG = {"decoder_kv_blocks_ttl_s": 50000, "router_ttl_s": 50000, "kv_load_failure_policy": "recompute"}
RUNS: dict[str, dict[str, Any]] = {
    "speed (64P64D, TTL 50,000 s)": _scenario(64, 64, LONG),
    "1P1D vLLM defaults": _scenario(1, 1, {}),
    "4P8D vLLM defaults": _scenario(4, 8, {}),
    "4P8D TTL 1,800 s": _scenario(4, 8, {"decoder_kv_blocks_ttl_s": 1800, "router_ttl_s": 1800,
                                         "kv_load_failure_policy": "recompute"}),
    "4P8D vLLM defaults, shared tool + system prefixes": _scenario(4, 8, {}, shared_prefix=True),
    "4P8D original timing, vLLM defaults": _scenario(4, 8, {}, timing="original"),
}


def main() -> None:
    """Run every replay, print the figures and write the results file."""
    from kvplan.sim import native
    from kvplan.sim.api import run

    if not TRACES.is_dir():
        sys.exit(f"traces not found: {TRACES} (needs ../shared)")
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    rows = []
    for name, sc in RUNS.items():
        t, c = time.perf_counter(), time.process_time()
        s = run(sc, keep=False).summary
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        tr = s["trace"]
        row = {"run": name, "wall_s": wall, "cpu_s": cpu, "turns": s["turns"], "errors": s["errors"],
               "skipped_overlong": tr["skipped_overlong"], "ttft_mean_s": s["ttft_mean_s"],
               "ttft_p50_s": s["ttft_p50_s"], "ttft_p90_s": s["ttft_p90_s"], "hit_rate": s["hit_rate"],
               "pinned_kv_gib_mean": s["pinned_kv_gib_mean"], "pinned_kv_gib_peak": s["pinned_kv_gib_peak"],
               "decode_kv_capacity_gib": s["decode_kv_capacity_gib"], "recomputed_tokens": s["recomputed_tokens"],
               "hash_recompute_tokens": tr["hash_recompute_tokens"], "pulled_tokens": s["pulled_tokens"]}
        rows.append(row)
        print(f"{name}: {wall:5.2f} s wall ({cpu:.2f} s CPU), {s['turns']} turns ({s['errors']} failed, "
              f"{tr['skipped_overlong']} over 202,752 tokens skipped), TTFT p50 {s['ttft_p50_s']:.2f} s p90 "
              f"{s['ttft_p90_s']:.2f} s, hit rate {s['hit_rate']:.1%}, pinned mean/peak "
              f"{s['pinned_kv_gib_mean']:.0f}/{s['pinned_kv_gib_peak']:.0f} GiB of {s['decode_kv_capacity_gib']:.0f}, "
              f"recomputed {s['recomputed_tokens']:,} tokens (hash bounds {tr['hash_recompute_tokens']})")
    speed = rows[0]["wall_s"]
    print(f"speed: {speed:.2f} s on one core (target < {TARGET_S:.0f} s): {'OK' if speed < TARGET_S else 'MISSED'}; "
          f"{'compiled' if native.status()['active'] else 'pure Python'}")
    (HERE / "results").mkdir(exist_ok=True)
    dest = HERE / "results" / "agentx.json"
    tmp = dest.with_suffix(".tmp")
    tmp.write_text(json.dumps({"runs": rows, "target_s": TARGET_S, "native": native.status()["active"]},
                              indent=2, default=float) + "\n")
    tmp.replace(dest)
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
