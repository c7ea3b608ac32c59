"""Analytic pull-vs-recompute break-even of a follow-up turn under the calibrated costs (pure, no SimPy).

Used by the threshold rule of :mod:`kvplan.plan.advice`: ``kv_recompute_threshold`` should be the smallest pull
size from which pulling (the simulator's read time incl. descriptors, idle link, no handshake) is no slower than
recomputing on P (``prefill_time_s`` of those tokens on top of the local prefix, minus the tail of new tokens
the request computes anyway: the per-step fixed cost is paid on both paths and cancels).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvplan.models.costs import prefill_time_s
from kvplan.sim.engine import Resolved
from kvplan.sim.pull import read_path


@dataclass(frozen=True)
class BreakEven:
    """Analytic pull-vs-recompute break-even of one follow-up turn."""

    tokens: int
    local_prefix_tokens: int
    tail_tokens: int
    pull_s: float
    recompute_s: float
    verdict: str  # crossover | always_pull | never_pull


def break_even(rs: Resolved, local_prefix_tokens: int, tail_tokens: int, max_tokens: int | None = None) -> BreakEven:
    """Smallest ``n`` from which pulling ``n`` tokens is no slower than recomputing them (for all larger ``n``).

    Pull: the simulator's read of ``n`` tokens (``sim/pull.py``: P's costs, the heterogeneous-TP rank plan, the link).
    Recompute on P: ``prefill_time_s(n + tail, local) - prefill_time_s(tail, local + n)`` (chunked as the engine).
    """
    sc = rs.scenario
    chunk = sc.deployment.max_num_batched_tokens
    read = read_path(sc, rs)  # P reads D's ranks as the simulator does (rank plan, P's costs)
    pc = read.reader.costs.prefill  # the recompute runs on P's profile
    top = max_tokens or rs.arch.max_model_len
    tail = max(int(tail_tokens), 1)
    local = max(int(local_prefix_tokens), 0)
    pull = np.empty(top)
    rec = np.empty(top)
    for n in range(1, top + 1):
        pull[n - 1] = read.time_s(n)
        rec[n - 1] = prefill_time_s(pc, n + tail, local, chunk) - prefill_time_s(pc, tail, local + n, chunk)
    worse = np.nonzero(pull > rec)[0]
    if len(worse) == 0:
        n_star, verdict = 1, "always_pull"
    elif worse[-1] == top - 1:
        n_star, verdict = top + 1, "never_pull"
    else:
        n_star, verdict = int(worse[-1]) + 2, "crossover"
    i = min(n_star, top) - 1
    return BreakEven(n_star, local, tail, float(pull[i]), float(rec[i]), verdict)
