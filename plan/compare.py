"""The alternatives an operator weighs, at equal GPUs, workload and seeds: ``compare(scenario, policies) -> rows``.

Every policy is a variant of the same scenario (dotted overrides, :func:`policy_overrides`), simulated with
the same seeds ``replication_seeds(seed, K)[k]`` for ``k < K`` replications (common random numbers, the
seeds of sweeps and ``capacity``), so the rows differ only by the policy:

* ``off``: ``bidirectional_kv_xfer`` off (plain P/D: every follow-up recomputes what P does not cache).
* ``ttl``: bidirectional at vLLM's defaults (``decoder_kv_blocks_ttl`` 480 s, ``kv_recompute_threshold`` 64,
  proxy TTL 450 s, ``kv_load_failure_policy`` fail).
* ``ttl_recommended``: bidirectional at what ``kvplan recommend`` (:mod:`kvplan.plan.advice`) picks for this
  scenario (its TTL, threshold, router TTL and ``recompute`` failure policy).
* ``lease``, ``ttl_evictable``, ``offload``: the retention alternatives (see :data:`POLICY_HELP` and
  :mod:`kvplan.sim.retention_policy`); ``lease:no_end`` is the lease when clients do not know that a
  conversation has ended. A policy the simulator does not model is refused with a one-line error.
* ``aggregated``: the same GPUs as aggregated replicas of the scenario's TP (:mod:`kvplan.sim.aggregated`; the TP
  by :data:`kvplan.plan.capacity.REPLICA_TP_RULE`, as capacity's aggregated column; the row says which in
  ``tensor_parallel_size`` and ``tensor_parallel_rule``), routed by the scenario's routing (``aggregated:prefix_aware`` and
  ``aggregated:session_affinity`` choose another one).

Per policy (mean over replications, with the 95% Student-t half-width as ``<key>_ci95``): TTFT p50/p90/p99
and mean; TPOT mean (``tpot_mean_s`` from the summary when the simulator reports it, else per turn
``(finish - first token) / (output - 1)`` over turns with more than one output token); hit rate (the
summary's: follow-ups whose previous turn's retained KV was still usable; on aggregated replicas, a
prefix-cache hit); reuse rate (follow-ups that reused any cached or pulled KV, e.g. P's own prefix cache
with bidirectional off); pinned decode KV mean (time-weighted over the run) and peak; held KV (P's
prompt KV held under ``kv_lease_duration`` for D's read, ``p_held_kv_gib_*``; null when the simulator does
not model it); errors; preemptions (null when not
modelled); prefill (engine) utilisation over the steady window (the health section's figure,
:data:`kvplan.plan.advice_rules.PREFILL_UTILIZATION_COLUMN`); ``saturated``: the health resources
(:mod:`kvplan.sim.health`) that any replication saturates (:func:`kvplan.plan.advice_runs.saturation`;
empty: none), ``saturated_replications`` how many of the ``replications`` saturate each; the cost per million turns
``node-hours x $/node-hour / served turns x 10^6`` on the steady-state basis
(:mod:`kvplan.plan.pricing`: GPUs over GPUs per node, turns served inside the steady window, not over the drain).
When the pulls of the fastest bidirectional policy take at least
:data:`CROSS_LAYER_PULL_SHARE` of its mean TTFT and the scenario does not set ``cross_layer_blocks``, that
policy is also run with ``cross_layer_blocks: true`` (row ``<policy>+cross_layer``, vLLM's
``enable_cross_layers_blocks``: one region per block instead of one per layer, so a pull posts
``layers``-times fewer NIXL descriptors), and its note states the descriptors and the modelled pull of the
mean pulled size with and without. With an SLO, the maximum Poisson rate of new conversations whose mean
TTFT p90 meets it (and at most 1% of turns errored) is searched per policy: doubled or halved from the scenario's rate (at
most 5 times), then bisected 4 times (~6%), the arrival horizon kept
(:func:`kvplan.plan.capacity.conversations_for`); a rate whose first runs meet the SLO is judged on runs
:data:`kvplan.plan.steady.EXTEND_FACTOR` x as long (more with retention: twice TTL + conversation span of arrivals),
since a load at capacity meets a TTFT SLO over a short run while its queue still grows (:mod:`kvplan.plan.steady`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from kvplan.errors import KvplanInputError, input_error
from kvplan.models.hardware import get_hardware
from kvplan.plan.advice import (
    DEFAULT_TTL_GRID_S,
    PROXY_ROUTER_TTL_S,
    UNLIMITED_TTL_S,
    VLLM_THRESHOLD,
    VLLM_TTL_S,
    AdviceOptions,
    Recommendation,
    ScenarioLike,
    advise,
    recommend,
    recommendation_inputs,
    takes_advice_options,
)
from kvplan.plan.advice_rules import PREFILL_UTILIZATION_COLUMN, mean_ci
from kvplan.plan.advice_runs import raise_conversations_fix, saturation, steady
from kvplan.plan.capacity import (
    aggregated_not_sized,
    aggregated_overrides,
    conversations_for,
    default_aggregated_routing,
    replica_tp,
    replica_tp_why,
)
from kvplan.plan.compare_rules import (
    BEST_CANDIDATES,
    BEST_RULE,
    CROSS_LAYER,
    CROSS_LAYER_PULL_SHARE,
    best_policy,
    cross_layer_candidate,
    cross_layer_note,
)
from kvplan.plan.executor import RunCache, run_tasks
from kvplan.plan.grid import check_planned_work
from kvplan.plan.pricing import COST_BASIS, node_equivalents, usd_per_million_turns
from kvplan.plan.steady import judging_conversations, judging_span_s
from kvplan.sim.results import json_safe
from kvplan.sim.scenario import ClosedLoopArrival, Scenario, with_overrides
from kvplan.sim.seeds import replication_seeds

DEFAULT_POLICIES = ("off", "ttl", "ttl_recommended", "lease", "ttl_evictable", "offload", "aggregated")
POLICY_HELP = {
    "off": "bidirectional_kv_xfer off",
    "ttl": "bidirectional at vLLM's defaults (TTL 480 s, threshold 64, router 450 s, failure policy fail)",
    "ttl_recommended": "bidirectional at kvplan recommend's TTL, threshold and router TTL (failure policy recompute)",
    "lease": "heartbeat-renewed decode lease (proposal, not vLLM): D frees a conversation's blocks lease_s after "
             "its client's last heartbeat",
    "ttl_evictable": "TTL pins that admission may evict LRU (a later read of an evicted pin is declined)",
    "offload": "expired or evicted decode blocks move to host DRAM; P pulls them at host-to-NIC bandwidth",
    "aggregated": "the same GPUs as aggregated vLLM replicas (both phases per engine, prefix caching on)",
}
ROUTINGS = ("round_robin", "session_affinity", "prefix_aware", "sticky")
METRICS = ("ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_mean_s", "tpot_mean_s", "hit_rate", "reuse_rate",
           "pinned_kv_gib_mean",
           "pinned_kv_gib_peak", "steady_pinned_kv_gib_mean", "held_kv_gib_mean", "held_kv_gib_peak", "errors",
           "preemptions", "prefill_utilization", "prefill_utilization_steady",
           "served_turns_per_s", "steady_served_turns_per_s", "turns",
           "kv_pull_mean_s", "pull_rate")
OPTIONAL = ("held_kv_gib_mean", "held_kv_gib_peak", "preemptions")  # null when the simulator does not model them
SOURCE = {"prefill_utilization_steady": PREFILL_UTILIZATION_COLUMN, "preemptions": "d_preemptions",
          "held_kv_gib_mean": "p_held_kv_gib_mean", "held_kv_gib_peak": "p_held_kv_gib_peak"}  # summary key behind a row key
MAX_ERROR_SHARE = 0.01
LEASE_S, HEARTBEAT_S, IDLE_TIMEOUT_S = 30.0, 5.0, 480.0  # lease policy: the 30 s; idle timeout = vLLM's TTL
RATE_STEPS = 5
BISECTIONS = 4
__all__ = ["BEST_CANDIDATES", "BEST_RULE", "CROSS_LAYER_PULL_SHARE", "best_policy", "compare", "compare_json",
           "recommend_with_best_policy"]


@dataclass(frozen=True)
class PolicyRun:
    """One policy's variant of the scenario."""

    name: str
    overrides: dict[str, Any]
    gpus: int
    nodes: int
    notes: tuple[str, ...] = ()


