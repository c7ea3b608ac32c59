"""The public API: ``run(scenario, seed) -> Result``. The CLI and the dashboard call only this."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import kvplan.sim.engine  # noqa: F401 - first: the engine installs the compiled hot path (sim/engine.py)
from kvplan.models.arch import kv_bytes_per_token_all_ranks
from kvplan.sim.alloc import TRIM_EVERY_CHUNKS, release_free_memory
from kvplan.sim.engine import ChunkSink, ProgressHook, profile_parts, run_profile_status, simulate, thread_counters
from kvplan.sim.events import EventChunk
from kvplan.sim.health import BUSY_FRACTION, compute_health
from kvplan.sim.results import Result, build_result
from kvplan.sim.scenario import Policy, Scenario, as_scenario
from kvplan.sim.stream import RunStream, TurnSink
from kvplan.sim.workload import ConversationPlan

GIB = 1024**3


def run(
    scenario: Scenario | dict[str, Any] | str | Path, seed: int | None = None, *, keep: bool = True,
    sink: TurnSink | None = None, progress: ProgressHook | None = None,
) -> Result:
    """Simulate ``scenario`` (object, mapping or YAML path) with ``seed`` (default: the scenario's).

    ``keep`` (default) keeps the event log and the turns in the result; ``keep=False`` streams: finished
    turns go to ``sink`` in (conversation, turn) order as the run goes and memory stays bounded (the result's
    ``events`` and ``turns`` are then empty; its summary and pinned series are complete).
    ``progress(now_s, horizon_s)`` is called between slices of simulated time.
    """
    scenario = as_scenario(scenario)
    seed = scenario.seed if seed is None else seed
    if seed != scenario.seed:  # the result (and DIR/scenario.yaml) records the seed the run used
        scenario = scenario.model_copy(update={"seed": seed})
    # The run's objects form one large reference graph the cyclic GC would rescan again and again for
    # nothing (the model makes no reference cycles worth collecting mid-run). Pause it for the run.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        result = _run(scenario, seed, keep, sink, progress)
    finally:
        if was_enabled:
            gc.enable()
    return result


def _run(scenario: Scenario, seed: int, keep: bool, sink: TurnSink | None, progress: ProgressHook | None) -> Result:
    streams: list[RunStream] = []

    def consumer(plan: ConversationPlan) -> ChunkSink:
        streams.append(RunStream(plan.offsets, plan.turns, sink=sink, keep_turns=keep))
        release_free_memory()  # the plan's temporaries (sim/alloc.py)
        consume = streams[0].consume
        chunks = [0]

        def on_chunk(ch: EventChunk) -> None:
            consume(ch)
            chunks[0] += 1
            if chunks[0] % TRIM_EVERY_CHUNKS == 0:
                release_free_memory()

        return on_chunk

    rs, plan, ctx = simulate(scenario, seed, consumer=consumer, progress=progress, keep=keep)
    stream = streams[0]
    stream.finish()
    result = _derive(scenario, seed, rs, plan, ctx, stream)
    release_free_memory()
    return result


def _derive(scenario: Scenario, seed: int, rs: Any, plan: Any, ctx: Any, stream: RunStream) -> Result:
    """Summary extras and the derived frames of a finished run."""
    bytes_all = kv_bytes_per_token_all_ranks(rs.arch, ctx.d_tp)  # D's KV (pins) at D's TP
    rs_p, rs_d = ctx.roles or (rs, rs)
    # utilisation over the active span (retention expiries after the last response do not count)
    end = max(stream.t_max_active, 0.0)
    engines = ctx.replicas if scenario.deployment.mode == "aggregated" else ctx.prefill
    busy = sum(p.busy_s for p in engines)
    n_kv = len(ctx.replicas) if ctx.replicas else scenario.deployment.decode_nodes
    extra: dict[str, Any] = {
        "seed": seed,
        "model": rs.arch.name,
        "hardware": rs.node.name,
        "profile": rs.profile.name,
        # heterogeneous TP: P and D are priced by their own TP's profiles; the status is the less trustworthy one's
        # (a calibrated TP8 profile does not make P's composed TP4 one calibrated), each role's beside it
        "profile_status": run_profile_status((rs_p, rs_d)),
        "extrapolated": rs_p.profile.extrapolated or rs_d.profile.extrapolated,
        "profile_components": profile_parts(rs, (rs_p, rs_d)),  # each role's own profile's parts
        "decode_kv_capacity_tokens": rs_d.decode_capacity_tokens,
        "decode_kv_capacity_gib": rs_d.decode_capacity_tokens * bytes_all / GIB * n_kv,
        "prefill_kv_capacity_gib": rs_p.prefill_capacity_tokens * kv_bytes_per_token_all_ranks(rs.arch, ctx.p_tp)
        / GIB * scenario.deployment.prefill_nodes,
        "prefill_profile": rs_p.profile.name,
        "decode_profile": rs_d.profile.name,
        "prefill_profile_status": rs_p.profile.status,
        "decode_profile_status": rs_d.profile.status,
        "kv_bytes_per_token_all_ranks": bytes_all,
        "prefill_utilization": busy / (end * len(engines)) if end > 0 else 0.0,
        **_window_utilization(ctx, len(engines)),
        **_thread_utilization(ctx, end),
        "truncated_conversations": plan.truncated_conversations,
        "nic_utilization": ctx.nic_utilization(end),
        # the highest share of one D's pool held by admitted and running requests and pins (what admission waits
        # on); aggregated mode: of one replica's pool, held by scheduled and running requests (its evictable prefix
        # cache not counted)
        "decode_kv_used_peak_fraction": (max(dn.used_peak / dn.pool.capacity for dn in ctx.decode) if ctx.decode else
                                         max(rep.used_peak / rep.pool.capacity for rep in ctx.replicas)
                                         if ctx.replicas else None),
    }
    if plan.trace_report is not None:
        extra["trace"] = plan.trace_report
    events = ctx.log.chunk() if ctx.log.keep else None
    # P's prefix cache at the end of the run (tokens, capacity), summed over P nodes, when caching is on
    pools = [p.pool for p in ctx.prefill if p.pool.caching]
    held = (sum(pl.cached * pl.block_size for pl in pools), sum(pl.capacity * pl.block_size for pl in pools)) \
        if pools else None
    if not ctx.log.keep:  # a streamed run: the driver's per-turn lists go before the end-of-run derivation
        del ctx.driver
        gc.collect()
        release_free_memory()
    result = build_result(scenario, seed, stream, events, bytes_all, extra, list(rs.notes) + _policy_notes(scenario))
    health = compute_health(result.summary, stream.agg.waits(), scenario, rs.per_byte_s, held)
    return result.with_run_context({"health": health})


def _window_utilization(ctx: Any, engines: int) -> dict[str, Any]:
    """Prefill (engine) busy share over the steady window (:func:`kvplan.sim.engine.steady_window`: the second
    half of the arrival window, ramp-up and drain left out); the health section reads it. Engines add a step's
    time when it starts, so a step in flight at either end counts to the side it started in. Closed loop: no
    window (null).

    ``prefill_utilization_steady`` is the mean over engines; ``prefill_utilization_steady_max`` the **busiest**
    engine's share, what the health section judges. The mean hides a P that falls behind while others idle (the
    router's placement is not a balancer: on the 16P56D benchmark at TTL 60 s, 10 of 16 P nodes were busy all the
    window, with 1.7x its length of work arriving, while 6 were half busy: mean 81%, P queue 511 s at p90). The
    achieved share, not the demanded one (busy x arrivals / scheduled, which the engine threads are judged on):
    a P whose queue waits on its KV pool schedules less than reaches it without its engine being busy, and that
    wait is the pool's (``prefill_held_kv``), not compute's. ``prefill_steady_engines_over_busy`` counts the
    engines at least :data:`kvplan.sim.health.BUSY_FRACTION` busy."""
    w, busy, each = ctx.steady_window, ctx.window_busy_s, ctx.window_busy_each_s
    if w is None or busy is None or engines == 0:
        return {"steady_window_start_s": None, "steady_window_end_s": None, "prefill_utilization_steady": None,
                "prefill_utilization_steady_max": None, "prefill_steady_engines_over_busy": None}
    span = w[1] - w[0]
    shares = [b / span for b in each or []]
    return {"steady_window_start_s": w[0], "steady_window_end_s": w[1],
            "prefill_utilization_steady": busy / (span * engines),
            "prefill_utilization_steady_max": max(shares) if shares else None,
            "prefill_steady_engines_over_busy": sum(s >= BUSY_FRACTION for s in shares) if shares else None}


def _thread_utilization(ctx: Any, end: float) -> dict[str, Any]:
    """P's and D's engine threads (the health section's ``*_engine_thread``) over the steady window, or with none
    (a closed loop) over the run up to the last response, per role, of the busiest engine: ``busy_fraction`` its
    busy share, ``post_fraction`` its share of posting work alone, ``utilization`` the busy share its arrivals
    demanded (``busy_fraction`` x requests that reached it / requests it took in, D: admitted, P: scheduled; the
    busy share itself when it keeps up, above it when its queue grows); ``busy_fraction_mean`` over engines.
    Busy = the read creation, post and, over TCP, wire work charged to the thread (``sim/xfer.py``), plus with
    ``kv_post_overlaps_forward: false`` the forward of each step that posted (it runs after the posting, on the
    same thread); work counts when it is posted, a forward when its step starts. None in aggregated mode."""
    out: dict[str, Any] = {}
    w, win = ctx.steady_window, ctx.window_thread_s
    counters, span = (win, w[1] - w[0]) if w is not None and win is not None else (thread_counters(ctx), end)
    for i, role in enumerate(("prefill", "decode")):
        keys = [f"{role}_thread_{k}" for k in ("utilization", "busy_fraction", "busy_fraction_mean", "post_fraction")]
        cols = counters[4 * i:4 * i + 4]
        if not cols[0]:
            out.update(dict.fromkeys(keys))
            continue
        if span <= 0:
            out.update(dict.fromkeys(keys, 0.0))
            continue
        busy, post, came, took = cols
        # took nothing while requests came: at least as many times its busy share as requests came
        demand = [b * c / max(t, 1.0) if c > t else b for b, c, t in zip(busy, came, took, strict=True)]
        k = max(range(len(demand)), key=lambda j: (demand[j], busy[j]))  # one engine: the one most demanded
        out.update(zip(keys, (demand[k] / span, busy[k] / span, sum(busy) / (span * len(busy)), post[k] / span),
                       strict=True))
    return out


#: Prefix of a note about a setting the run ignores (``kvplan simulate`` prints these as warnings).
NO_EFFECT = "no effect:"


def _policy_notes(scenario: Scenario) -> list[str]:
    """Assumption notes of the modes and policies that are not vLLM behaviour (printed with every result)."""
    notes = []
    if scenario.deployment.mode == "aggregated":
        notes.append("aggregated mode: blocks allocated per step, the newest running request preempted and "
                     "recomputed when blocks run out (vLLM V1); the mixed prefill/decode step cost is an "
                     "assumption, not calibrated on mixed batches")
    wl = scenario.workload
    if scenario.deployment.mode == "aggregated" and (
            wl.shared_prefix_tokens is not None or (wl.trace is not None and wl.trace.shared_prefix)):
        notes.append("aggregated mode does not share prefixes across conversations (sim/shared.py): "
                     "shared_prefix_tokens / trace.shared_prefix are ignored, each conversation computes and holds its own")
    if wl.history not in (None, "verbatim") and wl.trace is not None:
        from kvplan.sim.history import history_assumption

        notes.append(history_assumption(wl) if _weka(wl.trace.path, wl.trace.format) else
                     f"workload.history {wl.history} on a trace that records sizes, not tokens: what each prompt "
                     "repeats of the previous context is this assumption, not the trace's")
    if wl.trace is not None and wl.arrival.kind == "closed_loop":
        notes.append(f"{NO_EFFECT} workload.arrival closed_loop ({wl.arrival.clients} clients) does not pace a trace "
                     "replay: the trace brings its own clock (its timestamps, or a weka session's start and think "
                     "times after each answer)")
    kind = scenario.policy.retention.kind
    if kind != "ttl" and scenario.deployment.mode != "aggregated":
        notes.append(f"policy.retention {kind}: a proposal, not vLLM behaviour (assumptions in sim/retention_policy.py)")
    ttl = scenario.policy.decoder_kv_blocks_ttl_s
    if not scenario.policy.bidirectional and ttl != Policy().decoder_kv_blocks_ttl_s:
        notes.append(f"{NO_EFFECT} policy.decoder_kv_blocks_ttl_s = {ttl:g} s does nothing with policy.bidirectional "
                     "off (D retains no KV); the run is plain P/D without retention")
    if scenario.policy.offload is not None and scenario.deployment.mode != "aggregated":
        notes.append("policy.offload: host KV capacity and host-to-NIC bandwidth are stated assumptions "
                     "(models/hardware.py); the copy to host memory is taken as instantaneous")
    return notes


def _weka(path: str, fmt: str | None) -> bool:
    """Whether a trace source is (or is detected as) the weka format (its hash prefixes say what is repeated)."""
    from kvplan.sim.history import _is_weka

    return _is_weka(path, fmt)
