"""TTL, threshold and router-TTL advice from simulated sweeps: ``recommend(scenario, ...) -> Recommendation``.

Rules (printed with every recommendation, see :data:`RULES`):

* **Threshold**: the analytic break-even pull size ``n*`` under the calibrated costs: the smallest ``n``
  from which pulling ``n`` tokens (``transfer_time_s`` with ``regions x blocks`` descriptors, on an idle
  link, no handshake) is no slower than recomputing them on P. Recomputing costs
  ``prefill_time_s(n + tail, local) - prefill_time_s(tail, local + n)``: the prefill of those tokens on top
  of the local prefix, minus what the request computes anyway (its ``tail`` of new tokens, >= 1 because P
  backs off a full hit by one token), so the per-step fixed cost, paid on both paths, cancels. ``n*`` is
  then checked by simulation at the target load against ``n*/2``, ``2 n*`` and vLLM's 64 (common random
  numbers); a candidate that lowers mean TTFT significantly (95% CI of the paired difference) and by more
  than 1% wins, and the disagreement is reported.
* **TTL**: the shortest TTL of the grid whose mean-TTFT benefit over bidirectional off is at least 95% of
  the benefit of an unlimited TTL (TTL and router TTL 10^7 s, decode KV pool unbounded, so memory does not
  count against it), among TTLs whose peak pinned decode KV fits the HBM budget. When no TTL gets there
  within the budget, the shortest reaching 95% of the best feasible benefit; when no feasible TTL gives a
  significant (and > 1%) benefit, retention is turned down (bidirectional off, or the minimum TTL).
  A TTL whose runs saturate a resource (health section) is not feasible; when every TTL saturates, the
  advice says so and names the smallest change (a TTL that does not, else more P or D: ``kvplan capacity``).
* **Router TTL**: each TTL candidate is simulated with its own ``floor(TTL - safety margin - clock skew -
  allowance)``, allowance = that candidate's own p99 of arrival -> P's connector decision (>= 1 s), never a
  baseline's: searched from 1 s and re-run while the measured p99 exceeds the allowance it ran with
  (:func:`kvplan.plan.advice_runs.settle_router_ttls`), so that the router's entry expires before P would
  decline the read (the reference proxy uses 450 s under 480 s).
* **Screen**: the analytic screen prunes the TTL grid before any run (:func:`kvplan.plan.advice_runs.prune_ttls`);
  a run too short for steady state (arrival span < TTL + p90 conversation span) is lengthened or flagged.
* **Transfer**: when pulls are a large part of TTFT the recommendation is simulated again with cross-layer
  blocks (:mod:`kvplan.plan.advice_transfer`).

Every simulated configuration uses ``kv_load_failure_policy='recompute'`` (a declined read falls back to
prefill instead of failing the request), except the vLLM-defaults baseline (``fail``, 480 s, 64, 450 s).
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, TypeVar

import numpy as np

from kvplan.errors import KvplanInputError, input_error
from kvplan.models.hardware import nixl_backend
from kvplan.plan.advice_report import (
    COHORT,
    COHORT_FIX,
    PROXY_ROUTER_TTL_S,
    VLLM_THRESHOLD,
    VLLM_TTL_S,
    context_cut_warning,
    routing_note,
    run_warnings,
    saturation_lines,
    sessions_start_together,
    steady_json,
    unsaturate_hint,
)
from kvplan.plan.advice_rules import (
    Evidence,
    Rows,
    RunFacts,
    TtlCandidate,
    TtlChoice,
    apply_slo,
    binding_constraint,
    binding_text,
    choose_ttl,
    col,
    judge_recommended_budget,
    judge_recommended_slo,
    mean_ci,
    metrics,
    paired,
    significant_gain,
    threshold_rationale,
    ttl_curve,
)
from kvplan.plan.advice_runs import (
    Gaps,
    RouterFit,
    no_follow_ups,
    prune_ttls,
    raise_conversations_fix,
    saturation,
    screen_ttls,
    settle_router_ttls,
    steady,
    steady_conversations,
    trace_gap_sample,
    trace_pairs,
    workload_gaps,
)
from kvplan.plan.advice_transfer import (
    BREAK_EVEN_SHARE_TRIAL,
    PULL_SHARE_TRIAL,
    VLLM_FLAG,
    DescriptorCost,
    descriptor_cost,
    mean_p2d_tokens,
    mean_pulled_tokens,
    p2d_text,
    threshold_trial_text,
    trial_text,
)
from kvplan.plan.breakeven import BreakEven, break_even
from kvplan.plan.executor import RunCache, run_tasks
from kvplan.plan.grid import check_planned_work
from kvplan.plan.screen import formula_prefix_user, quantile_sample, screen_scenarios
from kvplan.plan.steady import judging_conversations, judging_span_s
from kvplan.sim.engine import Resolved, resolve
from kvplan.sim.history import follow_up_tail_tokens, history_assumption
from kvplan.sim.results import json_safe
from kvplan.sim.router import KV_AWARE_ROUTING
from kvplan.sim.scenario import Scenario, as_scenario, with_overrides
from kvplan.sim.seeds import replication_seeds
from kvplan.units import human_s

log = logging.getLogger(__name__)

__all__ = ["AdviceOptions", "BreakEven", "Recommendation", "break_even", "kv_transfer_config", "recommend"]

DEFAULT_TTL_GRID_S: tuple[float, ...] = (5, 10, 15, 30, 45, 60, 90, 120, 180, 240, 300, 480, 600, 900, 1200, 1800)
UNLIMITED_TTL_S = 1e7
UNBOUNDED_DECODE_KV_TOKENS = 10**12
#: The Little's-law screen is compared with the simulated pinned KV only above this mean (GiB) ...
SCREEN_CHECK_MIN_GIB = 0.5
#: ... and reported as a disagreement beyond this relative difference.
SCREEN_DISAGREEMENT_REL = 0.2
#: Prefix of the advice that applies only if bidirectional_kv_xfer is kept on against a retention-off advice.
IF_KEPT_ON = "Only if you keep bidirectional_kv_xfer on (not recommended): "
REPORTED = ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "hit_rate", "errors", "pinned_kv_gib_mean",
            "pinned_kv_gib_peak", "prefill_utilization", "prefill_utilization_steady", "decode_batch_capacity")
RULES = (
    "TTL rule: the shortest TTL in the grid whose mean-TTFT benefit over bidirectional off reaches 95% of the "
    "benefit of an unlimited TTL (memory not counted), among TTLs whose peak pinned decode KV fits the HBM budget.",
    "Threshold rule: the analytic break-even pull size n* where pulling (transfer_time_s incl. descriptors, idle "
    "link) stops beating recomputing (prefill_time_s of those tokens on top of the local prefix, minus the tail "
    "computed anyway); checked by simulation at the target load against n*/2, 2n* and 64 (the simulator wins); "
    "when cross-layer blocks are adopted, n* of the deployment with them (a cheaper pull), checked by simulation "
    "against the threshold chosen without them.",
    "Router rule: each TTL is simulated with router TTL = floor(D TTL - 5 s safety margin - clock skew - allowance), "
    "allowance = that run's own p99 of arrival->P decision (>= 1 s): searched from 1 s and re-run (up to 3 rounds) "
    "while the measured p99 exceeds the allowance it ran with, so a router hit is never declined by P (PR #47021).",
    "Saturation rule: a TTL whose runs saturate a resource (health: waits > 1 s at p90 on a resource >= 90% busy, in "
    "any replication; the text says in how many) is not eligible; saturated baselines are reported as such, and "
    "bidirectional off saturating is not kept when a feasible TTL saturates nothing (its gain is then no measure).",
)
SCREEN_RULE = ("TTLs whose screened hit rate is under 25% of the best, those above the one after the first reaching 99% "
               "of it, and those whose screened prefill utilisation is >= 1.25 (unless all are) are not simulated "
               "(analytic screen, router TTL = TTL - margin - 1 s)")
RETRY_RULE = ("every TTL the screen kept saturated the deployment, so the shorter TTLs it had pruned by their hit rate "
              "were simulated too (a shorter TTL pins less decode HBM)")
ASSUMPTIONS = (
    "TTFT benefit is measured on mean TTFT with common random numbers (same seeds for every configuration).",
    "Pinned decode KV mean is time-weighted over the steady window (after TTL + p90 conversation span, before the "
    "last conversation starts); peak is over the whole run, averaged over replications.",
    "Decode batch capacity = min(max_num_seqs, (KV pool - pinned KV) / mean request KV (prompt + output)).",
    "Pull cost excludes the one-off handshake; P-side queueing and link sharing are in the simulation, not in n*.",
    "Every recommended configuration uses kv_load_failure_policy 'recompute' (vLLM's KV-transfer config, PR #47021: "
    "with 'fail' a declined read errors the request).",
)


@dataclass(frozen=True)
class Recommendation:
    """The advice: settings, deployable config, expected metrics vs baselines, constraint and rationale.

    ``to_json()`` gives at least ``decoder_kv_blocks_ttl_s``, ``kv_recompute_threshold_tokens``,
    ``router_ttl_s``, ``kv_transfer_config`` (``prefill`` and ``decode``), ``expected`` (metrics at the
    recommendation, each with a ``<metric>_ci95`` half-width) and ``baseline`` (vLLM defaults), plus
    ``bidirectional_off``, ``decode_hbm``, ``binding_constraint``, ``rationale``, ``rules``, ``assumptions``,
    ``warnings``, ``ttl_curve``, ``threshold_check``, ``slo`` and ``disagreements``, ``saturation``, ``screen``,
    ``steady_state`` and ``transfer``, ``verification`` (how ``expected`` is reproduced by simulation), and
    ``inputs`` (what it was computed from, :func:`recommendation_inputs`: a recommendation is reused only for the
    same inputs).
    """

    bidirectional: bool
    decoder_kv_blocks_ttl_s: int
    kv_recompute_threshold_tokens: int
    router_ttl_s: int
    kv_load_failure_policy: str
    kv_transfer_config: dict[str, Any]
    router: dict[str, Any]
    expected: dict[str, float]
    baseline: dict[str, float]
    bidirectional_off: dict[str, float]
    decode_hbm: dict[str, Any]
    binding_constraint: str
    rationale: tuple[str, ...]
    retention_off: bool = False
    #: why retention is off when its gain is unresolved by the replications ('' when the evidence decided)
    inconclusive: str = ""
    rules: tuple[str, ...] = RULES
    assumptions: tuple[str, ...] = ASSUMPTIONS
    warnings: tuple[str, ...] = ()
    ttl_curve: tuple[dict[str, Any], ...] = ()
    threshold_check: dict[str, Any] = field(default_factory=dict)
    slo: dict[str, Any] = field(default_factory=dict)
    disagreements: tuple[str, ...] = ()
    best_policy: dict[str, Any] = field(default_factory=dict)  # kvplan compare's best alternative (plan/compare.py)
    saturation: dict[str, Any] = field(default_factory=dict)  # health resources each configuration saturates
    screen: dict[str, Any] = field(default_factory=dict)  # TTLs simulated and pruned by the analytic screen
    steady_state: dict[str, Any] = field(default_factory=dict)  # conversations simulated, TTLs not steady
    transfer: dict[str, Any] = field(default_factory=dict)  # the cross-layer blocks trial (advice_transfer)
    inputs: dict[str, Any] = field(default_factory=dict)  # recommendation_inputs() of the call
    #: how the ``expected`` figures were obtained: simulations of the recommended deployment itself (its overrides,
    #: the advisor's seeds and conversations), so simulating those reproduces them exactly
    verification: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (lists for tuples; NaN kept as float)."""
        return asdict(self)

    def to_json(self) -> str:
        """JSON text (sorted keys, NaN/inf written as null)."""

        return json.dumps(json_safe(self.to_dict()), indent=2, sort_keys=True)


