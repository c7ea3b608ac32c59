"""Rules over ``compare`` rows: the best policy (saturated policies not eligible, as in recommend's saturation rule;
paired differences over common random numbers, ties to the cheaper policy) and when to try ``cross_layer_blocks``
(the pull is a large part of TTFT).

Pure functions of the rows, except :func:`cross_layer_note`, which evaluates the calibrated transfer cost
(:mod:`kvplan.models.formulas`) for the mean pulled size.
"""

from __future__ import annotations

import math
from typing import Any

from kvplan.plan.advice_rules import mean_ci
from kvplan.sim.scenario import Scenario
from kvplan.units import human_s

#: mean TTFT p90 differences within this share of the lowest p90 are ties even when significant
PRACTICAL_TIE = 0.01
MAX_ERROR_SHARE = 0.01
BEST_RULE = ("best policy: among the policies with at most 1% of turns errored, saturating no resource (health: in "
             "any replication; when every one does, those saturating in the fewest replications), within the decode "
             "HBM budget (peak pinned KV) and meeting the SLO when given, those whose TTFT p90 is not significantly "
             "above the lowest "
             "one's: the per-replication differences (same seeds, common random numbers) have a mean within 1% of "
             "the lowest p90 or a 95% t-interval that reaches 0 (one replication: within 1%); ties go to the cheaper "
             "policy: lowest $ per million turns (within 1%), then the least pinned decode KV (time-weighted mean), "
             "then list order; when no policy meets the SLO, each is ranked by the p90 of the run that judged it (the "
             "longer run for one meeting it over the first), within 1% a tie")
BEST_CANDIDATES = ("off", "ttl_recommended", "lease", "ttl_evictable", "offload", "aggregated")
#: Pulls taking at least this share of the mean TTFT make compare try ``cross_layer_blocks`` (the advisor's
#: link-binding rule uses one half; at a third most of a long pull's time is per-descriptor cost already).
CROSS_LAYER_PULL_SHARE = 0.3
CROSS_LAYER = "+cross_layer"


def _by_rep(row: dict[str, Any]) -> list[float] | None:
    v = row.get("ttft_p90_s_by_replication")
    if not isinstance(v, list) or not v or not all(isinstance(x, int | float) and math.isfinite(x) for x in v):
        return None
    return [float(x) for x in v]


def paired_difference(row: dict[str, Any], ref: dict[str, Any]) -> tuple[float, float]:
    """Mean and 95% t half-width of ``row - ref`` TTFT p90 over replications with the same seeds (NaN half-width
    with one replication or without per-replication values: then the difference of the means)."""
    a, b = _by_rep(row), _by_rep(ref)
    if a is None or b is None or len(a) != len(b):
        return float(row["ttft_p90_s"]) - float(ref["ttft_p90_s"]), math.nan
    return mean_ci([x - y for x, y in zip(a, b, strict=True)])


def not_worse(row: dict[str, Any], ref: dict[str, Any]) -> bool:
    """Whether ``row``'s TTFT p90 is not significantly above ``ref``'s (see :data:`BEST_RULE`)."""
    if row is ref:
        return True
    diff, half = paired_difference(row, ref)
    if diff <= PRACTICAL_TIE * float(ref["ttft_p90_s"]):
        return True
    return math.isfinite(half) and diff - half <= 0.0


def saturated_share(row: dict[str, Any]) -> float:
    """Share of a compare row's replications saturating its most often saturated resource (0: none; 1 when the
    row names saturated resources without per-replication counts)."""
    sat = row.get("saturated") or []
    if not sat:
        return 0.0
    counts = row.get("saturated_replications") or {}
    reps = row.get("replications")
    if not counts or not isinstance(reps, int) or reps <= 0:
        return 1.0
    return min(max(float(counts.get(r, reps)) for r in sat) / reps, 1.0)


