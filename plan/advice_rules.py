"""The pure decision rules of :mod:`kvplan.plan.advice`: simulated rows in, the TTL choice and its reasons out.

Nothing here simulates. :func:`ttl_curve` turns the replicated rows of each TTL into :class:`TtlCandidate`
objects; :func:`choose_ttl` applies the TTL rule (:data:`kvplan.plan.advice.RULES`); :func:`apply_slo` moves
the TTL up for a TTFT p90 SLO and :func:`judge_recommended_slo` judges the SLO on the recommended deployment's own
runs; :func:`binding_constraint` names what limits the recommendation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kvplan.plan.breakeven import BreakEven
from kvplan.plan.executor import t_quantile_975
from kvplan.units import human_s

Rows = list[dict[str, Any]]
#: (mean, 95% CI half-width) of a paired difference over replications
Gain = tuple[float, float]

GIB = 1024**3
#: The TTL rule: the shortest TTL reaching this fraction of the unlimited-TTL benefit.
BENEFIT_FRACTION = 0.95
#: A TTFT change smaller than this fraction of the baseline's mean is not worth acting on.
MATERIAL_FRACTION = 0.01
#: Retention "expires unread" when the longest TTL's hit rate is below this fraction of the unlimited one.
EXPIRES_UNREAD_HIT_FRACTION = 0.5
#: Decode HBM binds when the mean decode admission wait exceeds this fraction of the mean TTFT.
D_QUEUE_BINDING_FRACTION = 0.05
#: Prefill compute binds at this prefill utilisation or above.
PREFILL_SATURATED_UTILISATION = 0.8
#: The link binds when pulls take more than this fraction of the mean TTFT.
LINK_BINDING_FRACTION = 0.5

#: The binding constraints (``binding_constraint`` names one of them).
TURN_GAPS, DECODE_HBM, PREFILL_COMPUTE, LINK = "turn-gap distribution", "decode HBM", "prefill compute", "link"
P_KV_POOL = "P's KV pool"
D_THREAD, P_THREAD = "D's engine thread", "P's engine thread"
#: Health resource (:mod:`kvplan.sim.health`) -> binding constraint, in the order a saturated one is named.
SATURATED_BINDING = (("decode_kv", DECODE_HBM), ("prefill_held_kv", P_KV_POOL), ("decode_engine_thread", D_THREAD),
                     ("prefill_engine_thread", P_THREAD), ("prefill_compute", PREFILL_COMPUTE), ("link", LINK))

#: The per-run row column of P's busy share that the advice and ``compare`` report and :data:`PREFILL_SATURATED_UTILISATION`
#: is held against: the health section's (:mod:`kvplan.sim.health`), the busiest P engine's busy time (summary
#: ``prefill_utilization_steady_max``; the summary's ``prefill_utilization_steady`` is the mean) over the steady window (the
#: second half of the arrivals; a closed loop: the active span), the window health judges saturation over, so that
#: neither the ramp-up nor the drain after the last arrival dilutes it (the whole-run ``prefill_utilization`` does).
#: JSON keys of recommend (``expected``/``baseline``/``bidirectional_off``), compare's rows and capacity's answers:
#: ``prefill_utilization_steady`` is this figure; ``prefill_utilization`` the whole-run busy share (the summary's, what
#: sweeps report: busy time from 0 to the last response).
PREFILL_UTILIZATION_COLUMN = "health.resources.prefill_compute.utilization"
#: Metric name -> column of the per-run rows (:func:`kvplan.plan.executor.summarise` output).
METRIC_COLUMNS = (
    ("ttft_mean_s", "ttft_mean_s"), ("ttft_p50_s", "ttft_p50_s"), ("ttft_p90_s", "ttft_p90_s"),
    ("ttft_p99_s", "ttft_p99_s"), ("hit_rate", "hit_rate"), ("errors", "errors"),
    ("pinned_kv_gib_mean", "steady_pinned_kv_gib_mean"), ("pinned_kv_gib_peak", "pinned_kv_gib_peak"),
    ("prefill_utilization", "prefill_utilization"), ("prefill_utilization_steady", PREFILL_UTILIZATION_COLUMN),
    ("kv_pull_mean_s", "kv_pull_mean_s"),
    ("d_queue_mean_s", "d_queue_mean_s"), ("p2d_transfer_mean_s", "p2d_transfer_mean_s"),
)


def _signed(x: float) -> str:
    """A signed time difference in human units."""
    return ("+" if x >= 0 else "-") + human_s(abs(x))


def mean_ci(x: Sequence[float]) -> Gain:
    """Mean and 95% CI half-width (Student t) of the finite values of ``x``; NaN when undefined."""
    a = np.asarray([v for v in x if v is not None and not math.isnan(v)], dtype=float)
    if len(a) == 0:
        return math.nan, math.nan
    if len(a) == 1:
        return float(a[0]), math.nan
    return float(a.mean()), t_quantile_975(len(a)) * float(a.std(ddof=1)) / math.sqrt(len(a))


def col(rows: Rows, key: str) -> list[float]:
    """Column ``key`` of the rows, NaN for a failed run."""
    return [float(r.get(key, math.nan)) if r.get("error") is None else math.nan for r in rows]


def paired(a: Rows, b: Rows, key: str = "ttft_mean_s") -> Gain:
    """Mean and CI half-width of ``a[key] - b[key]`` paired by replication (common random numbers)."""
    return mean_ci([x - y for x, y in zip(col(a, key), col(b, key), strict=True)])


def significant_gain(d: Gain, scale: float) -> bool:
    """``d`` = (mean, ci) of (baseline - candidate): positive beyond the CI and by more than 1% of ``scale``."""
    mean, ci = d
    if math.isnan(mean):
        return False
    return mean > MATERIAL_FRACTION * scale and (math.isnan(ci) or mean - ci > 0)


def metrics(rows: Rows, max_num_seqs: int, n_decode: int) -> dict[str, float]:
    """Replication means and CI half-widths of the reported metrics, plus the decode batch capacity."""
    out: dict[str, float] = {}
    for key, src in METRIC_COLUMNS:
        out[key], out[f"{key}_ci95"] = mean_ci(col(rows, src))
    caps = []
    for r in rows:
        if r.get("error") is not None:
            continue
        pinned_tok = r["steady_pinned_kv_gib_mean"] * GIB / r["kv_bytes_per_token_all_ranks"] / n_decode
        if not math.isfinite(pinned_tok):  # no steady window (e.g. a trace whose sessions all start at 0): unknown,
            continue  # not max_num_seqs (min() with a NaN returned it: pins that raised the batch capacity)
        free = max(r["decode_kv_capacity_tokens"] - pinned_tok, 0)
        caps.append(min(max_num_seqs, free / max(r["mean_request_kv_tokens"], 1.0)))
    out["decode_batch_capacity"], out["decode_batch_capacity_ci95"] = mean_ci(caps)
    return out


def router_ttl(ttl: float, margin: float, allowance: float) -> int:
    """The router rule: ``floor(TTL - margin - allowance)``, at least 1 s (a router TTL of 0 would forget every
    conversation at once)."""
    return int(max(math.floor(ttl - margin - allowance), 1))


@dataclass(frozen=True)
class TtlCandidate:
    """One TTL of the grid, simulated: its metrics and its benefit over bidirectional off."""

    ttl_s: float
    router_ttl_s: int
    metrics: dict[str, float]
    benefit: Gain
    unlimited_benefit_s: float
    feasible: bool
    significant: bool
    saturated: str = ""  # what the runs saturate ('' = nothing; a saturated TTL is not feasible)
    steady: bool = True  # arrival span >= TTL + p90 conversation span in every replication
    router_settled: bool = True  # the router TTL leaves room for this candidate's own P-decision delay
    allowance_s: float = 1.0  # the P-decision allowance its router TTL was derived with
    saturated_share: float = 0.0  # share of its replications saturating its most often saturated resource

    @property
    def benefit_s(self) -> float:
        """Mean TTFT lowered against bidirectional off (s; positive is better)."""
        return self.benefit[0]

    @property
    def benefit_fraction(self) -> float:
        """Share of the unlimited-TTL benefit this TTL reaches."""
        return self.benefit_s / self.unlimited_benefit_s if self.unlimited_benefit_s > 0 else math.nan

    def curve_row(self) -> dict[str, Any]:
        """The ``ttl_curve`` entry of the recommendation JSON."""
        m = self.metrics
        return {
            "ttl_s": self.ttl_s, "router_ttl_s": self.router_ttl_s, "ttft_mean_s": m["ttft_mean_s"],
            "ttft_p90_s": m["ttft_p90_s"], "hit_rate": m["hit_rate"], "benefit_s": self.benefit_s,
            "benefit_ci95": self.benefit[1], "benefit_fraction": self.benefit_fraction,
            "pinned_kv_gib_mean": m["pinned_kv_gib_mean"], "pinned_kv_gib_peak": m["pinned_kv_gib_peak"],
            "feasible": self.feasible, "significant": self.significant, "saturated": self.saturated,
            "steady": self.steady, "router_settled": self.router_settled, "p_decision_allowance_s": self.allowance_s,
        }


@dataclass(frozen=True)
class Evidence:
    """What the TTL rule reads: the baseline, the unlimited-TTL run and the curve."""

    curve: list[TtlCandidate]
    off_mean_s: float
    unlimited: Gain
    unlimited_hit_rate: float
    budget_gib: float | None
    gap_text: str
    local_prefix_tokens: int
    gap_p10_s: float = math.nan  # the workload's or trace's p10 turn gap (s)
    off_saturated: str = ""  # what bidirectional off saturates ('' = nothing)
    replications: int = 1


@dataclass
class TtlChoice:
    """The TTL rule's outcome: the chosen candidate (None: retention off), the constraint, the reasons."""

    chosen: TtlCandidate | None
    retention_off: bool
    binding: str
    rationale: list[str] = field(default_factory=list)
    #: retention off because its gain is not resolved by the replications, not because it is absent (a phrase for
    #: the headline, '' otherwise)
    inconclusive: str = ""


