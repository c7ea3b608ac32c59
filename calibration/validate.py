"""``kvplan validate``: kvplan's predictions against public measurements it was not fitted on.

The cases are small YAML files shipped in ``calibration/validation/`` (source, setup, licence, the
scenario that stands for the setup, what kvplan cannot express about it, the measured values; see the
README there). Every prediction goes through the profile resolution a simulation uses
(:func:`kvplan.sim.engine.resolve`), so a case gets better or worse exactly as ``kvplan simulate`` would:

* ``prefill_curve``: :func:`~kvplan.models.costs.prefill_time_s` of the input alone on the engine;
* ``decode_curve``: :func:`~kvplan.models.costs.decode_step_time_s` at the point's batch and context;
* ``serving``: a simulation of the run (:func:`kvplan.sim.api.run`): single-turn requests with the measured
  input/output lengths, closed loop at the measured concurrency or open loop at the measured rate, seed 0;
  and its **seed spread**: the same run under seeds :data:`SPREAD_SEEDS` (arrival times, sampled prompt lengths,
  random routing draws), the sampling spread of a finite run, of which the measured run is one draw too;
* ``published``: the P5en points of ``kvplan reproduce``, reported as fitted, in-sample.

Every predicted curve point and serving statistic also gets a sensitivity band (:mod:`.validate_band`): the
same prediction with the resolved GPU compute of prefill and decode scaled by its stated error, x(1 - e) and
x(1 + e) (serving runs: two more simulations each, same seed), whether the measurement lies inside it, and
whether it is a knife edge (the answer depends on the prior's error).

A case kvplan cannot predict at all (an unknown preset, no profile, a setup outside the model) keeps
its measured points with no prediction and says why; what a case can only approximate is listed as
"not expressible" next to its numbers. Pure: no printing, no files.
"""

from __future__ import annotations

import json
import math
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator, model_validator

from kvplan.calibration.validate_band import BandSpec, band_fields, band_spec, case_band
from kvplan.errors import KvplanInputError, input_error
from kvplan.safe_yaml import load_yaml_text

Kind = Literal["prefill_curve", "decode_curve", "serving", "published"]
MAX_CASE_BYTES = 256 * 1024
#: Most engine-side prompt lengths a run may list (the inline bound of an empirical distribution).
MAX_ENGINE_INPUT_VALUES = 10_000
SEED = 0
#: Seeds of a serving run's seed spread (the prediction is SEED's): four draws of the run's random parts.
SPREAD_SEEDS = (0, 1, 2, 3)
#: Measured serving metric -> (``summary.json`` key or ``latency``, unit label). Every key is a contract of the case files.
SERVING_METRICS: dict[str, str] = {
    "ttft_mean_ms": "ttft_mean_s",
    "ttft_p50_ms": "ttft_p50_s",
    "ttft_p90_ms": "ttft_p90_s",
    "tpot_mean_ms": "tpot_mean_s",
    "tpot_p50_ms": "tpot_p50_s",
    "itl_p50_ms": "itl_p50_s",  # benchmark_serving's median_itl_ms: every inter-token gap of every request pooled
    "itl_p99_ms": "itl_p99_s",
    "latency_mean_ms": "latency",
}


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Source(_Frozen):
    """Where the measured numbers come from."""

    repository: str = Field(description="Repository or publication.")
    path: str = Field(description="File(s) inside it.")
    commit: str = Field(description="Commit the values were taken at ('-' for an article).")
    licence: str = Field(description="Licence of the values and how they are used here.")


