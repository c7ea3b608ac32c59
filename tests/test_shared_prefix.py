"""Prefixes shared by conversations (``workload.shared_prefix_tokens`` / ``shared_prefix_groups``, weka
``trace.shared_prefix``; sim/shared.py): computed once per P, pinned once per D, never pulled when local.
Expected values are hand computations from the scenario's sizes."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvplan.errors import KvplanInputError
from kvplan.sim.api import run
from kvplan.sim.scenario import scenario_from_dict

GIB = 1024**3
SMALL_WEKA = Path(__file__).resolve().parent / "data" / "traces" / "weka_small.json"


def _sc(shared: int | None = None, groups: int | None = None, turns: int = 1, decode_nodes: int = 1) -> dict[str, Any]:
    wl: dict[str, Any] = {
        "conversations": 200, "arrival": {"kind": "poisson", "rate_per_s": 2.0},
        "turns": {"dist": "constant", "value": turns}, "prefix_tokens": {"dist": "constant", "value": 16000},
        "user_tokens": {"dist": "constant", "value": 0 if turns == 1 else 200},
        "output_tokens": {"dist": "constant", "value": 100}, "turn_gap_s": {"dist": "constant", "value": 5.0},
    }
    if shared is not None:
        wl["shared_prefix_tokens"] = shared
    if groups is not None:
        wl["shared_prefix_groups"] = groups
    return {"model": "qwen3-32b", "hardware": "p5en",
            "deployment": {"prefill_nodes": 2, "decode_nodes": decode_nodes},
            "policy": {"bidirectional": True, "decoder_kv_blocks_ttl_s": 3600, "router_ttl_s": 3600},
            "workload": wl, "seed": 1}


@pytest.mark.parametrize("groups, decode_nodes", [(None, 1), (4, 1), (None, 2)])
def test_shared_system_prompt_pinned_once(groups: int | None, decode_nodes: int) -> None:
    """200 one-turn conversations of 16,000 prompt tokens (12,000 shared) + 100 output tokens, all finished within
    the TTL: every context is pinned at the peak. Each pin holds prompt + output - 1 = 16,099 tokens; with the
    shared prompt it holds its own 4,099 and each group's 12,000 are pinned once per D that holds the group."""
    base = run(_sc(decode_nodes=decode_nodes)).summary
    shared = run(_sc(12000, groups, decode_nodes=decode_nodes)).summary
    per_token = base["kv_bytes_per_token_all_ranks"]
    assert base["pinned_kv_gib_peak"] == pytest.approx(200 * 16099 * per_token / GIB)
    # conversation c is in group c mod groups and, round robin in arrival order, on D c mod decode_nodes (and P
    # c mod 2): a group is held once on each node that serves one of its conversations
    held_once = math.lcm(groups or 1, decode_nodes)
    expected = (200 * (16099 - 12000) + held_once * 12000) * per_token / GIB
    assert shared["pinned_kv_gib_peak"] == pytest.approx(expected)
    # the peak falls by the shared share of the pinned contexts (less what is held once)
    fall = 1 - shared["pinned_kv_gib_peak"] / base["pinned_kv_gib_peak"]
    assert fall == pytest.approx(12000 / 16099 - held_once * 12000 / (200 * 16099))
    # P computes the shared prompt once per (P, group) (2 P, round robin) and hits it afterwards
    assert shared["local_hit_tokens"] == (200 - math.lcm(groups or 1, 2)) * 12000
    assert shared["recomputed_tokens"] == base["recomputed_tokens"] - shared["local_hit_tokens"]
    assert shared["pins"] == base["pins"]  # the group's blocks ride on its pins, no extra pin


def test_shared_prefix_never_pulled_when_local() -> None:
    """Three turns (P prefix caching on, vLLM's default; 2 P round robin, so a follow-up often lands on the other
    P): with the shared prefix local on P, a follow-up pulls at most its context beyond it, and D pulls from P
    only what it lacks."""
    base = run(_sc(turns=3)).summary
    shared = run(_sc(12000, turns=3)).summary
    assert shared["decisions"]["pull"] == base["decisions"]["pull"] == 400
    assert shared["pulled_tokens"] < base["pulled_tokens"]
    # every follow-up's pull is above the shared prefix: at most context - 12,000 tokens
    assert shared["pulled_tokens"] <= 400 * (16000 + 2 * 200 + 100 - 12000)
    # D holds the group's prefix after its first request: the P->D pulls skip it
    assert shared["p2d_bytes"] < base["p2d_bytes"]
    assert shared["ttft_mean_s"] < base["ttft_mean_s"]


def test_shared_prefix_validation() -> None:
    with pytest.raises(KvplanInputError, match="shared_prefix_tokens"):
        scenario_from_dict({"workload": {"shared_prefix_groups": 3}})
    with pytest.raises(KvplanInputError, match="shared_prefix_groups"):
        scenario_from_dict({"workload": {"shared_prefix_tokens": 100, "shared_prefix_groups": 0}})


def test_default_has_no_shared_state() -> None:
    """Without the fields nothing is shared (the native matrix checks byte-identical outputs separately)."""
    from kvplan.sim.workload import make_plan

    plan = make_plan(scenario_from_dict(_sc()).workload, 1, 40960)
    assert plan.shared_group is None and plan.shared_tokens is None
    # more shared tokens than any conversation's prefix is refused (it was silently capped at the prefix)
    with pytest.raises(KvplanInputError, match="exceeds every conversation's prefix_tokens"):
        scenario_from_dict(_sc(20000))
    # a drawn prefix shorter than shared_prefix_tokens shares only itself (capped at the prefix)
    sc = _sc(12000)
    sc["workload"]["prefix_tokens"] = {"dist": "uniform", "low": 8000, "high": 16000}
    plan = make_plan(scenario_from_dict(sc).workload, 1, 40960)
    prefix = plan.prompt_tokens[plan.offsets[:-1]]  # one turn, no user tokens: the first prompt is the prefix
    assert plan.shared_tokens is not None and (plan.shared_tokens == np.minimum(prefix, 12000)).all()
    assert (plan.shared_tokens < 12000).any() and (plan.shared_tokens == 12000).any()


def test_weka_sessions_with_equal_tool_and_system_tokens_share() -> None:
    from kvplan.sim.scenario import TraceSource
    from kvplan.sim.weka_plan import plan_from_weka

    plan = plan_from_weka(TraceSource(path=str(SMALL_WEKA), shared_prefix=True), 0, 40960)
    assert plan.shared_group is not None and plan.shared_tokens is not None
    assert plan.shared_group.tolist() == [0, 1]  # main agent (1000 + 280) and sub-agent (500 + 100) differ
    assert plan.shared_tokens.tolist() == [1280, 600]
