"""Unloaded service-time estimate of one request from the cost model (for fitting idle turn gaps).

A trace gives arrival-to-arrival gaps; the simulator's turn gap runs from the end of a response to the
next arrival, so fitting a workload needs each parent's service time. Without a measured one, kvplan
uses the calibrated costs on an idle deployment: proxy overheads + prefill of the whole prompt (chunked)
+ P->D transfer of the prompt + ``output`` decode steps at batch 1. Queueing is not included: fit from
an uncongested deployment or from measured latencies when the trace has them.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kvplan.models.costs import decode_steps_time_s, prefill_time_s
from kvplan.sim.engine import resolve, resolve_roles
from kvplan.sim.pull import read_path
from kvplan.sim.request import P2D
from kvplan.sim.scenario import Scenario


def unloaded_service_time_fn(scenario: Scenario) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
    """``f(input_tokens, output_tokens) -> seconds`` for the scenario's model, hardware and profile."""
    rs = resolve(scenario)
    rs_p, rs_d = resolve_roles(scenario, rs)  # each role at its own TP, as the simulator (sim/engine.py)
    c = rs_p.costs  # P's prefill; the proxy overheads as the simulator takes them (sim/node_setup.py)
    chunk = scenario.deployment.max_num_batched_tokens
    p2d = read_path(scenario, rs, P2D)  # D reads the prompt's KV from P as the simulator composes it

    def one(n_in: int, n_out: int) -> float:
        n_in = max(int(n_in), 1)
        t = c.overhead.p_leg_s + c.overhead.d_leg_s
        t += prefill_time_s(c.prefill, n_in, 0, chunk)
        t += p2d.time_s(n_in)
        t += decode_steps_time_s(rs_d.costs.decode, 1, n_in, max(int(n_out), 1))
        return t

    def f(input_tokens: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
        a = np.atleast_1d(np.asarray(input_tokens))
        b = np.atleast_1d(np.asarray(output_tokens))
        return np.array([one(x, y) for x, y in zip(a, b, strict=True)], dtype=float)

    return f
