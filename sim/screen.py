"""A fast analytic screen of a sweep grid: no queueing, vectorised numpy over every point.

Per point (open-loop workloads; closed-loop points get NaN where a rate is needed):

* **hit rate** of follow-up turns: ``P(pull case) F(w_pull) + P(recompute/local case) F(w_router)`` with
  ``F`` the turn-gap CDF, ``w_pull = min(router TTL, D TTL - safety margin - clock skew - P-leg overhead)``
  (P declines a read when ``now + margin >= expiry``, VLLM_BEHAVIOUR.md 1.5) and ``w_router`` the router
  TTL (the local/recompute decisions are taken before the expiry check). Zero when bidirectional is off.
* **pinned decode KV** by Little's law: ``lambda_conv x bytes/token x (E[sum of non-final turn tokens] x
  r_nonfinal + E[final turn tokens] x TTL)``, where a non-final turn's blocks are held ``gap + P-leg
  (+ pull)`` when read and the full TTL otherwise (never-returning final turns hold the whole TTL).
* **prefill utilisation** ``lambda_turns x E[prefill time of the computed tokens] / prefill nodes`` and
  **decode KV demand** (pinned + running KV) over the decode pool; running KV from the decode batch
  fixed point ``B = lambda' out t_step(B)``.
* **pull vs recompute** of a follow-up's missing tokens (models/costs.py ``transfer_time_s`` with
  descriptors vs the marginal prefill time).

Token counts use means (turns: E[T], E[T^2] from quantile samples); truncation at ``max_model_len`` and
P-side queueing are ignored. The screen may order or prune a sweep, but the simulator wins whenever they
disagree: :func:`compare_screen` lists every disagreement.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd
from scipy import special

from kvplan.models.arch import kv_bytes_per_token_all_ranks, kv_bytes_per_token_per_rank, kv_regions_per_rank
from kvplan.sim.grid import Grid
from kvplan.sim.router import KV_AWARE_ROUTING
from kvplan.sim.scenario import ClosedLoopArrival, Constant, Dist, Empirical, Exponential, LogNormal, Scenario, Uniform
from kvplan.sim.workload import load_empirical_values

GIB = 1024**3
QUANTILES = 256
SCREEN_COLUMNS = [
    "screen_hit_rate",
    "screen_pinned_kv_gib_mean",
    "screen_prefill_utilization",
    "screen_decode_kv_demand",
    "screen_pull_s",
    "screen_recompute_s",
    "screen_pull_beats_recompute",
    "screen_feasible",
    "screen_cost",
]
# How far the simulator may be from the screen before the point is listed as a disagreement.
TOLERANCES = {"hit_rate": 0.05, "steady_pinned_kv_gib_mean": 0.20, "prefill_utilization": 0.15}
SATURATED_UTILIZATION = 0.95  # simulator: P busy this share of its active time = saturated
SATURATED_QUEUE_S = 1.0  # simulator: mean wait in P's queue or for D's KV blocks above this = saturated


def _values(dist: Empirical) -> np.ndarray:
    if dist.values is not None:
        return np.asarray(dist.values, dtype=float)
    return load_empirical_values(dist.path or "", dist.column)


def quantile_sample(dist: Dist, m: int = QUANTILES) -> np.ndarray:
    """``m`` mid-quantiles of a scenario distribution (deterministic stand-in for its draws)."""
    u = (np.arange(m) + 0.5) / m
    if isinstance(dist, Constant):
        return np.full(m, dist.value)
    if isinstance(dist, Exponential):
        return -dist.mean * np.log1p(-u)
    if isinstance(dist, LogNormal):
        return dist.median * np.exp(dist.sigma * special.ndtri(u))
    if isinstance(dist, Uniform):
        return dist.low + (dist.high - dist.low) * u
    return np.quantile(_values(dist), u)


def gap_cdf_partial(dist: Dist, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``F(w) = P(G <= w)`` and the partial mean ``E[G; G <= w]`` of a turn-gap distribution, vectorised in ``w``."""
    w = np.asarray(w, dtype=float)
    if isinstance(dist, Constant):
        hit = (dist.value <= w).astype(float)
        return hit, hit * dist.value
    if isinstance(dist, Exponential):
        m = dist.mean
        x = np.maximum(w, 0.0)
        e = np.exp(-x / m)
        return 1 - e, m * (1 - e) - x * e
    if isinstance(dist, LogNormal):
        mu, s = np.log(dist.median), dist.sigma
        if s == 0:
            hit = (dist.median <= w).astype(float)
            return hit, hit * dist.median
        with np.errstate(divide="ignore"):
            z = (np.log(np.maximum(w, 0.0)) - mu) / s
        return special.ndtr(z), np.exp(mu + s * s / 2) * special.ndtr(z - s)
    if isinstance(dist, Uniform):
        lo, hi = dist.low, dist.high
        if hi == lo:
            hit = (lo <= w).astype(float)
            return hit, hit * lo
        x = np.clip(w, lo, hi)
        return (x - lo) / (hi - lo), (x * x - lo * lo) / (2 * (hi - lo))
    v = np.sort(_values(dist))
    cs = np.concatenate([[0.0], np.cumsum(v)])
    k = np.searchsorted(v, w, side="right")
    return k / len(v), cs[k] / len(v)