@dataclass(frozen=True)
class RunFacts:
    """What the advisor measured of one TTL's runs besides its metrics (router TTL, saturation, steadiness)."""

    router_ttl_s: int
    allowance_s: float
    settled: bool
    saturated: str
    steady: bool
    saturated_share: float = 0.0  # :attr:`TtlCandidate.saturated_share`


def ttl_curve(grid: Sequence[float], ttl_rows: dict[float, Rows], off: Rows, unlimited: Gain, off_mean_s: float,
              metric_fn: Any, budget_gib: float | None, facts: dict[float, RunFacts]) -> list[TtlCandidate]:
    """One :class:`TtlCandidate` per TTL of ``grid`` (``metric_fn(rows) -> metrics``); a TTL whose runs saturate a
    resource is not feasible."""
    out = []
    for t in grid:
        mt = metric_fn(ttl_rows[t])
        gain = paired(off, ttl_rows[t])
        f = facts[t]
        out.append(TtlCandidate(
            ttl_s=t, router_ttl_s=f.router_ttl_s, metrics=mt, benefit=gain, unlimited_benefit_s=unlimited[0],
            feasible=(budget_gib is None or mt["pinned_kv_gib_peak"] <= budget_gib) and not f.saturated,
            significant=significant_gain(gain, off_mean_s), saturated=f.saturated, steady=f.steady,
            router_settled=f.settled, allowance_s=f.allowance_s, saturated_share=f.saturated_share))
    return out