def _judged_longer(row: dict[str, Any]) -> bool:
    """Whether the row's SLO verdict came from a longer run than its first (``compare``'s SLO judging)."""
    return row.get("slo_ttft_p90_s") is not None and row.get("slo_ttft_p90_s") != row.get("ttft_p90_s")


def judged_p90(row: dict[str, Any]) -> float:
    """The TTFT p90 the row's SLO verdict used: its longer run's when it was judged on one, else its first run's."""
    v = row.get("slo_ttft_p90_s")
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else float(row["ttft_p90_s"])


def best_policy(rows: list[dict[str, Any]], slo_ttft_p90_ms: float | None = None,
                budget_gib: float | None = None) -> dict[str, Any]:
    """Apply :data:`BEST_RULE` to compare rows: ``{'policy', 'ttft_p90_s', 'pinned_kv_gib_mean', 'rule', 'why',
    'ties', 'compared'}`` (``compared`` has each row's paired difference to the lowest p90)."""
    meets = [r for r in rows if r["errors"] <= MAX_ERROR_SHARE * (r["turns"] or 0)
             and (budget_gib is None or r["pinned_kv_gib_peak"] <= budget_gib)
             # the SLO verdict of a row judged on a longer run (recommend --policies), else its first run's p90
             and (slo_ttft_p90_ms is None or (bool(r["slo_met"]) if "slo_met" in r
                                              else r["ttft_p90_s"] * 1000 <= slo_ttft_p90_ms))]
    # as recommend's saturation rule: a saturated policy's queue grows with the run, so its TTFT (and its interval)
    # is no measure and it is not eligible, whatever its cost; when every one saturates, the fewest replications
    ok = [r for r in meets if not saturated_share(r)]
    why = ""
    # no policy meets the SLO and some were judged on a longer run: rank each by the p90 its verdict used (a policy
    # fast over the first run and at capacity over the longer one was named best on the first run's figure)
    judged = slo_ttft_p90_ms is not None and not meets and any(_judged_longer(r) for r in rows)
    if not ok:
        pool = meets or list(rows)
        least = min(saturated_share(r) for r in pool)
        ok = [r for r in pool if saturated_share(r) == least]
        among = ("" if len(ok) == len(pool) else " among those saturating nothing" if least == 0 else
                 " among those saturating in the fewest replications")
        why = ("no policy meets every constraint" if not meets else
               "every policy within the constraints saturates a resource (health): the deployment is too small for "
               "the load whatever the policy") + ": the lowest TTFT p90 decides" + among
        if judged:
            why += (" (each policy's p90 on the run that judged its SLO: the longer run for those meeting it over the "
                    "first; ties within 1%)")
    if judged:
        ref = min(ok, key=lambda r: (judged_p90(r), rows.index(r)))
        ties = [r for r in ok if judged_p90(r) <= judged_p90(ref) * (1 + PRACTICAL_TIE)]
    else:
        ref = min(ok, key=lambda r: (r["ttft_p90_s"], rows.index(r)))
        ties = [r for r in ok if not_worse(r, ref)]
    usd = [r.get("usd_per_million_turns") for r in ties]
    known = [u for u in usd if isinstance(u, int | float) and math.isfinite(u)]
    cheapest = min(known) if known else None

    def cost_key(r: dict[str, Any]) -> tuple[int, float, int]:
        u = r.get("usd_per_million_turns")
        dearer = cheapest is not None and isinstance(u, int | float) and u > cheapest * (1 + PRACTICAL_TIE)
        return int(dearer), float(r["pinned_kv_gib_mean"]), rows.index(r)

    best = min(ties, key=cost_key)
    if not judged and best is not ref:
        d, h = paired_difference(best, ref)
        if d > PRACTICAL_TIE * float(ref["ttft_p90_s"]):
            # a tie by the interval only: the pick's p90 is higher than the lowest by more than a practical tie, and
            # the answer beside it (recommend's columns, compare's table) shows that; say why it is still the pick
            reps = len(_by_rep(best) or [])
            why = ((why + "; ") if why else "") + (
                f"{best['policy']} ties with the lowest TTFT p90 ({ref['policy']}, {human_s(float(ref['ttft_p90_s']))})"
                f" only by the width of the 95% interval over {reps} replication(s): its p90 is {human_s(d)} "
                f"(±{human_s(h)}) higher, {d / float(ref['ttft_p90_s']):.0%} of it; ties go to the cheaper policy (then "
                "the least pinned KV, then list order), and more replications (--replications) would tell whether the "
                "difference is real")
    compared = []
    for r in rows:
        d, h = paired_difference(r, ref)
        compared.append({**{k: r.get(k) for k in ("policy", "ttft_p90_s", "ttft_p90_s_ci95", "pinned_kv_gib_mean",
                                                   "errors", "usd_per_million_turns", "saturated", "slo_ttft_p90_s",
                                                   "slo_judged_conversations", "slo_met")},
                         "ttft_p90_diff_to_lowest_s": d, "ttft_p90_diff_ci95": h})
    return {"policy": best["policy"], "ttft_p90_s": judged_p90(best) if judged else best["ttft_p90_s"],
            "ttft_p90_judged_conversations": best.get("slo_judged_conversations") if judged else None,
            "pinned_kv_gib_mean": best["pinned_kv_gib_mean"],
            "hit_rate": best["hit_rate"], "rule": BEST_RULE, "why": why, "lowest_ttft_p90_policy": ref["policy"],
            "ties": [r["policy"] for r in ties], "compared": compared}


