"""Fit a synthetic multi-turn workload description to a real request trace.

:func:`fit_workload` turns a :class:`~kvplan.traces.Trace` into plain data in the shape of the
scenario's ``workload`` section (``kvplan.sim.scenario.Workload``), so it can be dumped to YAML::

    conversations: <sessions in the trace>
    arrival: {kind: poisson, rate_per_s: <(sessions - 1) / span of the sessions' first arrivals>}
    turns: {dist: empirical, values: [...]}          # longest chain per session
    prefix_tokens: {dist: empirical, values: [...]}  # first-turn input
    first_turn_user_tokens: false                    # turn 1 is that input alone (no user_tokens draw on top)
    user_tokens: {dist: empirical, values: [...]}    # new tokens per later turn, clipped at >= 0
    output_tokens: {dist: empirical, values: [...]}
    turn_gap_s: {dist: lognormal, median: m, sigma: s}   # or exponential, whichever fits better (KS)
    report: {...}                                    # goodness of fit, source sha256; not a scenario field

Each distribution is one of the scenario's ``{dist: constant, value}``, ``{dist: exponential, mean}``,
``{dist: lognormal, median, sigma}``, ``{dist: uniform, low, high}`` or ``{dist: empirical, values}``.
Token counts are heavy-tailed mixtures (short messages plus pasted documents), so they stay empirical,
subsampled deterministically to at most ``max_empirical`` values at evenly spaced quantiles (the
``(i + 0.5) / m`` quantiles, inverted CDF, so every value is one that occurred). :func:`workload_section`
drops the ``report`` to give exactly the scenario section.

The turn gap is the **idle** gap, because the simulator's ``turn_gap_s`` runs from the end of a response
to the next turn's arrival: arrival-to-arrival gap minus the parent's service time, measured when the
trace has it (``service_s``) and otherwise ``service_time_fn(input_tokens, output_tokens)``, by default
:func:`~kvplan.traces.crude_service_time_s` (``input / 8000 + 0.040 * output`` s, the
illustrative estimate of WORKLOADS.md 3.1). Idle gaps that come out <= 0 (service estimate longer than
the gap) cannot be fitted by a lognormal; they are left out and their share is reported. Candidates are
fitted by maximum likelihood with location 0 (lognormal in closed form, exponential, and for information
gamma and Weibull with :mod:`scipy.stats`); the chosen one is the scenario-representable candidate
(lognormal or exponential) with the smallest Kolmogorov-Smirnov statistic. The KS p-value is computed
with the fitted parameters, so it is optimistic (Lilliefors); with thousands of gaps any real trace
rejects every simple family, so read the fitted-vs-measured percentiles, not the p-value.

The follow-up probability (does a finished turn get a next turn at all) is not a separate parameter: it
is captured by the turns-per-session distribution, P(turn k+1 | turn k) = P(turns > k) / P(turns >= k).
Caveats inherited from the trace: a finite window censors long gaps (they are missing, not long), so the
fitted tail is light; sessions cut by the window have too few turns; Mooncake sessions only contain
turns with >= 1,024 tokens of context.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, cast

import numpy as np
from scipy import stats as sps

from kvplan.errors import input_error
from kvplan.traces.stats import PERCENTILES, ServiceTimeFn, crude_service_time_s, json_ready, turn_pairs
from kvplan.traces.trace import Trace, at_least_one_token

#: A session whose first request is within this of the trace's first request starts with the trace (s).
TOGETHER_S = 1.0
#: Sessions starting with the trace at least this share of them: a cohort, whose sessions / span is no arrival rate.
COHORT_SHARE = 0.5
#: Default cap on the number of values kept in an empirical distribution.
MAX_EMPIRICAL_VALUES = 2000
#: Distribution families the scenario schema can take for ``turn_gap_s``.
REPRESENTABLE = ("lognormal", "exponential")


def _no_service(input_tokens: np.ndarray, output_tokens: np.ndarray) -> np.ndarray:
    """Zero service time (``service_time_fn=None``)."""
    return np.zeros(np.shape(input_tokens))


def empirical(
    values: Sequence[float] | np.ndarray, max_values: int = MAX_EMPIRICAL_VALUES, *, integer: bool = False
) -> dict[str, Any]:
    """``{dist: empirical, values}`` of a sample, cut to at most ``max_values`` evenly spaced quantiles.

    Deterministic (no random draw); values are sorted and, with ``integer``, whole numbers.
    """
    arr = np.sort(np.asarray(values, dtype=float))
    arr = arr[np.isfinite(arr)]
    if arr.size == 0:
        raise input_error("empirical", "no finite values to build a distribution from")
    if max_values < 1:
        raise input_error("empirical: max_values", f"is {max_values}, must be >= 1")
    if arr.size > max_values:
        probs = (np.arange(max_values) + 0.5) / max_values
        arr = np.quantile(arr, probs, method="inverted_cdf")
    vals: list[Any] = [int(round(v)) for v in arr] if integer else [float(v) for v in arr]
    return {"dist": "empirical", "values": vals}


def _ks(x: np.ndarray, dist: Any) -> tuple[float, float]:
    """KS statistic and p-value of ``x`` against a frozen scipy distribution."""
    res = sps.kstest(x, dist.cdf)
    return float(res.statistic), float(res.pvalue)


def fit_gap_distribution(values: Sequence[float] | np.ndarray) -> dict[str, Any]:
    """Fit positive gaps (seconds): lognormal, exponential, gamma, Weibull (location 0), chosen by KS.

    Returns ``{"chosen": <scenario dist dict>, "chosen_family", "best_overall_family", "candidates":
    {family: {params, ks_statistic, ks_pvalue, representable}}, "percentiles": {"measured", "fitted"}}``.
    Only lognormal and exponential can be chosen (the scenario has no gamma or Weibull).
    """
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < 2 or (x <= 0).any():
        raise input_error("fit_gap_distribution", f"needs >= 2 positive finite gaps, got {x.size} values")
    logs = np.log(x)
    mu, sigma = float(logs.mean()), float(logs.std())  # MLE of the lognormal (ddof 0)
    frozen: dict[str, Any] = {
        "lognormal": sps.lognorm(s=max(sigma, 1e-12), scale=math.exp(mu)),
        "exponential": sps.expon(scale=float(x.mean())),
    }
    params: dict[str, dict[str, float]] = {
        "lognormal": {"median": math.exp(mu), "sigma": sigma, "mu": mu},
        "exponential": {"mean": float(x.mean())},
    }
    # scipy says so with a RuntimeWarning ('Precision loss occurred in moment calculation'), which np.errstate does
    # not silence: it reached the user's stderr as two lines of library source path
    with np.errstate(all="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        # identical gaps (no spread) have no gamma/Weibull maximum-likelihood fit: those candidates are left out
        try:
            a, _, scale = sps.gamma.fit(x, floc=0)
            frozen["gamma"] = sps.gamma(a, scale=scale)
            params["gamma"] = {"shape": float(a), "scale": float(scale)}
        except (ValueError, RuntimeError, FloatingPointError):
            pass
        try:
            c, _, wscale = sps.weibull_min.fit(x, floc=0)
            frozen["weibull"] = sps.weibull_min(c, scale=wscale)
            params["weibull"] = {"shape": float(c), "scale": float(wscale)}
        except (ValueError, RuntimeError, FloatingPointError):
            pass
    candidates: dict[str, dict[str, Any]] = {}
    for name, dist in frozen.items():
        d, p = _ks(x, dist)
        candidates[name] = {
            "params": params[name],
            "ks_statistic": d,
            "ks_pvalue": p,
            "representable": name in REPRESENTABLE,
        }
    chosen_name = min(REPRESENTABLE, key=lambda k: candidates[k]["ks_statistic"])
    best = min(candidates, key=lambda k: candidates[k]["ks_statistic"])
    if chosen_name == "lognormal":
        chosen: dict[str, Any] = {"dist": "lognormal", "median": math.exp(mu), "sigma": sigma}
    else:
        chosen = {"dist": "exponential", "mean": float(x.mean())}
    qs = [p / 100 for p in PERCENTILES]
    measured = np.percentile(x, list(PERCENTILES))
    return {
        "chosen": chosen,
        "chosen_family": chosen_name,
        "best_overall_family": best,
        "n": int(x.size),
        "candidates": candidates,
        "percentiles": {
            "measured": {f"p{p}": float(v) for p, v in zip(PERCENTILES, measured, strict=True)},
            "fitted": {
                f"p{p}": float(frozen[chosen_name].ppf(q)) for p, q in zip(PERCENTILES, qs, strict=True)
            },
        },
    }


def fit_workload(
    trace: Trace,
    service_time_fn: ServiceTimeFn | None = crude_service_time_s,
    *,
    max_empirical: int = MAX_EMPIRICAL_VALUES,
    gap_model: str = "empirical",
) -> dict[str, Any]:
    """Synthetic-workload description of ``trace`` as plain data (module docstring), with a ``report``.

    ``gap_model='empirical'`` (default) puts the measured idle gaps (up to ``max_empirical`` quantiles)
    into the workload: hit rates depend on the gap CDF near the TTL, where a parametric fit can be off by
    several points (Mooncake: the lognormal's KS distance is 0.023 and its median 5 % high), so the
    advice should not inherit that error. ``'fit'`` uses the best representable parametric family.
    The goodness of fit of every family is reported either way.

    ``service_time_fn(input_tokens, output_tokens) -> seconds`` (called with arrays) estimates the
    parent's service time where the trace has no measured one; the turn gap is the idle gap.
    """
    df = trace.requests
    n = len(df)
    if n == 0:
        raise input_error(f"trace {trace.source}", "has no requests")
    if not (df["input_tokens"] > 0).any():
        raise input_error(f"trace {trace.source}", "every request has input_tokens 0: nothing to fit",
                          "check the token columns of the trace")
    duration = trace.duration_s
    sessions = df.groupby("session_id", sort=False)
    n_sessions = int(sessions.ngroups)
    depth = sessions["turn"].max().to_numpy()  # the simulator's conversation is a chain
    # a trace's 0 tokens are fitted as 1, as the replay takes them (simulate refuses a draw of 0); counted in the report
    first_in, first_in_zeros = at_least_one_token(df.loc[df["turn"] == 1, "input_tokens"].to_numpy())
    # without any service time the arrival-to-arrival gap is used as it is (reported)
    pairs = turn_pairs(trace, service_time_fn if service_time_fn is not None else _no_service)
    new_tok = pairs["new_tokens"].to_numpy(dtype=float)
    clipped = float((new_tok < 0).mean()) if new_tok.size else 0.0
    outputs, output_zeros = at_least_one_token(df["output_tokens"].to_numpy(dtype=float))
    idle = pairs["idle_s"].to_numpy(dtype=float)
    idle = idle[np.isfinite(idle)]
    positive = idle[idle > 0]
    if duration <= 0:
        raise input_error(f"trace {trace.source}", "spans 0 s, so no arrival rate can be estimated")
    # sessions that start with the trace (weka: every file on its own clock from t = 0) are a cohort, not a stream of
    # arrivals: sessions / duration is then no measured rate (AgentX: 55 sessions over its longest session's 70,723 s)
    starts = sessions["arrival_s"].min().to_numpy(dtype=float)
    together = float((starts <= float(df["arrival_s"].min()) + TOGETHER_S).mean())
    cohort = trace.format == "weka" or (n_sessions >= 2 and together >= COHORT_SHARE)
    # the rate of new conversations: intervals between session starts over their span. Sessions / (last request -
    # first request) counted the follow-ups of the last sessions as time without arrivals: 23% low on 1,500 sessions
    # started at 0.5/s with 2.5 turns 45 s apart (aud15), so the fitted workload offered 23% less load than the trace
    # (a cohort keeps sessions / the trace's span: it has no arrival rate to measure, see arrival_warning)
    start_span = float(starts.max() - starts.min())
    by_starts = not cohort and n_sessions >= 2 and start_span > 0
    rate = (n_sessions - 1) / start_span if by_starts else n_sessions / duration
    out: dict[str, Any] = {
        "conversations": n_sessions,
        "arrival": {"kind": "poisson", "rate_per_s": rate},
        "turns": empirical(depth, max_empirical, integer=True),
        "prefix_tokens": empirical(first_in, max_empirical, integer=True),
        "first_turn_user_tokens": False,  # prefix_tokens is the trace's whole first prompt (sim/workload.py)
        "user_tokens": (
            empirical(np.maximum(new_tok, 0.0), max_empirical, integer=True)
            if new_tok.size
            else {"dist": "constant", "value": 0.0}
        ),
        "output_tokens": empirical(outputs, max_empirical, integer=True),
    }
    out["turn_gap_s"], gap_fit = _turn_gap(positive, gap_model, max_empirical)
    out["report"] = {
        "source": trace.source,
        "format": trace.format,
        "sha256": trace.sha256,
        "requests": n,
        "sessions": n_sessions,
        "duration_s": duration,
        "arrival": ("one Poisson stream of new conversations at (sessions - 1) / (last session start - first session "
                    "start)" if by_starts else
                    "one Poisson stream of new conversations at sessions / (last arrival - first arrival)"),
        "arrival_rate_measured": not cohort,
        "sessions_starting_together_share": together,
        **({"arrival_warning": f"{together:.0%} of the trace's {n_sessions} sessions start with it"
            + (" (weka: every file on its own clock from t = 0)" if trace.format == "weka" else "")
            + f": they are one cohort, not a stream of arrivals, so the rate {n_sessions / duration:.4g}/s (sessions / "
            "the trace's span) is not a measured arrival rate; set workload.arrival.rate_per_s to the load to plan "
            "for (or --rate of recommend and capacity)"} if cohort else {}),
        "turns": {
            "definition": "longest chain (max turn) per session",
            "mean": float(depth.mean()),
            "single_turn_share": float((depth == 1).mean()),
            "max": int(depth.max()),
            "note": "the follow-up probability is captured by this distribution: "
            "P(turn k+1 | turn k) = P(turns > k) / P(turns >= k)",
        },
        "prefix_tokens": {"definition": "input tokens of turn-1 requests (0 taken as 1)", "n": int(first_in.size),
                          "zero_taken_as_1": first_in_zeros},
        "user_tokens": {
            "definition": "child_in - parent_in - parent_out over linked pairs, clipped at 0",
            "n": int(new_tok.size),
            "clipped_share": clipped,
        },
        "output_tokens": {"n": int(outputs.size), "zero_taken_as_1": output_zeros,
                          "definition": "output tokens of every request (0 taken as 1, as a replay does)"},
        "turn_gap": {
            "definition": "idle gap = arrival-to-arrival gap - parent service time",
            "service_time": _service_description(df, service_time_fn),
            "pairs": int(len(pairs)),
            "with_service_time": int(idle.size),
            "nonpositive_idle": int((idle <= 0).sum()),
            "nonpositive_idle_share": float((idle <= 0).mean()) if idle.size else None,
            "fit": gap_fit,
        },
        "empirical_max_values": max_empirical,
    }
    return cast(dict[str, Any], json_ready(out))


def _turn_gap(positive: np.ndarray, gap_model: str, max_empirical: int) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The workload's ``turn_gap_s`` (measured quantiles or the best family) and the families' fit report."""
    if positive.size < 2:
        return {"dist": "constant", "value": 0.0}, None
    gap_fit = fit_gap_distribution(positive)
    if gap_model == "empirical":
        return empirical(positive, max_empirical), gap_fit
    if gap_model == "fit":
        return gap_fit["chosen"], gap_fit
    raise input_error("gap_model", f"is {gap_model!r}", "use 'empirical' or 'fit'")


def _service_description(df: Any, service_time_fn: ServiceTimeFn | None) -> str:
    """Where the parent service times subtracted from the gaps come from (for the report)."""
    if np.isfinite(df["service_s"].to_numpy(dtype=float)).any():
        return "measured service_s" + (" (service_time_fn where missing)" if service_time_fn is not None else "")
    if service_time_fn is not None:
        return getattr(service_time_fn, "__name__", repr(service_time_fn))
    return "none: the arrival-to-arrival gap is used as the idle gap"


#: Relative difference above which a synthetic statistic is reported as not reproducing the trace's.
REPRODUCTION_TOLERANCE = 0.10
#: Fewest conversations drawn for the check (a trace's own count when larger).
REPRODUCTION_CONVERSATIONS = 2000
#: Below this absolute difference (tokens, turns or seconds) a statistic counts as reproduced whatever its ratio (not a
#: rate: :data:`LOAD_STATISTICS`).
REPRODUCTION_FLOOR = 2.0


def synthetic_trace(section: Mapping[str, Any], service_time_fn: ServiceTimeFn, max_model_len: int,
                    seed: int = 0) -> Trace:
    """The requests ``kvplan simulate`` of the fitted ``section`` sends on an unloaded deployment, as a trace.

    Conversations are drawn by the simulator's own :func:`kvplan.sim.workload.make_plan` (seed ``seed``, cut at
    ``max_model_len`` as a run cuts them); a follow-up arrives at its parent's arrival + the parent's unloaded service
    time (``service_time_fn``, the one the fit subtracted from the gaps) + the drawn idle gap, as the simulator's
    driver sends it when nothing queues (under load the arrival-to-arrival gaps are longer).
    """
    import pandas as pd
    from pydantic import ValidationError

    from kvplan.sim.scenario import Workload
    from kvplan.sim.workload import make_plan

    try:
        workload = Workload.model_validate(dict(section))
    except ValidationError as exc:  # e.g. turn gaps spanning more simulated time than a plan may: one line
        err = exc.errors()[0]
        raise input_error("the fitted workload", str(err["msg"]).removeprefix("Value error, ")) from None
    plan = make_plan(workload, seed, max_model_len)
    n = len(plan.prompt_tokens)
    conv = np.repeat(np.arange(len(plan.turns)), plan.turns)
    turn = np.arange(n) - plan.offsets[conv] + 1
    svc = np.asarray(service_time_fn(plan.prompt_tokens, plan.output_tokens), dtype=float)
    step = svc + plan.gap_s  # parent arrival -> next turn's arrival
    arrival = np.empty(n)
    for c in range(len(plan.turns)):
        lo, hi = int(plan.offsets[c]), int(plan.offsets[c + 1])
        if hi > lo:
            arrival[lo] = plan.start_s[c]
            arrival[lo + 1 : hi] = plan.start_s[c] + np.cumsum(step[lo : hi - 1])
    ids = np.arange(n, dtype=np.int64)
    frame = pd.DataFrame({
        "request_id": ids, "session_id": conv.astype(str), "turn": turn.astype(np.int64), "arrival_s": arrival,
        "input_tokens": plan.prompt_tokens.astype(np.int64), "output_tokens": plan.output_tokens.astype(np.int64),
        "parent_request_id": np.where(turn > 1, ids - 1, -1), "service_s": np.nan, "linkable": True,
    }).sort_values("arrival_s", kind="stable").reset_index(drop=True)
    return Trace(frame, source="synthetic (kvplan workload fit)", format="csv", sha256="",
                 notes={"truncated_conversations": plan.truncated_conversations})


def _stat_rows(st: Mapping[str, Any]) -> dict[str, float | None]:
    """The statistics ``kvplan workload show`` prints that a synthetic workload should reproduce."""
    rows: dict[str, float | None] = {}
    tps = st["turns_per_session"]
    for k in ("mean", "p50", "p90", "p99"):  # not the max: it grows with the number of sessions drawn
        rows[f"requests per session {k}"] = tps.get(k)
    for k in ("p10", "p50", "p90"):
        rows[f"gap arrival-to-arrival {k} (s)"] = st["gap_s"].get(k)
    for turn, c in st["context_by_turn"].items():
        for k in ("p50", "p90"):
            rows[f"context turn {turn} {k}"] = c.get(k)
    for k in ("p10", "p50", "p90"):
        rows[f"new tokens per turn {k}"] = st["new_tokens_per_turn"].get(k)
    for k in ("p10", "p50", "p90", "p99"):
        rows[f"output tokens {k}"] = st["output_tokens"].get(k)
    return rows


#: The load rows of the reproduction check (per second: no absolute floor).
LOAD_STATISTICS = ("new conversations per second", "requests per second")


def _load_rows(trace: Trace) -> dict[str, float | None]:
    """The load a trace offers, as the fit measures its arrival rate: new conversations per second ((sessions - 1) /
    the span of the sessions' first requests) and requests per second over that span (the requests arriving in it)."""
    df = trace.requests
    starts = df.groupby("session_id", sort=False)["arrival_s"].min().to_numpy(dtype=float)
    span = float(starts.max() - starts.min()) if starts.size else 0.0
    if starts.size < 2 or span <= 0:
        return {}
    arr = df["arrival_s"].to_numpy(dtype=float)
    inside = int(((arr >= starts.min()) & (arr <= starts.max())).sum())
    return dict(zip(LOAD_STATISTICS, ((starts.size - 1) / span, inside / span), strict=True))


def reproduction_check(trace: Trace, section: Mapping[str, Any], service_time_fn: ServiceTimeFn, max_model_len: int,
                       fit_report: Mapping[str, Any] | None = None, seed: int = 0) -> dict[str, Any]:
    """The statistics ``kvplan workload show`` prints, of the trace and of the fitted workload's requests
    (:func:`synthetic_trace`), side by side, with the ones that differ by more than :data:`REPRODUCTION_TOLERANCE`
    (and :data:`REPRODUCTION_FLOOR`) and the known reasons the fit cannot reproduce them."""
    from kvplan.sim.scenario import MAX_SIM_TIME_S
    from kvplan.traces.stats import workload_stats

    real = _stat_rows(workload_stats(trace))
    # at least REPRODUCTION_CONVERSATIONS conversations, so that a small trace is held against its fitted
    # distributions rather than against a few draws from them
    drawn = {**section, "conversations": max(int(section.get("conversations", 1)), REPRODUCTION_CONVERSATIONS)}
    arrival = drawn.get("arrival") or {}
    if arrival.get("kind") == "poisson" and drawn["conversations"] / float(arrival["rate_per_s"]) > MAX_SIM_TIME_S:
        # a sparse trace (10 sessions over a day: 2,000 drawn at its rate span 1.7e7 s) would draw beyond the
        # simulated time a plan may span (a traceback); the statistics are per conversation on an unloaded
        # deployment, so the rate only places the conversations in time (its own random stream): drawn closer
        drawn["arrival"] = {**arrival, "rate_per_s": drawn["conversations"] / (MAX_SIM_TIME_S / 2)}
    if runnable_problem(drawn) is not None:  # still not runnable (e.g. too many turns): the section as fitted
        drawn = dict(section)
    synth_trace = synthetic_trace(drawn, service_time_fn, max_model_len, seed)
    synth = _stat_rows(workload_stats(synth_trace))
    if (fit_report or {}).get("arrival_rate_measured", True):  # the load the fitted arrival rate offers (a cohort
        # measures no rate: its warning says so)
        real.update(_load_rows(trace))
        synth.update(_load_rows(synth_trace))
    rows: list[dict[str, Any]] = []
    for name, a in real.items():
        b = synth.get(name)
        if a is None or b is None:
            continue
        diff = abs(float(b) - float(a))
        floor = 0.0 if name in LOAD_STATISTICS else REPRODUCTION_FLOOR  # a rate is judged relatively only
        ok = diff <= floor or diff <= REPRODUCTION_TOLERANCE * abs(float(a))
        rows.append({"statistic": name, "trace": float(a), "synthetic": float(b), "reproduced": bool(ok)})
    missed = [r for r in rows if not r["reproduced"]]
    reasons: list[str] = []
    names = {r["statistic"] for r in missed}
    if any(n.startswith("context turn 1 ") for n in names) and section.get("first_turn_user_tokens", True):
        reasons.append("turn 1 is prefix_tokens plus one user_tokens draw in the simulator, and the fitted "
                       "prefix_tokens is the trace's whole first prompt, so the synthetic first prompts are longer by "
                       "a user_tokens draw (and every later context with them): set workload.first_turn_user_tokens: "
                       "false")
    rep = dict(fit_report or {})
    clipped = float((rep.get("user_tokens") or {}).get("clipped_share") or 0.0)
    if clipped > 0 and any(n.startswith(("context turn", "new tokens")) for n in names):
        reasons.append(f"{clipped:.1%} of the trace's follow-ups are shorter than their parent's prompt + output (new "
                       "tokens < 0: the context was trimmed or rewritten); the fit clips them at 0, so the synthetic "
                       "context only grows, and every follow-up repeats its whole previous context (workload.history "
                       "verbatim) where the trace's did not")
    if any(n.startswith("gap ") for n in names):
        gap = rep.get("turn_gap") or {}
        share = gap.get("nonpositive_idle_share")
        reasons.append("the synthetic arrival-to-arrival gap is the drawn idle gap plus the unloaded service time "
                       f"({gap.get('service_time', 'the fit')}); the trace's includes its own serving delays"
                       + (f", and its {share:.1%} of gaps shorter than that service time are left out of the idle "
                          "gaps" if share else ""))
    if names & set(LOAD_STATISTICS):
        reasons.append("the load: new conversations arrive as one Poisson stream at the rate measured from the trace's "
                       "session starts ((sessions - 1) / their span); a trace whose sessions start in bursts, or whose "
                       "window cuts its sessions, offers another load over that span (requests per second also carries "
                       "every difference in turns per session and gaps)")
    if any(n.startswith("requests per session") for n in names):
        reasons.append("turns per conversation is the longest chain per session (the simulator's conversation is a "
                       "chain): a session with branches (regenerated answers) has more requests than turns")
    truncated = int(synth_trace.notes.get("truncated_conversations", 0))
    if truncated:
        drawn_n = int(drawn["conversations"])
        reasons.append(f"{truncated:,} of the {drawn_n:,} synthetic conversations drawn for this check "
                       f"({truncated / drawn_n:.0%}) end early: their context would exceed the model's "
                       f"{max_model_len:,}-token limit (--scenario names the model whose limit applies)")
    return {
        "definition": "the statistics `kvplan workload show` prints and the load (new conversations and requests per "
        "second over the span of the sessions' starts; not for a cohort), of the trace and of the requests the fitted "
        "workload sends (drawn by the simulator's workload planner, seed "
        f"{seed}; a follow-up at its parent's arrival + unloaded service time + idle gap: no queueing)",
        "tolerance": {"relative": REPRODUCTION_TOLERANCE, "absolute": REPRODUCTION_FLOOR},
        "seed": seed,
        "statistics": rows,
        "not_reproduced": [r["statistic"] for r in missed],
        "reasons": reasons,
    }


def runnable_problem(section: Mapping[str, Any]) -> str | None:
    """Why ``section`` is not a workload ``kvplan simulate`` runs (its first validation error, naming the field), or
    None when it is one."""
    from pydantic import ValidationError

    from kvplan.sim.scenario import Workload

    try:
        Workload.model_validate(dict(section))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        # the validator's own advice ('raise arrival.rate_per_s ...') is about a scenario's fields, not a trace's
        msg = str(err["msg"]).removeprefix("Value error, ").split("; ", 1)[0]
        return f"field 'workload{'.' + loc if loc else ''}': {msg}"
    return None


def check_runnable(section: Mapping[str, Any], label: str) -> None:
    """Refuse (one line naming the trace and the field) a fitted ``section`` that ``kvplan simulate`` would refuse:
    e.g. a trace whose sessions start days apart (an arrival rate so low that the drawn arrivals span more simulated
    time than the simulator resolves) or a session with more turns than a conversation may have."""
    problem = runnable_problem(section)
    if problem is not None:
        raise input_error(label, f"the workload fitted from it is not one kvplan simulate runs ({problem})",
                          "fit a shorter stretch of the trace (fewer hours between sessions, fewer turns per session)")


def workload_section(fit: Mapping[str, Any]) -> dict[str, Any]:
    """The scenario ``workload`` section of a :func:`fit_workload` result (everything but ``report``)."""
    return {k: v for k, v in fit.items() if k != "report"}


__all__ = [
    "MAX_EMPIRICAL_VALUES",
    "empirical",
    "fit_gap_distribution",
    "fit_workload",
    "reproduction_check",
    "synthetic_trace",
    "workload_section",
]
