"""Simulation-based calibration against the published P5en measurements (the write-up's end points).

Only aggregates were published, so the profile is fitted by *simulating the published benchmark* and
matching its aggregates: for each prefix size, :func:`kvplan.sim.defaults.published_benchmark` (1P1D
p5en TP8, prefix caching off on P and on on D, 10 conversations of 5 user turns, 150-token user messages,
300-token responses, 2 clients, at most 10 active conversations, no think time) is run ON and OFF and
the published series are computed from the per-turn records as the write-up aggregated them
(:func:`series_from_turns`):

* ``ttft_on`` / ``ttft_off``: mean ``ttft_s`` over the measured requests of a prefix size (the
  multi-turn benchmark's stats JSON);
* ``prefill_on`` / ``prefill_off``: mean ``p_leg_s`` (the proxy's "Prefill done in", arrival to P done);
* ``kv_transfer_on``: mean ``d2p_xfer_s`` over the D->P pulls (NIXL xferDuration, per transfer event).

**Which requests are measured.** The multi-turn benchmark's ``--warmup-step`` sends the first turn of
every conversation as a warm-up and leaves it out of the statistics (``skip_first_turn`` in
``benchmark_serving_multi_turn.py``). With the first (cold, full-prefill) turn *included*, the GLM-5
points cannot all be reached by any parameter values of this model: a turn-1 prefill of 20k tokens alone
puts ``0.2 x T1 ~ 450 ms`` into a 20k mean that is published as 541 ms, leaving under 120 ms per
follow-up turn that must also contain the published 110 ms transfer plus a per-request overhead that the
OFF curve pins at ~150-190 ms (see :func:`first_turn_bound`; the best fit with every turn misses GLM-5's
prefill_on at 20k by +26 % and its TTFT ratio by +22 %). With the first turn excluded every point is
reachable. The shipped profiles therefore use ``skip_first_turn=True`` (turns 2..5 measured); the
alternative is kept as an option and reported.

**What the end points identify.** Ten numbers per model (two prefix sizes x five series) cannot pin the
fifteen cost parameters, so the fit is a maximum a-posteriori estimate: tolerance-scaled relative
residuals of the published points (noise sigma = half the acceptance tolerance: 3.5 % for TTFT, 7.5 %
for prefill durations and KV transfer) plus log-normal priors on parameters (:func:`published_priors`),
plus a penalty on any point leaving 75 % of its acceptance band (the published points are mutually
inconsistent by about that much, e.g. Qwen3-32B's TTFT ON at 2k is 6 ms *below* its prefill duration).
Parameters the data cannot move are fixed from hardware/physics and recorded in the profile's ``notes``;
for each fitted one the report compares the posterior and prior spreads (``identified`` when the data
shrink the spread by at least half).

**How.** Stage 1 fits a closed-form surrogate of the benchmark (:func:`surrogate_series`, smooth and
cheap); stage 2 refines on the simulation itself, in ``x = log(p / p_prior)`` with bounds
(deterministic, scale-free). The simulated aggregates are piecewise smooth (a request reaching D waits
for the decode step in progress, so TTFT moves in steps of one decode step), hence wide finite
differences and trust-region restarts. The inner loop uses :func:`series_fast` (the same simulation,
aggregates read directly from the event log; a test checks it equals :func:`series_from_turns` on
``run().turns``); the reported numbers go through ``run()``.

**Where.** :mod:`~kvplan.calibration.published_series` holds the points, the simulated series and the
surrogate; :mod:`~kvplan.calibration.published_priors` the priors; this module the fit (their names are
re-exported here, so ``from kvplan.calibration.published import ...`` keeps working).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from kvplan.calibration.published_data import PUBLISHED_SHA256, PUBLISHED_SOURCE
from kvplan.calibration.published_priors import (
    ATTENTION_SCALE,
    DECODE_STEP_OVERHEAD_S,
    GPU_SCALE_SIGMA,
    INFORMATIVE,
    LINEAR_SCALE,
    POLL_S,
    POST_FIXED_S,
    WEAK,
    ParamSpec,
    costs_from_values,
    first_turn_bound,
    gpu_scale_lower,
    published_priors,
)
from kvplan.calibration.published_series import (
    AT_BOUND_LOG,
    BENCH_OUTPUT_TOKENS,
    BENCH_TURNS,
    BENCH_USER_TOKENS,
    HARDWARE,
    IDENTIFIED_SHRINK,
    MODEL_BY_HF_ID,
    MS_PER_S,
    NIXL_VERSION,
    PREFIX_SIZES,
    RATIO_TOLERANCE,
    SERIES,
    SIGMA_PER_TOLERANCE,
    TENSOR_PARALLEL,
    TOLERANCE,
    VLLM_VERSION,
    Aggregation,
    _ratio_keys,
    _targets,
    benchmark_scenario,
    d_leg_rows,
    point_rows,
    published_points,
    ratio_row,
    series_fast,
    series_from_turns,
    simulate_series,
    surrogate_series,
)
from kvplan.errors import input_error
from kvplan.models.arch import ModelArch, get_model
from kvplan.models.costs import CostModel
from kvplan.models.hardware import get_hardware
from kvplan.models.profile import Profile
from kvplan.models.resolve import compute_prior

__all__ = [  # re-exported names of published_series and published_priors, and the fit
    "ATTENTION_SCALE", "AT_BOUND_LOG", "Aggregation", "DECODE_STEP_OVERHEAD_S", "GPU_SCALE_SIGMA",
    "BENCH_OUTPUT_TOKENS", "BENCH_TURNS", "BENCH_USER_TOKENS", "HARDWARE", "LINEAR_SCALE",
    "IDENTIFIED_SHRINK", "INFORMATIVE", "MODEL_BY_HF_ID", "MS_PER_S", "NIXL_VERSION",
    "POLL_S", "POST_FIXED_S", "PREFIX_SIZES", "ParamSpec", "RATIO_TOLERANCE", "SERIES",
    "SIGMA_PER_TOLERANCE", "TENSOR_PARALLEL", "TOLERANCE", "VLLM_VERSION", "WEAK", "gpu_scale_lower",
    "benchmark_scenario", "costs_from_values", "first_turn_bound", "published_points", "published_priors",
    "series_fast", "series_from_turns", "simulate_series", "surrogate_series", "PublishedFit", "FitSettings",
    "fit_published", "point_rows", "d_leg_rows", "ratio_row",
]

# --- the fit -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PublishedFit:
    """Result of :func:`fit_published`: the profile and the report it carries."""

    profile: Profile
    report: dict[str, Any]


#: Stage 1 (surrogate) optimiser settings: the surrogate is smooth and cheap, so converge tightly.
SURROGATE_TOL = 1e-10
SURROGATE_MAX_NFEV = 2000
#: Stage 2 (simulation) tolerances, and the cost decrease below which the trust-region restarts stop.
SIMULATION_TOL = 1e-8
RESTART_MIN_IMPROVEMENT = 1e-3
#: Residual returned for every component when a simulated series is not finite (keeps the optimiser away).
NON_FINITE_RESIDUAL = 1e3
#: A fitted parameter further than this factor from its prior is listed in the notes as an effective value.
FAR_FROM_PRIOR = 3.0

Series = dict[tuple[str, int], float]


@dataclass(frozen=True)
class FitSettings:
    """Optimiser and penalty settings of :func:`fit_published` (its keyword arguments)."""

    max_nfev: int = 60
    diff_step: float = 0.1
    rounds: int = 8
    band_start: float = 0.75
    band_weight: float = 30.0


class _Objective:
    """Residuals of the log-parameters ``x`` (``p = prior x exp(x)``) against the published points.

    Evaluations are cached per (surrogate?, x); ``use_surrogate`` switches stage 1 (closed form) to stage 2
    (simulation).
    """

    def __init__(self, model: str, pts: pd.DataFrame, specs: list[ParamSpec], agg: Aggregation,
                 settings: FitSettings, compute: CostModel) -> None:
        self.model, self.agg, self.settings, self.compute = model, agg, settings, compute
        self.keys, self.pub = _targets(pts, model)
        self.sizes = sorted({s for _, s in self.keys})
        self.free = [s for s in specs if s.fitted]
        self.fixed = {s.name: s.prior for s in specs if not s.fitted}
        self.prior = np.array([s.prior for s in self.free])
        self.sig = np.array([s.sigma_log for s in self.free], dtype=np.float64)
        self.lower = np.log(np.array([s.lower for s in self.free]) / self.prior)
        self.upper = np.log(np.array([s.upper for s in self.free]) / self.prior)
        self.ratio_keys = _ratio_keys(self.pub)
        self.n_data = len(self.keys) + (1 if self.ratio_keys is not None else 0)
        self.use_surrogate = True
        self.compute_status = ""
        self._cache: dict[tuple[bool, bytes], Series] = {}

    def values(self, x: np.ndarray) -> dict[str, float]:
        """Every cost parameter (fixed and fitted) at ``x``."""
        vals = dict(self.fixed)
        vals.update({s.name: float(p) for s, p in zip(self.free, self.prior * np.exp(x), strict=True)})
        return vals

    def series(self, x: np.ndarray) -> Series:
        """The benchmark's series at ``x`` (surrogate or simulation)."""
        key = (self.use_surrogate, np.asarray(x, dtype=np.float64).tobytes())
        if key not in self._cache:
            costs_x = costs_from_values(self.values(x), self.compute)
            if self.use_surrogate:
                self._cache[key] = surrogate_series(self.model, self.sizes, costs_x, self.agg)
            else:
                self._cache[key] = simulate_series(self.model, self.sizes, costs=costs_x, aggregation=self.agg, fast=True)
        return self._cache[key]

    def data_residuals(self, sim: Mapping[tuple[str, int], float]) -> tuple[np.ndarray, np.ndarray]:
        """Tolerance-scaled residuals of the points (and ON/OFF ratio) and the band penalty."""
        pub = self.pub
        rel = [(sim[k] - pub[k]) / pub[k] for k in self.keys]
        tol = [TOLERANCE[k[0]] for k in self.keys]
        if self.ratio_keys is not None:
            on, off = self.ratio_keys
            rel.append(math.log(sim[on] / sim[off]) - math.log(pub[on] / pub[off]))
            tol.append(RATIO_TOLERANCE)
        e = np.array(rel) / np.array(tol)
        st = self.settings
        band = st.band_weight * np.sign(e) * np.maximum(np.abs(e) - st.band_start, 0.0)
        return e / SIGMA_PER_TOLERANCE, band

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """Data residuals, band penalty and prior residuals (``x / sigma``), in that order."""
        res = np.concatenate([*self.data_residuals(self.series(x)), x / self.sig])
        if not np.all(np.isfinite(res)):
            return np.full(res.shape, NON_FINITE_RESIDUAL)
        return res


