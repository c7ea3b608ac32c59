"""One cost basis for ``compare``, ``capacity`` and the dashboard: node-hours of the steady state.

``usd_per_million_turns = node-hours x $/node-hour / (steady served turns per hour) x 10^6``, where a
deployment's nodes are its GPUs over the GPUs of one node (an instance of TP < 8 on an 8-GPU node is billed
its share: the other GPUs of the node host other instances), and the steady
served turns per second are the turns finished without error inside the run's steady window (after TTL + p90
conversation span, before the last conversation's first arrival; :func:`kvplan.plan.executor.run_extras`),
not over the whole run: the ramp-up and the drain after the last arrival would count idle node-hours that a
deployment serving this load around the clock does not have.
"""

from __future__ import annotations

import math

#: The statement every output that prices a deployment prints next to its figure.
COST_BASIS = ("cost basis: nodes (GPUs / GPUs per node) x $/node-hour over the turns served per hour in the steady "
              "state (turns finished inside the steady window, ramp-up and drain excluded; a closed loop, with no "
              "arrival window: its active span)")


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
