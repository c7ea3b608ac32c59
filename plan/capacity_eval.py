"""Simulating capacity candidates: memoised runs of (deployment, policy, rate) overrides and the SLO test.

One :class:`Evaluator` per capacity plan runs every candidate with the same replication seeds
(:func:`kvplan.sim.seeds.replication_seeds`, the seeds of ``compare`` and sweeps, so that the same deployment
and load give the same rows in both), and keeps each candidate's mean metrics. A candidate meets the SLO when
the mean TTFT p90 over the replications is at most the SLO, at most 1% of turns errored (``compare``'s rule)
and no run failed, **judged on a longer run**: a candidate whose first run meets the SLO is simulated again with
:data:`kvplan.plan.steady.EXTEND_FACTOR` x its conversations at the same rate (more when retention needs them,
:func:`kvplan.plan.steady.longer_conversations`), and its metrics are that run's (``judged_conversations``;
``first_run_*`` keep the first), because a load at or beyond capacity meets a TTFT SLO over a short run while its
queue is still growing (:mod:`kvplan.plan.steady`). A trace replay keeps its own clock and is judged as it runs.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from kvplan.plan.executor import run_tasks
from kvplan.plan.steady import (
    FIRST_KEY,
    SECOND_KEY,
    growing,
    judging_conversations,
    judging_span_s,
    retention_unsteady,
)
from kvplan.sim.scenario import Scenario, with_overrides
from kvplan.sim.seeds import replication_seeds

MAX_ERROR_SHARE = 0.01
Metrics = dict[str, float]


def _mean(ok: list[dict[str, Any]], key: str) -> float:
    vals = [float(r[key]) for r in ok if r.get(key) is not None]
    return float(np.mean(vals)) if vals else math.nan


def metrics_of(rows: list[dict[str, Any]]) -> Metrics:
    """Mean metrics of one candidate's replications (TTFT p90 infinite when a run failed)."""
    ok = [r for r in rows if r.get("error") is None]
    p90 = [float(r["ttft_p90_s"]) for r in ok]
    out: Metrics = {k: _mean(ok, k) for k in ("ttft_mean_s", "ttft_p50_s", "hit_rate", "prefill_utilization",
                                             "steady_served_turns_per_s", "errors", "turns", "pinned_kv_gib_peak",
                                             "steady_pinned_kv_gib_mean", "retention_steady", FIRST_KEY, SECOND_KEY)}
    out["conversation_span_p90_s"] = judging_span_s(ok)  # the span judging runs are sized with (plan/steady.py)
    # the busiest P engine's (aggregated: replica's) busy share over the steady window, health's judged figure
    out["prefill_utilization_steady"] = _mean(ok, "health.resources.prefill_compute.utilization")
    # the longest p90 wait any resource caused (P's queue, D's admission, P's held KV, the link, an engine thread)
    waits = [max((float(v) for k, v in r.items() if k.startswith("health.resources.") and k.endswith(".wait_p90_s")
                  and v is not None and math.isfinite(float(v))), default=math.nan) for r in ok]
    out["wait_p90_s"] = float(np.mean(waits)) if waits else math.nan
    out["ttft_p90_s"] = float(np.mean(p90)) if ok and len(ok) == len(rows) else math.inf
    out["ttft_p90_s_sd"] = float(np.std(p90, ddof=1)) if len(p90) > 1 else math.nan
    # the router-TTL rule needs the worst replication's p99 of arrival -> P's decision on this very run
    out["p_decide_p99_s"] = max((float(r["p_decide_p99_s"]) for r in ok), default=math.nan)
    conv = [r["turns"] / max(r["conversations"], 1) for r in ok]
    out["turns_per_conversation"] = float(np.mean(conv)) if conv else math.nan
    return out


def meets(m: Metrics, slo_s: float) -> bool:
    """The SLO test: mean TTFT p90 <= SLO and at most 1% of turns errored."""
    return bool(m["ttft_p90_s"] <= slo_s and (m["errors"] or 0.0) <= MAX_ERROR_SHARE * (m["turns"] or 0.0))


