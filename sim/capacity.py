"""Capacity planning: the smallest xPyD meeting a TTFT p90 SLO at a load, with and without bidirectional.

``plan_capacity(scenario, rate_per_s, slo_ttft_p90_ms, ...) -> CapacityPlan``:

1. The analytic screen (:mod:`kvplan.sim.screen`) rates every (prefill nodes x, decode nodes y) with
   ``x + y <= max_nodes`` by its slack ``max(prefill utilisation, decode KV demand)``.
2. Totals ``x + y`` are simulated from the smallest the screen finds plausible (slack < 1.2) upwards, the
   three best splits of each total, ``replications`` seeds each; the first total with a split whose mean
   TTFT p90 meets the SLO wins (lowest p90 among its splits). The simulator wins over the screen: the best
   split one node smaller is simulated too, and if it meets the SLO the search goes down.
3. The maximum sustainable load of the chosen xPyD: the rate is doubled until the SLO breaks, then
   bisected (5 steps, ~3%).
4. Cost per million turns = nodes x $/node-hour / (turns per hour) x 10^6 at the target load and at the
   maximum load (turns per conversation as simulated).

The policy is the scenario's (vLLM defaults unless set); ``kvplan recommend`` tunes TTL and threshold.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvplan.errors import input_error
from kvplan.models.hardware import get_hardware
from kvplan.sim.executor import run_tasks
from kvplan.sim.results import json_safe
from kvplan.sim.scenario import ClosedLoopArrival, Scenario, as_scenario, with_overrides
from kvplan.sim.screen import screen_scenarios
from kvplan.sim.seeds import replication_seeds

PLAUSIBLE_SLACK = 1.2  # screen slack below which a split is worth simulating
SPLITS_PER_TOTAL = 3
BISECTION_STEPS = 5
MAX_DOUBLINGS = 5
MAX_CONVERSATIONS = 200_000  # bound on one run when the rate grows (the horizon is kept otherwise)


@dataclass(frozen=True)
class CapacityPlan:
    """Smallest deployments meeting the SLO, with and without bidirectional transfer, and their costs."""

    rate_per_s: float
    slo_ttft_p90_ms: float
    usd_per_node_hour: float
    turns_per_conversation: float
    with_bidirectional: dict[str, Any]
    without_bidirectional: dict[str, Any]
    notes: tuple[str, ...] = ()
    disagreements: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> str:
        """JSON text (sorted keys, NaN/inf as null)."""

        return json.dumps(json_safe(asdict(self)), indent=2, sort_keys=True)


class _Eval:
    """Simulates (x, y, rate) configurations of one mode, memoised, with progress."""

    def __init__(self, base: Scenario, bidirectional: bool, reps: int, workers: int, backend: str,
                 progress: Callable[[int, int], None] | None, counter: list[int]) -> None:
        self.base, self.bidir, self.reps = base, bidirectional, reps
        self.workers, self.backend, self.progress, self.counter = workers, backend, progress, counter
        self.cache: dict[tuple[int, int, float], dict[str, float]] = {}
        self.key = json.dumps(base.model_dump(mode="json"), sort_keys=True)

    def overrides(self, x: int, y: int, rate: float) -> dict[str, Any]:
        return {"deployment.prefill_nodes": x, "deployment.decode_nodes": y, "policy.bidirectional": self.bidir,
                "workload.arrival.rate_per_s": rate, "workload.conversations": conversations_for(self.base, rate)}

    def many(self, configs: list[tuple[int, int, float]]) -> list[dict[str, float]]:
        todo = [c for c in dict.fromkeys(configs) if c not in self.cache]
        rows: dict[tuple[int, int, float], list[dict[str, Any]]] = {c: [] for c in todo}
        seeds = replication_seeds(self.base.seed, self.reps)
        tasks = [(c, self.overrides(*c), seeds[k]) for c in todo for k in range(self.reps)]

        def on_result(key: Any, row: dict[str, Any]) -> None:
            rows[key].append(row)
            self.counter[0] += 1
            if self.progress:
                self.progress(self.counter[0], max(self.counter[0], self.counter[1]))

        self.counter[1] += len(tasks)
        run_tasks(self.base, self.key, tasks, on_result, self.backend, self.workers)
        for c, rs in rows.items():
            ok = [r for r in rs if r.get("error") is None]
            p90 = [r["ttft_p90_s"] for r in ok]
            self.cache[c] = {
                "ttft_p90_s": float(np.mean(p90)) if len(ok) == len(rs) else math.inf,
                "ttft_p90_s_sd": float(np.std(p90, ddof=1)) if len(p90) > 1 else math.nan,
                "ttft_mean_s": float(np.mean([r["ttft_mean_s"] for r in ok])) if ok else math.inf,
                "hit_rate": float(np.mean([r["hit_rate"] for r in ok])) if ok else math.nan,
                "prefill_utilization": float(np.mean([r["prefill_utilization"] for r in ok])) if ok else math.nan,
                "turns_per_conversation": (
                    float(np.mean([r["turns"] / max(r["conversations"], 1) for r in ok])) if ok else math.nan),
                "errors": float(np.mean([r["errors"] for r in ok])) if ok else math.nan,
            }
        return [self.cache[c] for c in configs]


def conversations_for(base: Scenario, rate: float) -> int:
    """Conversations that keep the base scenario's arrival horizon (conversations / rate) at another rate."""
    arr = base.workload.arrival
    horizon = base.workload.conversations / arr.rate_per_s if not isinstance(arr, ClosedLoopArrival) else 0.0
    return int(min(max(math.ceil(rate * horizon), 1), MAX_CONVERSATIONS))


