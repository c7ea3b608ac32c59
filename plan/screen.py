"""A fast analytic screen of a sweep grid: no queueing, vectorised numpy over every point.

Per point (open-loop workloads; closed loops are declined, see :data:`CLOSED_LOOP_DECLINED`, and so are trace
replays in a sweep, :data:`TRACE_DECLINED`):

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
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import pandas as pd
from scipy import special

from kvplan.models.arch import kv_bytes_per_token_all_ranks, kv_bytes_per_token_per_rank, kv_regions_per_rank
from kvplan.models.costs import CostModel, decode_step_coefficients, prefill_step_time_s
from kvplan.plan.grid import Grid
from kvplan.sim.engine import Resolved, resolve, resolve_roles
from kvplan.sim.pull import ReadPath, read_path
from kvplan.sim.router import KV_AWARE_ROUTING
from kvplan.sim.scenario import (
    Constant,
    Dist,
    Empirical,
    Exponential,
    LogNormal,
    PoissonArrival,
    Scenario,
    Uniform,
    Workload,
)
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
TOLERANCES = {"hit_rate": 0.05, "steady_pinned_kv_gib_mean": 0.20, "prefill_utilization_steady": 0.15,
              "prefill_utilization": 0.15}
#: The simulator's P busy share the screen's prefill utilisation is held against, first present first: the mean over
#: P engines over the steady window (the second half of the arrivals; what the screen's steady-state per-node
#: ``lambda x E[prefill time] / nodes`` predicts), else the whole-run share (0 to the last response, diluted by the
#: ramp-up and the drain; only a closed loop, which the screen does not rate, has no window).
UTILIZATION_COLUMNS = ("prefill_utilization_steady", "prefill_utilization")
#: The simulator's P busy share judged for saturation, first present first: the busiest P engine's over the steady
#: window (the health section's figure), the engines' mean there, else the whole-run share.
SATURATION_COLUMNS = ("prefill_utilization_steady_max", "prefill_utilization_steady", "prefill_utilization")
#: Why a closed loop is not screened (the sweep prints it when it has such points).
CLOSED_LOOP_DECLINED = (
    "closed-loop points are not screened (NaN): the arrival rate is not an input there, throughput = clients / "
    "(response time + think time) by Little's law and the response time is the queueing the screen leaves out; "
    "and a conversation's turn gap includes its client's other active conversations, so the turn-gap CDF does not "
    "give the hit rate (only with one conversation per client, when the gap is the think time, is it screened)")
#: Why a trace replay is not screened (the sweep prints it when it has such points).
TRACE_DECLINED = (
    "trace-replay points are not screened (NaN): the screen reads the synthetic workload (arrival rate, turns, "
    "tokens, turn gaps), which a replayed workload.trace does not use")
SATURATED_UTILIZATION = 0.95  # simulator: P busy this share of its active time = saturated
SATURATED_QUEUE_S = 1.0  # simulator: mean wait in P's queue or for D's KV blocks above this = saturated


def _values(dist: Empirical) -> np.ndarray:
    if dist.values is not None:
        return np.asarray(dist.values, dtype=float)
    return load_empirical_values(dist.path or "", dist.column)


def formula_prefix_user(wl: Workload) -> tuple[float, float]:
    """Mean prefix and user tokens per turn as the analytic formulas take them: they count turn 1 as prefix + user,
    so with ``workload.first_turn_user_tokens`` false (turn 1 is the prefix alone, sim/workload.py) the prefix they
    are given is the mean prefix less the mean user draw, which makes every turn's mean prompt the simulator's."""
    prefix = float(np.maximum(0, np.rint(quantile_sample(wl.prefix_tokens))).mean())
    user = float(np.maximum(0, np.rint(quantile_sample(wl.user_tokens))).mean())
    return (prefix if wl.first_turn_user_tokens else prefix - user), user


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


@dataclass(frozen=True)
class ScreenPoint:
    """What the screen reads from one scenario (resolved costs, workload means, policy, deployment)."""

    turns_q: np.ndarray  # quantile sample of turns per conversation (>= 1)
    rate_per_s: float  # new conversations per second (NaN: closed loop, not screened for load)
    client_slots: float  # closed loop: active conversations per client (0: open loop)
    conversations: int
    mean_turns: float  # E[T]
    mean_turns_sq: float  # E[T^2]
    prefix_tokens: float  # mean first-turn prefix
    user_tokens: float  # mean user tokens per turn
    output_tokens: float  # mean output tokens per turn
    output_q: np.ndarray  # quantile sample of output tokens
    gap: Dist
    ttl_s: float
    router_ttl_s: float
    margin_s: float  # expiry safety margin + clock skew
    router_on: float  # 1 when the router can hit (bidirectional on and conversation ids sent)
    threshold_tokens: float
    same_p_share: float  # share of follow-ups routed to the P that served the previous turn
    p_prefix_caching: float
    prefill_nodes: int
    decode_nodes: int
    block_tokens: int
    kv_bytes_per_token_rank: float
    kv_bytes_per_token_all: float
    regions: int
    decode_capacity_tokens: float
    costs: CostModel
    per_byte_s: float
    bidirectional: float
    fail_on_decline: float  # 1 when kv_load_failure_policy is 'fail'
    read: ReadPath  # the follow-up's D->P read as the simulator composes it (rank plan, P's costs)


#: Scalar fields of :class:`ScreenPoint` stacked into arrays by :class:`ScreenInputs`.
_SCALARS = tuple(f.name for f in fields(ScreenPoint) if f.name not in ("turns_q", "output_q", "gap", "costs", "read"))


@dataclass(frozen=True)
class ScreenInputs:
    """The screen's inputs for many scenarios: ``points`` and each scalar field of :class:`ScreenPoint` as an
    array over the points (same names, so the algebra reads like the per-scenario formulas)."""

    points: list[ScreenPoint]
    rate_per_s: np.ndarray
    client_slots: np.ndarray
    conversations: np.ndarray
    mean_turns: np.ndarray
    mean_turns_sq: np.ndarray
    prefix_tokens: np.ndarray
    user_tokens: np.ndarray
    output_tokens: np.ndarray
    ttl_s: np.ndarray
    router_ttl_s: np.ndarray
    margin_s: np.ndarray
    router_on: np.ndarray
    threshold_tokens: np.ndarray
    same_p_share: np.ndarray
    p_prefix_caching: np.ndarray
    prefill_nodes: np.ndarray
    decode_nodes: np.ndarray
    block_tokens: np.ndarray
    kv_bytes_per_token_rank: np.ndarray
    kv_bytes_per_token_all: np.ndarray
    regions: np.ndarray
    decode_capacity_tokens: np.ndarray
    per_byte_s: np.ndarray
    bidirectional: np.ndarray
    fail_on_decline: np.ndarray

    @classmethod
    def of(cls, points: list[ScreenPoint]) -> ScreenInputs:
        """Stack ``points``."""
        return cls(points, **{k: np.array([getattr(p, k) for p in points], dtype=float) for k in _SCALARS})

    def costs(self, get: Callable[[CostModel], float]) -> np.ndarray:
        """One cost parameter over the points, e.g. ``costs(lambda c: c.prefill.fixed_s)``."""
        return np.array([get(p.costs) for p in self.points], dtype=float)


def screen_point(sc: Scenario, cache: dict[str, Resolved]) -> ScreenPoint:
    """The :class:`ScreenPoint` of ``sc`` (``cache``: resolved costs by model/hardware/profile/deployment/costs)."""
    sections = {"model", "hardware", "profile", "deployment", "costs"}
    key = json.dumps(sc.model_dump(mode="json", include=sections), sort_keys=True)
    if key not in cache:
        cache[key] = resolve(sc)
    rs = cache[key]
    wl, pol, dep = sc.workload, sc.policy, sc.deployment
    # each role at its own TP, as the simulator (sim/engine.py): P's prefill and overhead, D's decode, pool and KV
    rs_p, rs_d = resolve_roles(sc, rs)
    d_tp = dep.decode_tensor_parallel_size or dep.tensor_parallel_size
    costs = rs_p.costs if rs_d is rs_p else rs_p.costs.model_copy(update={"decode": rs_d.costs.decode})
    t = np.maximum(1, np.rint(quantile_sample(wl.turns)))
    out_q = np.maximum(1, np.rint(quantile_sample(wl.output_tokens)))
    prefix_mean, user_mean = formula_prefix_user(wl)
    return ScreenPoint(
        turns_q=t, rate_per_s=wl.arrival.rate_per_s if isinstance(wl.arrival, PoissonArrival) else np.nan,
        client_slots=0.0 if isinstance(wl.arrival, PoissonArrival) else float(
            max(1, wl.arrival.max_active_conversations // wl.arrival.clients)),  # sim/driver.py ClosedLoop.slots
        conversations=wl.conversations, mean_turns=float(t.mean()), mean_turns_sq=float((t * t).mean()),
        prefix_tokens=prefix_mean, user_tokens=user_mean,
        output_tokens=float(out_q.mean()), output_q=out_q, gap=wl.turn_gap_s, ttl_s=pol.decoder_kv_blocks_ttl_s,
        router_ttl_s=pol.router_ttl_s, margin_s=pol.expiry_safety_margin_s + pol.clock_skew_s,
        router_on=float(pol.bidirectional and pol.send_conversation_id), threshold_tokens=pol.kv_recompute_threshold_tokens,
        same_p_share=1.0 if (dep.prefill_nodes == 1 or dep.routing in KV_AWARE_ROUTING) else 1.0 / dep.prefill_nodes,
        p_prefix_caching=float(dep.prefill_prefix_caching), prefill_nodes=dep.prefill_nodes,
        decode_nodes=dep.decode_nodes, block_tokens=rs.arch.block_size_tokens,
        kv_bytes_per_token_rank=kv_bytes_per_token_per_rank(rs.arch, d_tp),
        kv_bytes_per_token_all=kv_bytes_per_token_all_ranks(rs.arch, d_tp),
        regions=kv_regions_per_rank(rs.arch, dep.cross_layer_blocks), decode_capacity_tokens=rs_d.decode_capacity_tokens,
        costs=costs, per_byte_s=rs_d.per_byte_s, bidirectional=float(pol.bidirectional),
        fail_on_decline=float(pol.kv_load_failure_policy == "fail"), read=read_path(sc, rs),
    )


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


def _pull_s(p: ScreenPoint, n: np.ndarray) -> np.ndarray:
    """The simulator's read time (sim/xfer.py ``read_time_s``: rank plan, prep + xferDuration + poll) of ``n``
    tokens (rounded to whole tokens) on an idle link."""
    return np.array([p.read.time_s(int(round(v))) for v in np.maximum(n, 0).tolist()])


@dataclass(frozen=True)
class _Pulls:
    """Follow-up pull sizes: P holds the prompt (``local``) and pulls only the tail, or pulls everything."""

    ctx_prev: np.ndarray  # mean retained context of the previous turn
    local: np.ndarray  # share of follow-ups whose P still holds the previous prompt
    n_small: np.ndarray  # pull when P holds the prompt: previous output + half a block
    frac_small: np.ndarray  # share of those pulls at or above the threshold
    frac_big: np.ndarray  # same for whole-context pulls
    frac: np.ndarray  # share of follow-ups that pull (rather than recompute below the threshold)
    n: np.ndarray  # typical pull size
    pull_s: np.ndarray
    recompute_s: np.ndarray


def _pulls(x: ScreenInputs) -> _Pulls:
    et, inc = x.mean_turns, x.user_tokens + x.output_tokens
    # mean retained context of a follow-up's previous turn k-1: prefix + (k-1)(user+out) - 1, with
    # E[k-1 | follow-up] = E[T(T-1)/2] / E[T-1]
    mean_km1 = np.where(et > 1, (x.mean_turns_sq - et) / 2 / np.maximum(et - 1, 1e-12), 0.0)
    ctx_prev = np.maximum(x.prefix_tokens + inc * mean_km1 - 1, 1.0)
    # pull size: the previous output (+ partial block) when P still holds the prompt, else the whole context
    local = x.p_prefix_caching * x.same_p_share
    n_small = x.output_tokens - 1 + (x.block_tokens - 1) / 2
    frac_small = np.array([float(np.mean(p.output_q - 1 + (p.block_tokens - 1) / 2 >= p.threshold_tokens))
                           for p in x.points])
    frac_big = (ctx_prev >= x.threshold_tokens).astype(float)
    n = np.where(local > 0.5, n_small, ctx_prev)
    pull_s = np.array([float(_pull_s(p, np.array([v]))[0]) for p, v in zip(x.points, n, strict=True)])
    # the recompute of n tokens on top of the rest of the context, without the per-step fixed part (both paths pay it)
    recompute_s = np.array([
        prefill_step_time_s(p.costs.prefill, v, v * max(cp - v, 0) + v * (v + 1) / 2, v * max(cp - v, 0))
        - (p.costs.prefill.overhead_s + p.costs.prefill.fixed_s)
        for p, v, cp in zip(x.points, n, ctx_prev, strict=True)
    ])
    frac = local * frac_small + (1 - local) * frac_big
    return _Pulls(ctx_prev, local, n_small, frac_small, frac_big, frac, n, pull_s, recompute_s)


@dataclass(frozen=True)
class _Hits:
    """Router and read windows against the gap distribution: shares and partial means per point."""

    f_pull: np.ndarray  # P(gap within the read window)
    e_pull: np.ndarray  # E[gap; gap within the read window]
    f_rt: np.ndarray  # same for the router's window
    e_rt: np.ndarray
    hit: np.ndarray  # share of follow-ups that reuse retained KV
    err: np.ndarray  # share of follow-ups errored by 'fail' (they pin nothing)


def _hits(x: ScreenInputs, pulls: _Pulls) -> _Hits:
    p_leg = x.costs(lambda c: c.overhead.p_leg_s)
    w_pull = np.minimum(x.router_ttl_s, x.ttl_s - x.margin_s - p_leg)
    n = len(x.points)
    f_pull, e_pull, f_rt, e_rt = (np.zeros(n) for _ in range(4))
    for i, p in enumerate(x.points):
        f, e = gap_cdf_partial(p.gap, np.array([w_pull[i], x.router_ttl_s[i]]))
        f_pull[i], e_pull[i], f_rt[i], e_rt[i] = f[0], e[0], f[1], e[1]
    on = x.router_on  # no conversation_id (or bidirectional off): the router never hits
    f_pull, e_pull, f_rt, e_rt = f_pull * on, e_pull * on, f_rt * on, e_rt * on
    h = pulls.frac * f_pull + (1 - pulls.frac) * f_rt
    # with kv_load_failure_policy 'fail' a router hit that P declines (gap in (w_pull, w_router]) errors the
    # turn; the erroring turn stores no router entry, so the next follow-up is a miss: a two-state chain
    e = x.fail_on_decline * pulls.frac * np.maximum(f_rt - f_pull, 0.0)
    entry = np.array([_entry_share(p.turns_q, ei) for p, ei in zip(x.points, e, strict=True)])
    return _Hits(f_pull, e_pull, f_rt, e_rt, entry * h, entry * e)


def _pinned_tokens(x: ScreenInputs, pulls: _Pulls, hits: _Hits) -> np.ndarray:
    """Little's law: mean pinned tokens = arrival rate x tokens x retention time, summed over the turns."""
    p_leg = x.costs(lambda c: c.overhead.p_leg_s)
    ttl, et, prefix = x.ttl_s, x.mean_turns, x.prefix_tokens
    inc = x.user_tokens + x.output_tokens
    # retention of a non-final turn: gap + P leg (+ pull) when read back, the full TTL otherwise
    r_pull = hits.e_pull + (p_leg + pulls.pull_s) * hits.f_pull + ttl * (1 - hits.f_pull)
    r_rt = hits.e_rt + p_leg * hits.f_rt + ttl * (1 - hits.f_rt)
    r_nf = pulls.frac * r_pull + (1 - pulls.frac) * r_rt
    first_tokens = prefix + inc - 1
    multi = (et > 1) * 1.0
    later = (et - 1) * (prefix - 1) + inc * (x.mean_turns_sq - et) / 2 - first_tokens * multi  # turns 2..T-1
    sum_nonfinal_tokens = first_tokens * multi + (1 - hits.err) * later
    final_tokens = (prefix - 1 + inc * et) * np.where(et > 1, 1 - hits.err, 1.0)
    return x.rate_per_s * (sum_nonfinal_tokens * r_nf + final_tokens * ttl) * x.bidirectional