def gap_text(gaps: np.ndarray) -> str:
    """The turn-gap quantiles the rationale quotes."""
    p10, p50, p90 = (float(np.percentile(gaps, q)) for q in (10, 50, 90))
    return f"turn gaps p10 {p10:.3g} s, p50 {p50:.3g} s, p90 {p90:.3g} s"


def choose_ttl(ev: Evidence) -> TtlChoice:
    """The TTL rule (module docstring of :mod:`kvplan.plan.advice`); every TTL saturated: :func:`_all_saturated`;
    retention off when bidirectional off saturates and a feasible TTL does not: :func:`_off_saturated` instead."""
    if ev.curve and all(c.saturated for c in ev.curve):
        return _all_saturated(ev)
    choice = _by_benefit(ev)
    feasible = [c for c in ev.curve if c.feasible]
    if choice.retention_off and ev.off_saturated and feasible:
        return _off_saturated(ev, feasible)
    over = [c for c in ev.curve if not c.saturated and not c.feasible]  # saturating nothing, above the budget
    if choice.retention_off and ev.off_saturated and not feasible and over and ev.budget_gib is not None:
        return _over_budget(ev, over)
    return choice


def _over_budget(ev: Evidence, over: list[TtlCandidate]) -> TtlChoice:
    """Bidirectional off saturates, and every TTL that saturates nothing peaks above the decode HBM budget: no
    retention setting serves the load within the budget. Said as such (the budget binds), not as a gain the
    replications failed to resolve: off's saturated mean TTFT is no measure of retention's gain (the saturation
    rule), and more replications cannot make a TTL fit the budget."""
    least = min(over, key=lambda c: c.metrics["pinned_kv_gib_peak"])
    return TtlChoice(None, True, DECODE_HBM, [
        f"Bidirectional off saturates {ev.off_saturated} at this load, and every TTL that saturates nothing pins more "
        f"decode KV at its peak than the {ev.budget_gib:g} GiB budget (the least: TTL {least.ttl_s:g} s, "
        f"{least.metrics['pinned_kv_gib_peak']:.1f} GiB): within this budget no TTL serves the load. Raise "
        f"--decode-hbm-budget-gib to at least {least.metrics['pinned_kv_gib_peak']:.0f} GiB for TTL "
        f"{least.ttl_s:g} s, or add nodes (`kvplan capacity`); until then plain P/D (bidirectional off), saturated."])