def implemented(name: str) -> bool:
    """Whether the simulator models this policy (unmodelled ones are refused, never shown as results)."""
    from kvplan.sim.scenario import Policy

    base = name.split(":", 1)[0]
    if base in ("lease", "ttl_evictable"):
        return "retention" in Policy.model_fields
    if base == "offload":
        return "offload" in Policy.model_fields
    return base in POLICY_HELP


def parse_policies(text: str | Sequence[str] | None) -> list[str]:
    """The policy list (comma-separated or a sequence); unknown or unmodelled names are one-line errors."""
    if text is None:
        return [p for p in DEFAULT_POLICIES if implemented(p)]
    names = [p.strip() for p in (text.split(",") if isinstance(text, str) else text) if p.strip()]
    if not names:
        raise input_error("--policies", "empty list", f"use some of {', '.join(DEFAULT_POLICIES)}")
    for n in names:
        base, _, arg = n.partition(":")
        if base not in POLICY_HELP:
            raise input_error("--policies", f"unknown policy '{n}'",
                              f"use some of {', '.join(DEFAULT_POLICIES)} (also lease:no_end and "
                              f"aggregated:<routing>, routing one of {', '.join(ROUTINGS)})")
        if arg and not ((base == "aggregated" and arg in ROUTINGS) or (base == "lease" and arg == "no_end")):
            raise input_error("--policies", f"'{n}': only aggregated takes a routing suffix ({', '.join(ROUTINGS)}) "
                              "and lease ':no_end'")
        if not implemented(n):
            raise input_error("--policies", f"policy '{base}' is not modelled by this version of the simulator",
                              "leave it out of --policies")
    if len(set(names)) != len(names):
        raise input_error("--policies", "a policy is listed twice")
    return names


