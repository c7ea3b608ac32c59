"""Cost functions of prefill, KV transfer and decode (pure; parameters come from a profile).

Each function is the formula in its docstring and nothing else, so the calibration fits target them
directly and the simulator calls them per engine step.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class _Cost(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class PrefillCost(_Cost):
    """One prefill engine step: ``fixed_s + per_token_s x new tokens + attention_s x (new x context) pairs``.

    A step holds chunks of several requests (continuous batching, at most ``max_num_batched_tokens``
    new tokens, vLLM's chunked prefill). For a chunk of ``n`` new tokens after ``c`` tokens already in
    KV (cached, pulled or earlier chunks) the causal pairs are ``n x c + n (n + 1) / 2``.
    """

    fixed_s: float = Field(default=0.0, ge=0, description="Per engine step (scheduling, sampling, launch).")
    per_token_s: float = Field(default=0.0, ge=0, description="Per new token (linear layers).")
    attention_s: float = Field(default=0.0, ge=0, description="Per (new token, context token) pair.")


class TransferCost(_Cost):
    """NIXL READ of KV for one request, per TP rank (ranks run in parallel, the slowest decides).

    Visible time = ``post_fixed_s + post_per_descriptor_s x d`` (posting, NIXL postDuration) +
    ``fixed_s + per_descriptor_s x d + per_byte_s x bytes`` (NIXL xferDuration) + ``poll_s``
    (step-boundary polling and rescheduling in vLLM's connector). ``d`` = regions x blocks.
    ``per_byte_s`` is the inverse line rate; concurrent transfers on one link share it.
    ``handshake_s`` is paid once per (reader, remote engine) pair, on first contact.
    """

    fixed_s: float = Field(default=0.0, ge=0, description="Per transfer, in xferDuration.")
    per_descriptor_s: float = Field(default=0.0, ge=0, description="Per descriptor, in xferDuration.")
    per_byte_s: float = Field(default=0.0, ge=0, description="Inverse bandwidth per rank (s/B).")
    post_fixed_s: float = Field(default=0.0, ge=0, description="Per transfer, in postDuration.")
    post_per_descriptor_s: float = Field(default=0.0, ge=0, description="Per descriptor, in postDuration.")
    poll_s: float = Field(default=0.0, ge=0, description="Completion seen at the next engine step.")
    handshake_s: float = Field(default=0.0, ge=0, description="One-off side-channel handshake per pair.")


class DecodeCost(_Cost):
    """One decode step of a batch: ``fixed_s + per_seq_s x batch + per_context_token_s x sum of contexts``."""

    fixed_s: float = Field(default=0.0, ge=0, description="Per decode step.")
    per_seq_s: float = Field(default=0.0, ge=0, description="Per running sequence.")
    per_context_token_s: float = Field(default=0.0, ge=0, description="Per KV token read (attention).")


class OverheadCost(_Cost):
    """Latency outside the engines: proxy, HTTP, tokenisation and chat template for each leg."""

    p_leg_s: float = Field(default=0.0, ge=0, description="Proxy -> P engine (and back), not engine time.")
    d_leg_s: float = Field(default=0.0, ge=0, description="Proxy -> D engine and first SSE chunk back.")


class CostModel(_Cost):
    """All cost components of one (model, hardware, TP) deployment."""

    prefill: PrefillCost = Field(default_factory=PrefillCost, description="Prefill step cost.")
    transfer: TransferCost = Field(default_factory=TransferCost, description="KV transfer cost.")
    decode: DecodeCost = Field(default_factory=DecodeCost, description="Decode step cost.")
    overhead: OverheadCost = Field(default_factory=OverheadCost, description="Non-engine latency.")


def causal_pairs(new_tokens: float, context_tokens: float) -> float:
    """Attention (query, key) pairs of ``new_tokens`` computed after ``context_tokens``: n c + n (n + 1) / 2."""
    return new_tokens * context_tokens + new_tokens * (new_tokens + 1) / 2


def prefill_step_time_s(cost: PrefillCost, new_tokens: int, pairs: float) -> float:
    """Time of one prefill engine step with ``new_tokens`` in total and ``pairs`` attention pairs."""
    return cost.fixed_s + cost.per_token_s * new_tokens + cost.attention_s * pairs


def prefill_time_s(cost: PrefillCost, new_tokens: int, cached_tokens: int = 0, chunk_tokens: int = 8192) -> float:
    """Prefill of ``new_tokens`` on top of ``cached_tokens`` alone on an engine, chunked at ``chunk_tokens``.

    Sum over chunks of ``fixed_s + per_token_s x chunk + attention_s x causal_pairs(chunk, context)``.
    """
    if new_tokens <= 0:
        return 0.0
    total = 0.0
    done = 0
    while done < new_tokens:
        chunk = min(chunk_tokens, new_tokens - done)
        total += prefill_step_time_s(cost, chunk, causal_pairs(chunk, cached_tokens + done))
        done += chunk
    return total


def xfer_time_s(cost: TransferCost, nbytes_per_rank: float, descriptors: int) -> float:
    """NIXL xferDuration of one rank's READ: ``fixed_s + per_descriptor_s x d + per_byte_s x bytes``."""
    return cost.fixed_s + cost.per_descriptor_s * descriptors + cost.per_byte_s * nbytes_per_rank


def post_time_s(cost: TransferCost, descriptors: int) -> float:
    """NIXL postDuration: ``post_fixed_s + post_per_descriptor_s x d``."""
    return cost.post_fixed_s + cost.post_per_descriptor_s * descriptors


def transfer_time_s(cost: TransferCost, nbytes_per_rank: float, descriptors: int) -> float:
    """Request-visible pull latency on an idle link: post + xfer + poll (no handshake)."""
    return post_time_s(cost, descriptors) + xfer_time_s(cost, nbytes_per_rank, descriptors) + cost.poll_s


def decode_step_time_s(cost: DecodeCost, batch: int, context_tokens: float) -> float:
    """One decode step with ``batch`` sequences holding ``context_tokens`` KV tokens in total."""
    return cost.fixed_s + cost.per_seq_s * batch + cost.per_context_token_s * context_tokens


def decode_steps_time_s(cost: DecodeCost, batch: int, context_tokens: float, steps: int) -> float:
    """Time of ``steps`` consecutive decode steps of an unchanged batch (closed form).

    Each step appends one token per sequence, so step ``i`` (0-based) sees ``context + batch x i``:
    ``k (fixed + per_seq b + per_ctx S) + per_ctx b k (k - 1) / 2``.
    """
    k = steps
    first = cost.fixed_s + cost.per_seq_s * batch + cost.per_context_token_s * context_tokens
    return k * first + cost.per_context_token_s * batch * k * (k - 1) / 2


def mixed_step_time_s(
    prefill: PrefillCost, decode: DecodeCost, prefill_tokens: int, pairs: float, decode_seqs: int,
    decode_context_tokens: float,
) -> float:
    """One step of an aggregated engine mixing prefill chunks and decode tokens (vLLM V1 chunked prefill).

    With prefill tokens in the step: ``prefill_step_time_s(prefill, prefill_tokens, pairs) + decode.per_seq_s x B +
    decode.per_context_token_s x S`` (``B`` decoding sequences holding ``S`` KV tokens): the prefill step's
    fixed cost (launch, sampling, weight reads) is paid once and each decode token adds its marginal decode
    cost. A step without prefill tokens is a decode step, ``decode_step_time_s(decode, B, S)``.
    Assumption (stated, not measured): the marginal cost of a decode token is the same in a mixed step as in
    a pure decode step; no calibration here covers mixed batches, so the error is unknown.
    """
    if prefill_tokens <= 0:
        return decode_step_time_s(decode, decode_seqs, decode_context_tokens)
    return (
        prefill_step_time_s(prefill, prefill_tokens, pairs)
        + decode.per_seq_s * decode_seqs
        + decode.per_context_token_s * decode_context_tokens
    )
