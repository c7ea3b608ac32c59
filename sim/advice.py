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
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kvplan.errors import input_error
from kvplan.sim.breakeven import BreakEven, break_even
from kvplan.sim.engine import Resolved, resolve
from kvplan.sim.executor import run_tasks, t_quantile_975
from kvplan.sim.results import json_safe
from kvplan.sim.router import KV_AWARE_ROUTING
from kvplan.sim.scenario import ClosedLoopArrival, Scenario, load_scenario, scenario_from_dict
from kvplan.sim.screen import quantile_sample, screen_scenarios

log = logging.getLogger(__name__)

__all__ = ["BreakEven", "Recommendation", "break_even", "kv_transfer_config", "recommend"]

DEFAULT_TTL_GRID_S: tuple[float, ...] = (5, 10, 15, 30, 45, 60, 90, 120, 180, 240, 300, 480, 600, 900, 1200, 1800)
UNLIMITED_TTL_S = 1e7
UNBOUNDED_DECODE_KV_TOKENS = 10**12
BENEFIT_FRACTION = 0.95
MATERIAL_FRACTION = 0.01  # a TTFT change smaller than 1% of the baseline's mean is not worth acting on
VLLM_TTL_S = 480.0  # decoder_kv_blocks_ttl default (VLLM_BEHAVIOUR.md 1.1)
VLLM_THRESHOLD = 64  # kv_recompute_threshold default with bidirectional on
PROXY_ROUTER_TTL_S = 450.0  # disagg_proxy_multiturn.py hard-coded conversation TTL
GIB = 1024**3
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
    "Every recommended configuration uses kv_load_failure_policy 'recompute' (VLLM_BEHAVIOUR.md 1.5: with 'fail' a "
    "declined read errors the request).",
)