def _screen_slack(base: Scenario, bidir: bool, rate: float, max_nodes: int) -> list[tuple[int, int, float]]:
    pairs = [(x, y) for x in range(1, max_nodes) for y in range(1, max_nodes) if x + y <= max_nodes]
    scen = [with_overrides(base, {"deployment.prefill_nodes": x, "deployment.decode_nodes": y,
                                  "policy.bidirectional": bidir, "workload.arrival.rate_per_s": rate}) for x, y in pairs]
    scr = screen_scenarios(scen)
    slack = np.maximum(scr["screen_prefill_utilization"].to_numpy(), scr["screen_decode_kv_demand"].to_numpy())
    return [(x, y, float(s)) for (x, y), s in zip(pairs, slack, strict=True)]


def _best_at(total: int, slack: list[tuple[int, int, float]], loose: bool) -> list[tuple[int, int]]:
    at = sorted((s, x, y) for x, y, s in slack if x + y == total and (not loose or s < PLAUSIBLE_SLACK))
    return [(x, y) for _, x, y in at[:SPLITS_PER_TOTAL]]


#: (TTFT p90, (P nodes, D nodes), the run's metrics) of the best deployment tried
Closest = tuple[float, tuple[int, int], dict[str, float]]


def _not_meeting(closest: Closest | None, max_nodes: int,
                 slo_s: float) -> dict[str, Any]:
    """The answer when no deployment up to ``max_nodes`` meets the SLO: the closest one tried and its p90."""
    out: dict[str, Any] = {"meets_slo": False, "xpyd": None, "note": f"no deployment up to {max_nodes} nodes meets the SLO"}
    if closest is not None:
        p90, (cx, cy), best = closest
        out.update({
            "closest_xpyd": f"{cx}P{cy}D", "closest_ttft_p90_ms": p90 * 1000, "hit_rate": best["hit_rate"],
            "turns_per_conversation": best["turns_per_conversation"],
            "prefill_utilization": best["prefill_utilization"],
        })
        achieved = f"TTFT p90 {p90 * 1000:.0f} ms" if math.isfinite(p90) else "runs failed"
        out["note"] += (f"; closest tried: {cx}P{cy}D with {achieved} (SLO {slo_s * 1000:g} ms): raise "
                        "--max-nodes, relax the SLO or lower the load")
    return out