def _prefill_utilisation(x: ScreenInputs, pulls: _Pulls, hits: _Hits) -> np.ndarray:
    """Prefill busy share per P node from the mean prefill work of first turns and follow-ups."""
    pc = [p.costs.prefill for p in x.points]
    fixed = np.array([c.overhead_s + c.fixed_s for c in pc])  # per step, whatever its tokens
    user, et, hit = x.user_tokens, x.mean_turns, hits.hit
    # prefill work per turn: turn 1 computes its prompt; a follow-up computes user+1 after a pull, the
    # uncached tail when P still holds the prompt, the whole prompt otherwise
    prompt_f = pulls.ctx_prev + 1 + user
    comp_local = pulls.n_small + user + 1
    comp_follow = (
        pulls.local * (hit * pulls.frac_small * (user + 1) + (1 - hit * pulls.frac_small) * comp_local)
        + (1 - pulls.local) * (hit * pulls.frac_big * (user + 1) + (1 - hit * pulls.frac_big) * prompt_f)
    )

    def t_prefill(c: np.ndarray, cached: np.ndarray) -> np.ndarray:
        pairs = c * cached + c * (c + 1) / 2
        return np.array([prefill_step_time_s(p, ci, pi, ci * ki)
                         for p, ci, pi, ki in zip(pc, c, pairs, cached, strict=True)])

    first = x.prefix_tokens + user
    t_turn = (t_prefill(first, np.zeros(len(x.points))) + (et - 1) * t_prefill(comp_follow, prompt_f - comp_follow)) / et
    lam_turns = x.rate_per_s * et
    # the per-step fixed cost is paid per request only when it finds P idle (probability ~ 1 - rho_var);
    # otherwise the request joins a step that pays it anyway (continuous batching)
    rho_var = lam_turns * (t_turn - fixed) / x.prefill_nodes
    return rho_var + lam_turns * fixed / x.prefill_nodes * np.clip(1 - rho_var, 0, 1)