def _point_params(sc: Scenario, cache: dict[str, Any]) -> dict[str, Any]:
    from kvplan.sim.engine import resolve

    sections = {"model", "hardware", "profile", "deployment", "costs"}
    key = json.dumps(sc.model_dump(mode="json", include=sections), sort_keys=True)
    if key not in cache:
        cache[key] = resolve(sc)
    rs = cache[key]
    wl, pol, dep = sc.workload, sc.policy, sc.deployment
    t = np.maximum(1, np.rint(quantile_sample(wl.turns)))
    out_q = np.maximum(1, np.rint(quantile_sample(wl.output_tokens)))
    closed = isinstance(wl.arrival, ClosedLoopArrival)
    return {
        "t_q": t,
        "rate": np.nan if closed else wl.arrival.rate_per_s,
        "conversations": wl.conversations,
        "et": t.mean(),
        "et2": (t * t).mean(),
        "prefix": float(np.maximum(0, np.rint(quantile_sample(wl.prefix_tokens))).mean()),
        "user": float(np.maximum(0, np.rint(quantile_sample(wl.user_tokens))).mean()),
        "out": float(out_q.mean()),
        "out_q": out_q,
        "gap": wl.turn_gap_s,
        "ttl": pol.decoder_kv_blocks_ttl_s,
        "router": pol.router_ttl_s,
        "margin": pol.expiry_safety_margin_s + pol.clock_skew_s,
        "on": float(pol.bidirectional and pol.send_conversation_id),
        "thr": pol.kv_recompute_threshold_tokens,
        "same_p": 1.0 if (dep.prefill_nodes == 1 or dep.routing in KV_AWARE_ROUTING) else 1.0 / dep.prefill_nodes,
        "p_cache": float(dep.prefill_prefix_caching),
        "n_p": dep.prefill_nodes,
        "n_d": dep.decode_nodes,
        "bs": rs.arch.block_size_tokens,
        "b_rank": kv_bytes_per_token_per_rank(rs.arch, dep.tensor_parallel_size),
        "b_all": kv_bytes_per_token_all_ranks(rs.arch, dep.tensor_parallel_size),
        "regions": kv_regions_per_rank(rs.arch, dep.cross_layer_blocks),
        "cap": rs.decode_capacity_tokens,
        "costs": rs.costs,
        "per_byte": rs.per_byte_s,
    }