def recommendation_inputs(sc: Scenario, replications: int, ttl_grid: Sequence[float], slo_ttft_p90_ms: float | None,
                          decode_hbm_budget_gib: float | None) -> dict[str, Any]:
    """What a recommendation depends on: the scenario's SHA-256 (canonical JSON), the replications, the TTL grid
    (sorted, unique) and the SLO and budget (``workers`` and the backend do not change it)."""
    import hashlib

    return {"scenario_sha256": hashlib.sha256(sc.model_dump_json().encode()).hexdigest(),
            "replications": int(replications), "ttl_grid_s": sorted({float(t) for t in ttl_grid}),
            "slo_ttft_p90_ms": slo_ttft_p90_ms, "decode_hbm_budget_gib": decode_hbm_budget_gib}


def kv_transfer_config(bidirectional: bool, ttl_s: int, threshold: int, failure_policy: str,
                       cross_layer_blocks: bool = False, backend: str = "LIBFABRIC") -> dict[str, Any]:
    """The ``--kv-transfer-config`` JSON for one server (identical on P and D, VLLM_BEHAVIOUR.md 1.1); ``backend``:
    the deployment's NIXL backend (:func:`kvplan.models.hardware.nixl_backend`)."""
    extra: dict[str, Any] = {"bidirectional_kv_xfer": bidirectional, "backends": [backend]}
    if cross_layer_blocks:
        extra[VLLM_FLAG] = True
    if bidirectional:  # with bidirectional off the knobs are unused (and the newest code applies a set
        extra["decoder_kv_blocks_ttl"] = int(ttl_s)  # threshold to P->D too), so they are left at defaults
        extra["kv_recompute_threshold"] = int(threshold)
    return {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_both",
        "kv_load_failure_policy": failure_policy,
        "kv_connector_extra_config": extra,
    }


# --- helpers ---------------------------------------------------------------------------------------------------


