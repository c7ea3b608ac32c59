"""vLLM's own start-up validity rules, checked before a run (vLLM refuses to start a server that breaks them).

* Tensor parallelism must split the attention heads evenly: ``num_attention_heads % tp == 0``
  (``ModelConfig.verify_with_parallel_config``, vllm/config/model.py), and the KV heads must either split
  evenly (``kv_heads % tp == 0``) or be replicated evenly (``tp % kv_heads == 0``; vLLM's
  ``QKVParallelLinear``, vllm/model_executor/layers/linear.py). MLA models replicate their latent, so only
  the query heads count.
* The KV pool must hold the largest request it will serve (``check_enough_kv_cache_memory``,
  vllm/v1/core/kv_cache_utils.py, checks one ``max_model_len`` request at start-up). The scenario sets
  the pool, not ``max_model_len``, so the check here is against the largest prompt + output the drawn
  workload sends (a request that can never be admitted would otherwise wait forever).
* ``max_num_batched_tokens >= max_num_seqs`` is a field rule of :class:`~kvplan.sim.scenario.Deployment`
  (``SchedulerConfig._verify_args``, vllm/config/scheduler.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvplan.errors import input_error
from kvplan.models.arch import ModelArch

#: Largest TP size a refusal lists (a scenario's bound, ``Deployment.tensor_parallel_size`` <= 64).
MAX_LISTED_TP = 64


def _tp_ok(arch: ModelArch, tp: int) -> bool:
    return arch.num_q_heads % tp == 0 and not (
        arch.attention == "gqa" and arch.num_kv_heads % tp and tp % arch.num_kv_heads)


def valid_tensor_parallel_sizes(arch: ModelArch, up_to: int = 64) -> list[int]:
    """The TP sizes up to ``up_to`` vLLM accepts for ``arch`` (:func:`check_tensor_parallel`'s rules)."""
    return [tp for tp in range(1, up_to + 1) if _tp_ok(arch, tp)]


def check_tensor_parallel(arch: ModelArch, tp: int, where: str = "deployment.tensor_parallel_size") -> None:
    """Refuse a TP size vLLM would refuse for this architecture (the fix names the sizes it accepts)."""
    if _tp_ok(arch, tp):
        return
    sizes = valid_tensor_parallel_sizes(arch, min(max(16, tp), MAX_LISTED_TP))  # bounded: --tp may be any integer
    fix = f"use one of {', '.join(map(str, sizes))}"
    if arch.num_q_heads % tp:
        raise input_error(
            where, f"{tp} does not divide {arch.name}'s {arch.num_q_heads} attention heads (vLLM refuses to start)", fix)
    raise input_error(
        where, f"{tp} neither divides nor is a multiple of {arch.name}'s {arch.num_kv_heads} KV heads "
        "(vLLM cannot shard or replicate them)", fix)


#: What sizes a KV pool when the scenario does not set it (vLLM's memory accounting, models/memory.py).
_POOL_FIX = ("raise deployment.gpu_memory_utilization or the tensor-parallel size (the pool is what vLLM's memory "
             "accounting leaves after the weights), or shorten the workload")


#: Most output tokens a run in ``simulation.decode_mode: exact`` may plan: exact steps every decode token as an
#: event (about 4 us each in pure Python, one per token at batch 1), so this keeps its worst case near the fast
#: mode's at its own bound of 10,000,000 turns (~0.5 h of CPU); fast mode gives the same per-turn results.
MAX_EXACT_DECODE_TOKENS = 500_000_000


def check_exact_decode_cost(plan: Any, decode_mode: str) -> None:
    """Refuse, before the run, an exact-mode run whose plan holds more than :data:`MAX_EXACT_DECODE_TOKENS` output
    tokens (the turn bound alone lets it cost days: 10,000,000 turns of 40,000-token outputs)."""
    if decode_mode != "exact" or not len(plan.output_tokens):
        return
    total = int(np.sum(plan.output_tokens, dtype=np.int64))
    if total > MAX_EXACT_DECODE_TOKENS:
        raise input_error("simulation.decode_mode", f"exact steps every decode token, and this run plans {total:,} output "
                          f"tokens (more than {MAX_EXACT_DECODE_TOKENS:,}: hours to days of CPU)",
                          "use decode_mode: fast (the same per-turn times, one event per batch change), or fewer "
                          "conversations or output tokens")


#: Most prefill chunks a run may plan (every prompt split into ``max_num_batched_tokens``-token steps, before prefix
#: hits: an upper bound): each chunk is an engine step (~2 us in pure Python), so this keeps the worst case near half an
#: hour; only a step budget far below vLLM's (8192, or 2048 on small GPUs) reaches it.
MAX_PREFILL_CHUNKS = 1_000_000_000


def check_prefill_chunk_cost(plan: Any, max_num_batched_tokens: int) -> None:
    """Refuse, before the run, a plan whose prompts split into more than :data:`MAX_PREFILL_CHUNKS` prefill steps at
    ``max_num_batched_tokens`` (``max_num_batched_tokens: 1`` made a 30,000-token prompt 30,000 engine steps)."""
    if not len(plan.prompt_tokens):
        return
    budget = max(int(max_num_batched_tokens), 1)
    chunks = int(np.sum(-(-np.asarray(plan.prompt_tokens, dtype=np.int64) // budget), dtype=np.int64))
    if chunks > MAX_PREFILL_CHUNKS:
        raise input_error("deployment.max_num_batched_tokens", f"{budget:,} tokens per step split this run's prompts "
                          f"into up to {chunks:,} prefill steps (more than {MAX_PREFILL_CHUNKS:,}: hours to days of CPU)",
                          "raise it (vLLM's default is 8192) or plan fewer or shorter prompts")


def check_pools_hold_largest_request(
    plan: Any, decode_capacity_tokens: int, prefill_capacity_tokens: int, block_size: int,
    decode_set: bool = True, prefill_set: bool = True,
) -> None:
    """Refuse a run whose largest request cannot fit D's KV pool (prompt + output) or P's (prompt). ``*_set``: the
    scenario gives that pool's size (the error names the field), else vLLM's memory accounting sized it (the error
    says what moves it)."""
    if not len(plan.prompt_tokens):
        return
    need_d = int(np.max(plan.prompt_tokens + plan.output_tokens))
    need_p = int(np.max(plan.prompt_tokens))
    # whole blocks: a partly used block is held whole
    if -(-need_d // block_size) * block_size > decode_capacity_tokens:
        raise input_error(
            "deployment.decode_kv_capacity_tokens" if decode_set else "D's KV pool",
            f"D's KV pool of {decode_capacity_tokens:,} tokens cannot hold the largest request ({need_d:,} tokens);"
            " vLLM refuses to start when the pool cannot hold one request",
            "raise it or shorten the workload" if decode_set else _POOL_FIX,
        )
    if -(-need_p // block_size) * block_size > prefill_capacity_tokens:
        raise input_error(
            "deployment.prefill_kv_capacity_tokens" if prefill_set else "P's KV pool",
            f"P's KV pool of {prefill_capacity_tokens:,} tokens cannot hold the largest prompt ({need_p:,} tokens)",
            "raise it or shorten the workload" if prefill_set else _POOL_FIX,
        )


MAX_COST_TOKENS = 10_000_000
MAX_COST_CHUNKS = 100_000


#: Largest decode batch ``kvplan cost --batch`` takes: vLLM's ``--max-num-seqs`` bound in a scenario.
MAX_COST_BATCH = 65_536


def check_cost_request(tokens: int, cached_tokens: int, chunk_tokens: int, batch: int = 1,
                       context: int | None = None) -> None:
    """Bounds of ``kvplan cost`` (the prefill model walks the chunks one by one; a decode batch is at most
    ``max_num_seqs``' bound and a context at most the token bound)."""
    if batch > MAX_COST_BATCH:
        raise input_error("--batch", f"{batch:,} is more than {MAX_COST_BATCH:,} sequences",
                          "give a decode batch vLLM can run (--max-num-seqs)")
    if context is not None and context > MAX_COST_TOKENS:
        raise input_error("--context", f"{context:,} is more than {MAX_COST_TOKENS:,}", "no context is that long")
    if tokens > MAX_COST_TOKENS:
        raise input_error("--tokens", f"{tokens:,} is more than {MAX_COST_TOKENS:,}", "no context is that long")
    if cached_tokens > MAX_COST_TOKENS:
        raise input_error("--cached-tokens", f"{cached_tokens:,} is more than {MAX_COST_TOKENS:,}")
    if chunk_tokens > MAX_COST_TOKENS:  # deployment.max_num_batched_tokens' bound (it sizes the activation peak)
        raise input_error("--chunk-tokens", f"{chunk_tokens:,} is more than {MAX_COST_TOKENS:,}",
                          "use vLLM's max_num_batched_tokens (e.g. 8192)")
    if -(-tokens // chunk_tokens) > MAX_COST_CHUNKS:
        raise input_error("--chunk-tokens", f"{chunk_tokens} splits {tokens:,} tokens into more than "
                          f"{MAX_COST_CHUNKS:,} chunks", "use vLLM's max_num_batched_tokens (e.g. 8192)")


def check_cost_fits(arch: ModelArch, tokens: int, cached: int, batch: int, ctx: int, ctx_given: bool,
                    pool: int | None) -> None:
    """Refuse what no vLLM server of this model serves: a context beyond ``max_model_len`` (vLLM rejects the request,
    as simulate does) and a decode batch whose KV is larger than one instance's pool (it could never be resident)."""
    limit = arch.max_model_len
    if cached + tokens > limit:
        what = "--tokens" if not cached else "--cached-tokens + --tokens"
        raise input_error(what, f"{cached + tokens:,} tokens exceed {arch.name}'s context of {limit:,} (vLLM rejects "
                          "the request)", f"stay within {limit:,} tokens")
    if ctx > limit:
        raise input_error("--context", f"{ctx:,} tokens exceed {arch.name}'s context of {limit:,}",
                          f"stay within {limit:,} tokens")
    if pool is not None and batch * ctx > pool:
        raise input_error("--batch" if ctx_given or batch > 1 else "--context",
                          f"{batch:,} sequences of {ctx:,} tokens hold {batch * ctx:,} tokens of KV, more than the "
                          f"{pool:,}-token KV pool of one instance (vLLM's memory accounting at the defaults)",
                          "give a batch that fits the pool (kvplan memory shows it)")