def _vllm_defaults() -> dict[str, Any]:
    """vLLM's defaults for the retention rows: TTL retention, no host tier, whatever retention or offload the scenario's
    policy carries (a scenario with ``policy.offload`` set ran the ``ttl``, ``lease`` and ``ttl_evictable`` rows with
    its host tier too, so only the ``offload`` row differed by its router TTL and failure policy). The scenario's
    environment (clock skew, expiry margin, conversation ids, P's lease) is kept."""
    return {"policy.bidirectional": True, "policy.decoder_kv_blocks_ttl_s": VLLM_TTL_S,
            "policy.kv_recompute_threshold_tokens": VLLM_THRESHOLD, "policy.router_ttl_s": PROXY_ROUTER_TTL_S,
            "policy.kv_load_failure_policy": "fail", "policy.retention": {"kind": "ttl"}, "policy.offload": None}


def _pd_gpus(sc: Scenario) -> int:
    dep = sc.deployment
    tp = dep.tensor_parallel_size
    return (dep.prefill_nodes * (getattr(dep, "prefill_tensor_parallel_size", None) or tp)
            + dep.decode_nodes * (getattr(dep, "decode_tensor_parallel_size", None) or tp))


def aggregated_tp(sc: Scenario) -> int | None:
    """The TP of the ``aggregated`` policy's replicas on ``sc``'s GPUs, by the rule capacity's aggregated column
    follows (:data:`kvplan.plan.capacity.REPLICA_TP_RULE`, :func:`kvplan.plan.capacity.replica_tp`): the TP ``sc``'s
    P and D share, else ``deployment.tensor_parallel_size`` when one role runs it, else None (not compared)."""
    return replica_tp(sc)


def aggregated_problem(sc: Scenario) -> str | None:
    """Why the ``aggregated`` policy cannot run on ``sc``'s GPUs (no TP of the scenario's for a replica, or not a whole
    number of replicas of it), with the fix; else None."""
    gpus, tp = _pd_gpus(sc), aggregated_tp(sc)
    if tp is None:
        return aggregated_not_sized(sc).removeprefix("not sized: ")
    return (f"{gpus} GPUs are not a whole number of TP{tp} replicas (set deployment.tensor_parallel_size to a divisor "
            "of the GPU count)" if gpus % tp else None)


#: How to give ``offload`` a host tier on hardware without one.
OFFLOAD_FIX = "set policy.offload.host_capacity_gib and host_bandwidth_gbps in the scenario"


def offload_problem(sc: Scenario) -> str | None:
    """Why the ``offload`` policy cannot run on ``sc``'s hardware (no host KV memory or host-to-NIC bandwidth in its
    preset, e.g. ``h800``, and none in the scenario's ``policy.offload``), else None."""
    node = get_hardware(sc.hardware)
    off = sc.policy.offload
    gib = off.host_capacity_gib if off is not None and off.host_capacity_gib is not None else node.host_kv_gib
    gbps = off.host_bandwidth_gbps if off is not None and off.host_bandwidth_gbps is not None else node.host_to_nic_gbps
    missing = [f"policy.offload.{k}" for k, v in (("host_capacity_gib", gib), ("host_bandwidth_gbps", gbps)) if v <= 0]
    if not missing:
        return None
    return f"hardware '{node.name}' has no host KV preset and the scenario gives no {' or '.join(missing)}"


def default_left_out(sc: Scenario, names: Sequence[str]) -> list[dict[str, str]]:
    """The policies of ``names`` that cannot run on ``sc`` (offload without a host tier, aggregated when the GPUs are
    not whole TP replicas), each with why: left out of a default policy list and said so, rather than failing after
    the other policies' runs (an explicit ``--policies`` naming one is refused before any run)."""
    out = []
    if "offload" in names and (problem := offload_problem(sc)):
        out.append({"policy": "offload", "why": f"{problem} ({OFFLOAD_FIX} to compare it)"})
    if any(n.partition(":")[0] == "aggregated" for n in names) and (problem := aggregated_problem(sc)):
        out.append({"policy": "aggregated", "why": problem})
    return out


