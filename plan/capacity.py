"""Capacity planning: the smallest deployment meeting a TTFT p90 SLO at a load, for any scenario or trace.

``plan_capacity(scenario, rate_per_s, slo_ttft_p90_ms, ...) -> CapacityPlan`` keeps the scenario's model,
hardware, TP, workload (or trace) and policy and answers three columns:

* ``with_bidirectional``: the smallest xPyD with ``bidirectional_kv_xfer`` on, the TTL, router TTL and
  threshold chosen at each size as below;
* ``without_bidirectional``: the smallest xPyD with it off (plain P/D);
* ``aggregated``: the fewest aggregated vLLM replicas of the same TP (both phases per engine, prefix caching
  on, routed as ``compare``'s aggregated row: :func:`aggregated_overrides`), searched from the P/D answer's
  instance count (doubled until the SLO is met, then bisected), with the check of one replica fewer. The TP is
  the scenario's by :data:`REPLICA_TP_RULE` (:func:`replica_tp`), the rule ``compare``'s ``aggregated`` policy
  follows too: the TP of its P and D instances (per-role TP included); when P's and D's differ, an aggregated
  replica (one engine, both phases at one TP: ``sim/node_setup.py`` ``aggregated_config``) takes
  ``deployment.tensor_parallel_size`` when one role runs it (the other overrides it per role); when neither does,
  the scenario runs no TP a replica could take as its own, and the column says so (``not_sized``) instead of
  sizing replicas of a TP neither role runs. Every answer says which (``tensor_parallel_rule``).

Search (the screen prunes, the simulator decides):

1. The analytic screen (:mod:`kvplan.plan.screen`) rates every (P nodes x, D nodes y) with ``x + y <=
   max_nodes`` by its slack ``max(prefill utilisation, decode KV demand)`` (with bidirectional, at the TTL of
   the grid that screens best). Totals ``x + y`` are simulated upwards from the smallest the screen finds
   plausible (slack < :data:`PLAUSIBLE_SLACK`; from 2 on a trace, which the screen cannot see), the
   :data:`SPLITS_PER_TOTAL` best splits of each: that smallest total first, then ``max_nodes`` (when none of
   its splits meets the SLO, nothing in between is simulated; when the screen finds nothing plausible, only the
   best split of ``max_nodes``, so a hopeless load ends after a few runs), then bisection over the totals between;
   the smallest total with a split meeting the SLO gives the candidate (its lowest p90).
2. Neighbour checks: ``(x-1, y)`` and ``(x, y-1)`` are simulated; while one of them meets the SLO the answer
   moves there (a disagreement with the screen). The answer is the smallest in that sense: one P fewer and
   one D fewer both miss the SLO, and the checks are reported (``neighbour_checks``).
3. Bidirectional policy at a size: for each TTL of the grid (ascending; TTLs whose screened decode KV demand is
   >= :data:`PLAUSIBLE_SLACK` are pruned unless none is left), the router TTL is ``TTL - expiry margin -
   clock skew - p99(arrival -> P's connector decision)`` measured on that candidate's own run at this size
   (first run with the margin and skew only; rerun when the p99 lowers the whole-second router TTL): P
   declines a read within the margin of D's expiry (``nixl/pull_scheduler.py``, PR #47021), so the proxy must
   forget a D earlier by the time its requests wait before P decides. A TTL whose router TTL would be below
   1 s is skipped. The shortest TTL meeting the SLO is chosen (the least pinned HBM), else the lowest p90 is
   reported (:data:`TTL_RULE`, in every plan). This is deliberately not ``recommend``'s TTL rule
   (:func:`kvplan.plan.advice_rules.choose_ttl`: the shortest TTL reaching 95% of the unlimited-TTL benefit over
   bidirectional off, moved up by ``apply_slo`` to meet an SLO). Capacity's objective is the SLO at the fewest
   nodes, not the TTFT gain at a fixed size: any TTL meeting the SLO serves the load, the shortest pins the
   least decode HBM (the decode batch headroom a smaller deployment needs), and the benefit rule would need a
   retention-off and an unlimited-TTL run at every size tried (2 more x replications per size, with the
   unlimited TTL on an unbounded decode pool) to pick a TTL that is never shorter. On the answer the two can
   differ: ``recommend`` may keep a longer TTL for a lower TTFT. The threshold is the analytic
   pull-vs-recompute break-even (:mod:`kvplan.plan.breakeven`) of the workload's mean follow-up.
4. The maximum sustainable load of the answer (its policy held): the rate is doubled until the SLO breaks,
   then bisected (:data:`BISECTION_STEPS` steps); not on a trace (the trace brings its own clock).
5. Cost per million turns on the steady-state basis (:mod:`kvplan.plan.pricing`), as ``compare`` prices it.

Every candidate runs with ``replications`` seeds spawned from the scenario's seed (``compare``'s seeds), and
meets the SLO when its mean TTFT p90 is at most the SLO with at most 1% of turns errored.
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
from kvplan.plan.capacity_eval import Evaluator, Metrics, meets
from kvplan.plan.pricing import COST_BASIS, node_equivalents, usd_per_million_turns
from kvplan.plan.screen import screen_scenarios
from kvplan.plan.steady import EXTEND_FACTOR, MAX_CONVERSATIONS
from kvplan.sim.results import json_safe
from kvplan.sim.scenario import MAX_SIM_TIME_S, ClosedLoopArrival, Scenario, as_scenario, with_overrides
from kvplan.units import human_s

PLAUSIBLE_SLACK = 1.2  # screen slack below which a split is worth simulating
SPLITS_PER_TOTAL = 3
BISECTION_STEPS = 5
MAX_DOUBLINGS = 5
DEFAULT_TTL_GRID_S = (60.0, 120.0, 240.0, 480.0)
MIN_ROUTER_TTL_S = 1.0
KV_AWARE_ROUTING = ("session_affinity", "prefix_aware", "sticky")
#: How the bidirectional column's TTL is chosen at a size (every plan's JSON ``ttl_rule`` and text say it).
TTL_RULE = ("capacity's TTL rule: the shortest TTL of the grid meeting the SLO at this size (the least pinned decode "
            "HBM that serves the load), each at its own router TTL; not recommend's benefit rule (the shortest TTL "
            "reaching 95% of the unlimited-TTL gain over retention off): run `kvplan recommend` on this deployment "
            "for that one")


@dataclass(frozen=True)
class CapacityPlan:
    """Smallest deployments meeting the SLO (bidirectional on, off, aggregated replicas) and their costs."""

    rate_per_s: float | None
    slo_ttft_p90_ms: float
    usd_per_node_hour: float | None  # None: no price known for the hardware (sizing needs none; costs are null)
    turns_per_conversation: float
    with_bidirectional: dict[str, Any]
    without_bidirectional: dict[str, Any]
    aggregated: dict[str, Any] = field(default_factory=dict)
    cost_basis: str = COST_BASIS
    simulations: int = 0
    notes: tuple[str, ...] = ()
    disagreements: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> str:
        """JSON text (sorted keys, NaN/inf as null)."""

        return json.dumps(json_safe(asdict(self)), indent=2, sort_keys=True)


def conversations_for(base: Scenario, rate: float) -> int:
    """Conversations that keep the base scenario's arrival horizon (conversations / rate) at another rate."""
    arr = base.workload.arrival
    horizon = base.workload.conversations / arr.rate_per_s if not isinstance(arr, ClosedLoopArrival) else 0.0
    return int(min(max(math.ceil(rate * horizon), 1), MAX_CONVERSATIONS))


