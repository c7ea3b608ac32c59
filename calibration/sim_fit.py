"""Calibration through the simulator: ``kvplan calibrate --bench/--multiturn F --scenario S.yaml``.

A ``vllm bench serve`` or multi-turn benchmark file measures TTFT and TPOT *of a deployment under load*:
a mean TTFT contains queueing on P, the KV transfer, the proxy legs and the first decode step, not just a
prefill. So the fit does what the measurement did: the scenario gives the measured deployment (model,
hardware, TP, P/D counts or aggregated replicas, policy); the file gives the arrivals (rate, burstiness,
concurrency, or the multi-turn trace itself), the request count and the lengths; :func:`fit_scenario`
simulates that run (:func:`kvplan.sim.api.run`, the scenario's one seed: common random numbers, so the
objective moves only with the parameters) and fits, with :func:`scipy.optimize.least_squares` in log space, the
parameters the statistics can identify to the measured TTFT and TPOT means (weight 1) and medians
(weight 1/2):

* ``prefill.gpu_scale``: every prefill GPU term of the base (kernel prior) multiplied by one factor (one
  request shape cannot split linear layers from attention: their ratio stays the kernel prior's);
* ``decode.gpu_scale``: every decode GPU term multiplied by one factor;
* ``overhead.p_leg_scale``: the proxy/gateway leg before P (``overhead.p_leg_s``) multiplied by one factor,
  an additive part of every TTFT that only runs mixing short and long prefills (multi-turn files, or several
  files of different lengths) separate from the prefill scale.

Which of them the statistics identify is decided at the prior, from the Jacobian of the fitted statistics
(:func:`_identify`): a parameter moving no statistic, or moving them as another one does (the smallest
singular value of the column-normalised Jacobian below :data:`MIN_INDEPENDENCE`), is held at the prior and
named with the reason.

Bounds (:mod:`kvplan.models.bounds`): a scale may not take any term below its physical floor
(:func:`fit_floor`) nor above :data:`UPPER_SCALE` x its prior. A term the prior already holds at its bound (the
kernel prior's decode ``per_seq_s``, an extrapolation slope set to the dense peak when the measured one is below it)
stays at that bound when the scale goes below 1 (:func:`apply_values`, as :func:`kvplan.models.resolve.scaled_decode`
carries a calibration to another prior) and does not set the floor: with it the floor of every non-MLA decode scale
was exactly 1, so a run no faster than the prior was written ``unreliable`` ("pinned at its physical floor"). Parameters the
statistics cannot move and the other residuals (engine CPU overheads, the D-side proxy leg, transfer
latencies) are held at the base and named in the report.

**Self-check.** Every fit ends by simulating the fitted profile on the same setup and comparing the
measured and simulated means per run and metric, on the seed the fit used and, averaged, on
:data:`HELD_OUT_SEEDS` seeds it did not use (``held_out_check``; the replication seeds of the scenario's seed): a
run near saturation has a TTFT mean that moves by tens of percent between seeds, so a fit on one seed can match
that seed's queueing and not the profile's behaviour (llm-d 1P1D 23-05-25: -2.2% on the fitted seed, +19% over
the held-out seeds). A fit is written ``calibrated`` only when every mean, on the fitted seed and over the
held-out seeds, is within :data:`SELF_CHECK_TOLERANCE`, no fitted parameter is above :data:`MAX_PRIOR_FACTOR` x
its prior and no GPU scale is pinned at its physical floor;
otherwise ``unreliable`` with the reasons in ``fit_report.unreliable_reasons`` (``kvplan simulate`` then
refuses it without ``--allow-unreliable-profile``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
from scipy.optimize import least_squares

from kvplan.calibration.parse_bench import BenchServeResult
from kvplan.calibration.parse_multiturn import MultiTurnStats
from kvplan.errors import KvplanInputError, input_error
from kvplan.models.arch import ModelArch
from kvplan.models.bounds import REL_SLACK, _checks, physical_bounds
from kvplan.models.costs import CostModel, scale_decode_gpu, scale_prefill_gpu
from kvplan.models.hardware import Node
from kvplan.models.profile import Profile, load_profile
from kvplan.sim.scenario import CostOverrides, Scenario, scenario_from_dict

#: A fit whose simulated means miss a measured mean by more than this is ``unreliable`` (issue 19).
SELF_CHECK_TOLERANCE = 0.15
#: A fitted parameter above this factor of its prior makes the fit ``unreliable`` (below the prior, a GPU scale
#: is bounded by its physical floor, which also makes it ``unreliable`` when reached; an overhead may go to ~0).
MAX_PRIOR_FACTOR = 20.0
#: Upper bound of a scale in the optimiser: wider than MAX_PRIOR_FACTOR so that a fit wanting more shows it.
UPPER_SCALE = 100.0
#: Statistics fitted and their weights (means decide the self-check, medians help the shape).
TARGETS: dict[str, float] = {"ttft_mean_s": 1.0, "ttft_p50_s": 0.5, "tpot_mean_s": 1.0, "tpot_p50_s": 0.5}
#: The statistics the self-check gates on.
CHECKED = ("ttft_mean_s", "tpot_mean_s")
#: Seeds the fitted profile is also simulated with (not fitted on); their mean is gated like the fitted seed's.
HELD_OUT_SEEDS = 3
#: A parameter whose largest effect on a fitted statistic is below this (d log stat / d log param) is held.
MIN_SENSITIVITY = 0.05
#: Finite-difference step in log space (the simulated statistics move in small steps: wide differences). An absolute
#: step of the optimiser's Jacobian (:func:`_log_step_jacobian`): scipy's ``diff_step`` is relative to |x|, and x is
#: log(scale), so near the prior (scale 1, x 0) its step shrank to nothing (1.5e-8 at x = 0, 9e-4 at scale 1.018).
DIFF_STEP = 0.05
MAX_EVALUATIONS = 30
#: A fitted GPU scale this close above its physical floor (log space: one finite-difference step) is checked for
#: pinning: the bounded optimiser ('trf' keeps its iterates strictly inside the bounds) stops short of a floor the
#: statistics push against (aud15: Qwen3-8B simulated with decode x0.9 under its floor x0.9484 was fitted to x0.9486,
#: 1.7e-4 above, and written 'calibrated'), so within this band the statistics are evaluated one band below the floor.
FLOOR_BAND = DIFF_STEP
#: Requests simulated per run and evaluation at most (a fit simulates each run ~40 times: keep each small).
MAX_FIT_REQUESTS = 1000
#: Fitted parameters, each a factor over the base (kernel prior plus residuals), in the order they are kept when
#: two are not separable (the last goes first).
PARAMS = ("prefill.gpu_scale", "decode.gpu_scale", "overhead.p_leg_scale")
#: Residuals never fitted here (additive terms held at the base).
HELD_RESIDUALS = ("prefill.overhead_s", "decode.overhead_s", "overhead.d_leg_s", "transfer.*")
#: Forward-difference step of the identifiability Jacobian (log space; wide: the statistics move in steps).
SENSITIVITY_STEP = 0.2
#: Columns of the normalised Jacobian whose smallest singular value is below this are not separable.
MIN_INDEPENDENCE = 0.2


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
    if n > MAX_FIT_REQUESTS:
        notes.append(f"{label}: {n} requests; the fit simulates the first {MAX_FIT_REQUESTS} at the same arrival "
                     "process (the means are those of a shorter run)")
        n = MAX_FIT_REQUESTS
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
    replay = _bench_replay(r, arrival, label)
    if replay is not None:  # the measured requests themselves, at their send times: nothing drawn
        workload, notes = replay[0], [n for n in notes if "max_concurrency" not in n] + [replay[1]]
    return MeasuredRun(label, r.source, workload, measured, tuple(notes))


def _bench_replay(r: BenchServeResult, arrival: dict[str, Any], label: str) -> tuple[dict[str, Any], str] | None:
    """The run's own requests as a trace (``workload.trace`` format ``bench``: each successful request at its
    ``start_times`` send time with its measured lengths), when the file has them (``--save-detailed``) and the
    run is open loop (a finite request rate: the send times are the client's Poisson clock, its semaphore's waits
    included). A Poisson draw at the file's rate, with lengths drawn independently, is another run: near
    saturation its TTFT differs from the measured one by more than any fit error (a queue depends on the exact
    arrivals), so the profile could not reproduce its own input. A closed loop (``--max-concurrency`` at rate
    inf) is simulated as one: its send times depend on the server's speed. The first :data:`MAX_FIT_REQUESTS`
    requests are replayed (a time window of the trace)."""
    req = r.requests
    if arrival["kind"] != "poisson" or req is None or "start_time_s" not in req:
        return None
    ok = req[req["ok"]] if "ok" in req else req
    starts = np.sort(ok["start_time_s"].to_numpy(dtype=float))
    if not len(starts):
        return None
    trace: dict[str, Any] = {"path": os.fspath(r.source), "format": "bench"}
    what = f"its {len(starts)} successful requests"
    if len(starts) > MAX_FIT_REQUESTS:
        end = float(starts[MAX_FIT_REQUESTS])
        trace["window_s"] = [0.0, end - float(starts[0])]  # the trace's clock starts at its first request
        what = f"its first {int(np.count_nonzero(starts < end))} of {len(starts)} successful requests"
    return {"trace": trace}, (f"{label}: replayed as measured ({what} at their send times, the file's start_times, "
                              "with their measured lengths; format bench)")


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
    """``base`` with the run's workload and (when given) every cost component inline; every simulation of a fit
    uses the scenario's one seed (common random numbers: the objective moves only with the parameters)."""
    data = base.model_dump(mode="python")
    data["workload"] = run.workload
    sc = scenario_from_dict(data, where=f"--scenario with {run.label}")
    if costs is None:
        return sc
    dump = costs.model_dump(mode="python")
    over = CostOverrides(prefill=dump["prefill"], transfer=dump["transfer"], decode=dump["decode"],
                         overhead=dump["overhead"])
    return sc.model_copy(update={"costs": over})


