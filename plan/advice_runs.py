"""What :mod:`kvplan.plan.advice` reads from its runs and from the workload before it applies its rules.

* :func:`saturation`: the resources a configuration saturates, from the health section of its runs
  (:mod:`kvplan.sim.health`, a resource counts when any replication saturates it, and the text says in how many:
  "P compute in 1 of 3 replications").
* :func:`settle_router_ttls`: each TTL candidate simulated with its **own** router TTL. Round 0 uses
  ``floor(TTL - margin - 1 s)``; each round measures the candidate's own p99 of arrival -> P's connector
  decision (``p_decide_p99_s``) and, when that exceeds the allowance it was run with, re-runs it with
  ``floor(TTL - margin - ceil(p99))``; a candidate is settled once its measured allowance is within the one it
  ran with (so its router entries expire before P would decline the read, PR #47021). One that
  :data:`ROUTER_ROUNDS` rounds do not settle, or whose delay leaves no router TTL of 1 s, keeps its first
  (longest) router TTL and is flagged: P's decision delay grows as the router forgets (saturation).
* :func:`prune_ttls`: the analytic screen (:func:`kvplan.plan.screen.screen_scenarios`; on a trace, the CDF of
  its gaps) orders the TTL grid by hit rate; TTLs whose screened hit rate is under
  :data:`PRUNE_LOW_HIT_FRACTION` of the best, and those above the first after the one reaching
  :data:`PRUNE_HIGH_HIT_FRACTION` of it, are not simulated (the TTL rule could not pick them), and are listed
  as pruned. When no TTL gets any hit, the shortest and the longest are simulated (they say so). TTLs whose
  screened prefill utilisation reaches :data:`PRUNE_P_OVERLOAD` are pruned too, unless every TTL kept overloads P.
* :func:`steady_conversations`: how many conversations make the arrival span at least
  :data:`STEADY_SPAN_FACTOR` x (TTL + p90 conversation span) (the steady-window definition of
  ``run_extras``), estimated before any run, when at most :data:`MAX_LENGTHEN_FACTOR` x the scenario's do;
  every run is checked after with its measured spans (:func:`steady`) and flagged when too short.
* :func:`workload_gaps`: the turn gaps the rationale quotes: the synthetic ``turn_gap_s``, or the trace's
  arrival-to-arrival gaps as ``kvplan workload show`` computes them (:func:`kvplan.traces.stats.turn_pairs`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from kvplan.errors import KvplanInputError, input_error
from kvplan.models.costs import decode_step_time_s
from kvplan.plan.advice_rules import Rows, col, router_ttl
from kvplan.plan.screen import formula_prefix_user, quantile_sample, screen_scenarios
from kvplan.sim.engine import Resolved, resolve_roles
from kvplan.sim.scenario import ClosedLoopArrival, PoissonArrival, Scenario, with_overrides
from kvplan.units import human_s

K = TypeVar("K", bound=Hashable)

#: Rounds of the router-TTL search per candidate (round 0 included).
ROUTER_ROUNDS = 3
#: The smallest P-decision allowance (s): the router rule's floor (and round 0 of the search).
MIN_ALLOWANCE_S = 1.0
#: Screen pruning: TTLs whose screened hit rate is under this share of the best are dropped ...
PRUNE_LOW_HIT_FRACTION = 0.25
#: ... and TTLs beyond the one after the first reaching this share of the best.
PRUNE_HIGH_HIT_FRACTION = 0.99
#: ... and TTLs whose screened prefill utilisation is at least this (P overloaded by a quarter: the misses of a
#: too-short TTL saturate P), when another TTL kept is below 1.
PRUNE_P_OVERLOAD = 1.25
#: Arrival span sought, in units of (TTL + p90 conversation span): run_extras' steady window starts at
#: min(t_b / 2, TTL + p90 span), so it is steady only when t_b >= 2 (TTL + p90 span).
STEADY_SPAN_FACTOR = 2.0
#: Lengthening stops at this many times the scenario's conversations (the rest is flagged).
MAX_LENGTHEN_FACTOR = 4.0
#: A resource is saturated for a configuration when at least this many of its replications saturate it: one, so a
#: TTL that saturates P on one seed of three is not read as safe (its TTFT tail is that replication's queue); the
#: text says in how many (:meth:`Saturation.text`: "P compute in 1 of 3 replications").
SATURATED_MIN_REPLICATIONS = 1

#: health resource -> what the advice calls it.
RESOURCE_NAMES = {"decode_kv": "decode HBM", "prefill_held_kv": "P's KV pool", "prefill_compute": "P compute",
                  "link": "the P<->D links", "decode_engine_thread": "D's engine thread",
                  "prefill_engine_thread": "P's engine thread"}


# --- saturation ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Saturation:
    """The resources a configuration saturates (health keys, in :data:`RESOURCE_NAMES` order), why, and in how many
    of its replications (``counts[i]`` of ``replications`` saturate ``resources[i]``; empty counts: all of them)."""

    resources: tuple[str, ...]
    by_retention: bool = False
    backpressure: bool = False
    counts: tuple[int, ...] = ()
    replications: int = 0

    def __bool__(self) -> bool:
        return bool(self.resources)

    def count(self, resource: str) -> int:
        """Replications saturating ``resource`` (all of them when the counts are not known)."""
        if resource not in self.resources:
            return 0
        return self.counts[self.resources.index(resource)] if self.counts else self.replications

    def text(self) -> str:
        """'decode HBM and P's KV pool' with the cause of each, and 'in k of n replications' when not in all."""
        parts = []
        for r in self.resources:
            name = RESOURCE_NAMES[r]
            if r == "decode_kv" and self.by_retention:
                name += " (pinned KV of finished conversations)"
            if r == "prefill_held_kv" and self.backpressure:
                name += " (lease backpressure: prompts held until D can read them)"
            k = self.count(r)
            if 0 < k < self.replications:
                name += f" in {k} of {self.replications} replications"
            parts.append(name)
        return " and ".join(parts) if len(parts) <= 2 else ", ".join(parts[:-1]) + " and " + parts[-1]

    def share(self) -> float:
        """Share of the replications saturating the most often saturated resource (0: none saturates)."""
        if not self.resources or self.replications <= 0:
            return 0.0
        return max(self.count(r) for r in self.resources) / self.replications

    def replication_counts(self) -> dict[str, int]:
        """{health resource: replications saturating it} (the ``saturated_replications`` JSON)."""
        return {r: self.count(r) for r in self.resources}


