"""Retention against probability theory, on runs it was not tuned on.

With exponential think times of mean g between a response's end and the next turn (``turn_gap_s``), a light load (no
queueing, so a follow-up reaches the router and P's connector a few ms after its think time) and single-use router
entries stored at D's finish, a follow-up's entry is found while its age is under the router TTL R: the router hit
share is P(gap < R) = 1 - exp(-R / g) (``disagg_proxy_multiturn.py``'s TTL, VLLM_BEHAVIOUR.md 1.2). When the router
keeps entries longer than D keeps the blocks (R > T), P declines a read posted within the 5 s safety margin of D's
expiry (``nixl/pull_scheduler.py``, PR #47021) and, with ``kv_load_failure_policy: fail``, the turn fails: pulls are
P(gap < T - 5) and failures P(T - 5 < gap < R) (VLLM_BEHAVIOUR.md 1.5). Each share is checked within 4 binomial
standard errors (3,000 follow-ups: about +-3.3 points), so a mechanism error of a few points fails it."""

from __future__ import annotations

import math

import pytest

from kvplan.sim.api import run
from kvplan.sim.scenario import scenario_from_dict

GAP_S = 300.0
N = 3000


def _run(router_ttl_s: float, ttl_s: float, margin_s: float = 5.0) -> dict[str, int]:
    sc = scenario_from_dict({
        "model": "qwen3-32b", "hardware": "p5en",
        # P's prefix cache off: every router hit is a pull of the whole previous context (above the threshold)
        "deployment": {"prefill_nodes": 1, "decode_nodes": 1, "prefill_prefix_caching": False},
        "policy": {"bidirectional": True, "router_ttl_s": router_ttl_s, "decoder_kv_blocks_ttl_s": ttl_s,
                   "expiry_safety_margin_s": margin_s},
        "workload": {"conversations": N, "arrival": {"kind": "poisson", "rate_per_s": 0.5},
                     "turns": {"dist": "constant", "value": 2}, "prefix_tokens": {"dist": "constant", "value": 1000},
                     "user_tokens": {"dist": "constant", "value": 100},
                     "output_tokens": {"dist": "constant", "value": 200},
                     "turn_gap_s": {"dist": "exponential", "mean": GAP_S}}})
    r = run(sc)
    follow = r.turns[r.turns["turn"] == 2]
    assert len(follow) == N
    counts = {str(k): int(v) for k, v in follow["decision"].value_counts().items()}
    return {**counts, "router_hit": int((follow["router"] == "hit").sum())}


def _within(count: int, p: float) -> None:
    se = math.sqrt(p * (1 - p) / N)
    assert count / N == pytest.approx(p, abs=4 * se), (count / N, p, se)


def test_router_ttl_sets_the_hit_share() -> None:
    got = _run(router_ttl_s=100.0, ttl_s=480.0)
    p = 1 - math.exp(-100.0 / GAP_S)
    _within(got["router_hit"], p)
    _within(got.get("pull", 0), p)  # every hit pulls: D still holds the blocks (480 s)
    assert got.get("error", 0) == 0


@pytest.mark.parametrize("margin", [5.0, 30.0])  # vLLM's _KV_BLOCKS_EXPIRY_SAFETY_MARGIN, and a wide one that shows
def test_reads_past_ds_expiry_are_declined_as_vllm_does(margin: float) -> None:  # the margin (7 points of pulls)
    got = _run(router_ttl_s=1000.0, ttl_s=100.0, margin_s=margin)
    _within(got["router_hit"], 1 - math.exp(-1000.0 / GAP_S))
    _within(got.get("pull", 0), 1 - math.exp(-(100.0 - margin) / GAP_S))
    _within(got.get("error", 0), math.exp(-(100.0 - margin) / GAP_S) - math.exp(-1000.0 / GAP_S))