def simulated_summary(base: Scenario, run: MeasuredRun, costs: CostModel | None) -> dict[str, Any]:
    """The ``summary.json`` of one simulated run."""
    from kvplan.sim.api import run as simulate

    return dict(simulate(run_scenario(base, run, costs), keep=False).summary)


def simulated_stats(base: Scenario, run: MeasuredRun, costs: CostModel | None) -> dict[str, float]:
    """The fitted statistics of one simulated run (seconds)."""
    summary = simulated_summary(base, run, costs)
    return {k: float(summary.get(k, math.nan)) for k in TARGETS}


def saturation_note(label: str, summary: dict[str, Any]) -> str | None:
    """What a fit on a run whose simulation saturates a resource can say (its health section), else None: the
    statistics are then that resource's queue, which the GPU scales move little or not at all."""
    saturated = list((summary.get("health") or {}).get("saturated") or [])
    if not saturated:
        return None
    what = ", ".join(RESOURCE_NAMES.get(x, x.replace("_", " ")) for x in saturated)
    return (f"{label}: the fitted profile's simulation of this run saturates {what} (its health section): its TTFT is "
            "mostly that queue, so the fit says little about compute there (a scale that moves no statistic is held, not "
            "fitted); calibrate on a run below saturation to fit the GPU scales")


