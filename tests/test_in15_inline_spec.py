"""An inline model/hardware spec missing a required field (helper in15) said only 'model.attention: Field required':
no fix. It now names what an inline spec must give (and the presets, the other way out)."""

from __future__ import annotations

import pytest

from kvplan.errors import KvplanInputError
from kvplan.models.arch import MODEL_PRESETS, ModelArch
from kvplan.models.hardware import HARDWARE_PRESETS, Node
from kvplan.models.presets import resolve_preset


def test_model_spec_missing_a_field() -> None:
    with pytest.raises(KvplanInputError) as info:
        resolve_preset({"name": "mine", "num_layers": 4}, MODEL_PRESETS, ModelArch, "model")
    msg = str(info.value)
    assert msg.startswith("model.attention: Field required; add it; an inline model spec gives at least name, ")
    assert "num_layers" in msg and "qwen3-32b" in msg


def test_hardware_spec_missing_a_field() -> None:
    with pytest.raises(KvplanInputError) as info:
        resolve_preset({"name": "mine"}, HARDWARE_PRESETS, Node, "hardware")
    msg = str(info.value)
    assert "Field required; add it; an inline hardware spec gives at least name, gpu" in msg and "p5en" in msg
