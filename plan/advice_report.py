"""The sentences and flags of a recommendation that come from what its runs measured (:mod:`kvplan.plan.advice`).

* :func:`saturation_lines`: what vLLM's defaults and bidirectional off saturate (health section), said as such:
  a saturated baseline is never read as "retention does not pay"; and the TTLs not eligible because they saturate
  something (in how many replications: "P compute in 1 of 3 replications"), when others do not.
* :func:`unsaturate_hint`: the smallest change that removes a saturation: a TTL that saturates nothing, else
  more P or D nodes (``kvplan capacity`` at this load).
* :func:`run_warnings` and :func:`steady_json`: runs too short for steady state, identical pinned KV at different
  TTLs, router TTLs that did not settle.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from kvplan.errors import KvplanInputError
from kvplan.plan.advice_rules import Rows, TtlCandidate
from kvplan.plan.advice_runs import ROUTER_ROUNDS, Saturation, raise_conversations_fix
from kvplan.sim.engine import Resolved, profile_parts, resolve_roles
from kvplan.sim.scenario import PoissonArrival, Scenario
from kvplan.units import human_s

VLLM_TTL_S = 480.0  # decoder_kv_blocks_ttl default (VLLM_BEHAVIOUR.md 1.1)
VLLM_THRESHOLD = 64  # kv_recompute_threshold default with bidirectional on
PROXY_ROUTER_TTL_S = 450.0  # disagg_proxy_multiturn.py hard-coded conversation TTL
#: Pinned-KV means of two TTLs within this relative difference are "the same" (a warning: the runs do not separate them).
SAME_PINNED_REL = 0.005
#: Pinned-KV means below this (GiB) are not compared.
SAME_PINNED_MIN_GIB = 0.5


def saturation_lines(defaults: tuple[dict[str, float], Saturation], off: tuple[dict[str, float], Saturation],
                     curve: list[TtlCandidate]) -> list[str]:
    """What the baselines saturate, said as such (never read as "retention does not pay")."""
    (def_m, def_sat), (off_m, off_sat) = defaults, off
    out = []
    if def_sat:
        fine = [c for c in curve if not c.saturated]
        # the least change to the defaults, not the advice: the TTL recommended (or kept if retention is kept on)
        # is chosen below among the TTLs that saturate nothing (new15: two TTLs read as a contradiction)
        fix = (f" The smallest change that removes it: TTL {max(fine, key=lambda c: c.ttl_s).ttl_s:g} s (router TTL "
               f"{max(fine, key=lambda c: c.ttl_s).router_ttl_s} s), the longest TTL tried that saturates nothing (the "
               "least change to the defaults, not the advice: the recommended TTL, below, is chosen among the TTLs "
               "that saturate nothing)." if fine else "")
        out.append(f"vLLM's defaults (TTL {VLLM_TTL_S:g} s, router TTL {PROXY_ROUTER_TTL_S:g} s, threshold "
                   f"{VLLM_THRESHOLD}) saturate {def_sat.text()} at this load (TTFT p50 {human_s(def_m['ttft_p50_s'])}, "
                   f"p90 {human_s(def_m['ttft_p90_s'])}, {def_m['errors']:.0f} failed turns): that is the defaults "
                   f"failing at this load, not a verdict on retention.{fix}")
    if off_sat:
        why = (" (recomputing every follow-up's context is more than P can serve)"
               if "prefill_compute" in off_sat.resources else "")
        verb = "saturates" if len(off_sat.resources) == 1 else "saturate"
        out.append(f"With bidirectional off, {off_sat.text()} {verb} at this load (P busy "
                   f"{off_m['prefill_utilization_steady']:.0%}, TTFT p50 {human_s(off_m['ttft_p50_s'])}){why}.")
    sat = [c for c in curve if c.saturated]
    if sat and len(sat) < len(curve):  # every TTL saturated: the TTL rule's own sentence says so
        out.append("Not eligible, saturated: " + "; ".join(
            f"TTL {c.ttl_s:g} s (router TTL {c.router_ttl_s} s) saturates {c.saturated} (TTFT p90 "
            f"{human_s(c.metrics['ttft_p90_s'])})" for c in sat) + ".")
    return out


def unsaturate_hint(rs: Resolved, sat: Saturation, curve: list[TtlCandidate]) -> list[str]:
    """When the recommendation itself saturates: the smallest change that removes it (a TTL, else more nodes)."""
    if not sat:
        return []
    fine = [c for c in curve if not c.saturated]
    if fine:
        within = [c for c in fine if c.feasible]  # a candidate is feasible when unsaturated and within the budget
        best = min(within or fine, key=lambda c: c.metrics["ttft_mean_s"])
        over = (f", but it pins up to {best.metrics['pinned_kv_gib_peak']:.1f} GiB of decode KV, above the decode HBM "
                "budget" if not within else "")
        return [f"Smallest change that removes the saturation: TTL {best.ttl_s:g} s (router TTL {best.router_ttl_s} s) "
                f"saturates nothing{over}."]
    dep, wl = rs.scenario.deployment, rs.scenario.workload
    add = []
    if {"prefill_compute", "prefill_held_kv"} & set(sat.resources) and not sat.backpressure:
        add.append(f"P nodes (now {dep.prefill_nodes})")
    if "decode_kv" in sat.resources or sat.backpressure:
        add.append(f"D nodes (now {dep.decode_nodes})")
    if "link" in sat.resources:
        add.append("link bandwidth")
    # `kvplan capacity --model M --hardware H --rate R` alone sizes the chat preset at its TP, not this workload:
    # the search must run on the same scenario (file, or preset options, or trace) the advice ran on
    # a replayed trace brings its own arrivals: the scenario's (preset's) Poisson rate is not the load searched
    rate = (f" at {wl.arrival.rate_per_s:g} new conversations/s"
            if isinstance(wl.arrival, PoissonArrival) and wl.trace is None else
            " at the trace's own arrivals" if wl.trace is not None else "")
    return [f"No TTL tried removes the saturation ({sat.text()}): add {' and '.join(add) or 'nodes'} — run `kvplan "
            "capacity` on this same scenario (the same SCENARIO.yaml, or the same --workload, --model, --hardware, "
            f"--rate and --trace options) with --slo-ttft-p90-ms <SLO> (xPyD search{rate} for {rs.arch.name} on "
            f"{rs.node.name}; the deployment now is {dep.prefill_nodes}P{dep.decode_nodes}D {_tp_text(dep)})."]


def _tp_text(dep: Any) -> str:
    """``TP8``, or ``P TP4 / D TP2`` when the roles differ."""
    p = dep.prefill_tensor_parallel_size or dep.tensor_parallel_size
    d = dep.decode_tensor_parallel_size or dep.tensor_parallel_size
    return f"TP{p}" if p == d else f"P TP{p} / D TP{d}"


def steady_json(sc: Scenario, lengthened: tuple[int, int] | None, curve: list[TtlCandidate], off: Rows) -> dict[str, Any]:
    """The ``steady_state`` JSON: conversations asked and simulated, TTLs not steady, TTLs saturated."""
    wl = sc.workload
    ran = [int(r["conversations"]) for r in off if r.get("error") is None and "conversations" in r]
    simulated = ran[0] if ran else wl.conversations  # a trace replays its own sessions
    return {"conversations_asked": lengthened[0] if lengthened else simulated,
            "conversations_simulated": simulated, "lengthened": lengthened is not None,
            "unsteady_ttls_s": [c.ttl_s for c in curve if not c.steady and not c.saturated and c.router_settled],
            "saturated_ttls_s": [c.ttl_s for c in curve if c.saturated],
            # a replay whose sessions all start together has no steady state at any length (COHORT)
            "sessions_start_together": sessions_start_together(sc),
            "rule": "steady at a TTL when arrival span >= TTL + p90 conversation span (measured in every replication); "
                    "a saturated TTL has no steady state at any length (its queues grow) and is listed as saturated"}


#: What marks a context-cut warning (``recommend``'s text prints it under the headline: the advice is about the
#: shorter workload the runs simulated).
CONTEXT_CUT = "per run were cut at the model's context limit"


def context_cut_warning(rows: Rows, max_model_len: int, planned: int | None = None) -> str | None:
    """What a run did not simulate: conversations cut at the context limit (``truncated_conversations``, the turns from
    the first one beyond ``max_model_len`` on, a conversation whose first prompt is beyond it entirely), or None;
    with ``planned`` (the run's planned conversations) the share too."""
    cut = [float(r.get("truncated_conversations", 0) or 0) for r in rows if r.get("error") is None]
    if not cut or max(cut) <= 0:
        return None
    of = f" of {planned:,} ({max(cut) / planned:.0%})" if planned and planned >= max(cut) else ""
    return (f"{max(cut):,.0f}{of} conversation(s) {CONTEXT_CUT} ({max_model_len:,} tokens): "
            "their turns from the first one beyond it on (all of them when the first prompt is) are not simulated, so "
            "the figures describe a shorter workload; use a model with a longer context or deployment.max_model_len")


def sessions_start_together(sc: Scenario) -> bool:
    """Whether ``sc`` replays a trace whose sessions all start together: a weka trace (every file's sessions on its
    own clock from t = 0; a sub-agent at its marker inside its parent's session, ``window_s`` refused). Such a replay
    is one cohort ramping up and draining, not a stream of arrivals: no replay length reaches a steady state."""
    src = sc.workload.trace
    if src is None:
        return False
    if src.format is not None:
        return src.format == "weka"
    from kvplan.traces.readers import detect_trace_format

    try:
        return detect_trace_format(src.path) == "weka"
    except (KvplanInputError, OSError):  # unreadable: the runs say so in their own words
        return False


#: What limits the evidence of a replay whose sessions all start together (:func:`sessions_start_together`).
COHORT = ("the trace's sessions all start together (weka: every file at t = 0), so the replay is one cohort ramping up "
          "and draining, not a stream of arrivals: no replay length reaches a steady state (a longer or larger replay "
          "starts its sessions together too)")
#: ... and what would give a steady judgement.
COHORT_FIX = ("for a steady load of such sessions, fit a workload to the trace (`kvplan workload fit TRACE --out "
              "w.yaml`) and recommend on it at a Poisson rate (`kvplan recommend w.yaml --rate R`)")


def run_warnings(rs: Resolved, curve: list[TtlCandidate], rows_at: Mapping[float, Rows] | None = None) -> list[str]:
    """An extrapolated profile, runs too short for steady state (a replay whose sessions all start together: no
    steady state at any length, :data:`COHORT`), identical pinned KV at different TTLs, and router TTLs that did not
    settle."""
    out = []
    # each role's own profile: under heterogeneous TP, P or D may run on a profile composed for its TP while
    # tensor_parallel_size's is calibrated (qwen3-32b on p5en, P at TP4: p5en-qwen3-32b's corrections borrowed)
    if any(r.profile.extrapolated for r in resolve_roles(rs.scenario, rs)):
        parts = profile_parts(rs)  # heterogeneous TP: P's and D's parts from their own TP's profiles
        out.append("profile not calibrated on this deployment: " + ("; ".join(f"{k}: {v}" for k, v in sorted(
            parts.items())) if parts else rs.profile.status))
    # saturated (or unsettled: its P-decision delay leaves no router TTL) -> no length would be steady
    short = [c.ttl_s for c in curve if not c.steady and not c.saturated and c.router_settled]
    if short and sessions_start_together(rs.scenario):
        out.append(f"no steady state at TTL {', '.join(f'{t:g}' for t in short)} s: {COHORT}; their pinned KV, hit "
                   f"rates and saturation are this cohort's, at its concurrency, not a steady load's; {COHORT_FIX}")
    elif short:
        longest = max(short)  # the TTL needing the most arrivals: its count makes every flagged TTL steady
        fix = ("the trace cannot be lengthened: replay a longer window" if rs.scenario.workload.trace is not None
               else raise_conversations_fix((rows_at or {}).get(longest, []), longest, rs.scenario.workload.conversations))
        out.append(f"runs too short for steady state at TTL {', '.join(f'{t:g}' for t in short)} s (arrival span < "
                   f"TTL + p90 conversation span): their pinned KV and hit rates are not steady figures; {fix}")
    pinned = [(c.ttl_s, c.metrics["pinned_kv_gib_mean"]) for c in curve
              if math.isfinite(c.metrics["pinned_kv_gib_mean"]) and c.metrics["pinned_kv_gib_mean"] > SAME_PINNED_MIN_GIB]
    for (t1, g1), (t2, g2) in zip(pinned, pinned[1:], strict=False):
        if abs(g1 - g2) <= SAME_PINNED_REL * max(g1, g2):
            out.append(f"pinned decode KV mean is the same ({g1:.1f} GiB) at TTL {t1:g} s and {t2:g} s: the runs do not "
                       "separate them (too short for steady state, or the decode pool is full)")
    unsettled = [c.ttl_s for c in curve if not c.router_settled]
    if unsettled:  # one line for all of them (a saturated deployment: often every TTL of the grid)
        at = "TTL" if len(unsettled) == 1 else "TTLs"
        out.append(f"router TTL at {at} {', '.join(f'{t:g}' for t in unsettled)} s did not settle within "
                   f"{ROUTER_ROUNDS} rounds: its own p99 arrival->P decision leaves no router TTL that expires before P "
                   "would decline, or grows as the router TTL shrinks (P queues at this TTL); shown at its longest "
                   "router TTL")
    return out


def routing_note(sc: Scenario, rows: Rows) -> str | None:
    """The health section's routing finding (:func:`kvplan.sim.health.routing_miss`) over a configuration's runs: when
    ``sc`` routes its decode legs blind to where a conversation's KV is (``round_robin`` or ``random`` over several D)
    and, on the mean of its runs, at least :data:`~kvplan.sim.health.ROUTING_MISS_SHARE` of the follow-up turns found
    less than half their prompt in their D's prefix cache (``follow_up_d_missed_fraction``, per run from
    :func:`kvplan.plan.executor.run_extras`), the line naming the setting that fixes it; else None."""
    from kvplan.sim.health import ROUTING_MISS_SHARE, engines_routed, kv_blind_routing, routing_warning

    ok = [r for r in rows if r.get("error") is None and r.get("follow_up_d_missed_fraction") is not None]
    if not kv_blind_routing(sc) or not ok:
        return None
    share = sum(float(r["follow_up_d_missed_fraction"]) for r in ok) / len(ok)
    if share < ROUTING_MISS_SHARE:
        return None
    found = sum(float(r.get("follow_up_d_hit_token_fraction") or 0.0) for r in ok) / len(ok)
    counted = "one run" if len(ok) == 1 else f"mean of {len(ok)} replications"
    n, what = engines_routed(sc)
    return routing_warning({"routing": sc.deployment.routing, "decode_nodes": n, "engines": what,
                            "missed_fraction": share, "d_hit_token_fraction": found, "counted": counted})