def _bidirectional_pd(row: dict[str, Any]) -> bool:
    st = row.get("settings") or {}
    return bool(st.get("policy.bidirectional")) and st.get("deployment.mode") != "aggregated"


def cross_layer_candidate(sc: Scenario, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The fastest bidirectional P/D row whose pulls take >= :data:`CROSS_LAYER_PULL_SHARE` of its mean TTFT,
    when the scenario does not already use cross-layer blocks (else None)."""
    if sc.deployment.cross_layer_blocks:
        return None
    big = [r for r in rows if _bidirectional_pd(r) and (r.get("pull_rate") or 0) > 0
           and math.isfinite(r.get("kv_pull_mean_s") or math.nan)
           and r["kv_pull_mean_s"] >= CROSS_LAYER_PULL_SHARE * r["ttft_mean_s"]]
    return min(big, key=lambda r: (r["ttft_p90_s"], rows.index(r))) if big else None


def cross_layer_note(sc: Scenario, reps: list[dict[str, Any]], row: dict[str, Any]) -> str:
    """What the descriptors cost: NIXL descriptors per rank and the modelled idle-link pull of the mean pulled size,
    without and with cross-layer blocks, against the measured pull and TTFT."""
    from kvplan.sim.engine import resolve
    from kvplan.sim.pull import read_path

    pulls = [(r.get("pulled_tokens") or 0, r.get("decisions.pull") or 0) for r in reps]
    per = [t / n for t, n in pulls if n]
    tokens = int(round(sum(per) / len(per))) if per else 0
    rs = resolve(sc)
    paths = [read_path(sc, rs, cross_layer=x) for x in (False, True)]  # as the simulator composes a pull
    d0, d1 = (p.phases(tokens)[0] for p in paths)
    t0, t1 = (p.time_s(tokens) for p in paths)
    return (f"pulls take {row['kv_pull_mean_s'] * 1000:.0f} ms of a {row['ttft_mean_s'] * 1000:.0f} ms mean TTFT "
            f"under {row['policy']}: a mean pull of {tokens:,} tokens posts {d0:,} NIXL descriptors per rank "
            f"({t0 * 1000:.0f} ms modelled on an idle link), {d1:,} with cross-layer blocks ({t1 * 1000:.0f} ms)")