def _count(rows: Rows, key: str) -> int:
    """Replications whose (boolean) health field ``key`` is set (failed runs not counted)."""
    return sum(1 for x in col(rows, key) if math.isfinite(x) and x >= 0.5)


def saturation(rows: Rows) -> Saturation:
    """What the health sections of ``rows`` (one per replication) saturate: a resource at least
    :data:`SATURATED_MIN_REPLICATIONS` of them saturate, with the number that do."""
    counts = {r: _count(rows, f"health.resources.{r}.saturated") for r in RESOURCE_NAMES}
    res = tuple(r for r in RESOURCE_NAMES if counts[r] >= SATURATED_MIN_REPLICATIONS)
    return Saturation(res, _count(rows, "health.resources.decode_kv.by_retention") >= SATURATED_MIN_REPLICATIONS,
                      _count(rows, "health.resources.prefill_held_kv.backpressure_from_decode")
                      >= SATURATED_MIN_REPLICATIONS,
                      tuple(counts[r] for r in res), sum(1 for r in rows if r.get("error") is None))


# --- router TTL per candidate ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RouterFit:
    """A candidate's runs at the router TTL that leaves room for its own P-decision delay."""

    rows: Rows
    router_ttl_s: int
    allowance_s: float  # the allowance it ran with (>= its own measured p99, when settled)
    measured_s: float  # its own p99 arrival -> P decision, max over replications
    rounds: int
    settled: bool


def measured_allowance(rows: Rows) -> float:
    """``max(1 s, ceil(p99 arrival -> P decision))`` over the replications (NaN runs ignored)."""
    v = [x for x in col(rows, "p_decide_p99_s") if math.isfinite(x)]
    return max(MIN_ALLOWANCE_S, float(math.ceil(max(v)))) if v else MIN_ALLOWANCE_S