def _running_tokens(x: ScreenInputs, pulls: _Pulls) -> np.ndarray:
    """KV of the running decode batch: the batch fixed point ``B = l' out (a + b B + c B ctx)`` per node."""
    a, b, c = (np.array(v) for v in zip(*(decode_step_coefficients(p.costs.decode) for p in x.points), strict=True))
    prompt_f, out = pulls.ctx_prev + 1 + x.user_tokens, x.output_tokens
    lam_d = x.rate_per_s * x.mean_turns / x.decode_nodes
    denom = 1 - lam_d * out * (b + c * (prompt_f + out / 2))
    batch = np.where(denom > 0, lam_d * out * a / np.where(denom > 0, denom, 1), np.inf)
    return batch * x.decode_nodes * (prompt_f + out)


def screen_scenarios(scenarios: list[Scenario]) -> pd.DataFrame:
    """The analytic screen of a list of scenarios (one row each, columns :data:`SCREEN_COLUMNS`)."""
    if not scenarios:
        return pd.DataFrame(columns=SCREEN_COLUMNS)
    cache: dict[str, Resolved] = {}
    x = ScreenInputs.of([screen_point(sc, cache) for sc in scenarios])
    pulls = _pulls(x)
    hits = _hits(x, pulls)
    pinned_tok = _pinned_tokens(x, pulls, hits)
    util = _prefill_utilisation(x, pulls, hits)
    demand = (pinned_tok + _running_tokens(x, pulls)) / (x.decode_capacity_tokens * x.decode_nodes)
    feasible = (util < 1) & (demand < 1)
    # a closed loop: no rate (NaN above); its hit rate only with one conversation per client (CLOSED_LOOP_DECLINED)
    hit = np.where(x.client_slots > 1, np.nan, hits.hit)
    return pd.DataFrame(
        {
            "screen_hit_rate": hit,
            "screen_pinned_kv_gib_mean": pinned_tok * x.kv_bytes_per_token_all / GIB,
            "screen_prefill_utilization": util,
            "screen_decode_kv_demand": demand,
            "screen_pull_s": pulls.pull_s,
            "screen_recompute_s": pulls.recompute_s,
            "screen_pull_beats_recompute": (pulls.pull_s < pulls.recompute_s).astype(int),
            # int unless a closed loop is among the points (NaN there: not screened)
            "screen_feasible": (np.where(np.isnan(x.rate_per_s), np.nan, feasible.astype(float))
                                if np.isnan(x.rate_per_s).any() else feasible.astype(int)),
            "screen_cost": x.conversations * x.mean_turns,
        }
    )