def _entry_share(turns_q: np.ndarray, e: float) -> float:
    """Mean over follow-up turns of P(the router holds an entry): ``q_1 = 1``, ``q_{j+1} = 1 - e q_j``."""
    t_max = int(turns_q.max())
    if t_max < 2:
        return 1.0
    q = np.empty(t_max - 1)
    q[0] = 1.0
    for j in range(1, t_max - 1):
        q[j] = 1 - e * q[j - 1]
    cq = np.concatenate([[0.0], np.cumsum(q)])
    n_follow = np.maximum(turns_q.astype(int) - 1, 0)
    total = n_follow.sum()
    return float(cq[n_follow].sum() / total) if total > 0 else 1.0


def _pull_s(pp: dict[str, Any], n: np.ndarray) -> np.ndarray:
    """transfer_time_s (post + xfer + poll) of ``n`` tokens on an idle link, vectorised."""
    tc = pp["costs"].transfer
    desc = pp["regions"] * np.ceil(np.maximum(n, 0) / pp["bs"])
    return (
        tc.post_fixed_s + tc.post_per_descriptor_s * desc + tc.fixed_s + tc.per_descriptor_s * desc
        + pp["per_byte"] * n * pp["b_rank"] + tc.poll_s
    )


def screen_scenarios(scenarios: list[Scenario]) -> pd.DataFrame:
    """The analytic screen of a list of scenarios (one row each, columns :data:`SCREEN_COLUMNS`)."""
    cache: dict[str, Any] = {}
    pts = [_point_params(sc, cache) for sc in scenarios]
    n = len(pts)
    if n == 0:
        return pd.DataFrame(columns=SCREEN_COLUMNS)
    col = {k: np.array([p[k] for p in pts], dtype=float) for k in pts[0] if k not in ("gap", "costs", "out_q", "t_q")}
    pc = [p["costs"].prefill for p in pts]
    per_tok = np.array([c.per_token_s for c in pc])
    att = np.array([c.attention_s for c in pc])
    fixed = np.array([c.fixed_s for c in pc])
    p_leg = np.array([p["costs"].overhead.p_leg_s for p in pts])
    et, et2 = col["et"], col["et2"]
    prefix, user, out = col["prefix"], col["user"], col["out"]
    inc = user + out
    # mean retained context of a follow-up's previous turn k-1: prefix + (k-1)(user+out) - 1, with
    # E[k-1 | follow-up] = E[T(T-1)/2] / E[T-1]
    mean_km1 = np.where(et > 1, (et2 - et) / 2 / np.maximum(et - 1, 1e-12), 0.0)
    ctx_prev = np.maximum(prefix + inc * mean_km1 - 1, 1.0)
    # pull size: the previous output (+ partial block) when P still holds the prompt, else the whole context
    local_p = col["p_cache"] * col["same_p"]
    n_small = out - 1 + (col["bs"] - 1) / 2
    n_big = ctx_prev
    frac_small_pull = np.array(
        [float(np.mean(p["out_q"] - 1 + (p["bs"] - 1) / 2 >= p["thr"])) for p in pts]
    )
    frac_big_pull = (n_big >= col["thr"]).astype(float)
    frac_pull = local_p * frac_small_pull + (1 - local_p) * frac_big_pull
    n_pull = np.where(local_p > 0.5, n_small, n_big)
    pull_s = np.array([float(_pull_s(p, np.array([x]))[0]) for p, x in zip(pts, n_pull, strict=True)])
    recompute_s = per_tok * n_pull + att * (n_pull * np.maximum(ctx_prev - n_pull, 0) + n_pull * (n_pull + 1) / 2)
    # hit windows and gap statistics (per point: each point's gap distribution)
    w_pull = np.minimum(col["router"], col["ttl"] - col["margin"] - p_leg)
    w_rt = col["router"]
    f_pull, e_pull, f_rt, e_rt = (np.zeros(n) for _ in range(4))
    for i, p in enumerate(pts):
        f, e = gap_cdf_partial(p["gap"], np.array([w_pull[i], w_rt[i]]))
        f_pull[i], e_pull[i], f_rt[i], e_rt[i] = f[0], e[0], f[1], e[1]
    on = col["on"]  # no conversation_id (or bidirectional off): the router never hits
    f_pull, e_pull, f_rt, e_rt = f_pull * on, e_pull * on, f_rt * on, e_rt * on
    h = frac_pull * f_pull + (1 - frac_pull) * f_rt
    # with kv_load_failure_policy 'fail' a router hit that P declines (gap in (w_pull, w_router]) errors the
    # turn; the erroring turn stores no router entry, so the next follow-up is a miss: a two-state chain
    fail = np.array([1.0 if sc.policy.kv_load_failure_policy == "fail" else 0.0 for sc in scenarios])
    e = fail * frac_pull * np.maximum(f_rt - f_pull, 0.0)
    entry = np.array([_entry_share(p["t_q"], ei) for p, ei in zip(pts, e, strict=True)])
    hit = entry * h
    err = entry * e  # errored share of follow-up turns (they pin nothing)
    # retention of a non-final turn: gap + P leg (+ pull) when read back, the full TTL otherwise
    ttl = col["ttl"]
    r_pull = e_pull + (p_leg + pull_s) * f_pull + ttl * (1 - f_pull)
    r_rt = e_rt + p_leg * f_rt + ttl * (1 - f_rt)
    r_nf = frac_pull * r_pull + (1 - frac_pull) * r_rt
    first_tokens = prefix + inc - 1
    multi = (et > 1) * 1.0
    later = (et - 1) * (prefix - 1) + inc * (et2 - et) / 2 - first_tokens * multi  # turns 2..T-1
    sum_nonfinal_tokens = first_tokens * multi + (1 - err) * later
    final_tokens = (prefix - 1 + inc * et) * np.where(et > 1, 1 - err, 1.0)
    rate = col["rate"]
    bidir = np.array([1.0 if sc.policy.bidirectional else 0.0 for sc in scenarios])
    pinned_tok = rate * (sum_nonfinal_tokens * r_nf + final_tokens * ttl) * bidir
    pinned_gib = pinned_tok * col["b_all"] / GIB
    # prefill work per turn: turn 1 computes its prompt; a follow-up computes user+1 after a pull, the
    # uncached tail when P still holds the prompt, the whole prompt otherwise
    prompt_f = ctx_prev + 1 + user
    comp_hit_pull = user + 1
    comp_local = n_small + user + 1
    comp_follow = (
        local_p * (hit * frac_small_pull * comp_hit_pull + (1 - hit * frac_small_pull) * comp_local)
        + (1 - local_p) * (hit * frac_big_pull * comp_hit_pull + (1 - hit * frac_big_pull) * prompt_f)
    )
    first = prefix + user

    def t_prefill(c: np.ndarray, cached: np.ndarray) -> np.ndarray:
        return fixed + per_tok * c + att * (c * cached + c * (c + 1) / 2)

    t_turn = (t_prefill(first, np.zeros(n)) + (et - 1) * t_prefill(comp_follow, prompt_f - comp_follow)) / et
    lam_turns = rate * et
    # the per-step fixed cost is paid per request only when it finds P idle (probability ~ 1 - rho_var);
    # otherwise the request joins a step that pays it anyway (continuous batching)
    rho_var = lam_turns * (t_turn - fixed) / col["n_p"]
    util = rho_var + lam_turns * fixed / col["n_p"] * np.clip(1 - rho_var, 0, 1)
    # decode: batch fixed point B = l' out (a + b B + c B ctx) per node
    dcs = [p["costs"].decode for p in pts]
    a = np.array([d.fixed_s for d in dcs])
    b = np.array([d.per_seq_s for d in dcs])
    c = np.array([d.per_context_token_s for d in dcs])
    ctx_run = prompt_f + out / 2
    lam_d = lam_turns / col["n_d"]
    denom = 1 - lam_d * out * (b + c * ctx_run)
    batch = np.where(denom > 0, lam_d * out * a / np.where(denom > 0, denom, 1), np.inf)
    running_tok = batch * col["n_d"] * (prompt_f + out)
    demand = (pinned_tok + running_tok) / (col["cap"] * col["n_d"])
    feasible = (util < 1) & (demand < 1)
    return pd.DataFrame(
        {
            "screen_hit_rate": hit,
            "screen_pinned_kv_gib_mean": pinned_gib,
            "screen_prefill_utilization": util,
            "screen_decode_kv_demand": demand,
            "screen_pull_s": pull_s,
            "screen_recompute_s": recompute_s,
            "screen_pull_beats_recompute": (pull_s < recompute_s).astype(int),
            "screen_feasible": np.where(np.isnan(rate), 1, feasible.astype(int)),
            "screen_cost": col["conversations"] * et,
        }
    )