def aggregated_overrides(replicas: int, routing: str, tp: int | None = None) -> dict[str, Any]:
    """Overrides turning a P/D scenario into ``replicas`` aggregated replicas of its TP (``tp`` when given:
    ``deployment.tensor_parallel_size`` is set to it), routed by ``routing``."""
    return {"deployment.prefill_tensor_parallel_size": None, "deployment.decode_tensor_parallel_size": None,
            **({"deployment.tensor_parallel_size": tp} if tp is not None else {}),
            "deployment.mode": "aggregated", "deployment.replicas": replicas, "deployment.routing": routing,
            "deployment.prefill_prefix_caching": True, "policy.bidirectional": False,
            # aggregated serving has no decode-side retention: reset what a P/D scenario's policy may carry
            # (aggregated + lease / ttl_evictable / offload is refused as inconsistent, issue 22 item 14)
            "policy.retention": {"kind": "ttl"}, "policy.offload": None}


def role_tps(sc: Scenario) -> tuple[int, int]:
    """The TP of the scenario's prefill and of its decode instances (per role, else ``tensor_parallel_size``)."""
    dep = sc.deployment
    return (dep.prefill_tensor_parallel_size or dep.tensor_parallel_size,
            dep.decode_tensor_parallel_size or dep.tensor_parallel_size)


def instance_tp(sc: Scenario) -> int | None:
    """The one TP of the scenario's P and D instances (given per role or not); None when P's and D's differ."""
    p, d = role_tps(sc)
    return p if p == d else None


#: The rule both ``capacity``'s aggregated column and ``compare``'s ``aggregated`` policy follow (:func:`replica_tp`).
REPLICA_TP_RULE = ("an aggregated replica runs both phases at one TP (sim/node_setup.py aggregated_config), a TP of the "
                   "scenario's instances: the TP its P and D share, else deployment.tensor_parallel_size when one role "
                   "runs it; with P and D at two TPs and deployment.tensor_parallel_size neither, none (not sized, "
                   "not compared)")


def replica_tp(sc: Scenario) -> int | None:
    """The TP of aggregated replicas "of the scenario's TP" (:data:`REPLICA_TP_RULE`): the TP P and D share (per role
    or not); when they differ, ``deployment.tensor_parallel_size`` if one role runs it (the other overrides it per
    role); else None: the scenario runs no TP a replica could take as its own (``tensor_parallel_size`` is then no
    instance's, and picking P's or D's would be a guess)."""
    shared = instance_tp(sc)
    if shared is not None:
        return shared
    tp = sc.deployment.tensor_parallel_size
    return tp if tp in role_tps(sc) else None


def replica_tp_why(sc: Scenario) -> str:
    """Where :func:`replica_tp`'s TP comes from, or why there is none with the fix (one clause, for both outputs)."""
    p, d = role_tps(sc)
    tp = replica_tp(sc)
    if tp is not None and p == d:
        return f"TP{tp}, the TP of the scenario's P and D instances"
    if tp is not None:
        role = "prefill" if tp == p else "decode"
        return (f"TP{tp} = deployment.tensor_parallel_size, the {role} instances' TP (prefill TP {p} and decode TP {d} "
                "differ, and a replica runs both phases at one TP)")
    return aggregated_not_sized(sc)


def aggregated_not_sized(sc: Scenario) -> str:
    """Why there are no aggregated replicas of the scenario's TP (heterogeneous TP, ``tensor_parallel_size`` neither
    role's), with the fix (one line)."""
    p, d = role_tps(sc)
    return (f"not sized: the scenario's prefill TP {p} and decode TP {d} differ, and an aggregated replica runs both "
            f"phases at one TP (deployment.tensor_parallel_size {sc.deployment.tensor_parallel_size} is neither role's "
            f"here); to size aggregated replicas, set deployment.tensor_parallel_size to {p} or {d} (the per-role fields "
            "keep P and D as they are)")