def policy_run(name: str, sc: Scenario, recommended: dict[str, Any] | None = None) -> PolicyRun:
    """The overrides that turn ``sc`` into policy ``name`` on the same GPUs."""
    dep = sc.deployment
    nodes = dep.prefill_nodes + dep.decode_nodes  # one instance each
    tp = aggregated_tp(sc)
    gpus = _pd_gpus(sc)
    base, _, arg = name.partition(":")
    if base == "off":
        return PolicyRun(name, {"policy.bidirectional": False}, gpus, nodes)
    if base == "ttl":
        return PolicyRun(name, _vllm_defaults(), gpus, nodes)
    if base == "ttl_recommended":
        if recommended is None:
            raise ValueError("ttl_recommended needs the recommendation")
        return PolicyRun(name, dict(recommended), gpus, nodes)
    if base == "lease":
        lease = {"kind": "lease", "lease_s": LEASE_S, "heartbeat_s": HEARTBEAT_S, "idle_timeout_s": IDLE_TIMEOUT_S,
                 "client_knows_end": arg != "no_end"}
        end = "the client does not know a conversation's end" if arg else "the client stops after the last turn"
        return PolicyRun(name, {**_vllm_defaults(), "policy.retention": lease}, gpus, nodes,
                         (f"lease {LEASE_S:g} s, heartbeat {HEARTBEAT_S:g} s, idle timeout {IDLE_TIMEOUT_S:g} s, {end}",))
    if base == "ttl_evictable":
        return PolicyRun(name, {**_vllm_defaults(), "policy.retention": {"kind": "ttl_evictable"},
                                "policy.kv_load_failure_policy": "recompute"}, gpus, nodes,
                         ("TTL 480 s, evicted pins' reads recompute (kv_load_failure_policy recompute)",))
    if base == "offload":
        problem = offload_problem(sc)
        if problem:
            raise input_error("--policies offload", problem, f"{OFFLOAD_FIX}, or leave offload out of --policies")
        # the scenario's own host tier (policy.offload), else the hardware preset's
        own = sc.policy.offload.model_dump(mode="python") if sc.policy.offload is not None else {}
        source = "the scenario's policy.offload" if any(v is not None for v in own.values()) else "the hardware preset"
        return PolicyRun(name, {**_vllm_defaults(), "policy.offload": own, "policy.kv_load_failure_policy": "recompute",
                                "policy.router_ttl_s": UNLIMITED_TTL_S}, gpus, nodes,
                         (f"TTL 480 s, host tier from {source}, router keeps entries (the host tier bounds them), "
                          "failure policy recompute",))
    if base == "aggregated":
        routing = arg or default_aggregated_routing(sc)
        problem = aggregated_problem(sc)
        if problem or tp is None:
            raise input_error("--policies aggregated", problem or "no TP for aggregated replicas",
                              "or leave aggregated out of --policies")
        nodes = gpus // tp
        return PolicyRun(name, aggregated_overrides(nodes, routing, tp if tp != dep.tensor_parallel_size else None),
                         gpus, nodes,
                         (f"{nodes} aggregated replicas of {replica_tp_why(sc)}, routing {routing}",))
    raise input_error("--policies", f"policy '{name}' is not modelled by this version of the simulator")


def recommended_overrides(sc: Scenario, replications: int, workers: int,
                          progress: Callable[[int, int], None] | None = None) -> tuple[dict[str, Any], str]:
    """The ``ttl_recommended`` overrides from :func:`kvplan.plan.advice.recommend` and a one-line description."""
    return recommendation_overrides(recommend(sc, replications=replications, workers=workers, progress=progress))


RECOMMENDED_OFF = ("kvplan recommend's answer, which is retention off (bidirectional_kv_xfer false): the same "
                   "deployment as the off column")


def recommendation_overrides(rec: Any) -> tuple[dict[str, Any], str]:
    """The scenario overrides of a :class:`kvplan.plan.advice.Recommendation` (or its ``to_json()`` object) and a
    one-line description."""
    r = rec if isinstance(rec, Mapping) else rec.to_dict()
    ov = {"policy.bidirectional": r["bidirectional"], "policy.decoder_kv_blocks_ttl_s": float(r["decoder_kv_blocks_ttl_s"]),
          "policy.kv_recompute_threshold_tokens": r["kv_recompute_threshold_tokens"],
          "policy.router_ttl_s": float(r["router_ttl_s"]), "policy.kv_load_failure_policy": r["kv_load_failure_policy"]}
    what = (f"TTL {r['decoder_kv_blocks_ttl_s']} s, threshold {r['kv_recompute_threshold_tokens']}, router TTL "
            f"{r['router_ttl_s']} s, {r['kv_load_failure_policy']}" if r["bidirectional"] else "retention off")
    transfer = r.get("transfer")
    on_off = isinstance(transfer, Mapping) and transfer.get("tried_on") == "bidirectional off"
    if isinstance(transfer, Mapping) and transfer.get("adopted") is True and r["bidirectional"] is not on_off:
        # the recommended deployment includes the cross-layer blocks the advisor's trial adopted (its config has them):
        # a trial of the deployment it recommends (retention on, or off when the D leg's P->D reads made the trial)
        ov["deployment.cross_layer_blocks"] = True
        what += ", cross-layer blocks"
    return ov, what