def _by_benefit(ev: Evidence) -> TtlChoice:
    """The benefit rule: the unlimited-TTL gain, then the shortest feasible TTL reaching 95% of it."""
    if not significant_gain(ev.unlimited, ev.off_mean_s):
        if material_unresolved(ev.unlimited, ev.off_mean_s):
            return _inconclusive(ev, "unlimited retention", ev.unlimited)
        return TtlChoice(None, True, TURN_GAPS, [
            f"Even unlimited retention does not lower mean TTFT materially (gain {human_s(ev.unlimited[0])} vs "
            f"{human_s(ev.off_mean_s)} with bidirectional off): pulls are not faster than recomputing here, or "
            "turns rarely come back."])
    target = BENEFIT_FRACTION * ev.unlimited[0]
    feasible = [c for c in ev.curve if c.feasible]
    reach = [c for c in feasible if c.benefit_s >= target]
    if reach:
        return _reaching(ev, reach[0], target)
    significant = [c for c in feasible if c.significant]
    if not significant:
        unresolved = [c for c in feasible if material_unresolved(c.benefit, ev.off_mean_s)]
        if unresolved:
            best = max(unresolved, key=lambda c: c.benefit_s)
            return _inconclusive(ev, f"TTL {best.ttl_s:g} s", best.benefit)
        return _retention_down(ev)
    return _best_attainable(ev, significant)