#: The health section's resources as the saturation note names them.
RESOURCE_NAMES = {"decode_kv": "D's KV pool", "prefill_held_kv": "P's KV pool (prompts held for D)",
                  "prefill_compute": "P compute", "link": "the P<->D link", "decode_engine_thread": "D's engine thread",
                  "prefill_engine_thread": "P's engine thread"}


#: The deployment whose physical bounds hold a scaled term (architecture, node, TP), or None (plain scaling).
Limits = tuple[ModelArch, Node, int] | None


def apply_values(base: CostModel, values: dict[str, float], limits: Limits = None) -> CostModel:
    """``base`` with the fitted scales applied; with ``limits``, a term scaled below its physical bound is held at
    it (:func:`kvplan.models.resolve.scaled_prefill` / ``scaled_decode``: only a term the prior holds at its bound
    can reach it, the scale's floor (:func:`fit_floor`) keeps every other term above its own)."""
    if limits is None:
        pc = scale_prefill_gpu(base.prefill, values["prefill.gpu_scale"], values["prefill.gpu_scale"])
        dc = scale_decode_gpu(base.decode, values["decode.gpu_scale"])
    else:
        from kvplan.models.resolve import scaled_decode, scaled_prefill

        arch, node, tp = limits
        pc = scaled_prefill(base.prefill, values["prefill.gpu_scale"], values["prefill.gpu_scale"], arch, node, tp)
        dc = scaled_decode(base.decode, values["decode.gpu_scale"], arch, node, tp)
    oc = base.overhead.model_copy(update={"p_leg_s": base.overhead.p_leg_s * values["overhead.p_leg_scale"]})
    return base.model_copy(update={"prefill": pc, "decode": dc, "overhead": oc})