def reusable_recommendation(rec: Any, sc: Scenario, replications: int, where: str = "--recommendation") -> Any:
    """``rec`` (a Recommendation or its ``to_json()`` object) if it is the one ``compare`` would compute for
    ``ttl_recommended`` (same scenario and replications, default TTL grid, no SLO, no budget), so that reusing
    it gives the same rows as rerunning the advisor; otherwise a one-line error naming ``where``."""
    got = rec.get("inputs") if isinstance(rec, Mapping) else getattr(rec, "inputs", None)
    want = recommendation_inputs(sc, replications, DEFAULT_TTL_GRID_S, None, None)
    if got != want:
        differ = sorted(k for k in want if not isinstance(got, Mapping) or got.get(k) != want[k])
        raise input_error(where, f"not the recommendation compare would compute here (differs in: {', '.join(differ)})",
                          f"run `kvplan recommend` on this scenario with --replications {replications} and no SLO, "
                          "budget or TTL grid, or leave it out (compare then runs the advisor)")
    try:  # its values on this scenario, before any run (an edited file: a negative TTL, an unknown policy)
        with_overrides(sc, recommendation_overrides(rec)[0])
    except KvplanInputError as exc:
        problem = str(exc).removeprefix("scenario with overrides: ")
        raise input_error(where, problem, "pass the output of `kvplan recommend --json` as it was written") from None
    return rec


@takes_advice_options
def recommend_with_best_policy(scenario: ScenarioLike, options: AdviceOptions) -> Recommendation:
    """``kvplan recommend --policies``: :func:`kvplan.plan.advice.recommend`, then the alternatives of
    :data:`BEST_CANDIDATES` (retention off, the recommended TTL, lease, evictable pins, offload, aggregated
    serving) simulated on the scenario the advisor simulated, at the same seeds, and the best named in
    ``best_policy`` (:data:`BEST_RULE`). An aggregated scenario has no alternatives: the advice alone.
    The alternatives the advisor already simulated (bidirectional off; the recommended configuration) are
    reused from its runs (:class:`kvplan.plan.executor.RunCache`: same scenario and seeds), not rerun.
    The parameters after ``scenario`` are the fields of :class:`kvplan.plan.advice.AdviceOptions`.
    """
    cache = options.cache if options.cache is not None else RunCache()
    rec, sc = advise(scenario, replace(options, cache=cache))
    if sc.deployment.mode == "aggregated":
        return rec
    # aggregated replicas need the P/D GPUs to be whole TP replicas (heterogeneous P and D TP often are not): that
    # alternative is left out and said so, rather than failing after the advisor's runs and losing the advice
    left_out = default_left_out(sc, BEST_CANDIDATES)
    candidates = [c for c in BEST_CANDIDATES if c not in {x["policy"] for x in left_out}]
    rows = compare(sc, candidates, replications=options.replications, workers=options.workers,
                   recommended=recommendation_overrides(rec), cache=cache)
    if options.slo_ttft_p90_ms is not None:
        _judge_rows_longer(sc, rows, options.slo_ttft_p90_ms / 1000, options.replications, options.workers, cache)
    best = best_policy(rows, options.slo_ttft_p90_ms, options.decode_hbm_budget_gib)
    if left_out:
        best["not_compared"] = left_out
    return replace(rec, best_policy=best)


def _judge_rows_longer(sc: Scenario, rows: list[dict[str, Any]], slo_s: float, replications: int, workers: int,
                       cache: RunCache) -> None:
    """The SLO verdict of each compare row as the advisor's own (:func:`kvplan.plan.advice._judge_slo_longer`) and
    ``capacity`` judge theirs: a row meeting ``slo_s`` on its first run is simulated again with
    :func:`kvplan.plan.steady.judging_conversations` conversations at the same rate and seeds, and that run's p90 is
    its SLO figure (``slo_ttft_p90_s``, ``slo_judged_conversations``, and ``slo_met``, which :func:`best_policy`'s SLO
    test reads); a row missing it on its first run keeps that run's. Judged on the first run alone, a policy at
    capacity for the load was named the best policy meeting an SLO that the recommendation itself, judged longer,
    was said to miss. When then no row meets the SLO, the rows not judged longer yet are too, so that
    :func:`best_policy` ranks every policy on a run of the same kind (a policy missing the SLO over the short first
    run was otherwise ranked on it, against the others' longer, slower runs)."""
    batch = _Batch(sc, replications, workers, None, cache)

    def judge(row: dict[str, Any]) -> bool:
        """Judge ``row`` on its longer run; False when it needs none (the first run is long enough)."""
        ov = dict(row["settings"])
        first = batch.run({"first": ov})["first"]  # the rows compare ran (from the cache)
        n = judging_conversations(with_overrides(sc, ov), judging_span_s(first))
        if n <= sc.workload.conversations:
            return False
        longer = _aggregate(batch.run({"longer": {**ov, "workload.conversations": n}})["longer"])
        row["slo_ttft_p90_s"], row["slo_judged_conversations"] = longer["ttft_p90_s"], n
        row["slo_met"] = _meets(longer, slo_s)  # p90 and errors of the longer run
        return True

    judged: set[int] = set()
    for i, row in enumerate(rows):
        row["slo_ttft_p90_s"], row["slo_judged_conversations"] = row["ttft_p90_s"], sc.workload.conversations
        row["slo_met"] = _meets(row, slo_s)
        if sc.workload.trace is None and row["slo_met"] and judge(row):
            judged.add(i)
    if judged and not any(row["slo_met"] for row in rows):
        for i, row in enumerate(rows):
            if i not in judged:
                judge(row)