def default_aggregated_routing(sc: Scenario) -> str:
    """``compare``'s aggregated routing: the scenario's, ``sticky`` as ``session_affinity``."""
    return "session_affinity" if sc.deployment.routing == "sticky" else sc.deployment.routing


@dataclass
class Pick:
    """One deployment size simulated under its policy: whether it meets the SLO, its metrics and policy."""

    ok: bool
    metrics: Metrics
    overrides: dict[str, Any]
    policy: dict[str, Any]
    candidates: list[dict[str, Any]] = field(default_factory=list)


def _check(x: int, y: int, pick: Pick) -> dict[str, Any]:
    return {"xpyd": f"{x}P{y}D", "prefill_nodes": x, "decode_nodes": y, "meets_slo": pick.ok,
            "ttft_p90_ms": pick.metrics["ttft_p90_s"] * 1000,
            "judged_conversations": pick.metrics.get("judged_conversations"), **pick.policy}


class _Planner:
    """The search of one plan: the screen, the per-size policy, the smallest-deployment walk."""

    def __init__(self, ev: Evaluator, slo_s: float, max_nodes: int, ttl_grid: tuple[float, ...], threshold: int,
                 rate_ov: dict[str, Any], screened: bool) -> None:
        self.ev, self.slo_s, self.max_nodes, self.ttl_grid = ev, slo_s, max_nodes, ttl_grid
        self.threshold, self.rate_ov, self.screened = threshold, rate_ov, screened
        self.disagreements: list[str] = []
        pol = ev.base.policy
        self.allowance_s = pol.expiry_safety_margin_s + pol.clock_skew_s
        self.pairs = [(x, y) for x in range(1, max_nodes) for y in range(1, max_nodes) if x + y <= max_nodes]
        self.demand: dict[tuple[int, int, float], float] = {}

    # --- the screen ----------------------------------------------------------------------------------------

    def slack(self, bidir: bool) -> dict[tuple[int, int], float]:
        """Screen slack of every (x, y): max(prefill utilisation, decode KV demand), best TTL with bidirectional."""
        ttls = self.ttl_grid if bidir else (self.ev.base.policy.decoder_kv_blocks_ttl_s,)
        keys = [(x, y, t) for x, y in self.pairs for t in ttls]
        scen = [with_overrides(self.ev.base, {**self._size(x, y), **self._policy_ov(bidir, t, t)}) for x, y, t in keys]
        scr = screen_scenarios(scen)
        util = scr["screen_prefill_utilization"].to_numpy()
        dem = scr["screen_decode_kv_demand"].to_numpy()
        out: dict[tuple[int, int], float] = {}
        for (x, y, t), u, d in zip(keys, util, dem, strict=True):
            self.demand[(x, y, t)] = float(d)
            s = float(max(u, d)) if math.isfinite(u) and math.isfinite(d) else math.inf
            out[(x, y)] = min(out.get((x, y), math.inf), s)
        return out

    def _size(self, x: int, y: int) -> dict[str, Any]:
        return {"deployment.prefill_nodes": x, "deployment.decode_nodes": y, **self.rate_ov}

    def _policy_ov(self, bidir: bool, ttl: float, router: float) -> dict[str, Any]:
        if not bidir:
            return {"policy.bidirectional": False}
        return {"policy.bidirectional": True, "policy.decoder_kv_blocks_ttl_s": ttl, "policy.router_ttl_s": router,
                "policy.kv_recompute_threshold_tokens": self.threshold}

    # --- one size ------------------------------------------------------------------------------------------

    def off_at(self, x: int, y: int) -> Pick:
        """Bidirectional off at xPyD."""
        ov = {**self._size(x, y), **self._policy_ov(False, 0.0, 0.0)}
        m = self.ev.one(ov)
        return Pick(meets(m, self.slo_s), m, ov, {"decoder_kv_blocks_ttl_s": None, "router_ttl_s": None,
                                                   "kv_recompute_threshold_tokens": None})

    def _ttls_at(self, x: int, y: int) -> list[float]:
        keep = [t for t in self.ttl_grid if self.demand.get((x, y, t), 0.0) < PLAUSIBLE_SLACK or not self.screened]
        return keep or [min(self.ttl_grid)]

    def bidir_at(self, x: int, y: int) -> Pick:
        """Bidirectional on at xPyD: the shortest TTL of the grid meeting the SLO, each with its own router TTL."""
        tried: list[Pick] = []
        cands: list[dict[str, Any]] = []
        for ttl in self._ttls_at(x, y):
            first = math.floor(ttl - self.allowance_s)
            if first < MIN_ROUTER_TTL_S:
                cands.append({"decoder_kv_blocks_ttl_s": ttl, "skipped": "TTL within the expiry margin + skew"})
                continue
            m0 = self.ev.one({**self._size(x, y), **self._policy_ov(True, ttl, first)})
            router = math.floor(ttl - self.allowance_s - m0["p_decide_p99_s"]) if math.isfinite(
                m0["p_decide_p99_s"]) else first
            cand: dict[str, Any] = {"decoder_kv_blocks_ttl_s": ttl, "p_decide_p99_s": m0["p_decide_p99_s"]}
            if router < MIN_ROUTER_TTL_S:
                cands.append({**cand, "router_ttl_s": router, "skipped": "P decides later than TTL - margin - skew"})
                continue
            ov = {**self._size(x, y), **self._policy_ov(True, ttl, float(router))}
            m = m0 if router == first else self.ev.one(ov)
            pick = Pick(meets(m, self.slo_s), m, ov, {"decoder_kv_blocks_ttl_s": ttl, "router_ttl_s": float(router),
                                                       "kv_recompute_threshold_tokens": self.threshold})
            cands.append({**cand, "router_ttl_s": float(router), "ttft_p90_ms": m["ttft_p90_s"] * 1000,
                          "meets_slo": pick.ok})
            tried.append(pick)
            if pick.ok:
                break
        if not tried:
            inf: Metrics = {"ttft_p90_s": math.inf}
            return Pick(False, inf, {}, {"decoder_kv_blocks_ttl_s": None, "router_ttl_s": None,
                                         "kv_recompute_threshold_tokens": self.threshold}, cands)
        best = next((p for p in tried if p.ok), min(tried, key=lambda p: p.metrics["ttft_p90_s"]))
        best.candidates = cands
        return best

    # --- the search ------------------------------------------------------------------------------------------

    def smallest(self, at: Callable[[int, int], Pick], slack: dict[tuple[int, int], float],
                 label: str) -> tuple[tuple[int, int, Pick] | None, tuple[int, int, Pick] | None, list[dict[str, Any]]]:
        """(answer, closest tried, neighbour checks) of one column."""
        closest: tuple[int, int, Pick] | None = None

        def at_total(total: int, n: int = SPLITS_PER_TOTAL) -> tuple[int, int, Pick] | None:
            nonlocal closest
            splits = sorted((s, x, y) for (x, y), s in slack.items() if x + y == total)[:n]
            picks = [(x, y, at(x, y)) for _, x, y in splits]
            for x, y, p in picks:
                if closest is None or p.metrics["ttft_p90_s"] < closest[2].metrics["ttft_p90_s"]:
                    closest = (x, y, p)
            ok = [(p.metrics["ttft_p90_s"], x, y, p) for x, y, p in picks if p.ok]
            if not ok:
                return None
            _, x, y, p = min(ok, key=lambda t: t[:3])
            return x, y, p

        plausible = [x + y for (x, y), s in slack.items() if s < PLAUSIBLE_SLACK] if self.screened else []
        lo = min(plausible) - 1 if plausible else 1  # totals <= lo are taken to miss (the screen, or 1 node)
        if plausible or not self.screened:
            found = at_total(lo + 1)  # the smallest the screen finds plausible: the common case ends here
            hi = lo + 1
            if found is None and hi < self.max_nodes:
                # then the largest: when it misses, nothing in between is simulated
                lo, hi = hi, self.max_nodes
                found = at_total(hi)
        else:  # the screen finds nothing plausible up to the bound: the largest total's best split first
            hi = self.max_nodes
            found = at_total(hi, 1)
        while found is not None and hi - lo > 1:  # bisection over the total (meeting the SLO ~ monotone in it)
            mid = (lo + hi) // 2
            got = at_total(mid)
            if got is None:
                lo = mid
            else:
                hi, found = mid, got
        checks: list[dict[str, Any]] = []
        while found is not None:
            x, y, p = found
            nbrs = [(x - 1, y)] * (x > 1) + [(x, y - 1)] * (y > 1)
            res = [(nx, ny, at(nx, ny)) for nx, ny in nbrs]
            checks = [_check(nx, ny, q) for nx, ny, q in res]
            better = [(q.metrics["ttft_p90_s"], nx, ny, q) for nx, ny, q in res if q.ok]
            if not better:
                break
            _, nx, ny, q = min(better, key=lambda t: t[:3])
            self.disagreements.append(f"{label}: {nx}P{ny}D meets the SLO too (the search started above it)")
            found = (nx, ny, q)
        return found, closest, checks

    def aggregated(self, routing: str, tp: int, guess: int | None
                   ) -> tuple[int | None, Pick | None, list[dict[str, Any]], Pick | None]:
        """(replicas, pick, the check of one replica fewer, closest) of the aggregated column. Meeting the SLO is
        taken as monotone in the replica count: from ``guess`` (the P/D answer's instance count) doubling up to
        ``max_nodes`` until one meets, then bisection below it; the check of R - 1 is simulated."""
        def at(r: int) -> Pick:
            base_tp = self.ev.base.deployment.tensor_parallel_size
            ov = {**aggregated_overrides(r, routing, tp if tp != base_tp else None), **self.rate_ov}
            m = self.ev.one(ov)
            return Pick(meets(m, self.slo_s), m, ov, {"replicas": r, "routing": routing, "tensor_parallel_size": tp})

        lo, hi = 0, min(max(guess or self.max_nodes, 1), self.max_nodes)  # at(lo) misses: 0 replicas serve nothing
        while not (top := at(hi)).ok:
            if hi == self.max_nodes:
                return None, None, [], top
            lo, hi = hi, min(2 * hi, self.max_nodes)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if at(mid).ok else (mid, hi)
        best = at(hi)
        checks = []
        if hi > 1:
            below = at(hi - 1)
            checks = [{"replicas": hi - 1, "meets_slo": below.ok, "ttft_p90_ms": below.metrics["ttft_p90_s"] * 1000}]
        return hi, best, checks, best


