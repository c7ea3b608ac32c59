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
* **Router TTL**: ``floor(TTL - safety margin - clock skew - allowance)``, allowance = p99 of arrival ->
  P's connector decision (>= 1 s), so that the router's entry expires before P would decline the read
  (the reference proxy uses 450 s under 480 s).

Every simulated configuration uses ``kv_load_failure_policy='recompute'`` (a declined read falls back to
prefill instead of failing the request), except the vLLM-defaults baseline (``fail``, 480 s, 64, 450 s).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from kvplan.errors import input_error
from kvplan.sim.advice_rules import (
    Evidence,
    Rows,
    TtlCandidate,
    TtlChoice,
    apply_slo,
    binding_constraint,
    binding_text,
    choose_ttl,
    col,
    gap_text,
    mean_ci,
    metrics,
    paired,
    router_ttl,
    significant_gain,
    threshold_rationale,
    ttl_curve,
)
from kvplan.sim.breakeven import BreakEven, break_even
from kvplan.sim.engine import Resolved, resolve
from kvplan.sim.executor import run_tasks
from kvplan.sim.history import follow_up_tail_tokens, history_assumption
from kvplan.sim.results import json_safe
from kvplan.sim.router import KV_AWARE_ROUTING
from kvplan.sim.scenario import ClosedLoopArrival, Scenario, as_scenario, with_overrides
from kvplan.sim.screen import quantile_sample, screen_scenarios
from kvplan.sim.seeds import replication_seeds

log = logging.getLogger(__name__)

__all__ = ["BreakEven", "Recommendation", "break_even", "kv_transfer_config", "recommend"]

DEFAULT_TTL_GRID_S: tuple[float, ...] = (5, 10, 15, 30, 45, 60, 90, 120, 180, 240, 300, 480, 600, 900, 1200, 1800)
UNLIMITED_TTL_S = 1e7
UNBOUNDED_DECODE_KV_TOKENS = 10**12
#: Arrivals must span this many TTLs for the pinned-KV mean at a TTL to be steady (else a warning).
STEADY_HORIZON_TTLS = 2
#: The Little's-law screen is compared with the simulated pinned KV only above this mean (GiB) ...
SCREEN_CHECK_MIN_GIB = 0.5
#: ... and reported as a disagreement beyond this relative difference.
SCREEN_DISAGREEMENT_REL = 0.2
VLLM_TTL_S = 480.0  # decoder_kv_blocks_ttl default (VLLM_BEHAVIOUR.md 1.1)
VLLM_THRESHOLD = 64  # kv_recompute_threshold default with bidirectional on
#: Prefix of the advice that applies only if bidirectional_kv_xfer is kept on against a retention-off advice.
IF_KEPT_ON = "Only if you keep bidirectional_kv_xfer on (not recommended): "
PROXY_ROUTER_TTL_S = 450.0  # disagg_proxy_multiturn.py hard-coded conversation TTL
REPORTED = ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "hit_rate", "errors", "pinned_kv_gib_mean",
            "pinned_kv_gib_peak", "prefill_utilization", "decode_batch_capacity")
RULES = (
    "TTL rule: the shortest TTL in the grid whose mean-TTFT benefit over bidirectional off reaches 95% of the "
    "benefit of an unlimited TTL (memory not counted), among TTLs whose peak pinned decode KV fits the HBM budget.",
    "Threshold rule: the analytic break-even pull size n* where pulling (transfer_time_s incl. descriptors, idle "
    "link) stops beating recomputing (prefill_time_s of those tokens on top of the local prefix, minus the tail "
    "computed anyway); checked by simulation at the target load against n*/2, 2n* and 64 (the simulator wins).",
    "Router rule: router TTL = floor(D TTL - 5 s safety margin - clock skew - p99 of arrival->P decision, >= 1 s), "
    "so a router hit is never declined by P (PR #47021).",
)
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
    ``warnings``, ``ttl_curve``, ``threshold_check``, ``slo`` and ``disagreements``, and ``inputs`` (what it
    was computed from, :func:`recommendation_inputs`: a recommendation is reused only for the same inputs).
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
    rules: tuple[str, ...] = RULES
    assumptions: tuple[str, ...] = ASSUMPTIONS
    warnings: tuple[str, ...] = ()
    ttl_curve: tuple[dict[str, Any], ...] = ()
    threshold_check: dict[str, Any] = field(default_factory=dict)
    slo: dict[str, Any] = field(default_factory=dict)
    disagreements: tuple[str, ...] = ()
    best_policy: dict[str, Any] = field(default_factory=dict)  # kvplan compare's best alternative (sim/compare.py)
    inputs: dict[str, Any] = field(default_factory=dict)  # recommendation_inputs() of the call

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


