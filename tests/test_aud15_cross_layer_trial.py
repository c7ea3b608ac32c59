"""aud15: recommend tries cross-layer blocks when the descriptors set the threshold, not only when pulls are a large
part of TTFT. Qwen3-8B on h800 at TP8: a 24k-token pull posts ~110,000 descriptors per rank (208 ms, 21 ms with
cross-layer blocks), so the flagless break-even is ~24,000 tokens; that threshold recomputes the pulls, pulls are then
0% of TTFT, the trial never ran, and the answer said nothing of the flag, whose own break-even (~1,580 tokens) gave a
lower TTFT (the chat preset at 2/s: mean 75.4 -> 68.3 ms, p90 107.3 -> 87.7 ms)."""

from __future__ import annotations

from typing import Any

import pytest

from kvplan.plan.advice import recommend
from kvplan.sim.api import run
from kvplan.sim.scenario import scenario_from_dict, with_overrides


def _scenario() -> dict[str, Any]:
    def const(v: float) -> dict[str, Any]:
        return {"dist": "constant", "value": v}

    return {"model": "qwen3-8b", "hardware": "h800",
            "workload": {"conversations": 300, "arrival": {"kind": "poisson", "rate_per_s": 1.0}, "turns": const(4),
                         "prefix_tokens": const(3000), "user_tokens": const(150), "output_tokens": const(300),
                         "turn_gap_s": {"dist": "uniform", "low": 10, "high": 20}},
            "seed": 1}


def test_the_flag_is_tried_when_the_descriptors_set_the_threshold() -> None:
    sc = scenario_from_dict(_scenario())
    rec = recommend(sc, replications=2, ttl_grid=(30,), workers=1)
    t = rec.transfer
    cost = t["descriptor_cost"]
    # the case: the flagless threshold is descriptor-made, and no pull is left to show the flag's worth
    assert cost["tokens"] > 20_000 and cost["pull_s"] > 5 * cost["pull_cross_layer_s"]
    assert t["without"]["kv_pull_mean_s"] < 0.25 * t["without"]["ttft_p50_s"]
    assert t["tried"] and t["trigger"] == "break_even" and t["trial_threshold_tokens"] < 0.5 * cost["tokens"]
    assert t["adopted"] and t["with"]["ttft_mean_s"] < t["without"]["ttft_mean_s"]
    # the recommendation is the flag with its own break-even, and its figures are that deployment's
    assert rec.kv_recompute_threshold_tokens == t["trial_threshold_tokens"] == t["break_even_tokens"]
    assert rec.kv_transfer_config["decode"]["kv_connector_extra_config"].get(t["vllm_flag"]) is True
    assert rec.expected["ttft_mean_s"] == t["with"]["ttft_mean_s"]
    assert any(r.startswith("Transfer: the threshold") for r in rec.rationale)
    v = rec.verification
    assert v["overrides"]["deployment.cross_layer_blocks"] is True
    means = [run(with_overrides(sc, {**v["overrides"], "workload.conversations": v["conversations"]}), s).summary[
        "ttft_mean_s"] for s in v["seeds"]]
    assert sum(means) / len(means) == pytest.approx(rec.expected["ttft_mean_s"], rel=1e-12)