def _plan_mode(ev: _Eval, rate: float, slo_s: float, max_nodes: int, usd: float, notes: list[str],
               disagreements: list[str]) -> dict[str, Any]:
    slack = _screen_slack(ev.base, ev.bidir, rate, max_nodes)
    found, closest = _smallest_meeting(ev, slack, rate, slo_s, max_nodes, disagreements)
    if found is None:
        return _not_meeting(closest, max_nodes, slo_s)
    x, y = found
    at = ev.many([(x, y, rate)])[0]
    lo, capped = _max_rate(ev, x, y, rate, slo_s)
    if capped:
        notes.append(f"bidirectional {'on' if ev.bidir else 'off'}: the SLO still holds at {lo:g}/s (search capped)")
    tpc = at["turns_per_conversation"]
    nodes = x + y

    def per_m(rate_c: float) -> float:
        return nodes * usd * 1e6 / (rate_c * tpc * 3600) if rate_c > 0 and tpc > 0 else math.nan

    return {
        "meets_slo": True,
        "xpyd": f"{x}P{y}D",
        "prefill_nodes": x,
        "decode_nodes": y,
        "nodes": nodes,
        "usd_per_hour": nodes * usd,
        "ttft_p90_ms": at["ttft_p90_s"] * 1000,
        "ttft_mean_ms": at["ttft_mean_s"] * 1000,
        "hit_rate": at["hit_rate"],
        "turns_per_conversation": tpc,
        "prefill_utilization": at["prefill_utilization"],
        "max_sustainable_rate_per_s": lo,
        "max_rate_capped": capped,
        "usd_per_million_turns_at_rate": per_m(rate),
        "usd_per_million_turns_at_max_rate": per_m(lo),
    }


def _meeting(ev: _Eval, splits: list[tuple[int, int]], rate: float, slo_s: float,
             closest: list[Closest]) -> tuple[int, int] | None:
    """The split of ``splits`` with the lowest simulated TTFT p90 within the SLO, if any; ``closest`` keeps
    the lowest p90 seen (for the answer when nothing meets the SLO)."""
    res = ev.many([(x, y, rate) for x, y in splits])
    for row, split in zip(res, splits, strict=True):
        if not closest or row["ttft_p90_s"] < closest[0][0]:
            closest[:] = [(row["ttft_p90_s"], split, row)]
    ok = [(r["ttft_p90_s"], s) for r, s in zip(res, splits, strict=True) if r["ttft_p90_s"] <= slo_s]
    return min(ok)[1] if ok else None


def _smallest_meeting(ev: _Eval, slack: list[tuple[int, int, float]], rate: float, slo_s: float, max_nodes: int,
                      disagreements: list[str]) -> tuple[tuple[int, int] | None, Closest | None]:
    """Grow the node count from the screen's plausible minimum until a split meets the SLO, then shrink
    while the simulator still meets it there (the simulator wins over the screen)."""
    plausible = [x + y for x, y, s in slack if s < PLAUSIBLE_SLACK]
    found: tuple[int, int] | None = None
    closest: list[Closest] = []
    total = min(plausible) if plausible else 2
    while total <= max_nodes and found is None:
        found = _meeting(ev, _best_at(total, slack, loose=False), rate, slo_s, closest)
        total += 1
    while found is not None and found[0] + found[1] > 2:
        smaller = _meeting(ev, _best_at(found[0] + found[1] - 1, slack, loose=False), rate, slo_s, [])
        if smaller is None:
            break
        disagreements.append(f"bidirectional {'on' if ev.bidir else 'off'}: the screen ruled out "
                             f"{smaller[0]}P{smaller[1]}D, the simulator meets the SLO there")
        found = smaller
    return found, (closest[0] if closest else None)


