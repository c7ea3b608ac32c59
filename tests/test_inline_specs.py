"""Inline model specs and explicit profiles get only what is theirs: a spec under a preset's name would inherit that
preset's calibrated costs, a profile calibrated on other hardware would pass as a calibration of this one; specs vLLM
could not load are refused with the field and the fix; a TP size refused names the sizes that work."""

from __future__ import annotations

from typing import Any

import pytest

from kvplan.errors import KvplanInputError
from kvplan.models.arch import MODEL_PRESETS, get_model
from kvplan.models.hardware import get_hardware
from kvplan.models.resolve import resolve_profile
from kvplan.sim.validity import check_tensor_parallel, valid_tensor_parallel_sizes

SPEC: dict[str, Any] = {"name": "mymodel", "attention": "gqa", "num_layers": 32, "hidden_size": 4096, "num_q_heads": 32,
                        "num_kv_heads": 8, "head_dim": 128, "params_total": 8e9, "params_active": 8e9,
                        "weight_bytes_total": 16e9, "max_model_len": 131072}


def test_an_inline_spec_under_a_preset_name_is_refused() -> None:
    with pytest.raises(KvplanInputError, match=r"model\.name: 'qwen3-32b' is the name of a preset"):
        get_model({**SPEC, "name": "qwen3-32b"})
    same = MODEL_PRESETS["qwen3-32b"].model_dump()
    assert get_model(same) == MODEL_PRESETS["qwen3-32b"]  # the preset written out in full is the preset
    assert get_model(SPEC).name == "mymodel"


@pytest.mark.parametrize(("change", "field"), [
    ({"params_active": 9e12}, "params_active"),
    ({"num_kv_heads": 64}, "num_kv_heads"),
    ({"num_q_heads": 30}, "num_kv_heads"),  # 8 KV heads cannot be shared by 30 query heads
])
def test_specs_vllm_cannot_load_are_refused(change: dict[str, Any], field: str) -> None:
    with pytest.raises(KvplanInputError, match=rf"model mymodel\.{field}:") as exc:
        get_model({**SPEC, **change})
    assert "Value error" not in str(exc.value) and len(str(exc.value).splitlines()) == 1


def test_a_refused_tp_names_the_sizes_that_work() -> None:
    arch = get_model({**SPEC, "num_q_heads": 30, "num_kv_heads": 30})
    assert valid_tensor_parallel_sizes(arch, 16) == [1, 2, 3, 5, 6, 10, 15]
    with pytest.raises(KvplanInputError, match=r"use one of 1, 2, 3, 5, 6, 10, 15$"):
        check_tensor_parallel(arch, 4)


def test_a_profile_from_other_hardware_is_composed_not_taken_as_calibrated() -> None:
    arch = MODEL_PRESETS["qwen3-32b"]
    same, _ = resolve_profile(arch, get_hardware("p5en"), 8, "p5en-qwen3-32b")
    assert same.name == "p5en-qwen3-32b" and same.status == "calibrated"
    other, _ = resolve_profile(arch, get_hardware("p6-b200"), 8, "p5en-qwen3-32b")
    assert other.status == "composed" and other.hardware == "p6-b200" and other.name.endswith("+p5en-qwen3-32b")


def test_an_unset_pool_too_small_names_what_sizes_it(tmp_path: Any) -> None:
    from kvplan.sim.api import run
    from kvplan.sim.scenario import scenario_from_dict

    sc = scenario_from_dict({"model": {**SPEC, "num_layers": 20000}, "hardware": "p5en",
                             "deployment": {"prefill_nodes": 1, "decode_nodes": 1, "tensor_parallel_size": 8},
                             "workload": {"conversations": 2, "turns": {"dist": "constant", "value": 1},
                                          "prefix_tokens": {"dist": "constant", "value": 60000}}})
    with pytest.raises(KvplanInputError) as exc:
        run(sc)
    msg = str(exc.value)
    assert "decode_kv_capacity_tokens" not in msg and "gpu_memory_utilization" in msg


def test_a_huge_tp_is_refused_at_once() -> None:
    """The sizes a refusal lists are bounded, whatever --tp says (a listing up to the given TP never ended)."""
    arch = MODEL_PRESETS["qwen3-32b"]
    with pytest.raises(KvplanInputError, match=r"use one of 1, 2, 4, 8, 16, 32, 64$"):
        check_tensor_parallel(arch, 999_999_999)