def settle_router_ttls(run: Callable[[dict[K, dict[str, Any]]], dict[K, Rows]], ttls: Mapping[K, float],
                       overrides: Callable[[K, int], dict[str, Any]], margin: float) -> dict[K, RouterFit]:
    """Simulate every candidate ``key`` (TTL ``ttls[key]``) with ``overrides(key, router_ttl)`` until its router
    TTL leaves room for its own measured P-decision delay (module docstring); all pending candidates of a round
    run together (one parallel batch).

    The result is the last settled round; a candidate that does not settle (its measured delay leaves no router
    TTL >= 1 s, its round saturates P, or the delay keeps growing as the router TTL shrinks: fewer hits load P
    more) keeps its first round, the longest router TTL, and is flagged ``settled=False``.
    """
    allowance = dict.fromkeys(ttls, MIN_ALLOWANCE_S)
    fits: dict[K, RouterFit] = {}
    pending = list(ttls)
    for rnd in range(1, ROUTER_ROUNDS + 1):
        routers = {k: router_ttl(ttls[k], margin, allowance[k]) for k in pending}
        rows = run({k: overrides(k, routers[k]) for k in pending})
        nxt = []
        for k in pending:
            got = measured_allowance(rows[k])
            fit = RouterFit(rows[k], routers[k], allowance[k], got, rnd, got <= allowance[k])
            if fit.settled or k not in fits:
                fits[k] = fit
            no_room = ttls[k] - margin - got < 1.0  # floor(TTL - margin - allowance) would be below 1 s
            # a shorter router TTL only turns pulls into recomputes: a round that saturates P cannot be cured by one
            p_saturated = bool({"prefill_compute", "prefill_held_kv"} & set(saturation(rows[k]).resources))
            if not fit.settled and not no_room and not p_saturated and rnd < ROUTER_ROUNDS:
                allowance[k] = got
                nxt.append(k)
        pending = nxt
        if not pending:
            break
    return fits


# --- screen pruning --------------------------------------------------------------------------------------------


def screened_hits(sc: Scenario, grid: Sequence[float], margin: float, trace_gaps: np.ndarray | None) -> np.ndarray:
    """Hit rate per TTL of ``grid`` with the router TTL at ``TTL - margin - 1 s``: the analytic screen, or on a
    trace the share of its gaps within that router TTL; NaN for a closed loop (a turn also waits for a free
    client, which the screen's gap model does not see: nothing is pruned)."""
    return screen_ttls(sc, grid, margin, trace_gaps)[0]