def kv_transfer_config(bidirectional: bool, ttl_s: int, threshold: int, failure_policy: str) -> dict[str, Any]:
    """The ``--kv-transfer-config`` JSON for one server (identical on P and D, VLLM_BEHAVIOUR.md 1.1)."""
    extra: dict[str, Any] = {"bidirectional_kv_xfer": bidirectional, "backends": ["LIBFABRIC"]}
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


def _follow_up_shape(sc: Scenario) -> tuple[int, int]:
    """(mean local prefix on P, tail tokens) of a follow-up turn, for the break-even."""
    wl, dep = sc.workload, sc.deployment
    t = np.maximum(1, np.rint(quantile_sample(wl.turns)))
    et, et2 = t.mean(), (t * t).mean()
    prefix = float(np.maximum(0, np.rint(quantile_sample(wl.prefix_tokens))).mean())
    user = float(np.maximum(0, np.rint(quantile_sample(wl.user_tokens))).mean())
    out = float(np.maximum(1, np.rint(quantile_sample(wl.output_tokens))).mean())
    km1 = (et2 - et) / 2 / (et - 1) if et > 1 else 1.0
    prev_prompt = prefix + user * km1 + out * (km1 - 1)
    same_p = dep.prefill_nodes == 1 or dep.routing in KV_AWARE_ROUTING
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
                 backend: str, workers: int, ray_address: str | None) -> None:
        self.base, self.reps, self.total, self.progress = base, reps, total, progress
        self.backend, self.workers, self.ray_address = backend, workers, ray_address
        self.done = 0
        self.key = json.dumps(base.model_dump(mode="json"), sort_keys=True)
        self.seeds = replication_seeds(base.seed, reps)

    def run(self, variants: Mapping[K, dict[str, Any]]) -> dict[K, Rows]:
        """Rows of every variant, one per replication (replication ``k`` has the same seed in every variant)."""
        results: dict[K, Rows] = {name: [{}] * self.reps for name in variants}
        tasks = [((name, k), ov, self.seeds[k]) for name, ov in variants.items() for k in range(self.reps)]

        def on_result(key: Any, row: dict[str, Any]) -> None:
            name, k = key
            results[name] = [row if j == k else r for j, r in enumerate(results[name])]
            self.done += 1
            if self.progress:
                self.progress(self.done, self.total)

        run_tasks(self.base, self.key, tasks, on_result, self.backend, self.workers, self.ray_address)
        return results


@dataclass(frozen=True)
class _Setup:
    """The validated inputs of :func:`recommend` and what follows from them before any simulation."""

    sc: Scenario
    rs: Resolved
    grid: list[float]
    be: BreakEven
    candidates: list[int]
    margin: float
    slo_ms: float | None
    budget: float | None


@dataclass
class _Stages:
    """The simulated rows of the three stages and the threshold they settle on."""

    off: Rows
    defaults: Rows
    allowance: float
    threshold: int
    check_rows: list[dict[str, Any]]
    disagreements: list[str]
    ttl_rows: dict[float, Rows]