def _value(row: dict[str, Any], key: str) -> float:
    if row.get("error") is not None:
        return math.nan
    v = row.get(key)
    return float(v) if v is not None else math.nan


def _aggregate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    failed = [r["error"] for r in rows if r.get("error") is not None]
    if failed:
        raise input_error("compare", f"a run failed: {failed[0]}")
    out: dict[str, Any] = {}
    for k in METRICS:
        src = SOURCE.get(k, k)
        if k in OPTIONAL and not any(src in r for r in rows):
            out[k], out[f"{k}_ci95"] = None, None
            continue
        out[k], out[f"{k}_ci95"] = mean_ci([_value(r, src) for r in rows])
    out["ttft_p90_s_by_replication"] = [_value(r, "ttft_p90_s") for r in rows]  # for paired differences (CRN)
    return out


class _Batch:
    """Runs (name, overrides) x replications through the executor and keeps the rows in order."""

    def __init__(self, base: Scenario, reps: int, workers: int, progress: Callable[[int, int], None] | None,
                 cache: RunCache | None = None) -> None:
        self.base, self.reps, self.workers, self.progress, self.cache = base, reps, workers, progress, cache
        self.key = json.dumps(base.model_dump(mode="json"), sort_keys=True)
        self.done = 0
        self.total = 0

    def run(self, variants: dict[Any, dict[str, Any]]) -> dict[Any, list[dict[str, Any]]]:
        rows: dict[Any, list[dict[str, Any]]] = {k: [{} for _ in range(self.reps)] for k in variants}
        seeds = replication_seeds(self.base.seed, self.reps)
        tasks = [((name, k), ov, seeds[k]) for name, ov in variants.items() for k in range(self.reps)]
        self.total += len(tasks)

        def on_result(key: Any, row: dict[str, Any]) -> None:
            rows[key[0]][key[1]] = row
            self.done += 1
            if self.progress:
                self.progress(self.done, self.total)

        run_tasks(self.base, self.key, tasks, on_result, "local", self.workers, cache=self.cache)
        return rows


def _meets(agg: dict[str, Any], slo_s: float) -> bool:
    turns = agg["turns"] or 0.0
    return bool(agg["ttft_p90_s"] <= slo_s and agg["errors"] <= MAX_ERROR_SHARE * turns)


def _judged(batch: _Batch, base: Scenario, v: dict[str, Any], rows: list[dict[str, Any]], slo_s: float) -> bool:
    """The SLO test of override set ``v`` whose first runs gave ``rows``: a first run meeting it is judged on a
    longer run (:mod:`kvplan.plan.steady`, as ``capacity`` does), so that a load at capacity does not pass over a
    run too short for its queue to grow."""
    first = _meets(_aggregate(rows), slo_s)
    if not first or base.workload.trace is not None:
        return first
    n = judging_conversations(with_overrides(base, v), judging_span_s(rows))
    key = ("longer", json.dumps(v, sort_keys=True))
    return _meets(_aggregate(batch.run({key: {**v, "workload.conversations": n}})[key]), slo_s)


def _max_rate(batch: _Batch, base: Scenario, ov: dict[str, Any], slo_s: float, at_base: list[dict[str, Any]]) -> float:
    """Largest Poisson rate (new conversations/s) at which the policy meets the SLO (0 if none tried does), each rate
    judged on a longer run once its first run meets the SLO (:func:`_judged`)."""
    assert not isinstance(base.workload.arrival, ClosedLoopArrival)
    r0 = base.workload.arrival.rate_per_s

    def ok(rate: float) -> bool:
        v = {**ov, "workload.arrival.rate_per_s": rate, "workload.conversations": conversations_for(base, rate)}
        return _judged(batch, base, v, batch.run({rate: v})[rate], slo_s)

    good, bad = (r0, math.nan) if _judged(batch, base, ov, at_base, slo_s) else (0.0, r0)
    for _ in range(RATE_STEPS):
        if not math.isnan(bad):
            break
        if ok(good * 2):
            good *= 2
        else:
            bad = good * 2
    if math.isnan(bad):
        return good  # still met after 5 doublings: a lower bound
    if good == 0.0:
        rate = bad
        for _ in range(RATE_STEPS):
            rate /= 2
            if ok(rate):
                good = rate
                break
            bad = rate
        if good == 0.0:
            return 0.0
    for _ in range(BISECTIONS):
        mid = (good + bad) / 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