def material_unresolved(d: Gain, scale: float) -> bool:
    """``d`` = (mean, ci) of a TTFT gain: material on its mean (> 1% of ``scale``) but its 95% CI reaches 0."""
    mean, ci = d
    return bool(math.isfinite(mean) and mean > MATERIAL_FRACTION * scale and math.isfinite(ci) and mean - ci <= 0)


def replications_to_resolve(d: Gain, n: int) -> int:
    """Replications that would put a gain's 95% CI half-width below its mean, at the spread these ``n`` showed
    (the half-width shrinks as t(n-1) / sqrt(n)); at least twice ``n``."""
    mean, ci = d
    if n < 2 or not (math.isfinite(ci) and ci > 0 and mean > 0):
        return max(2 * n, 3)
    sd = ci * math.sqrt(n) / t_quantile_975(n)
    # t(m-1) > 1.96 always, so no m below (1.96 sd / mean)^2 resolves it: start there, a few t quantiles at most
    m = max(n, int((1.96 * sd / mean) ** 2))
    while m < 10_000 and t_quantile_975(m) * sd / math.sqrt(m) >= mean:
        m += 1
    return max(m, 2 * n)


def _inconclusive(ev: Evidence, what: str, gain: Gain) -> TtlChoice:
    n = ev.replications
    need = replications_to_resolve(gain, n)
    return TtlChoice(None, True, TURN_GAPS, [
        f"INCONCLUSIVE: {what} lowers mean TTFT by {human_s(gain[0])} on average ({human_s(ev.off_mean_s)} with "
        f"bidirectional off), but with {n} replications its 95% CI (+-{human_s(gain[1])}) includes no gain: the "
        f"replications disagree too much to tell. Rerun with --replications {need} or more (at the spread seen here); "
        "until then this advice keeps vLLM's plain P/D (bidirectional off), the setting that needs no evidence."],
        inconclusive=f"retention's TTFT gain is not resolved by {n} replications (rerun with --replications {need})")


def _reaching(ev: Evidence, rec: TtlCandidate, target: float) -> TtlChoice:
    shorter = ev.curve[: ev.curve.index(rec)]
    hbm = ev.budget_gib is not None and any(c.benefit_s >= target and not c.feasible for c in shorter)
    return TtlChoice(rec, False, DECODE_HBM if hbm else TURN_GAPS, [
        f"TTL {rec.ttl_s:g} s is the shortest reaching {rec.benefit_fraction:.0%} of the unlimited-TTL "
        f"benefit ({human_s(rec.benefit_s)} of {human_s(ev.unlimited[0])} mean TTFT); {ev.gap_text}."])


def _all_saturated(ev: Evidence) -> TtlChoice:
    """Every TTL tried saturates something: among the TTLs saturating in the fewest replications, the best mean TTFT,
    and bidirectional off, said as such. A TTL that saturates in one replication of three is the safer bet than one
    that saturates in all three, whatever their means (a saturated run's mean TTFT grows with the run's length)."""
    least = min(c.saturated_share for c in ev.curve)
    fewest = [c for c in ev.curve if c.saturated_share == least]
    best = min(fewest, key=lambda c: c.metrics["ttft_mean_s"])
    keep = significant_gain(best.benefit, ev.off_mean_s)
    off = f"bidirectional off saturates {ev.off_saturated}" if ev.off_saturated else "bidirectional off does not"
    what = "; ".join(sorted({c.saturated for c in ev.curve}))
    among = "" if len(fewest) == len(ev.curve) else " of those saturating in the fewest replications"
    if keep:
        pick = f"TTL {best.ttl_s:g} s has the lowest mean TTFT{among}"
    elif best.benefit_s > 0:  # lower on average, but not significantly: say so, with the figures measured
        pick = (f"none lowers mean TTFT significantly against bidirectional off (the lowest{among}, TTL "
                f"{best.ttl_s:g} s: {human_s(best.metrics['ttft_mean_s'])} against {human_s(ev.off_mean_s)}, a gain "
                f"whose 95% CI +-{human_s(best.benefit[1])} includes none over {ev.replications} replications)")
    else:
        pick = "none lowers mean TTFT against bidirectional off"
    return TtlChoice(best if keep else None, not keep, DECODE_HBM if "decode HBM" in best.saturated else PREFILL_COMPUTE, [
        f"Every TTL tried saturates the deployment at this load ({what}; {off}): {pick}, but the deployment is "
        "too small for the load whatever the TTL."])


