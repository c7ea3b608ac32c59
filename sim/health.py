"""The health section of every result (``summary.json["health"]``): what saturated, what bound TTFT, what failed.

A run can be "correct" and still useless to read: the Mooncake replay on 1P1D at vLLM's defaults reports
a TTFT p50 of over an hour because every finished request pins its KV on D for 480 s and new requests
wait for expiries. The health section names that: per resource (prefill compute, decode KV pool, the
P<->D links, P's prefix cache, P's and D's engine threads) its utilisation and the waits it caused, the
*binding* resource (the one requests waited on longest), and every failed turn with its cause. All of it is
derived from the same turn records and summary as the rest of the result (no extra state).

Definitions (ASSUMPTIONS of this report, not of the model):

* A resource is **saturated** when requests waited on it for more than :data:`WAIT_S` at p90 *and* it
  was at least :data:`BUSY_FRACTION` busy (prefill: the **busiest** engine's busy time over the steady window,
  so that one P falling behind counts even while others idle; ``utilization_mean`` is the mean over engines,
  ``engines_over_busy`` how many reached :data:`BUSY_FRACTION`; the steady window is the second half
  of the arrivals, ``t_b / 2`` to ``t_b`` with ``t_b`` the last new conversation's first arrival or a trace's
  last request, so neither the ramp-up nor the drain after the last arrival dilutes it, nor does the backlog
  served after it inflate it; ``utilization_window`` says which; a closed loop, which has no such window, over
  the run up to the last response; decode: the pinned (retained) peak share of the pool, the retention pressure
  a TTL choice controls; ``used_peak_fraction``, the highest share of one D's pool held at once by admitted and
  running requests and pins (what admission waits on; ``summary["decode_kv_used_peak_fraction"]``; in
  aggregated mode of one replica's pool, held by scheduled and running requests), is reported beside it and
  warns when it reaches :data:`BUSY_FRACTION` with admission waits over :data:`WAIT_S`, but is not judged: a
  pool that fills at its peak while the best TTL runs is not a reason to
  rule that TTL out (judged on it, ``recommend`` dropped the best TTL of the 16P56D benchmark for one 89x worse);
  link: bytes x seconds per byte over (links x span), a lower bound of the busiest link; engine
  threads: below).
* **Engine threads** (``decode_engine_thread``, ``prefill_engine_thread``): an engine's thread is **busy**
  with the KV reads it posts (request creation, post and, over ``kv_transport: tcp``, the wire: the work
  ``sim/xfer.py`` returns and ``charge_thread`` charges, counted when posted, hidden behind a forward or not), and
  with ``kv_post_overlaps_forward: false`` also with the forward of each step that posted reads (that forward is
  launched only after the posting, on the same thread; counted when the step starts; an empty step's posting has
  no forward). Over the same window as prefill compute, for the busiest engine of the role: ``busy_fraction`` is
  that busy share, ``post_fraction`` the posting work's alone, ``busy_fraction_mean`` the mean over engines, and
  ``utilization`` (the figure judged) the share its arrivals **demanded**: ``busy_fraction`` x requests that
  reached it in the window / requests it took in (D: admitted, P: scheduled), equal to ``busy_fraction`` while
  it keeps up and above it when its queue grows (a D whose posts stretch its steps while its pool is full
  admits, and so posts, only as fast as finishes free blocks: its achieved share stays below 1 however far
  behind it falls). The wait is that engine's queue: D's admission (``d_queue_s``), P's queue
  (``prefill_queue_s``); of resources with the same wait, a saturated one binds first.
* The waits are the TTFT components of ``turns.csv``: ``prefill_queue_s`` (P), ``d_queue_s`` (admission
  to D, waiting for KV blocks or a batch slot), ``kv_pull_s`` + ``p2d_transfer_s`` (links).
* A resource at least :data:`NEAR_FRACTION` busy that requests did not (yet) wait on is a warning.
* A pool (decode KV, P's KV held for D) is also **saturated** when its queue waited more than :data:`WAIT_S`
  at p90 and its peak (decode: pinned) share plus one mean request's share (``request_fraction``: the mean
  prompt over one node's pool) reaches 1: **no room for a request** (``no_room_for_a_request``) although the pool
  is never :data:`BUSY_FRACTION` full: one 10k-token pin in an 18k-token pool stops every next 10k-token
  request until it expires (Qwen3-32B at TP1 on an H100). With several nodes the peak share is the
  deployment's (all nodes) and the request's one node's: an approximation. P's request share is priced at
  D's KV bytes per token (they differ only with heterogeneous TP and a KV-head count below it).
* Decode saturation is **by retention** when pinned (retained) KV holds at least half of the pool on
  average: the pool is full of finished conversations' KV, not of running requests.
* P's KV pool (``prefill_held_kv``) holds each prompt from the end of its prefill until D has read it
  (vLLM's ``kv_lease_duration``); it is **saturated** when P's queue waited more than :data:`WAIT_S` at
  p90 and the held peak reached :data:`BUSY_FRACTION` of P's pool. P's queue is then charged to the held
  KV, not to prefill compute, unless the engine itself was that busy. When D's pool is saturated too, the
  held prompts are waiting for D (backpressure), and the binding resource is D's pool.

Numbers in the section are exact SI (seconds, GiB, fractions); :func:`health_lines` renders them with
any time formatter (the CLI and the dashboard pass one that scales to ms/s/min/h).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from kvplan.sim.scenario import Scenario
from kvplan.units import si_s

WAIT_S = 1.0
BUSY_FRACTION = 0.9
NEAR_FRACTION = 0.95  # a resource this busy warns even before requests wait on it
FULL_MARGIN = 0.005  # busy within this of the whole window: it never idled (a busy share over 1 is a step straddling
# the window's edges)
_BUSY_OVER_WINDOW = ("prefill_compute", "decode_engine_thread", "prefill_engine_thread")  # busy shares of a time window
RETENTION_SHARE = 0.5


def _p90(x: pd.Series) -> float:
    v = x.dropna().to_numpy(dtype=float)
    return float(np.percentile(v, 90)) if len(v) else 0.0


@dataclass(frozen=True)
class Waits:
    """What the health section reads of the turns that did not fail: each wait's (p90, mean) and the span.

    From a turns frame (:func:`waits_of`) or from a streamed run's column statistics (exact, or within the
    quantile sketch's bound above :data:`kvplan.sim.quantiles.EXACT_PERCENTILE_MAX_TURNS` turns).
    """

    span_s: float  # last finish - first arrival
    prefill: tuple[float, float]  # prefill_queue_s
    decode: tuple[float, float]  # d_queue_s
    link: tuple[float, float]  # kv_pull_s + p2d_transfer_s
    follow_ups: int = 0  # follow-up turns (turn >= 2)
    follow_ups_d_missed: int = 0  # of them, those whose D found less than half their prompt (:func:`d_missed`)
    follow_up_prompt_tokens: int = 0  # their prompt tokens
    follow_up_d_hit_tokens: int = 0  # of them, found in their D's prefix cache (``d_hit_tokens``)
    # the same for the engine that prefilled them (``local_hit_tokens``: P's cache, or an aggregated replica's)
    follow_ups_local_missed: int = 0
    follow_up_local_hit_tokens: int = 0


def d_missed(d_hit_tokens: Any, prompt_tokens: Any) -> Any:
    """Per turn: its D found less than half its prompt in its prefix cache (so D read most of it from P)."""
    return 2 * d_hit_tokens < prompt_tokens


def waits_of(turns: pd.DataFrame) -> Waits:
    """The waits of a turns frame (``turns.csv`` columns)."""
    ok = turns[turns["decision"] != "error"]
    n = len(ok)
    link = ok["kv_pull_s"] + ok["p2d_transfer_s"]
    follow = ok[ok["turn"] >= 2]
    return Waits(
        span_s=float(ok["finish_s"].max() - ok["arrival_s"].min()) if n else 0.0,
        prefill=(_p90(ok["prefill_queue_s"]), float(ok["prefill_queue_s"].mean()) if n else 0.0),
        decode=(_p90(ok["d_queue_s"]), float(ok["d_queue_s"].mean()) if n else 0.0),
        link=(_p90(link), float(link.mean()) if n else 0.0),
        follow_ups=len(follow),
        follow_ups_d_missed=int(d_missed(follow["d_hit_tokens"], follow["prompt_tokens"]).sum()),
        follow_up_prompt_tokens=int(follow["prompt_tokens"].sum()),
        follow_up_d_hit_tokens=int(follow["d_hit_tokens"].sum()),
        follow_ups_local_missed=int(d_missed(follow["local_hit_tokens"], follow["prompt_tokens"]).sum()),
        follow_up_local_hit_tokens=int(follow["local_hit_tokens"].sum()),
    )


#: routings that choose D without looking at where a conversation's KV is (``sim/router.py``)
KV_BLIND_ROUTING = ("round_robin", "random")
#: the share of follow-up turns missing their D's prefix cache (:func:`d_missed`) from which routing is reported
ROUTING_MISS_SHARE = 0.1
#: the setting that keeps a conversation's decode legs on one D (``sim/router.py`` ``Router.pick_decode``)
ROUTING_FIX = "deployment.routing: session_affinity"


def kv_blind_routing(scenario: Scenario) -> bool:
    """The scenario routes the decode legs of P/D over several D (or the requests of aggregated serving over several
    replicas) without looking where a conversation's KV is, with that engine's prefix caching on (so landing on
    another loses it): ``round_robin`` or ``random`` (``sim/router.py``)."""
    dep = scenario.deployment
    if dep.routing not in KV_BLIND_ROUTING:
        return False
    if dep.mode == "aggregated":  # a replica's prefix cache is the one prefill caching switches (sim/aggregated.py)
        return bool(dep.replicas > 1 and dep.prefill_prefix_caching)
    return bool(dep.decode_nodes > 1 and dep.decode_prefix_caching)


def engines_routed(scenario: Scenario) -> tuple[int, str]:
    """(how many engines :func:`kv_blind_routing` routes over, what they are called): D, or aggregated replicas."""
    dep = scenario.deployment
    return (dep.replicas, "replicas") if dep.mode == "aggregated" else (dep.decode_nodes, "D")


def routing_miss(scenario: Scenario, waits: Waits) -> dict[str, Any] | None:
    """The follow-up turns whose decode leg missed its conversation's KV because routing ignores where it is, or None.

    The reference proxy (vLLM ``examples/disaggregated/disaggregated_serving/disagg_proxy_multiturn.py``) picks D
    with its own round-robin iterator, independently of the D named in the cached ``kv_transfer_params``
    (``random``: a ClusterIP Service's draw): with several D a follow-up's decode leg usually lands on a D that has
    not served its conversation, which then reads the whole prompt from P instead of the new tail (D pulls
    ``prompt - local hits``, ``nixl/pull_scheduler.py``; ``../shared/VLLM_BEHAVIOUR.md`` §1.2 step 6, §1.7).
    Aggregated replicas routed the same way lose their prefix cache alike (the replica recomputes what it lacks;
    counted on ``local_hit_tokens``, the replica's hit).
    Reported when the scenario routes that way (:func:`kv_blind_routing`) and at least :data:`ROUTING_MISS_SHARE`
    of its follow-up turns (that did not fail) found less than half their prompt in their D's prefix cache
    (measured, ``d_hit_tokens``, :func:`d_missed`). Eviction can also cause such misses; routing is named because
    the scenario's routing makes them likely. :data:`ROUTING_FIX` (or ``prefix_aware``) keeps a conversation on
    its D."""
    if not kv_blind_routing(scenario) or waits.follow_ups <= 0:
        return None
    aggregated = scenario.deployment.mode == "aggregated"  # a replica prefills: its cache is the local hit
    missed = waits.follow_ups_local_missed if aggregated else waits.follow_ups_d_missed
    hit = waits.follow_up_local_hit_tokens if aggregated else waits.follow_up_d_hit_tokens
    share = missed / waits.follow_ups
    if share < ROUTING_MISS_SHARE:
        return None
    found = hit / waits.follow_up_prompt_tokens if waits.follow_up_prompt_tokens else 0.0
    n, what = engines_routed(scenario)
    return {"routing": scenario.deployment.routing, "decode_nodes": n, "engines": what,
            "missed_fraction": share, "d_hit_token_fraction": found, "counted": f"{missed:,} of {waits.follow_ups:,}"}


def routing_warning(miss: dict[str, Any]) -> str:
    """The line saying :func:`routing_miss`'s finding (``counted``: how the share was counted) and the setting that
    fixes it; ``recommend`` and ``compare`` word their runs' mean with it. ``engines`` ``replicas``: aggregated
    serving, whose replica recomputes what its prefix cache lacks (``D`` when absent)."""
    if miss.get("engines") == "replicas":
        how = "the next replica in round-robin order" if miss["routing"] == "round_robin" else "a replica drawn at random"
        return (f"routing {miss['routing']} over {miss['decode_nodes']} replicas: {miss['missed_fraction']:.0%} of "
                f"follow-up turns ({miss['counted']}) found less than half their prompt in their replica's prefix cache "
                f"and recomputed the rest (follow-ups found {miss['d_hit_token_fraction']:.0%} of their prompt tokens "
                f"cached), because a follow-up goes to {how}, not to the replica that served its conversation; set "
                f"{ROUTING_FIX} (or prefix_aware) to keep a conversation on its replica")
    how = "the next D in round-robin order" if miss["routing"] == "round_robin" else "a D drawn at random"
    return (f"routing {miss['routing']} over {miss['decode_nodes']} D: {miss['missed_fraction']:.0%} of follow-up "
            f"turns ({miss['counted']}) found less than half their prompt in their D's prefix cache and read the rest "
            f"from P (follow-ups found {miss['d_hit_token_fraction']:.0%} of their prompt tokens on D), because a "
            f"follow-up's decode leg goes to {how}, not to the D holding its conversation's KV (as the reference "
            f"proxy disagg_proxy_multiturn.py does); set {ROUTING_FIX} (or prefix_aware) to keep a conversation on "
            "its D")


def _prefill_held(summary: dict[str, Any], waits: Waits, prompt_mean: float, nodes: int) -> dict[str, Any]:
    """P's KV pool held for D's reads: peak and mean of the held series over P's capacity, one mean prompt's share
    of one P's pool, and P's queue."""
    cap = float(summary.get("prefill_kv_capacity_gib") or 0.0)
    peak = float(summary.get("p_held_kv_gib_peak") or 0.0)
    mean = float(summary.get("p_held_kv_gib_mean") or 0.0)
    prompt_gib = prompt_mean * float(summary.get("kv_bytes_per_token_all_ranks") or 0.0) / 1024**3
    return {
        "utilization": peak / cap if cap > 0 else 0.0,
        "held_mean_fraction": mean / cap if cap > 0 else 0.0,
        "capacity_gib": cap,
        "request_fraction": prompt_gib * max(nodes, 1) / cap if cap > 0 else 0.0,
        "lease_expiries": int(summary.get("p_lease_expiries") or 0),
        "wait_p90_s": waits.prefill[0],
        "wait_mean_s": waits.prefill[1],
    }


def _thread(summary: dict[str, Any], role: str, wait: tuple[float, float], window: str, overlaps: bool) -> dict[str, Any]:
    """One role's engine threads (``summary`` ``{role}_thread_*``, :func:`kvplan.sim.api._thread_utilization`) and
    the wait of that role's queue (D: admission, P: its prefill queue)."""
    def num(key: str) -> float:
        v = summary.get(f"{role}_thread_{key}")
        return float(v) if v is not None else 0.0

    return {
        "utilization": num("utilization"),
        "busy_fraction": num("busy_fraction"),
        "busy_fraction_mean": num("busy_fraction_mean"),
        "post_fraction": num("post_fraction"),
        "post_overlaps_forward": bool(overlaps),
        "utilization_window": window,
        "wait_p90_s": wait[0],
        "wait_mean_s": wait[1],
    }


def _saturated(r: dict[str, Any]) -> bool:
    """Waited on and busy; a pool (it has a ``request_fraction``) also when it had no room for a mean request."""
    waited = r["wait_p90_s"] > WAIT_S
    if "request_fraction" in r:  # a pool: full for the next request before it is BUSY_FRACTION full
        r["no_room_for_a_request"] = bool(waited and r["request_fraction"] > 0
                                          and r["utilization"] + r["request_fraction"] >= 1.0)
        if r["no_room_for_a_request"]:
            return True
    return bool(waited and r["utilization"] >= BUSY_FRACTION)


def _setting_warnings(scenario: Scenario, waits: Waits) -> list[str]:
    """Warnings about the scenario's settings: a router TTL above D's TTL, routing that misses D's KV
    (:func:`routing_miss`)."""
    pol = scenario.policy
    warnings: list[str] = []
    if pol.bidirectional and pol.router_ttl_s > pol.decoder_kv_blocks_ttl_s:
        warnings.append(
            f"router_ttl_s ({pol.router_ttl_s:g} s) is above decoder_kv_blocks_ttl_s ({pol.decoder_kv_blocks_ttl_s:g} s): "
            "the router hands out entries whose KV D has already released (misses, or declined reads)"
        )
    miss = routing_miss(scenario, waits)
    if miss is not None:
        warnings.append(routing_warning(miss))
    return warnings


def compute_health(
    summary: dict[str, Any], turns: pd.DataFrame | Waits, scenario: Scenario, per_byte_s: float,
    prefill_held: tuple[int, int] | None = None,
) -> dict[str, Any]:
    """The health section of one run (see the module docstring for every definition).

    ``prefill_held`` is (tokens P's prefix caches hold at the end, their capacity), summed over P nodes,
    when prefix caching is on: reported, never saturated (vLLM evicts it LRU; it only limits local hits).
    ``turns`` is the turns frame or its :class:`Waits`.
    """
    waits = turns if isinstance(turns, Waits) else waits_of(turns)
    dep, pol = scenario.deployment, scenario.policy
    span = waits.span_s
    cap = float(summary.get("decode_kv_capacity_gib") or 0.0)
    pinned_peak = float(summary.get("pinned_kv_gib_peak", 0.0))
    pinned_mean = float(summary.get("pinned_kv_gib_mean", 0.0))
    tp = dep.tensor_parallel_size
    links = dep.prefill_nodes * dep.decode_nodes
    link_util = 0.0
    if span > 0 and per_byte_s > 0:
        per_rank = max(summary.get("d2p_bytes", 0), summary.get("p2d_bytes", 0)) / tp
        link_util = per_rank * per_byte_s / (links * span)
    used = summary.get("decode_kv_used_peak_fraction")
    turns_n = int(summary.get("turns") or 0)
    prompt_mean = float(summary.get("prompt_tokens") or 0) / turns_n if turns_n else 0.0
    d_tokens = float(summary.get("decode_kv_capacity_tokens") or 0.0)  # one D's pool
    windowed = summary.get("prefill_utilization_steady")
    busiest = summary.get("prefill_utilization_steady_max")
    window = (f"steady window ({float(summary['steady_window_start_s']):.6g} to "
              f"{float(summary['steady_window_end_s']):.6g} s: the second half of the arrivals of "
              "new conversations, or of a trace's requests; ramp-up and drain excluded)"
              if summary.get("steady_window_start_s") is not None else
              "active span (first arrival to last response; a closed loop has no arrival window)")
    resources: dict[str, dict[str, Any]] = {
        "prefill_compute": {
            "utilization": float(busiest if busiest is not None else
                                 windowed if windowed is not None else summary.get("prefill_utilization", 0.0)),
            "utilization_mean": float(windowed if windowed is not None else summary.get("prefill_utilization", 0.0)),
            "engines_over_busy": summary.get("prefill_steady_engines_over_busy"),
            "engines": dep.replicas if dep.mode == "aggregated" else dep.prefill_nodes,
            "utilization_window": window,
            "wait_p90_s": waits.prefill[0],
            "wait_mean_s": waits.prefill[1],
        },
        "decode_kv": {
            "utilization": pinned_peak / cap if cap > 0 else 0.0,
            "used_peak_fraction": float(used) if used is not None else None,
            "pinned_peak_fraction": pinned_peak / cap if cap > 0 else 0.0,
            "pinned_mean_fraction": pinned_mean / cap if cap > 0 else 0.0,
            "capacity_gib": cap,
            "request_fraction": prompt_mean / d_tokens if d_tokens > 0 else 0.0,
            "wait_p90_s": waits.decode[0],
            "wait_mean_s": waits.decode[1],
        },
        "prefill_held_kv": _prefill_held(summary, waits, prompt_mean, dep.prefill_nodes),
        "link": {
            "utilization": link_util,
            "wait_p90_s": waits.link[0],
            "wait_mean_s": waits.link[1],
        },
        "decode_engine_thread": _thread(summary, "decode", waits.decode, window, dep.kv_post_overlaps_forward),
        "prefill_engine_thread": _thread(summary, "prefill", waits.prefill, window, dep.kv_post_overlaps_forward),
    }
    # always the same keys (sweep rows need the same columns whether P caches or not)
    held, capacity = prefill_held if prefill_held is not None else (0, 0)
    extra: dict[str, Any] = {"prefill_kv": {
        "caching": prefill_held is not None, "held_tokens_end": int(held), "capacity_tokens": int(capacity),
        "held_fraction_end": held / capacity if capacity > 0 else float("nan"), "evictable": True,
    }}
    for name, r in resources.items():
        r["saturated"] = _saturated(r)
        if name.endswith("_engine_thread") and r["utilization"] >= 1.0:
            # its arrivals demand more thread time than there is: a backlog grows whatever queue it shows in (on D
            # with room in the pool the reads wait on the thread, in first_decode_s, not in d_queue_s)
            r["saturated"] = True
        if name == "decode_kv":
            r["by_retention"] = bool(r["saturated"] and r["pinned_mean_fraction"] >= RETENTION_SHARE)
    if resources["prefill_held_kv"]["saturated"] and resources["prefill_compute"]["utilization"] < BUSY_FRACTION:
        resources["prefill_compute"]["saturated"] = False  # P's queue waited on its pool, not on its engine
    waited = {k: v["wait_mean_s"] for k, v in resources.items() if v["wait_p90_s"] > WAIT_S}
    if resources["prefill_held_kv"]["saturated"] and resources["prefill_compute"]["utilization"] < BUSY_FRACTION:
        waited.pop("prefill_compute", None)
    # equal waits (an engine thread shares its engine's queue): a saturated resource binds before one that is not,
    # and D's thread before D's pool unless pins fill the pool (else it holds requests whose reads queue on the
    # thread: a symptom)
    thread_first = {"decode_engine_thread": bool(resources["decode_engine_thread"]["saturated"]
                                                 and not resources["decode_kv"]["by_retention"])}
    binding = (max(waited, key=lambda k: (waited[k], resources[k]["saturated"], thread_first.get(k, False)))
               if waited else None)
    if binding == "prefill_held_kv" and resources["decode_kv"]["saturated"]:
        binding = "decode_kv"  # P holds the prompts D cannot admit yet: backpressure from D's pool
        resources["prefill_held_kv"]["backpressure_from_decode"] = True
    errors = int(summary.get("errors", 0))
    err: dict[str, Any] = {"count": errors, "cause": None}
    if errors:
        err["cause"] = (
            f"read declined under kv_load_failure_policy: {pol.kv_load_failure_policy} (P's read of D's retained KV came "
            f"within expiry_safety_margin_s = {pol.expiry_safety_margin_s:g} s of its expiry; vLLM fails the request; "
            "with kv_load_failure_policy: recompute it would be recomputed). TTFT statistics exclude failed turns"
        )
    warnings = _setting_warnings(scenario, waits)
    saturated = [k for k, v in resources.items() if v["saturated"]]
    labels = {"prefill_compute": "prefill compute busy", "decode_kv": "decode KV pool pinned at peak",
              "prefill_held_kv": "P's KV pool held for D's reads at peak", "link": "P<->D links busy",
              "decode_engine_thread": "D's engine thread busy", "prefill_engine_thread": "P's engine thread busy"}
    dkv = resources["decode_kv"]
    if not dkv["saturated"] and (dkv["used_peak_fraction"] or 0.0) >= BUSY_FRACTION and dkv["wait_p90_s"] > WAIT_S:
        warnings.append(f"decode KV pool full at its peak ({dkv['used_peak_fraction']:.0%} held by running requests "
                        f"and pins, {dkv['pinned_peak_fraction']:.0%} pinned): admission to D waited "
                        f"{dkv['wait_p90_s']:.3g} s at p90")
    for k, v in resources.items():
        if v["saturated"] or v["utilization"] < NEAR_FRACTION:
            continue
        if k == "prefill_compute" and dep.mode == "aggregated":
            continue  # an aggregated engine steps while any request decodes: busy is not its load
        if k in _BUSY_OVER_WINDOW and v["utilization"] >= 1.0 - FULL_MARGIN:
            warnings.append(f"{labels[k]} {min(v['utilization'], 1.0):.1%} of the steady window: at or over "
                            "capacity (it never idled, so its queue never emptied); a run this long understates the "
                            "steady-state waits")
        else:
            warnings.append(f"{labels[k]} {v['utilization']:.1%}: close to saturation (a little more load and "
                            "requests queue)")
    status = "saturated" if saturated else ("warning" if errors or warnings else "ok")
    return {
        "status": status,
        "binding_resource": binding,
        "saturated": saturated,
        "resources": resources,
        **extra,
        "errors": err,
        "warnings": warnings,
        "thresholds": {"wait_p90_s": WAIT_S, "busy_fraction": BUSY_FRACTION, "retention_share": RETENTION_SHARE,
                       "near_fraction": NEAR_FRACTION},
    }


def _no_room(r: dict[str, Any], what: str) -> str:
    """The clause of a pool saturated for lack of room for the next request (not for being nearly full)."""
    if not r.get("no_room_for_a_request") or r["utilization"] >= BUSY_FRACTION:
        return ""
    return f", and a mean {what} needs {r['request_fraction']:.0%} of one node's pool: no room for the next one"


#: The settings a saturation line names as its fix (what an operator edits in the scenario).
_ADD_D = "add D nodes (deployment.decode_nodes)"
_ADD_P = "add P nodes (deployment.prefill_nodes)"
_OR_REPLICAS = "; aggregated: deployment.replicas)"  # resources an aggregated run has too: its replicas are the fix


def health_lines(health: dict[str, Any], fmt_s: Callable[[Any], str] = si_s) -> list[str]:
    """One line per finding: saturation (binding resource first), failures with their cause, warnings."""
    if not health:
        return []
    res = health["resources"]
    lines: list[str] = []
    order = sorted(health["saturated"], key=lambda k: k != health["binding_resource"])
    for name in order:
        r = res[name]
        bind = " (binding: requests waited longest here)" if name == health["binding_resource"] else ""
        if name == "decode_kv":
            # judged on the pinned peak (``utilization``): a saturated pool is pinned >= BUSY_FRACTION full at its peak,
            # or has no room for a mean request beside its pins; "running requests fill it (held peak 100%, pinned
            # peak 100%)" named the pinned peak as running requests' (a burst of pins, 46% on average)
            ttl_fix = ("lower policy.decoder_kv_blocks_ttl_s (vLLM's decoder_kv_blocks_ttl; `kvplan recommend` finds "
                       f"one), or {_ADD_D}")
            if r.get("by_retention"):
                why = ("by retention: pinned KV of finished conversations holds "
                       f"{r['pinned_mean_fraction']:.0%} of the pool on average, {r['pinned_peak_fraction']:.0%} at peak")
                fix = ttl_fix
            elif r["pinned_peak_fraction"] >= BUSY_FRACTION:
                why = ("pinned KV of finished conversations holds "
                       f"{r['pinned_mean_fraction']:.0%} of the pool on average, {r['pinned_peak_fraction']:.0%} at peak")
                fix = ttl_fix
            else:
                used = r.get("used_peak_fraction")
                why = ("its requests do not fit beside the pins (peak held by running requests and pins "
                       f"{used if used is not None else r['utilization']:.0%}, pinned peak "
                       f"{r['pinned_peak_fraction']:.0%})")
                fix = (f"a larger pool per D: deployment.decode_tensor_parallel_size or deployment.kv_cache_dtype: "
                       f"fp8; or {_ADD_D.removesuffix(')')}{_OR_REPLICAS}")
            lines.append(f"SATURATED decode HBM{bind}: {why} of {r['capacity_gib']:.0f} GiB{_no_room(r, 'request')}; "
                         "admission to D waited "
                         f"{fmt_s(r['wait_p90_s'])} at p90 ({fix})")
        elif name == "prefill_held_kv":
            why = (" (backpressure: D cannot admit them yet)" if r.get("backpressure_from_decode") else "")
            lines.append(f"SATURATED prefill KV pool{bind}: prompts held for D's reads fill {r['utilization']:.0%} of "
                         f"{r['capacity_gib']:.0f} GiB at peak{_no_room(r, 'prompt')}{why}; P's queue waited "
                         f"{fmt_s(r['wait_p90_s'])} at p90 "
                         f"({r['lease_expiries']} leases lapsed; "
                         + (f"D's pool is full too: {_ADD_D}; P holds each prompt until D reads it"
                            if r.get("backpressure_from_decode") or res["decode_kv"]["saturated"]
                            else f"{_ADD_P}, or lower the load") + ")")
        elif name == "prefill_compute":
            over = r.get("engines_over_busy")
            u, um = min(r["utilization"], 1.0), min(r.get("utilization_mean", 0.0), 1.0)  # > 1: a step straddling
            # the window's edges (as the "nothing saturated" line and the warnings print it)
            which = (f"the busiest of {r['engines']} engines ({over} at {BUSY_FRACTION:.0%} or more; mean "
                     f"{um:.0%})" if over is not None and r.get("engines", 1) > 1 else "engine")
            lines.append(f"SATURATED prefill compute{bind}: {which} busy {u:.0%} of the "
                         f"{r.get('utilization_window', 'run').split(' (')[0]}; P queue "
                         f"{fmt_s(r['wait_p90_s'])} at p90 ({_ADD_P.removesuffix(')')}{_OR_REPLICAS}, or lower the "
                         "load)")
        elif name in ("decode_engine_thread", "prefill_engine_thread"):
            role, queue = ("D", "admission to D") if name == "decode_engine_thread" else ("P", "P queue")
            fwd, fix = ("", "") if r["post_overlaps_forward"] else (
                " and the forwards those posts run before", ", a vLLM that posts beside the forward (PR #53333)")
            lines.append(f"SATURATED {role}'s engine thread{bind}: its arrivals demand {r['utilization']:.0%} of it "
                         f"over the {r.get('utilization_window', 'run').split(' (')[0]} ({r['busy_fraction']:.0%} busy: "
                         f"KV read posting {r['post_fraction']:.0%}{fwd}), so its steps stretch; {queue} waited "
                         f"{fmt_s(r['wait_p90_s'])} at p90 (deployment.kv_transport: rdma if it is tcp{fix}, or "
                         f"{_ADD_D if role == 'D' else _ADD_P})")
        else:
            lines.append(f"SATURATED P<->D link{bind}: {r['utilization']:.0%} busy on average; transfers took "
                         f"{fmt_s(r['wait_p90_s'])} at p90 (fewer bytes per token: deployment.kv_cache_dtype: fp8; or "
                         "more P and D nodes, each with its own NICs)")
    if not health["saturated"]:
        pc = res["prefill_compute"]
        u, um = min(pc["utilization"], 1.0), min(pc["utilization_mean"], 1.0)  # > 1: a step straddling the edges
        busy = (f"{u:.0%} (busiest engine; mean {um:.0%})"
                if pc.get("engines_over_busy") is not None and pc.get("engines", 1) > 1 else f"{u:.0%}")
        dkv = res["decode_kv"]
        # the peak held by admitted and running requests and pins (what admission waits on); ``utilization`` is the
        # pinned peak alone, printed beside it (a run with retention off read "peak 0% (pinned 0%)" at an 18% peak)
        used = dkv.get("used_peak_fraction")
        lines.append(f"health: nothing saturated (prefill {busy} busy over the "
                     f"{res['prefill_compute'].get('utilization_window', 'run').split(' (')[0]}, decode KV "
                     f"peak {used if used is not None else dkv['utilization']:.0%} of the pool (pinned "
                     f"{dkv['pinned_peak_fraction']:.0%}), links "
                     f"{res['link']['utilization']:.0%} busy)")
    b = health.get("binding_resource")
    if b and b not in health["saturated"]:
        lines.append(f"longest waits at {b.replace('_', ' ')}: {fmt_s(res[b]['wait_p90_s'])} at p90")
    if health["errors"]["count"]:
        lines.append(f"{health['errors']['count']} turns failed: {health['errors']['cause']}")
    lines.extend(f"warning: {w}" for w in health["warnings"])
    return lines
