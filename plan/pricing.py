"""One cost basis for ``compare``, ``capacity`` and the dashboard: node-hours of the steady state.

``usd_per_million_turns = node-hours x $/node-hour / (steady served turns per hour) x 10^6``, where a
deployment's nodes are its GPUs over the GPUs of one node (an instance of TP < 8 on an 8-GPU node is billed
its share: the other GPUs of the node host other instances), and the steady
served turns per second are the turns finished without error inside the run's pricing window
(:func:`pricing_window`, read by :func:`kvplan.plan.executor.run_extras`), not over the whole run: the ramp-up and
the drain after the last arrival would count idle node-hours that a deployment serving this load around the clock
does not have.

The pricing window is the second half of the arrival window, the summary's ``steady_window_start_s`` to
``steady_window_end_s`` (:func:`kvplan.sim.engine.steady_window`, drawn from the workload's plan before any run),
so every policy and TTL of one scenario and seed is priced over the same seconds. It used to start at
``min(t_b / 2, TTL + p90 conversation span)``, the pinned-KV window, which starts earlier for a short TTL or with
retention off: a window reaching into the ramp-up counts fewer turns per second, so on 2P2D TP2 at 2 conversations/s
(200 conversations, seed 1) retention off was priced 2.7% above a 10 s TTL and 7.3% above 4 aggregated replicas
(now 0.3% above and 1.6% below), more than ``compare``'s 1% cost tie-break. A closed loop has no arrival window:
its active span, first arrival to last response.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

#: The statement every output that prices a deployment prints next to its figure.
COST_BASIS = ("cost basis: nodes (GPUs / GPUs per node) x $/node-hour over the turns served per hour in the steady "
              "state (turns finished inside the steady window, the second half of the arrival window, the same for every "
              "policy and TTL; ramp-up and drain excluded; a closed loop, with no arrival window: its active span)")


def pricing_window(summary: Mapping[str, Any], active_span: tuple[float, float] | None = None,
                   ) -> tuple[float, float] | None:
    """The seconds ``(start, end)`` a run's served turns are priced over: ``active_span`` when given (a closed loop,
    first arrival to last response), else the summary's steady window (the second half of the arrival window,
    independent of the policy and the TTL); None without one (an empty arrival window)."""
    if active_span is not None:
        start, end = active_span
    else:
        a, b = summary.get("steady_window_start_s"), summary.get("steady_window_end_s")
        if a is None or b is None:
            return None
        start, end = float(a), float(b)
    return (start, end) if end > start else None


def served_turns_per_s(finish_s: np.ndarray, window: tuple[float, float]) -> float:
    """Turns finished inside ``window`` (both ends included) per second of it; ``finish_s`` holds the finish times of
    the turns served without error (NaN: not finished)."""
    start, end = window
    return float(((finish_s >= start) & (finish_s <= end)).sum() / (end - start))


def node_equivalents(gpus: int, gpus_per_node: int) -> float:
    """Nodes a deployment of ``gpus`` GPUs is billed for."""
    return gpus / gpus_per_node


def usd_per_million_turns(nodes: float, usd_per_node_hour: float | None,
                          steady_turns_per_s: float | None) -> float | None:
    """$ per million served turns on the steady-state basis (None without a price or a positive throughput);
    ``nodes`` as :func:`node_equivalents`."""
    if usd_per_node_hour is None or steady_turns_per_s is None:
        return None
    if not (math.isfinite(steady_turns_per_s) and steady_turns_per_s > 0):
        return None
    return nodes * usd_per_node_hour / 3600 / steady_turns_per_s * 1e6
