"""Unit tests of the pure models against hand-computed numbers (VLLM_BEHAVIOUR.md section 3)."""

from __future__ import annotations

import pytest

from kvplan.errors import KvplanInputError
from kvplan.models.arch import (
    GLM_5_FP8,
    LLAMA_3_3_70B,
    QWEN3_32B,
    blocks_for_tokens,
    descriptors_per_transfer,
    get_model,
    kv_bytes_per_token_per_rank,
    weights_bytes_per_gpu,
)
from kvplan.models.costs import (
    DecodeCost,
    PrefillCost,
    TransferCost,
    decode_step_time_s,
    decode_steps_time_s,
    post_time_s,
    prefill_time_s,
    prep_time_s,
    pull_visible_time_s,
    transfer_time_s,
    xfer_time_s,
)
from kvplan.models.hardware import H200, get_hardware
from kvplan.models.memory import kv_capacity_tokens
from kvplan.models.profile import load_prior, load_profile, shipped_profiles


def test_qwen_kv_bytes_and_descriptors() -> None:
    assert kv_bytes_per_token_per_rank(QWEN3_32B, 8) == 32 * 1024  # 2 x 64 x 1 x 128 x 2 B
    assert kv_bytes_per_token_per_rank(QWEN3_32B, 1) == 256 * 1024
    # 25k-token pull: 1563 blocks x 128 regions ~ 200k descriptors per rank (VLLM_BEHAVIOUR.md 1.11)
    assert descriptors_per_transfer(QWEN3_32B, 25_000) == 128 * 1563
    assert descriptors_per_transfer(QWEN3_32B, 25_000, cross_layer_blocks=True) == 1563


def test_glm_mla_replicated_per_rank() -> None:
    assert kv_bytes_per_token_per_rank(GLM_5_FP8, 8) == 78 * (1152 + 132) == 100_152
    assert kv_bytes_per_token_per_rank(GLM_5_FP8, 1) == 100_152  # replicated, not sharded
    fp8 = GLM_5_FP8.model_copy(update={"kv_cache_dtype": "fp8_ds_mla"})
    assert kv_bytes_per_token_per_rank(fp8, 8) == 78 * (656 + 132) == 61_464
    assert descriptors_per_transfer(GLM_5_FP8, 21_000) == 156 * blocks_for_tokens(21_000, 64)


def test_llama_and_weights() -> None:
    assert kv_bytes_per_token_per_rank(LLAMA_3_3_70B, 8) == 2 * 80 * 1 * 128 * 2
    assert weights_bytes_per_gpu(QWEN3_32B, 8) == pytest.approx(8.19e9, rel=1e-3)


def test_capacity_from_vllm_memory_accounting() -> None:
    """vLLM's terms: torch total x util - weights - activation peak - non-torch, whole 16-token blocks."""
    cap = kv_capacity_tokens(QWEN3_32B, 8, H200, gpu_memory_utilization=0.9)
    gib = 1024**3
    act = 38 * 1024 * 151936 + 8192 * 5120 * 2 + 0.05 * gib
    expected = (139.81 * gib * 0.9 - 32.76e9 * 2 / 8 - act - 1.0 * gib) // (32768 * 16) * 16
    assert cap == expected
    with pytest.raises(KvplanInputError, match="weights do not fit"):
        kv_capacity_tokens(GLM_5_FP8, 1, H200, gpu_memory_utilization=0.9)