class Run(_Frozen):
    """One measured serving run."""

    label: str = Field(description="Short name of the run.")
    arrival: dict[str, Any] = Field(description="closed_loop {clients} or poisson {rate_per_s}.")
    requests: int = Field(gt=0, le=100_000, description="Requests sent.")
    input_tokens: int = Field(gt=0, description="Input length of every request.")
    output_tokens: int = Field(gt=0, description="Output length of every request.")
    measured: dict[str, float] = Field(description="Measured metrics (keys of SERVING_METRICS).")
    deployment: dict[str, Any] = Field(
        default_factory=dict, description="Deployment fields of this run over the case's (e.g. its replica count)."
    )
    engine_input_tokens: list[StrictInt] | None = Field(
        default=None,
        description="Prompt lengths the engine saw (tokens it prefilled), when they differ from the nominal "
        "input_tokens the client reported: each simulated request draws its prompt length from these values "
        "(an empirical distribution, seeded). input_tokens stays the nominal length of the source.",
    )
    engine_input_tokens_source: str | None = Field(
        default=None, description="How engine_input_tokens were derived (required with them)."
    )

    @field_validator("engine_input_tokens")
    @classmethod
    def _engine_lengths(cls, v: list[int] | None) -> list[int] | None:
        if v is None:
            return v
        if not v:
            raise ValueError("is empty: list the engine-side prompt lengths, or drop the field")
        if len(v) > MAX_ENGINE_INPUT_VALUES:
            raise ValueError(f"{len(v):,} values (at most {MAX_ENGINE_INPUT_VALUES:,}): give quantiles of them")
        if min(v) <= 0:
            raise ValueError(f"holds {min(v)}: every prompt length must be a positive token count")
        return v

    @model_validator(mode="after")
    def _engine_source(self) -> Run:
        if (self.engine_input_tokens is None) != (self.engine_input_tokens_source is None):
            raise ValueError("engine_input_tokens and engine_input_tokens_source go together: give both or neither")
        if self.engine_input_tokens_source is not None and not self.engine_input_tokens_source.strip():
            raise ValueError("engine_input_tokens_source is empty: say how the lengths were derived")
        return self


class Case(_Frozen):
    """One validation case (a YAML file in ``calibration/validation/``)."""

    name: str
    title: str
    kind: Kind
    source: Source
    setup: str
    scenario: dict[str, Any] | None = Field(default=None, description="Model, hardware, deployment, policy.")
    predicts: str = Field(description="What kvplan computes for the points.")
    not_expressible: list[str] = Field(default_factory=list, description="What kvplan cannot express here.")
    modelled: list[str] = Field(default_factory=list, description="What kvplan models of this setup (its mechanisms).")
    expressible: str | None = Field(default=None, description="Why no prediction is possible at all.")
    in_sample: str | None = Field(default=None, description="Set when kvplan is fitted to these points.")
    points: list[list[float]] = Field(default_factory=list, description="Curve points.")
    runs: list[Run] = Field(default_factory=list, description="Serving runs.")


def _cases_dir() -> Path:
    return Path(str(resources.files("kvplan.calibration").joinpath("validation")))


def case_names() -> list[str]:
    """Names of the shipped validation cases, sorted."""
    return sorted(p.stem for p in _cases_dir().glob("*.yaml"))


def load_case(name: str) -> Case:
    """Load one shipped case by name (one-line error naming the valid cases otherwise)."""
    names = case_names()
    if name not in names:
        raise input_error("--case", f"unknown case '{name}'", f"use one of {', '.join(names)}")
    path = _cases_dir() / f"{name}.yaml"
    if path.stat().st_size > MAX_CASE_BYTES:
        raise input_error(str(path), "validation case larger than 256 KiB")
    raw = load_yaml_text(path.read_text(encoding="utf-8"), str(path))  # a key given twice is an error, not the last
    try:
        case = Case.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise input_error(str(path), f"malformed validation case: field '{loc}': {err['msg']}") from None
    if case.name != name:
        raise input_error(str(path), f"case name '{case.name}' differs from the file name")
    return case


# --- predictions ----------------------------------------------------------------------------------------------


def _point(label: str, metric: str, measured: float, predicted: float | None) -> dict[str, Any]:
    rel = (predicted - measured) / measured if predicted is not None and measured else None
    return {
        "label": label,
        "metric": metric,
        "measured": round(measured, 4),
        "predicted": round(predicted, 4) if predicted is not None else None,
        "rel_error": round(rel, 5) if rel is not None else None,
    }


