"""One rule for the TP of aggregated replicas under per-role TP, in ``capacity`` and ``compare`` alike
(``plan/capacity.py`` ``REPLICA_TP_RULE``): the TP P and D share, else ``deployment.tensor_parallel_size`` when one
role runs it, else none (capacity: not sized; compare: left out, refused when named), and both say which."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvplan.app.cli import main
from kvplan.errors import KvplanInputError
from kvplan.plan.capacity import plan_capacity, replica_tp
from kvplan.plan.compare import compare, default_left_out
from kvplan.sim.scenario import scenario_from_dict


def _scenario(**deployment: Any) -> dict[str, Any]:
    """A light load (capacity meets a loose SLO at the smallest sizes)."""
    return {
        "model": "qwen3-32b",
        "hardware": "p5en",
        "deployment": {"max_num_seqs": 64, "prefill_prefix_caching": False, **deployment},
        "workload": {
            "conversations": 20,
            "arrival": {"kind": "poisson", "rate_per_s": 0.2},
            "turns": {"dist": "uniform", "low": 2, "high": 6},
            "prefix_tokens": {"dist": "lognormal", "median": 6000, "sigma": 0.4},
            "user_tokens": {"dist": "uniform", "low": 100, "high": 600},
            "output_tokens": {"dist": "uniform", "low": 50, "high": 300},
            "turn_gap_s": {"dist": "exponential", "mean": 15},
        },
        "seed": 1,
    }


#: P at TP4 (deployment.tensor_parallel_size), D at TP8 (per role): 2 x 4 + 1 x 8 = 16 GPUs
ONE_ROLE_AT_TP = _scenario(prefill_nodes=2, decode_nodes=1, tensor_parallel_size=4, decode_tensor_parallel_size=8)
#: P at TP2 and D at TP4, both per role; tensor_parallel_size 8 is neither role's
NEITHER_ROLE_AT_TP = _scenario(prefill_tensor_parallel_size=2, decode_tensor_parallel_size=4)


def test_the_rule() -> None:
    assert replica_tp(scenario_from_dict(_scenario(tensor_parallel_size=2))) == 2
    assert replica_tp(scenario_from_dict(_scenario(prefill_tensor_parallel_size=2, decode_tensor_parallel_size=2))) == 2
    assert replica_tp(scenario_from_dict(ONE_ROLE_AT_TP)) == 4
    assert replica_tp(scenario_from_dict(_scenario(prefill_tensor_parallel_size=2))) == 8  # D runs the field's TP8
    assert replica_tp(scenario_from_dict(NEITHER_ROLE_AT_TP)) is None


def test_capacity_sizes_replicas_of_the_tp_one_role_runs_and_says_so() -> None:
    """It said 'not sized' where compare ran TP4 replicas of the same scenario: now both run TP4 replicas."""
    sc = scenario_from_dict(ONE_ROLE_AT_TP)
    plan = plan_capacity(sc, None, 20000.0, replications=1, max_nodes=3, ttl_grid=(60.0,), max_rate=False)
    agg = plan.aggregated
    assert agg["not_sized"] is False and agg["meets_slo"] and agg["tensor_parallel_size"] == 4
    assert agg["gpus"] == 4 * agg["replicas"]
    assert agg["verification"]["scenario"]["deployment"]["tensor_parallel_size"] == 4
    assert agg["tensor_parallel_rule"].startswith("TP4 = deployment.tensor_parallel_size, the prefill instances' TP")
    assert any(n.startswith("aggregated: replicas of TP4 = deployment.tensor_parallel_size") for n in plan.notes)
    (row,) = compare(sc, ["aggregated"], replications=1)
    assert row["tensor_parallel_size"] == 4 and row["tensor_parallel_rule"] == agg["tensor_parallel_rule"]
    assert row["settings"]["deployment.replicas"] == 4 and row["gpus"] == 16
    assert any("aggregated replicas of TP4 = deployment.tensor_parallel_size" in n for n in row["notes"])


def test_compare_leaves_out_what_capacity_does_not_size(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """P TP2, D TP4, tensor_parallel_size 8: compare ran TP8 replicas (a TP neither role runs) where capacity said
    'not sized'; now compare leaves aggregated out of its default list and refuses it when named, both with the fix."""
    sc = scenario_from_dict(NEITHER_ROLE_AT_TP)
    (left,) = default_left_out(sc, ["off", "aggregated"])
    assert left["policy"] == "aggregated" and "prefill TP 2 and decode TP 4 differ" in left["why"]
    assert "set deployment.tensor_parallel_size to 2 or 4" in left["why"]
    with pytest.raises(KvplanInputError, match="prefill TP 2 and decode TP 4 differ"):
        compare(sc, ["aggregated"], replications=1)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(NEITHER_ROLE_AT_TP))
    assert main(["compare", str(path), "--policies", "off,aggregated", "--replications", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --policies aggregated: the scenario's prefill TP 2 and decode")
    assert "set deployment.tensor_parallel_size to 2 or 4" in err[0]
    # capacity's column says the same rule in its JSON
    assert main(["capacity", str(path), "--slo-ttft-p90-ms", "20000", "--replications", "1", "--no-max-rate",
                 "--max-nodes", "3", "--ttl-grid", "60", "--json"]) == 0
    agg = json.loads(capsys.readouterr().out)["aggregated"]
    assert agg["not_sized"] is True and agg["tensor_parallel_size"] is None
    assert "set deployment.tensor_parallel_size to 2 or 4" in agg["tensor_parallel_rule"]