def recommend(
    scenario: Scenario | dict[str, Any] | str | Path,
    slo_ttft_p90_ms: float | None = None,
    decode_hbm_budget_gib: float | None = None,
    replications: int = 3,
    ttl_grid: Sequence[float] = DEFAULT_TTL_GRID_S,
    progress: Callable[[int, int], None] | None = None,
    workers: int = 1,
    backend: str = "local",
    ray_address: str | None = None,
    policies: bool = False,
) -> Recommendation:
    """Recommend ``decoder_kv_blocks_ttl``, ``kv_recompute_threshold`` and the router TTL for ``scenario``.

    With ``policies``, the alternatives of :mod:`kvplan.sim.compare` (retention off, the recommended TTL,
    lease, evictable pins, offload, aggregated serving) are simulated at the same load and seeds and the
    best is named in ``best_policy`` (:data:`kvplan.sim.compare.BEST_RULE`).

    Simulates (``replications`` seeds each, common random numbers): bidirectional off, vLLM's defaults,
    the threshold candidates, every TTL of ``ttl_grid`` and an unlimited TTL; applies :data:`RULES`;
    ``slo_ttft_p90_ms`` (optional) moves the TTL up when a longer one meets it; ``decode_hbm_budget_gib``
    (optional) caps the peak pinned decode KV. ``progress(done, total)`` is called per finished run.
    """
    setup = _setup(as_scenario(scenario), slo_ttft_p90_ms, decode_hbm_budget_gib, replications, ttl_grid)
    total = replications * (2 + len(setup.candidates) + len(setup.grid) + 1)
    runner = _Runner(setup.sc, replications, total, progress, backend, workers, ray_address)
    from dataclasses import replace

    rec = replace(_decide(setup, _simulate_stages(setup, runner)),
                  inputs=recommendation_inputs(setup.sc, replications, ttl_grid, slo_ttft_p90_ms, decode_hbm_budget_gib))
    rec = replace(rec, assumptions=(*rec.assumptions, history_assumption(setup.sc.workload)))
    if not policies or setup.sc.deployment.mode == "aggregated":
        return rec
    from kvplan.sim.compare import BEST_CANDIDATES, best_policy, compare, recommendation_overrides

    rows = compare(setup.sc, list(BEST_CANDIDATES), replications=replications, workers=workers,
                   recommended=recommendation_overrides(rec))
    return replace(rec, best_policy=best_policy(rows, slo_ttft_p90_ms, decode_hbm_budget_gib))


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
    rs = resolve(sc)
    pol = sc.policy
    be = break_even(rs, *_follow_up_shape(sc))
    bs = rs.arch.block_size_tokens
    cands = {be.tokens, max(bs, round(be.tokens / 2 / bs) * bs), round(2 * be.tokens / bs) * bs, VLLM_THRESHOLD}
    candidates = sorted(int(c) for c in cands if 0 < c <= rs.arch.max_model_len + 1)
    margin = pol.expiry_safety_margin_s + max(pol.clock_skew_s, 0.0)
    return _Setup(sc, rs, grid, be, candidates, margin, slo_ms, budget)


def _simulate_stages(setup: _Setup, runner: _Runner) -> _Stages:
    on = {"policy.bidirectional": True, "policy.kv_load_failure_policy": "recompute"}
    # stage 1: the baselines (they also give the P decision delay the router TTL must leave room for)
    base_rows = runner.run({
        Baseline.OFF: {"policy.bidirectional": False},
        Baseline.VLLM_DEFAULTS: {"policy.bidirectional": True, "policy.decoder_kv_blocks_ttl_s": VLLM_TTL_S,
                                 "policy.kv_recompute_threshold_tokens": VLLM_THRESHOLD,
                                 "policy.router_ttl_s": PROXY_ROUTER_TTL_S, "policy.kv_load_failure_policy": "fail"},
    })
    defaults = base_rows[Baseline.VLLM_DEFAULTS]
    allowance = max(1.0, math.ceil(max(col(defaults, "p_decide_p99_s") + [0.0])))
    margin, pol = setup.margin, setup.sc.policy
    ttl0 = pol.decoder_kv_blocks_ttl_s if pol.decoder_kv_blocks_ttl_s > margin + allowance else VLLM_TTL_S
    # stage 2: the threshold check at the scenario's TTL
    thr_rows = runner.run({c: {**on, "policy.decoder_kv_blocks_ttl_s": ttl0, "policy.kv_recompute_threshold_tokens": c,
                               "policy.router_ttl_s": router_ttl(ttl0, margin, allowance)} for c in setup.candidates})
    threshold, check_rows, disagreements = _check_threshold(setup.be, thr_rows)
    # stage 3: TTL sweep at the chosen threshold, plus an unlimited TTL (memory unbounded)
    ttl_var = {t: {**on, "policy.decoder_kv_blocks_ttl_s": t, "policy.kv_recompute_threshold_tokens": threshold,
                   "policy.router_ttl_s": router_ttl(t, margin, allowance)} for t in setup.grid}
    ttl_var[UNLIMITED] = {**on, "policy.decoder_kv_blocks_ttl_s": UNLIMITED_TTL_S, "policy.router_ttl_s": UNLIMITED_TTL_S,
                          "policy.kv_recompute_threshold_tokens": threshold,
                          "deployment.decode_kv_capacity_tokens": UNBOUNDED_DECODE_KV_TOKENS}
    return _Stages(base_rows[Baseline.OFF], defaults, allowance, threshold, check_rows, disagreements,
                   runner.run(ttl_var))


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


