"""Pure fits of the cost model (``models/costs.py``) to measured points.

Each fit targets one pure function of :mod:`kvplan.models.costs` and is *linear in its parameters*, so
the design matrix is written down exactly (no approximation) and solved with
:func:`scipy.optimize.least_squares` under bounds (every cost parameter is >= 0):

* prefill (:func:`fit_prefill`): ``prefill_time_s(cost, new, cached, chunk)`` =
  ``fixed_s x steps + per_token_s x new + attention_s x sum over chunks of causal_pairs`` (chunking at
  ``max_num_batched_tokens`` is respected: a 24k-token prompt is 3 steps of at most 8192 tokens);
* NIXL transfer per TP rank (:func:`fit_xfer`): ``xfer_time_s`` = ``fixed_s + per_descriptor_s x d +
  per_byte_s x bytes`` (NIXL xferDuration, which contains the post), and the post time (:func:`fit_post`) =
  ``post_fixed_s + post_per_descriptor_s x d`` (postDuration, the part of xferDuration spent posting;
  reported, never added to the pull);
* decode step (:func:`fit_decode`): ``decode_step_time_s`` = ``fixed_s + per_seq_s x batch +
  per_context_token_s x sum of contexts``.

Noise is taken as multiplicative (timings scatter by a few percent), so residuals are relative:
``(predicted - observed) / observed``. Standard errors come from the Jacobian of the weighted residuals,
``cov = s^2 (J^T J)^-1`` with ``s^2 = RSS / (m - p)``.

Identifiability is checked, never assumed: columns of the (column-normalised, weighted) design that are
numerically dependent (rank deficiency, e.g. bytes and descriptors that both scale with tokens for one
model, or a single input length) cannot be separated by any data of this shape. The parameter the caller
ranks least identifiable is then *held* at its given value (a prior or a base profile's value) and the
result says so, with the reason, instead of inventing a number. Parameters whose relative standard error
exceeds :data:`POORLY_DETERMINED_REL_SE` are flagged as poorly determined.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvplan.calibration.fit_solve import (
    _fit_free,
    _held_parameters,
)
from kvplan.errors import input_error
from kvplan.models.costs import causal_pairs

MS_PER_S = 1000.0
#: Residuals kept per metric in a JSON report (all of them enter the fit and its MAPE).
MAX_REPORTED_RESIDUALS = 400


@dataclass(frozen=True)
class ParamEstimate:
    """One fitted (or held) parameter.

    ``status`` is ``fitted``, ``at_bound`` (the optimum sits on the bound, e.g. 0: its standard error is
    not meaningful), ``held`` (not identifiable from these data: kept at ``value`` given by the caller),
    or ``poorly_determined`` (fitted, but relative standard error > 50 %).
    """

    name: str
    value: float
    stderr: float
    status: str
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form (NaN standard errors become ``None``)."""
        return {
            "name": self.name,
            "value": self.value,
            "stderr": None if not math.isfinite(self.stderr) else self.stderr,
            "status": self.status,
            "note": self.note,
        }


@dataclass(frozen=True)
class FitResult:
    """The outcome of one fit: parameters, residuals and error metrics.

    ``residuals`` holds one dict per observation: ``metric``, ``x`` (tokens or batch), ``observed`` and
    ``predicted`` (ms for times), ``rel_error``. ``mape_pct`` is the mean absolute percentage error per
    metric. ``notes`` explain every held parameter and every caveat of the data.
    """

    target: str
    params: tuple[ParamEstimate, ...]
    residuals: tuple[dict[str, Any], ...]
    mape_pct: Mapping[str, float]
    n_obs: int
    dof: int
    notes: tuple[str, ...] = field(default_factory=tuple)

    def values(self) -> dict[str, float]:
        """Parameter values keyed by their dotted names (``prefill.per_token_s``...)."""
        return {p.name: p.value for p in self.params}

    def stderrs(self) -> dict[str, float]:
        """Standard errors of the fitted parameters (held parameters are left out)."""
        return {p.name: p.stderr for p in self.params if p.status != "held" and math.isfinite(p.stderr)}

    def param(self, name: str) -> ParamEstimate:
        """The estimate of one parameter by dotted name."""
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def to_report(self, max_residuals: int = MAX_REPORTED_RESIDUALS) -> dict[str, Any]:
        """JSON-able report (parameters, MAPE per metric, residuals, notes).

        At most ``max_residuals`` residuals per metric are kept, evenly spaced (a bench file can hold tens
        of thousands of ITLs; the MAPE is computed on all of them).
        """
        return {
            "target": self.target,
            "n_obs": self.n_obs,
            "dof": self.dof,
            "params": [p.to_dict() for p in self.params],
            "mape_pct": dict(self.mape_pct),
            "residuals": self.residual_sample(max_residuals),
            "notes": list(self.notes),
        }

    def residual_sample(self, max_residuals: int = MAX_REPORTED_RESIDUALS) -> list[dict[str, Any]]:
        """At most ``max_residuals`` residuals per metric, evenly spaced in observation order."""
        out: list[dict[str, Any]] = []
        for metric in dict.fromkeys(r["metric"] for r in self.residuals):
            rows = [r for r in self.residuals if r["metric"] == metric]
            idx = np.unique(np.linspace(0, len(rows) - 1, min(len(rows), max_residuals)).astype(int))
            out += [dict(rows[i]) for i in idx.tolist()]
        return out


