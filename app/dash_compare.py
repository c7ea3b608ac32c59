"""The Compare page's plain data: the policy choices, a caption naming the deployment shown, the rows in human
units and the best policy (``kvplan compare``'s rule, :func:`kvplan.plan.compare.best_policy`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from kvplan.app.cmd_compare import health_cell
from kvplan.plan import compare as cmp
from kvplan.sim.scenario import Scenario
from kvplan.units import human_s

#: KV-aware routings of the aggregated replicas the page offers next to the sidebar's.
AGGREGATED_ROUTED = ("aggregated:prefix_aware", "aggregated:session_affinity")


def compare_policy_choices() -> list[str]:
    """Every modelled policy, then the aggregated replicas with prefix-aware and session-affinity routing."""
    names = [n for n in cmp.DEFAULT_POLICIES if cmp.implemented(n)]
    return names + [n for n in AGGREGATED_ROUTED if cmp.implemented(n)]


def default_policy_selection(sc: Scenario, names: Sequence[str]) -> tuple[list[str], list[str]]:
    """The page's default selection (every choice but ``ttl_recommended`` and the routed aggregated variants) without
    the policies ``sc`` cannot run, as ``kvplan compare``'s default list leaves them out
    (:func:`kvplan.plan.compare.default_left_out`: offload without a host tier, aggregated without a TP of the
    scenario's or on GPUs that are not whole replicas), and one line per policy left out saying why."""
    left = cmp.default_left_out(sc, names)
    out = {x["policy"] for x in left}
    chosen = [n for n in names if n != "ttl_recommended" and ":" not in n and n.partition(":")[0] not in out]
    return chosen, [f"{x['policy']} not selected: {x['why']}" for x in left]


#: Session keys of the page's policy selection and of the policies left out when it was last drawn.
SELECTION_KEY = "compare_policies"
LEFT_OUT_KEY = "compare_left_out"


def drop_left_out(state: Any, sc: Scenario, names: Sequence[str]) -> None:
    """When the policies ``sc`` cannot run (:func:`default_policy_selection`) differ from those of the last render,
    remove them from the page's selection in ``state`` (Streamlit's session state, a mapping), before the widget is
    drawn; a policy the user selects again while it cannot run is refused by compare, in one line."""
    out = sorted({x["policy"] for x in cmp.default_left_out(sc, names)})
    if state.get(LEFT_OUT_KEY) not in (None, out) and SELECTION_KEY in state:
        state[SELECTION_KEY] = [n for n in state[SELECTION_KEY] if n.partition(":")[0] not in out]
    state[LEFT_OUT_KEY] = out


def compare_caption(sc: Scenario) -> str:
    """What the page simulates, naming the deployment of the sidebar (its P/D counts, TP and GPUs)."""
    dep = sc.deployment
    tp = dep.tensor_parallel_size
    p_tp = dep.prefill_tensor_parallel_size or tp
    d_tp = dep.decode_tensor_parallel_size or tp
    gpus = dep.prefill_nodes * p_tp + dep.decode_nodes * d_tp
    tps = f"TP{tp}" if p_tp == d_tp else f"P TP{p_tp}, D TP{d_tp}"
    where = "a trace replay" if sc.workload.trace is not None else f"{sc.workload.conversations:,} conversations"
    return (f"{dep.prefill_nodes}P{dep.decode_nodes}D {tps} ({gpus} GPUs, {sc.model} on {sc.hardware}), {where}: "
            "every policy on these GPUs (aggregated: the same GPUs as replicas of the same TP), the same workload and "
            "the same replication seeds (spawned from the sidebar's seed, as `kvplan compare`). ttl_recommended "
            "reuses the Advice page's recommendation for this scenario (no SLO, no budget, the same replications) "
            "when there is one, else first runs the advisor's sweeps (slow).")


TIME_COLUMNS = (("TTFT p50", "ttft_p50_s"), ("TTFT p90", "ttft_p90_s"), ("TTFT p99", "ttft_p99_s"),
                ("TTFT mean", "ttft_mean_s"), ("TPOT mean", "tpot_mean_s"))


def _pct(v: Any) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{float(v):.1%}"


def _share(r: Mapping[str, Any], key: str) -> str:
    """A share as a percentage with its CI as the CLI prints a share's: the range clipped to 0-100%."""
    from kvplan.app.cmd_compare import shown_ci

    v, ci = r.get(key), shown_ci(r, key)
    if ci is None or v is None or (isinstance(v, float) and math.isnan(v)):
        return _pct(v)
    lo, hi = max(float(v) - ci, 0.0), min(float(v) + ci, 1.0)
    return f"{float(v):.1%} [{lo * 100:.1f}-{hi * 100:.1f}%]"


def _capped(v: Any) -> Any:
    """A busy share at most 1 (a steady-window figure above 1 is a step straddling the window's edges)."""
    return min(float(v), 1.0) if isinstance(v, int | float) and not math.isnan(v) else v


def _num(v: Any, fmt: str) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(float(v), fmt)


def _ci(r: Mapping[str, Any], key: str, fmt: str) -> str:
    """' ± CI' of ``key`` as the CLI table shows it (:func:`kvplan.app.cmd_compare.shown_ci`), or nothing."""
    from kvplan.app.cmd_compare import shown_ci

    ci = shown_ci(r, key)
    return f" ± {format(ci, fmt)}" if ci is not None and r.get(key) is not None else ""


def _time(r: Mapping[str, Any], key: str) -> str:
    from kvplan.app.cmd_compare import shown_ci  # the CLI table's rule: every CI with > 1 replication, none with 1

    ci = shown_ci(r, key)
    return human_s(r.get(key)) + (f" ± {human_s(ci)}" if ci is not None else "")


def compare_display_frame(rows: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The rows for people: times scaled (ms, s, min, h) with their 95% CI, shares as %, GiB, $ per M turns."""
    out = []
    for r in rows:
        # health first, as the CLI's table: a saturated column's TTFT measures the queue, not the policy
        row: dict[str, Any] = {"policy": r["policy"], "GPUs": r["gpus"], "health": health_cell(dict(r))}
        row.update({label: _time(r, key) for label, key in TIME_COLUMNS})
        row.update({
            "hit rate": _share(r, "hit_rate"), "reuse rate": _share(r, "reuse_rate"),
            # every figure with its CI where the CLI prints one (shown_ci's rule)
            **{label: _num(r.get(key), ".1f") + _ci(r, key, ".1f") for label, key in (
                ("pinned KV mean GiB", "pinned_kv_gib_mean"), ("pinned KV peak GiB", "pinned_kv_gib_peak"),
                # prompts P holds for D's reads (the lease's and P saturation's cost), as the CLI's held KV rows
                ("held KV mean GiB", "held_kv_gib_mean"), ("held KV peak GiB", "held_kv_gib_peak"),
                ("errors", "errors"), ("preemptions", "preemptions"))},
            # at most 100%, as the CLI table and the health lines print it (the raw figure stays in the rows)
            "prefill/engine util": _pct(_capped(r.get("prefill_utilization_steady", r.get("prefill_utilization")))),
            "$ per M turns": _num(r.get("usd_per_million_turns"), ",.0f") + _ci(r, "usd_per_million_turns", ",.0f"),
        })
        out.append(row)
    return pd.DataFrame(out)


def compare_warnings(rows: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[str]]:
    """What ``kvplan compare`` prints under its table about how to read it: (warnings, notes). Warnings: a policy
    saturated a resource (its TTFT measures the queue), the replications were identical (their ±0 says nothing about
    similar traffic); notes: a busy share shown capped at 100%."""
    from kvplan.app.cmd_compare import CAPPED_NOTE, IDENTICAL_NOTE, capped, identical_replications

    warn: list[str] = []
    if any(r.get("saturated") for r in rows):
        warn.append("SATURATED: the health section of at least one replication (k/n: k of the n) found requests "
                    "waiting > 1 s at p90 on a resource >= 90% busy; that column's TTFT measures the queue, not the "
                    "policy")
    reps = rows[0].get("replications") if rows else None
    if isinstance(reps, int) and reps > 1 and identical_replications(rows):
        warn.append(f"± 0: {IDENTICAL_NOTE}")
    notes = [CAPPED_NOTE] if any(capped(dict(r)) for r in rows) else []
    return warn, notes


def best_policy_text(best: Mapping[str, Any]) -> str:
    """One line: the best policy, its TTFT p90 and pinned KV, and the policies it tied with."""
    ties = [p for p in best.get("ties", []) if p != best["policy"]]
    tie = (f"; not significantly slower than {best['lowest_ttft_p90_policy']} (paired over the same seeds), tied "
           f"with {', '.join(ties)}, the cheaper wins" if ties else "")
    why = f" ({best['why']})" if best.get("why") else ""
    return (f"**Best policy: {best['policy']}** (TTFT p90 {human_s(best['ttft_p90_s'])}, pinned KV mean "
            f"{best['pinned_kv_gib_mean']:.1f} GiB){tie}{why}")