def analytic_screen(grid: Grid) -> pd.DataFrame:
    """The analytic screen over every point of ``grid``: ``point``, the axis values, :data:`SCREEN_COLUMNS`, then
    ``screen_declined``: why the point is not screened ('trace': a ``workload.trace`` replay, every screen column
    NaN, :data:`TRACE_DECLINED`; 'closed loop': NaN but for a hit rate with one conversation per client,
    :data:`CLOSED_LOOP_DECLINED`), empty when it is."""
    scen = [grid.scenario(i) for i in range(grid.n_points)]
    replay = [sc.workload.trace is not None for sc in scen]
    df = screen_scenarios([sc for sc, r in zip(scen, replay, strict=True) if not r])
    if any(replay):  # the synthetic fields a trace replay leaves unused are not screened: NaN rows
        df.index = pd.Index([i for i, r in enumerate(replay) if not r])
        df = df.reindex(range(grid.n_points)).astype(float).reset_index(drop=True)
    df["screen_declined"] = ["trace" if r else "closed loop" if not isinstance(sc.workload.arrival, PoissonArrival)
                             else "" for sc, r in zip(scen, replay, strict=True)]
    df.insert(0, "point", np.arange(grid.n_points, dtype=np.int64))
    for j, name in enumerate(grid.axis_names):
        df.insert(1 + j, name, [_axis_cell(grid.point_values(i)[j]) for i in range(grid.n_points)])
    return df