def _check_inputs(sc: Scenario, replications: int, slo_ttft_p90_ms: float | None) -> None:
    """One-line errors for what compare cannot run."""
    if not isinstance(replications, int) or not 1 <= replications <= 1000:
        raise input_error("--replications", f"must be an integer in [1, 1000], got {replications!r}")
    if slo_ttft_p90_ms is not None and not (math.isfinite(slo_ttft_p90_ms) and slo_ttft_p90_ms > 0):
        raise input_error("--slo-ttft-p90-ms", f"must be a positive number, got {slo_ttft_p90_ms!r}")
    if sc.deployment.mode == "aggregated":
        raise input_error("deployment.mode", "compare starts from a disaggregated (P/D) scenario",
                          "give the P/D deployment; the aggregated row uses the same GPUs")
    if slo_ttft_p90_ms is not None and sc.workload.trace is not None:
        raise input_error("--slo-ttft-p90-ms", "a trace brings its own clock: there is no rate to search",
                          "leave out the SLO, or use the trace's time_scale in a sweep")
    if slo_ttft_p90_ms is not None and isinstance(sc.workload.arrival, ClosedLoopArrival):
        raise input_error("--slo-ttft-p90-ms", "the maximum load is searched over a Poisson rate",
                          "use a poisson arrival (or leave out the SLO)")


def compare(
    sc: Scenario,
    policies: Sequence[str] | str | None = None,
    replications: int = 3,
    slo_ttft_p90_ms: float | None = None,
    usd_per_node_hour: float | None = None,
    workers: int = 1,
    progress: Callable[[int, int], None] | None = None,
    recommended: tuple[dict[str, Any], str] | None = None,
    recommendation: Any = None,
    cache: RunCache | None = None,
) -> list[dict[str, Any]]:
    """One row per policy (in the order given): the metrics above, ``policy``, ``gpus``, ``description``, settings.

    ``ttl_recommended`` runs the advisor (:func:`recommended_overrides`) unless the caller already has its
    values: ``recommended`` (overrides and description, as ``recommend --policies`` passes its own), or
    ``recommendation`` (a Recommendation or its JSON object), checked by :func:`reusable_recommendation` to be
    the one the advisor would compute here, so the rows are identical either way. ``cache``
    (:class:`kvplan.plan.executor.RunCache`): runs already in it (same scenario and seed) are reused, not rerun.
    """
    names = parse_policies(policies)
    _check_inputs(sc, replications, slo_ttft_p90_ms)
    node = get_hardware(sc.hardware)
    usd = node.usd_per_hour if usd_per_node_hour is None else usd_per_node_hour  # None: no price known
    if usd is not None and not (math.isfinite(usd) and usd >= 0):
        raise input_error("--usd-per-node-hour", f"must be a number >= 0, got {usd!r}")
    if recommendation is not None and recommended is None:
        recommended = recommendation_overrides(reusable_recommendation(recommendation, sc, replications))
    rec_ov, rec_what = None, ""
    runs = [policy_run(n, sc, {}) for n in names]  # validate every variant before any work
    for r in runs:
        with_overrides(sc, r.overrides)
    check_planned_work(len(runs) * replications, sc, "compare", "lower --replications or --conversations")
    done_before = [0]  # runs of the advisor, so that the progress count keeps growing across both phases

    def rec_progress(done: int, total: int) -> None:
        done_before[0] = done
        if progress:
            progress(done, total + len(runs) * replications)

    if any(n == "ttl_recommended" for n in names):
        rec_ov, rec_what = (recommended if recommended is not None
                            else recommended_overrides(sc, replications, workers, rec_progress))
    runs = [policy_run(n, sc, rec_ov) for n in names]

    def batch_progress(done: int, total: int) -> None:
        if progress:
            progress(done_before[0] + done, done_before[0] + total)

    batch = _Batch(sc, replications, workers, batch_progress, cache)
    rows_by = batch.run({r.name: r.overrides for r in runs})
    out = [_policy_row(r, rows_by[r.name], sc, replications, usd, rec_what) for r in runs]
    xl = cross_layer_candidate(sc, out)
    extra_rows: dict[Any, list[dict[str, Any]]] = {}
    if xl is not None:
        src = next(r for r in runs if r.name == xl["policy"])
        extra = PolicyRun(src.name + CROSS_LAYER, {**src.overrides, "deployment.cross_layer_blocks": True}, src.gpus,
                          src.nodes, (*src.notes, cross_layer_note(sc, rows_by[src.name], xl)))
        runs.append(extra)
        extra_rows = batch.run({extra.name: extra.overrides})
        out.append(_policy_row(extra, extra_rows[extra.name], sc, replications, usd, rec_what))
    rows_by.update(extra_rows)
    for r, row in zip(runs, out, strict=True):
        row["max_rate_per_s_meeting_slo"] = (
            _max_rate(batch, sc, r.overrides, slo_ttft_p90_ms / 1000, rows_by[r.name]) if slo_ttft_p90_ms is not None
            else None)
        row["slo_ttft_p90_ms"] = slo_ttft_p90_ms
    return out