def test_cost_formulas() -> None:
    pc = PrefillCost(fixed_s=0.01, per_token_s=1e-5, attention_s=1e-9)
    # two chunks of 8192 and 1808 on top of 1000 cached
    c1 = 0.01 + 8192e-5 + 1e-9 * (8192 * 1000 + 8192 * 8193 / 2)
    c2 = 0.01 + 1808e-5 + 1e-9 * (1808 * (1000 + 8192) + 1808 * 1809 / 2)
    assert prefill_time_s(pc, 10_000, 1000) == pytest.approx(c1 + c2)
    tc = TransferCost(fixed_s=0.01, per_descriptor_s=1e-6, per_byte_s=1e-10, post_per_descriptor_s=2e-6, poll_s=0.001,
                      handshake_s=0.2, prep_fixed_s=1e-4, prep_per_descriptor_s=3e-7)
    # NIXL's xferDuration contains the post: visible = request creation + xferDuration + poll, post not re-added
    assert xfer_time_s(tc, 1e8, 1000) == pytest.approx(0.01 + 1e-3 + 1e-2)
    assert post_time_s(tc, 1000) == pytest.approx(2e-3)
    assert prep_time_s(tc, 1000) == pytest.approx(1e-4 + 3e-4)
    visible = 1e-4 + 3e-4 + 0.01 + 1e-3 + 1e-2 + 0.001
    assert transfer_time_s(tc, 1e8, 1000) == pytest.approx(visible)
    assert pull_visible_time_s(tc, 1e8, 1000) == pytest.approx(visible)
    assert pull_visible_time_s(tc, 1e8, 1000, first_use=True) == pytest.approx(visible + 0.2)
    dc = DecodeCost(fixed_s=0.01, per_seq_s=1e-4, per_context_token_s=1e-8)
    total = sum(decode_step_time_s(dc, 4, 1000 + 4 * i) for i in range(50))
    assert decode_steps_time_s(dc, 4, 1000, 50) == pytest.approx(total)


def test_presets_and_errors() -> None:
    assert get_model("qwen3-32b") is QWEN3_32B
    assert get_hardware("p5en").link.bandwidth_bytes_per_s_per_rank == pytest.approx(50e9)
    with pytest.raises(KvplanInputError, match="unknown model"):
        get_model("gpt-9")
    with pytest.raises(KvplanInputError, match="unknown hardware"):
        get_hardware("tpu")
    with pytest.raises(KvplanInputError):
        get_model({"name": "x", "attention": "gqa", "num_layers": 2, "hidden_size": 8, "num_q_heads": 2,
                                  "params_total": 1, "params_active": 1, "weight_bytes_total": 1})


def test_generic_yaml_model() -> None:
    m = get_model({"name": "tiny", "attention": "gqa", "num_layers": 4, "hidden_size": 256, "num_q_heads": 4,
                   "num_kv_heads": 2, "head_dim": 64, "params_total": 1e8, "params_active": 1e8,
                   "weight_bytes_total": 2e8})
    assert kv_bytes_per_token_per_rank(m, 2) == 2 * 4 * 1 * 64 * 2


def test_shipped_profiles_and_resolution() -> None:
    from kvplan.models.resolve import resolve_profile

    assert {"p5en-qwen3-32b", "p5en-glm-5-fp8"} <= set(shipped_profiles())
    base = load_profile("p5en-qwen3-32b")
    prof, notes = resolve_profile(LLAMA_3_3_70B, get_hardware("p5en"), 8, None)
    assert prof.extrapolated and prof.status == "composed" and "COMPOSED" in notes[0]
    assert prof.component_status["prefill.gpu"].startswith("kernel-derived (prior llama-3.3-70b-h200-tp8")
    assert "transferred from the calibration p5en-qwen3-32b" in prof.component_status["overhead"]
    # residuals are the calibration's; the GPU part is the llama prior alone (issue 19: the Qwen3-32B calibration's
    # prefill corrections apply only to Qwen3-32B on the H200, not to another model)
    assert prof.costs.overhead == base.costs.overhead and prof.costs.transfer == base.costs.transfer
    prior = load_prior("llama-3.3-70b", "h200", 8)
    assert prior is not None
    assert prof.costs.prefill.linear_s(8192) == pytest.approx(prior.costs.prefill.linear_s(8192))
    assert "no calibration correction" in prof.component_status["prefill.gpu"]

