"""vLLM's GPU memory accounting: how many KV-cache tokens one engine gets (pure, no SimPy).

The one function :func:`plan_memory` follows vLLM V1's start-up, per TP rank:

* ``Worker.determine_available_memory`` (``vllm/v1/worker/gpu_worker.py``, read at commit 35d5cda of
  vllm-project/vllm, the v0.11-v0.13 line; the same terms through v0.18)::

      requested  = total_memory x gpu_memory_utilization        # MemorySnapshot.total_memory (torch)
      available  = requested - non_kv_cache_memory [- cudagraph_memory_estimate_applied]
      non_kv_cache_memory = weights_memory + torch_peak_increase + non_torch_increase   # memory_profiling()

  ``torch_peak_increase`` is the activation peak of ``profile_run()`` (a dummy forward of
  ``max_num_batched_tokens`` tokens, then a dummy sampler run over ``min(max_num_seqs,
  max_num_batched_tokens)`` requests); ``non_torch_increase`` is what NCCL / custom all-reduce / cuBLAS
  allocate outside torch after the start-up snapshot. The CUDA-graph estimate
  (``profile_cudagraph_memory``) is subtracted only with ``VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1``
  (off before v0.19, announced as the v0.19 default): ``cudagraph_memory_profiling``.
* ``get_num_blocks`` / ``get_kv_cache_config_from_groups`` (``vllm/v1/core/kv_cache_utils.py``)::

      num_blocks = available // page_size_bytes // layers_per_group     # page = block_size x bytes/token/layer
      GPU KV cache size = num_blocks x block_size tokens                  # every rank holds its slice
      max concurrency   = num_blocks / cdiv(max_model_len, block_size)

What vLLM measures on the GPU kvplan must model; each model states its data and error:

* **total memory**: the torch-reported ``total_memory`` of the GPU preset (``GPU.torch_total_memory_bytes``,
  each cited in ``models/hardware.py``).
* **weights**: the checkpoint's bytes / TP (vLLM logs "Model loading took X GiB": 14.99 GiB for
  Llama-3.1-8B and 61.03 GiB for Qwen3-32B in the llm-d H100 logs, 0.1-0.3 % from ``weight_bytes_total``).
* **activation peak** (fit, :data:`SAMPLER_BYTES_PER_LOGIT`, :data:`ACTIVATION_BASE_BYTES`): at serving
  defaults the peak is the sampler's, not the forward's: ``38 B x min(max_num_seqs, max_num_batched_tokens) x
  vocab`` (the fp32 logits plus the top-k/top-p sort, softmax and index tensors of
  ``vllm/v1/sample/ops/topk_topp_sampler.py``) plus the retained hidden states ``B x hidden x 2 B`` plus
  0.05 GiB; the forward's MLP transient ``B x 3 x intermediate/tp x 2 B`` takes over only when it is larger.
  Fitted to the five H100 engines of llm-d-benchmark ``config_explorer/empirical-vllm-memory-results.md``
  (Llama-3.1-8B 4.76 GiB, Llama-3.3-70B-FP8 TP1/TP2 4.84, Qwen3-0.6B 5.56, Qwen3-32B 5.64, gpt-oss-20b
  7.38): residual <= 0.02 GiB; out of sample, 5.58 GiB on an H200 TP2 Qwen3-Next vLLM 0.10.2 log that says
  "FlashInfer is not available. Falling back to the PyTorch-native implementation of top-p & top-k sampling"
  (5.59 modelled). vLLM 0.10.1.1 "Using FlashInfer for top-p & top-k sampling" peaks far lower (~0.4 GiB at 256
  sequences on A100): the modelled path is the PyTorch-native sampler, see ``tests/data/vllm_startup_logs.json``.
* **non-torch memory** (assumption, :data:`NON_TORCH_BYTES_TP1`, :data:`NON_TORCH_BYTES_TP`): 0.13 GiB at
  TP1 (0.13-0.14 in the llm-d logs); 1.0 GiB at TP >= 2, the mean of 0.55 GiB (H100 TP2, llm-d) and
  1.38 GiB (H200 TP2 log), error +-0.45 GiB; TP4/TP8 not measured.
* **CUDA graphs** (assumption, :data:`CUDAGRAPH_ESTIMATE_BYTES`): 0.7 GiB when profiled (logged graph pools
  0.1-2.4 GiB: 0.50/0.65 GiB Qwen2-7B TP1/TP2, 0.39 gpt-oss-20b, 2.37 Qwen3-Next TP2 FULL+PIECEWISE).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from kvplan.errors import input_error
from kvplan.models.arch import ModelArch, kv_bytes_per_token_per_rank, weights_bytes_per_gpu
from kvplan.models.hardware import GIB, GPU

BF16_BYTES = 2
#: Sampler transient per (request x vocabulary entry): 9.5 x the fp32 logit (fit, see the module docstring).
SAMPLER_BYTES_PER_LOGIT = 38.0
#: Activation bytes not explained by the sampler and hidden-state terms (fit intercept).
ACTIVATION_BASE_BYTES = 0.05 * GIB
#: Forward-pass MLP transient per token and per intermediate unit on a rank: gate_up (2) + act output (1), bf16.
MLP_TRANSIENT_FACTOR = 3
NON_TORCH_BYTES_TP1 = 0.13 * GIB
NON_TORCH_BYTES_TP = 1.0 * GIB
CUDAGRAPH_ESTIMATE_BYTES = 0.7 * GIB
#: Device memory held before vLLM's start-up snapshot by the CUDA context (assumption, not measured here: a torch
#: CUDA context takes about 0.5 GiB on Ampere/Hopper). vLLM refuses to start when the free memory at that
#: snapshot is below total x gpu_memory_utilization (``Worker.init_device``, gpu_worker.py: "Free memory on
#: device ... on startup is less than desired GPU memory utilization"), so a utilization this close to 1 fails.
CUDA_CONTEXT_BYTES = 0.5 * GIB
#: What this module models, for reports and notes.
ACCOUNTING = ("vLLM V1 Worker.determine_available_memory (vllm/v1/worker/gpu_worker.py @35d5cda, v0.11-v0.18 terms) "
              "and kv_cache_utils.get_num_blocks")


@dataclass(frozen=True)
class MemoryPlan:
    """One engine's memory split per TP rank, as vLLM's start-up log reports it (bytes unless named)."""

    total_bytes: float
    gpu_memory_utilization: float
    requested_bytes: float
    weights_bytes: float
    activation_peak_bytes: float
    non_torch_bytes: float
    cudagraph_bytes: float
    available_kv_bytes: float
    kv_bytes_per_token: int
    block_size_tokens: int
    num_gpu_blocks: int
    kv_cache_tokens: int
    max_model_len: int
    max_concurrency: float

    def as_dict(self) -> dict[str, Any]:
        """The plan as plain numbers (JSON-ready)."""
        return asdict(self)


def device_total_bytes(gpu: GPU) -> float:
    """The ``total_memory`` torch reports for ``gpu`` (vLLM's ``MemorySnapshot.total_memory``)."""
    return gpu.torch_total_memory_bytes or gpu.hbm_bytes


def activation_peak_bytes(arch: ModelArch, tp: int, max_num_batched_tokens: int, max_num_seqs: int) -> float:
    """``torch_peak_increase`` of vLLM's ``profile_run`` (model in the module docstring)."""
    reqs = min(max_num_seqs, max_num_batched_tokens)
    sampler = SAMPLER_BYTES_PER_LOGIT * reqs * arch.vocab_size
    forward = max_num_batched_tokens * MLP_TRANSIENT_FACTOR * (arch.intermediate_size / tp) * BF16_BYTES
    hidden = max_num_batched_tokens * arch.hidden_size * BF16_BYTES
    return max(sampler, forward) + hidden + ACTIVATION_BASE_BYTES


def non_torch_bytes(tp: int) -> float:
    """``non_torch_increase``: NCCL / custom all-reduce buffers and the like (assumption in the module docstring)."""
    return NON_TORCH_BYTES_TP1 if tp == 1 else NON_TORCH_BYTES_TP


#: How a scenario names the knobs of :func:`plan_memory` (its errors say which to change).
SCENARIO_KNOBS: Mapping[str, str] = {
    "tp": "deployment.tensor_parallel_size", "gpu_memory_utilization": "deployment.gpu_memory_utilization",
    "max_num_seqs": "deployment.max_num_seqs", "max_num_batched_tokens": "deployment.max_num_batched_tokens",
}
#: How ``kvplan memory`` names them: its flags.
FLAG_KNOBS: Mapping[str, str] = {
    "tp": "--tp", "gpu_memory_utilization": "--gpu-memory-utilization", "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
}


def plan_memory(
    arch: ModelArch,
    gpu: GPU,
    tp: int,
    gpu_memory_utilization: float = 0.9,
    max_num_batched_tokens: int = 8192,
    max_num_seqs: int = 1024,
    max_model_len: int | None = None,
    cudagraph_memory_profiling: bool = False,
    knobs: Mapping[str, str] = SCENARIO_KNOBS,
) -> MemoryPlan:
    """vLLM's KV pool of one engine of ``tp`` GPUs: the terms of ``determine_available_memory``, then whole blocks.

    ``arch.kv_cache_dtype`` sets the bytes per token (MLA latents replicated on every rank). Raises a
    one-line input error when nothing is left for KV, as vLLM refuses to start ("No available memory for
    the cache blocks"), naming the knobs to change as the caller's user writes them (``knobs``: the scenario's
    fields, or :data:`FLAG_KNOBS` for ``kvplan memory``).
    """
    if tp <= 0:
        raise input_error(knobs["tp"], "must be > 0")
    if not 0 < gpu_memory_utilization <= 1:
        raise input_error(knobs["gpu_memory_utilization"], "must be in (0, 1]")
    total = device_total_bytes(gpu)
    requested = total * gpu_memory_utilization
    weights = weights_bytes_per_gpu(arch, tp)
    act = activation_peak_bytes(arch, tp, max_num_batched_tokens, max_num_seqs)
    ntm = non_torch_bytes(tp)
    graphs = CUDAGRAPH_ESTIMATE_BYTES if cudagraph_memory_profiling else 0.0
    available = requested - weights - act - ntm - graphs
    per_token = kv_bytes_per_token_per_rank(arch, tp)
    block = arch.block_size_tokens
    blocks = int(available // (per_token * block)) if available > 0 else 0
    if weights >= requested:
        raise input_error(
            f"model {arch.name}",
            f"weights do not fit: {weights / GIB:.2f} GiB per GPU at TP{tp} against {requested / GIB:.2f} GiB requested "
            f"({total / GIB:.2f} GiB x {gpu_memory_utilization} on {gpu.name})",
            f"raise {knobs['tp']} or {knobs['gpu_memory_utilization']}",
        )
    if blocks <= 0:
        raise input_error(
            f"model {arch.name}",
            f"no memory left for the KV cache on {gpu.name} at TP{tp}: {requested / GIB:.2f} GiB requested, weights "
            f"{weights / GIB:.2f}, activation peak {act / GIB:.2f}, non-torch {ntm / GIB:.2f} GiB",
            f"raise {knobs['tp']} or {knobs['gpu_memory_utilization']}, or lower {knobs['max_num_seqs']} or "
            f"{knobs['max_num_batched_tokens']}",
        )
    mml = max_model_len or arch.max_model_len
    return MemoryPlan(
        total_bytes=total, gpu_memory_utilization=gpu_memory_utilization, requested_bytes=requested,
        weights_bytes=weights, activation_peak_bytes=act, non_torch_bytes=ntm, cudagraph_bytes=graphs,
        available_kv_bytes=available, kv_bytes_per_token=per_token, block_size_tokens=block,
        num_gpu_blocks=blocks, kv_cache_tokens=blocks * block, max_model_len=mml,
        max_concurrency=blocks / -(-mml // block),
    )


#: vLLM --kv-cache-dtype values (``CacheDType`` in vllm/config/cache.py; ``bf16`` is kvplan's short name) ->
#: kvplan's KV element layouts (``auto`` keeps the model preset's; fp8_e5m2 is one byte per element as e4m3).
KV_CACHE_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp8": "fp8", "fp8_e4m3": "fp8", "fp8_e5m2": "fp8",
                   "fp8_ds_mla": "fp8_ds_mla"}


def kv_capacity_tokens(arch: ModelArch, tp: int, gpu: GPU, **settings: Any) -> int:
    """Tokens of KV one instance (``tp`` GPUs) holds: vLLM's ``num_gpu_blocks x block_size``.

    The one accounting is :func:`plan_memory` (total memory x gpu_memory_utilization - weights - activation
    peak - non-torch - CUDA graphs, whole blocks); ``settings`` are its keyword arguments. Every rank holds its
    slice of every token, so the per-GPU token count is the instance's.
    """
    return plan_memory(arch, gpu, tp, **settings).kv_cache_tokens


def with_kv_cache_dtype(arch: ModelArch, kv_cache_dtype: str) -> ModelArch:
    """``arch`` with vLLM's ``--kv-cache-dtype`` applied (``auto``: unchanged; one-line error for a bad value)."""
    if kv_cache_dtype == "auto":
        return arch
    layout = KV_CACHE_DTYPES.get(kv_cache_dtype)
    if layout is None:
        raise input_error("kv_cache_dtype", f"unknown KV cache dtype '{kv_cache_dtype}'",
                          f"use auto or one of {', '.join(KV_CACHE_DTYPES)}")
    if layout == "fp8_ds_mla" and arch.attention != "mla":
        raise input_error("kv_cache_dtype", "fp8_ds_mla is only for MLA models", "use fp8 or auto")
    return arch.model_copy(update={"kv_cache_dtype": layout})


def serve_defaults(gpu: GPU) -> tuple[int, int]:
    """``vllm serve``'s default (max_num_batched_tokens, max_num_seqs) on ``gpu``.

    vllm/engine/arg_utils.py ``EngineArgs.get_batch_defaults`` (OPENAI_API_SERVER): 8192 and 1024 on GPUs of at
    least 70 GiB that are not A100 (PR #17885), else 2048 and 256.
    """
    if device_total_bytes(gpu) >= 70 * GIB and "a100" not in gpu.name.lower():
        return 8192, 1024
    return 2048, 256



def startup_free_memory_ok(plan: MemoryPlan) -> bool:
    """Whether vLLM's start-up check passes: free memory (total - :data:`CUDA_CONTEXT_BYTES`) >= total x
    gpu_memory_utilization (``Worker.init_device`` in vllm/v1/worker/gpu_worker.py)."""
    return plan.total_bytes - CUDA_CONTEXT_BYTES >= plan.requested_bytes