def _optimise(obj: _Objective, progress: Callable[[str], None] | None) -> tuple[np.ndarray, Any, int]:
    """Stage 1 on the surrogate from the priors, then trust-region restarts on the simulation."""
    say = progress or (lambda _msg: None)
    bounds = (obj.lower, obj.upper)
    stage1 = least_squares(obj, np.zeros(len(obj.free)), bounds=bounds, method="trf", x_scale=1.0,
                           xtol=SURROGATE_TOL, ftol=SURROGATE_TOL, max_nfev=SURROGATE_MAX_NFEV)
    x, nfev = stage1.x, int(stage1.nfev)
    say(f"{obj.model}: surrogate fit cost {stage1.cost:.4f} ({stage1.nfev} evaluations)")
    # stage 2: the simulation itself. Its aggregates are piecewise smooth (a request reaching D waits for
    # the step in progress, so TTFT moves in steps of one decode step): wide finite differences, and
    # trust-region restarts that re-estimate the Jacobian after the staircase has stalled the region
    obj.use_surrogate = False
    st = obj.settings
    sol = None
    for round_ in range(st.rounds):
        sol = least_squares(obj, x, bounds=bounds, method="trf", diff_step=st.diff_step, x_scale=1.0,
                            max_nfev=st.max_nfev, xtol=SIMULATION_TOL, ftol=SIMULATION_TOL)
        nfev += int(sol.nfev)
        improved = float(np.sum(obj(x) ** 2)) - 2 * float(sol.cost)
        x = sol.x
        say(f"{obj.model}: round {round_ + 1}, cost {sol.cost:.4f} ({sol.nfev} evaluations, {sol.message})")
        if improved < RESTART_MIN_IMPROVEMENT:
            break
    if sol is None:
        raise input_error("fit_published", f"rounds is {st.rounds}", "use rounds >= 1")
    say(f"{obj.model}: {nfev} evaluations in total")
    return x, sol, nfev


