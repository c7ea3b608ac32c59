"""The sensitivity band of ``kvplan validate``: each prediction again with the GPU compute scaled by its stated error.

A prediction that moves a lot when the kernel prior moves within its own error is a knife edge: the answer
depends on the prior's error, not on the mechanisms kvplan models (e.g. a P/D reading of the llm-d 1P1D runs,
one P at utilisation ~1.05 under the A100 prefill prior, where a few percent on the prefill kernels halves or
doubles the mean TTFT; the tests keep it as their example). The band says so next to every point.

* **Error** (:func:`band_spec`): per component (prefill, decode), the largest relative error the resolved
  GPU compute states: for a kernel-derived prior its ``fit_report`` ``prefill_max_abs_rel_error`` /
  ``decode_max_abs_rel_error`` (the prior's worst point against aiconfigurator's kernel estimates over its whole
  grid, ``calibration/derive.py``); for compute without one (the roofline fallback, a calibrated profile) the
  stated assumption :data:`ASSUMED_GPU_REL_ERROR`; or one value the user gives (``--band-error``). It is the
  prior's error against its kernel source, a lower bound of the kernel error against a real engine, which
  aiconfigurator does not state.
* **Scaling** (:meth:`BandSpec.costs`): every GPU term of prefill (linear and attention,
  :func:`~kvplan.models.costs.scale_prefill_gpu`) and decode (:func:`~kvplan.models.costs.scale_decode_gpu`) of
  the *resolved* costs (what :func:`kvplan.sim.engine.resolve` gives the run: prior, borrowed corrections and
  inline costs) x ``(1 - e)`` (low) and x ``(1 + e)`` (high); engine CPU overheads, proxy legs and transfer
  unchanged. No term goes below its physical bound (:mod:`kvplan.models.bounds`): a term the low side would take
  under it is held at it (prefill: :func:`kvplan.models.resolve.scaled_prefill`, as borrowed corrections are;
  decode: :func:`kvplan.models.resolve.scaled_decode`), and the case's band notes say which.
* **Band** of a point: the lowest and highest of its predictions at low, nominal and high (a statistic need not
  move one way: a faster P sends D more at once). Serving runs are simulated again with the scaled prefill and
  decode costs given inline in full (the ``costs:`` block of a scenario, resolved like any other, same seed);
  curve points evaluate the cost function with the scaled costs (no simulation).
* **Knife edge** (:func:`knife_edge`): a band more than :data:`KNIFE_EDGE_RATIO` x wide (high / low), or wider,
  in log terms, than :data:`KNIFE_EDGE_GAIN` x the widest scaling applied (the prediction amplifies the error).

Nothing is fitted: the band shows how far the stated error moves a prediction; the point prediction is unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from kvplan.models.costs import CostModel

#: Relative GPU-compute error assumed where the resolved compute states none (no kernel prior's fit report: the
#: roofline fallback or a calibrated profile). Stated assumption: the largest worst-point error of a dense-model
#: kernel prior against aiconfigurator that the README's "Costs: kernel-derived priors" quotes is 9.7% (A100
#: decode); 10% takes that as the error of compute that states none.
ASSUMED_GPU_REL_ERROR = 0.10
#: A band wider than this (high / low) is a knife edge (the answer depends on the prior's error).
KNIFE_EDGE_RATIO = 2.0
#: ... or a band whose log-width is more than this multiple of the widest scaling's, ln((1 + e) / (1 - e)).
KNIFE_EDGE_GAIN = 2.0
COMPONENTS = ("prefill", "decode")
FIT_ERROR_KEY = {"prefill": "prefill_max_abs_rel_error", "decode": "decode_max_abs_rel_error"}


@dataclass(frozen=True)
class BandSpec:
    """The scaling of one resolved cost model: per component the stated error, its (low, high) factors, whence."""

    error: dict[str, float]
    factors: dict[str, tuple[float, float]]
    source: dict[str, str]
    bounds: tuple[Any, Any, int]  # (arch, node, tp) of the physical bounds
    notes: tuple[str, ...] = field(default=())

    def costs(self, base: CostModel, side: int) -> CostModel:
        """``base`` with its prefill and decode GPU terms x the low (``side`` 0) or high (1) factor, each term
        held at its physical bound."""
        from kvplan.models.resolve import scaled_decode, scaled_prefill

        arch, node, tp = self.bounds
        fp, fd = self.factors["prefill"][side], self.factors["decode"][side]
        return base.model_copy(update={"prefill": scaled_prefill(base.prefill, fp, fp, arch, node, tp),
                                       "decode": scaled_decode(base.decode, fd, arch, node, tp)})

    def widest_log_scaling(self) -> float:
        """ln(high / low) of the widest component scaling."""
        return max((math.log(hi / lo) for lo, hi in self.factors.values() if lo > 0), default=0.0)

    def describe(self) -> str:
        """One phrase: the factors and where their error comes from."""
        parts = []
        for comp in COMPONENTS:
            lo, hi = self.factors[comp]
            parts.append(f"{comp} x{lo:.4g}-{hi:.4g} ({self.source[comp]})")
        return "GPU compute " + "; ".join(parts)

    def as_dict(self) -> dict[str, Any]:
        """JSON form (the case's ``band.scaling``)."""
        return {"error": dict(self.error), "factors": {k: list(v) for k, v in self.factors.items()},
                "source": dict(self.source), "notes": list(self.notes)}


def _held(base: CostModel, scaled: CostModel, factor: dict[str, float]) -> list[str]:
    """The GPU terms the low side holds at their physical bound (not x their component's factor)."""
    out = []
    for comp, keys in (("prefill", ("per_token_s", "attention_s", "context_attention_s", "linear_knots_s")),
                       ("decode", ("per_seq_s", "per_context_token_s", "context_knots_s", "batch_knots_s"))):
        b, s = getattr(base, comp), getattr(scaled, comp)
        for k in keys:
            bv, sv = getattr(b, k), getattr(s, k)
            pairs = list(zip(bv, sv, strict=True)) if isinstance(bv, tuple) else [(bv, sv)]
            n = sum(1 for x, y in pairs if x is not None and y is not None and x > 0
                    and not math.isclose(y, x * factor[comp], rel_tol=1e-12))
            if n:
                out.append(f"{comp}.{k}" + (f" ({n} of {len(pairs)} knots)" if isinstance(bv, tuple) else ""))
    return out


def _stated_error(rs: Any, comp: str) -> tuple[float, str]:
    """(relative error, where it is stated) of the resolved ``comp`` GPU compute."""
    from kvplan.models.hardware import gpu_key
    from kvplan.models.profile import load_prior

    tp = rs.scenario.deployment.tensor_parallel_size
    prior = load_prior(rs.arch.name, gpu_key(rs.node.gpu), tp)
    status = rs.profile.component_status.get(f"{comp}.gpu", "")
    if prior is not None and status.startswith("kernel-derived") and prior.name in status:
        err = prior.fit_report.get(FIT_ERROR_KEY[comp])
        if isinstance(err, (int, float)) and math.isfinite(err) and 0 <= err < 1:
            return float(err), f"prior {prior.name}'s worst fit error against aiconfigurator, {err:.1%}"
    return ASSUMED_GPU_REL_ERROR, (f"assumed {ASSUMED_GPU_REL_ERROR:.0%}: {rs.profile.name} states no {comp} "
                                   "kernel error (validate_band.ASSUMED_GPU_REL_ERROR)")


def band_spec(rs: Any, band_error: float | None = None) -> BandSpec:
    """The band's scaling of a resolved run (:class:`kvplan.sim.engine.Resolved`): per component the stated
    error (or ``band_error`` for both, a user assumption) and the factors ``(max(1 - e, floor), 1 + e)``."""
    from kvplan.models.arch import get_model

    arch = get_model(rs.scenario.model)  # the bounds resolve checks inline costs against (before the KV dtype)
    tp = rs.scenario.deployment.tensor_parallel_size
    error, factors, source = {}, {}, {}
    for comp in COMPONENTS:
        if band_error is not None:
            e, src = band_error, f"assumed {band_error:.1%} (--band-error)"
        else:
            e, src = _stated_error(rs, comp)
        error[comp], factors[comp], source[comp] = e, (1.0 - e, 1.0 + e), src
    spec = BandSpec(error, factors, source, (arch, rs.node, tp))
    held = _held(rs.costs, spec.costs(rs.costs, 0), {c: factors[c][0] for c in COMPONENTS})
    return replace(spec, notes=(f"low side holds at its physical bound: {', '.join(held)}",)) if held else spec


def knife_edge(low: float, high: float, spec: BandSpec) -> bool:
    """True when the band ``[low, high]`` is more than :data:`KNIFE_EDGE_RATIO` x wide or its log-width more
    than :data:`KNIFE_EDGE_GAIN` x the widest scaling's."""
    if low <= 0:
        return high > 0
    width = math.log(high / low)
    return high / low > KNIFE_EDGE_RATIO or width > KNIFE_EDGE_GAIN * spec.widest_log_scaling()


def band_fields(measured: float, predicted: float | None, low: float | None, high: float | None,
                spec: BandSpec | None) -> dict[str, Any]:
    """A point's added keys: ``predicted_low`` / ``predicted_high`` (the lowest / highest of the point and its two
    scaled predictions), ``in_band`` (the measurement within them), ``knife_edge``; None where there is no band."""
    vals = [v for v in (low, predicted, high) if v is not None and math.isfinite(v)]
    if spec is None or predicted is None or len(vals) < 3:
        return {"predicted_low": None, "predicted_high": None, "in_band": None, "knife_edge": None}
    lo, hi = min(vals), max(vals)
    return {"predicted_low": round(lo, 4), "predicted_high": round(hi, 4), "in_band": bool(lo <= measured <= hi),
            "knife_edge": knife_edge(lo, hi, spec)}


def case_band(points: list[dict[str, Any]], spec: BandSpec | None, why_none: str | None,
              notes: list[str]) -> dict[str, Any] | None:
    """The case's ``band``: its scaling, how many measurements lie inside, the knife edges, and one line."""
    if spec is None:
        return None if why_none is None else {"scaling": None, "points_with_band": 0, "inside": 0,
                                              "knife_edges": [], "notes": [why_none], "line": f"no band: {why_none}"}
    banded = [p for p in points if p["predicted_low"] is not None]
    inside = sum(1 for p in banded if p["in_band"])
    edges = [f"{p['label']} {p['metric']}" for p in banded if p["knife_edge"]]
    shown = [f"{p['label']} {p['metric']} {p['predicted_low']:.4g}-{p['predicted_high']:.4g}"
             for p in banded if p["knife_edge"]]
    line = f"measured inside the band at {inside} of {len(banded)} points"
    if edges:
        more = f" (+{len(shown) - 3} more)" if len(shown) > 3 else ""
        line += (f"; KNIFE EDGE at {len(edges)} (band > {KNIFE_EDGE_RATIO:g}x wide or > {KNIFE_EDGE_GAIN:g}x the "
                 f"scaling: the answer depends on the prior's error): {', '.join(shown[:3])}{more}")
    else:
        line += "; no knife edge"
    return {"scaling": spec.as_dict(), "points_with_band": len(banded), "inside": inside, "knife_edges": edges,
            "notes": list(spec.notes) + notes, "line": f"{line} ({spec.describe()})"}
