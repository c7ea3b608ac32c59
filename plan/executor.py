"""Run many (scenario variant, seed) simulations in-process, on a local process pool, or on Ray.

One task is ``(key, overrides, seed)`` against one base scenario: the worker re-validates
``with_overrides(base, overrides)`` and calls the public ``run(scenario, seed)``, then returns one flat
row (:func:`run_row`). All backends call the same function, so the rows are identical whatever runs them.

* ``workers=1`` runs in this process (no pickling, no start-up cost).
* ``backend='local'`` uses ``concurrent.futures.ProcessPoolExecutor`` with the ``forkserver`` context on
  Linux (``spawn`` elsewhere): no inherited state, the same as a fresh interpreter.
* ``backend='ray'`` (optional extra ``kvplan[ray]``, imported lazily) runs on ``ray.init(address)``, or on
  a local Ray started for the call and shut down after it. Remote nodes need kvplan installed and any
  empirical ``path:`` files present at the same path.

At most ``2 x workers`` tasks are in flight, so a million-task sweep does not queue a million futures.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import math
import multiprocessing
import os
import sys
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

import numpy as np

import kvplan.sim.engine  # noqa: F401 - first: the engine installs the compiled hot path (sim/engine.py)
from kvplan.atomic import deferred_signals
from kvplan.errors import KvplanInputError, input_error
from kvplan.plan.pricing import pricing_window, served_turns_per_s
from kvplan.sim.events import Ev
from kvplan.sim.health import d_missed
from kvplan.sim.scenario import Scenario, scenario_from_dict, with_overrides
from kvplan.sim.summary import flatten

log = logging.getLogger(__name__)

Task = tuple[Hashable, dict[str, Any], int]
OnResult = Callable[[Hashable, dict[str, Any]], Iterable[Task] | None]
BACKENDS = ("local", "ray")
GIB = 1024**3

_BASE_CACHE: dict[str, Scenario] = {}


# --- one run -> one flat row -----------------------------------------------------------------------------


def flatten_summary(summary: dict[str, Any]) -> dict[str, Any]:
    """Scalar summary metrics as a flat dict (:func:`kvplan.sim.summary.flatten`)."""
    return flatten(summary)


def _window_mean(t: np.ndarray, v: np.ndarray, t_a: float, t_b: float) -> float:
    """Time-weighted mean of the right-continuous step function (t, v) over [t_a, t_b] (0 before t[0])."""
    if t_b <= t_a or len(t) == 0:
        return float("nan")
    edges = np.clip(np.append(t, np.inf), t_a, t_b)
    dt = np.diff(edges)
    return float((v * dt).sum() / (t_b - t_a))


def run_extras(result: Any) -> dict[str, float]:
    """Derived per-run metrics the sweep, the screen and the advisor need (pure functions of the result).

    ``steady_pinned_kv_gib_mean``: pinned decode KV averaged over the steady window [t_a, t_b], where t_b
    is the last conversation's first arrival and t_a = min(t_b / 2, TTL + p90 conversation span) (the
    whole-run ``pinned_kv_gib_mean`` also averages the ramp-up and the drain after the last arrival); a closed
    loop (no arrival window) uses its active span, first arrival to last response. ``steady_pinned_window_start_s``
    and ``steady_pinned_window_end_s`` are t_a and t_b.
    ``pinned_token_s``: token-seconds of retention; ``retention_mean_s``: mean time a pin is held;
    ``p_decide_p99_s``: p99 of
    arrival -> P's connector decision (the slack the router TTL needs below D's TTL - margin).
    ``arrival_span_s`` (= t_b) and ``conversation_span_p90_s`` (p90 of first to last arrival of a conversation):
    the run reaches a steady state at a TTL only when ``arrival_span_s >= TTL + conversation_span_p90_s``.
    ``retention_steady``: 1 when retention is off or the arrival span reaches TTL + p90 conversation span, else 0;
    ``pinned_window_after_ramp``: 1 when the pinned-KV steady window starts at or after TTL + p90 conversation span
    (retention off or aggregated: the span), when pinned KV has stopped ramping up, else 0 (the window then averages
    part of the ramp-up: below the steady state); ``prefill_window_after_ramp``: 1 when the summary's steady window
    (``steady_window_start_s``, P's utilisation and the health section) starts at or after the p90 conversation span,
    when P's load has stopped ramping up, else 0 (both read by :func:`kvplan.plan.screen.compare_screen`);
    ``steady_ttft_mean_first_s`` / ``steady_ttft_mean_second_s``: :func:`_steady_halves` (both read by
    :mod:`kvplan.plan.steady`).
    ``served_turns_per_s``: finished turns over first arrival -> last finish (the drain included);
    ``steady_served_turns_per_s``: turns finished without error inside the pricing window over its length (the
    basis every cost per million turns uses, :func:`kvplan.plan.pricing.pricing_window`: the summary's steady window,
    the second half of the arrival window, the same whatever the policy and TTL, not the pinned-KV window above;
    ``served_turns_per_s`` when the window is empty; a closed loop's window is its active span, first arrival to
    last response), ``priced_window_start_s`` / ``priced_window_end_s`` that window (NaN without one);
    ``tpot_mean_s`` (unless the summary has it): :func:`tpot_mean_s`; ``reuse_rate``: share of follow-up turns that
    reused any KV of their context (a local prefix hit on P or an aggregated replica, or a pull), whatever the
    decision was; ``follow_up_d_missed_fraction``: share of the follow-up turns that did not fail whose D found less
    than half their prompt in its prefix cache, ``follow_up_d_hit_token_fraction``: the share of their prompt tokens
    it found (the health section's routing check, :func:`kvplan.sim.health.routing_miss`).
    """
    ev = result.events
    turns = result.turns
    sc = result.scenario
    out: dict[str, float] = {}
    pin = ev[ev["kind"] == int(Ev.PIN)]
    unpin = ev[ev["kind"] == int(Ev.UNPIN)]
    n_pins = len(pin)
    tok_s = float((unpin["a"] * unpin["t_s"]).sum() - (pin["a"] * pin["t_s"]).sum()) if n_pins else 0.0
    out["pinned_token_s"] = tok_s
    out["retention_mean_s"] = float((unpin["t_s"].sum() - pin["t_s"].sum()) / n_pins) if n_pins else 0.0
    first = turns[turns["turn"] == 1]
    t_b = float(first["arrival_s"].max()) if len(first) else 0.0
    by_conv = turns.groupby("conversation_id")["arrival_s"]
    span = by_conv.max() - by_conv.min()
    span_p90 = float(np.percentile(span.to_numpy(), 90)) if len(span) else 0.0
    ttl = sc.policy.decoder_kv_blocks_ttl_s if sc.policy.bidirectional else 0.0
    t_a = min(t_b / 2, ttl + span_p90)
    out["arrival_span_s"] = t_b
    closed = bool(sc.workload.arrival.kind == "closed_loop" and sc.workload.trace is None and len(turns))
    if closed:
        # a closed loop's arrivals follow its responses: its last new conversation starts early (12 s into the
        # published benchmark, whose window then held 5 first turns) and it has no arrival window; its window is
        # the active span, first arrival to last response (as health's, sim/health.py)
        t_a, t_b = float(turns["arrival_s"].min()), float(turns["finish_s"].max())
    series = result.pinned_series()
    out["steady_window_s"] = max(t_b - t_a, 0.0)
    # the window itself, so that steady_pinned_kv_gib_mean can be recomputed from a `kvplan simulate` run's
    # pinned.parquet (summary.json's pinned_kv_gib_mean is the whole run's): recommend's `verification` quotes it
    out["steady_pinned_window_start_s"], out["steady_pinned_window_end_s"] = t_a, t_b
    out["conversation_span_p90_s"] = span_p90
    out["steady_pinned_kv_gib_mean"] = (
        _window_mean(series["t_s"].to_numpy(), series["pinned_gib"].to_numpy(), t_a, t_b) if len(series) else 0.0
    )
    s = result.summary
    ok = turns[turns["decision"] != "error"]
    out["d_queue_mean_s"] = float(ok["d_queue_s"].mean()) if len(ok) else float("nan")
    out["mean_request_kv_tokens"] = float((turns["prompt_tokens"] + turns["output_tokens"]).mean()) if len(turns) else 0.0
    dec = ev[ev["kind"] == int(Ev.P_DECISION)][["conv", "turn", "t_s"]].set_index(["conv", "turn"])
    arr = ev[ev["kind"] == int(Ev.ARRIVE)][["conv", "turn", "t_s"]].set_index(["conv", "turn"])
    delay = (dec["t_s"] - arr["t_s"].reindex(dec.index)).to_numpy()
    out["p_decide_p99_s"] = float(np.percentile(delay, 99)) if len(delay) else 0.0
    out["finished_turns_per_s"] = float(len(turns) / s["sim_end_s"]) if s.get("sim_end_s") else 0.0
    span = float(turns["finish_s"].max() - turns["arrival_s"].min()) if len(turns) else 0.0
    out["served_turns_per_s"] = float(ok["finish_s"].notna().sum() / span) if span > 0 else 0.0
    # priced over one window for every policy and TTL of the scenario (plan/pricing.py), not the pinned-KV one above
    priced = pricing_window(s, (t_a, t_b) if closed else None)
    out["priced_window_start_s"], out["priced_window_end_s"] = priced if priced is not None else (math.nan, math.nan)
    out["steady_served_turns_per_s"] = (served_turns_per_s(ok["finish_s"].to_numpy(dtype=float), priced)
                                        if priced is not None else out["served_turns_per_s"])
    follow = turns[turns["turn"] >= 2]
    reused = (follow["local_hit_tokens"] + follow["pulled_tokens"]) > 0
    out["reuse_rate"] = float(reused.mean()) if len(follow) else 0.0
    # the routing check of the health section (kvplan.sim.health.routing_miss), per run: recommend and compare say it
    follow_ok = follow[follow["decision"] != "error"]
    prompt = float(follow_ok["prompt_tokens"].sum())
    # aggregated serving: the replica that prefills is the one whose cache the routing loses (local_hit_tokens)
    hit = follow_ok["local_hit_tokens" if sc.deployment.mode == "aggregated" else "d_hit_tokens"]
    out["follow_up_d_missed_fraction"] = (float(d_missed(hit, follow_ok["prompt_tokens"]).mean())
                                          if len(follow_ok) else 0.0)
    out["follow_up_d_hit_token_fraction"] = float(hit.sum()) / prompt if prompt > 0 else 0.0
    # the D leg's P->D reads (per turn that did not fail; 0 where D read nothing): recommend's cross-layer trial
    out["p2d_transfer_mean_s"] = float(ok["p2d_transfer_s"].mean()) if len(ok) else 0.0
    read = ok[ok["p2d_tokens"] > 0]
    out["p2d_reads"] = float(len(read))
    out["p2d_tokens_total"] = float(read["p2d_tokens"].sum())
    if "tpot_mean_s" not in s:
        out["tpot_mean_s"] = tpot_mean_s(ok)
    out["retention_steady"] = float(not sc.policy.bidirectional or sc.deployment.mode == "aggregated"
                                    or out["arrival_span_s"] >= ttl + span_p90)
    # whether the steady windows start after the ramp-up: pinned KV keeps growing until TTL + p90 conversation span
    # (the first conversations' last pins), P's load until one p90 conversation span; a window starting earlier
    # averages part of the ramp-up, so its figure is below the steady state the analytic screen predicts
    retained = sc.policy.bidirectional and sc.deployment.mode != "aggregated"
    out["pinned_window_after_ramp"] = float(t_a >= (ttl if retained else 0.0) + span_p90)
    start = s.get("steady_window_start_s")
    out["prefill_window_after_ramp"] = float(start is not None and float(start) >= span_p90)
    out.update(_steady_halves(ok, s.get("steady_window_start_s"), s.get("steady_window_end_s")))
    return out


def _steady_halves(ok: Any, start: float | None, end: float | None) -> dict[str, float]:
    """Mean TTFT of the turns arriving in the first and in the second half of the steady window (``sim/health.py``;
    NaN without one, e.g. a closed loop, or with no turn in a half): the trend :mod:`kvplan.plan.steady` reads."""
    nan = float("nan")
    if start is None or end is None or not end > start:
        return {"steady_ttft_mean_first_s": nan, "steady_ttft_mean_second_s": nan}
    mid = (float(start) + float(end)) / 2
    t = ok["arrival_s"].to_numpy(dtype=float)
    ttft = ok["ttft_s"].to_numpy(dtype=float)
    halves = ((t >= float(start)) & (t < mid), (t >= mid) & (t <= float(end)))
    means = [float(ttft[h].mean()) if h.any() else nan for h in halves]
    return {"steady_ttft_mean_first_s": means[0], "steady_ttft_mean_second_s": means[1]}


def tpot_mean_s(turns: Any) -> float:
    """Mean time per output token after the first: ``(finish - first token) / (output - 1)`` over turns with > 1."""
    multi = turns[(turns["output_tokens"] > 1) & turns["finish_s"].notna()]
    if not len(multi):
        return float("nan")
    first = multi["arrival_s"] + multi["ttft_s"]
    return float(((multi["finish_s"] - first) / (multi["output_tokens"] - 1)).mean())


def run_row(scenario: Scenario, seed: int) -> dict[str, Any]:
    """Simulate and return ``{'error': None, **flat summary, **extras}``; a failing run gives ``{'error': msg}``."""
    from kvplan.sim.api import run

    # The run's objects form one large reference graph (nodes, closures, the log) that only the cyclic
    # collector frees; letting it rescan that graph mid-run costs ~10-15% of a reference run for no memory
    # gain (same peak RSS), so it is paused during the run and run once afterwards.
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        result = run(scenario, seed)
    except (KvplanInputError, RuntimeError, ValueError, ArithmeticError) as exc:
        return {"error": f"{type(exc).__name__}: {' '.join(str(exc).split())}"}
    finally:
        if was_enabled:
            gc.enable()
    row: dict[str, Any] = {"error": None}
    row.update(result.stats.to_row() if result.stats is not None else flatten_summary(result.summary))
    row.update(run_extras(result))
    del result
    gc.collect()
    return row


def run_task(base_dump: dict[str, Any], base_key: str, overrides: dict[str, Any], seed: int) -> dict[str, Any]:
    """Worker entry point: rebuild the base once per process, apply the overrides, run one seed."""
    base = _BASE_CACHE.get(base_key)
    if base is None:
        base = scenario_from_dict(base_dump, where="sweep base")
        _BASE_CACHE.clear()
        _BASE_CACHE[base_key] = base
    sc = with_overrides(base, overrides) if overrides else base
    return run_row(sc, seed)


# --- backends --------------------------------------------------------------------------------------------


def _mp_context() -> Any:
    if sys.platform.startswith("linux"):
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["kvplan.sim.engine", "kvplan.plan.executor", "kvplan.sim.api"])
        return ctx
    return multiprocessing.get_context("spawn")


def require_ray() -> Any:
    """Import Ray or raise a one-line error naming the optional extra."""
    try:
        import ray
    except ImportError:
        raise input_error("--backend ray", "Ray is not installed", "pip install 'kvplan[ray]'") from None
    return ray


class RunCache:
    """Rows of finished runs keyed by (the simulated scenario's canonical JSON, seed), for callers that simulate
    the same variant twice (``recommend --policies``: the advisor's bidirectional-off and recommended runs are
    ``compare``'s ``off`` and ``ttl_recommended`` rows). A run is a pure function of (scenario, seed), so a
    cached row is the row a rerun would give."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, int], dict[str, Any]] = {}
        self.hits = 0

    @staticmethod
    def key(base: Scenario, overrides: dict[str, Any], seed: int) -> tuple[str, int]:
        """The scenario ``overrides`` make of ``base`` (canonical JSON) and the seed."""
        sc = with_overrides(base, overrides) if overrides else base
        return json.dumps(sc.model_dump(mode="json"), sort_keys=True), int(seed)

    def split(self, base: Scenario, tasks: Iterable[Task], on_result: OnResult) -> tuple[list[Task], OnResult]:
        """The tasks still to run, after answering the cached ones through ``on_result``; and an ``on_result``
        that stores each new row (and filters the follow-up tasks it returns the same way)."""
        keys: dict[Hashable, tuple[str, int]] = {}

        def filtered(ts: Iterable[Task]) -> list[Task]:
            todo: list[Task] = []
            for t in ts:
                k = self.key(base, t[1], t[2])
                if k in self.rows:
                    self.hits += 1
                    todo.extend(filtered(on_result(t[0], dict(self.rows[k])) or ()))
                else:
                    keys[t[0]] = k
                    todo.append(t)
            return todo

        def store(key: Hashable, row: dict[str, Any]) -> Iterable[Task] | None:
            self.rows[keys.pop(key)] = dict(row)
            return filtered(on_result(key, row) or ())

        return filtered(tasks), store


def run_tasks(
    base: Scenario,
    base_key: str,
    tasks: Iterable[Task],
    on_result: OnResult,
    backend: str = "local",
    workers: int = 1,
    ray_address: str | None = None,
    cache: RunCache | None = None,
) -> None:
    """Run every task (and the follow-up tasks ``on_result`` returns), calling ``on_result(key, row)`` as each ends.

    ``on_result`` runs in this process, one call at a time, in completion order. With ``cache``, a task whose
    (scenario, seed) is in it is answered from it at once, and every row run is stored in it.
    """
    if backend not in BACKENDS:
        raise input_error("--backend", f"unknown backend '{backend}'", f"use one of {', '.join(BACKENDS)}")
    if not isinstance(workers, int) or workers < 1:
        raise input_error("--workers", f"must be an integer >= 1, got {workers!r}")
    if cache is not None:
        tasks, on_result = cache.split(base, tasks, on_result)
    queue: deque[Task] = deque(tasks)
    dump = base.model_dump(mode="python")
    if backend == "ray":
        _run_ray(dump, base_key, queue, on_result, workers, ray_address)
    elif workers == 1:
        while queue:
            key, ov, seed = queue.popleft()
            more = on_result(key, run_task(dump, base_key, ov, seed))
            if more:
                queue.extend(more)
    else:
        _run_pool(dump, base_key, queue, on_result, workers)


@contextlib.contextmanager
def _main_not_reimported() -> Iterator[None]:
    """Start workers without re-running the caller's ``__main__`` (the tasks only need kvplan).

    multiprocessing's spawn/forkserver re-import the parent's main script in each worker, which breaks
    scripts without an ``if __name__ == '__main__'`` guard (and notebooks, Streamlit pages). The worker
    entry point lives in this module, so the main module is hidden while the pool starts its processes.
    """
    main = sys.modules.get("__main__")
    saved = {k: getattr(main, k) for k in ("__file__", "__spec__") if main is not None and hasattr(main, k)}
    try:
        if main is not None:
            if "__file__" in saved:
                delattr(main, "__file__")
            main.__spec__ = None
        yield
    finally:
        if main is not None:
            for k, v in saved.items():
                setattr(main, k, v)


def _run_pool(dump: dict[str, Any], base_key: str, queue: deque[Task], on_result: OnResult, workers: int) -> None:
    window = 2 * workers
    with _main_not_reimported(), ProcessPoolExecutor(max_workers=workers, mp_context=_mp_context()) as ex:
        pending: dict[Future[dict[str, Any]], Hashable] = {}
        try:
            while queue or pending:
                while queue and len(pending) < window:
                    key, ov, seed = queue.popleft()
                    # a submit may start a worker process: a signal during it would leave one the teardown does not
                    # know of yet (it reads the pool's process table), which then fails to start once the pool's
                    # queues are gone and prints the forkserver's traceback. Held back until the worker is listed.
                    with deferred_signals():
                        pending[ex.submit(run_task, dump, base_key, ov, seed)] = key
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in done:
                    key = pending.pop(fut)
                    more = on_result(key, fut.result())
                    if more:
                        queue.extend(more)
        except BaseException:
            for fut in pending:
                fut.cancel()
            _stop_workers(ex)
            raise


def _stop_workers(ex: ProcessPoolExecutor, grace_s: float = 5.0) -> None:
    """End the pool's worker processes now (an interrupted sweep: SIGINT, SIGTERM, SIGHUP, an error).

    ``shutdown`` alone waits for the running tasks (minutes for a long point) and a parent that dies meanwhile
    orphans the workers, which keep the resource tracker alive. The workers get SIGTERM, then SIGKILL after
    ``grace_s``; the forkserver and the resource tracker end by themselves once this process exits (their
    pipes close). Finished runs are already committed, so ``--resume`` loses nothing.
    """
    import time

    procs = list((getattr(ex, "_processes", None) or {}).values())  # CPython's own table (3.14 has terminate_workers)
    ex.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        with contextlib.suppress(Exception):
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in procs:
        with contextlib.suppress(Exception):
            p.join(max(deadline - time.monotonic(), 0.0))
            if p.is_alive():
                p.kill()
                p.join(1.0)


def _run_ray(
    dump: dict[str, Any], base_key: str, queue: deque[Task], on_result: OnResult, workers: int, address: str | None
) -> None:
    ray = require_ray()
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no network calls home
    started = False
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        else:
            ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
        started = True
    try:
        cpus = int(ray.cluster_resources().get("CPU", workers)) if address else workers
        window = 2 * max(cpus, 1)
        remote = ray.remote(num_cpus=1)(run_task)
        base_ref = ray.put(dump)
        pending: dict[Any, Hashable] = {}
        while queue or pending:
            while queue and len(pending) < window:
                key, ov, seed = queue.popleft()
                pending[remote.remote(base_ref, base_key, ov, seed)] = key
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                key = pending.pop(ref)
                more = on_result(key, ray.get(ref))
                if more:
                    queue.extend(more)
    finally:
        if started:
            ray.shutdown()


def t_quantile_975(n: int) -> float:
    """Two-sided 95% Student-t multiplier for ``n`` samples (NaN below 2)."""
    if n < 2:
        return math.nan
    from scipy import stats

    return float(stats.t.ppf(0.975, n - 1))