def _posterior(obj: _Objective, x: np.ndarray, sol: Any) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """Per fitted parameter: value, standard error, prior, shrinkage, bound; and the profile's uncertainty.

    Posterior covariance of the log-parameters: Gauss-Newton on the data and prior residuals (the
    tolerance-band penalty is a constraint, not information, and is left out).
    """
    n_data = obj.n_data
    jac = np.asarray(sol.jac)
    info_rows = np.concatenate([jac[:n_data], jac[2 * n_data :]])
    try:
        cov = np.linalg.inv(info_rows.T @ info_rows)
    except np.linalg.LinAlgError:
        cov = np.full((len(obj.free), len(obj.free)), np.nan)
    values = obj.values(x)
    params, uncertainty = [], {}
    for j, spec in enumerate(obj.free):
        var = float(cov[j, j])
        sd_log = math.sqrt(var) if math.isfinite(var) and var >= 0 else math.nan
        value = values[spec.name]
        se = value * sd_log if math.isfinite(sd_log) else math.nan
        at_bound = bool(x[j] <= obj.lower[j] + AT_BOUND_LOG or x[j] >= obj.upper[j] - AT_BOUND_LOG)
        shrink = sd_log / float(obj.sig[j]) if math.isfinite(sd_log) else math.nan
        if math.isfinite(se) and not at_bound:
            uncertainty[spec.name] = se
        params.append({
            "name": spec.name, "value": value, "stderr": se if math.isfinite(se) and not at_bound else None,
            "prior": spec.prior, "prior_sigma_log": spec.sigma_log,
            "posterior_over_prior_sd": round(shrink, 4) if math.isfinite(shrink) else None,
            "identified_by_data": bool(math.isfinite(shrink) and shrink < IDENTIFIED_SHRINK and not at_bound),
            "at_bound": at_bound, "source": spec.source,
        })
    return params, uncertainty