def _axis_cell(v: Any) -> Any:
    return json.dumps(v, sort_keys=True) if isinstance(v, dict | list) else v


def _metric(row: dict[str, Any] | pd.Series, k: str) -> float | None:
    """A per-run key ``k`` of ``row``, or the ``k_mean`` column of an aggregate; None when absent, null or NaN."""
    v = row.get(k, row.get(f"{k}_mean"))
    if v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if np.isnan(x) else x


def _first(row: dict[str, Any] | pd.Series, keys: tuple[str, ...]) -> tuple[str, float] | None:
    """The first of ``keys`` that ``row`` has a value for, with the value."""
    for k in keys:
        v = _metric(row, k)
        if v is not None:
            return k, v
    return None


def simulator_saturated(row: dict[str, Any] | pd.Series) -> bool:
    """Whether a simulated run is saturated: P busy >= 95% over the steady window (the busiest engine, as the health
    section judges; the whole run only when there is no window, :data:`SATURATION_COLUMNS`), or a mean wait above
    1 s in P's queue or for decode KV blocks (per-run keys, or the ``_mean`` columns of an aggregate)."""
    util = _first(row, SATURATION_COLUMNS)
    return ((util is not None and util[1] >= SATURATED_UTILIZATION)
            or (_metric(row, "prefill_queue_mean_s") or 0.0) > SATURATED_QUEUE_S
            or (_metric(row, "d_queue_mean_s") or 0.0) > SATURATED_QUEUE_S)


