"""``kvplan recommend`` benchmark (issue 18, acceptance 1 and 5).

Two parts, both with the local backend on 2 workers:

* ``reference``: wall time of ``recommend`` on benchmarks/reference.yaml (1P1D Qwen3-32B, 2,000 conversations x
  10 turns) with the CLI's defaults (3 replications, the default TTL grid, ``--policies`` on); target < 3 min.
  ``--no-policies``: the advisor alone (``reference_no_policies``).
* ``16p56d``: the issue's saturated deployment: Llama-3.3-70B on p5, 16P56D TP8, 30k-token prefix growing by
  1,500 user + 500 output tokens per turn, 10 turns, gaps uniform 20-60 s, 3 conversations/s, 3,600
  conversations. ``recommend`` (no policies), then the hand sweep it must match: TTL 60/90/120/180 s with router
  TTL = TTL - 10 s, and retention off, on the same seeds. Checks: bidirectional kept on, 65 <= TTL <= 180 s,
  router TTL below it, recommended TTFT p90 within 25% of the best of the hand sweep.

Writes benchmarks/results/recommend.json (merging the parts run).

    nice -n 10 .venv/bin/python benchmarks/bench_recommend.py [--part reference|16p56d|all] [--conversations N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import kvplan.sim.engine  # noqa: F401 - first: the engine installs the compiled hot path (sim/engine.py)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from shape_16p56d import HAND_SWEEP, shape_16p56d  # noqa: E402 - the scenario tests/test_advice_saturation.py scales down

REF = HERE / "reference.yaml"
OUT = HERE / "results" / "recommend.json"
TARGET_REFERENCE_S = 180.0
WORKERS = 2


def _summary(rec: Any) -> dict[str, Any]:
    from kvplan.app.cmd_recommend import render_text

    keys = ("ttft_p50_s", "ttft_p90_s", "ttft_mean_s", "hit_rate", "pinned_kv_gib_mean", "prefill_utilization",
            "prefill_utilization_steady")
    return {"bidirectional": rec.bidirectional, "decoder_kv_blocks_ttl_s": rec.decoder_kv_blocks_ttl_s,
            "router_ttl_s": rec.router_ttl_s, "kv_recompute_threshold_tokens": rec.kv_recompute_threshold_tokens,
            "expected": {k: rec.expected[k] for k in keys}, "vllm_defaults": {k: rec.baseline[k] for k in keys},
            "bidirectional_off": {k: rec.bidirectional_off[k] for k in keys}, "saturation": rec.saturation,
            "binding_constraint": rec.binding_constraint, "rationale": list(rec.rationale),
            "warnings": list(rec.warnings), "screen": rec.screen, "steady_state": rec.steady_state,
            "transfer": {k: v for k, v in rec.transfer.items() if k != "text"},
            "text": [ln for ln in render_text(rec) if not ln.startswith(("rule:", "assumption:", "warning: profile"))],
            "ttl_curve": [{k: c[k] for k in ("ttl_s", "router_ttl_s", "ttft_p90_s", "hit_rate", "saturated", "steady",
                                             "router_settled")} for c in rec.ttl_curve]}


def part_reference(replications: int, policies: bool = True) -> dict[str, Any]:
    """Wall time of recommend on the reference workload with the CLI's defaults (``policies=False``: the advisor
    alone, as ``--no-policies``)."""
    from kvplan.plan.advice import recommend
    from kvplan.plan.compare import recommend_with_best_policy
    from kvplan.sim.scenario import load_scenario

    runs = [0]
    t0 = time.perf_counter()
    advise = recommend_with_best_policy if policies else recommend
    rec = advise(load_scenario(REF), replications=replications, workers=WORKERS,
                 progress=lambda d, n: runs.__setitem__(0, d))
    wall = time.perf_counter() - t0
    out = {"wall_s": wall, "target_s": TARGET_REFERENCE_S, "meets_target": wall < TARGET_REFERENCE_S,
           "advisor_runs": runs[0], "replications": replications, "workers": WORKERS,
           "best_policy": rec.best_policy.get("policy"), **_summary(rec)}
    print(f"reference: recommend wall {wall:.1f} s ({runs[0]} advisor runs{' + compare' if policies else ''}; target < "
          f"{TARGET_REFERENCE_S:.0f} s)"
          f" -> TTL {rec.decoder_kv_blocks_ttl_s} s, router {rec.router_ttl_s} s, threshold "
          f"{rec.kv_recompute_threshold_tokens}; screen pruned {rec.screen.get('pruned_ttls_s')}")
    return out


def part_16p56d(conversations: int, replications: int) -> dict[str, Any]:
    """The saturated 16P56D scenario against the hand sweep."""
    from kvplan.plan.advice import recommend
    from kvplan.plan.executor import run_row
    from kvplan.sim.scenario import scenario_from_dict, with_overrides
    from kvplan.sim.seeds import replication_seeds

    sc = scenario_from_dict(shape_16p56d(conversations))
    t0 = time.perf_counter()
    rec = recommend(sc, replications=replications, workers=WORKERS)
    wall = time.perf_counter() - t0
    sim = with_overrides(sc, {"workload.conversations": rec.steady_state["conversations_simulated"]})
    seeds = replication_seeds(sc.seed, replications)
    hand: dict[str, dict[str, float]] = {}
    for name, ov in HAND_SWEEP:
        rows = [run_row(with_overrides(sim, ov), s) for s in seeds]
        hand[name] = {k: sum(r[k] for r in rows) / len(rows) for k in ("ttft_p50_s", "ttft_p90_s", "hit_rate")}
    best = min(v["ttft_p90_s"] for v in hand.values())
    ok = {"bidirectional_on": rec.bidirectional, "ttl_65_to_180": 65 <= rec.decoder_kv_blocks_ttl_s <= 180,
          "router_below_ttl": rec.router_ttl_s < rec.decoder_kv_blocks_ttl_s,
          "p90_within_25pct_of_best": rec.expected["ttft_p90_s"] <= 1.25 * best}
    print(f"16P56D ({conversations} conversations, {replications} replications): recommend wall {wall:.1f} s -> "
          f"bidirectional {rec.bidirectional}, TTL {rec.decoder_kv_blocks_ttl_s} s, router {rec.router_ttl_s} s, "
          f"TTFT p50 {rec.expected['ttft_p50_s']:.2f} s p90 {rec.expected['ttft_p90_s']:.2f} s; best hand p90 "
          f"{best:.2f} s; checks {ok}")
    return {"wall_s": wall, "conversations": conversations, "replications": replications, "hand_sweep": hand,
            "best_hand_ttft_p90_s": best, "checks": ok, **_summary(rec)}


def main() -> None:
    """Run the parts asked for and merge them into benchmarks/results/recommend.json."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--part", choices=("reference", "16p56d", "all"), default="all")
    ap.add_argument("--conversations", type=int, default=3600, help="Conversations of the 16P56D scenario.")
    ap.add_argument("--replications", type=int, default=3)
    ap.add_argument("--no-policies", action="store_true", help="Reference part: the advisor alone (no compare).")
    a = ap.parse_args()
    results: dict[str, Any] = json.loads(OUT.read_text()) if OUT.exists() else {}
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    if a.part in ("reference", "all"):
        key = "reference_no_policies" if a.no_policies else "reference"
        results[key] = part_reference(a.replications, policies=not a.no_policies)
    if a.part in ("16p56d", "all"):
        results["16p56d"] = part_16p56d(a.conversations, a.replications)
    from kvplan.sim.results import json_safe

    OUT.parent.mkdir(exist_ok=True)
    OUT.write_text(json.dumps(json_safe(results), indent=2, sort_keys=True) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
