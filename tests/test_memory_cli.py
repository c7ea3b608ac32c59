"""``kvplan memory`` as a demanding and a hostile user runs it: every preset x TP answers or refuses in one line
(exit 2), bad flags are one-line errors naming the flag, the JSON keys are the issue's, and one engine is checked
by hand against vLLM's ``determine_available_memory`` / ``get_num_blocks`` arithmetic."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from kvplan.app.cli import main
from kvplan.models.arch import MODEL_PRESETS
from kvplan.models.hardware import GIB, GPU_PRESETS, get_gpu


def _run(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(args)
    return rc, out.getvalue(), err.getvalue()


BASE = ["memory", "--model", "qwen3-32b", "--gpu", "h100-sxm", "--tp", "2"]


@pytest.mark.parametrize(("extra", "needle"), [
    (["--gpu-memory-utilization", "0"], "--gpu-memory-utilization"),
    (["--gpu-memory-utilization", "1.5"], "--gpu-memory-utilization"),
    (["--gpu-memory-utilization", "-1"], "--gpu-memory-utilization"),
    (["--gpu-memory-utilization", "nan"], "--gpu-memory-utilization"),
    (["--gpu-memory-utilization", "inf"], "--gpu-memory-utilization"),
    (["--gpu-memory-utilization", "abc"], "--gpu-memory-utilization"),
    (["--gpu-memory-utilization", "1e-9"], "weights do not fit"),
    (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens"),
    (["--max-num-batched-tokens", "99999999999"], "--max-num-batched-tokens"),
    (["--max-num-batched-tokens", "10000000"], "no memory left for the KV cache"),
    # vLLM SchedulerConfig: max_num_batched_tokens must be >= max_num_seqs (1024 by default on an H100)
    (["--max-num-batched-tokens", "512"], "--max-num-batched-tokens"),
    (["--max-num-seqs", "0"], "--max-num-seqs"),
    (["--max-num-seqs", "65536"], "--max-num-batched-tokens"),
    # above qwen3-32b's max_position_embeddings (40,960): vLLM refuses it
    (["--max-model-len", "40961"], "--max-model-len"),
    (["--max-model-len", "10000000"], "--max-model-len"),
    (["--max-model-len", "0"], "--max-model-len"),
    (["--kv-cache-dtype", "bogus"], "kv_cache_dtype"),
    (["--kv-cache-dtype", ""], "kv_cache_dtype"),
    (["--kv-cache-dtype", "fp8_ds_mla"], "only for MLA"),
    (["--tp", "3"], "--tp"),
    (["--tp", "0"], "--tp"),
    (["--hardware", "p5"], "--hardware/--gpu"),
])
def test_bad_flags_one_line_exit_2(extra: list[str], needle: str) -> None:
    rc, out, err = _run(BASE + extra)
    assert rc == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("error: ") and needle in err, err


@pytest.mark.parametrize("args", [
    ["memory", "--model", "nope", "--gpu", "h100-sxm", "--tp", "1"],
    ["memory", "--model", "qwen3-32b", "--gpu", "nope", "--tp", "1"],
    ["memory", "--model", "qwen3-32b", "--hardware", "nope", "--tp", "1"],
    ["memory", "--model", "qwen3-32b", "--tp", "1"],
    ["memory", "--model", "qwen3-32b", "--hardware", "p5", "--tp", "16"],
    ["memory", "--model", "llama-3.3-70b", "--gpu", "h100-sxm", "--tp", "1"],  # weights > memory
    ["memory", "--model", "glm-5-fp8", "--gpu", "h200", "--tp", "4"],
])
def test_unknown_or_impossible_one_line(args: list[str]) -> None:
    rc, out, err = _run(args)
    assert rc == 2 and out == "" and err.count("\n") == 1 and err.startswith("error: ")


def test_every_model_gpu_and_tp_answers_or_refuses_in_one_line() -> None:
    for model in MODEL_PRESETS:
        for gpu in GPU_PRESETS:
            for tp in (1, 2, 4, 8):
                rc, out, err = _run(["memory", "--model", model, "--gpu", gpu, "--tp", str(tp), "--json"])
                if rc == 2:
                    assert out == "" and err.count("\n") == 1, (model, gpu, tp, err)
                    continue
                assert rc == 0, (model, gpu, tp, err)
                d = json.loads(out)
                assert 0 < d["weights_gib"] and 0 < d["available_kv_gib"] and d["kv_cache_tokens"] > 0
                assert d["weights_gib"] + d["available_kv_gib"] <= d["requested_gib"] <= d["total_gib"]
                assert d["kv_cache_tokens"] == d["num_gpu_blocks"] * d["block_size_tokens"]


def test_json_keys_and_log_wording() -> None:
    rc, out, _ = _run(["memory", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1", "--json"])
    d = json.loads(out)
    assert rc == 0 and {"weights_gib", "available_kv_gib", "kv_cache_tokens", "max_concurrency"} <= set(d)
    rc, out, _ = _run(["memory", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1"])
    lines = out.splitlines()
    # vLLM's start-up log lines (gpu_worker.py / kv_cache_utils.py wording)
    assert any(ln.startswith("Model loading took ") for ln in lines)
    assert "Available KV cache memory: 51.41 GiB" in lines
    assert "GPU KV cache size: 421,184 tokens (26,324 blocks of 16)" in lines
    assert "Maximum concurrency for 131,072 tokens per request: 3.21x" in lines


def test_hand_check_against_vllm_arithmetic() -> None:
    """Llama-3.1-8B, H100, TP1, serve defaults: requested = total x 0.9; available = requested - weights - peak -
    non-torch; num_blocks = available // page_size // num_layers (page = 16 tokens x 2 x 8 heads x 128 x 2 B)."""
    rc, out, _ = _run(["memory", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1", "--json"])
    d = json.loads(out)
    total = get_gpu("h100-sxm").torch_total_memory_bytes
    assert total is not None
    available = total * 0.9 - d["weights_gib"] * GIB - d["activation_peak_gib"] * GIB - d["non_torch_gib"] * GIB
    page = 16 * 2 * 8 * 128 * 2
    assert abs(d["available_kv_gib"] * GIB - available) < 1e-3 * GIB
    assert abs(d["num_gpu_blocks"] - available // page // 32) <= 1
    assert d["max_concurrency"] == pytest.approx(d["num_gpu_blocks"] / (131072 // 16), abs=1e-4)


def test_mla_latent_replicated_on_every_rank() -> None:
    per_rank = set()
    for tp in (8,):
        for gpu in ("h200", "b200"):
            rc, out, _ = _run(["memory", "--model", "glm-5-fp8", "--gpu", gpu, "--tp", str(tp), "--json"])
            assert rc == 0
            per_rank.add(json.loads(out)["kv_bytes_per_token_per_rank"])
    assert per_rank == {78 * ((512 + 64) * 2 + 132)}  # latent + rope in bf16 plus the indexer key, per layer
    rc, out, _ = _run(["memory", "--model", "glm-5-fp8", "--gpu", "h200", "--tp", "8", "--json",
                       "--kv-cache-dtype", "fp8_ds_mla"])
    assert json.loads(out)["kv_bytes_per_token_per_rank"] == 78 * (656 + 132)  # FlashMLA-sparse 656 B


@pytest.mark.parametrize(("dtype", "per_rank"), [("auto", 131072), ("bf16", 131072), ("bfloat16", 131072),
                                                ("fp8", 65536), ("fp8_e4m3", 65536), ("fp8_e5m2", 65536)])
def test_vllm_kv_cache_dtype_names(dtype: str, per_rank: int) -> None:
    rc, out, _ = _run(["memory", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--tp", "1", "--json",
                       "--kv-cache-dtype", dtype])
    assert rc == 0 and json.loads(out)["kv_bytes_per_token_per_rank"] == per_rank


def test_utilization_one_warns_of_the_startup_free_memory_check() -> None:
    rc, out, _ = _run(BASE + ["--gpu-memory-utilization", "1"])
    assert rc == 0 and "less than desired GPU memory utilization" in out
    rc, out, _ = _run(BASE + ["--gpu-memory-utilization", "1", "--json"])
    assert json.loads(out)["startup_free_memory_ok"] is False
    rc, out, _ = _run(BASE + ["--json"])
    assert json.loads(out)["startup_free_memory_ok"] is True


def test_max_model_len_beyond_the_pool_warns() -> None:
    rc, out, _ = _run(["memory", "--model", "qwen3-32b", "--gpu", "h100-sxm", "--tp", "1"])
    assert rc == 0 and "warning: vLLM refuses to start" in out


@pytest.mark.parametrize(("extra", "fix"), [
    (["--gpu-memory-utilization", "1e-9"], "; raise --tp or --gpu-memory-utilization\n"),
    (["--max-num-batched-tokens", "10000000"],
     "; raise --tp or --gpu-memory-utilization, or lower --max-num-seqs or --max-num-batched-tokens\n"),
])
def test_a_pool_that_does_not_fit_names_the_flags_to_change(extra: list[str], fix: str) -> None:
    """The memory accounting's refusal named the scenario's fields ("raise deployment.tensor_parallel_size or
    gpu_memory_utilization"), which `kvplan memory` does not take: its fix names the command's own flags."""
    rc, _out, err = _run(BASE + extra)
    assert rc == 2 and err.endswith(fix), err