def _resolved(case: Case) -> tuple[Any, Any, str | None]:
    """(scenario, Resolved, None) or (None, None, why kvplan cannot express it)."""
    from kvplan.sim.engine import resolve
    from kvplan.sim.scenario import scenario_from_dict

    if case.expressible is not None:
        return None, None, case.expressible
    if case.scenario is None:
        return None, None, "the case gives no scenario"
    try:
        sc = scenario_from_dict(dict(case.scenario), where=f"case {case.name}")
        return sc, resolve(sc), None
    except KvplanInputError as exc:
        return None, None, str(exc)


def _banded(point: dict[str, Any], low: float | None, high: float | None, spec: BandSpec | None) -> dict[str, Any]:
    """``point`` with its band keys (after the existing ones)."""
    return {**point, **band_fields(point["measured"], point["predicted"], low, high, spec)}


def _prefill_curve(case: Case, sc: Any, rs: Any, spec: BandSpec | None) -> list[dict[str, Any]]:
    from kvplan.models.costs import prefill_time_s

    chunk = sc.deployment.max_num_batched_tokens if sc is not None else 0
    sides = [spec.costs(rs.costs, k).prefill for k in (0, 1)] if spec is not None else []
    out = []
    for isl, ms in case.points:
        pred = prefill_time_s(rs.costs.prefill, int(isl), 0, chunk) * 1e3 if rs is not None else None
        band: list[float | None] = [prefill_time_s(c, int(isl), 0, chunk) * 1e3 for c in sides] or [None, None]
        out.append(_banded(_point(f"ISL {int(isl)}", "ttft_ms", ms, pred), band[0], band[1], spec))
    return out


def _decode_curve(case: Case, rs: Any, spec: BandSpec | None) -> list[dict[str, Any]]:
    from kvplan.models.costs import decode_step_time_s

    sides = [spec.costs(rs.costs, k).decode for k in (0, 1)] if spec is not None else []
    out = []
    for batch, ctx, ms in case.points:
        b = int(batch)
        pred = decode_step_time_s(rs.costs.decode, b, b * ctx) * 1e3 if rs is not None else None
        band: list[float | None] = [decode_step_time_s(c, b, b * ctx) * 1e3 for c in sides] or [None, None]
        out.append(_banded(_point(f"batch {b}, context {int(ctx)}", "itl_ms", ms, pred), band[0], band[1], spec))
    return out


def run_scenario(case: Case, run: Run, gpu_costs: Any = None, seed: int = SEED) -> Any:
    """The scenario a serving run stands for: the case's deployment (the run's own fields over it), single-turn
    requests as measured: the nominal prompt length, or one drawn per request from the run's
    ``engine_input_tokens`` (what the engine prefilled, when the client reported another length).

    ``gpu_costs`` (a :class:`~kvplan.models.costs.CostModel`, the band's scaled costs) puts its prefill and decode
    components inline in full (the scenario's ``costs:`` block; the case's own inline transfer and overhead kept),
    resolved by the simulation like any other scenario."""
    from kvplan.sim.scenario import scenario_from_dict

    arrival = dict(run.arrival)
    if arrival.get("kind") == "closed_loop":
        arrival.setdefault("max_active_conversations", arrival.get("clients", 1))
    data = dict(case.scenario or {})
    if run.deployment:
        data["deployment"] = {**dict(data.get("deployment") or {}), **run.deployment}
    data["workload"] = {
        "conversations": run.requests,
        "arrival": arrival,
        "turns": {"dist": "constant", "value": 1},
        "prefix_tokens": (
            {"dist": "constant", "value": run.input_tokens}
            if run.engine_input_tokens is None
            else {"dist": "empirical", "values": [float(v) for v in run.engine_input_tokens]}
        ),
        "user_tokens": {"dist": "constant", "value": 0},
        "output_tokens": {"dist": "constant", "value": run.output_tokens},
        "turn_gap_s": {"dist": "constant", "value": 0},
    }
    data["seed"] = seed
    if gpu_costs is not None:
        data["costs"] = {**dict(data.get("costs") or {}), "prefill": gpu_costs.prefill.model_dump(mode="python"),
                         "decode": gpu_costs.decode.model_dump(mode="python")}
    return scenario_from_dict(data, where=f"case {case.name}, {run.label}")


