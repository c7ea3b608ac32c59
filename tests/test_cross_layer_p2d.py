"""recommend tries cross-layer blocks when the D leg's P->D reads are a large part of TTFT, with retention on or off.

The trial looked at D->P pulls only (aud15), so a deployment whose TTFT is made of P->D reads (D reads the prompt P
computed, ``nixl/pull_worker.py``; one descriptor per region x block, VLLM_BEHAVIOUR.md 1.11) never heard of the flag,
and a recommendation of retention off never tried it at all. Single-turn 8k-token requests on an A100 (no follow-up to
reuse: retention off), 32,448 descriptors per read: the flag is adopted on the off deployment, the deployable config
carries it, and simulating the verification gives the expected figures."""

from __future__ import annotations

import pytest

from kvplan.plan.advice import recommend
from kvplan.sim.api import run
from kvplan.sim.scenario import scenario_from_dict

SINGLE = {"model": "llama-3.1-8b", "hardware": "p4de",
          "deployment": {"prefill_nodes": 1, "decode_nodes": 1, "tensor_parallel_size": 1},
          "workload": {"conversations": 120, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                       "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 8000},
                       "user_tokens": {"dist": "constant", "value": 100},
                       "output_tokens": {"dist": "constant", "value": 50}}}


def test_p2d_heavy_off_recommendation_tries_and_adopts_cross_layer_blocks() -> None:
    rec = recommend(scenario_from_dict(SINGLE), replications=2, workers=1)
    assert rec.bidirectional is False
    t = rec.transfer
    assert t["tried"] and t["trigger"] == "p2d_share" and t["adopted"] is True, t
    assert t["without"]["p2d_transfer_mean_s"] > t["with"]["p2d_transfer_mean_s"] > 0
    assert "the D leg's P->D reads take" in t["text"] and t["descriptor_cost"]["descriptors_per_rank"] > 10_000
    cfg = rec.kv_transfer_config["prefill"]["kv_connector_extra_config"]
    assert cfg["bidirectional_kv_xfer"] is False and cfg[t["vllm_flag"]] is True
    v = rec.verification
    assert v["overrides"] == {"policy.bidirectional": False, "deployment.cross_layer_blocks": True}
    mean = sum(run(scenario_from_dict({**v["scenario"], "seed": s})).summary["ttft_mean_s"] for s in v["seeds"])
    assert mean / len(v["seeds"]) == pytest.approx(rec.expected["ttft_mean_s"], rel=1e-9)
    assert rec.expected["ttft_mean_s"] < rec.bidirectional_off["ttft_mean_s"]


def test_compare_runs_the_adopted_flag_of_an_off_recommendation() -> None:
    from kvplan.plan.compare import RECOMMENDED_OFF, compare

    sc = scenario_from_dict(SINGLE)
    rec = recommend(sc, replications=1, workers=1)
    assert rec.transfer.get("tried_on") == "bidirectional off" and rec.transfer["adopted"] is True
    rows = compare(sc, ["off", "ttl_recommended"], replications=1, recommendation=rec)
    assert rows[1]["settings"]["policy.bidirectional"] is False
    assert rows[1]["settings"]["deployment.cross_layer_blocks"] is True
    assert rows[1]["description"].startswith(RECOMMENDED_OFF) and "cross-layer blocks" in rows[1]["description"]
    assert rows[1]["ttft_mean_s"] < rows[0]["ttft_mean_s"]