def _decide(setup: _Setup, st: _Stages) -> Recommendation:
    sc, dep = setup.sc, setup.sc.deployment

    def m(rows: Rows) -> dict[str, float]:
        return metrics(rows, dep.max_num_seqs, dep.decode_nodes)

    off_m, def_m = m(st.off), m(st.defaults)
    unlimited = paired(st.off, st.ttl_rows[UNLIMITED])
    curve = ttl_curve(setup.grid, st.ttl_rows, st.off, unlimited, off_m["ttft_mean_s"], m, setup.budget,
                      setup.margin, st.allowance)
    gaps = gap_text(quantile_sample(sc.workload.turn_gap_s))
    choice = choose_ttl(Evidence(curve, off_m["ttft_mean_s"], unlimited,
                                 mean_ci(col(st.ttl_rows[UNLIMITED], "hit_rate"))[0], setup.budget, gaps,
                                 setup.be.local_prefix_tokens))
    warnings: list[str] = []
    slo = apply_slo(choice, curve, off_m, setup.slo_ms, warnings)
    rec = choice.chosen
    exp_m = rec.metrics if rec is not None else off_m
    binding = binding_constraint(choice.binding, exp_m, slo, rec is not None)
    ttl = int(rec.ttl_s) if rec is not None else int(setup.grid[0])
    router = router_ttl(ttl, setup.margin, st.allowance)
    bidir = not choice.retention_off
    rationale = choice.rationale
    # with retention off the threshold and router TTL only matter if the operator keeps bidirectional on anyway
    kept_on = IF_KEPT_ON if choice.retention_off else ""
    if choice.retention_off:
        rationale.append(f"Recommended: bidirectional_kv_xfer off; if you keep it on, use the minimum TTL {ttl} s "
                         "to bound the pinned decode HBM.")
    rationale.append(kept_on + threshold_rationale(st.threshold, setup.be))
    rationale.append(f"{kept_on}Router TTL {router} s = floor({ttl} - {setup.margin:g} s margin - {st.allowance:g} s "
                     "P-decision allowance).")
    warnings.extend(_run_warnings(setup, ttl))
    if rec is not None:
        st.disagreements.extend(_screen_disagreement(sc, ttl, router, st.threshold, exp_m["pinned_kv_gib_mean"]))
    off0 = st.off[0] if st.off and st.off[0].get("error") is None else {}
    hbm = {
        "pinned_kv_gib_mean": exp_m["pinned_kv_gib_mean"] if bidir else 0.0,
        "pinned_kv_gib_peak": exp_m["pinned_kv_gib_peak"] if bidir else 0.0,
        "decode_kv_capacity_gib": float(off0.get("decode_kv_capacity_gib", math.nan)),
        "budget_gib": setup.budget,
        "decode_batch_capacity_without_retention": off_m["decode_batch_capacity"],
        "decode_batch_capacity_at_recommendation": exp_m["decode_batch_capacity"],
        "decode_batch_capacity_at_vllm_defaults": def_m["decode_batch_capacity"],
    }
    return _recommendation(setup, st, bidir, ttl, router, (exp_m, def_m, off_m), hbm, binding_text(binding, exp_m, gaps),
                           choice, curve, slo, warnings)