#: The tensor-parallel size of the published benchmark's deployment (an assumption the profile's notes state).
PUBLISHED_TP = 8


def _misses(report: dict[str, Any]) -> list[str]:
    """Each published point (and the ON/OFF ratio) the fitted profile leaves outside its acceptance tolerance."""
    out = [f"{r['model']} {r['series']} at {r['prompt_tokens']} tokens: simulated {r['simulated_ms']:.4g} ms vs "
           f"published {r['published_ms']:.4g} ms ({r['rel_error']:+.1%}, tolerance {r['tolerance']:.0%})"
           for r in report["points"] if not r["within"]]
    ratio = report.get("ttft_ratio_at_longest_prompt")
    if ratio is not None and not ratio["within"]:
        out.append(f"ON/OFF TTFT ratio at {ratio['prompt_tokens']} tokens: {ratio['rel_error']:+.1%} (tolerance "
                   f"{ratio['tolerance']:.0%})")
    return out


def _report(obj: _Objective, pts: pd.DataFrame, specs: list[ParamSpec], sol: Any, nfev: int,
            params: list[dict[str, Any]], final: Series) -> dict[str, Any]:
    """The profile's ``fit_report``: method, per-point errors, MAPE, parameters, optimiser state."""
    st, n_data, pub = obj.settings, obj.n_data, obj.pub
    rows = point_rows(obj.model, pub, final)
    ratio = ratio_row(pub, final)
    mape = {series: float(np.mean([abs(r["rel_error"]) for r in rows if r["series"] == series]) * 100.0)
            for series in SERIES if any(r["series"] == series for r in rows)}
    return {
        "method": (
            "simulation-based MAP fit (scipy.optimize.least_squares, trf, bounds, log-parameters): stage 1 on the "
            "closed-form surrogate, stage 2 on the simulation; tolerance-scaled residuals plus a penalty "
            f"{st.band_weight:g} x (|error|/tolerance - {st.band_start:g}) outside {st.band_start:.0%} of each "
            "acceptance band"
        ),
        "aggregation": obj.agg.describe(),
        "noise_model": "relative, sigma = half the acceptance tolerance (TTFT 3.5%, prefill and KV transfer 7.5%)",
        "points": rows,
        "ttft_ratio_at_longest_prompt": ratio,
        "mape_pct": mape,
        "all_within_tolerance": bool(all(r["within"] for r in rows) and (ratio is None or ratio["within"])),
        "params": params,
        "fixed": [{"name": s.name, "value": s.prior, "source": s.source} for s in specs if not s.fitted],
        "optimizer": {
            "nfev": nfev, "status": int(sol.status), "message": str(sol.message), "cost": float(sol.cost),
            "data_chi2": float(np.sum(sol.fun[:n_data] ** 2)),
            "band_penalty": float(np.sum(sol.fun[n_data : 2 * n_data] ** 2)),
            "prior_chi2": float(np.sum(sol.fun[2 * n_data :] ** 2)),
        },
        "first_turn_included_bound": first_turn_bound(pts, obj.model),
        "d_leg_check": d_leg_rows(pub, final),
        "residuals": [{"metric": r["series"], "x": r["prompt_tokens"], "observed": r["published_ms"],
                       "predicted": r["simulated_ms"]} for r in rows],
    }