def _off_saturated(ev: Evidence, feasible: list[TtlCandidate]) -> TtlChoice:
    """Bidirectional off saturates a resource while feasible TTLs saturate nothing in any replication: retention off
    is not eligible, as a saturated TTL is not (its queue grows with the run, so its mean TTFT, and a gain measured
    against it, depend on the run's length and spread between replications: the benefit rule's CI is no measure).
    The shortest feasible TTL reaching 95% of the best feasible gain."""
    best = max(feasible, key=lambda c: c.benefit_s)
    rec = next((c for c in feasible if c.benefit_s >= BENEFIT_FRACTION * best.benefit_s), best)
    return TtlChoice(rec, False, TURN_GAPS, [
        f"Bidirectional off saturates {ev.off_saturated} at this load while TTL {rec.ttl_s:g} s saturates nothing in "
        "any replication: retention off is not eligible (the saturation rule; a saturated run's mean TTFT grows with "
        f"the run, so the gain over it is no measure of retention). TTL {rec.ttl_s:g} s is the shortest unsaturated "
        f"TTL reaching 95% of the best unsaturated gain ({human_s(best.benefit_s)} of mean TTFT at "
        f"{best.ttl_s:g} s)."])


def _retention_down(ev: Evidence) -> TtlChoice:
    top = max(ev.curve, key=lambda c: c.ttl_s)
    best = max(ev.curve, key=lambda c: c.benefit_s)
    hit, peak = top.metrics["hit_rate"], top.metrics["pinned_kv_gib_peak"]
    gain = human_s(ev.unlimited[0])
    binding = TURN_GAPS
    if ev.budget_gib is not None and any(c.significant for c in ev.curve):
        why = f"no TTL that helps fits the {ev.budget_gib:g} GiB decode HBM budget"
        binding = DECODE_HBM
    elif hit < EXPIRES_UNREAD_HIT_FRACTION * ev.unlimited_hit_rate and ev.gap_p10_s > top.ttl_s:
        why = (f"{ev.gap_text}: they lie far beyond every TTL considered (up to {top.ttl_s:g} s), so retained "
               f"blocks expire unread (hit rate {hit:.1%} at {top.ttl_s:g} s vs {ev.unlimited_hit_rate:.1%} "
               f"unlimited) while pinning up to {peak:.1f} GiB of decode HBM; unlimited retention would gain "
               f"{gain} only by holding KV for hours")
    elif hit < EXPIRES_UNREAD_HIT_FRACTION * ev.unlimited_hit_rate:
        why = (f"retained blocks mostly expire unread (hit rate {hit:.1%} at {top.ttl_s:g} s vs "
               f"{ev.unlimited_hit_rate:.1%} unlimited; {ev.gap_text}) and no TTL tried lowers mean TTFT significantly "
               f"(best {_signed(best.benefit_s)} at {best.ttl_s:g} s)")
    else:
        why = (f"retained blocks are read back (hit rate {hit:.1%} at {top.ttl_s:g} s) but no finite TTL lowers mean "
               f"TTFT significantly (best {_signed(best.benefit_s)} at {best.ttl_s:g} s): the pulls are little "
               f"faster than recomputing what P's prefix cache lacks (local prefix ~{ev.local_prefix_tokens} "
               f"tokens), and the pinned KV (up to {peak:.1f} GiB) shrinks the decode batch; the unlimited-TTL gain "
               f"of {gain} needs unbounded decode memory")
        binding = DECODE_HBM if top.metrics["d_queue_mean_s"] > 0 else binding
    return TtlChoice(None, True, binding, [f"Turn retention down: {why}."])


