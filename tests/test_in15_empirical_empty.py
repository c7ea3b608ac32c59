"""An empirical distribution with an empty inline sample (helper in15) said only "'values' is empty": the error now
names the fix too."""

from __future__ import annotations

import pytest

from kvplan.errors import KvplanInputError
from kvplan.sim.scenario import scenario_from_dict


def test_empty_inline_sample_names_the_fix() -> None:
    data = {"workload": {"user_tokens": {"dist": "empirical", "values": []}}}
    with pytest.raises(KvplanInputError) as info:
        scenario_from_dict(data, where="s.yaml")
    msg = str(info.value)
    assert "field 'workload.user_tokens'" in msg and "'values' is empty; give at least one value" in msg
    assert "'path:'" in msg