def finished_runs(row: dict[str, Any] | pd.Series) -> int | None:
    """Runs of a point that finished (``replications - errors`` of an aggregate row), None when not said."""
    reps, errors = row.get("replications"), row.get("errors")
    if reps is None or errors is None or pd.isna(reps) or pd.isna(errors):
        return None
    return int(reps) - int(errors)


def no_verdict(row: dict[str, Any] | pd.Series) -> bool:
    """Whether every run of a point failed (an aggregate row): the simulator says nothing about it."""
    return finished_runs(row) == 0


def compare_screen(screen: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """Every (point, metric) where the simulator (per-point means) and the screen disagree; the simulator wins.

    Columns: ``point, metric, screen, simulator, tolerance``. Hit rate and prefill utilisation compare in
    absolute terms, steady pinned KV relatively (and only above 0.5 GiB); ``feasible`` compares the
    screen's verdict with :func:`simulator_saturated`. A point none of whose runs finished (``errors`` equal to
    ``replications`` in the aggregate) has no simulator verdict and is not compared (:func:`no_verdict`); with some
    failed, the means are over the runs that finished. The screen's prefill utilisation is a steady-state
    figure: it is held against the simulator's over the steady window, ``prefill_utilization_steady`` (the
    whole-run ``prefill_utilization`` only for a run without one, :data:`UTILIZATION_COLUMNS`; the metric is
    named after the column compared), and since the simulator's is an achieved busy share, which cannot exceed 1,
    the screen's offered load is capped at 1 for the comparison (the listed screen value is its own).
    A steady-state figure of a point whose simulated window starts in the ramp-up (:func:`ramp_up_comparisons`)
    is not a disagreement: the run is too short to say, and the point is listed there instead.
    """
    return _compare(screen, summary)[0]


def ramp_up_comparisons(screen: pd.DataFrame, summary: pd.DataFrame) -> pd.DataFrame:
    """The (point, metric) pairs :func:`compare_screen` leaves out because the simulated figure is not a steady one.

    Steady pinned KV when some replication's pinned window starts before TTL + p90 conversation span
    (``pinned_window_after_ramp`` below 1: pinned KV is still growing there, so the window's mean is below the steady
    state the screen predicts), P's steady utilisation when some replication's steady window starts before one p90
    conversation span (``prefill_window_after_ramp``), and the screen's 'infeasible' against a simulator that did not
    saturate in such a window (a saturation seen there is a verdict, and stays compared). Same columns as
    :func:`compare_screen`; a sweep written before these flags existed compares everything, as it did.
    """
    return _compare(screen, summary)[1]


def _after_ramp(m: Any, flag: str) -> bool:
    """Whether every replication of an aggregate row had its ``flag`` window after the ramp-up (True when unknown)."""
    col = f"{flag}_mean"
    return col not in m.index or pd.isna(m[col]) or float(m[col]) >= 1.0


def _compare(screen: pd.DataFrame, summary: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(disagreements, comparisons left out because the simulated window was in the ramp-up)."""
    rows: list[dict[str, Any]] = []
    ramp: list[dict[str, Any]] = []
    sim = summary.set_index("point")
    pairs = [
        ("hit_rate", "screen_hit_rate", False),
        ("steady_pinned_kv_gib_mean", "screen_pinned_kv_gib_mean", True),
    ]
    for _, s in screen.iterrows():
        p = int(s["point"])
        if p not in sim.index:
            continue
        m = sim.loc[p]
        if no_verdict({str(k): v for k, v in m.items()}):
            continue
        pinned_steady = _after_ramp(m, "pinned_window_after_ramp")
        prefill_steady = _after_ramp(m, "prefill_window_after_ramp")
        for metric, scol, rel in pairs:
            col = f"{metric}_mean"
            if col not in m.index or pd.isna(m[col]) or pd.isna(s[scol]):
                continue
            tol = TOLERANCES[metric]
            a, b = float(s[scol]), float(m[col])
            bad = (abs(a - b) > tol * max(abs(b), 1e-12) and max(abs(a), abs(b)) > 0.5) if rel else abs(a - b) > tol
            if bad:
                row = {"point": p, "metric": metric, "screen": a, "simulator": b, "tolerance": tol}
                (rows if metric != "steady_pinned_kv_gib_mean" or pinned_steady else ramp).append(row)
        util = _first({k: m[f"{k}_mean"] for k in UTILIZATION_COLUMNS if f"{k}_mean" in m.index}, UTILIZATION_COLUMNS)
        if util is not None and pd.notna(s["screen_prefill_utilization"]):
            metric, b = util
            a, tol = float(s["screen_prefill_utilization"]), TOLERANCES[metric]
            if abs(min(a, 1.0) - b) > tol:
                row = {"point": p, "metric": metric, "screen": a, "simulator": b, "tolerance": tol}
                (rows if metric != "prefill_utilization_steady" or prefill_steady else ramp).append(row)
        sat = simulator_saturated({str(k): v for k, v in m.items()})
        if pd.notna(s["screen_feasible"]) and bool(s["screen_feasible"]) == sat:
            row = {"point": p, "metric": "feasible", "screen": float(s["screen_feasible"]), "simulator": float(not sat),
                   "tolerance": 0.0}
            (rows if sat or prefill_steady else ramp).append(row)
    cols = ["point", "metric", "screen", "simulator", "tolerance"]
    return pd.DataFrame(rows, columns=cols), pd.DataFrame(ramp, columns=cols)