def break_even_threshold(sc: Scenario) -> int:
    """The threshold ``recommend``'s rule starts from: the analytic pull-vs-recompute break-even of the mean
    follow-up turn (local prefix on P when it has one, the new user tokens as the tail)."""
    from kvplan.plan.breakeven import break_even
    from kvplan.plan.screen import formula_prefix_user, quantile_sample
    from kvplan.sim.engine import resolve

    wl, dep = sc.workload, sc.deployment
    t = np.maximum(1, np.rint(quantile_sample(wl.turns)))
    et, et2 = float(t.mean()), float((t * t).mean())
    prefix, user = formula_prefix_user(wl)  # turn 1 as the formulas count it (plan/screen.py)
    out = float(np.maximum(1, np.rint(quantile_sample(wl.output_tokens))).mean())
    km1 = (et2 - et) / 2 / (et - 1) if et > 1 else 1.0  # mean turn index - 1 of a follow-up
    prev_prompt = prefix + user * km1 + out * (km1 - 1)
    same_p = dep.prefill_nodes == 1 or dep.routing in KV_AWARE_ROUTING
    local = int(prev_prompt) if dep.prefill_prefix_caching and same_p else 0
    return int(break_even(resolve(sc), local, int(round(user)) + 1).tokens)


def _max_rate(ev: Evaluator, ov: dict[str, Any], rate: float, slo_s: float) -> tuple[float, bool]:
    """The largest load the answer sustains within the SLO, its policy held: doublings, then bisection."""
    def ok(r: float) -> bool:
        return meets(ev.one({**ov, "workload.arrival.rate_per_s": r,
                             "workload.conversations": conversations_for(ev.base, r)}), slo_s)

    lo, hi = rate, math.inf
    r = rate
    for _ in range(MAX_DOUBLINGS):
        r *= 2
        if ok(r):
            lo = r
        else:
            hi = r
            break
    if not math.isfinite(hi):
        return lo, True
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo, False