@dataclass(frozen=True)
class Recommendation:
    """The advice: settings, deployable config, expected metrics vs baselines, constraint and rationale.

    ``to_json()`` gives at least ``decoder_kv_blocks_ttl_s``, ``kv_recompute_threshold_tokens``,
    ``router_ttl_s``, ``kv_transfer_config`` (``prefill`` and ``decode``), ``expected`` (metrics at the
    recommendation, each with a ``<metric>_ci95`` half-width) and ``baseline`` (vLLM defaults), plus
    ``bidirectional_off``, ``decode_hbm``, ``binding_constraint``, ``rationale``, ``rules``, ``assumptions``,
    ``warnings``, ``ttl_curve``, ``threshold_check``, ``slo`` and ``disagreements``.
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

    def to_dict(self) -> dict[str, Any]:
        """Plain-data form (lists for tuples; NaN kept as float)."""
        return asdict(self)

    def to_json(self) -> str:
        """JSON text (sorted keys, NaN/inf written as null)."""

        return json.dumps(json_safe(self.to_dict()), indent=2, sort_keys=True)


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


def _as_scenario(scenario: Scenario | dict[str, Any] | str | Path) -> Scenario:
    if isinstance(scenario, Scenario):
        return scenario
    if isinstance(scenario, dict):
        return scenario_from_dict(scenario)
    return load_scenario(scenario)


def _mean_ci(x: Sequence[float]) -> tuple[float, float]:
    a = np.asarray([v for v in x if v is not None and not math.isnan(v)], dtype=float)
    if len(a) == 0:
        return math.nan, math.nan
    if len(a) == 1:
        return float(a[0]), math.nan
    return float(a.mean()), t_quantile_975(len(a)) * float(a.std(ddof=1)) / math.sqrt(len(a))


def _col(rows: list[dict[str, Any]], key: str) -> list[float]:
    return [float(r.get(key, math.nan)) if r.get("error") is None else math.nan for r in rows]


def _paired(a: list[dict[str, Any]], b: list[dict[str, Any]], key: str = "ttft_mean_s") -> tuple[float, float]:
    """Mean and CI half-width of ``a[key] - b[key]`` paired by replication (common random numbers)."""
    return _mean_ci([x - y for x, y in zip(_col(a, key), _col(b, key), strict=True)])


def _significant_gain(d: tuple[float, float], scale: float) -> bool:
    """``d`` = (mean, ci) of (baseline - candidate): positive beyond the CI and by more than 1% of ``scale``."""
    mean, ci = d
    if math.isnan(mean):
        return False
    return mean > MATERIAL_FRACTION * scale and (math.isnan(ci) or mean - ci > 0)


def _metrics(rows: list[dict[str, Any]], max_num_seqs: int, n_decode: int) -> dict[str, float]:
    out: dict[str, float] = {}
    for key, src in (
        ("ttft_mean_s", "ttft_mean_s"), ("ttft_p50_s", "ttft_p50_s"), ("ttft_p90_s", "ttft_p90_s"),
        ("ttft_p99_s", "ttft_p99_s"), ("hit_rate", "hit_rate"), ("errors", "errors"),
        ("pinned_kv_gib_mean", "steady_pinned_kv_gib_mean"), ("pinned_kv_gib_peak", "pinned_kv_gib_peak"),
        ("prefill_utilization", "prefill_utilization"), ("kv_pull_mean_s", "kv_pull_mean_s"),
        ("d_queue_mean_s", "d_queue_mean_s"),
    ):
        out[key], out[f"{key}_ci95"] = _mean_ci(_col(rows, src))
    caps = []
    for r in rows:
        if r.get("error") is not None:
            continue
        per_node = r["decode_kv_capacity_tokens"]
        pinned_tok = r["steady_pinned_kv_gib_mean"] * GIB / r["kv_bytes_per_token_all_ranks"] / n_decode
        caps.append(min(max_num_seqs, max(per_node - pinned_tok, 0) / max(r["mean_request_kv_tokens"], 1.0)))
    out["decode_batch_capacity"], out["decode_batch_capacity_ci95"] = _mean_ci(caps)
    return out


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
    return local, int(round(user)) + 1


def _router_ttl(ttl: float, margin: float, allowance: float) -> int:
    return int(max(math.floor(ttl - margin - allowance), 0))


# --- recommend -------------------------------------------------------------------------------------------------


class _Runner:
    """Runs named variants (overrides) x replications in parallel and counts progress."""

    def __init__(self, base: Scenario, reps: int, total: int, progress: Callable[[int, int], None] | None,
                 backend: str, workers: int, ray_address: str | None) -> None:
        self.base, self.reps, self.total, self.progress = base, reps, total, progress
        self.backend, self.workers, self.ray_address = backend, workers, ray_address
        self.done = 0
        self.key = json.dumps(base.model_dump(mode="json"), sort_keys=True)

    def run(self, variants: dict[str, dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
        results: dict[str, list[dict[str, Any]]] = {name: [{}] * self.reps for name in variants}
        tasks = [((name, k), ov, self.base.seed + k) for name, ov in variants.items() for k in range(self.reps)]

        def on_result(key: Any, row: dict[str, Any]) -> None:
            name, k = key
            results[name] = [row if j == k else r for j, r in enumerate(results[name])]
            self.done += 1
            if self.progress:
                self.progress(self.done, self.total)

        run_tasks(self.base, self.key, tasks, on_result, self.backend, self.workers, self.ray_address)
        return results


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
    sc = _as_scenario(scenario)
    if not isinstance(replications, int) or replications < 1:
        raise input_error("replications", f"must be an integer >= 1, got {replications!r}")
    grid = sorted({float(t) for t in ttl_grid})
    if not grid or any((not math.isfinite(t)) or t <= 0 for t in grid):
        raise input_error("ttl_grid", "must be a non-empty list of positive TTLs in seconds")
    for name, v in (("--slo-ttft-p90-ms", slo_ttft_p90_ms), ("--decode-hbm-budget-gib", decode_hbm_budget_gib)):
        if v is not None and not (math.isfinite(v) and v > 0):
            raise input_error(name, f"must be a positive number, got {v!r}")
    rs = resolve(sc)
    pol = sc.policy
    margin = pol.expiry_safety_margin_s + max(pol.clock_skew_s, 0.0)
    local, tail = _follow_up_shape(sc)
    be = break_even(rs, local, tail)
    bs = rs.arch.block_size_tokens
    cands = {be.tokens, max(bs, round(be.tokens / 2 / bs) * bs), round(2 * be.tokens / bs) * bs, VLLM_THRESHOLD}
    cands = {int(c) for c in cands if 0 < c <= rs.arch.max_model_len + 1}
    total = replications * (2 + len(cands) + len(grid) + 1)
    runner = _Runner(sc, replications, total, progress, backend, workers, ray_address)
    on = {"policy.bidirectional": True, "policy.kv_load_failure_policy": "recompute"}
    # stage 1: the baselines (they also give the P decision delay the router TTL must leave room for)
    base_rows = runner.run({
        "off": {"policy.bidirectional": False},
        "defaults": {"policy.bidirectional": True, "policy.decoder_kv_blocks_ttl_s": VLLM_TTL_S,
                     "policy.kv_recompute_threshold_tokens": VLLM_THRESHOLD,
                     "policy.router_ttl_s": PROXY_ROUTER_TTL_S, "policy.kv_load_failure_policy": "fail"},
    })
    off, defaults = base_rows["off"], base_rows["defaults"]
    allowance = max(1.0, math.ceil(max(_col(defaults, "p_decide_p99_s") + [0.0])))
    ttl0 = pol.decoder_kv_blocks_ttl_s if pol.decoder_kv_blocks_ttl_s > margin + allowance else VLLM_TTL_S
    # stage 2: the threshold check at the scenario's TTL
    thr_var = {
        f"thr{c}": {**on, "policy.decoder_kv_blocks_ttl_s": ttl0,
                    "policy.router_ttl_s": _router_ttl(ttl0, margin, allowance), "policy.kv_recompute_threshold_tokens": c}
        for c in sorted(cands)
    }
    thr_rows = runner.run(thr_var)
    ref = thr_rows[f"thr{be.tokens}"]
    ref_mean = _mean_ci(_col(ref, "ttft_mean_s"))[0]
    threshold, disagreements = be.tokens, []
    check_rows = []
    best_gain = 0.0
    for name, rows in sorted(thr_rows.items(), key=lambda kv: int(kv[0][3:])):
        c = int(name[3:])
        gain = _paired(ref, rows)  # positive: c is faster than n*
        check_rows.append({"threshold_tokens": c, "ttft_mean_s": _mean_ci(_col(rows, "ttft_mean_s"))[0],
                           "gain_vs_break_even_s": gain[0], "gain_ci95": gain[1]})
        if c != be.tokens and _significant_gain(gain, ref_mean) and gain[0] > best_gain:
            best_gain, threshold = gain[0], c
    if threshold != be.tokens:
        disagreements.append(
            f"threshold: simulation at the target load favours {threshold} tokens over the analytic break-even "
            f"{be.tokens} (mean TTFT {best_gain * 1000:.1f} ms lower); the simulator wins")
    # stage 3: TTL sweep at the chosen threshold, plus an unlimited TTL (memory unbounded)
    ttl_var = {f"ttl{t:g}": {**on, "policy.decoder_kv_blocks_ttl_s": t, "policy.kv_recompute_threshold_tokens": threshold,
                             "policy.router_ttl_s": _router_ttl(t, margin, allowance)} for t in grid}
    ttl_var["unlimited"] = {**on, "policy.decoder_kv_blocks_ttl_s": UNLIMITED_TTL_S, "policy.router_ttl_s": UNLIMITED_TTL_S,
                            "policy.kv_recompute_threshold_tokens": threshold,
                            "deployment.decode_kv_capacity_tokens": UNBOUNDED_DECODE_KV_TOKENS}
    ttl_rows = runner.run(ttl_var)
    rec = _decide(sc, rs, grid, off, defaults, ttl_rows, threshold, be, check_rows, disagreements, margin, allowance,
                  slo_ttft_p90_ms, decode_hbm_budget_gib)
    if not policies or sc.deployment.mode == "aggregated":
        return rec
    from dataclasses import replace

    from kvplan.sim.compare import BEST_CANDIDATES, best_policy, compare, recommendation_overrides

    rows = compare(sc, list(BEST_CANDIDATES), replications=replications, workers=workers,
                   recommended=recommendation_overrides(rec))
    return replace(rec, best_policy=best_policy(rows, slo_ttft_p90_ms, decode_hbm_budget_gib))


def _decide(sc: Scenario, rs: Resolved, grid: list[float], off: list[dict[str, Any]], defaults: list[dict[str, Any]],
            ttl_rows: dict[str, list[dict[str, Any]]], threshold: int, be: BreakEven, check_rows: list[dict[str, Any]],
            disagreements: list[str], margin: float, allowance: float, slo_ms: float | None,
            budget: float | None) -> Recommendation:
    dep = sc.deployment
    m = lambda rows: _metrics(rows, dep.max_num_seqs, dep.decode_nodes)  # noqa: E731
    off_m, def_m = m(off), m(defaults)
    off_mean = off_m["ttft_mean_s"]
    inf_gain = _paired(off, ttl_rows["unlimited"])
    warnings: list[str] = []
    curve: list[dict[str, Any]] = []
    for t in grid:
        rows = ttl_rows[f"ttl{t:g}"]
        mt = m(rows)
        gain = _paired(off, rows)
        curve.append({
            "ttl_s": t, "router_ttl_s": _router_ttl(t, margin, allowance), "ttft_mean_s": mt["ttft_mean_s"],
            "ttft_p90_s": mt["ttft_p90_s"], "hit_rate": mt["hit_rate"], "benefit_s": gain[0], "benefit_ci95": gain[1],
            "benefit_fraction": gain[0] / inf_gain[0] if inf_gain[0] > 0 else math.nan,
            "pinned_kv_gib_mean": mt["pinned_kv_gib_mean"], "pinned_kv_gib_peak": mt["pinned_kv_gib_peak"],
            "feasible": budget is None or mt["pinned_kv_gib_peak"] <= budget,
            "significant": _significant_gain(gain, off_mean),
            "metrics": mt,
        })
    feas = [c for c in curve if c["feasible"]]
    gaps = quantile_sample(sc.workload.turn_gap_s)
    p10, p50, p90 = (float(np.percentile(gaps, q)) for q in (10, 50, 90))
    gap_txt = f"turn gaps p10 {p10:.3g} s, p50 {p50:.3g} s, p90 {p90:.3g} s"
    rationale: list[str] = []
    retention_off = False
    rec: dict[str, Any] | None = None
    binding = "turn-gap distribution"
    if not _significant_gain(inf_gain, off_mean):
        retention_off = True
        rationale.append(
            f"Even unlimited retention does not lower mean TTFT materially (gain {inf_gain[0] * 1000:.1f} ms vs "
            f"{off_mean * 1000:.1f} ms with bidirectional off): pulls are not faster than recomputing here, or turns "
            "rarely come back.")
    else:
        target = BENEFIT_FRACTION * inf_gain[0]
        reach = [c for c in feas if c["benefit_s"] >= target]
        if reach:
            rec = reach[0]
            rationale.append(
                f"TTL {rec['ttl_s']:g} s is the shortest reaching {rec['benefit_fraction']:.0%} of the unlimited-TTL "
                f"benefit ({rec['benefit_s'] * 1000:.1f} of {inf_gain[0] * 1000:.1f} ms mean TTFT); {gap_txt}.")
            if budget is not None and any(c["benefit_s"] >= target and not c["feasible"] for c in curve[: curve.index(rec)]):
                binding = "decode HBM"
        else:
            sig = [c for c in feas if c["significant"]]
            if not sig:
                retention_off = True
                top = max(curve, key=lambda c: c["ttl_s"])
                inf_hit = _mean_ci(_col(ttl_rows["unlimited"], "hit_rate"))[0]
                best_any = max(curve, key=lambda c: c["benefit_s"])
                if budget is not None and any(c["significant"] for c in curve):
                    why = f"no TTL that helps fits the {budget:g} GiB decode HBM budget"
                    binding = "decode HBM"
                elif top["hit_rate"] < 0.5 * inf_hit:
                    why = (f"{gap_txt}: they lie far beyond every TTL considered (up to {top['ttl_s']:g} s), so retained "
                           f"blocks expire unread (hit rate {top['hit_rate']:.1%} at {top['ttl_s']:g} s vs "
                           f"{inf_hit:.1%} unlimited) while pinning up to {top['pinned_kv_gib_peak']:.1f} GiB of decode "
                           "HBM; "
                           f"unlimited retention would gain {inf_gain[0] * 1000:.1f} ms only by holding KV for hours")
                else:
                    why = (f"retained blocks are read back (hit rate {top['hit_rate']:.1%} at {top['ttl_s']:g} s) but no "
                           f"finite TTL lowers mean TTFT significantly (best {best_any['benefit_s'] * 1000:+.1f} ms at "
                           f"{best_any['ttl_s']:g} s): the pulls are little faster than recomputing what P's prefix cache "
                           f"lacks (local prefix ~{be.local_prefix_tokens} tokens), and the pinned KV (up to "
                           f"{top['pinned_kv_gib_peak']:.1f} GiB) shrinks the decode batch; the unlimited-TTL gain of "
                           f"{inf_gain[0] * 1000:.1f} ms needs unbounded decode memory")
                    binding = "decode HBM" if top["metrics"]["d_queue_mean_s"] > 0 else binding
                rationale.append(f"Turn retention down: {why}.")
            else:
                best = max(sig, key=lambda c: c["benefit_s"])
                rec = next(c for c in sig if c["benefit_s"] >= BENEFIT_FRACTION * best["benefit_s"])
                limited_by_hbm = budget is not None and any(
                    not c["feasible"] and c["benefit_s"] > best["benefit_s"] for c in curve)
                binding = "decode HBM" if limited_by_hbm else "turn-gap distribution"
                rationale.append(
                    f"No TTL reaches 95% of the unlimited-TTL benefit ({inf_gain[0] * 1000:.1f} ms) "
                    + (f"within the {budget:g} GiB budget" if limited_by_hbm else f"in the grid ({gap_txt})")
                    + f"; TTL {rec['ttl_s']:g} s reaches 95% of the best attainable ({best['benefit_s'] * 1000:.1f} ms).")
    slo: dict[str, Any] = {}
    if slo_ms is not None:
        slo_s = slo_ms / 1000
        cur = rec["metrics"]["ttft_p90_s"] if rec is not None else off_m["ttft_p90_s"]
        if cur > slo_s:
            better = [c for c in feas if c["ttft_p90_s"] <= slo_s and (rec is None or c["ttl_s"] > rec["ttl_s"])]
            if better:
                rec, retention_off = better[0], False
                rationale.append(f"TTL raised to {rec['ttl_s']:g} s, the shortest meeting the TTFT p90 SLO "
                                 f"of {slo_ms:g} ms.")
        met_p90 = rec["metrics"]["ttft_p90_s"] if rec is not None else off_m["ttft_p90_s"]
        slo = {"ttft_p90_ms": slo_ms, "met": bool(met_p90 <= slo_s), "expected_ttft_p90_ms": met_p90 * 1000}
        if not slo["met"]:
            warnings.append(f"the TTFT p90 SLO of {slo_ms:g} ms is not met at any TTL ({met_p90 * 1000:.0f} ms expected)")
    exp_m = rec["metrics"] if rec is not None else off_m
    # binding constraint at the recommendation
    if binding != "decode HBM":
        if exp_m["d_queue_mean_s"] > 0.05 * exp_m["ttft_mean_s"]:
            binding = "decode HBM"
        elif exp_m["prefill_utilization"] >= 0.8 or (slo and not slo["met"] and exp_m["kv_pull_mean_s"]
                                                       <= 0.5 * exp_m["ttft_mean_s"]):
            binding = "prefill compute"  # saturated P, or an SLO no TTL can meet: the P leg of misses dominates
        elif rec is not None and exp_m["kv_pull_mean_s"] > 0.5 * exp_m["ttft_mean_s"]:
            binding = "link"
    binding_txt = {
        "turn-gap distribution": f"turn-gap distribution ({gap_txt}; longer TTLs add < 5% of the benefit)",
        "decode HBM": "decode HBM (pinned KV against the budget / the decode KV pool)",
        "prefill compute": f"prefill compute (P busy {exp_m['prefill_utilization']:.0%}; the prefill of first turns "
                           "and misses sets the TTFT tail)",
        "link": f"link (pulls take {exp_m['kv_pull_mean_s'] * 1000:.0f} ms of a {exp_m['ttft_mean_s'] * 1000:.0f} ms TTFT)",
    }[binding]
    ttl = int(rec["ttl_s"]) if rec is not None else int(grid[0])
    router = _router_ttl(ttl, margin, allowance)
    bidir = not retention_off
    if retention_off:
        rationale.append(f"Recommended: bidirectional_kv_xfer off; if you keep it on, use the minimum TTL {ttl} s "
                         "to bound the pinned decode HBM.")
    rationale.append(f"Threshold {threshold} tokens: analytic break-even {be.tokens} ({be.verdict}; pull "
                     f"{be.pull_s * 1000:.1f} ms vs recompute {be.recompute_s * 1000:.1f} ms at n*, local prefix "
                     f"{be.local_prefix_tokens}, tail {be.tail_tokens}).")
    rationale.append(f"Router TTL {router} s = floor({ttl} - {margin:g} s margin - {allowance:g} s P-decision allowance).")
    if rs.profile.extrapolated:
        warnings.append("EXTRAPOLATED profile: costs scaled from another model's calibration")
    arr = sc.workload.arrival
    if not isinstance(arr, ClosedLoopArrival):
        horizon = sc.workload.conversations / arr.rate_per_s
        if horizon < 2 * (ttl + 1):
            warnings.append(f"only {horizon:.0f} s of arrivals: pinned-KV means at TTLs above {horizon / 2:.0f} s "
                            "are not steady")
    pred = math.nan
    if rec is not None:
        pred = float(screen_scenarios([_variant(sc, ttl, router, threshold)])["screen_pinned_kv_gib_mean"].iloc[0])
    if rec is not None and math.isfinite(pred) and exp_m["pinned_kv_gib_mean"] > 0.5:
        rel = abs(pred - exp_m["pinned_kv_gib_mean"]) / exp_m["pinned_kv_gib_mean"]
        if rel > 0.2:
            disagreements.append(f"pinned KV: Little's-law screen {pred:.1f} GiB vs simulated "
                                 f"{exp_m['pinned_kv_gib_mean']:.1f} GiB "
                                 "(the simulator wins)")
    cap_gib = float(off[0].get("decode_kv_capacity_gib", math.nan)) if off and off[0].get("error") is None else math.nan
    hbm = {
        "pinned_kv_gib_mean": exp_m["pinned_kv_gib_mean"] if bidir else 0.0,
        "pinned_kv_gib_peak": exp_m["pinned_kv_gib_peak"] if bidir else 0.0,
        "decode_kv_capacity_gib": cap_gib,
        "budget_gib": budget,
        "decode_batch_capacity_without_retention": off_m["decode_batch_capacity"],
        "decode_batch_capacity_at_recommendation": exp_m["decode_batch_capacity"],
        "decode_batch_capacity_at_vllm_defaults": def_m["decode_batch_capacity"],
    }
    cfg = kv_transfer_config(bidir, ttl, threshold, "recompute")
    return Recommendation(
        bidirectional=bidir,
        decoder_kv_blocks_ttl_s=ttl,
        kv_recompute_threshold_tokens=int(threshold),
        router_ttl_s=router,
        kv_load_failure_policy="recompute",
        kv_transfer_config={"prefill": cfg, "decode": cfg},
        router={"conversation_ttl_s": router, "send_conversation_id": True,
                "how": f"disagg_proxy_multiturn.py hard-codes a 450 s conversation TTL: set it to {router} s "
                       "(it must stay below decoder_kv_blocks_ttl - 5 s)"},
        expected={k: v for k, v in exp_m.items() if not k.startswith(("kv_pull", "d_queue"))},
        baseline={k: v for k, v in def_m.items() if not k.startswith(("kv_pull", "d_queue"))},
        bidirectional_off={k: v for k, v in off_m.items() if not k.startswith(("kv_pull", "d_queue"))},
        decode_hbm=hbm,
        binding_constraint=binding_txt,
        rationale=tuple(rationale),
        retention_off=retention_off,
        warnings=tuple(warnings),
        ttl_curve=tuple({k: v for k, v in c.items() if k != "metrics"} for c in curve),
        threshold_check={"analytic_break_even_tokens": be.tokens, "verdict": be.verdict,
                         "local_prefix_tokens": be.local_prefix_tokens, "tail_tokens": be.tail_tokens,
                         "pull_s_at_break_even": be.pull_s, "recompute_s_at_break_even": be.recompute_s,
                         "simulated": check_rows, "chosen_tokens": int(threshold)},
        slo=slo,
        disagreements=tuple(disagreements),
    )


def _variant(sc: Scenario, ttl: float, router: float, threshold: int) -> Scenario:
    from kvplan.sim.scenario import with_overrides

    return with_overrides(sc, {"policy.bidirectional": True, "policy.decoder_kv_blocks_ttl_s": ttl,
                               "policy.router_ttl_s": router, "policy.kv_recompute_threshold_tokens": threshold,
                               "policy.kv_load_failure_policy": "recompute"})
