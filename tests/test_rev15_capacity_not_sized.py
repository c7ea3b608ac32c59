"""rev15 / left15: with P and D at two TPs, aggregated replicas take deployment.tensor_parallel_size when one role runs
it (the decode's with only prefill_tensor_parallel_size set), and only when it is neither role's are they not sized,
with a note saying so: before, 'tensor_parallel_size 8 is neither role's here' was said of TP8 with P at TP4, where
decode runs at TP8."""

from __future__ import annotations

from typing import Any

import pytest

from kvplan.plan.capacity import aggregated_not_sized, replica_tp, replica_tp_why
from kvplan.sim.scenario import scenario_from_dict


@pytest.mark.parametrize(("deployment", "tp", "whose"), [
    ({"tensor_parallel_size": 8, "prefill_tensor_parallel_size": 4}, 8, "the decode instances' TP"),
    ({"tensor_parallel_size": 2, "decode_tensor_parallel_size": 4}, 2, "the prefill instances' TP"),
    ({"prefill_tensor_parallel_size": 2, "decode_tensor_parallel_size": 4}, None, "is neither role's here"),
])
def test_whose_tp_aggregated_replicas_take(deployment: dict[str, Any], tp: int | None, whose: str) -> None:
    sc = scenario_from_dict({"model": "qwen3-32b", "hardware": "p5en", "deployment": deployment})
    assert replica_tp(sc) == tp
    why = replica_tp_why(sc)
    assert whose in why and "\n" not in why, why
    if tp is None:
        assert why == aggregated_not_sized(sc) and why.startswith("not sized: the scenario's prefill TP")