def _notes(obj: _Objective, params: list[dict[str, Any]], values: Mapping[str, float], arch: ModelArch) -> list[str]:
    """The profile's ``notes``: what was fitted against what, what was fixed, what the data could not move."""
    not_identified = [str(p["name"]) for p in params if not p["identified_by_data"]]
    at_bounds = [str(p["name"]) for p in params if p["at_bound"]]
    ratios = {spec.name: values[spec.name] / spec.prior for spec in obj.free if spec.name not in at_bounds}
    moved = [f"{name} = {r:.2g}x its prior" for name, r in ratios.items() if abs(math.log(r)) > math.log(FAR_FROM_PRIOR)]
    notes = [
        "CALIBRATED by simulating the published P5en benchmark (kvplan calibrate --published) against the "
        "write-up's end points only (2 prefix sizes x 5 series); intermediate prefix sizes are predictions",
        "Aggregation: " + obj.agg.describe(),
        "Assumed: TP8 on each p5en (not stated in the write-up), bf16 KV cache, the benchmark as described "
        "(10 conversations x 5 user turns, 150-token messages, 300-token responses, 2 clients)",
        f"GPU compute held at the kernel-derived prior: {obj.compute_status}; only residuals are fitted (engine "
        "per-step CPU overhead on P, proxy/HTTP legs, transfer latencies)",
        "Fixed, not identifiable from end-point aggregates: the transfer's bytes/descriptor split "
        "(per_byte_s = 1/line rate), post_fixed_s and post_per_descriptor_s (the post is part of NIXL's "
        "xferDuration, reported only), poll_s, handshake_s; the visible D->P pull is request creation "
        "(prep_per_descriptor_s, fitted to prefill ON) + xferDuration (fitted to kv_transfer_on) + poll_s",
        f"Constrained least squares: noisy points weighed by sigma = half their acceptance tolerance, plus a "
        f"penalty once a point leaves {obj.settings.band_start:.0%} of its band (the published points are not "
        "jointly consistent to better than that; see fit_report.d_leg_check)",
    ]
    if not_identified:
        notes.append("Prior-dominated (data shrink the prior spread by less than half): " + ", ".join(not_identified))
    if at_bounds:
        notes.append("On a bound of the fit (the data push it there; no standard error): " + ", ".join(at_bounds))
    if moved:
        notes.append("Far from the physics prior (effective values absorbing what the model lacks): " + ", ".join(moved))
    return notes


