"""``workload.history``: what of the previous turn the next prompt repeats token for token (sim/history.py).

The pull, the hit decision and the tokens recomputed follow it; pinned memory is what vLLM pins (every
finished context); ``recommend``'s threshold moves with the break-even's tail, and it states the assumption.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from conftest import small

from kvplan.errors import KvplanInputError
from kvplan.plan.advice import _follow_up_shape, recommend
from kvplan.plan.breakeven import break_even
from kvplan.sim.api import run
from kvplan.sim.engine import resolve
from kvplan.sim.scenario import scenario_from_dict, with_overrides
from kvplan.sim.workload import make_plan


def _sc(history: str | None = None, share: float | None = None, caching: bool = False) -> dict[str, Any]:
    wl = {
        "conversations": 30, "arrival": {"kind": "poisson", "rate_per_s": 0.5},
        "turns": {"dist": "constant", "value": 4}, "prefix_tokens": {"dist": "uniform", "low": 1000, "high": 4000},
        "user_tokens": {"dist": "uniform", "low": 50, "high": 300},
        "output_tokens": {"dist": "uniform", "low": 100, "high": 900},
        "turn_gap_s": {"dist": "constant", "value": 5.0},
    }
    if history is not None:
        wl["history"] = history
    if share is not None:
        wl["history_kept_share"] = share
    return small(workload=wl, deployment={"max_num_seqs": 64, "prefill_prefix_caching": caching})


def _follow_ups(sc: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(previous prompt, previous output) of every follow-up turn of the scenario's plan."""
    s = scenario_from_dict(sc)
    plan = make_plan(s.workload, s.seed, 40960)
    follow = np.ones(plan.total_turns, dtype=bool)
    follow[plan.offsets[:-1]] = False
    prev_p = np.r_[0, plan.prompt_tokens[:-1]][follow]
    prev_o = np.r_[0, plan.output_tokens[:-1]][follow]
    return prev_p, prev_o


def test_prompt_only_lowers_pulled_tokens_by_previous_outputs() -> None:
    verb, only = run(_sc()).summary, run(_sc("prompt_only")).summary
    prev_p, prev_o = _follow_ups(_sc())
    n = len(prev_p)
    assert verb["decisions"]["pull"] == only["decisions"]["pull"] == n  # TTL 480 s > every 5 s gap, P caching off
    # verbatim pulls D's whole context (prompt + output - 1, the last token has no KV); prompt_only the prompt
    assert verb["pulled_tokens"] == int((prev_p + prev_o - 1).sum())
    assert only["pulled_tokens"] == int(prev_p.sum())
    assert verb["pulled_tokens"] - only["pulled_tokens"] == int((prev_o - 1).sum())
    assert only["recomputed_tokens"] - verb["recomputed_tokens"] == int((prev_o - 1).sum())
    # vLLM pins every finished context whatever the next prompt repeats: the same pins
    assert only["pins"] == verb["pins"]


def test_partial_pulls_the_kept_share() -> None:
    part = run(_sc("partial", 0.5)).summary
    prev_p, prev_o = _follow_ups(_sc())
    assert part["pulled_tokens"] == int(np.floor(0.5 * (prev_p + prev_o)).sum())


def test_prompt_only_with_p_caching_needs_no_pull() -> None:
    """One P with prefix caching holds the previous prompt: with prompt_only nothing is left to pull from D."""
    verb, only = run(_sc(caching=True)).summary, run(_sc("prompt_only", caching=True)).summary
    assert verb["decisions"].get("pull", 0) > 0
    assert only["decisions"].get("pull", 0) == 0 and only["pulled_tokens"] == 0
    # what is left is the previous prompt's partial last block (< 16 tokens < the threshold): recomputed on P
    d = only["decisions"]
    assert d["local"] + d["recompute_below_threshold"] == verb["decisions"]["pull"] + verb["decisions"]["local"]
    assert only["local_hit_tokens"] == verb["local_hit_tokens"]


@pytest.mark.parametrize("wl, needle", [
    ({"history": "partial"}, "history_kept_share"),
    ({"history_kept_share": 0.3}, "history_kept_share"),
    ({"history": "everything"}, "history"),
    ({"history": "partial", "history_kept_share": 1.5}, "history_kept_share"),
])
def test_history_fields_validated(wl: dict[str, Any], needle: str) -> None:
    with pytest.raises(KvplanInputError) as exc:
        scenario_from_dict({"workload": wl})
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_recommend_threshold_follows_break_even_and_states_history() -> None:
    def sc(history: str | None) -> dict[str, Any]:
        d = _sc(history)
        d["workload"]["output_tokens"] = {"dist": "constant", "value": 2000}
        return d

    verb, only = scenario_from_dict(sc(None)), scenario_from_dict(sc("prompt_only"))
    assert _follow_up_shape(verb)[1] + 2000 == _follow_up_shape(only)[1]  # the previous output joins the tail
    rs = resolve(only)
    be_verb = break_even(rs, *_follow_up_shape(verb)).tokens
    be_only = break_even(rs, *_follow_up_shape(only)).tokens
    assert be_only < be_verb  # a longer tail makes recomputing dearer (attention over it): pull from fewer tokens
    rec = recommend(only, replications=1, ttl_grid=(30.0,))
    # the rule's break-even is the recommended deployment's: with cross-layer blocks when the trial adopted them
    adopted = rec.transfer.get("adopted") is True
    rs_rec = resolve(with_overrides(only, {"deployment.cross_layer_blocks": True})) if adopted else rs
    assert rec.threshold_check["analytic_break_even_tokens"] == break_even(rs_rec, *_follow_up_shape(only)).tokens
    assert not adopted or rec.transfer["break_even_tokens"] < be_only  # a cheaper pull: pulled from fewer tokens
    assert any("prompt_only" in a for a in rec.assumptions)