def _gpus(sc: Scenario, ov: dict[str, Any]) -> int:
    v = with_overrides(sc, ov).deployment
    if v.mode == "aggregated":
        return v.replicas * v.tensor_parallel_size
    return (v.prefill_nodes * (v.prefill_tensor_parallel_size or v.tensor_parallel_size)
            + v.decode_nodes * (v.decode_tensor_parallel_size or v.tensor_parallel_size))


def _answer(pick: Pick, nodes: int, usd: float | None, rate: float | None, max_rate: tuple[float, bool] | None,
            ev: Evaluator) -> dict[str, Any]:
    m = pick.metrics
    gpus = _gpus(ev.base, pick.overrides)
    billed = node_equivalents(gpus, get_hardware(ev.base.hardware).gpus_per_node)
    out: dict[str, Any] = {
        "meets_slo": True, "nodes": nodes, "gpus": gpus, "billed_nodes": billed,
        "usd_per_hour": billed * usd if usd is not None else None,
        "ttft_p90_ms": m["ttft_p90_s"] * 1000, "ttft_p50_ms": m["ttft_p50_s"] * 1000,
        "ttft_mean_ms": m["ttft_mean_s"] * 1000, "hit_rate": m["hit_rate"],
        "turns_per_conversation": m["turns_per_conversation"], "prefill_utilization": m["prefill_utilization"],
        "steady_served_turns_per_s": m["steady_served_turns_per_s"], "errors": m["errors"],
        "pinned_kv_gib_peak": m["pinned_kv_gib_peak"],
        "usd_per_million_turns_at_rate": (usd_per_million_turns(billed, usd, m["steady_served_turns_per_s"])
                                          if usd is not None else None),
        # the run that judged it (capacity_eval: a first run meeting the SLO is simulated again, longer)
        "judged_conversations": m.get("judged_conversations"), "first_run_conversations": m.get("first_run_conversations"),
        "first_run_ttft_p90_ms": m["first_run_ttft_p90_s"] * 1000 if "first_run_ttft_p90_s" in m else None,
        # what the first run showed of its own unsteadiness (plan/steady.py: reported, not the trigger)
        "first_run_ttft_growing": bool(m["first_run_ttft_growing"]) if "first_run_ttft_growing" in m else None,
        "first_run_retention_unsteady": (bool(m["first_run_retention_unsteady"])
                                         if "first_run_retention_unsteady" in m else None),
        **pick.policy,
        "verification": _verification(pick, ev),
    }
    if max_rate is not None and rate is not None:
        lo, capped = max_rate
        at_max = ev.one({**pick.overrides, "workload.arrival.rate_per_s": lo,
                         "workload.conversations": conversations_for(ev.base, lo)}) if lo != rate else m
        out.update({"max_sustainable_rate_per_s": lo, "max_rate_capped": capped,
                    "usd_per_million_turns_at_max_rate": usd_per_million_turns(
                        billed, usd, at_max["steady_served_turns_per_s"]) if usd is not None else None})
    else:
        out.update({"max_sustainable_rate_per_s": None, "max_rate_capped": None,
                    "usd_per_million_turns_at_max_rate": None})
    return out


def _verification(pick: Pick, ev: Evaluator) -> dict[str, Any]:
    """How an answer's figures are reproduced: the scenario with these overrides (deployment size, policy, rate and
    the conversations of the run that judged it), simulated on these seeds; its TTFT p90 is the mean of the seeds'
    summary.json ``ttft_p90_s``."""
    ov = dict(pick.overrides)
    judged = pick.metrics.get("judged_conversations")
    if judged is not None and math.isfinite(judged) and ev.base.workload.trace is None:
        ov["workload.conversations"] = int(judged)
    return {"by": "simulation", "overrides": ov, "seeds": list(ev.seeds),
            # the whole scenario with the overrides applied (a --workload preset is in no file of the user's)
            "scenario": with_overrides(ev.base, ov).model_dump(mode="json"),
            "expected_is": "ttft_p90_ms, ttft_p50_ms, ttft_mean_ms, hit_rate, errors, pinned_kv_gib_peak and "
            "prefill_utilization are the means over these seeds of summary.json's ttft_p90_s (x1000), ttft_p50_s, "
            "ttft_mean_s, hit_rate, errors, pinned_kv_gib_peak and prefill_utilization of the scenario with these "
            "overrides (other fields as in the scenario)"}