def _follow_up_shape(sc: Scenario, pairs: Any = None) -> tuple[int, int]:
    """(mean local prefix on P, tail tokens) of a follow-up turn, for the break-even; on a trace, from its turn
    pairs (the previous prompt, which P computed, and the new tokens)."""
    wl, dep = sc.workload, sc.deployment
    same_p = dep.prefill_nodes == 1 or dep.routing in KV_AWARE_ROUTING
    if pairs is not None:
        if not len(pairs):
            return 0, 1
        prev = float(pairs["parent_input"].mean())
        tail = float(np.maximum(pairs["new_tokens"], 0).mean())
        return (int(prev) if (dep.prefill_prefix_caching and same_p) else 0), int(round(tail)) + 1
    t = np.maximum(1, np.rint(quantile_sample(wl.turns)))
    et, et2 = t.mean(), (t * t).mean()
    prefix, user = formula_prefix_user(wl)  # turn 1 as the formulas count it (plan/screen.py)
    out = float(np.maximum(1, np.rint(quantile_sample(wl.output_tokens))).mean())
    km1 = (et2 - et) / 2 / (et - 1) if et > 1 else 1.0
    prev_prompt = prefix + user * km1 + out * (km1 - 1)
    local = int(prev_prompt) if (dep.prefill_prefix_caching and same_p) else 0
    return local, follow_up_tail_tokens(wl, user, out, prev_prompt + out)  # sim/history.py: what the prompt repeats


# --- recommend -------------------------------------------------------------------------------------------------


class Baseline(Enum):
    """The two reference configurations every recommendation is measured against."""

    OFF = "bidirectional off"
    VLLM_DEFAULTS = "vLLM defaults"


#: Key of the unlimited-TTL run in the TTL stage (every finite TTL is keyed by its value in seconds).
UNLIMITED = math.inf
K = TypeVar("K", bound=Hashable)


class _Runner:
    """Runs keyed variants (overrides) x replications in parallel and counts progress."""

    def __init__(self, base: Scenario, reps: int, total: int, progress: Callable[[int, int], None] | None,
                 backend: str, workers: int, ray_address: str | None, cache: RunCache | None = None) -> None:
        self.base, self.reps, self.total, self.progress = base, reps, total, progress
        self.cache = cache
        self.backend, self.workers, self.ray_address = backend, workers, ray_address
        self.done = 0
        self.key = json.dumps(base.model_dump(mode="json"), sort_keys=True)
        self.seeds = replication_seeds(base.seed, reps)

    def run(self, variants: Mapping[K, dict[str, Any]]) -> dict[K, Rows]:
        """Rows of every variant, one per replication (replication ``k`` has the same seed in every variant)."""
        results: dict[K, Rows] = {name: [{}] * self.reps for name in variants}
        tasks = [((name, k), ov, self.seeds[k]) for name, ov in variants.items() for k in range(self.reps)]
        self.total = max(self.total, self.done + len(tasks))  # re-runs of the router search grow the count

        def on_result(key: Any, row: dict[str, Any]) -> None:
            name, k = key
            results[name] = [row if j == k else r for j, r in enumerate(results[name])]
            self.done += 1
            if self.progress:
                self.progress(self.done, self.total)

        run_tasks(self.base, self.key, tasks, on_result, self.backend, self.workers, self.ray_address, self.cache)
        return results


@dataclass(frozen=True)
class _Setup:
    """The validated inputs of :func:`recommend` and what follows from them before any simulation."""

    sc: Scenario  # what is simulated: the user's scenario, lengthened for steady state when needed
    rs: Resolved
    grid: list[float]  # the TTL grid asked for
    ttls: list[float]  # the TTLs simulated (the grid after the screen's pruning)
    pruned: list[float]
    be: BreakEven
    candidates: list[int]
    margin: float
    slo_ms: float | None
    budget: float | None
    gaps: Gaps | None
    lengthened: tuple[int, int] | None  # (conversations asked, conversations simulated)
    no_gaps: str = "no follow-up turns"  # what the rationale says when there are no gaps to quote
    retried: tuple[float, ...] = ()  # pruned TTLs simulated after all the others saturated (:func:`_retry_shorter`)


@dataclass
class _Stages:
    """The simulated rows of the baselines, of each TTL at its own router TTL, and of the unlimited TTL."""

    off: Rows
    defaults: Rows
    fits: dict[float, RouterFit]
    unlimited: Rows


ScenarioLike = Scenario | dict[str, Any] | str | Path
P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class AdviceOptions:
    """The knobs of :func:`recommend`, :func:`recommend_simulated` and
    :func:`kvplan.plan.compare.recommend_with_best_policy`, declared once: each of those takes the scenario and
    then exactly these parameters (positionally in this order, or by name), through :data:`takes_advice_options`.

    What is advised depends on ``slo_ttft_p90_ms``, ``decode_hbm_budget_gib``, ``replications`` and ``ttl_grid``
    (:func:`recommendation_inputs`); ``progress(done, total)`` is called per finished run; ``workers``,
    ``backend`` and ``ray_address`` say where the runs go (:func:`kvplan.plan.executor.run_tasks`); with
    ``cache`` (:class:`kvplan.plan.executor.RunCache`) every run is stored in it and a run already in it is not
    repeated. None of the last five changes the advice.
    """

    slo_ttft_p90_ms: float | None = None
    decode_hbm_budget_gib: float | None = None
    replications: int = 3
    ttl_grid: Sequence[float] = DEFAULT_TTL_GRID_S
    progress: Callable[[int, int], None] | None = None
    workers: int = 1
    backend: str = "local"
    ray_address: str | None = None
    cache: RunCache | None = None

    def inputs(self, sc: Scenario) -> dict[str, Any]:
        """:func:`recommendation_inputs` of ``sc`` under these options."""
        return recommendation_inputs(sc, self.replications, self.ttl_grid, self.slo_ttft_p90_ms,
                                     self.decode_hbm_budget_gib)


def _options_call(
    cls: Callable[P, AdviceOptions],
) -> Callable[[Callable[[ScenarioLike, AdviceOptions], R]], Callable[Concatenate[ScenarioLike, P], R]]:
    def wrap(f: Callable[[ScenarioLike, AdviceOptions], R]) -> Callable[Concatenate[ScenarioLike, P], R]:
        @functools.wraps(f)
        def call(scenario: ScenarioLike, *args: P.args, **kwargs: P.kwargs) -> R:
            return f(scenario, cls(*args, **kwargs))

        sig = inspect.signature(f)
        call.__signature__ = sig.replace(  # type: ignore[attr-defined]  # help() shows the knobs
            parameters=[next(iter(sig.parameters.values())), *inspect.signature(cls).parameters.values()])
        return call

    return wrap


#: ``f(scenario, options)`` as ``f(scenario, <the fields of AdviceOptions>)``: the public signature of the recommend
#: family; mypy checks every call against :class:`AdviceOptions`'s fields.
takes_advice_options = _options_call(AdviceOptions)


@takes_advice_options
def recommend(scenario: ScenarioLike, options: AdviceOptions) -> Recommendation:
    """Recommend ``decoder_kv_blocks_ttl``, ``kv_recompute_threshold`` and the router TTL for ``scenario``.

    Simulates (``replications`` seeds each, common random numbers): bidirectional off, vLLM's defaults, every
    TTL of ``ttl_grid`` the screen keeps (each at its own router TTL) and an unlimited TTL, then the threshold
    candidates at the chosen TTL and, when pulls are a large part of TTFT, cross-layer blocks; applies
    :data:`RULES`; ``slo_ttft_p90_ms`` (optional) moves the TTL up when a longer one meets it;
    ``decode_hbm_budget_gib`` (optional) caps the peak pinned decode KV. ``progress(done, total)`` is called per
    finished run. A scenario too short for steady state is lengthened (:func:`steady_conversations`).
    The parameters after ``scenario`` are the fields of :class:`AdviceOptions`.
    The best of the policy alternatives (``kvplan recommend --policies``) is added on top of this by
    :func:`kvplan.plan.compare.recommend_with_best_policy`.
    """
    return advise(scenario, options)[0]