def _metrics_ms(res: Any) -> dict[str, float]:
    """The serving metrics of one simulated run, in ms (NaN where the run has none)."""
    ok = res.turns[res.turns["decision"] != "error"]
    latency = float((ok["finish_s"] - ok["arrival_s"]).mean()) if len(ok) else math.nan
    return {metric: (latency if key == "latency" else float(res.summary.get(key, math.nan))) * 1e3
            for metric, key in SERVING_METRICS.items()}


def _finite(v: float | None) -> float | None:
    return v if v is not None and math.isfinite(v) else None


def _seed_spread(case: Case, r: Run, nominal: dict[str, float], notes: list[str]) -> list[dict[str, float]]:
    """The run's metrics under every seed of :data:`SPREAD_SEEDS` (``nominal``: SEED's, already simulated)."""
    from kvplan.sim.api import run as simulate

    out = []
    for seed in SPREAD_SEEDS:
        if seed == SEED:
            out.append(nominal)
            continue
        try:
            out.append(_metrics_ms(simulate(run_scenario(case, r, seed=seed), seed)))
        except KvplanInputError as exc:
            notes.append(f"no seed {seed} draw for {r.label}: {exc}")
    return out


def seed_fields(measured: float, draws: list[float | None]) -> dict[str, Any]:
    """A point's seed-spread keys: ``seed_low`` / ``seed_high`` (the lowest / highest prediction over the seeds)
    and ``in_seed_spread`` (the measurement within them); None without every draw."""
    vals = [v for v in draws if v is not None and math.isfinite(v)]
    if len(vals) < len(SPREAD_SEEDS):
        return {"seed_low": None, "seed_high": None, "in_seed_spread": None}
    lo, hi = min(vals), max(vals)
    return {"seed_low": round(lo, 4), "seed_high": round(hi, 4), "in_seed_spread": bool(lo <= measured <= hi)}


def case_seed_spread(points: list[dict[str, Any]], notes: list[str]) -> dict[str, Any] | None:
    """The case's ``seed_spread``: how many measurements lie within the spread of the seeds, and the widest."""
    spread = [p for p in points if p.get("seed_low") is not None]
    if not spread:
        return None
    inside = sum(1 for p in spread if p["in_seed_spread"])
    widest = max(spread, key=lambda p: p["seed_high"] / p["seed_low"] if p["seed_low"] > 0 else math.inf)
    width = widest["seed_high"] / widest["seed_low"] - 1 if widest["seed_low"] > 0 else math.inf
    seeds = f"{SPREAD_SEEDS[0]}-{SPREAD_SEEDS[-1]}"
    line = f"measured within the spread of seeds {seeds} at {inside} of {len(spread)} points; "
    if width < 1e-9:
        line += "every seed gives the same prediction (nothing in these runs is drawn at random)"
    else:
        line += (f"widest: {widest['label']} {widest['metric']} {widest['seed_low']:.4g}-{widest['seed_high']:.4g} "
                 f"(+{width:.1%}): the sampling spread of a run this long (arrival times, sampled prompt lengths, "
                 "random routing), of which the measured run is one draw")
    return {"seeds": list(SPREAD_SEEDS), "points_with_spread": len(spread), "inside": inside,
            "deterministic": width < 1e-9, "notes": notes, "line": line}


def _run_band(case: Case, r: Run, sc: Any, band_error: float | None,
              notes: list[str]) -> tuple[BandSpec | None, list[dict[str, float]]]:
    """The run's band scaling and its two scaled simulations' metrics (low, high), or (None, []) with a note
    (``sc``: the run's nominal scenario, :func:`run_scenario`)."""
    from kvplan.sim.api import run as simulate
    from kvplan.sim.engine import resolve

    dep = sc.deployment
    if {dep.prefill_tensor_parallel_size or dep.tensor_parallel_size,
            dep.decode_tensor_parallel_size or dep.tensor_parallel_size} != {dep.tensor_parallel_size}:
        notes.append(f"no band for {r.label}: P and D at different TP resolve different costs (one inline block "
                     "cannot scale both)")
        return None, []
    rs = resolve(sc)
    spec = band_spec(rs, band_error)
    sides: list[dict[str, float]] = []
    for k, name in ((0, "low"), (1, "high")):
        try:
            sides.append(_metrics_ms(simulate(run_scenario(case, r, spec.costs(rs.costs, k)), SEED)))
        except KvplanInputError as exc:  # e.g. the slower side never drains: say so, keep the point
            notes.append(f"no {name} side of the band for {r.label}: {exc}")
            sides.append({})
    return spec, sides