#: Below this steady-window busy share of the closest deployment's busiest prefill engine, a missed SLO is not a
#: queue that more nodes remove: its TTFT p90 is the requests' own service time.
SERVICE_BOUND_UTILISATION = 0.5
#: ... and when no resource (P's queue, D's admission, P's held KV, the link, an engine thread) made requests wait
#: more than this share of the TTFT p90 at p90.
SERVICE_BOUND_WAIT_SHARE = 0.1


def _not_meeting(closest: tuple[str, Pick] | None, what: str, slo_s: float) -> dict[str, Any]:
    """The answer when nothing up to the bound meets the SLO: the closest one tried and its p90."""
    # the keys of an answer stay present (null), so a consumer of --json reads the same shape either way
    out: dict[str, Any] = {"meets_slo": False, "xpyd": None, "prefill_nodes": None, "decode_nodes": None,
                           "ttft_p90_ms": None, "decoder_kv_blocks_ttl_s": None, "router_ttl_s": None,
                           "kv_recompute_threshold_tokens": None, "closest_prefill_utilization_steady": None,
                           "closest_wait_p90_s": None, "note": f"no deployment up to {what} meets the SLO"}
    if closest is not None:
        name, p = closest
        p90 = p.metrics["ttft_p90_s"]
        out.update({"closest": name, "closest_xpyd": name, "closest_ttft_p90_ms": p90 * 1000,
                    "hit_rate": p.metrics.get("hit_rate"), **p.policy,
                    "turns_per_conversation": p.metrics.get("turns_per_conversation"),
                    "prefill_utilization": p.metrics.get("prefill_utilization")})
        skipped = [f"TTL {c['decoder_kv_blocks_ttl_s']:g} s ({c['skipped']}"
                   + (f": p99 arrival-to-decision {c['p_decide_p99_s']:.0f} s)" if "p_decide_p99_s" in c else ")")
                   for c in p.candidates if c.get("skipped")]
        achieved = (f"TTFT p90 {human_s(p90)}" if math.isfinite(p90) else
                    "every TTL skipped: " + ", ".join(skipped) if skipped else "runs failed")
        if skipped:
            out["ttl_candidates"] = p.candidates
        busy = p.metrics.get("prefill_utilization_steady", math.nan)
        wait = p.metrics.get("wait_p90_s", math.nan)
        out["closest_prefill_utilization_steady"], out["closest_wait_p90_s"] = busy, wait
        if (math.isfinite(p90) and math.isfinite(busy) and busy < SERVICE_BOUND_UTILISATION and math.isfinite(wait)
                and wait < SERVICE_BOUND_WAIT_SHARE * p90):
            # no queue to remove: the p90 is the service time of its requests (long prompts' prefill, recomputed
            # contexts, transfers), which more nodes or a lower load do not shorten
            out["note"] += (f"; closest tried: {name} with {achieved} (SLO {human_s(slo_s)}), its busiest prefill "
                            f"engine only {busy:.0%} busy over the steady window and no resource's p90 wait above "
                            f"{human_s(wait)}: that TTFT is service time, not queueing, so more nodes or a lower load "
                            "will not bring it to the SLO; see where it goes "
                            "(`kvplan simulate` of that deployment: prefill_s, kv_pull_s, p2d_transfer_s per turn) "
                            "and what shortens it (prompt lengths, prefix caching and routing that keeps a "
                            "conversation's prefix on one engine), or relax the SLO")
        else:
            out["note"] += (f"; closest tried: {name} with {achieved} (SLO {human_s(slo_s)}): raise "
                            "--max-nodes, relax the SLO or lower the load")
    return out


@dataclass(frozen=True)
class _Inputs:
    sc: Scenario
    rate: float | None
    slo_s: float
    usd: float | None
    max_nodes: int
    ttl_grid: tuple[float, ...]


def _validate(scenario: Scenario | dict[str, Any] | str | Path, rate_per_s: float | None, slo_ttft_p90_ms: float,
              usd_per_node_hour: float | None, max_nodes: int, ttl_grid: Any) -> _Inputs:
    sc = as_scenario(scenario)
    if sc.deployment.mode == "aggregated":
        raise input_error("deployment.mode", "capacity starts from a disaggregated (P/D) scenario",
                          "give the P/D deployment; the aggregated column uses the same TP")
    trace = sc.workload.trace is not None
    if isinstance(sc.workload.arrival, ClosedLoopArrival) and not trace:
        raise input_error("workload.arrival", "capacity planning needs an open-loop (poisson) workload or a trace")
    if rate_per_s is not None and trace:
        raise input_error("--rate", "a trace brings its own clock", "leave out --rate (or scale the trace in a sweep)")
    for name, v in (("--rate", rate_per_s), ("--slo-ttft-p90-ms", slo_ttft_p90_ms)):
        if v is not None and not (isinstance(v, int | float) and math.isfinite(v) and v > 0):
            raise input_error(name, f"must be a positive number, got {v!r}")
    if not isinstance(max_nodes, int) or max_nodes < 2:
        raise input_error("max_nodes", "must be an integer >= 2")
    try:
        grid = tuple(float(t) for t in ttl_grid)
    except (TypeError, ValueError):
        raise input_error("--ttl-grid", f"must be TTLs in seconds, got {ttl_grid!r}") from None
    # a TTL within the expiry margin + skew (+ 1 s of router TTL) can never be used: every candidate is skipped
    floor = max(sc.policy.expiry_safety_margin_s + sc.policy.clock_skew_s, 0.0) + MIN_ROUTER_TTL_S  # skew may be < 0
    if not grid or any(not (math.isfinite(t) and floor <= t <= MAX_SIM_TIME_S) for t in grid):
        raise input_error("--ttl-grid", f"every TTL must be in {floor:g}..{MAX_SIM_TIME_S:g} s (expiry margin + "
                          f"clock skew + {MIN_ROUTER_TTL_S:g} s of router TTL up to the time bound), got {ttl_grid!r}",
                          "e.g. 60,120,240")
    usd = usd_per_node_hour if usd_per_node_hour is not None else get_hardware(sc.hardware).usd_per_hour
    if usd is not None and not (math.isfinite(usd) and usd >= 0):
        raise input_error("--usd-per-node-hour", f"must be >= 0, got {usd!r}")
    arr = sc.workload.arrival
    rate = None if trace or isinstance(arr, ClosedLoopArrival) else float(
        rate_per_s if rate_per_s is not None else arr.rate_per_s)
    return _Inputs(sc, rate, slo_ttft_p90_ms / 1000, float(usd) if usd is not None else None, max_nodes,
                   tuple(sorted(set(grid))))