@takes_advice_options
def recommend_simulated(scenario: ScenarioLike, options: AdviceOptions) -> tuple[Recommendation, Scenario]:
    """:func:`recommend` and the scenario its runs simulated (the user's, lengthened for steady state when needed);
    with ``cache`` (:class:`kvplan.plan.executor.RunCache`) every run is stored in it and a run already in it is
    not repeated."""
    return advise(scenario, options)


def advise(scenario: ScenarioLike, options: AdviceOptions) -> tuple[Recommendation, Scenario]:
    """:func:`recommend_simulated` with its knobs as one :class:`AdviceOptions`."""
    o = options
    user_sc = as_scenario(scenario)
    setup = _setup(user_sc, o.slo_ttft_p90_ms, o.decode_hbm_budget_gib, o.replications, o.ttl_grid)
    total = o.replications * (2 + len(setup.ttls) + 1 + len(setup.candidates) - 1)
    check_planned_work(total, setup.sc, "recommend", "lower --replications, --conversations or the TTL grid")
    runner = _Runner(setup.sc, o.replications, total, o.progress, o.backend, o.workers, o.ray_address, o.cache)
    from dataclasses import replace

    setup, stages = _retry_shorter(setup, _simulate_stages(setup, runner), runner)
    rec = replace(_decide(setup, stages, runner), inputs=o.inputs(user_sc))
    return replace(rec, assumptions=(*rec.assumptions, history_assumption(setup.sc.workload))), setup.sc