def analytic_screen(grid: Grid) -> pd.DataFrame:
    """The analytic screen over every point of ``grid``: ``point``, the axis values, then :data:`SCREEN_COLUMNS`."""
    scen = [grid.scenario(i) for i in range(grid.n_points)]
    df = screen_scenarios(scen)
    df.insert(0, "point", np.arange(grid.n_points, dtype=np.int64))
    for j, name in enumerate(grid.axis_names):
        df.insert(1 + j, name, [_axis_cell(grid.point_values(i)[j]) for i in range(grid.n_points)])
    return df


def _axis_cell(v: Any) -> Any:
    return json.dumps(v, sort_keys=True) if isinstance(v, dict | list) else v


def simulator_saturated(row: dict[str, Any] | pd.Series) -> bool:
    """Whether a simulated run is saturated: P busy >= 95% of its active time, or a mean wait above 1 s in
    P's queue or for decode KV blocks (per-run keys, or the ``_mean`` columns of an aggregate)."""

    def get(k: str) -> float:
        v = row.get(k, row.get(f"{k}_mean", 0.0))
        return 0.0 if v is None or (isinstance(v, float) and np.isnan(v)) else float(v)

    return (get("prefill_utilization") >= SATURATED_UTILIZATION or get("prefill_queue_mean_s") > SATURATED_QUEUE_S
            or get("d_queue_mean_s") > SATURATED_QUEUE_S)