def _best_attainable(ev: Evidence, significant: list[TtlCandidate]) -> TtlChoice:
    best = max(significant, key=lambda c: c.benefit_s)
    rec = next(c for c in significant if c.benefit_s >= BENEFIT_FRACTION * best.benefit_s)
    by_hbm = ev.budget_gib is not None and any(not c.feasible and c.benefit_s > best.benefit_s for c in ev.curve)
    where = f"within the {ev.budget_gib:g} GiB budget" if by_hbm else f"in the grid ({ev.gap_text})"
    return TtlChoice(rec, False, DECODE_HBM if by_hbm else TURN_GAPS, [
        f"No TTL reaches 95% of the unlimited-TTL benefit ({human_s(ev.unlimited[0])}) {where}; TTL "
        f"{rec.ttl_s:g} s reaches 95% of the best attainable ({human_s(best.benefit_s)})."])


def apply_slo(choice: TtlChoice, curve: list[TtlCandidate], off_metrics: dict[str, float], slo_ms: float | None,
              warnings: list[str]) -> dict[str, Any]:
    """Raise the TTL to the shortest feasible one meeting the TTFT p90 SLO (in place); the ``slo`` JSON."""
    if slo_ms is None:
        return {}
    slo_s = slo_ms / 1000

    def p90(c: TtlCandidate | None) -> float:
        return c.metrics["ttft_p90_s"] if c is not None else off_metrics["ttft_p90_s"]

    if p90(choice.chosen) > slo_s:
        rec = choice.chosen
        better = [c for c in curve if c.feasible and c.metrics["ttft_p90_s"] <= slo_s
                  and (rec is None or c.ttl_s > rec.ttl_s)]
        if better:
            choice.chosen, choice.retention_off = better[0], False
            choice.rationale.append(f"TTL raised to {better[0].ttl_s:g} s, the shortest meeting the TTFT p90 SLO "
                                    f"of {slo_ms:g} ms.")
    met_p90 = p90(choice.chosen)
    slo = {"ttft_p90_ms": slo_ms, "met": bool(met_p90 <= slo_s), "expected_ttft_p90_ms": met_p90 * 1000}
    if not slo["met"]:
        warnings.append(f"the TTFT p90 SLO of {slo_ms:g} ms is not met at any TTL ({human_s(met_p90)} expected)")
    return slo


def judge_recommended_slo(slo: dict[str, Any], p90_s: float, warnings: list[str]) -> dict[str, Any]:
    """The SLO verdict on the recommended deployment itself (``p90_s``: the TTFT p90 of its runs, the ``expected``
    column), replacing :func:`apply_slo`'s verdict on the TTL curve's runs. The curve's runs choose the TTL, but the
    recommendation also carries the threshold the simulation check chose and, when adopted, cross-layer blocks:
    judged on the curve, a deployment whose own p90 (printed in the same table) is within the SLO was said to miss
    it, and one missing it could be said to meet it. ``warnings`` gets the reason when it is not met."""
    if not slo:
        return slo
    slo_ms = float(slo["ttft_p90_ms"])
    met = bool(p90_s <= slo_ms / 1000)
    if not met:
        where = "at any TTL" if not slo["met"] else "by the recommended deployment (its threshold and transfer settings)"
        warnings.append(f"the TTFT p90 SLO of {slo_ms:g} ms is not met {where} ({human_s(p90_s)} expected)")
    return {**slo, "met": met, "expected_ttft_p90_ms": p90_s * 1000}