def max_simulations(max_nodes: int, n_ttls: int, replications: int, max_rate: bool) -> int:
    """An upper bound of the simulations of one plan (the search above), for the work check before it starts:
    per P/D column the screen's smallest total, ``max_nodes`` and the bisection between (3 splits each; with
    bidirectional two runs per TTL), a few neighbour moves; the aggregated doublings and bisection; the
    max-load search of each answer."""
    totals = 2 + math.ceil(math.log2(max(max_nodes, 2)))
    moves = 2 * 4  # neighbour checks: a few moves of two checks
    bidir = (totals * SPLITS_PER_TOTAL + moves) * 2 * n_ttls
    off = totals * SPLITS_PER_TOTAL + moves
    agg = 2 * math.ceil(math.log2(max(max_nodes, 2))) + 2
    rate = 3 * (MAX_DOUBLINGS + BISECTION_STEPS + 1) if max_rate else 0
    return (bidir + off + agg + rate) * replications


def check_inputs(scenario: Scenario | dict[str, Any] | str | Path, rate_per_s: float | None, slo_ttft_p90_ms: float,
                 usd_per_node_hour: float | None = None, max_nodes: int = 16,
                 ttl_grid: Any = DEFAULT_TTL_GRID_S) -> None:
    """The one-line input errors of :func:`plan_capacity`, raised before any work (the CLI calls it first)."""
    _validate(scenario, rate_per_s, slo_ttft_p90_ms, usd_per_node_hour, max_nodes, ttl_grid)


def _pd_column(pl: _Planner, inp: _Inputs, bidir: bool, with_max_rate: bool) -> dict[str, Any]:
    label = f"bidirectional {'on' if bidir else 'off'}"
    at = pl.bidir_at if bidir else pl.off_at
    found, closest, checks = pl.smallest(at, pl.slack(bidir), label)
    if found is None:
        return {**_not_meeting((f"{closest[0]}P{closest[1]}D", closest[2]) if closest else None,
                               f"{inp.max_nodes} nodes", inp.slo_s), **({"ttl_rule": TTL_RULE} if bidir else {})}
    x, y, pick = found
    mr = _max_rate(pl.ev, pick.overrides, inp.rate, inp.slo_s) if with_max_rate and inp.rate is not None else None
    out = {"xpyd": f"{x}P{y}D", "prefill_nodes": x, "decode_nodes": y, "bidirectional": bidir,
           **_answer(pick, x + y, inp.usd, inp.rate, mr, pl.ev), "neighbour_checks": checks,
           "smallest_verified": all(not c["meets_slo"] for c in checks)}
    if bidir:
        out["ttl_candidates"] = pick.candidates
        out["ttl_rule"] = TTL_RULE
    return out


def _agg_column(pl: _Planner, inp: _Inputs, routing: str, with_max_rate: bool, guess: int | None) -> dict[str, Any]:
    tp = replica_tp(inp.sc)
    why = replica_tp_why(inp.sc)  # the TP rule's outcome, said in every answer (tensor_parallel_rule)
    if tp is None:  # heterogeneous TP with no TP of the scenario's for a replica running both phases (replica_tp)
        return {**_not_meeting(None, "", inp.slo_s), "note": aggregated_not_sized(inp.sc), "not_sized": True,
                "routing": routing, "tensor_parallel_size": None, "tensor_parallel_rule": why, "replicas": None,
                "neighbour_checks": []}
    n, pick, checks, closest = pl.aggregated(routing, tp, guess)
    if n is None or pick is None:
        return {**_not_meeting((f"{inp.max_nodes} replicas", closest) if closest else None,
                               f"{inp.max_nodes} replicas", inp.slo_s), "routing": routing, "not_sized": False,
                "tensor_parallel_size": tp, "tensor_parallel_rule": why}
    mr = _max_rate(pl.ev, pick.overrides, inp.rate, inp.slo_s) if with_max_rate and inp.rate is not None else None
    return {"replicas": n, "tensor_parallel_size": tp, "tensor_parallel_rule": why, "not_sized": False,
            "routing": routing, "prefix_caching": True,
            "xpyd": f"{n} aggregated", **_answer(pick, n, inp.usd, inp.rate, mr, pl.ev), "neighbour_checks": checks,
            "smallest_verified": all(not c["meets_slo"] for c in checks)}


