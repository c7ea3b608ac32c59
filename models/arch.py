"""LLM architectures as data, and the KV-cache arithmetic vLLM does on them.

Everything here is pure: no SimPy, no I/O. Sources for the numbers are in ``../shared/VLLM_BEHAVIOUR.md``
section 3 (model configs) and section 1.11 (descriptor counts); each preset cites its config.

Units are in the names: ``*_bytes``, ``*_tokens``. A *rank* is one tensor-parallel GPU.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from kvplan.errors import input_error
from kvplan.models.presets import resolve_preset

BYTES_PER_BF16 = 2
BYTES_PER_FP8 = 1
FP32_BYTES = 4
KV_TENSORS_PER_LAYER_GQA = 2  # one K and one V tensor per attention layer
FLOPS_PER_MAC = 2


class ModelArch(BaseModel):
    """One LLM architecture, enough to size its KV cache, weights and prefill FLOPs.

    ``attention='gqa'`` is a dense GQA/MHA model whose KV heads are sharded over TP ranks (replicated
    when there are fewer KV heads than ranks). ``attention='mla'`` is a DeepSeek-style multi-head latent
    attention model: the latent (``mla_latent_dim`` + ``mla_rope_dim`` values per token and layer) is
    **replicated on every TP rank** (vLLM's MLA backends), optionally with a DSA indexer cache of
    ``indexer_bytes_per_token_layer`` bytes (GLM-5 / DeepSeek-V3.2).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Short name used in scenarios, e.g. qwen3-32b.")
    hf_id: str = Field(default="", description="Hugging Face repository id, for provenance.")
    attention: Literal["gqa", "mla"] = Field(description="KV layout: gqa (sharded heads) or mla (latent).")
    num_layers: int = Field(gt=0, description="Transformer layers holding KV cache.")
    hidden_size: int = Field(gt=0, description="Model hidden size.")
    num_q_heads: int = Field(gt=0, description="Query heads.")
    num_kv_heads: int = Field(default=0, ge=0, description="KV heads (gqa only).")
    head_dim: int = Field(default=0, ge=0, description="Head dimension (gqa only).")
    mla_latent_dim: int = Field(default=0, ge=0, description="MLA kv_lora_rank (mla only).")
    mla_rope_dim: int = Field(default=0, ge=0, description="MLA decoupled RoPE key dim (mla only).")
    indexer_bytes_per_token_layer: int = Field(
        default=0, ge=0, description="DSA indexer K-cache bytes per token per layer (0 = no indexer)."
    )
    kv_cache_dtype: Literal["bf16", "fp8", "fp8_ds_mla"] = Field(
        default="bf16", description="KV cache dtype as vLLM's --kv-cache-dtype (auto = bf16 here)."
    )
    block_size_tokens: int = Field(default=16, gt=0, description="vLLM KV block size in tokens.")
    intermediate_size: int = Field(default=0, ge=0, description="Dense FFN intermediate size.")
    vocab_size: int = Field(default=0, ge=0, description="Vocabulary size.")
    params_total: float = Field(gt=0, description="Total parameters (all experts).")
    params_active: float = Field(gt=0, description="Parameters active per token (non-embedding).")
    weight_bytes_total: float = Field(gt=0, description="Bytes of weights in the served checkpoint.")
    attention_flops_per_pair: float = Field(
        default=0.0, ge=0, description="Attention FLOPs per (query, key) pair over all layers (0 = derive)."
    )
    max_model_len: int = Field(default=32768, gt=0, description="Context limit used for serving (vLLM's default:"
                               " the config's max_position_embeddings).")

    @model_validator(mode="after")
    def _check_layout(self) -> ModelArch:
        if self.attention == "gqa" and (self.num_kv_heads <= 0 or self.head_dim <= 0):
            raise input_error(f"model {self.name}", "gqa models need num_kv_heads and head_dim > 0")
        if self.attention == "mla" and self.mla_latent_dim <= 0:
            raise input_error(f"model {self.name}", "mla models need mla_latent_dim > 0")
        if self.kv_cache_dtype == "fp8_ds_mla" and self.attention != "mla":
            raise input_error(f"model {self.name}.kv_cache_dtype", "fp8_ds_mla is only for mla models")
        if self.attention == "gqa" and (self.num_kv_heads > self.num_q_heads or self.num_q_heads % self.num_kv_heads):
            raise input_error(f"model {self.name}.num_kv_heads",
                              f"{self.num_kv_heads} KV heads for {self.num_q_heads} query heads: grouped-query attention "
                              "shares each KV head among a whole number of query heads",
                              "give a divisor of num_q_heads (num_q_heads itself for multi-head attention)")
        if self.params_active > self.params_total:
            raise input_error(f"model {self.name}.params_active",
                              f"{self.params_active:.4g} active parameters exceed the {self.params_total:.4g} in total",
                              "params_active counts the parameters one token uses (<= params_total)")
        return self


def kv_bytes_per_token_per_rank(arch: ModelArch, tp: int) -> int:
    """KV-cache bytes one token occupies on one TP rank.

    GQA: ``2 (K,V) x layers x ceil(kv_heads / tp) x head_dim x dtype`` (heads replicated when tp >
    kv_heads). MLA: ``layers x (latent bytes + indexer bytes)``, replicated on every rank; the latent is
    ``(latent + rope) x 2`` in bf16 or ``latent x 1 + 4 x fp32 scales + rope x 2`` in ``fp8_ds_mla``
    (FlashMLA-sparse layout, VLLM_BEHAVIOUR.md 3.2). Qwen3-32B at TP8: 32 KiB; GLM-5 bf16: 100,152 B.
    """
    if tp <= 0:
        raise input_error("deployment.tensor_parallel_size", "must be > 0")
    if arch.attention == "gqa":
        elem = BYTES_PER_BF16 if arch.kv_cache_dtype == "bf16" else BYTES_PER_FP8
        heads_per_rank = math.ceil(arch.num_kv_heads / tp)
        return KV_TENSORS_PER_LAYER_GQA * arch.num_layers * heads_per_rank * arch.head_dim * elem
    if arch.kv_cache_dtype == "fp8_ds_mla":
        fp8_scales = 4
        latent = arch.mla_latent_dim * BYTES_PER_FP8 + fp8_scales * FP32_BYTES + arch.mla_rope_dim * BYTES_PER_BF16
    else:
        elem = BYTES_PER_BF16 if arch.kv_cache_dtype == "bf16" else BYTES_PER_FP8
        latent = (arch.mla_latent_dim + arch.mla_rope_dim) * elem
    return arch.num_layers * (latent + arch.indexer_bytes_per_token_layer)


def kv_bytes_per_token_all_ranks(arch: ModelArch, tp: int) -> int:
    """KV bytes one token occupies summed over the ``tp`` GPUs of an instance (MLA counts each replica)."""
    return kv_bytes_per_token_per_rank(arch, tp) * tp


def kv_regions_per_rank(arch: ModelArch, cross_layer_blocks: bool = False) -> int:
    """Registered NIXL memory regions per rank: K and V per layer (gqa), latent (+ indexer) per layer (mla).

    With ``enable_cross_layers_blocks`` a logical block is contiguous over layers, so one region
    remains (VLLM_BEHAVIOUR.md 1.11; the exact count there is **[uncertain]**).
    """
    if cross_layer_blocks:
        return 1
    if arch.attention == "gqa":
        return KV_TENSORS_PER_LAYER_GQA * arch.num_layers
    return arch.num_layers * (2 if arch.indexer_bytes_per_token_layer else 1)


def blocks_for_tokens(tokens: int, block_size_tokens: int) -> int:
    """Blocks needed to hold ``tokens`` tokens (the last block may be partial)."""
    return -(-max(tokens, 0) // block_size_tokens)


def full_blocks_tokens(tokens: int, block_size_tokens: int) -> int:
    """Tokens covered by *full* blocks only (what vLLM's prefix cache can hit)."""
    return (max(tokens, 0) // block_size_tokens) * block_size_tokens


def descriptors_per_transfer(arch: ModelArch, tokens: int, cross_layer_blocks: bool = False) -> int:
    """NIXL descriptors one rank posts to move ``tokens`` tokens: regions x blocks (worker register_kv_caches)."""
    return kv_regions_per_rank(arch, cross_layer_blocks) * blocks_for_tokens(tokens, arch.block_size_tokens)


def weights_bytes_per_gpu(arch: ModelArch, tp: int) -> float:
    """Weight bytes per GPU with the checkpoint split evenly over ``tp`` ranks."""
    return arch.weight_bytes_total / tp


def linear_flops_per_token(arch: ModelArch) -> float:
    """Prefill FLOPs per token of the dense/active matmuls: 2 x active parameters."""
    return FLOPS_PER_MAC * arch.params_active


def attention_flops_per_pair(arch: ModelArch) -> float:
    """Attention FLOPs per (query, key) pair over all layers: 4 x q_heads x head_dim x layers (QK^T and PV).

    For MLA give ``attention_flops_per_pair`` explicitly: the kernel form changes the constant.
    """
    if arch.attention_flops_per_pair > 0:
        return arch.attention_flops_per_pair
    head_dim = arch.head_dim if arch.head_dim else arch.mla_latent_dim
    return 2 * FLOPS_PER_MAC * arch.num_q_heads * head_dim * arch.num_layers


# --- presets -------------------------------------------------------------------------------------------

QWEN3_32B = ModelArch(
    # Qwen/Qwen3-32B config.json: 64 layers, hidden 5120, 64 q / 8 kv heads x 128, FFN 25600, vocab 151936.
    name="qwen3-32b",
    hf_id="Qwen/Qwen3-32B",
    attention="gqa",
    num_layers=64,
    hidden_size=5120,
    num_q_heads=64,
    num_kv_heads=8,
    head_dim=128,
    block_size_tokens=16,
    intermediate_size=25600,
    vocab_size=151936,
    params_total=32.76e9,
    params_active=31.21e9,  # non-embedding (VLLM_BEHAVIOUR.md 3.1)
    weight_bytes_total=32.76e9 * BYTES_PER_BF16,
    max_model_len=40960,  # config.json max_position_embeddings: vLLM's default max_model_len
)

GLM_5_FP8 = ModelArch(
    # zai-org/GLM-5-FP8 (GlmMoeDsaConfig): 78 layers, MLA kv_lora_rank 512 + rope 64, DSA indexer 132 B/tok/layer.
    name="glm-5-fp8",
    hf_id="zai-org/GLM-5-FP8",
    attention="mla",
    num_layers=78,
    hidden_size=6144,
    num_q_heads=64,
    mla_latent_dim=512,
    mla_rope_dim=64,
    indexer_bytes_per_token_layer=132,
    kv_cache_dtype="bf16",  # the blog passes no --kv-cache-dtype: likely bf16 [uncertain]
    block_size_tokens=64,
    intermediate_size=12288,
    vocab_size=154880,
    params_total=744e9,
    params_active=40e9,
    weight_bytes_total=752e9,  # 744 B FP8 + bf16 extras, ~94 GB per GPU at TP8 (VLLM_BEHAVIOUR.md 3.2)
    # DSA: each query attends to <= 2048 keys; indexer scan ~2*32*128 FLOP per (q,k) per layer.
    attention_flops_per_pair=2 * 32 * 128 * 78,
    max_model_len=202752,  # config.json max_position_embeddings (vLLM's default); the P5en write-up served 32768
)

LLAMA_3_3_70B = ModelArch(
    # meta-llama/Llama-3.3-70B-Instruct config.json: 80 layers, hidden 8192, 64 q / 8 kv x 128, FFN 28672.
    name="llama-3.3-70b",
    hf_id="meta-llama/Llama-3.3-70B-Instruct",
    attention="gqa",
    num_layers=80,
    hidden_size=8192,
    num_q_heads=64,
    num_kv_heads=8,
    head_dim=128,
    block_size_tokens=16,
    intermediate_size=28672,
    vocab_size=128256,
    params_total=70.55e9,
    params_active=68.45e9,  # non-embedding: 80 x (attention 150.99 M + MLP 704.64 M)
    weight_bytes_total=70.55e9 * BYTES_PER_BF16,
    max_model_len=131072,  # config.json max_position_embeddings (llama3 RoPE scaling to 128k)
)

LLAMA_3_1_8B = ModelArch(
    # meta-llama/Llama-3.1-8B-Instruct config.json: 32 layers, hidden 4096, 32 q / 8 kv x 128, FFN 14336.
    name="llama-3.1-8b",
    hf_id="meta-llama/Llama-3.1-8B-Instruct",
    attention="gqa",
    num_layers=32,
    hidden_size=4096,
    num_q_heads=32,
    num_kv_heads=8,
    head_dim=128,
    block_size_tokens=16,
    intermediate_size=14336,
    vocab_size=128256,
    params_total=8.03e9,
    params_active=6.98e9,  # non-embedding: 32 x (attention 41.9 M + MLP 176.2 M)
    weight_bytes_total=8.03e9 * BYTES_PER_BF16,
    max_model_len=131072,  # config.json max_position_embeddings
)

QWEN3_8B = ModelArch(
    # Qwen/Qwen3-8B config.json (the copy aiconfigurator-core 0.12.0 ships, model_configs/Qwen--Qwen3-8B_config.json):
    # 36 layers, hidden 4096, 32 q / 8 kv heads x 128, FFN 12288, vocab 151936, untied embeddings, max_position 40960.
    name="qwen3-8b",
    hf_id="Qwen/Qwen3-8B",
    attention="gqa",
    num_layers=36,
    hidden_size=4096,
    num_q_heads=32,
    num_kv_heads=8,
    head_dim=128,
    block_size_tokens=16,
    intermediate_size=12288,
    vocab_size=151936,
    params_total=8.19e9,  # 36 x 192.95 M + embedding and lm_head 2 x 622.3 M (the model card: 8.2 B)
    params_active=6.95e9,  # non-embedding (the model card: 6.95 B)
    weight_bytes_total=8.19e9 * BYTES_PER_BF16,
    max_model_len=40960,  # config.json max_position_embeddings (vLLM's default max_model_len)
)

MODEL_PRESETS: dict[str, ModelArch] = {
    m.name: m for m in (QWEN3_32B, GLM_5_FP8, LLAMA_3_3_70B, LLAMA_3_1_8B, QWEN3_8B)
}


#: Models with the architecture of a preset (identical config.json shapes: layers, heads, hidden, FFN, vocabulary and
#: context), so that preset simulates them: meta-llama/Llama-3.1-70B-Instruct's config.json has Llama-3.3-70B's 80
#: layers, hidden 8192, 64 q / 8 kv heads x 128, FFN 28672, vocabulary 128256 and max_position_embeddings 131072.
#: (Llama-3-70B is not: its context is 8,192 tokens.)
SAME_ARCHITECTURE: dict[str, str] = {"llama-3.1-70b": "llama-3.3-70b"}


def _preset_for(name: str) -> tuple[str, bool] | None:
    """The preset a name that is not one means, and whether it is another model of the same architecture
    (:data:`SAME_ARCHITECTURE`) rather than another spelling of the preset's own (a Hugging Face id such as
    ``Qwen/Qwen3-32B``, any case, with or without ``-Instruct``)."""
    short = name.strip().lower().rsplit("/", 1)[-1].removesuffix("-instruct")
    for m in MODEL_PRESETS.values():
        if short in (m.name, m.hf_id.lower().rsplit("/", 1)[-1].removesuffix("-instruct")):
            return m.name, False
    short = short.removeprefix("meta-")
    if short in SAME_ARCHITECTURE:
        return SAME_ARCHITECTURE[short], True
    return None


def get_model(name_or_spec: str | dict[str, object] | ModelArch) -> ModelArch:
    """Resolve a preset name, or validate a user's inline architecture (the generic YAML form)."""
    if isinstance(name_or_spec, str) and name_or_spec not in MODEL_PRESETS:
        found = _preset_for(name_or_spec)
        if found is not None:
            preset, other = found
            m = MODEL_PRESETS[preset]
            what = (f"it has the architecture of the preset '{preset}' ({m.hf_id}: the same layers, heads, hidden "
                    "size, FFN, vocabulary and context)" if other else f"it is the preset '{preset}' ({m.hf_id})")
            raise input_error("model", f"unknown model '{name_or_spec}'", f"{what}: use {preset}")
        raise input_error("model", f"unknown model '{name_or_spec}'",
                          f"use one of {', '.join(f'{k} ({m.hf_id})' for k, m in MODEL_PRESETS.items())} or an inline "
                          "spec")
    return resolve_preset(name_or_spec, MODEL_PRESETS, ModelArch, "model")