def judge_recommended_budget(budget_gib: float | None, peak_gib: float, curve_peak_gib: float,
                             warnings: list[str]) -> bool | None:
    """Whether the recommended deployment's own peak pinned decode KV (``peak_gib``, the ``expected`` column's) fits
    the HBM budget; None without a budget. The TTL rule judged the budget on the TTL curve's run
    (``curve_peak_gib``), which has neither the threshold the simulation check chose nor adopted cross-layer blocks:
    those move the peak, so a TTL inside the budget on the curve can recommend a deployment above it, said here."""
    if budget_gib is None or not math.isfinite(peak_gib):
        return None
    if peak_gib <= budget_gib:
        return True
    warnings.append(f"the recommended deployment pins up to {peak_gib:.1f} GiB of decode KV at its peak, above the "
                    f"{budget_gib:g} GiB budget: its TTL was judged within it on the TTL curve's run ({curve_peak_gib:.1f} "
                    "GiB peak), and its threshold and transfer settings moved the peak; lower the TTL or raise "
                    "--decode-hbm-budget-gib")
    return False


def binding_constraint(binding: str, m: dict[str, float], slo: dict[str, Any], retained: bool,
                       saturated: Sequence[str] = ()) -> str:
    """The constraint at the recommendation (metrics ``m``): a resource its runs saturate (health keys in
    ``saturated``, named in :data:`SATURATED_BINDING` order), decode HBM when the TTL rule found it, else from the
    waits and utilisations measured."""
    for res, name in SATURATED_BINDING:
        if res in saturated:
            return name
    if binding == DECODE_HBM:
        return binding
    if m["d_queue_mean_s"] > D_QUEUE_BINDING_FRACTION * m["ttft_mean_s"]:
        return DECODE_HBM
    pull_small = m["kv_pull_mean_s"] <= LINK_BINDING_FRACTION * m["ttft_mean_s"]
    if m["prefill_utilization_steady"] >= PREFILL_SATURATED_UTILISATION or (slo and not slo["met"] and pull_small):
        return PREFILL_COMPUTE  # saturated P, or an SLO no TTL can meet: the P leg of misses dominates
    if retained and not pull_small:
        return LINK
    return binding


def binding_text(binding: str, m: dict[str, float], gaps: str) -> str:
    """The ``binding_constraint`` sentence of the recommendation."""
    return {
        TURN_GAPS: f"turn-gap distribution ({gaps}; longer TTLs add < 5% of the benefit)",
        DECODE_HBM: "decode HBM (pinned KV against the budget / the decode KV pool)",
        P_KV_POOL: "P's KV pool (prompts held for D's reads fill it; P's queue waits on the lease backpressure)",
        PREFILL_COMPUTE: f"prefill compute (P busy {m['prefill_utilization_steady']:.0%}; the prefill of first turns "
                         "and misses sets the TTFT tail)",
        LINK: f"link (pulls take {human_s(m['kv_pull_mean_s'])} of a {human_s(m['ttft_mean_s'])} TTFT)",
        D_THREAD: "D's engine thread (creating and posting the P->D reads, over TCP also moving their bytes, stalls "
                  "D's steps: fewer descriptors per read, enable_cross_layers_blocks, or an RDMA transport)",
        P_THREAD: "P's engine thread (creating and posting the D->P reads stalls P's steps: fewer descriptors per "
                  "read, enable_cross_layers_blocks, or an RDMA transport)",
    }[binding]


def threshold_rationale(threshold: int, be: BreakEven, without_cross_layer: BreakEven | None = None) -> str:
    """The threshold sentence of the rationale; ``without_cross_layer``: the break-even without the cross-layer
    blocks the recommendation adopted (``be`` is then the one with them)."""
    adopted = (f"; with the cross-layer blocks adopted, whose pull is cheaper: {without_cross_layer.tokens} without "
               "them" if without_cross_layer is not None else "")
    return (f"Threshold {threshold} tokens: analytic break-even {be.tokens} ({be.verdict}; pull "
            f"{human_s(be.pull_s)} vs recompute {human_s(be.recompute_s)} at n*, local prefix "
            f"{be.local_prefix_tokens}, tail {be.tail_tokens}{adopted}).")