def _serving(case: Case, rs: Any, why_not: list[str], band_error: float | None,
             band_notes: list[str], seed_notes: list[str]) -> tuple[list[dict[str, Any]], BandSpec | None]:
    from kvplan.sim.api import run as simulate

    out = []
    first: BandSpec | None = None
    done: dict[str, tuple[Any, ...]] = {}  # repeated runs of one setup (the same scenario) are simulated once
    for r in case.runs:
        unknown = set(r.measured) - set(SERVING_METRICS)
        if unknown:
            raise input_error(f"case {case.name}", f"unknown measured metric(s) {sorted(unknown)}")
        pred: dict[str, float] = {}
        res = sc = None
        spec: BandSpec | None = None
        sides: list[dict[str, float]] = []
        draws: list[dict[str, float]] = []
        same = json.dumps(r.model_dump(mode="json", exclude={"label", "measured"}), sort_keys=True)
        if rs is not None and same in done:
            res, pred, spec, sides, draws = done[same]
        elif rs is not None:
            try:
                sc = run_scenario(case, r)
                res = simulate(sc, SEED)
            except KvplanInputError as exc:  # e.g. a request beyond the model's context: say so, keep going
                why_not.append(f"no prediction for {r.label}: {exc}")
        if res is not None:
            cut = int(res.summary.get("truncated_conversations", 0))
            if cut:
                why_not.append(f"{'no prediction for ' if cut == r.requests else ''}{r.label}: {cut} of {r.requests} "
                               f"requests exceed the model's context limit (vLLM rejects them; kvplan does not send them)")
            if same not in done:
                pred = _metrics_ms(res)
                spec, sides = _run_band(case, r, sc, band_error, band_notes)
                draws = _seed_spread(case, r, pred, seed_notes)
                done[same] = (res, pred, spec, sides, draws)
            first = first or spec
        for metric, measured in r.measured.items():
            point = _point(r.label, metric, measured, _finite(pred.get(metric)))
            low, high = (_finite(sides[0].get(metric)), _finite(sides[1].get(metric))) if sides else (None, None)
            out.append({**_banded(point, low, high, spec),
                        **seed_fields(measured, [_finite(d.get(metric)) for d in draws])})
    return out, first


def _published() -> tuple[list[dict[str, Any]], str]:
    from kvplan.calibration.reproduce import reproduce_rows

    rows = reproduce_rows(published_only=True)
    pts = [  # fitted, in-sample: no band (its keys present, None)
        _banded(_point(f"{r['model']} {r['prompt_tokens']}", r["series"] + "_ms", r["published_ms"], r["simulated_ms"]),
                None, None, None)
        for r in rows
    ]
    profiles = sorted({f"p5en-{r['model']}" for r in rows})
    return pts, ", ".join(profiles)


def _summary(points: list[dict[str, Any]]) -> dict[str, Any]:
    errs = np.array([abs(p["rel_error"]) for p in points if p["rel_error"] is not None], dtype=float)
    return {
        "points": len(points),
        "predicted": int(errs.size),
        "mape_pct": round(float(errs.mean() * 100), 2) if errs.size else None,
        "max_abs_error_pct": round(float(errs.max() * 100), 2) if errs.size else None,
    }


