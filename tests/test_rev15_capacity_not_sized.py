"""rev15: capacity's 'aggregated: not sized' note names whose TP tensor_parallel_size is.

With prefill_tensor_parallel_size 4 and tensor_parallel_size 8 (decode_tensor_parallel_size unset), decode runs at
TP8, yet the note said 'deployment.tensor_parallel_size 8 is neither role's here'."""

from __future__ import annotations

from typing import Any

import pytest

from kvplan.plan.capacity import aggregated_not_sized
from kvplan.sim.scenario import scenario_from_dict


@pytest.mark.parametrize(("deployment", "whose"), [
    ({"tensor_parallel_size": 8, "prefill_tensor_parallel_size": 4}, "tensor_parallel_size 8 is the decode's only"),
    ({"tensor_parallel_size": 2, "decode_tensor_parallel_size": 4}, "tensor_parallel_size 2 is the prefill's only"),
    ({"prefill_tensor_parallel_size": 2, "decode_tensor_parallel_size": 4}, "tensor_parallel_size 8 is neither role's"),
])
def test_the_note_names_whose_tp_the_shared_field_is(deployment: dict[str, Any], whose: str) -> None:
    sc = scenario_from_dict({"model": "qwen3-32b", "hardware": "p5en", "deployment": deployment})
    note = aggregated_not_sized(sc)
    assert f"deployment.{whose} here" in note, note
    assert note.startswith("not sized: the scenario's prefill TP") and "\n" not in note