def fit_published(
    model: str,
    points: pd.DataFrame | None = None,
    *,
    hardware: str = HARDWARE,
    tp: int = TENSOR_PARALLEL,
    aggregation: Aggregation | None = None,
    source_sha256: str = PUBLISHED_SHA256,
    source_name: str = "p5en_published.csv",
    max_nfev: int = 60,
    diff_step: float = 0.1,
    rounds: int = 8,
    band_start: float = 0.75,
    band_weight: float = 30.0,
    progress: Callable[[str], None] | None = None,
) -> PublishedFit:
    """Fit the cost model of ``model`` to the published points by simulating the published benchmark.

    Deterministic (the simulation is seeded, the optimiser has no randomness). Returns the calibrated
    :class:`Profile` (costs, standard errors, per-point report, provenance, notes) and the report.
    ``band_start``/``band_weight``: the penalty ``band_weight x (|error|/tolerance - band_start)`` once a
    point leaves ``band_start`` of its acceptance band.
    """
    agg = aggregation or Aggregation()
    pts = published_points() if points is None else points
    arch, node = get_model(model), get_hardware(hardware)
    compute, compute_status = compute_prior(arch, node.gpu, tp)
    lows = {n: gpu_scale_lower(arch, node, tp, compute, n) for n in (LINEAR_SCALE, ATTENTION_SCALE)}
    specs = [ParamSpec(s.name, max(s.prior, lows[s.name] * 1.001), s.sigma_log, lows[s.name], s.upper, s.source)
             if s.name in lows else s for s in published_priors(arch, node, tp)]
    obj = _Objective(model, pts, specs, agg, FitSettings(max_nfev, diff_step, rounds, band_start, band_weight),
                     compute)
    obj.compute_status = compute_status
    x, sol, nfev = _optimise(obj, progress)
    values = obj.values(x)
    costs = costs_from_values(values, compute)
    params, uncertainty = _posterior(obj, x, sol)
    # the reported numbers go through the public run() path
    final = simulate_series(model, obj.sizes, costs=costs, aggregation=agg, fast=False)
    report = _report(obj, pts, specs, sol, nfev, params, final)
    reasons = _misses(report)
    if reasons:  # the fit does not reproduce the points it was fitted on: not a calibration (as calibrate --scenario)
        report["unreliable_reasons"] = reasons
    # the write-up's deployment is TP8 (assumed, notes): a fit at another TP gets its own name, not the shipped one's
    name = f"{hardware}-{model}" if tp == PUBLISHED_TP else f"{hardware}-{model}-tp{tp}"
    profile = Profile(
        name=name, model=model, hardware=hardware, tensor_parallel_size=tp, costs=costs,
        uncertainty=uncertainty, fit_report=report,
        provenance={
            "sources": [{"file": source_name, "sha256": source_sha256, "what": PUBLISHED_SOURCE}],
            "vllm_version": VLLM_VERSION,
            "nixl_version": NIXL_VERSION,
            "model": arch.hf_id or model,
            "hardware": f"{hardware} ({node.gpus_per_node}x {node.gpu.name}, {node.link.description})",
            "tensor_parallel_size": tp,
            "method": "kvplan calibrate --published (simulation-based, calibration/published.py)",
            "compute_prior": compute_status,
            "prefill_gpu_scales": {"linear": values[LINEAR_SCALE], "attention": values[ATTENTION_SCALE]},
        },
        status="unreliable" if reasons else "calibrated",
        component_status={
            "prefill.gpu": f"{compute_status}, linear x {values[LINEAR_SCALE]:.3f}, attention x "
                           f"{values[ATTENTION_SCALE]:.3f} (calibrated on the published P5en points)",
            "decode.gpu": compute_status,
            "prefill.overhead_s": "calibrated (published P5en points)",
            "decode.overhead_s": "calibrated (published P5en points, prior-dominated)",
            "overhead": "calibrated (published P5en points)",
            "transfer.latency": "calibrated (published P5en points)",
            "transfer.per_byte_s": f"hardware data (1 / line rate of {hardware})",
        },
        notes=_notes(obj, params, values, arch),
    )
    return PublishedFit(profile=profile, report=report)