def validate_case(case: Case, band_error: float | None = None) -> dict[str, Any]:
    """Measured vs predicted for one case, with its summary, its sensitivity band (``band_error``: one relative
    GPU-compute error for both components instead of the stated ones) and what kvplan cannot express."""
    not_expr = list(case.not_expressible)
    profile = None
    band_notes: list[str] = []
    seed_notes: list[str] = []
    spec: BandSpec | None = None
    no_band: str | None = None
    if case.kind == "published":
        points, profile = _published()
        status = "fitted, in-sample"
        no_band = "fitted, in-sample points (the calibration target)"
    else:
        sc, rs, why = _resolved(case)
        if why is not None:
            not_expr.insert(0, f"no prediction: {why}")
            no_band = "no prediction"
        else:
            profile = f"{rs.profile.name} ({rs.profile.status})"
        if case.kind in ("prefill_curve", "decode_curve"):
            spec = band_spec(rs, band_error) if rs is not None else None
            points = _prefill_curve(case, sc, rs, spec) if case.kind == "prefill_curve" else _decode_curve(case, rs, spec)
        else:
            points, spec = _serving(case, rs, not_expr, band_error, band_notes, seed_notes)
            if spec is None and no_band is None:
                no_band = "; ".join(band_notes) or "no run was simulated"
        status = "not expressible" if rs is None else ("fitted, in-sample" if case.in_sample else "predicted, not fitted")
    points = [p if "seed_low" in p else {**p, **seed_fields(p["measured"], [])} for p in points]  # one schema
    return {
        "name": case.name,
        "title": case.title,
        "kind": case.kind,
        "status": status,
        "source": case.source.model_dump(),
        "setup": case.setup,
        "scenario": case.scenario,
        "profile": profile,
        "predicts": case.predicts,
        "in_sample": case.in_sample,
        "not_expressible": not_expr,
        "modelled": list(case.modelled),
        "points": points,
        "summary": _summary(points),
        "band": case_band(points, spec, no_band, band_notes),
        "seed_spread": case_seed_spread(points, seed_notes),
    }


def validate(names: list[str] | None = None, band_error: float | None = None) -> list[dict[str, Any]]:
    """Run the named cases (every shipped case when ``None`` or empty), in the order given, a name given twice
    once; ``band_error`` replaces the stated GPU-compute errors of the band (:func:`validate_case`)."""
    if band_error is not None and not (math.isfinite(band_error) and 0 < band_error < 1):
        raise input_error("--band-error", f"{band_error} is not a relative error in (0, 1)", "give e.g. 0.05 for 5%")
    chosen = list(dict.fromkeys(names or case_names()))  # --case X --case X: X once, first-seen order
    cases = [load_case(n) for n in chosen]  # every name checked before any work
    return [validate_case(c, band_error) for c in cases]


def json_ready(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Results with NaN/inf as None (strict JSON)."""
    from kvplan.sim.results import json_safe

    out: list[dict[str, Any]] = json_safe(results)
    return out


def _band_summary(band: dict[str, Any] | None) -> str:
    """The markdown table's band cell: measurements inside the band, knife edges."""
    if band is None or band["scaling"] is None:
        return "-"
    edges = len(band["knife_edges"])
    return (f"{band['inside']}/{band['points_with_band']} inside"
            + (f", **{edges} knife edge{'s' if edges > 1 else ''}**" if edges else ""))


def _seed_summary(spread: dict[str, Any] | None) -> str:
    """The markdown table's seed-spread cell: measurements within the spread of the seeds, or that none moves."""
    if spread is None:
        return "-"
    if spread["deterministic"]:
        return "no random part"
    return f"{spread['inside']}/{spread['points_with_spread']} within"


def markdown_table(results: list[dict[str, Any]]) -> str:
    """The per-case summary as a Markdown table (what the README shows): the first not-expressible item per case,
    how many measurements lie inside the sensitivity band, with its knife edges, and within the seed spread."""
    lines = [
        "| case | status | profile | points predicted | MAPE | max abs error | not expressible | band | seeds 0-3 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r["summary"]
        mape = f"{s['mape_pct']:.1f}%" if s["mape_pct"] is not None else "-"
        mx = f"{s['max_abs_error_pct']:.1f}%" if s["max_abs_error_pct"] is not None else "-"
        ne = r["not_expressible"]
        why = ne[0] + (f" (+{len(ne) - 1} more)" if len(ne) > 1 else "") if ne else "-"
        lines.append(
            f"| `{r['name']}` | {r['status']} | {r['profile'] or '-'} | {s['predicted']}/{s['points']} | {mape} | {mx} "
            f"| {why.replace('|', '/')} | {_band_summary(r.get('band'))} | {_seed_summary(r.get('seed_spread'))} |"
        )
    return "\n".join(lines) + "\n"
