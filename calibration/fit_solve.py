"""The solver behind :func:`kvplan.calibration.fit.fit_linear`: structural identifiability (which parameters
to hold) and the bounded least squares of the free ones, with standard errors and statuses."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
from scipy.optimize import least_squares

#: Relative standard error above which an estimate is reported as poorly determined.
POORLY_DETERMINED_REL_SE = 0.5
#: Relative singular value (column-normalised, weighted design) below which a direction is taken as not
#: identifiable: 1 % keeps e.g. bytes vs descriptors (proportional up to block rounding) from being "fitted"
#: to noise, while prefill designs with several lengths and contexts sit at 0.1-0.3.
#: A parameter takes part in a null direction when its share of the singular vector exceeds this.
NULL_DIRECTION_SHARE = 0.05
RANK_TOL = 1e-2


def _held_parameters(a: np.ndarray, names: Sequence[str], hold_order: Sequence[str], held: dict[str, str],
                     reasons: Mapping[str, str]) -> dict[str, str]:
    """Structural identifiability: hold columns that carry no information, then one parameter per
    rank-deficient direction (the first of ``hold_order`` involved in it), until the rest is full rank."""
    m, p = a.shape
    for j in range(p):
        if names[j] not in held and not np.any(a[:, j] != 0):
            held[names[j]] = reasons.get(names[j], "no observation depends on it")
    free = [j for j in range(p) if names[j] not in held]
    while free:
        sub = a[:, free]
        norms = np.linalg.norm(sub, axis=0)
        s = np.linalg.svd(sub / norms, compute_uv=False)
        if s[-1] > RANK_TOL * s[0] and len(free) <= m:
            break
        # the null direction: the right singular vector of the smallest singular value
        _, _, vt = np.linalg.svd(sub / norms, full_matrices=False)
        null = np.abs(vt[-1])
        involved = {names[free[k]] for k in range(len(free)) if null[k] > NULL_DIRECTION_SHARE} if len(free) <= m else set()
        choice = next((n for n in hold_order if n in involved), None)
        if choice is None:
            choice = next((n for n in hold_order if names.index(n) in free), names[free[-1]])
        held[choice] = reasons.get(
            choice, "not separable from " + ", ".join(sorted(involved - {choice})) + " with these data"
            if involved - {choice}
            else "too few distinct observations"
        )
        free = [j for j in free if names[j] != choice]
    return held


def _fit_free(a: np.ndarray, rhs: np.ndarray, theta: np.ndarray, free: list[int], names: Sequence[str],
              stderr: np.ndarray, status: dict[str, str], note_list: list[str],
              lower_bounds: Mapping[str, float] | None = None) -> int:
    """Bounded least squares (``theta >= lower``, the physical bounds, default 0) of the free parameters given
    the held ones, in place: values, standard errors (from the residual variance) and statuses. Returns the
    degrees of freedom."""
    m, p = a.shape
    held_idx = [j for j in range(p) if j not in free]
    offset = a[:, held_idx] @ theta[held_idx]
    af = a[:, free]
    scale = np.maximum(np.linalg.norm(af, axis=0), 1e-300)
    # least_squares on the column-scaled problem (parameters of order 1), bounds theta >= lower
    lo = np.array([float((lower_bounds or {}).get(names[j], 0.0)) for j in free]) * scale
    start = np.linalg.lstsq(af / scale, rhs - offset, rcond=None)[0]
    start = np.maximum(start, lo) + 1e-12 + 1e-9 * lo
    sol = least_squares(lambda t: (af / scale) @ t - (rhs - offset), start, jac=lambda t: af / scale,
                        bounds=(lo, np.inf), method="trf", x_scale="jac", xtol=1e-15, ftol=1e-15, gtol=1e-15)
    est = sol.x / scale
    theta[free] = est
    dof = m - len(free)
    active = est <= lo / scale * (1 + 1e-9) + 1e-14 * np.maximum(1.0, np.abs(est).max())
    inner = [k for k in range(len(free)) if not active[k]]
    if dof > 0 and inner:
        s2 = float(sol.fun @ sol.fun) / dof
        ji = af[:, inner]
        try:
            cov = np.linalg.inv(ji.T @ ji) * s2
            for k_i, k in enumerate(inner):
                stderr[free[k]] = math.sqrt(max(cov[k_i, k_i], 0.0))
        except np.linalg.LinAlgError:
            note_list.append("covariance singular: standard errors unavailable")
    elif dof <= 0:
        note_list.append(f"{m} observations for {len(free)} parameters: no degrees of freedom, no standard errors")
    for k, j in enumerate(free):
        if active[k]:
            status[names[j]] = "at_bound"
        elif math.isfinite(stderr[j]) and theta[j] > 0 and stderr[j] / theta[j] > POORLY_DETERMINED_REL_SE:
            status[names[j]] = "poorly_determined"
        else:
            status[names[j]] = "fitted"
    return dof
