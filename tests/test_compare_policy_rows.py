"""compare's retention rows are the policies they name, whatever the scenario's own policy carries: with
``policy.offload`` (and a lease) in the scenario, the ``ttl`` row ('vLLM's defaults'), ``lease`` and ``ttl_evictable``
ran with the scenario's host tier (and ``ttl`` with its lease), found by helper rev15."""

from __future__ import annotations

from typing import Any

from kvplan.plan.compare import policy_run
from kvplan.sim.scenario import scenario_from_dict, with_overrides

SC: dict[str, Any] = {"model": "qwen3-32b", "hardware": "p5en",
      "policy": {"bidirectional": True, "offload": {}, "retention": {"kind": "lease"}}}


def test_retention_rows_do_not_inherit_the_scenarios_host_tier_or_lease() -> None:
    sc = scenario_from_dict(SC)
    want = {"ttl": ("ttl", False), "lease": ("lease", False), "ttl_evictable": ("ttl_evictable", False),
            "offload": ("ttl", True)}
    for name, (kind, offload) in want.items():
        v = with_overrides(sc, policy_run(name, sc).overrides)
        assert v.policy.retention.kind == kind, name
        assert (v.policy.offload is not None) is offload, name


def test_the_offload_row_names_where_its_host_tier_comes_from() -> None:
    # 'offload: {}' in the scenario leaves both sizes to the hardware preset (the row said "the scenario's")
    preset = policy_run("offload", scenario_from_dict(SC)).notes[0]
    assert "host tier from the hardware preset" in preset, preset
    own = scenario_from_dict({**SC, "policy": {**SC["policy"], "offload": {"host_capacity_gib": 512}}})
    assert "host tier from the scenario's policy.offload" in policy_run("offload", own).notes[0]
