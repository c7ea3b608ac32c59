"""A list of numbers in a scenario (``workload.trace.window_s``, an inline empirical ``values``) follows the rule of
every number field (sim/scenario_base.py): a YAML bool or a string is refused naming the field and the item, where
pydantic's lax mode read ``true`` as 1.0 and the YAML 1.1 string ``5e3`` as 5000.0."""

from __future__ import annotations

from typing import Any

import pytest

from kvplan.errors import KvplanInputError
from kvplan.sim.scenario import scenario_from_dict

TRACE = {"path": "t.csv"}


@pytest.mark.parametrize(("data", "needle"), [
    ({"workload": {"trace": {**TRACE, "window_s": ["0", 5]}}}, "field 'workload.trace.window_s': item 0 is the string '0'"),
    ({"workload": {"trace": {**TRACE, "window_s": [0, "5e3"]}}}, "item 1 is the string '5e3', not a number (YAML 1.1"),
    ({"workload": {"trace": {**TRACE, "window_s": [True, 5]}}}, "field 'workload.trace.window_s': item 0 is true"),
    ({"workload": {"output_tokens": {"dist": "empirical", "values": [1, 2, True]}}},
     "field 'workload.output_tokens.values': item 2 is true, not a number"),
    ({"workload": {"turn_gap_s": {"dist": "empirical", "values": ["1.5"]}}},
     "field 'workload.turn_gap_s.values': item 0 is the string '1.5'"),
])
def test_a_bool_or_a_string_in_a_list_of_numbers_is_refused(data: dict[str, Any], needle: str) -> None:
    with pytest.raises(KvplanInputError) as exc:
        scenario_from_dict(data)
    assert needle in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_numbers_in_lists_still_load() -> None:
    sc = scenario_from_dict({"workload": {"trace": {**TRACE, "window_s": [0, 5.5]},
                                          "output_tokens": {"dist": "empirical", "values": [1, 2.5]}}})
    assert sc.workload.trace is not None and sc.workload.trace.window_s == (0.0, 5.5)
    assert sc.workload.output_tokens.values == (1.0, 2.5)  # type: ignore[union-attr]