def _policy_row(r: PolicyRun, reps: list[dict[str, Any]], sc: Scenario, replications: int, usd: float | None,
                rec_what: str) -> dict[str, Any]:
    """One output row: the aggregated metrics of ``reps``, the settings and the steady-state cost."""
    agg = _aggregate(reps)
    base = r.name.split(":")[0].removesuffix(CROSS_LAYER)
    row: dict[str, Any] = {"policy": r.name, "gpus": r.gpus, "nodes": r.nodes, "replications": replications,
                           "seed": sc.seed, "description": POLICY_HELP[base],
                           "settings": dict(sorted(r.overrides.items())), **agg}
    if base == "ttl_recommended":
        # recommend may answer retention off: then the column is that deployment, not one with bidirectional on
        row["description"] = (RECOMMENDED_OFF if rec_what == "retention off" else
                              f"{RECOMMENDED_OFF}, with cross-layer blocks (its trial adopted them)"
                              if rec_what.startswith("retention off") else row["description"] + f" ({rec_what})")
    if r.name.endswith(CROSS_LAYER):
        row["description"] += ", with cross_layer_blocks (enable_cross_layers_blocks)"
    if base == "aggregated":  # the replicas' TP and where it comes from (capacity's aggregated column says the same)
        row["tensor_parallel_size"] = aggregated_tp(sc)
        row["tensor_parallel_rule"] = replica_tp_why(sc)
    billed = node_equivalents(r.gpus, get_hardware(sc.hardware).gpus_per_node)
    row["usd_per_million_turns"] = usd_per_million_turns(billed, usd, agg["steady_served_turns_per_s"])
    # its 95% CI from the served rate's (first-order: cost = k / rate, so its relative half-width is the rate's): the
    # cost is as uncertain as the steady served rate it divides by, and the table prints every other row with its CI
    rate, rate_ci = agg["steady_served_turns_per_s"], agg.get("steady_served_turns_per_s_ci95")
    row["usd_per_million_turns_ci95"] = (
        row["usd_per_million_turns"] * float(rate_ci) / float(rate)
        if row["usd_per_million_turns"] is not None and isinstance(rate_ci, int | float) and math.isfinite(rate_ci)
        else None)
    row["cost_basis"] = COST_BASIS
    sat = saturation(reps)
    row["saturated"] = list(sat.resources)  # health resources saturated in any replication
    row["saturated_replications"] = sat.replication_counts()  # ... and in how many of them
    row["notes"] = list(r.notes)
    from kvplan.plan.advice_report import COHORT, COHORT_FIX, context_cut_warning, routing_note, sessions_start_together
    from kvplan.sim.engine import resolve

    routed = routing_note(with_overrides(sc, r.overrides), reps)  # the health section's routing finding
    if routed is not None:
        row["notes"].append(routed)

    cut = context_cut_warning(reps, resolve(sc).arch.max_model_len,
                              None if sc.workload.trace is not None else sc.workload.conversations)
    if cut is not None:
        row["notes"].insert(0, cut)
    ttl = _retention_ttl(sc, r.overrides)
    if ttl is not None and not sat.resources and not steady(reps, ttl):
        # as recommend flags its TTLs: a TTL run shorter than TTL + conversation span never reaches its steady pinned
        # KV, so it can look unsaturated and fast where a steady run saturates decode HBM
        if sessions_start_together(sc):  # no length is steady: say what limits the evidence instead
            row["notes"].insert(0, f"no steady state at TTL {ttl:g} s: {COHORT}; TTFT, pinned KV and saturation are "
                                   f"this cohort's, not a steady load's; {COHORT_FIX}")
        else:
            fix = ("replay a longer window" if sc.workload.trace is not None else
                   raise_conversations_fix(reps, ttl, sc.workload.conversations))
            row["notes"].insert(0, f"run too short for steady state at TTL {ttl:g} s (arrival span < TTL + p90 "
                                   "conversation span): pinned KV was still growing when arrivals ended, so TTFT, "
                                   f"pinned KV and saturation are not steady figures; {fix}")
    return row


def _retention_ttl(sc: Scenario, overrides: dict[str, Any]) -> float | None:
    """The TTL a policy's decode pins live for (TTL retention, evictable or not, with bidirectional on in P/D mode);
    None for the other policies."""
    v = with_overrides(sc, overrides)
    pol = v.policy
    if not pol.bidirectional or v.deployment.mode == "aggregated" or pol.retention.kind not in ("ttl", "ttl_evictable"):
        return None
    return float(pol.decoder_kv_blocks_ttl_s)


def compare_json(rows: list[dict[str, Any]]) -> str:
    """JSON text of the rows (sorted keys, NaN/inf as null): identical inputs give identical bytes."""
    return json.dumps(json_safe(rows), indent=2, sort_keys=True)


FRAME_COLUMNS = ("policy", "gpus", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_mean_s", "tpot_mean_s", "hit_rate",
                 "reuse_rate", "pinned_kv_gib_mean", "pinned_kv_gib_peak", "errors", "preemptions",
                 "prefill_utilization", "usd_per_million_turns")


def compare_frame(rows: list[dict[str, Any]]) -> Any:
    """The rows as a pandas frame of the headline columns (for the dashboard)."""
    import pandas as pd

    return pd.DataFrame([{k: r.get(k) for k in FRAME_COLUMNS} for r in rows], columns=list(FRAME_COLUMNS))
