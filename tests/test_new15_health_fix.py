"""Every SATURATED line names the scenario field to change (helper new15: 'lower decoder_kv_blocks_ttl_s ... or
add D' named no section, 'add P nodes' no field, and the prefill KV pool and link lines had no fix at all)."""

from __future__ import annotations

import copy
import re

from conftest import small

from kvplan.sim.api import run
from kvplan.sim.health import health_lines
from kvplan.sim.scenario import Deployment, Policy

FIELD = re.compile(r"\b(?:deployment|policy)\.[a-z_]+")


def _saturated_health() -> dict:
    wl = {**small()["workload"], "conversations": 40, "turns": {"dist": "constant", "value": 1}}
    r = run(small(workload=wl, deployment={"decode_kv_capacity_tokens": 12_000}, policy={"decoder_kv_blocks_ttl_s": 60}))
    return r.summary["health"]


def test_each_saturated_line_names_a_scenario_field() -> None:
    h = copy.deepcopy(_saturated_health())
    h["saturated"] = list(h["resources"])  # every resource's line, as each could be
    lines = [ln for ln in health_lines(h) if ln.startswith("SATURATED")]
    assert len(lines) == len(h["resources"])
    fields = set(Deployment.model_fields) | set(Policy.model_fields)
    for line in lines:
        named = FIELD.findall(line)
        assert named, line
        for path in named:  # each a real field of the scenario (a renamed field would leave a stale hint)
            assert path.split(".", 1)[1] in fields, path


def test_retention_line_names_the_ttl_field_and_vllm_knob() -> None:
    line = health_lines(_saturated_health())[0]
    assert "lower policy.decoder_kv_blocks_ttl_s (vLLM's decoder_kv_blocks_ttl" in line
    assert "add D nodes (deployment.decode_nodes)" in line


def test_prefill_pool_behind_a_full_decode_pool_names_d() -> None:
    h = copy.deepcopy(_saturated_health())
    h["saturated"] = ["decode_kv", "prefill_held_kv"]
    line = next(ln for ln in health_lines(h) if ln.startswith("SATURATED prefill KV pool"))
    assert "D's pool is full too: add D nodes (deployment.decode_nodes)" in line


def test_pins_full_at_peak_only_still_name_the_ttl() -> None:
    """Pins 46% of the pool on average and 100% at peak: not 'by retention' (>= 50% on average), and the line said
    'running requests fill it (held peak 100%, pinned peak 100%)', the pinned peak read as running requests', with
    no TTL in its fix (a fitted AgentX workload on Llama-3.3-70B, 1P1D p5)."""
    h = copy.deepcopy(_saturated_health())
    h["saturated"] = ["decode_kv"]
    h["resources"]["decode_kv"].update(by_retention=False, pinned_mean_fraction=0.46, pinned_peak_fraction=1.0,
                                       utilization=1.0)
    line = health_lines(h)[0]
    assert "running requests fill it" not in line
    assert "pinned KV of finished conversations holds 46% of the pool on average, 100% at peak" in line
    assert "lower policy.decoder_kv_blocks_ttl_s" in line


def test_no_room_beside_few_pins_names_a_larger_pool() -> None:
    h = copy.deepcopy(_saturated_health())
    h["saturated"] = ["decode_kv"]
    h["resources"]["decode_kv"].update(by_retention=False, pinned_mean_fraction=0.1, pinned_peak_fraction=0.2,
                                       utilization=0.2, used_peak_fraction=0.95, request_fraction=0.85,
                                       no_room_for_a_request=True)
    line = health_lines(h)[0]
    assert "its requests do not fit beside the pins" in line and "no room for the next one" in line
    assert "deployment.kv_cache_dtype: fp8" in line and "lower policy.decoder_kv_blocks_ttl_s" not in line
