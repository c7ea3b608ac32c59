"""Raw SimPy's time for a given number of events: the yardstick of the speed benchmarks (issue 23, item 6).

``raw_simpy_cpu_s(n_events)`` runs a minimal SimPy model on the pinned SimPy (pyproject: simpy 4): ``procs``
processes, each a loop of ``yield env.timeout(d)`` over pre-drawn exponential delays (cycled), so that SimPy processes
``n_events`` events in all (one ``Initialize`` and one process-end event per process, one ``Timeout`` per
iteration) with about as many events pending at once as the reference run has (its queue holds 140-220
events). It measures what SimPy itself costs per event (schedule, heap, step, resuming a generator), with no
model code: the floor a simulator built on SimPy can approach.

``count_events(scenario)`` runs ``kvplan.sim.api.run`` once and reads how many events entered SimPy's queue
(SimPy numbers every scheduled event from one counter, ``Environment._eid``; the run ends with an empty
queue, so every scheduled event was processed).

Both measure CPU time (``time.process_time``), which a loaded machine inflates far less than wall time.
"""

from __future__ import annotations

import random
import time
from itertools import cycle, islice
from typing import Any

import simpy

PROCS = 150  # events pending at once: the reference run's queue holds 144 on average (max 222)


DRAWS = 1024  # delays drawn per process, cycled (memory stays small at millions of events)


def _proc(env: simpy.Environment, delays: list[float], n: int) -> Any:
    for d in islice(cycle(delays), n):
        yield env.timeout(d)


def raw_simpy_cpu_s(n_events: int, procs: int = PROCS, seed: int = 1) -> float:
    """CPU seconds raw SimPy takes to process ``n_events`` events (``procs`` timeout loops)."""
    rng = random.Random(seed)
    per = max((n_events - 2 * procs) // procs, 1)
    extra = max(n_events - 2 * procs - per * procs, 0)
    env = simpy.Environment()
    for i in range(procs):
        env.process(_proc(env, [rng.expovariate(1.0) for _ in range(DRAWS)], per + (1 if i < extra else 0)))
    c = time.process_time()
    env.run()
    dt = time.process_time() - c
    done = next(env._eid)  # events scheduled (and, the queue being empty, processed)
    if abs(done - n_events) > 2:
        raise RuntimeError(f"yardstick processed {done} events, wanted {n_events}")
    return dt


def count_events(scenario: Any, **run_kwargs: Any) -> tuple[int, Any]:
    """(events SimPy's queue processed, the result) of one ``run(scenario, **run_kwargs)``."""
    import kvplan.sim.api as api

    envs: list[Any] = []
    orig = api.simulate

    def counted(*a: Any, **k: Any) -> Any:
        out = orig(*a, **k)
        envs.append(out[2].env)
        return out

    api.simulate = counted
    try:
        res = api.run(scenario, **run_kwargs)
    finally:
        api.simulate = orig
    return next(envs[0]._eid), res