def _validate(name: str, arr: np.ndarray, *, positive: bool = False) -> None:
    if arr.ndim != 1 or arr.size == 0:
        raise input_error(f"fit {name}", "needs a non-empty 1-d array")
    if not np.all(np.isfinite(arr)):
        raise input_error(f"fit {name}", "contains NaN or infinite values")
    if positive and np.any(arr <= 0):
        raise input_error(f"fit {name}", "timings must be > 0")
    if np.any(arr < 0):
        raise input_error(f"fit {name}", "contains negative values")


def fit_linear(
    target: str,
    design: np.ndarray,
    observed: np.ndarray,
    names: Sequence[str],
    held_values: Mapping[str, float],
    hold_order: Sequence[str],
    *,
    metrics: Sequence[str],
    xs: Sequence[float] | np.ndarray,
    weights: np.ndarray | None = None,
    observed_scale: float = MS_PER_S,
    notes: Sequence[str] = (),
    reasons: Mapping[str, str] | None = None,
    force_hold: Mapping[str, str] | None = None,
    lower_bounds: Mapping[str, float] | None = None,
) -> FitResult:
    """Fit ``observed ~ design @ theta`` with ``theta >= lower`` on relative residuals, holding what is not
    identifiable. ``lower_bounds[name]`` (default 0) is the parameter's physical bound (models/bounds.py).

    ``design`` is ``m x p`` (column ``j`` multiplies parameter ``names[j]``); ``observed`` is > 0.
    ``held_values[name]`` is the value used when ``name`` has to be held (prior or base profile), and
    ``hold_order`` lists the parameters from least to most identifiable *a priori*: when the design is
    rank deficient the first of them involved in a null direction is held, and the check repeats.
    ``weights`` multiply the relative residuals (e.g. sqrt of a count). ``observed_scale`` converts
    seconds to the units of the residual report (ms). ``reasons[name]`` explains a structural hold;
    ``force_hold[name]`` holds a parameter the caller knows the data cannot inform (with the reason).
    """
    x = np.asarray(design, dtype=np.float64)
    y = np.asarray(observed, dtype=np.float64)
    _validate(f"{target} observations", y, positive=True)
    m, p = x.shape
    if len(names) != p:
        raise ValueError("names and design columns differ")  # programming error
    w = np.ones(m) if weights is None else np.asarray(weights, dtype=np.float64)
    a = x * (w / y)[:, None]  # weighted relative design: residual = a @ theta - w
    held = _held_parameters(a, names, hold_order, dict(force_hold or {}), reasons or {})
    free = [j for j in range(p) if names[j] not in held]
    theta = np.array([float(held_values.get(n, 0.0)) if n in held else 0.0 for n in names])
    status = {names[j]: "held" for j in range(p) if names[j] in held}
    note_list = list(notes)
    stderr = np.full(p, math.nan)
    dof = m
    if free:
        dof = _fit_free(a, w, theta, free, names, stderr, status, note_list, lower_bounds)
    pred = x @ theta
    params = tuple(
        ParamEstimate(
            name=names[j],
            value=float(theta[j]),
            stderr=float(stderr[j]),
            status=status[names[j]],
            note=(f"not identifiable: {held[names[j]]}; held at {theta[j]:.6g}" if names[j] in held else ""),
        )
        for j in range(p)
    )
    for name, why in held.items():
        note_list.append(f"{name} not identifiable ({why}); held at {held_values.get(name, 0.0):.6g}")
    residuals, mape = _residual_report(y, pred, metrics, xs, observed_scale)
    return FitResult(target=target, params=params, residuals=residuals, mape_pct=mape, n_obs=m, dof=int(dof),
                     notes=tuple(note_list))


