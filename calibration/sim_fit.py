"""Calibration through the simulator: ``kvplan calibrate --bench/--multiturn F --scenario S.yaml``.

A ``vllm bench serve`` or multi-turn benchmark file measures TTFT and TPOT *of a deployment under load*:
a mean TTFT contains queueing on P, the KV transfer, the proxy legs and the first decode step, not just a
prefill. So the fit does what the measurement did: the scenario gives the measured deployment (model,
hardware, TP, P/D counts or aggregated replicas, policy); the file gives the arrivals (rate, burstiness,
concurrency, or the multi-turn trace itself), the request count and the lengths; :func:`fit_scenario`
simulates that run (:func:`kvplan.sim.api.run`, one fixed seed: common random numbers, so the objective
moves only with the parameters) and fits, with :func:`scipy.optimize.least_squares` in log space, the
parameters the statistics can identify to the measured TTFT and TPOT means (weight 1) and medians
(weight 1/2):

* ``prefill.gpu_scale``: every prefill GPU term of the base (kernel prior) multiplied by one factor (one
  request shape cannot split linear layers from attention: their ratio stays the kernel prior's);
* ``decode.gpu_scale``: every decode GPU term multiplied by one factor.

Bounds (:mod:`kvplan.models.bounds`): a scale may not take any term below its physical floor
(:func:`~kvplan.models.bounds.floor_scale`) nor above :data:`UPPER_SCALE` x its prior. Parameters the
statistics cannot move (no TPOT in the file, or a Jacobian column of zero) and the residuals (engine CPU
overheads, proxy legs, transfer latencies: additive terms that a single request shape cannot separate from
the GPU scales) are held at the base and named in the report.

**Self-check.** Every fit ends by simulating the fitted profile on the same setup and comparing the
measured and simulated means per run and metric. A fit is written ``calibrated`` only when every mean is
within :data:`SELF_CHECK_TOLERANCE` and every fitted parameter within :data:`MAX_PRIOR_FACTOR` of its prior;
otherwise ``unreliable`` with the reasons in ``fit_report.unreliable_reasons`` (``kvplan simulate`` then
refuses it without ``--allow-unreliable-profile``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from kvplan.calibration.parse_bench import BenchServeResult
from kvplan.calibration.parse_multiturn import MultiTurnStats
from kvplan.errors import KvplanInputError, input_error
from kvplan.models.bounds import floor_scale
from kvplan.models.costs import CostModel, scale_decode_gpu, scale_prefill_gpu
from kvplan.models.profile import Profile, load_profile
from kvplan.sim.scenario import CostOverrides, Scenario, scenario_from_dict

#: A fit whose simulated means miss a measured mean by more than this is ``unreliable`` (issue 19).
SELF_CHECK_TOLERANCE = 0.15
#: A fitted parameter beyond this factor of its prior (either way) makes the fit ``unreliable``.
MAX_PRIOR_FACTOR = 20.0
#: Upper bound of a scale in the optimiser: wider than MAX_PRIOR_FACTOR so that a fit wanting more shows it.
UPPER_SCALE = 100.0
#: The one seed of every simulation of the fit (common random numbers).
FIT_SEED = 0
#: Statistics fitted and their weights (means decide the self-check, medians help the shape).
TARGETS: dict[str, float] = {"ttft_mean_s": 1.0, "ttft_p50_s": 0.5, "tpot_mean_s": 1.0, "tpot_p50_s": 0.5}
#: The statistics the self-check gates on.
CHECKED = ("ttft_mean_s", "tpot_mean_s")
#: A parameter whose largest effect on a fitted statistic is below this (d log stat / d log param) is held.
MIN_SENSITIVITY = 0.05
#: Finite-difference step in log space (the simulated statistics move in small steps: wide differences).
DIFF_STEP = 0.05
MAX_EVALUATIONS = 30
PARAMS = ("prefill.gpu_scale", "decode.gpu_scale")
HELD_RESIDUALS = ("prefill.overhead_s", "decode.overhead_s", "overhead.p_leg_s", "overhead.d_leg_s", "transfer.*")


@dataclass(frozen=True)
class MeasuredRun:
    """One measured run: its workload section (arrivals and lengths from the file) and its statistics (s)."""

    label: str
    source: str
    workload: dict[str, Any]
    measured: dict[str, float]
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SimFit:
    """The result of :func:`fit_scenario`: the profile (``calibrated`` or ``unreliable``) and its report."""

    profile: Profile
    report: dict[str, Any]
    values: dict[str, float] = field(default_factory=dict)


def _stat(frame_value: Any) -> float:
    v = float(frame_value)
    return v if math.isfinite(v) else math.nan


def bench_run(r: BenchServeResult) -> MeasuredRun:
    """The run a ``vllm bench serve --save-result`` file measured: arrivals (rate, burstiness, concurrency),
    request count and lengths (per request with ``--save-detailed``, else the mean of the totals)."""
    label = os.path.basename(r.source)
    notes: list[str] = []
    n = r.num_prompts or r.completed
    rate = r.request_rate_req_s
    if r.max_concurrency and (rate is None or math.isinf(rate)):
        arrival: dict[str, Any] = {"kind": "closed_loop", "clients": r.max_concurrency,
                                   "max_active_conversations": r.max_concurrency}
    elif rate is None or math.isinf(rate):
        raise input_error(f"--bench {r.source}", "request rate 'inf' without max_concurrency: every request at t=0",
                          "such a run has no arrival process kvplan can replay; use a run with a finite rate")
    else:
        arrival = {"kind": "poisson", "rate_per_s": rate, "burstiness": r.burstiness or 1.0}
        if r.max_concurrency:
            notes.append(f"{label}: max_concurrency {r.max_concurrency} at a finite rate is not simulated (open loop "
                         "without the client's cap)")
    req = r.requests
    if req is not None and "input_len_tokens" in req and "output_len_tokens" in req:
        ok = req[req["ok"]] if "ok" in req else req
        isl: dict[str, Any] = {"dist": "empirical", "values": [float(x) for x in ok["input_len_tokens"]]}
        osl: dict[str, Any] = {"dist": "empirical", "values": [float(max(x, 1)) for x in ok["output_len_tokens"]]}
    else:
        if not r.total_input_tokens or not r.total_output_tokens:
            raise input_error(f"--bench {r.source}", "no per-request lengths and no total_input/output_tokens",
                              "save the result with --save-detailed or keep the totals")
        isl = {"dist": "constant", "value": round(r.total_input_tokens / r.completed)}
        osl = {"dist": "constant", "value": max(1, round(r.total_output_tokens / r.completed))}
        notes.append(f"{label}: lengths are the file's means ({isl['value']} in / {osl['value']} out; no "
                     "per-request arrays)")
    measured = {}
    for stat, (metric, col) in {"ttft_mean_s": ("ttft", "mean"), "ttft_p50_s": ("ttft", "median"),
                                "tpot_mean_s": ("tpot", "mean"), "tpot_p50_s": ("tpot", "median")}.items():
        if metric in r.summary_ms.index and col in r.summary_ms.columns:
            v = _stat(r.summary_ms.loc[metric, col]) / 1e3
            if math.isfinite(v) and v > 0:
                measured[stat] = v
    workload = {"conversations": int(n), "arrival": arrival, "turns": {"dist": "constant", "value": 1},
                "prefix_tokens": isl, "user_tokens": {"dist": "constant", "value": 0}, "output_tokens": osl,
                "turn_gap_s": {"dist": "constant", "value": 0}}
    return MeasuredRun(label, r.source, workload, measured, tuple(notes))


def multiturn_run(m: MultiTurnStats) -> MeasuredRun:
    """The run a multi-turn stats file measured: replayed as a trace (its arrival clock, turns and tokens)."""
    req = m.requests
    measured = {}
    ttft = req["ttft_s"].dropna()
    tpot = req["tpot_s"][req["output_num_tokens"] > 1]
    if len(ttft):
        measured["ttft_mean_s"], measured["ttft_p50_s"] = float(ttft.mean()), float(ttft.median())
    if len(tpot):
        measured["tpot_mean_s"], measured["tpot_p50_s"] = float(tpot.mean()), float(tpot.median())
    label = os.path.basename(m.source)
    workload = {"trace": {"path": os.fspath(m.source), "format": "multiturn"}}
    note = (f"{label}: replayed at the file's request start times (open loop; the benchmark's clients are closed "
            "loop, so a slower engine would have sent later)")
    return MeasuredRun(label, m.source, workload, measured, (note,))


def run_scenario(base: Scenario, run: MeasuredRun, costs: CostModel | None) -> Scenario:
    """``base`` with the run's workload, the fit's seed and (when given) every cost component inline."""
    data = base.model_dump(mode="python")
    data["workload"] = run.workload
    data["seed"] = FIT_SEED
    sc = scenario_from_dict(data, where=f"--scenario with {run.label}")
    if costs is None:
        return sc
    dump = costs.model_dump(mode="python")
    over = CostOverrides(prefill=dump["prefill"], transfer=dump["transfer"], decode=dump["decode"],
                         overhead=dump["overhead"])
    return sc.model_copy(update={"costs": over})


def simulated_stats(base: Scenario, run: MeasuredRun, costs: CostModel | None) -> dict[str, float]:
    """The fitted statistics of one simulated run (seconds)."""
    from kvplan.sim.api import run as simulate

    res = simulate(run_scenario(base, run, costs), FIT_SEED, keep=False)
    return {k: float(res.summary.get(k, math.nan)) for k in TARGETS}


def apply_values(base: CostModel, values: dict[str, float]) -> CostModel:
    """``base`` with the fitted scales applied."""
    pc = scale_prefill_gpu(base.prefill, values["prefill.gpu_scale"], values["prefill.gpu_scale"])
    dc = scale_decode_gpu(base.decode, values["decode.gpu_scale"])
    return base.model_copy(update={"prefill": pc, "decode": dc})


@dataclass
class _Problem:
    scenarios: list[Scenario]
    runs: list[MeasuredRun]
    base: CostModel
    free: list[str]
    held: dict[str, float]
    evaluations: int = 0

    def values(self, x: np.ndarray) -> dict[str, float]:
        return {**self.held, **{n: float(math.exp(v)) for n, v in zip(self.free, x, strict=True)}}

    def stats(self, values: dict[str, float]) -> list[dict[str, float]]:
        self.evaluations += 1
        costs = apply_values(self.base, values)
        return [simulated_stats(sc, r, costs) for sc, r in zip(self.scenarios, self.runs, strict=True)]

    def residuals(self, x: np.ndarray) -> np.ndarray:
        out = []
        for r, sim in zip(self.runs, self.stats(self.values(x)), strict=True):
            for k, w in TARGETS.items():
                if k in r.measured:
                    s = sim[k]
                    out.append(w * (math.log(s / r.measured[k]) if s > 0 and math.isfinite(s) else 5.0))
        return np.array(out)


def _sensitivity(prob: _Problem, x: np.ndarray) -> np.ndarray:
    """d residual / d log(param) at ``x`` (the largest absolute entry per parameter)."""
    r0 = prob.residuals(x)
    cols = []
    for i in range(len(x)):
        xp = x.copy()
        xp[i] += DIFF_STEP * 4
        cols.append(np.max(np.abs((prob.residuals(xp) - r0) / (DIFF_STEP * 4))) if r0.size else 0.0)
    return np.array(cols)


def _start(prob: _Problem, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """A start from the prior: each scale set so that its mean matches, TTFT and TPOT taken as proportional."""
    x0 = np.zeros(len(prob.free))
    sims = prob.stats(prob.values(x0))
    for i, name in enumerate(prob.free):
        key = "ttft_mean_s" if name.startswith("prefill") else "tpot_mean_s"
        ratios = [r.measured[key] / s[key] for r, s in zip(prob.runs, sims, strict=True)
                  if key in r.measured and s[key] > 0 and math.isfinite(s[key])]
        if ratios:
            x0[i] = float(np.mean(np.log(ratios)))
    return np.clip(x0, lo + 1e-9, hi - 1e-9)


def _identify(prob: _Problem, why_held: dict[str, str]) -> None:
    """Hold the parameters no fitted statistic is observed for, or that move none of them."""
    has = {k for r in prob.runs for k in r.measured}
    for name in list(prob.free):
        need = "tpot" if name.startswith("decode") else "ttft"
        if not any(k.startswith(need) for k in has):
            why_held[name] = f"held at the prior: the file(s) measure no {need.upper()}"
            prob.free.remove(name)
            prob.held[name] = 1.0
    if not prob.free:
        return
    x = np.zeros(len(prob.free))
    sens = _sensitivity(prob, x)
    for name, s in zip(list(prob.free), sens, strict=True):
        if s < MIN_SENSITIVITY:
            why_held[name] = (f"held at the prior: not identifiable (moves no fitted statistic: "
                              f"|d log stat / d log x| = {s:.3g})")
            prob.free.remove(name)
            prob.held[name] = 1.0


def fit_scenario(base: Scenario, runs: Sequence[MeasuredRun], scenarios: Sequence[Scenario] | None = None,
                 sources: list[dict[str, Any]] | None = None) -> SimFit:
    """Fit the identifiable scales to the runs' measured statistics by simulating each run; self-check; profile.

    ``scenarios`` gives one deployment per run (default: ``base`` for every run); ``base`` names the model,
    hardware and TP of the profile.
    """
    from kvplan.sim.engine import resolve

    scen = list(scenarios) if scenarios is not None else [base] * len(runs)
    for sc in scen:
        if (sc.model, sc.hardware, sc.deployment.tensor_parallel_size) != (
                base.model, base.hardware, base.deployment.tensor_parallel_size):
            raise input_error("--scenario", "every scenario of one fit must have the same model, hardware and TP",
                              "fit each deployment of another model, hardware or TP separately")
    if not runs or not any(r.measured for r in runs):
        raise input_error("calibrate", "the file(s) hold no TTFT or TPOT statistic to fit", "use --save-result files")
    rs = resolve(run_scenario(base, runs[0], None))
    base_costs = rs.costs
    lo_s = {"prefill.gpu_scale": floor_scale(base_costs, rs.arch, rs.node, rs.scenario.deployment.tensor_parallel_size,
                                             "prefill"),
            "decode.gpu_scale": floor_scale(base_costs, rs.arch, rs.node, rs.scenario.deployment.tensor_parallel_size,
                                            "decode")}
    prob = _Problem(scen, list(runs), base_costs, list(PARAMS), {})
    why_held: dict[str, str] = {}
    _identify(prob, why_held)
    lo = np.array([math.log(max(lo_s[n], 1.0 / UPPER_SCALE)) for n in prob.free])
    hi = np.array([math.log(UPPER_SCALE)] * len(prob.free))
    sol_x = np.zeros(0)
    if prob.free:
        x0 = _start(prob, lo, hi)
        sol = least_squares(prob.residuals, x0, bounds=(lo, hi), diff_step=DIFF_STEP, max_nfev=MAX_EVALUATIONS,
                            x_scale=1.0, method="trf")
        sol_x = sol.x
    values = prob.values(sol_x)
    fitted_costs = apply_values(base_costs, values)
    check = self_check(scen, list(runs), fitted_costs)
    reasons = [f"{c['run']} {c['metric']}: simulated {c['simulated_ms']:.4g} ms vs measured {c['measured_ms']:.4g} ms "
               f"({c['rel_error']:+.1%}, tolerance {SELF_CHECK_TOLERANCE:.0%})" for c in check if c["gated"] and not c["within"]]
    params = []
    for n in PARAMS:
        v = values[n]
        at_floor = n in prob.free and v <= lo_s[n] * (1 + 1e-6)
        if v > MAX_PRIOR_FACTOR or v < 1.0 / MAX_PRIOR_FACTOR:
            reasons.append(f"{n} = {v:.4g} x the prior, beyond {MAX_PRIOR_FACTOR:.0f}x")
        params.append({"name": n, "value": v, "prior": 1.0, "lower": lo_s[n], "upper": UPPER_SCALE,
                       "status": "fitted" if n in prob.free else "held", "at_physical_floor": at_floor,
                       "why": why_held.get(n, "fitted to the measured TTFT/TPOT statistics by simulation")})
    report = {
        "method": "simulation (calibration/sim_fit.py: scipy.optimize.least_squares over the simulated run)",
        "runs": [{"label": r.label, "file": r.source, "workload": r.workload, "measured_s": r.measured,
                  "deployment": s.deployment.model_dump(mode="json")} for r, s in zip(runs, scen, strict=True)],
        "params": params,
        "held": [*(f"{n}: {why_held[n]}" for n in PARAMS if n in why_held),
                 *(f"{n}: held at the base {rs.profile.name} (a residual, not model compute: additive terms the "
                   "TTFT/TPOT statistics do not separate from the GPU scales)" for n in HELD_RESIDUALS)],
        "base_profile": f"{rs.profile.name} ({rs.profile.status_line()})",
        "self_check": check,
        "self_check_tolerance": SELF_CHECK_TOLERANCE,
        "max_prior_factor": MAX_PRIOR_FACTOR,
        "unreliable_reasons": reasons,
        "simulations": prob.evaluations + len(runs),
        "notes": [n for r in runs for n in r.notes],
        "mape_pct": _mape(check),
    }
    profile = _profile(base, rs, fitted_costs, values, report, reasons, sources or [], prob.free)
    return SimFit(profile, report, values)


def self_check(scenarios: Sequence[Scenario], runs: list[MeasuredRun], costs: CostModel) -> list[dict[str, Any]]:
    """Measured vs simulated per run and statistic with the fitted costs (means gate the status)."""
    out = []
    for sc, r in zip(scenarios, runs, strict=True):
        sim = simulated_stats(sc, r, costs)
        for k in TARGETS:
            if k not in r.measured:
                continue
            m, s = r.measured[k], sim[k]
            rel = (s - m) / m if math.isfinite(s) else math.inf
            out.append({"run": r.label, "metric": k.replace("_s", "_ms"), "measured_ms": m * 1e3,
                        "simulated_ms": s * 1e3, "rel_error": rel, "gated": k in CHECKED,
                        "within": abs(rel) <= SELF_CHECK_TOLERANCE})
    return out


def _mape(check: list[dict[str, Any]]) -> dict[str, float]:
    by: dict[str, list[float]] = {}
    for c in check:
        by.setdefault(c["metric"], []).append(abs(c["rel_error"]) * 100)
    return {f"self_check:{k}": float(np.mean(v)) for k, v in by.items()}


def _base_gpu_scales(rs: Any) -> tuple[float, float]:
    """The prefill GPU corrections already in the base (a calibration of this model, GPU and TP), else 1."""
    from kvplan.models.resolve import gpu_corrections

    prof = rs.profile
    src = prof if prof.provenance.get("prefill_gpu_scales") else None
    name = prof.provenance.get("residuals_from")
    if src is None and isinstance(name, str):
        try:
            src = load_profile(name)
        except KvplanInputError:
            src = None
    got = gpu_corrections(src, rs.arch, rs.node, rs.scenario.deployment.tensor_parallel_size) if src else None
    return (got.linear, got.attention) if got is not None else (1.0, 1.0)


def _profile(base: Scenario, rs: Any, costs: CostModel, values: dict[str, float], report: dict[str, Any],
             reasons: list[str], sources: list[dict[str, Any]], free: list[str]) -> Profile:
    files = ", ".join(os.path.basename(s["file"]) for s in sources) or "the runs"
    status = "unreliable" if reasons else "calibrated"
    lin, att = _base_gpu_scales(rs)
    cs = dict(rs.profile.component_status) or {"prefill.gpu": rs.profile.name, "decode.gpu": rs.profile.name}
    for comp, n in (("prefill.gpu", "prefill.gpu_scale"), ("decode.gpu", "decode.gpu_scale")):
        how = "calibrated by simulation" if n in free else "held (not identifiable)"
        cs[comp] = f"{how} ({files}): x {values[n]:.4g} over [{cs.get(comp, rs.profile.name)}]"
    notes = [f"{status.upper()}: kvplan calibrate --scenario, fitted by simulating the measured run(s) "
             f"({files}); fitted: {', '.join(free) or 'nothing'}"]
    if reasons:
        notes.append("UNRELIABLE (self-check failed): " + "; ".join(reasons))
    tp = base.deployment.tensor_parallel_size
    return Profile(
        name=f"{rs.node.name}-{rs.arch.name}-tp{tp}-calibrated", model=rs.arch.name, hardware=rs.node.name,
        tensor_parallel_size=tp, costs=costs, uncertainty={}, fit_report=report, status=status,
        component_status=cs,
        provenance={"sources": sources, "method": report["method"], "scenario": base.model_dump(mode="json",
                    exclude={"workload"}), "prefill_gpu_scales": {"linear": lin * values["prefill.gpu_scale"],
                                                                  "attention": att * values["prefill.gpu_scale"]},
                    "decode_gpu_scale": values["decode.gpu_scale"], "residuals_from": rs.profile.name,
                    "model": rs.arch.hf_id or rs.arch.name, "hardware": rs.node.name, "tensor_parallel_size": tp},
        notes=notes,
    )