def _setup(sc: Scenario, slo_ms: float | None, budget: float | None, replications: int,
           ttl_grid: Sequence[float]) -> _Setup:
    if not isinstance(replications, int) or replications < 1:
        raise input_error("replications", f"must be an integer >= 1, got {replications!r}")
    grid = sorted({float(t) for t in ttl_grid})
    if not grid or any((not math.isfinite(t)) or t <= 0 for t in grid):
        raise input_error("ttl_grid", "must be a non-empty list of positive TTLs in seconds")
    for name, v in (("--slo-ttft-p90-ms", slo_ms), ("--decode-hbm-budget-gib", budget)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise input_error(name, f"must be a positive number, got {v!r}")
    if sc.deployment.mode == "aggregated":  # as capacity and compare refuse it
        raise input_error("deployment.mode", "recommend tunes bidirectional KV transfer between prefill and decode "
                          "nodes, which aggregated replicas do not have",
                          "give the P/D deployment (kvplan compare runs the same GPUs as aggregated replicas beside it)")
    rs = resolve(sc)
    pol = sc.policy
    pairs = trace_pairs(sc, rs.arch.max_model_len)  # the requests replayed, not those the context limit skips
    trace_gaps = trace_gap_sample(pairs)
    be = break_even(rs, *_follow_up_shape(sc, pairs))
    bs = rs.arch.block_size_tokens
    cands = {be.tokens, max(bs, round(be.tokens / 2 / bs) * bs), round(2 * be.tokens / bs) * bs, VLLM_THRESHOLD}
    candidates = sorted(int(c) for c in cands if 0 < c <= rs.arch.max_model_len + 1)
    if be.tokens not in candidates:
        candidates = sorted([*candidates, be.tokens])
    margin = pol.expiry_safety_margin_s + max(pol.clock_skew_s, 0.0)
    ttls, pruned = prune_ttls(grid, *screen_ttls(sc, grid, margin, trace_gaps))
    lengthened = None
    n = steady_conversations(rs, max(ttls))
    if n is not None:
        try:
            longer = with_overrides(sc, {"workload.conversations": n})
        except KvplanInputError:  # beyond the scenario's limits: the runs are flagged instead
            longer = None
        if longer is not None:
            lengthened, sc = (sc.workload.conversations, n), longer
            rs = resolve(sc)
    selection = pairs.attrs.get("selection") if pairs is not None else None
    return _Setup(sc, rs, grid, ttls, pruned, be, candidates, margin, slo_ms, budget,
                  workload_gaps(sc, trace_gaps, selection), lengthened, no_follow_ups(selection))


def _on(ttl: float, router: float, threshold: int) -> dict[str, Any]:
    return {"policy.bidirectional": True, "policy.decoder_kv_blocks_ttl_s": float(ttl),
            "policy.router_ttl_s": float(router), "policy.kv_recompute_threshold_tokens": int(threshold),
            "policy.kv_load_failure_policy": "recompute"}


def _simulate_stages(setup: _Setup, runner: _Runner) -> _Stages:
    # stage 1: the baselines, measured (their saturation is reported, their P-decision delay is not reused)
    base_rows = runner.run({
        Baseline.OFF: {"policy.bidirectional": False},
        Baseline.VLLM_DEFAULTS: {"policy.bidirectional": True, "policy.decoder_kv_blocks_ttl_s": VLLM_TTL_S,
                                 "policy.kv_recompute_threshold_tokens": VLLM_THRESHOLD,
                                 "policy.router_ttl_s": PROXY_ROUTER_TTL_S, "policy.kv_load_failure_policy": "fail"},
    })
    n_star = setup.be.tokens
    # stage 2: each TTL at the analytic threshold with its own router TTL, plus an unlimited TTL (memory unbounded)
    unlimited = runner.run({UNLIMITED: {**_on(UNLIMITED_TTL_S, UNLIMITED_TTL_S, n_star),
                                        "deployment.decode_kv_capacity_tokens": UNBOUNDED_DECODE_KV_TOKENS}})[UNLIMITED]
    fits = settle_router_ttls(runner.run, {t: t for t in setup.ttls}, lambda t, r: _on(t, r, n_star), setup.margin)
    return _Stages(base_rows[Baseline.OFF], base_rows[Baseline.VLLM_DEFAULTS], fits, unlimited)


def _retry_shorter(setup: _Setup, st: _Stages, runner: _Runner) -> tuple[_Setup, _Stages]:
    """Stage 2b: when every TTL simulated saturates, the TTLs shorter than all of them that the screen pruned (by
    its hit rate: a shorter TTL catches fewer returns, but pins less, and saturation reverses the order) are
    simulated too, each with its own router TTL, before the advice concludes that no TTL unsaturates the deployment.
    Llama-3.1-8B on p5 at 40 conversations/s: the screen kept 90-1800 s, all saturated decode HBM, and the answer
    said 'the deployment is too small for the load whatever the TTL' beside bidirectional off saturating nothing."""
    from dataclasses import replace

    shorter = [t for t in setup.pruned if t < min(setup.ttls)] if setup.ttls else []
    if not shorter or not st.fits or not all(saturation(f.rows) for f in st.fits.values()):
        return setup, st
    n_star = setup.be.tokens
    more = settle_router_ttls(runner.run, {t: t for t in shorter}, lambda t, r: _on(t, r, n_star), setup.margin)
    ttls = sorted([*setup.ttls, *shorter])
    return (replace(setup, ttls=ttls, pruned=[t for t in setup.pruned if t not in shorter], retried=tuple(shorter)),
            replace(st, fits={t: (more[t] if t in more else st.fits[t]) for t in ttls}))


def _check_threshold(be: BreakEven, thr_rows: dict[int, Rows]) -> tuple[int, list[dict[str, Any]], list[str]]:
    """The threshold rule's simulation check: a candidate significantly faster than n* wins."""
    ref = thr_rows[be.tokens]
    ref_mean = mean_ci(col(ref, "ttft_mean_s"))[0]
    threshold, best_gain, check_rows = be.tokens, 0.0, []
    for c, rows in sorted(thr_rows.items()):
        gain = paired(ref, rows)  # positive: c is faster than n*
        check_rows.append({"threshold_tokens": c, "ttft_mean_s": mean_ci(col(rows, "ttft_mean_s"))[0],
                           "gain_vs_break_even_s": gain[0], "gain_ci95": gain[1]})
        if c != be.tokens and significant_gain(gain, ref_mean) and gain[0] > best_gain:
            best_gain, threshold = gain[0], c
    disagreements = []
    if threshold != be.tokens:
        disagreements.append(
            f"threshold: simulation at the target load favours {threshold} tokens over the analytic break-even "
            f"{be.tokens} (mean TTFT {best_gain * 1000:.1f} ms lower); the simulator wins")
    return threshold, check_rows, disagreements


@dataclass(frozen=True)
class _Threshold:
    tokens: int
    check_rows: list[dict[str, Any]]
    disagreements: list[str]
    rows: Rows | None  # the chosen TTL's rows at the chosen threshold (None: retention off)
    be: BreakEven | None = None  # the break-even the rule used when not the setup's (cross-layer blocks adopted)


def _threshold_stage(setup: _Setup, runner: _Runner, rec: TtlCandidate | None, rec_rows: Rows | None) -> _Threshold:
    """Stage 3: the threshold candidates at the chosen TTL and its router TTL (with retention off: at the shortest
    TTL simulated, the one advised if bidirectional is kept on)."""
    n_star = setup.be.tokens
    if rec is None or rec_rows is None:
        return _Threshold(n_star, [], [], None)
    others = runner.run({c: _on(rec.ttl_s, rec.router_ttl_s, c) for c in setup.candidates if c != n_star})
    thr_rows = {n_star: rec_rows, **others}
    tokens, check_rows, disagreements = _check_threshold(setup.be, thr_rows)
    return _Threshold(tokens, check_rows, disagreements, thr_rows[tokens])


def _cross_layer_break_even(setup: _Setup) -> BreakEven:
    """The break-even n* of the scenario with cross-layer blocks (same local prefix and tail as the setup's)."""
    return break_even(resolve(with_overrides(setup.sc, {"deployment.cross_layer_blocks": True})),
                      setup.be.local_prefix_tokens, setup.be.tail_tokens)


#: The figures a cross-layer trial reports for its runs without and with the flag (``transfer.without``/``with``).
_TRIAL_KEYS = ("ttft_p50_s", "ttft_p90_s", "ttft_mean_s", "kv_pull_mean_s")


def _flag_trial(runner: _Runner, rows0: Rows, variant: dict[str, Any], m: Callable[[Rows], dict[str, float]],
                trigger: str, dc: DescriptorCost, text: Callable[..., str]) -> tuple[dict[str, Any], Rows | None]:
    """``variant`` (the deployment whose runs are ``rows0``) again with cross-layer blocks on the same seeds: the trial's
    report (``text`` words it) and, when the flag is significantly faster, its runs."""
    base = m(rows0)
    rows = runner.run({"x": {**variant, "deployment.cross_layer_blocks": True}})["x"]
    mx = m(rows)
    gain = paired(rows0, rows)
    adopted = significant_gain(gain, base["ttft_mean_s"])
    keys = _TRIAL_KEYS + (("p2d_transfer_mean_s",) if trigger == "p2d_share" else ())
    return {"tried": True, "adopted": adopted, "vllm_flag": VLLM_FLAG, "descriptor_cost": dc.to_dict(),
            "trigger": trigger, "ttft_mean_gain_s": gain[0], "ttft_mean_gain_ci95": gain[1],
            "without": {k: base[k] for k in keys}, "with": {k: mx[k] for k in keys},
            "text": text(dc, base, mx, gain, adopted, human_s)}, (rows if adopted else None)


def _p2d_trial(setup: _Setup, runner: _Runner, rows0: Rows, variant: dict[str, Any],
               m: Callable[[Rows], dict[str, float]]) -> tuple[dict[str, Any], Rows | None]:
    """The cross-layer trial when the D leg's P->D reads (D reads the prompt P computed, ``nixl/pull_worker.py``) are
    a large part of TTFT, priced at their mean size."""
    ok = [r for r in rows0 if r.get("error") is None]
    dc = descriptor_cost(setup.rs, mean_p2d_tokens(ok[0]) if ok else 0, p2d=True)
    return _flag_trial(runner, rows0, variant, m, "p2d_share", dc, p2d_text)


def _p2d_heavy(mt: dict[str, float]) -> bool:
    """The D leg's P->D reads, per turn, are at least :data:`PULL_SHARE_TRIAL` of the TTFT p50."""
    return bool(mt.get("p2d_transfer_mean_s", 0.0) >= PULL_SHARE_TRIAL * mt["ttft_p50_s"])


def _cross_layer_stage(setup: _Setup, runner: _Runner, rec: TtlCandidate | None, thr: _Threshold,
                       m: Callable[[Rows], dict[str, float]], off_rows: Rows | None = None,
                       ) -> tuple[dict[str, Any], Rows | None, Rows | None]:
    """Stage 4: the recommendation again with cross-layer blocks when pulls are a large part of TTFT, or when the
    descriptors set the threshold (the flag's break-even at most :data:`BREAK_EVEN_SHARE_TRIAL` of it: that threshold
    recomputes the pulls the flag would make cheap, so the flag is also simulated at its own break-even and adopted
    when the better of the two is significantly faster), or when the D leg's P->D reads are (the flag makes those
    cheaper too: with retention recommended off, ``off_rows``' deployment is tried with it). Returns the trial's
    report and, when the flag is adopted, its runs at the chosen threshold (those of the recommended deployment) and
    at the flag's break-even (or None)."""
    if setup.sc.deployment.cross_layer_blocks:
        return {}, None, None
    if rec is None:  # retention off: the plain P/D deployment's own reads
        if off_rows is None or not _p2d_heavy(m(off_rows)):
            return {}, None, None
        report, rows = _p2d_trial(setup, runner, off_rows, {"policy.bidirectional": False}, m)
        return {**report, "tried_on": "bidirectional off"}, rows, None
    if thr.rows is None:
        return {}, None, None
    base = m(thr.rows)
    be_x: BreakEven | None = None
    if not base["kv_pull_mean_s"] >= PULL_SHARE_TRIAL * base["ttft_p50_s"]:
        if _p2d_heavy(base):
            report, rows = _p2d_trial(setup, runner, thr.rows, _on(rec.ttl_s, rec.router_ttl_s, thr.tokens), m)
            return report, rows, None
        be_x = _cross_layer_break_even(setup)
        if not be_x.tokens <= BREAK_EVEN_SHARE_TRIAL * thr.tokens:
            return {}, None, None
    flag = {**_on(rec.ttl_s, rec.router_ttl_s, thr.tokens), "deployment.cross_layer_blocks": True}
    if be_x is not None:  # the descriptors set the threshold: the flag at its own break-even too
        runs = runner.run({"x": flag, "xt": {**flag, "policy.kv_recompute_threshold_tokens": be_x.tokens}})
        rows, xt_rows = runs["x"], runs["xt"]
        gain_x, gain_xt = paired(thr.rows, rows), paired(thr.rows, xt_rows)
        adopted = significant_gain(gain_x, base["ttft_mean_s"]) or significant_gain(gain_xt, base["ttft_mean_s"])
        mx = m(xt_rows)
        dc = descriptor_cost(setup.rs, thr.tokens)
        return {"tried": True, "adopted": adopted, "vllm_flag": VLLM_FLAG, "descriptor_cost": dc.to_dict(),
                "trigger": "break_even", "trial_threshold_tokens": be_x.tokens,
                "ttft_mean_gain_s": gain_xt[0], "ttft_mean_gain_ci95": gain_xt[1],
                "ttft_mean_gain_at_threshold_s": gain_x[0], "ttft_mean_gain_at_threshold_ci95": gain_x[1],
                "without": {k: base[k] for k in _TRIAL_KEYS}, "with": {k: mx[k] for k in _TRIAL_KEYS},
                "text": threshold_trial_text(dc, be_x.tokens, base, mx, gain_xt, adopted, human_s)}, (
                    rows if adopted else None), (xt_rows if adopted else None)
    ok = [r for r in thr.rows if r.get("error") is None]
    dc = descriptor_cost(setup.rs, mean_pulled_tokens(ok[0]) if ok else 0)
    report, rows = _flag_trial(runner, thr.rows, _on(rec.ttl_s, rec.router_ttl_s, thr.tokens), m, "pull_share", dc,
                               trial_text)
    return report, rows, None


def _cross_layer_threshold(setup: _Setup, runner: _Runner, at: TtlCandidate, thr: _Threshold, x_rows: Rows,
                           transfer: dict[str, Any], xt_rows: Rows | None = None) -> _Threshold:
    """Stage 4b, cross-layer blocks adopted: the threshold rule applied to the deployment recommended. One region
    per layer group instead of one per layer makes a pull cheaper (fewer descriptors), so its break-even n* is lower
    than the one the threshold stage used; that n* is simulated with the flag against the threshold chosen without
    it, which is kept only when significantly faster (the simulator wins), as in :func:`_check_threshold`.
    Returns the threshold with its rows (the recommended deployment's runs) and the break-even the rule used."""
    from dataclasses import replace

    be_x = _cross_layer_break_even(setup)
    transfer["break_even_tokens"] = be_x.tokens
    if be_x.tokens == thr.tokens:
        transfer["threshold_tokens"] = thr.tokens
        return replace(thr, rows=x_rows, be=be_x)
    rows = xt_rows if xt_rows is not None else runner.run({"xt": {**_on(at.ttl_s, at.router_ttl_s, be_x.tokens),
                                                                  "deployment.cross_layer_blocks": True}})["xt"]
    tokens, check, disagreements = _check_threshold(be_x, {be_x.tokens: rows, thr.tokens: x_rows})
    transfer["threshold_tokens"] = tokens
    transfer["threshold_check"] = check
    return _Threshold(tokens, [*thr.check_rows, *({**c, "cross_layer_blocks": True} for c in check)],
                      [*thr.disagreements, *(f"with cross-layer blocks: {d}" for d in disagreements)],
                      rows if tokens == be_x.tokens else x_rows, be_x)


def _decide(setup: _Setup, st: _Stages, runner: _Runner) -> Recommendation:
    sc, dep = setup.sc, setup.sc.deployment

    def m(rows: Rows) -> dict[str, float]:
        return metrics(rows, dep.max_num_seqs, dep.decode_nodes)

    off_m, def_m = m(st.off), m(st.defaults)
    off_sat, def_sat = saturation(st.off), saturation(st.defaults)
    unlimited = paired(st.off, st.unlimited)
    sats = {t: saturation(f.rows) for t, f in st.fits.items()}
    facts = {t: RunFacts(f.router_ttl_s, f.allowance_s, f.settled, sats[t].text(), steady(f.rows, t), sats[t].share())
             for t, f in st.fits.items()}
    ttl_rows = {t: f.rows for t, f in st.fits.items()}
    curve = ttl_curve(setup.ttls, ttl_rows, st.off, unlimited, off_m["ttft_mean_s"], m, setup.budget, facts)
    gaps = setup.gaps.text() if setup.gaps is not None else setup.no_gaps
    choice = choose_ttl(Evidence(curve, off_m["ttft_mean_s"], unlimited, mean_ci(col(st.unlimited, "hit_rate"))[0],
                                 setup.budget, gaps, setup.be.local_prefix_tokens,
                                 setup.gaps.p10 if setup.gaps is not None else math.nan, off_sat.text(),
                                 len(st.off)))
    warnings: list[str] = []
    # the curve's verdict only moves the TTL; the SLO is judged on the recommended deployment's runs (below)
    slo = apply_slo(choice, curve, off_m, setup.slo_ms, [])
    rec = choice.chosen
    at = rec if rec is not None else curve[0]  # retention off: the minimum TTL, if kept on
    thr = _threshold_stage(setup, runner, at, ttl_rows[at.ttl_s])
    transfer, x_rows, xt_rows = _cross_layer_stage(setup, runner, rec, thr, m, st.off)
    if rec is not None and x_rows is not None:  # the threshold rule on the deployment recommended, flag included
        thr = _cross_layer_threshold(setup, runner, at, thr, x_rows, transfer, xt_rows)
        x_rows = thr.rows
    be = thr.be or setup.be  # the break-even of the deployment recommended
    # the expected figures are the runs of the recommended deployment itself: with cross-layer blocks when adopted
    exp_rows = x_rows if x_rows is not None else thr.rows if rec is not None and thr.rows is not None else st.off
    exp_m = m(exp_rows)
    final = ({"policy.bidirectional": False, **({"deployment.cross_layer_blocks": True} if transfer.get("adopted")
                                                 else {})} if rec is None else
             {**_on(at.ttl_s, at.router_ttl_s, thr.tokens),
              **({"deployment.cross_layer_blocks": True} if transfer.get("adopted") else {})})
    slo = judge_recommended_slo(slo, exp_m["ttft_p90_s"], warnings)
    slo = _judge_slo_longer(setup, runner, slo, final, exp_rows, warnings)
    exp_sat = saturation(exp_rows)
    binding = binding_constraint(choice.binding, exp_m, slo, rec is not None, exp_sat.resources)
    ttl, router, allowance = int(at.ttl_s), at.router_ttl_s, at.allowance_s
    bidir = not choice.retention_off
    rationale = [*saturation_lines((def_m, def_sat), (off_m, off_sat), curve), *choice.rationale]
    if rec is None or all(c.saturated for c in curve):
        rationale.extend(unsaturate_hint(setup.rs, exp_sat if rec is not None else off_sat, curve))
    # with retention off the threshold and router TTL only matter if the operator keeps bidirectional on anyway
    kept_on = IF_KEPT_ON if choice.retention_off else ""
    if choice.retention_off:
        rationale.append(f"Recommended: bidirectional_kv_xfer off; if you keep it on, use the minimum TTL {ttl} s "
                         "to bound the pinned decode HBM.")
    rationale.append(kept_on + threshold_rationale(thr.tokens, be, setup.be if be is not setup.be else None))
    fit = st.fits[at.ttl_s]
    how = (f"its own p99 arrival->P decision, {fit.rounds} simulation round(s)" if fit.settled else
           f"not settled after {fit.rounds} round(s): its own p99 arrival->P decision measured "
           f"{human_s(fit.measured_s)}, more than the allowance, so some router hits will be declined by P")
    rationale.append(f"{kept_on}Router TTL {router} s = floor({ttl} - {setup.margin:g} s margin - {allowance:g} s "
                     f"P-decision allowance ({how})).")
    if transfer:
        rationale.append(transfer["text"])
    warnings.extend(run_warnings(setup.rs, curve, {t: f.rows for t, f in st.fits.items()}))
    routed = routing_note(sc, exp_rows)  # the health section's routing finding, on the recommended deployment's runs
    if routed is not None:
        warnings.append(routed)
    cut = context_cut_warning(st.off, setup.rs.arch.max_model_len,
                              None if sc.workload.trace is not None else sc.workload.conversations)
    if cut is not None:
        warnings.append(cut)
    if st.defaults and not def_sat.resources and not steady(st.defaults, VLLM_TTL_S):
        # the headline compares with this column: a TTL-480 s run shorter than TTL + span never reaches the pinned KV
        # of its steady state, so it can look unsaturated and fast where a steady run saturates decode HBM (a
        # saturated one is reported as such: it has no steady state at any length)
        if sessions_start_together(sc):  # no length is steady: say why, once the TTL curve's warning said how
            said = any(w.startswith("no steady state at TTL") for w in warnings)
            warnings.append(f"the vLLM-defaults column (TTL {VLLM_TTL_S:g} s) has no steady state either: "
                            + ("the sessions all start together (above)" if said else COHORT)
                            + "; its TTFT, pinned KV and saturation are this cohort's, not a steady load's (a steady "
                            "load can saturate)" + ("" if said else f"; {COHORT_FIX}"))
        else:
            fix = ("replay a longer window" if sc.workload.trace is not None else
                   raise_conversations_fix(st.defaults, VLLM_TTL_S, sc.workload.conversations))
            warnings.append(f"the vLLM-defaults column (TTL {VLLM_TTL_S:g} s) ran too short for steady state (arrival "
                            "span < TTL + p90 conversation span): its pinned KV was still growing when arrivals ended, "
                            f"so its TTFT, pinned KV and saturation are not steady figures (a steady run can saturate); "
                            f"{fix}")
    disagreements = list(thr.disagreements)
    # the screen's steady pinned KV is compared only with a window past the pins' ramp-up (as sweeps do: a window
    # inside it averages pins still accumulating, and the screen was right, plan/screen.py not_steady)
    after_ramp = all(float(r.get("pinned_window_after_ramp", 1.0)) >= 1.0 for r in exp_rows if r.get("error") is None)
    if rec is not None and after_ramp:
        disagreements.extend(_screen_disagreement(sc, ttl, router, thr.tokens, exp_m["pinned_kv_gib_mean"]))
    off0 = st.off[0] if st.off and st.off[0].get("error") is None else {}
    hbm = {
        "pinned_kv_gib_mean": exp_m["pinned_kv_gib_mean"] if bidir else 0.0,
        "pinned_kv_gib_peak": exp_m["pinned_kv_gib_peak"] if bidir else 0.0,
        "decode_kv_capacity_gib": float(off0.get("decode_kv_capacity_gib", math.nan)),
        "budget_gib": setup.budget,
        "decode_batch_capacity_without_retention": off_m["decode_batch_capacity"],
        "decode_batch_capacity_at_recommendation": exp_m["decode_batch_capacity"],
        "decode_batch_capacity_at_vllm_defaults": def_m["decode_batch_capacity"],
        # the recommended deployment's own peak against the budget (null: no budget, or retention off)
        "within_budget": judge_recommended_budget(setup.budget, exp_m["pinned_kv_gib_peak"],
                                                  at.metrics["pinned_kv_gib_peak"], warnings) if bidir else None,
    }
    choice.rationale = rationale
    extra = {"saturation": {"vllm_defaults": list(def_sat.resources), "bidirectional_off": list(off_sat.resources),
                            "recommended": list(exp_sat.resources),
                            # {configuration: {resource: replications saturating it}} of the lists above
                            "saturated_replications": {"vllm_defaults": def_sat.replication_counts(),
                                                       "bidirectional_off": off_sat.replication_counts(),
                                                       "recommended": exp_sat.replication_counts()},
                            "replications": {"vllm_defaults": def_sat.replications,
                                             "bidirectional_off": off_sat.replications,
                                             "recommended": exp_sat.replications}},
             "screen": {"simulated_ttls_s": setup.ttls, "pruned_ttls_s": setup.pruned, "rule": SCREEN_RULE,
                        **({"retried_ttls_s": list(setup.retried), "retried_why": RETRY_RULE} if setup.retried else {})},
             "steady_state": steady_json(setup.sc, setup.lengthened, curve, st.off), "transfer": transfer,
             "verification": verification(setup.sc, final, list(runner.seeds), exp_rows)}
    return _recommendation(setup, thr, bidir, ttl, router, (exp_m, def_m, off_m), hbm,
                           binding_text(binding, exp_m, gaps), choice, curve, slo, warnings, disagreements, extra)


#: Where ``kvplan simulate``'s output has each ``expected`` figure of one seed (``expected`` is the mean over the
#: seeds): a summary.json key, or how to derive it from the result files.
SIMULATE_FIGURES: dict[str, str] = {
    "ttft_mean_s": "summary.json ttft_mean_s", "ttft_p50_s": "summary.json ttft_p50_s",
    "ttft_p90_s": "summary.json ttft_p90_s", "ttft_p99_s": "summary.json ttft_p99_s",
    "hit_rate": "summary.json hit_rate", "errors": "summary.json errors",
    "pinned_kv_gib_peak": "summary.json pinned_kv_gib_peak",
    "prefill_utilization": "summary.json prefill_utilization",
    "prefill_utilization_steady": "summary.json prefill_utilization_steady_max (the busiest P engine, as "
                                  "health.resources.prefill_compute.utilization; summary.json's "
                                  "prefill_utilization_steady is the mean over P engines)",
    "pinned_kv_gib_mean": "pinned.parquet: the time-weighted mean of pinned_gib (each row's level holds until the "
                          "next row) over that seed's steady_pinned_windows_s (summary.json's pinned_kv_gib_mean is "
                          "the whole run's, ramp-up and drain included)",
    "decode_batch_capacity": "derived: min(max_num_seqs, (summary.json decode_kv_capacity_tokens - the pinned mean "
                             "above in tokens per D node) / the mean prompt + output tokens of turns.parquet)",
}


def verification(sc: Scenario, overrides: dict[str, Any], seeds: list[int], rows: Rows) -> dict[str, Any]:
    """How ``expected`` is reproduced: the recommended deployment's overrides, the seeds and run length it was
    simulated with, and where ``kvplan simulate``'s output has each figure (:data:`SIMULATE_FIGURES`, with each
    seed's steady window for the pinned-KV mean, which summary.json does not give)."""
    trace = sc.workload.trace
    windows = [[r.get("steady_pinned_window_start_s"), r.get("steady_pinned_window_end_s")]
               if r.get("error") is None else None for r in rows]
    return {"by": "simulation", "expected_is": "the mean over these seeds of the recommended deployment simulated "
            "with these overrides (the kv_transfer_config's settings)",
            "overrides": overrides, "seeds": seeds,
            # the whole scenario simulated, overrides applied: what a --workload preset or the CLI's --rate and
            # --conversations changed is in no file the user has (`kvplan simulate` of this mapping as YAML, --seed)
            "scenario": with_overrides(sc, overrides).model_dump(mode="json"),
            # a trace replays its own sessions: workload.conversations is not read
            "conversations": None if trace is not None else sc.workload.conversations,
            "trace": str(trace.path) if trace is not None else None,
            "figures": dict(SIMULATE_FIGURES), "steady_pinned_windows_s": windows}


def _judge_slo_longer(setup: _Setup, runner: _Runner, slo: dict[str, Any], final: dict[str, Any], rows: Rows,
                      warnings: list[str]) -> dict[str, Any]:
    """An SLO the recommendation meets is judged again on a longer run of the recommended configuration
    (``final``): :func:`kvplan.plan.steady.judging_conversations` conversations at the same rate, the same
    replication seeds, as ``capacity`` judges its answers (a load at capacity meets a TTFT SLO over a short run
    while its queue still grows). ``slo`` gains ``first_run_conversations``, ``first_run_ttft_p90_ms``,
    ``judged_conversations`` and ``expected_ttft_p90_ms`` becomes the longer run's; ``met`` is that run's verdict.
    A trace replay keeps its own clock and is judged as it runs (``judged_conversations`` null)."""
    if not slo or not slo["met"]:
        return slo
    if setup.sc.workload.trace is not None:
        return {**slo, "judged_conversations": None}
    first = setup.sc.workload.conversations
    n = judging_conversations(with_overrides(setup.sc, final), judging_span_s(rows))
    if n <= first:
        return {**slo, "first_run_conversations": first, "judged_conversations": first}
    long_rows = runner.run({"judge": {**final, "workload.conversations": n}})["judge"]
    done = [r for r in long_rows if r.get("error") is None]
    p90 = float(np.mean([float(r["ttft_p90_s"]) for r in done])) if done and len(done) == len(long_rows) else math.inf
    slo_s = slo["ttft_p90_ms"] / 1000
    out = {**slo, "first_run_conversations": first, "first_run_ttft_p90_ms": slo["expected_ttft_p90_ms"],
           "judged_conversations": n, "expected_ttft_p90_ms": p90 * 1000, "met": bool(p90 <= slo_s)}
    if not out["met"]:
        warnings.append(f"the TTFT p90 SLO of {slo['ttft_p90_ms']:g} ms is met over {first:,} conversations "
                        f"({slo['expected_ttft_p90_ms']:.0f} ms) but not over {n:,} at the same rate "
                        f"({human_s(p90)}): the queue still grows, this deployment is at capacity for the load "
                        "(`kvplan capacity` sizes one that holds)")
    return out


def _screen_disagreement(sc: Scenario, ttl: int, router: int, threshold: int, simulated_gib: float) -> list[str]:
    """The Little's-law screen of pinned KV against the simulated mean, when they differ by more than 20%."""
    if sc.workload.trace is not None:
        return []  # the screen reads the synthetic workload fields
    pred = float(screen_scenarios([_variant(sc, ttl, router, threshold)])["screen_pinned_kv_gib_mean"].iloc[0])
    if not (math.isfinite(pred) and simulated_gib > SCREEN_CHECK_MIN_GIB):
        return []
    if abs(pred - simulated_gib) / simulated_gib <= SCREEN_DISAGREEMENT_REL:
        return []
    return [f"pinned KV: Little's-law screen {pred:.1f} GiB vs simulated {simulated_gib:.1f} GiB (the simulator wins)"]


def _recommendation(setup: _Setup, thr: _Threshold, bidir: bool, ttl: int, router: int,
                    ms: tuple[dict[str, float], dict[str, float], dict[str, float]], hbm: dict[str, Any],
                    binding_txt: str, choice: TtlChoice, curve: list[TtlCandidate], slo: dict[str, Any],
                    warnings: list[str], disagreements: list[str], extra: dict[str, Any]) -> Recommendation:
    exp_m, def_m, off_m = ms
    be, threshold = thr.be or setup.be, thr.tokens
    dep = setup.sc.deployment
    # the deployable config carries the cross-layer flag when the scenario sets it or the trial adopted it (the
    # rationale tells the operator to enable it, and the expected figures are the runs with it)
    cross_layer = dep.cross_layer_blocks or bool(extra.get("transfer", {}).get("adopted"))
    cfg = kv_transfer_config(bidir, ttl, threshold, "recompute", cross_layer,
                             nixl_backend(setup.rs.node.link, dep.kv_transport))

    def shown(m: dict[str, float]) -> dict[str, float]:
        return {k: v for k, v in m.items() if not k.startswith(("kv_pull", "d_queue", "p2d_transfer"))}

    return Recommendation(
        bidirectional=bidir, decoder_kv_blocks_ttl_s=ttl, kv_recompute_threshold_tokens=int(threshold),
        router_ttl_s=router, kv_load_failure_policy="recompute", kv_transfer_config={"prefill": cfg, "decode": cfg},
        router={"conversation_ttl_s": router, "send_conversation_id": True,
                "how": f"disagg_proxy_multiturn.py hard-codes a 450 s conversation TTL: set it to {router} s "
                       f"(it must stay below decoder_kv_blocks_ttl - {setup.margin:g} s - P's decision delay)"},
        expected=shown(exp_m), baseline=shown(def_m), bidirectional_off=shown(off_m), decode_hbm=hbm,
        binding_constraint=binding_txt, rationale=tuple(choice.rationale), retention_off=choice.retention_off,
        inconclusive=choice.inconclusive,
        warnings=tuple(warnings), ttl_curve=tuple(c.curve_row() for c in curve),
        threshold_check={"analytic_break_even_tokens": be.tokens, "verdict": be.verdict,
                         "local_prefix_tokens": be.local_prefix_tokens, "tail_tokens": be.tail_tokens,
                         "pull_s_at_break_even": be.pull_s, "recompute_s_at_break_even": be.recompute_s,
                         "simulated": thr.check_rows, "chosen_tokens": int(threshold),
                         "simulated_at": "the chosen TTL and router TTL" if bidir else
                         "the minimum TTL advised if bidirectional is kept on"},
        slo=slo, disagreements=tuple(disagreements), **extra,
    )


def _variant(sc: Scenario, ttl: float, router: float, threshold: int) -> Scenario:
    return with_overrides(sc, _on(ttl, router, threshold))