def plan_capacity(
    scenario: Scenario | dict[str, Any] | str | Path,
    rate_per_s: float | None,
    slo_ttft_p90_ms: float,
    usd_per_node_hour: float | None = None,
    max_nodes: int = 16,
    replications: int = 2,
    workers: int = 1,
    backend: str = "local",
    progress: Callable[[int, int], None] | None = None,
    ttl_grid: tuple[float, ...] = DEFAULT_TTL_GRID_S,
    aggregated_routing: str | None = None,
    max_rate: bool = True,
) -> CapacityPlan:
    """Smallest deployments meeting ``slo_ttft_p90_ms`` at ``rate_per_s`` new conversations/s (default: the
    scenario's; a trace replays at its own clock): P/D with and without bidirectional transfer, and aggregated
    replicas; their policies, neighbour checks, maximum sustainable loads and cost per million turns."""
    inp = _validate(scenario, rate_per_s, slo_ttft_p90_ms, usd_per_node_hour, max_nodes, ttl_grid)
    sc = inp.sc
    rate_ov: dict[str, Any] = {}
    if inp.rate is not None:
        rate_ov = {"workload.arrival.rate_per_s": inp.rate, "workload.conversations": conversations_for(sc, inp.rate)}
    routing = aggregated_routing or default_aggregated_routing(sc)
    ev = Evaluator(sc, replications, workers, backend, progress, inp.slo_s)
    threshold = break_even_threshold(sc)
    pl = _Planner(ev, inp.slo_s, max_nodes, inp.ttl_grid, threshold, rate_ov, screened=sc.workload.trace is None)
    notes = _notes(sc, inp, replications, threshold, routing)
    on = _pd_column(pl, inp, True, max_rate)
    off = _pd_column(pl, inp, False, max_rate)
    guesses = [m["nodes"] for m in (on, off) if m.get("meets_slo")]
    agg = _agg_column(pl, inp, routing, max_rate, min(guesses) if guesses else None)
    tpc = next((m.get("turns_per_conversation") for m in (on, off, agg) if m.get("turns_per_conversation")), None)
    if ev.truncated_conversations > 0:
        from kvplan.plan.advice_report import context_cut_warning
        from kvplan.sim.engine import resolve

        cut = context_cut_warning([{"truncated_conversations": ev.truncated_conversations}],
                                  resolve(sc).arch.max_model_len,
                                  ev.truncated_of if sc.workload.trace is None else None)
        notes.append(f"WARNING: {cut}")
    return CapacityPlan(
        rate_per_s=inp.rate, slo_ttft_p90_ms=float(slo_ttft_p90_ms), usd_per_node_hour=inp.usd,
        turns_per_conversation=float(tpc) if tpc is not None else math.nan,
        with_bidirectional=on, without_bidirectional=off, aggregated=agg, simulations=ev.runs,
        notes=tuple(notes), disagreements=tuple(pl.disagreements))


def _base_rate(sc: Scenario) -> float:
    arr = sc.workload.arrival
    return arr.rate_per_s if not isinstance(arr, ClosedLoopArrival) else math.nan


def _notes(sc: Scenario, inp: _Inputs, replications: int, threshold: int, routing: str) -> list[str]:
    pol = sc.policy
    notes = [
        f"bidirectional on: TTL searched over {', '.join(f'{t:g}' for t in inp.ttl_grid)} s at each size (the "
        f"shortest meeting the SLO: ttl_rule), router TTL = TTL - {pol.expiry_safety_margin_s:g} s margin - "
        f"{pol.clock_skew_s:g} s skew - that run's p99 arrival-to-decision, threshold {threshold} tokens "
        "(pull-vs-recompute break-even); other policy fields as in the scenario",
        f"SLO met when the mean TTFT p90 over {replications} replications is <= the SLO with <= 1% of turns errored",
        (f"aggregated: replicas of {replica_tp_why(sc)}, prefix caching on, routing {routing}"
         if replica_tp(sc) is not None else
         "aggregated: not sized (prefill TP {} and decode TP {} differ; an aggregated replica runs one TP)".format(
             *role_tps(sc))),
        "smallest: one P fewer and one D fewer (one replica fewer) are simulated and miss the SLO "
        "(neighbour_checks)",
    ]
    if inp.rate is None:
        notes.append("trace replay: no rate to search (max load not computed); every size starts from 1P1D")
        return notes
    horizon = sc.workload.conversations / _base_rate(sc)  # kept at every rate (conversations_for)
    notes.append(f"every first run keeps {horizon:.0f} s of arrivals (conversations scale with the rate); a "
                 f"candidate meeting the SLO on it is judged on a run {EXTEND_FACTOR}x as long (with retention on, at "
                 "least twice TTL + p90 conversation span of arrivals): a load near capacity meets a TTFT SLO over a "
                 "short run while its queue still grows (plan/steady.py); judged_conversations in each answer")
    if inp.rate * horizon > MAX_CONVERSATIONS:
        horizon = MAX_CONVERSATIONS / inp.rate
        notes.append(f"WARNING: runs are capped at {MAX_CONVERSATIONS:,} conversations, so at {inp.rate:g}/s they "
                     f"keep only {horizon:.0f} s of arrivals (and fewer at the higher loads of the max-load search)")
    if horizon < 2 * max(inp.ttl_grid):
        notes.append(f"{horizon:.0f} s of arrivals is short against TTLs up to {max(inp.ttl_grid):g} s: a first run "
                     "meeting the SLO is judged on a run with at least twice TTL + conversation span of arrivals, "
                     "where retention reaches steady state; a first run missing it is not run again")
    return notes
