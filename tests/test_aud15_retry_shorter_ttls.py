"""aud15: when every TTL the screen kept saturates the deployment, recommend simulates the shorter TTLs the screen
pruned by their hit rate before it concludes that no TTL removes the saturation. Llama-3.1-8B on p5 at 40
conversations/s (chat): the screen kept 90-1800 s, every one saturated decode HBM, and the answer said 'the
deployment is too small for the load whatever the TTL' beside bidirectional off saturating nothing; TTL 30 s
saturates nothing there."""

from __future__ import annotations

from typing import Any

from kvplan.plan.advice import recommend
from kvplan.sim.scenario import scenario_from_dict


def _scenario() -> dict[str, Any]:
    def const(v: float) -> dict[str, Any]:
        return {"dist": "constant", "value": v}

    # turn gaps of 100-200 s: the screen finds no hit within 10 or 30 s and prunes them; a 200k-token D pool fills
    # with a minute of finished turns, so 240 and 480 s saturate it
    return {"model": "llama-3.1-8b", "hardware": "p5",
            "deployment": {"tensor_parallel_size": 1, "decode_kv_capacity_tokens": 200_000},
            "workload": {"conversations": 200, "arrival": {"kind": "poisson", "rate_per_s": 1.0}, "turns": const(3),
                         "prefix_tokens": const(4000), "user_tokens": const(200), "output_tokens": const(200),
                         "turn_gap_s": {"dist": "uniform", "low": 100, "high": 200}},
            "seed": 3}


def test_the_pruned_shorter_ttls_are_tried_when_every_kept_one_saturates() -> None:
    rec = recommend(scenario_from_dict(_scenario()), replications=1, ttl_grid=(10, 30, 240, 480), workers=1)
    assert rec.screen["retried_ttls_s"] == [10.0, 30.0] and rec.screen["pruned_ttls_s"] == []
    assert rec.screen["simulated_ttls_s"] == [10.0, 30.0, 240.0, 480.0]
    curve = {c["ttl_s"]: c for c in rec.ttl_curve}
    assert curve[10.0]["saturated"] == "" and curve[240.0]["saturated"] and curve[480.0]["saturated"]
    why = " ".join(rec.rationale)
    assert "The smallest change that removes it: TTL 10 s" in why
    assert "the least change to the defaults, not the advice" in why  # not a second recommendation (new15)
    assert "whatever the TTL" not in why