def _run_warnings(setup: _Setup, ttl: int) -> list[str]:
    """An extrapolated profile, and a run too short for steady pinned-KV means at ``ttl``."""
    out = []
    if setup.rs.profile.extrapolated:
        out.append("profile not calibrated on this deployment: " + setup.rs.profile.status_line())
    arr, wl = setup.sc.workload.arrival, setup.sc.workload
    if not isinstance(arr, ClosedLoopArrival):
        horizon = wl.conversations / arr.rate_per_s
        if horizon < STEADY_HORIZON_TTLS * (ttl + 1):
            out.append(f"only {horizon:.0f} s of arrivals: pinned-KV means at TTLs above {horizon / 2:.0f} s are not steady")
    return out


def _screen_disagreement(sc: Scenario, ttl: int, router: int, threshold: int, simulated_gib: float) -> list[str]:
    """The Little's-law screen of pinned KV against the simulated mean, when they differ by more than 20%."""
    pred = float(screen_scenarios([_variant(sc, ttl, router, threshold)])["screen_pinned_kv_gib_mean"].iloc[0])
    if not (math.isfinite(pred) and simulated_gib > SCREEN_CHECK_MIN_GIB):
        return []
    if abs(pred - simulated_gib) / simulated_gib <= SCREEN_DISAGREEMENT_REL:
        return []
    return [f"pinned KV: Little's-law screen {pred:.1f} GiB vs simulated {simulated_gib:.1f} GiB (the simulator wins)"]


def _recommendation(setup: _Setup, st: _Stages, bidir: bool, ttl: int, router: int,
                    ms: tuple[dict[str, float], dict[str, float], dict[str, float]], hbm: dict[str, Any],
                    binding_txt: str, choice: TtlChoice, curve: list[TtlCandidate], slo: dict[str, Any],
                    warnings: list[str]) -> Recommendation:
    exp_m, def_m, off_m = ms
    be, threshold = setup.be, st.threshold
    cfg = kv_transfer_config(bidir, ttl, threshold, "recompute")

    def shown(m: dict[str, float]) -> dict[str, float]:
        return {k: v for k, v in m.items() if not k.startswith(("kv_pull", "d_queue"))}

    return Recommendation(
        bidirectional=bidir, decoder_kv_blocks_ttl_s=ttl, kv_recompute_threshold_tokens=int(threshold),
        router_ttl_s=router, kv_load_failure_policy="recompute", kv_transfer_config={"prefill": cfg, "decode": cfg},
        router={"conversation_ttl_s": router, "send_conversation_id": True,
                "how": f"disagg_proxy_multiturn.py hard-codes a 450 s conversation TTL: set it to {router} s "
                       "(it must stay below decoder_kv_blocks_ttl - 5 s)"},
        expected=shown(exp_m), baseline=shown(def_m), bidirectional_off=shown(off_m), decode_hbm=hbm,
        binding_constraint=binding_txt, rationale=tuple(choice.rationale), retention_off=choice.retention_off,
        warnings=tuple(warnings), ttl_curve=tuple(c.curve_row() for c in curve),
        threshold_check={"analytic_break_even_tokens": be.tokens, "verdict": be.verdict,
                         "local_prefix_tokens": be.local_prefix_tokens, "tail_tokens": be.tail_tokens,
                         "pull_s_at_break_even": be.pull_s, "recompute_s_at_break_even": be.recompute_s,
                         "simulated": st.check_rows, "chosen_tokens": int(threshold)},
        slo=slo, disagreements=tuple(st.disagreements),
    )


def _variant(sc: Scenario, ttl: float, router: float, threshold: int) -> Scenario:
    return with_overrides(sc, {"policy.bidirectional": True, "policy.decoder_kv_blocks_ttl_s": ttl,
                               "policy.router_ttl_s": router, "policy.kv_recompute_threshold_tokens": threshold,
                               "policy.kv_load_failure_policy": "recompute"})
