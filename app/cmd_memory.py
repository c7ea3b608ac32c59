"""``kvplan memory``: vLLM's KV-cache memory accounting for one engine, printed as vLLM's start-up log prints it.

The numbers are :func:`kvplan.models.memory.plan_memory`'s, the function every simulation sizes its KV pools with.
"""

from __future__ import annotations

import json
from typing import Any

import typer

MEMORY_HELP = """Print vLLM's KV-cache memory accounting of one engine of --model on --tp GPUs of --hardware (an
instance preset) or --gpu (a GPU preset): total device memory x --gpu-memory-utilization - weights per rank -
the profiled activation peak (a dummy forward of --max-num-batched-tokens tokens and a sampler run over
--max-num-seqs requests) - non-torch memory [- CUDA graph memory with --cudagraph-memory-profiling], then
whole KV blocks, as vLLM V1's Worker.determine_available_memory and get_num_blocks do. Prints the lines of
vLLM's start-up log (Model loading took, Available KV cache memory, GPU KV cache size, Maximum concurrency at
--max-model-len); --json prints weights_gib, available_kv_gib, kv_cache_tokens, max_concurrency and the terms.
--max-num-batched-tokens and --max-num-seqs default to vllm serve's defaults for the GPU."""


def _terms(plan: Any) -> dict[str, Any]:
    gib = 1024**3
    return {
        "weights_gib": round(plan.weights_bytes / gib, 4),
        "available_kv_gib": round(plan.available_kv_bytes / gib, 4),
        "kv_cache_tokens": plan.kv_cache_tokens,
        "max_concurrency": round(plan.max_concurrency, 4),
        "total_gib": round(plan.total_bytes / gib, 4),
        "requested_gib": round(plan.requested_bytes / gib, 4),
        "activation_peak_gib": round(plan.activation_peak_bytes / gib, 4),
        "non_torch_gib": round(plan.non_torch_bytes / gib, 4),
        "cudagraph_gib": round(plan.cudagraph_bytes / gib, 4),
        "num_gpu_blocks": plan.num_gpu_blocks,
        "block_size_tokens": plan.block_size_tokens,
        "kv_bytes_per_token_per_rank": plan.kv_bytes_per_token,
        "max_model_len": plan.max_model_len,
    }


