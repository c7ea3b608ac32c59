"""A newcomer's first scenario names its GPU ("h100") and the model it serves ("llama-3.1-70b"): the errors say which
preset to write instead of listing bare preset names (helper new15)."""

from __future__ import annotations

import pytest

from kvplan.errors import KvplanInputError
from kvplan.models.arch import get_model
from kvplan.models.hardware import get_hardware


@pytest.mark.parametrize(("name", "want"), [("h100", "use p5 (8x H100-SXM-80GB"), ("H200", "p5en (8x H200-SXM-141GB"),
                                            ("l40s", "g6e (8x L40S-48GB")])
def test_gpu_name_as_hardware_names_its_instances(name: str, want: str) -> None:
    with pytest.raises(KvplanInputError, match=r"is a GPU") as err:
        get_hardware(name)
    assert want in str(err.value)


def test_unknown_hardware_lists_each_presets_gpus() -> None:
    with pytest.raises(KvplanInputError, match="unknown hardware 'p9'") as err:
        get_hardware("p9")
    assert "p5 (8x H100-SXM-80GB, 3,200 Gb/s EFA)" in str(err.value)
    assert "p5en-tcp (8x H200-SXM-141GB, UCX/TCP fallback)" in str(err.value)


@pytest.mark.parametrize(("name", "preset"), [("llama-3.1-70b", "llama-3.3-70b"),
                                              ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.3-70b"),
                                              ("Qwen/Qwen3-32B", "qwen3-32b"), ("Qwen3-32B", "qwen3-32b")])
def test_model_names_the_preset_to_use(name: str, preset: str) -> None:
    with pytest.raises(KvplanInputError, match=f"unknown model .*: use {preset}$"):
        get_model(name)


def test_llama_3_1_70b_really_is_the_llama_3_3_70b_architecture() -> None:
    """The hint is only honest while the preset keeps Llama-3.1-70B's config.json shapes."""
    m = get_model("llama-3.3-70b")
    assert (m.num_layers, m.hidden_size, m.num_q_heads, m.num_kv_heads, m.head_dim, m.intermediate_size,
            m.vocab_size, m.max_model_len) == (80, 8192, 64, 8, 128, 28672, 128256, 131072)


def test_unknown_model_names_hf_ids() -> None:
    with pytest.raises(KvplanInputError, match=r"unknown model 'gpt-9'; use one of qwen3-32b \(Qwen/Qwen3-32B\)"):
        get_model("gpt-9")


def test_memory_hardware_given_a_gpu_names_gpu_option(capsys: pytest.CaptureFixture[str]) -> None:
    from kvplan.app.cli import main

    assert main(["memory", "--model", "llama-3.3-70b", "--hardware", "h100", "--tp", "8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: --hardware: 'h100' is a GPU") and "use --gpu h100, or --hardware p5 (" in err
    assert "inline spec" not in err
    assert main(["memory", "--model", "llama-3.3-70b", "--gpu", "h100", "--tp", "8"]) == 0  # what it names works