def at_bound_terms(costs: CostModel, arch: ModelArch, node: Node, tp: int, component: str) -> list[str]:
    """The terms of ``component`` the costs hold at their physical bound (within the bounds' rounding slack)."""
    bounds = {bd.param: bd for bd in physical_bounds(arch, node, tp)}
    return [param for param, value, lower, _why in _checks(costs, bounds)
            if param.startswith(component + ".") and value > 0 and abs(lower / value - 1.0) <= REL_SLACK]


def fit_floor(costs: CostModel, arch: ModelArch, node: Node, tp: int, component: str) -> float:
    """The smallest scale of ``component``'s GPU terms that keeps every term the costs hold *above* its physical bound
    at or above it (:func:`kvplan.models.bounds.floor_scale` without the terms already at their bound, which
    :func:`apply_values` holds there); 1 when every bounded term is at its bound, 0 when none is bounded."""
    bounds = {bd.param: bd for bd in physical_bounds(arch, node, tp)}
    ratios = [lower / value for param, value, lower, _why in _checks(costs, bounds)
              if param.startswith(component + ".") and value > 0]
    free = [r for r in ratios if abs(r - 1.0) > REL_SLACK]
    return max(free, default=1.0 if ratios else 0.0)


@dataclass
class _Problem:
    scenarios: list[Scenario]
    runs: list[MeasuredRun]
    base: CostModel
    free: list[str]
    held: dict[str, float]
    limits: Limits = None
    evaluations: int = 0
    _last: tuple[bytes, np.ndarray] | None = None

    def values(self, x: np.ndarray) -> dict[str, float]:
        return {**self.held, **{n: float(math.exp(v)) for n, v in zip(self.free, x, strict=True)}}

    def stats(self, values: dict[str, float]) -> list[dict[str, float]]:
        self.evaluations += 1
        costs = apply_values(self.base, values, self.limits)
        return [simulated_stats(sc, r, costs) for sc, r in zip(self.scenarios, self.runs, strict=True)]

    def residuals(self, x: np.ndarray) -> np.ndarray:
        key = np.asarray(x, dtype=np.float64).tobytes()
        if self._last is not None and self._last[0] == key:  # the optimiser asks again at x for its Jacobian
            return self._last[1].copy()
        res = self._residuals(x)
        self._last = (key, res.copy())
        return res

    def _residuals(self, x: np.ndarray) -> np.ndarray:
        out = []
        for r, sim in zip(self.runs, self.stats(self.values(x)), strict=True):
            for k, w in TARGETS.items():
                if k in r.measured:
                    s = sim[k]
                    out.append(w * (math.log(s / r.measured[k]) if s > 0 and math.isfinite(s) else 5.0))
        return np.array(out)


def _jacobian(prob: _Problem, x: np.ndarray) -> np.ndarray:
    """d residual / d log(param) at ``x`` by forward differences of :data:`SENSITIVITY_STEP` (rows: residuals)."""
    r0 = prob.residuals(x)
    cols = []
    for i in range(len(x)):
        xp = x.copy()
        xp[i] += SENSITIVITY_STEP
        cols.append((prob.residuals(xp) - r0) / SENSITIVITY_STEP)
    return np.column_stack(cols) if cols else np.zeros((r0.size, 0))