class Evaluator:
    """Runs override sets x replications through the executor, memoised by the overrides, with progress."""

    def __init__(self, base: Scenario, reps: int, workers: int, backend: str,
                 progress: Callable[[int, int], None] | None, slo_s: float | None = None) -> None:
        """``slo_s``: the SLO candidates are judged against (their first run meeting it sends them to the longer
        run, module docstring); None: every candidate is judged on its first run."""
        self.base, self.reps, self.workers, self.backend, self.progress = base, reps, workers, backend, progress
        self.slo_s = slo_s if base.workload.trace is None else None
        self.key = json.dumps(base.model_dump(mode="json"), sort_keys=True)
        self.seeds = replication_seeds(base.seed, reps)
        self.cache: dict[str, Metrics] = {}
        self.done = 0
        self.total = 0
        self.truncated_conversations = 0.0  # the most conversations any run cut at the context limit
        self.truncated_of = 0  # ... of that run's planned conversations

    def many(self, variants: list[dict[str, Any]]) -> list[Metrics]:
        """The metrics of each override set (simulated once per distinct set, in parallel): its first run's, or,
        when that run meets the SLO, its longer run's (module docstring)."""
        keys = [json.dumps(v, sort_keys=True) for v in variants]
        fresh = [k for k in dict.fromkeys(keys) if k not in self.cache]
        self._simulate(variants)
        if self.slo_s is not None:
            by_key = dict(zip(keys, variants, strict=True))
            longer = {k: self._longer(by_key[k], self.cache[k]) for k in fresh if meets(self.cache[k], self.slo_s)}
            for k in fresh:
                self.cache[k] = {**self.cache[k], "judged_conversations": float(self._conversations(by_key[k]))}
            self._simulate(list(longer.values()))
            for k, v in longer.items():
                first = self.cache[k]
                judged = dict(self.cache[json.dumps(v, sort_keys=True)])
                judged.update({"judged_conversations": float(v["workload.conversations"]),
                               "first_run_conversations": float(self._conversations(by_key[k])),
                               "first_run_ttft_p90_s": first["ttft_p90_s"],
                               "first_run_ttft_growing": float(growing(first)),
                               "first_run_retention_unsteady": float(retention_unsteady(first))})
                self.cache[k] = judged
        return [self.cache[k] for k in keys]

    def _conversations(self, variant: dict[str, Any]) -> int:
        return int(variant.get("workload.conversations", self.base.workload.conversations))

    def _longer(self, variant: dict[str, Any], first: Metrics) -> dict[str, Any]:
        """``variant`` with the conversations of its judging run."""
        span = first.get("conversation_span_p90_s", math.nan)
        return {**variant, "workload.conversations": judging_conversations(with_overrides(self.base, variant), span)}

    def _simulate(self, variants: list[dict[str, Any]]) -> None:
        """Simulate every override set not yet cached (replications in parallel) and cache its first-run metrics."""
        keys = [json.dumps(v, sort_keys=True) for v in variants]
        todo = {k: v for k, v in zip(keys, variants, strict=True) if k not in self.cache}
        rows: dict[str, list[dict[str, Any]]] = {k: [{} for _ in range(self.reps)] for k in todo}
        tasks = [((k, j), v, self.seeds[j]) for k, v in todo.items() for j in range(self.reps)]

        def on_result(key: Any, row: dict[str, Any]) -> None:
            rows[key[0]][key[1]] = row
            cut = row.get("truncated_conversations") if row.get("error") is None else None
            if cut is not None and math.isfinite(float(cut)) and float(cut) > self.truncated_conversations:
                self.truncated_conversations = float(cut)
                self.truncated_of = self._conversations(todo[key[0]])  # that run's planned conversations
            self.done += 1
            if self.progress:
                self.progress(self.done, max(self.done, self.total))

        self.total += len(tasks)
        if tasks:
            run_tasks(self.base, self.key, tasks, on_result, self.backend, self.workers)
        for k, rs in rows.items():
            self.cache[k] = metrics_of(rs)

    def one(self, variant: dict[str, Any]) -> Metrics:
        """The metrics of one override set."""
        return self.many([variant])[0]

    @property
    def runs(self) -> int:
        """Simulations run so far."""
        return self.done