def _residual_report(y: np.ndarray, pred: np.ndarray, metrics: Sequence[str], xs: Sequence[float] | np.ndarray,
                     observed_scale: float) -> tuple[tuple[dict[str, Any], ...], dict[str, float]]:
    """One residual row per observation and the MAPE per metric."""
    m = len(y)
    residuals = tuple(
        {
            "metric": str(metrics[i]),
            "x": float(xs[i]),
            "observed": float(y[i] * observed_scale),
            "predicted": float(pred[i] * observed_scale),
            "rel_error": float((pred[i] - y[i]) / y[i]),
        }
        for i in range(m)
    )
    mape: dict[str, float] = {}
    for metric in dict.fromkeys(str(mm) for mm in metrics):
        idx = [i for i in range(m) if str(metrics[i]) == metric]
        mape[metric] = float(np.mean(np.abs((pred[idx] - y[idx]) / y[idx])) * 100.0)
    return residuals, mape


# --- prefill ------------------------------------------------------------------------------------------------

PREFILL_NAMES = ("prefill.fixed_s", "prefill.per_token_s", "prefill.attention_s")


def prefill_design(new_tokens: np.ndarray, cached_tokens: np.ndarray, chunk_tokens: int = 8192) -> np.ndarray:
    """Columns ``[steps, new tokens, causal pairs]`` of ``prefill_time_s`` for each (new, cached) row.

    Row ``i`` dotted with ``(fixed_s, per_token_s, attention_s)`` equals
    ``prefill_time_s(PrefillCost(...), new[i], cached[i], chunk_tokens)`` exactly.
    """
    new = np.asarray(new_tokens, dtype=np.int64)
    cached = np.asarray(cached_tokens, dtype=np.int64)
    out = np.zeros((new.size, 3))
    for i, (n, c) in enumerate(zip(new.tolist(), cached.tolist(), strict=True)):
        done = 0
        steps = 0
        pairs = 0.0
        while done < n:
            chunk = min(chunk_tokens, n - done)
            pairs += causal_pairs(chunk, c + done)
            done += chunk
            steps += 1
        out[i] = (steps, n, pairs)
    return out