def _check_vllm_limits(arch: Any, tokens: int, seqs: int, max_model_len: int | None) -> None:
    """Refuse what vLLM refuses before it profiles memory (one-line errors naming the flag).

    ``max_num_batched_tokens < max_num_seqs``: ``SchedulerConfig`` (vllm/config/scheduler.py) raises "must be
    greater than or equal to max_num_seqs"; a ``max_model_len`` above the model's derived limit
    (max_position_embeddings): ``ModelConfig`` (vllm/config/model.py ``_get_and_verify_max_len``) raises
    "User-specified max_model_len ... is greater than the derived max_model_len" (as ``deployment.max_model_len``
    is refused in sim/engine.py).
    """
    from kvplan.errors import input_error

    if tokens < seqs:
        raise input_error("--max-num-batched-tokens", f"{tokens} is below max_num_seqs {seqs} (vLLM refuses to start: "
                          "max_num_batched_tokens must be >= max_num_seqs)",
                          "raise --max-num-batched-tokens or lower --max-num-seqs")
    if max_model_len is not None and max_model_len > arch.max_model_len:
        raise input_error("--max-model-len", f"{max_model_len} exceeds {arch.name}'s limit of {arch.max_model_len} "
                          "(vLLM refuses it without RoPE scaling)", f"use --max-model-len <= {arch.max_model_len}")


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""

    @app.command("memory", help=MEMORY_HELP, short_help="vLLM's KV-cache memory accounting of one engine.")
    def memory_cmd(
        model: str = typer.Option(..., "--model", help="Model preset (e.g. qwen3-32b)."),
        hardware: str | None = typer.Option(None, "--hardware", help="Instance preset (e.g. p5, h800); or --gpu."),
        gpu: str | None = typer.Option(None, "--gpu", help="GPU preset (e.g. h100-sxm, h200); or --hardware."),
        tp: int = typer.Option(..., "--tp", min=1, max=64, help="Tensor-parallel size."),
        gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization", help="vLLM's, in (0, 1]."),
        max_num_batched_tokens: int | None = typer.Option(None, "--max-num-batched-tokens", min=1, max=10_000_000,
                                                          help="Tokens of the profiling forward (default: vllm serve's)."),
        max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", min=1, max=65_536,
                                                help="Requests of the profiling sampler run (default: vllm serve's)."),
        max_model_len: int | None = typer.Option(None, "--max-model-len", min=1, max=10_000_000,
                                                 help="Context limit for the concurrency line (default: the model's)."),
        kv_cache_dtype: str = typer.Option(
            "auto", "--kv-cache-dtype", help="auto, bf16 (bfloat16), fp8 (fp8_e4m3, fp8_e5m2), fp8_ds_mla."),
        cudagraph_memory_profiling: bool = typer.Option(
            False, "--cudagraph-memory-profiling", help="Subtract the CUDA graph estimate (vLLM >= 0.19 default)."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        from kvplan.calibration.derive import check_tp
        from kvplan.errors import input_error
        from kvplan.models.arch import get_model
        from kvplan.models.hardware import HARDWARE_PRESETS, get_gpu, get_hardware, gpu_named, unknown_hardware_error
        from kvplan.models.memory import (
            FLAG_KNOBS,
            plan_memory,
            serve_defaults,
            startup_free_memory_ok,
            with_kv_cache_dtype,
        )

        if (hardware is None) == (gpu is None):
            raise input_error("--hardware/--gpu", "give exactly one of --hardware (instance) or --gpu (GPU preset)")
        if not 0 < gpu_memory_utilization <= 1:
            raise input_error("--gpu-memory-utilization", f"{gpu_memory_utilization} is outside (0, 1]")
        arch = with_kv_cache_dtype(get_model(model), kv_cache_dtype.lower())
        if hardware is not None:
            if hardware not in HARDWARE_PRESETS and gpu_named(hardware) is not None:  # 'h100': memory takes a GPU too
                raise input_error("--hardware", f"'{hardware}' is a GPU, and --hardware names an instance",
                                  f"use --gpu {hardware}, or --hardware "
                                  + str(unknown_hardware_error(hardware)).split("; use ")[-1].removesuffix(
                                      ", or an inline spec"))
            node = get_hardware(hardware)
            check_tp(arch, tp, node.gpus_per_node)
            device = node.gpu
        else:
            check_tp(arch, tp)
            device = get_gpu(gpu or "")
        d_tokens, d_seqs = serve_defaults(device)
        tokens = max_num_batched_tokens or d_tokens
        seqs = max_num_seqs or d_seqs
        _check_vllm_limits(arch, tokens, seqs, max_model_len)
        plan = plan_memory(arch, device, tp, gpu_memory_utilization, tokens, seqs, max_model_len,
                           cudagraph_memory_profiling, knobs=FLAG_KNOBS)
        out = {**_terms(plan), "model": arch.name, "gpu": device.name, "tensor_parallel_size": tp,
               "gpu_memory_utilization": gpu_memory_utilization, "max_num_batched_tokens": tokens,
               "max_num_seqs": seqs, "kv_cache_dtype": arch.kv_cache_dtype,
               "fits_max_model_len": plan.max_concurrency >= 1, "startup_free_memory_ok": startup_free_memory_ok(plan)}
        if json_out:
            typer.echo(json.dumps(out, indent=2))
            return
        gib = 1024**3
        typer.echo(f"{arch.name} on {device.name}, TP{tp}: gpu_memory_utilization {gpu_memory_utilization}, "
                   f"max_num_batched_tokens {tokens}, max_num_seqs {seqs}, KV cache {arch.kv_cache_dtype}")
        typer.echo(f"Model loading took {plan.weights_bytes / gib:.2f} GiB (weights per rank)")
        typer.echo(f"Memory profiling: total {plan.total_bytes / gib:.2f} GiB x {gpu_memory_utilization} = "
                   f"{plan.requested_bytes / gib:.2f} GiB; weights {plan.weights_bytes / gib:.2f} GiB; activation peak "
                   f"{plan.activation_peak_bytes / gib:.2f} GiB; non-torch {plan.non_torch_bytes / gib:.2f} GiB; "
                   f"CUDA graphs {plan.cudagraph_bytes / gib:.2f} GiB")
        typer.echo(f"Available KV cache memory: {plan.available_kv_bytes / gib:.2f} GiB")
        typer.echo(f"GPU KV cache size: {plan.kv_cache_tokens:,} tokens ({plan.num_gpu_blocks:,} blocks of "
                   f"{plan.block_size_tokens})")
        typer.echo(f"Maximum concurrency for {plan.max_model_len:,} tokens per request: {plan.max_concurrency:.2f}x")
        # vLLM logs memory per rank and tokens per engine; kvplan simulate prints the pool in GiB over all D GPUs
        # (a newcomer read 49 GiB here against 392 GiB there as two different pools)
        typer.echo(f"(memory figures are per GPU, as vLLM logs them; tokens per engine: its {tp} GPU(s) hold "
                   f"{plan.available_kv_bytes * tp / gib:.2f} GiB of KV cache, the pool of one P or D instance in "
                   "kvplan simulate, whose 'decode KV capacity' sums the D instances)")
        if not out["startup_free_memory_ok"]:
            typer.echo(f"warning: vLLM refuses to start: free memory at start-up (total less the ~0.5 GiB CUDA context, "
                       f"assumed) is below {plan.requested_bytes / gib:.2f} GiB requested (\"Free memory on device ... is "
                       "less than desired GPU memory utilization\"); lower --gpu-memory-utilization")
        if plan.max_concurrency < 1:
            typer.echo(f"warning: vLLM refuses to start: one {plan.max_model_len:,}-token request needs more KV than the "
                       f"{plan.kv_cache_tokens:,} tokens available; lower --max-model-len to <= {plan.kv_cache_tokens:,}")
