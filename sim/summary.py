"""The typed run summary: one frozen record per run, built in one place (:func:`kvplan.sim.results.summarize`).

``to_dict()`` is the content of ``summary.json`` (its keys are a contract: unchanged), ``to_row()`` the
flat scalar row of a sweep frame (nested counts as ``decisions.pull``, booleans as 0/1, strings dropped).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Summary:
    """Headline metrics of one run (see the README for each definition) and its run context."""

    turns: int
    conversations: int
    errors: int
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    hit_rate: float
    # follow-ups that reused any KV of their context (a local prefix hit or a pull), whatever the decision: a
    # router hit whose pull falls below the threshold, or whose prompt repeats nothing, reuses none
    reuse_rate: float
    pull_rate: float
    follow_up_turns: int
    decisions: Mapping[str, int]
    pulled_tokens: int
    recomputed_tokens: int
    local_hit_tokens: int
    failed_tokens: int
    prompt_tokens: int
    d2p_bytes: int
    p2d_bytes: int
    kv_pull_mean_s: float
    d2p_xfer_mean_s: float
    p_leg_mean_s: float
    prefill_queue_mean_s: float
    pinned_kv_gib_mean: float
    pinned_kv_gib_peak: float
    pins: int
    releases: Mapping[str, int]
    pins_outstanding: int
    sim_end_s: float
    d_preemptions: int
    d_preempted_recompute_tokens: int
    p_held_kv_gib_mean: float
    p_held_kv_gib_peak: float
    p_lease_expiries: int
    p2d_failed_reads: int
    tpot_mean_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    run: Mapping[str, Any]  # run context: seed, model, hardware, profile, capacities, utilisations, trace report
    # how the percentiles above (and health's wait p90s) were computed: "exact" (the columns kept) or "sketch"
    # (a mergeable quantile sketch, kvplan.sim.quantiles), and the sketch's relative error bound (0 when exact)
    percentile_method: str = "exact"
    percentile_relative_error: float = 0.0
    # inter-token latency over every simulated gap of every turn (vLLM benchmark's median/p90/p99 ITL), always
    # from the pooled bucket counts (kvplan.sim.itl, relative error 0.5 %)
    itl_p50_s: float = float("nan")
    itl_p90_s: float = float("nan")
    itl_p99_s: float = float("nan")

    def to_dict(self) -> dict[str, Any]:
        """``summary.json`` content: the metrics in field order, then the run context's keys."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name != "run":
                v = getattr(self, f.name)
                out[f.name] = dict(v) if isinstance(v, Mapping) else v
        out.update(self.run)
        return out

    def to_row(self) -> dict[str, Any]:
        """The flat scalar row of a sweep frame."""
        return flatten(self.to_dict())

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Summary:
        """Back from a ``summary.json`` mapping (unknown keys go to ``run``)."""
        names = [f.name for f in fields(cls) if f.name != "run"]
        defaults: dict[str, Any] = {f.name: f.default for f in fields(cls) if f.name != "run"}  # older summaries lack some
        return cls(**{n: d[n] if n in d else defaults[n] for n in names},
                   run={k: v for k, v in d.items() if k not in names})


def flatten(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Scalar summary metrics as a flat dict: dicts flattened as ``decisions.pull``, bools as 0/1, strings dropped."""
    out: dict[str, Any] = {}

    def put(key: str, v: Any) -> None:
        if isinstance(v, Mapping):
            for k, x in v.items():
                put(f"{key}.{k}", x)
        elif isinstance(v, bool | np.bool_):
            out[key] = int(v)
        elif isinstance(v, int | np.integer):
            out[key] = int(v)
        elif isinstance(v, float | np.floating):
            out[key] = float(v)
        elif v is None and not key.startswith("health."):
            # health's optional texts (binding resource, error cause) are strings or None: both are dropped,
            # so every row has the same columns whichever run comes first
            out[key] = float("nan")

    for k, v in summary.items():
        put(k, v)
    return out


def profile_label(summary: Mapping[str, Any]) -> str:
    """``profile NAME, STATUS`` of a run's summary; under heterogeneous TP, when P and D are priced by different
    profiles, each role's (``P NAME (STATUS), D NAME (STATUS)``): the TP8 profile's name alone would hide that P
    runs on another."""
    p, d = summary.get("prefill_profile"), summary.get("decode_profile")
    if p is not None and d is not None and p != d:
        return (f"profiles P {p} ({summary.get('prefill_profile_status', '?')}), "
                f"D {d} ({summary.get('decode_profile_status', '?')})")
    return f"profile {summary['profile']}, {summary['profile_status']}"