def fit_prefill(
    new_tokens: Sequence[int] | np.ndarray,
    cached_tokens: Sequence[int] | np.ndarray,
    seconds: Sequence[float] | np.ndarray,
    *,
    held_values: Mapping[str, float] | None = None,
    chunk_tokens: int = 8192,
    metrics: Sequence[str] | None = None,
    weights: np.ndarray | None = None,
    notes: Sequence[str] = (),
    force_hold: Mapping[str, str] | None = None,
    lower_bounds: Mapping[str, float] | None = None,
) -> FitResult:
    """Fit ``PrefillCost`` (``fixed_s``, ``per_token_s``, ``attention_s``) to measured prefill times.

    ``new_tokens[i]`` tokens computed on top of ``cached_tokens[i]`` took ``seconds[i]``. With a single
    prompt length, or no variation in context, some parameters are not identifiable: ``attention_s`` is
    held first, then ``fixed_s`` (values from ``held_values``, default 0).
    """
    new = np.asarray(new_tokens, dtype=np.float64)
    cached = np.asarray(cached_tokens, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    _validate("prefill new tokens", new)
    _validate("prefill cached tokens", cached)
    if not (new.size == cached.size == y.size):
        raise input_error("fit prefill", f"{new.size} token counts, {cached.size} cached counts, {y.size} times")
    design = prefill_design(new.astype(np.int64), cached.astype(np.int64), chunk_tokens)
    return fit_linear(
        "prefill",
        design,
        y,
        PREFILL_NAMES,
        dict(held_values or {}),
        ("prefill.attention_s", "prefill.fixed_s", "prefill.per_token_s"),
        metrics=list(metrics) if metrics is not None else ["prefill"] * y.size,
        xs=new + cached,
        weights=weights,
        notes=notes,
        force_hold=force_hold,
        lower_bounds=lower_bounds,
    )


# --- transfer -----------------------------------------------------------------------------------------------

XFER_NAMES = ("transfer.fixed_s", "transfer.per_descriptor_s", "transfer.per_byte_s")
POST_NAMES = ("transfer.post_fixed_s", "transfer.post_per_descriptor_s")
BYTES_DESCRIPTOR_REASON = (
    "bytes and descriptors both scale with the tokens moved (same model and block size), so their costs "
    "cannot be told apart; held at the link's line rate"
)


def fit_xfer(
    descriptors: Sequence[float] | np.ndarray,
    bytes_per_rank: Sequence[float] | np.ndarray,
    seconds: Sequence[float] | np.ndarray,
    *,
    per_byte_s_prior: float,
    held_values: Mapping[str, float] | None = None,
    weights: np.ndarray | None = None,
    metrics: Sequence[str] | None = None,
    xs: Sequence[float] | np.ndarray | None = None,
    notes: Sequence[str] = (),
) -> FitResult:
    """Fit the NIXL ``xferDuration`` of one rank: ``fixed_s + per_descriptor_s x d + per_byte_s x bytes``.

    Observations may be per-transfer values or interval means (the model is linear, so a mean of
    transfers is the model at the mean descriptors and bytes; weight intervals by their transfer count).
    ``per_byte_s`` is held at ``per_byte_s_prior`` (1 / line rate per GPU) when bytes and descriptors are
    collinear, which they are for any single model. Never fit bandwidth from NIXL's printed "Throughput":
    it divides total MiB by *summed* transfer seconds, fixed and per-descriptor time included.
    """
    d = np.asarray(descriptors, dtype=np.float64)
    b = np.asarray(bytes_per_rank, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    _validate("transfer descriptors", d)
    _validate("transfer bytes", b)
    if not (d.size == b.size == y.size):
        raise input_error("fit transfer", f"{d.size} descriptor counts, {b.size} byte counts, {y.size} times")
    held = {"transfer.per_byte_s": per_byte_s_prior, **(held_values or {})}
    design = np.column_stack([np.ones_like(d), d, b])
    return fit_linear(
        "transfer",
        design,
        y,
        XFER_NAMES,
        held,
        ("transfer.per_byte_s", "transfer.fixed_s", "transfer.per_descriptor_s"),
        metrics=list(metrics) if metrics is not None else ["kv_xfer"] * y.size,
        xs=xs if xs is not None else d,
        weights=weights,
        notes=notes,
        reasons={"transfer.per_byte_s": BYTES_DESCRIPTOR_REASON},
    )


def fit_post(
    descriptors: Sequence[float] | np.ndarray,
    seconds: Sequence[float] | np.ndarray,
    *,
    held_values: Mapping[str, float] | None = None,
    weights: np.ndarray | None = None,
    xs: Sequence[float] | np.ndarray | None = None,
) -> FitResult:
    """Fit the NIXL ``postDuration``: ``post_fixed_s + post_per_descriptor_s x descriptors``."""
    d = np.asarray(descriptors, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    _validate("post descriptors", d)
    if d.size != y.size:
        raise input_error("fit post", f"{d.size} descriptor counts but {y.size} times")
    return fit_linear(
        "post",
        np.column_stack([np.ones_like(d), d]),
        y,
        POST_NAMES,
        dict(held_values or {}),
        ("transfer.post_fixed_s", "transfer.post_per_descriptor_s"),
        metrics=["kv_post"] * y.size,
        xs=xs if xs is not None else d,
        weights=weights,
    )


# --- decode -------------------------------------------------------------------------------------------------

DECODE_NAMES = ("decode.fixed_s", "decode.per_seq_s", "decode.per_context_token_s")


def fit_decode(
    batch: Sequence[float] | np.ndarray,
    context_tokens: Sequence[float] | np.ndarray,
    seconds: Sequence[float] | np.ndarray,
    *,
    held_values: Mapping[str, float] | None = None,
    weights: np.ndarray | None = None,
    metrics: Sequence[str] | None = None,
    notes: Sequence[str] = (),
    lower_bounds: Mapping[str, float] | None = None,
) -> FitResult:
    """Fit ``DecodeCost`` to decode-step times (ITL or TPOT) at a batch size and summed context.

    ``context_tokens`` is the KV tokens read by the step summed over the batch. With a constant batch
    (e.g. ITLs of a client that cannot see the server's batch) ``per_seq_s`` is not identifiable from
    ``fixed_s`` and is held (default 0: its cost is folded into ``fixed_s`` at that batch size).
    """
    bb = np.asarray(batch, dtype=np.float64)
    c = np.asarray(context_tokens, dtype=np.float64)
    y = np.asarray(seconds, dtype=np.float64)
    _validate("decode batch", bb)
    _validate("decode context", c)
    if not (bb.size == c.size == y.size):
        raise input_error("fit decode", f"{bb.size} batch sizes, {c.size} contexts, {y.size} times")
    return fit_linear(
        "decode",
        np.column_stack([np.ones_like(bb), bb, c]),
        y,
        DECODE_NAMES,
        dict(held_values or {}),
        ("decode.per_seq_s", "decode.per_context_token_s", "decode.fixed_s"),
        metrics=list(metrics) if metrics is not None else ["decode_step"] * y.size,
        xs=c,
        weights=weights,
        notes=notes,
        reasons={"decode.per_seq_s": "the batch size does not vary in these data (folded into decode.fixed_s)"},
        lower_bounds=lower_bounds,
    )


def combine_reports(results: Sequence[FitResult]) -> dict[str, Any]:
    """One JSON-able report of several fits: parameters, MAPE per metric, residuals, notes."""
    return {
        "fits": [r.to_report() for r in results],
        "mape_pct": {f"{r.target}:{k}": v for r in results for k, v in r.mape_pct.items()},
        "residuals": [x for r in results for x in r.residual_sample()],
        "notes": [n for r in results for n in r.notes],
    }