def compare_screen(screen: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Every (point, metric) where the simulator (per-point means) and the screen disagree; the simulator wins.

    Columns: ``point, metric, screen, simulator, tolerance``. Hit rate and prefill utilisation compare in
    absolute terms, steady pinned KV relatively (and only above 0.5 GiB); ``feasible`` compares the
    screen's verdict with :func:`simulator_saturated`.
    """
    rows: list[dict[str, Any]] = []
    sim = summary.set_index("point")
    pairs = [
        ("hit_rate", "screen_hit_rate", False),
        ("steady_pinned_kv_gib_mean", "screen_pinned_kv_gib_mean", True),
        ("prefill_utilization", "screen_prefill_utilization", False),
    ]
    for _, s in screen.iterrows():
        p = int(s["point"])
        if p not in sim.index:
            continue
        m = sim.loc[p]
        for metric, scol, rel in pairs:
            col = f"{metric}_mean"
            if col not in m.index or pd.isna(m[col]) or pd.isna(s[scol]):
                continue
            tol = TOLERANCES[metric]
            a, b = float(s[scol]), float(m[col])
            bad = (abs(a - b) > tol * max(abs(b), 1e-12) and max(abs(a), abs(b)) > 0.5) if rel else abs(a - b) > tol
            if bad:
                rows.append({"point": p, "metric": metric, "screen": a, "simulator": b, "tolerance": tol})
        sat = simulator_saturated({str(k): v for k, v in m.items()})
        if bool(s["screen_feasible"]) == sat:
            rows.append(
                {"point": p, "metric": "feasible", "screen": float(s["screen_feasible"]), "simulator": float(not sat),
                 "tolerance": 0.0}
            )
    return pd.DataFrame(rows, columns=["point", "metric", "screen", "simulator", "tolerance"])