def _max_rate(ev: _Eval, x: int, y: int, rate: float, slo_s: float) -> tuple[float, bool]:
    """The largest load ``xPyD`` sustains within the SLO: doublings, then bisection; (rate, search capped)."""
    lo, hi = rate, math.inf
    r = rate
    for _ in range(MAX_DOUBLINGS):
        r *= 2
        if ev.many([(x, y, r)])[0]["ttft_p90_s"] <= slo_s:
            lo = r
        else:
            hi = r
            break
    if not math.isfinite(hi):
        return lo, True
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        if ev.many([(x, y, mid)])[0]["ttft_p90_s"] <= slo_s:
            lo = mid
        else:
            hi = mid
    return lo, False


def plan_capacity(
    scenario: Scenario | dict[str, Any] | str | Path,
    rate_per_s: float,
    slo_ttft_p90_ms: float,
    usd_per_node_hour: float | None = None,
    max_nodes: int = 16,
    replications: int = 2,
    workers: int = 1,
    backend: str = "local",
    progress: Callable[[int, int], None] | None = None,
) -> CapacityPlan:
    """Smallest xPyD meeting ``slo_ttft_p90_ms`` at ``rate_per_s`` new conversations/s, with and without
    bidirectional transfer; their maximum sustainable loads and cost per million turns."""
    sc = as_scenario(scenario)
    if isinstance(sc.workload.arrival, ClosedLoopArrival):
        raise input_error("--workload", "capacity planning needs an open-loop (poisson) workload")
    for name, v in (("--rate", rate_per_s), ("--slo-ttft-p90-ms", slo_ttft_p90_ms)):
        if not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
            raise input_error(name, f"must be a positive number, got {v!r}")
    if not isinstance(max_nodes, int) or max_nodes < 2:
        raise input_error("max_nodes", "must be an integer >= 2")
    usd = usd_per_node_hour if usd_per_node_hour is not None else get_hardware(sc.hardware).usd_per_hour
    if usd is None:
        raise input_error("--usd-per-node-hour", f"no on-demand price is known for hardware '{sc.hardware}'",
                          "pass --usd-per-node-hour")
    if not (math.isfinite(usd) and usd >= 0):
        raise input_error("--usd-per-node-hour", f"must be >= 0, got {usd!r}")
    base = with_overrides(sc, {"workload.arrival.rate_per_s": float(rate_per_s),
                               "workload.conversations": conversations_for(sc, float(rate_per_s))})
    horizon = base.workload.conversations / float(rate_per_s)
    notes: list[str] = [f"policy as in the scenario: TTL {base.policy.decoder_kv_blocks_ttl_s:g} s, threshold "
                        f"{base.policy.kv_recompute_threshold_tokens}, router TTL {base.policy.router_ttl_s:g} s "
                        "(tune them with `kvplan recommend`)",
                        f"SLO met when the mean TTFT p90 over {replications} replications is <= the SLO",
                        f"every run keeps {horizon:.0f} s of arrivals (conversations scale with the rate)"]
    if horizon < 2 * base.policy.decoder_kv_blocks_ttl_s:
        notes.append(f"WARNING: {horizon:.0f} s of arrivals is short against the {base.policy.decoder_kv_blocks_ttl_s:g} s "
                     "TTL: retention never reaches steady state, so decode HBM pressure is underestimated")
    dis: list[str] = []
    counter = [0, 0]
    modes = {}
    for bidir in (True, False):
        ev = _Eval(base, bidir, replications, workers, backend, progress, counter)
        modes[bidir] = _plan_mode(ev, float(rate_per_s), slo_ttft_p90_ms / 1000, max_nodes, usd, notes, dis)
    tpc = next((m.get("turns_per_conversation") for m in modes.values() if m.get("turns_per_conversation")), None)
    if tpc is None:
        tpc = float("nan")
    return CapacityPlan(
        rate_per_s=float(rate_per_s),
        slo_ttft_p90_ms=float(slo_ttft_p90_ms),
        usd_per_node_hour=float(usd),
        turns_per_conversation=float(tpc),
        with_bidirectional=modes[True],
        without_bidirectional=modes[False],
        notes=tuple(notes),
        disagreements=tuple(dis),
    )