def screen_ttls(sc: Scenario, grid: Sequence[float], margin: float,
                trace_gaps: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(hit rate, prefill utilisation) per TTL of ``grid`` (:func:`screened_hits`); the utilisation is the
    screen's (NaN on a trace or a closed loop)."""
    routers = np.array([max(t - margin - MIN_ALLOWANCE_S, 1.0) for t in grid])
    nan = np.full(len(grid), np.nan)
    if trace_gaps is None and isinstance(sc.workload.arrival, ClosedLoopArrival):
        return nan, nan
    if trace_gaps is not None:
        g = np.sort(trace_gaps[np.isfinite(trace_gaps)])
        return np.searchsorted(g, routers, side="right") / max(len(g), 1), nan
    variants = [with_overrides(sc, {"policy.bidirectional": True, "policy.decoder_kv_blocks_ttl_s": t,
                                    "policy.router_ttl_s": float(r), "policy.kv_load_failure_policy": "recompute"})
                for t, r in zip(grid, routers, strict=True)]
    df = screen_scenarios(variants)
    return (df["screen_hit_rate"].to_numpy(dtype=float), df["screen_prefill_utilization"].to_numpy(dtype=float))


def prune_ttls(grid: Sequence[float], hits: np.ndarray | Sequence[float],
               p_util: np.ndarray | Sequence[float] | None = None) -> tuple[list[float], list[float]]:
    """(TTLs to simulate, TTLs pruned) of the sorted ``grid`` by the screened ``hits`` and, when given, the
    screened prefill utilisation ``p_util`` (module docstring)."""
    keep, pruned = _prune_by_hits(grid, hits)
    if p_util is None:
        return keep, pruned
    util = dict(zip(grid, np.asarray(p_util, dtype=float), strict=True))
    over = [t for t in keep if util[t] >= PRUNE_P_OVERLOAD]
    if over and any(util[t] < 1.0 for t in keep):  # keep them all when every TTL overloads P (it is said so)
        keep = [t for t in keep if t not in over]
        pruned = sorted([*pruned, *over])
    return keep, pruned


def _prune_by_hits(grid: Sequence[float], hits: np.ndarray | Sequence[float]) -> tuple[list[float], list[float]]:
    n = len(grid)
    raw = np.asarray(hits, dtype=float)
    if n <= 2 or not np.isfinite(raw).any():  # nothing to prune, or the screen could not say (closed loop)
        return list(grid), []
    h = np.nan_to_num(raw, nan=0.0)
    top = float(h.max())
    if top <= 0:
        keep = {0, n - 1}  # nothing comes back within any TTL: the shortest and the longest say so
    else:
        hi = int(np.argmax(h >= PRUNE_HIGH_HIT_FRACTION * top))
        lo = int(np.argmax(h >= PRUNE_LOW_HIT_FRACTION * top))
        keep = set(range(lo, min(hi + 1, n - 1) + 1))
    return [t for i, t in enumerate(grid) if i in keep], [t for i, t in enumerate(grid) if i not in keep]


# --- steady state ----------------------------------------------------------------------------------------------


def conversation_span_estimate_s(rs: Resolved) -> float:
    """p90 of first -> last arrival of a conversation, before any run: (T90 - 1) x (mean gap + one turn's decode
    at batch 1), T90 the p90 of turns (a lower bound of the service time: the runs measure the real one)."""
    wl = rs.scenario.workload
    t90 = float(np.percentile(np.maximum(1, np.rint(quantile_sample(wl.turns))), 90))
    gap = float(np.mean(quantile_sample(wl.turn_gap_s)))
    out = float(np.mean(np.maximum(1, np.rint(quantile_sample(wl.output_tokens)))))
    prefix, user = formula_prefix_user(wl)  # turn 1 as the formulas count it (plan/screen.py)
    ctx = prefix + t90 / 2 * (user + out)
    service = out * decode_step_time_s(resolve_roles(rs.scenario, rs)[1].costs.decode, 1, int(ctx))  # at D's TP
    return max(t90 - 1, 0.0) * (gap + service)


def steady_conversations(rs: Resolved, ttl_s: float) -> int | None:
    """Conversations giving an arrival span of :data:`STEADY_SPAN_FACTOR` x (``ttl_s`` + p90 conversation span)
    at the scenario's Poisson rate, capped at :data:`MAX_LENGTHEN_FACTOR` x the scenario's; None when it needs
    no more, or when a trace or closed loop (which cannot be lengthened) or more than the cap would be needed
    (the runs are then flagged instead)."""
    wl = rs.scenario.workload
    if wl.trace is not None or not isinstance(wl.arrival, PoissonArrival):
        return None
    need = STEADY_SPAN_FACTOR * (ttl_s + conversation_span_estimate_s(rs)) * wl.arrival.rate_per_s
    if wl.conversations >= need or need > MAX_LENGTHEN_FACTOR * wl.conversations:
        return None
    return int(math.ceil(need))


def steady(rows: Rows, ttl_s: float) -> bool:
    """The issue-18 criterion on measured spans: arrival span >= TTL + p90 conversation span (every replication)."""
    spans, conv = col(rows, "arrival_span_s"), col(rows, "conversation_span_p90_s")
    ok = [a >= ttl_s + c for a, c in zip(spans, conv, strict=True) if math.isfinite(a) and math.isfinite(c)]
    return bool(ok) and all(ok)


def conversations_for_steady(rows: Rows, ttl_s: float, conversations: int) -> int | None:
    """Conversations at the same rate whose arrivals would span TTL + p90 conversation span in every replication
    (:func:`steady`): ``conversations`` x the largest (TTL + span) / arrival span over the replications, rounded up;
    None when no replication measured both spans. A floor: a longer run's conversations can span longer."""
    spans, conv = col(rows, "arrival_span_s"), col(rows, "conversation_span_p90_s")
    ratios = [(ttl_s + c) / a for a, c in zip(spans, conv, strict=True) if math.isfinite(a) and math.isfinite(c) and a > 0]
    if not ratios or not math.isfinite(max(ratios)):
        return None
    return max(int(math.ceil(conversations * max(ratios))), conversations + 1)


def raise_conversations_fix(rows: Rows, ttl_s: float, conversations: int, option: str = "--conversations") -> str:
    """'raise --conversations to at least N' (:func:`conversations_for_steady`), or without a number when the runs
    measured no spans: a newcomer told only 'raise --conversations' had to guess by how much."""
    n = conversations_for_steady(rows, ttl_s, conversations)
    if n is None:
        return f"raise {option}"
    return (f"raise {option} to at least {n:,} (from {conversations:,}: arrivals spanning TTL {ttl_s:g} s + the p90 "
            "conversation span at the same rate)")


# --- gaps ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gaps:
    """Turn-gap quantiles (s) of the workload or trace, and what they measure."""

    p10: float
    p50: float
    p90: float
    what: str

    def text(self) -> str:
        """The sentence fragment the rationale quotes."""
        return f"{self.what} p10 {_s(self.p10)}, p50 {_s(self.p50)}, p90 {_s(self.p90)}"


def _s(x: float) -> str:
    return "0 s" if x == 0 else human_s(x)


def trace_pairs(sc: Scenario, max_model_len: int | None = None) -> pd.DataFrame | None:
    """The (parent -> child) turn pairs of the requests the scenario's trace replays
    (:func:`kvplan.traces.stats.turn_pairs`, what ``kvplan workload show`` reads), gaps divided by its
    ``time_scale``; None for a synthetic workload.

    The requests are those the simulator replays (:func:`kvplan.traces.select.select`): inside ``window_s``, and
    with ``input + output`` above ``max_model_len`` skipped (each next kept request then pairs with the previous
    kept one, as the replay does) or truncated, as ``overlong`` says. ``sample_sessions`` is not applied: each
    replication draws its own sessions from its own seed, so the pairs are those of every session it may draw.
    ``attrs['selection']`` counts the requests read and replayed (:func:`workload_gaps` quotes them). A trace of
    which no request is left to replay is refused in one line (every run would fail)."""
    src = sc.workload.trace
    if src is None:
        return None
    from kvplan.traces.readers import load_trace
    from kvplan.traces.select import select
    from kvplan.traces.stats import turn_pairs

    trace = load_trace(src.path, src.format)
    try:  # warn=False: the replay itself says what it skips ("select: N request(s) over ...")
        sel, report = select(trace, time_scale=src.time_scale, window_s=src.window_s,
                             max_context_tokens=max_model_len, overlong=src.overlong, warn=False)
    except KvplanInputError as exc:  # nothing left to replay: every run would fail, so no advice either
        raise input_error(f"workload.trace '{src.path}'", str(exc).removeprefix("select: ")) from None
    pairs = turn_pairs(sel)  # select divided the arrivals by time_scale
    pairs.attrs["selection"] = {"input_requests": int(report["input_requests"]),
                                "requests_replayed": int(report["kept_requests"]),
                                "skipped_overlong": int(report["skipped_overlong"]),
                                "truncated_overlong": int(report["truncated_overlong"]),
                                "outside_window": int(report.get("dropped_outside_window", 0)),
                                "max_model_len": max_model_len}
    return pairs


def trace_gap_sample(pairs: pd.DataFrame | None) -> np.ndarray | None:
    """The finite arrival-to-arrival gaps of :func:`trace_pairs` (None for a synthetic workload)."""
    if pairs is None:
        return None
    gaps = pairs["gap_s"].to_numpy(dtype=float)
    return gaps[np.isfinite(gaps)]


def workload_gaps(sc: Scenario, trace_gaps: np.ndarray | None, selection: Mapping[str, Any] | None = None) -> Gaps | None:
    """The gaps the rationale quotes; None for a trace without any follow-up turn replayed. ``selection``
    (:func:`trace_pairs`' ``attrs['selection']``): when the replay leaves requests of the trace out, the text says
    the gaps are those of the requests replayed, and how many of the trace's those are."""
    if trace_gaps is not None:
        if not len(trace_gaps):
            return None
        q = np.percentile(trace_gaps, [10, 50, 90])
        return Gaps(float(q[0]), float(q[1]), float(q[2]), _trace_gaps_what(selection))
    q = np.percentile(quantile_sample(sc.workload.turn_gap_s), [10, 50, 90])
    what = ("think times (closed loop: a turn also waits for a free client)"
            if isinstance(sc.workload.arrival, ClosedLoopArrival) else "turn gaps (end of response to next turn)")
    return Gaps(float(q[0]), float(q[1]), float(q[2]), what)


def no_follow_ups(selection: Mapping[str, Any] | None) -> str:
    """What the rationale says for a workload without any follow-up turn to take gaps from (``selection``: as
    :func:`workload_gaps`)."""
    of, why = _replayed(selection)
    return f"no follow-up turns among the {of}" + (f" ({why})" if why else "") if of else "no follow-up turns"


def _trace_gaps_what(selection: Mapping[str, Any] | None) -> str:
    """What the trace's gaps are of: the whole trace, or the requests replayed (and why the others are not)."""
    of, why = _replayed(selection)
    if not of:
        return "trace turn gaps (arrival to arrival, as workload show)"
    return f"turn gaps of the {of} (arrival to arrival" + (f"; {why})" if why else ")")


def _replayed(selection: Mapping[str, Any] | None) -> tuple[str, str]:
    """('1 of 68 trace requests replayed', '67 over the 40,960-token context skipped'), or ('', '') when the replay
    keeps every request of the trace."""
    if not selection or selection["requests_replayed"] >= selection["input_requests"]:
        return "", ""
    left = []
    if selection.get("skipped_overlong"):
        left.append(f"{selection['skipped_overlong']:,} over the {selection['max_model_len']:,}-token context skipped")
    if selection.get("outside_window"):
        left.append(f"{selection['outside_window']:,} outside window_s")
    return (f"{selection['requests_replayed']:,} of {selection['input_requests']:,} trace requests replayed",
            " and ".join(left))