def _log_step_jacobian(prob: _Problem, hi: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """The optimiser's Jacobian: forward differences of :data:`DIFF_STEP` in log space at every x (backward where the
    step would cross the upper bound), whatever |x| is."""
    def jac(x: np.ndarray) -> np.ndarray:
        r0 = prob.residuals(x)
        cols = []
        for i in range(len(x)):
            h = DIFF_STEP if x[i] + DIFF_STEP <= hi[i] else -DIFF_STEP
            xp = np.array(x, dtype=np.float64)
            xp[i] += h
            cols.append((prob.residuals(xp) - r0) / h)
        return np.column_stack(cols)
    return jac


def _start(prob: _Problem, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """A start from the prior: each GPU scale set so that its mean matches (TTFT and TPOT taken as proportional)."""
    x0 = np.zeros(len(prob.free))
    sims = prob.stats(prob.values(x0))
    for i, name in enumerate(prob.free):
        key = {"prefill.gpu_scale": "ttft_mean_s", "decode.gpu_scale": "tpot_mean_s"}.get(name)
        ratios = [r.measured[key] / s[key] for r, s in zip(prob.runs, sims, strict=True)
                  if key is not None and key in r.measured and s[key] > 0 and math.isfinite(s[key])]
        if ratios:
            x0[i] = float(np.mean(np.log(ratios)))
    return np.clip(x0, lo + 1e-9, hi - 1e-9)


def _hold(prob: _Problem, name: str, why: str, why_held: dict[str, str]) -> None:
    why_held[name] = why
    prob.free.remove(name)
    prob.held[name] = 1.0


def _identify(prob: _Problem, why_held: dict[str, str], base: CostModel) -> None:
    """Hold the parameters no fitted statistic is observed for, that move none of them, or that move them as
    another parameter does (collinear columns of the Jacobian at the prior; the last in :data:`PARAMS` goes)."""
    has = {k for r in prob.runs for k in r.measured}
    for name in list(prob.free):
        need = "tpot" if name.startswith("decode") else "ttft"
        if not any(k.startswith(need) for k in has):
            _hold(prob, name, f"held at the prior: the file(s) measure no {need.upper()}", why_held)
    if "overhead.p_leg_scale" in prob.free and base.overhead.p_leg_s <= 0:
        _hold(prob, "overhead.p_leg_scale", "held: the base has no proxy leg to scale (0 s)", why_held)
    if not prob.free:
        return
    names = list(prob.free)
    jac = _jacobian(prob, np.zeros(len(names)))
    for name, col in zip(names, jac.T, strict=True):
        if np.max(np.abs(col), initial=0.0) < MIN_SENSITIVITY:
            _hold(prob, name, f"held at the prior: not identifiable (moves no fitted statistic: |d log stat / d log x| "
                  f"= {np.max(np.abs(col), initial=0.0):.3g})", why_held)
    while len(prob.free) > 1:
        cols = jac[:, [names.index(n) for n in prob.free]]
        unit = cols / np.linalg.norm(cols, axis=0)
        sv = np.linalg.svd(unit, compute_uv=False)
        if sv[-1] >= MIN_INDEPENDENCE:
            return
        last = prob.free[-1]
        _hold(prob, last, f"held at the prior: not separable from {', '.join(prob.free[:-1])} on these statistics "
              f"(they move the fitted statistics alike: smallest singular value of the normalised Jacobian "
              f"{sv[-1]:.3g} < {MIN_INDEPENDENCE})", why_held)


def _same_deployment_kind(base: Scenario, scen: list[Scenario]) -> None:
    for sc in scen:
        dep = sc.deployment
        roles = {"prefill": dep.prefill_tensor_parallel_size, "decode": dep.decode_tensor_parallel_size}
        other = {r: tp for r, tp in roles.items() if tp is not None and tp != dep.tensor_parallel_size}
        if other:
            # the fit scales one TP's cost model and every simulation of it carries that model inline, so a role at
            # another TP would be simulated with this TP's costs, and its scale written into a profile of this TP
            raise input_error(
                "--scenario", f"{', '.join(f'{r}_tensor_parallel_size {tp}' for r, tp in other.items())} differs from "
                f"tensor_parallel_size {dep.tensor_parallel_size}: a fit writes one TP's profile and cannot fit a role at "
                "another TP", "calibrate a deployment whose P and D run at one TP (a profile per TP)")
        if (sc.model, sc.hardware, sc.deployment.tensor_parallel_size) != (
                base.model, base.hardware, base.deployment.tensor_parallel_size):
            raise input_error("--scenario", "every scenario of one fit must have the same model, hardware and TP",
                              "fit each deployment of another model, hardware or TP separately")


def _solve(prob: _Problem, floors: dict[str, float]) -> dict[str, float]:
    """Least squares in log space within [physical floor, UPPER_SCALE x prior], from the mean-matching start."""
    if not prob.free:
        return prob.values(np.zeros(0))
    lo = np.array([math.log(max(floors[n], 1.0 / UPPER_SCALE)) for n in prob.free])
    hi = np.array([math.log(UPPER_SCALE)] * len(prob.free))
    x0 = _start(prob, lo, hi)
    sol = least_squares(prob.residuals, x0, jac=_log_step_jacobian(prob, hi), bounds=(lo, hi),
                        max_nfev=MAX_EVALUATIONS, x_scale=1.0, method="trf")
    return prob.values(sol.x)


def _pinned_at_floor(prob: _Problem, values: dict[str, float], floors: dict[str, float]) -> set[str]:
    """The free parameters whose fit is held up by their physical floor: at it, or within :data:`FLOOR_BAND` above it
    where the residuals with that parameter a band *below* the floor are smaller than at the fitted value (the
    statistics ask for a GPU faster than the floor allows; the optimiser only stopped short of the bound). Probed below
    the floor, not at it: a simulated statistic moves in small steps, so two points 1e-4 apart can compare either way.
    One simulation per such parameter, plus one at the fitted values."""
    pinned: set[str] = set()
    base_cost: float | None = None
    x = np.array([math.log(values[n]) for n in prob.free])
    for i, n in enumerate(prob.free):
        floor = floors[n]
        if floor <= 0 or values[n] > floor * math.exp(FLOOR_BAND):
            continue
        if values[n] <= floor * (1 + 1e-6):
            pinned.add(n)
            continue
        if base_cost is None:
            base_cost = float(np.sum(prob.residuals(x) ** 2))
        at = x.copy()
        at[i] = math.log(floor) - FLOOR_BAND
        if float(np.sum(prob.residuals(at) ** 2)) < base_cost:
            pinned.add(n)
    return pinned


def _param_rows(values: dict[str, float], floors: dict[str, float], free: list[str], why_held: dict[str, str],
                reasons: list[str], pinned: set[str] | None = None) -> list[dict[str, Any]]:
    """One row per parameter; appends to ``reasons`` every parameter beyond its limits (``pinned``: the free ones held
    up by their physical floor, :func:`_pinned_at_floor`; default: those at it)."""
    rows = []
    for n in PARAMS:
        v = values[n]
        at_floor = n in free and (n in pinned if pinned is not None else v <= floors[n] * (1 + 1e-6))
        if v > MAX_PRIOR_FACTOR:  # downwards a GPU scale meets its physical floor first; an overhead may be ~0
            reasons.append(f"{n} = {v:.4g} x the prior, beyond {MAX_PRIOR_FACTOR:.0f}x")
        if at_floor:
            reasons.append(f"{n} = {v:.4g} is pinned at its physical floor (the statistics ask for a GPU faster than "
                           "its peak FLOP/s or HBM bandwidth allow)")
        rows.append({"name": n, "value": v, "prior": 1.0, "lower": floors[n], "upper": UPPER_SCALE,
                     "status": "fitted" if n in free else "held", "at_physical_floor": at_floor,
                     "why": why_held.get(n, "fitted to the measured TTFT/TPOT statistics by simulation")})
    return rows


def fit_scenario(base: Scenario, runs: Sequence[MeasuredRun], scenarios: Sequence[Scenario] | None = None,
                 sources: list[dict[str, Any]] | None = None) -> SimFit:
    """Fit the identifiable scales to the runs' measured statistics by simulating each run; self-check; profile.

    ``scenarios`` gives one deployment per run (default: ``base`` for every run); ``base`` names the model,
    hardware and TP of the profile.
    """
    from kvplan.sim.engine import resolve

    scen = list(scenarios) if scenarios is not None else [base] * len(runs)
    _same_deployment_kind(base, scen)
    if not runs or not any(r.measured for r in runs):
        raise input_error("calibrate", "the file(s) hold no TTFT or TPOT statistic to fit", "use --save-result files")
    rs = resolve(run_scenario(base, runs[0], None))
    base_costs = rs.costs
    tp = rs.scenario.deployment.tensor_parallel_size
    floors = {"prefill.gpu_scale": fit_floor(base_costs, rs.arch, rs.node, tp, "prefill"),
              "decode.gpu_scale": fit_floor(base_costs, rs.arch, rs.node, tp, "decode"),
              "overhead.p_leg_scale": 0.0}  # a proxy leg has no physical floor beyond 0
    limits: Limits = (rs.arch, rs.node, tp)
    at_bound = [t for comp in ("prefill", "decode") for t in at_bound_terms(base_costs, rs.arch, rs.node, tp, comp)]
    prob = _Problem(scen, list(runs), base_costs, list(PARAMS), {}, limits)
    why_held: dict[str, str] = {}
    _identify(prob, why_held, base_costs)
    values = _solve(prob, floors)
    pinned = _pinned_at_floor(prob, values, floors)
    fitted_costs = apply_values(base_costs, values, limits)
    check = self_check(scen, list(runs), fitted_costs)
    held_out, held_out_runs = held_out_check(scen, list(runs), fitted_costs, check)
    # a held-out miss is its own reason only where the fitted seed was within (else that miss is already the reason)
    fitted_within = {(c["run"], c["metric"]) for c in check if c["within"]}
    reasons = [f"{c['run']} {c['metric']}: simulated {c['simulated_ms']:.4g} ms vs measured {c['measured_ms']:.4g} ms "
               f"({c['rel_error']:+.1%}, tolerance {SELF_CHECK_TOLERANCE:.0%})"
               for c in check if c["gated"] and not c["within"]]
    reasons += [f"{c['run']} {c['metric']} over {len(c['seeds'])} held-out seeds (not fitted on): simulated mean "
                f"{c['simulated_ms']:.4g} ms (per seed {', '.join(f'{v:.4g}' for v in c['simulated_ms_per_seed'])}) vs "
                f"measured {c['measured_ms']:.4g} ms ({c['rel_error']:+.1%}, tolerance {SELF_CHECK_TOLERANCE:.0%}): the "
                "fit matches its own seed's queueing, not the run"
                for c in held_out if c["gated"] and not c["within"] and (c["run"], c["metric"]) in fitted_within]
    params = _param_rows(values, floors, prob.free, why_held, reasons, pinned)
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
        "fitted_seeds": [sc.seed for sc in scen],  # the seed of each run's simulation the fit used (self_check's)
        "held_out_check": held_out,
        "self_check_tolerance": SELF_CHECK_TOLERANCE,
        "max_prior_factor": MAX_PRIOR_FACTOR,
        "unreliable_reasons": reasons,
        "simulations": prob.evaluations + len(runs) + held_out_runs,
        "notes": [*(["the scenario's workload section is replaced by each file's arrivals, request count and "
                     "lengths"] if any("workload" in sc.model_fields_set for sc in scen) else []),
                  *(n for r in runs for n in r.notes),
                  *dict.fromkeys(c["saturation"] for c in check if c.get("saturation")),
                  *dict.fromkeys(f"{c['run']}: the held-out seed gave exactly the fitted seed's statistics (a replay "
                                 "draws nothing), so the held-out check repeats the self-check: this fit has no "
                                 "held-out evidence; hold it against another measured run (kvplan validate)"
                                 for c in held_out if c.get("seed_independent")),
                  *([f"at their physical bound in the base (held there when a scale goes below 1, not setting its "
                     f"floor): {', '.join(at_bound)}"] if at_bound else [])],
        "mape_pct": _mape(check),
    }
    profile = _profile(base, rs, fitted_costs, values, report, reasons, sources or [], prob.free)
    return SimFit(profile, report, values)


def self_check(scenarios: Sequence[Scenario], runs: list[MeasuredRun], costs: CostModel) -> list[dict[str, Any]]:
    """Measured vs simulated per run and statistic with the fitted costs (means gate the status)."""
    out = []
    for sc, r in zip(scenarios, runs, strict=True):
        summary = simulated_summary(sc, r, costs)
        sim = {k: float(summary.get(k, math.nan)) for k in TARGETS}
        note = saturation_note(r.label, summary)
        for k in TARGETS:
            if k not in r.measured:
                continue
            m, s = r.measured[k], sim[k]
            rel = (s - m) / m if math.isfinite(s) else math.inf
            out.append({"run": r.label, "metric": k.removesuffix("_s") + "_ms", "measured_ms": m * 1e3,
                        "simulated_ms": s * 1e3, "rel_error": rel, "gated": k in CHECKED,
                        "within": abs(rel) <= SELF_CHECK_TOLERANCE, **({"saturation": note} if note else {})})
    return out


def held_out_check(scenarios: Sequence[Scenario], runs: list[MeasuredRun], costs: CostModel,
                   fitted: Sequence[dict[str, Any]] | None = None) -> tuple[list[dict[str, Any]], int]:
    """Measured vs the mean simulated over :data:`HELD_OUT_SEEDS` seeds the fit did not use (the replication seeds
    of each scenario's seed), per run and statistic (means gate the status, as in :func:`self_check`).

    ``fitted``: the :func:`self_check` rows (the fitted seed's simulated statistics). A run whose first held-out seed
    gives exactly the fitted seed's statistics does not depend on the seed (a replayed trace: its arrivals and
    lengths are the measured ones, nothing is drawn): its check is that one seed, marked ``seed_independent``, since
    more seeds would only repeat the self-check (the fit has no held-out evidence then, and the report says so).
    Returns the rows and the number of simulations run (a run with no measured statistic is not simulated)."""
    from kvplan.sim.seeds import replication_seeds

    own: dict[str, dict[str, float]] = {}
    for c in fitted or ():
        own.setdefault(c["run"], {})[c["metric"]] = c["simulated_ms"]
    labels = [r.label for r in runs]
    out = []
    simulations = 0
    for sc, r in zip(scenarios, runs, strict=True):
        keys = [k for k in TARGETS if k in r.measured]
        if not keys:
            continue
        seeds = replication_seeds(sc.seed, HELD_OUT_SEEDS)
        sims = [simulated_stats(sc.model_copy(update={"seed": seeds[0]}), r, costs)]
        mine = own.get(r.label) if labels.count(r.label) == 1 else None
        same = mine is not None and all(
            mine.get(k.removesuffix("_s") + "_ms") == sims[0][k] * 1e3 for k in keys)
        simulations += 1 if same else len(seeds)
        if same:
            seeds = seeds[:1]
        else:
            sims += [simulated_stats(sc.model_copy(update={"seed": seed}), r, costs) for seed in seeds[1:]]
        for k in keys:
            vals = [s[k] for s in sims]
            m, s = r.measured[k], float(np.mean(vals)) if all(math.isfinite(v) for v in vals) else math.inf
            rel = (s - m) / m if math.isfinite(s) else math.inf
            out.append({"run": r.label, "metric": k.removesuffix("_s") + "_ms", "seeds": seeds, "measured_ms": m * 1e3,
                        "simulated_ms": s * 1e3, "simulated_ms_per_seed": [v * 1e3 for v in vals], "rel_error": rel,
                        "gated": k in CHECKED, "within": abs(rel) <= SELF_CHECK_TOLERANCE,
                        **({"seed_independent": True} if same else {})})
    return out, simulations


def _mape(check: list[dict[str, Any]]) -> dict[str, float]:
    by: dict[str, list[float]] = {}
    for c in check:
        by.setdefault(c["metric"], []).append(abs(c["rel_error"]) * 100)
    return {f"self_check:{k}": float(np.mean(v)) for k, v in by.items()}


def _base_gpu_scales(rs: Any) -> tuple[float, float, float]:
    """The GPU corrections already in the base (linear, attention, decode: a calibration of this model and GPU,
    :func:`kvplan.models.resolve.gpu_corrections`), else 1: the written scales are relative to the kernel prior."""
    from kvplan.models.resolve import gpu_corrections

    prof = rs.profile
    src = prof if prof.provenance.get("prefill_gpu_scales") or prof.provenance.get("decode_gpu_scale") else None
    name = prof.provenance.get("residuals_from")
    if src is None and isinstance(name, str):
        try:
            src = load_profile(name)
        except KvplanInputError:
            src = None
    got = gpu_corrections(src, rs.arch, rs.node, rs.scenario.deployment.tensor_parallel_size) if src else None
    return (got.linear, got.attention, got.decode) if got is not None else (1.0, 1.0, 1.0)


def _profile(base: Scenario, rs: Any, costs: CostModel, values: dict[str, float], report: dict[str, Any],
             reasons: list[str], sources: list[dict[str, Any]], free: list[str]) -> Profile:
    files = ", ".join(os.path.basename(s["file"]) for s in sources) or "the runs"
    status: Literal["calibrated", "unreliable"] = "unreliable" if reasons else "calibrated"
    lin, att, dec = _base_gpu_scales(rs)
    cs = dict(rs.profile.component_status) or {"prefill.gpu": rs.profile.name, "decode.gpu": rs.profile.name}
    for comp, n in (("prefill.gpu", "prefill.gpu_scale"), ("decode.gpu", "decode.gpu_scale"),
                    ("overhead", "overhead.p_leg_scale")):
        how = "calibrated by simulation" if n in free else "held (not identifiable)"
        what = "p_leg_s " if comp == "overhead" else ""
        cs[comp] = f"{how} ({files}): {what}x {values[n]:.4g} over [{cs.get(comp, rs.profile.name)}]"
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
                    "decode_gpu_scale": dec * values["decode.gpu_scale"], "residuals_from": rs.profile.name,
                    "model": rs.arch.hf_id or rs.arch.name, "hardware": rs.node.name, "tensor_parallel_size": tp},
        notes=notes,
    )
