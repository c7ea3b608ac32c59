"""Cost functions of prefill, KV transfer and decode (pure; parameters come from a profile).

The one home of every cost formula (the per-step ones are written in :mod:`kvplan.models.formulas`, which
is compiled with the simulator's hot path, and re-exported here): the simulator (``sim/prefill.py``,
``sim/decode.py``), the analytic screen and break-even (``plan/screen.py``, ``plan/breakeven.py``), the
calibration fits and ``kvplan cost`` call these functions. Each function is the formula in its docstring and nothing else.

Structure (so that costs transfer across GPUs and TP sizes):

* **GPU compute** of an engine step: ``fixed_s``, ``per_token_s`` with its weight-read floor
  ``weight_read_s`` and ``attention_s`` (prefill), ``fixed_s``, ``per_seq_s``, ``per_context_token_s``
  (decode). Priors come from measured vLLM kernels (aiconfigurator-core, ``kvplan profile derive``), so TP
  scaling, all-reduce and GPU speed come from the kernel data, never from 8/N. :mod:`kvplan.models.bounds`
  rejects any value faster than the GPU's peak FLOP/s or HBM bandwidth.
* **Engine per-step CPU overhead** ``overhead_s`` (vLLM V1 scheduler, input preparation, sampling,
  detokenisation on the engine core; ``vllm/v1/engine/core.py`` step): its own term, not scaled by TP or GPU.
* **Proxy/HTTP overhead** outside the engines (:class:`OverheadCost`).
* **Transfer** (:class:`TransferCost`), bounded by the link's line rate.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

# the per-step formulas (compiled with the simulator's hot path, sim/native.py), re-exported from here
from kvplan.models.formulas import (
    batch_s,
    causal_pairs,
    ctx_attention_s,
    decode_step_increment_s,
    decode_step_time_s,
    decode_steps_time_s,
    linear_s,
    per_context_s,
    piecewise_linear,
    post_time_s,
    prefill_gpu_step_s,
    prefill_step_time_s,
    prefill_time_s,
    prep_time_s,
    pull_visible_time_s,
    read_thread_time_s,
    steps_within,
    transfer_time_s,
    xfer_time_s,
)

__all__ = [
    "CostModel", "DecodeCost", "OverheadCost", "PrefillCost", "TransferCost", "batch_s", "causal_pairs",
    "ctx_attention_s", "decode_step_coefficients", "decode_step_increment_s", "decode_step_time_s",
    "decode_steps_time_s", "linear_s", "mixed_step_time_s", "per_context_s", "piecewise_linear", "post_time_s",
    "prefill_gpu_step_s",
    "prefill_step_time_array", "prefill_step_time_s", "prefill_time_s", "prep_time_s", "pull_visible_time_s",
    "read_thread_time_s", "scale_prefill_gpu", "steps_within", "transfer_time_s", "xfer_time_s",
]


class _Cost(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_numbers(cls, data: Any) -> Any:
        """A cost parameter is a number, a knot list a list of numbers: pydantic's lax mode would read a JSON ``true``
        as 1.0 (a second per attention pair) and ``"0.01"`` as 0.01 in a hand-edited profile, silently. (A scenario's
        inline ``costs:`` are checked before they get here, with YAML's hints: sim/scenario.py.)"""
        if not isinstance(data, dict):
            return data
        for key, value in data.items():
            if key not in cls.model_fields or isinstance(value, dict | BaseModel):
                continue  # an unknown key is pydantic's error; a component of CostModel is checked by its class
            for item in value if isinstance(value, list | tuple) else (value,):
                if isinstance(item, bool | str):
                    # [[key]]: the loaders put the parameter into the field path (models/profile.py, sim/scenario.py)
                    raise ValueError(f"[[{key}]] is {item!r:.40}, not a number; write a plain number")
        return data


def _check_knots(knots: tuple[int, ...], values: tuple[float, ...], what: str) -> None:
    if len(knots) != len(values):
        raise ValueError(f"{what}: knots and values differ in length")
    if any(b <= a for a, b in zip(knots, knots[1:], strict=False)) or (knots and knots[0] <= 0):
        raise ValueError(f"{what}: knots must be positive and increasing")
    if any(v < 0 for v in values):
        raise ValueError(f"{what}: values must be >= 0")


class PrefillCost(_Cost):
    """One prefill engine step of ``n`` new tokens, ``pairs`` attention pairs (``ctx_pairs`` of them against KV
    already in the cache):

    ``overhead_s + fixed_s + linear(n) + attention_s x (pairs - ctx_pairs) + context_attention_s x ctx_pairs``.

    ``linear(n)`` is the linear layers (GEMMs and TP all-reduce): ``max(per_token_s x n, weight_read_s)``
    (per-token cost with the roofline's weight-read floor for short steps), or, when ``linear_knots_tokens``
    is given (kernel-derived priors), the measured time at those step sizes interpolated linearly (GEMM
    efficiency grows with the step's tokens), flat below the first knot and ``per_token_s`` per token past
    the last. A step holds chunks of several requests (continuous batching, at most
    ``max_num_batched_tokens`` new tokens, vLLM's chunked prefill). For a chunk of ``n`` new tokens after
    ``c`` tokens already in KV (cached, pulled or earlier chunks) the pairs are ``n c + n (n + 1) / 2``,
    ``n c`` of them against the cache (a dense rectangle: the attention kernel runs it at another
    efficiency than the causal triangle; ``context_attention_s`` ``None`` = the same as ``attention_s``).
    """

    fixed_s: float = Field(default=0.0, ge=0, description="GPU time per step independent of tokens (launch, LM head).")
    per_token_s: float = Field(default=0.0, ge=0, description="Per new token (linear layers + TP all-reduce).")
    weight_read_s: float = Field(default=0.0, ge=0, description="Floor of the linear layers: one read of the weights.")
    attention_s: float = Field(default=0.0, ge=0, description="Per causal (new token, new token) pair.")
    context_attention_s: float | None = Field(
        default=None, ge=0, description="Per (new token, cached token) pair (None: attention_s)."
    )
    overhead_s: float = Field(default=0.0, ge=0, description="Engine CPU overhead per step (not scaled by TP or GPU).")
    linear_knots_tokens: tuple[int, ...] = Field(default=(), description="Step sizes of the measured linear-layer time.")
    linear_knots_s: tuple[float, ...] = Field(default=(), description="Linear-layer time at each knot, s.")

    @model_validator(mode="after")
    def _knots(self) -> PrefillCost:
        _check_knots(self.linear_knots_tokens, self.linear_knots_s, "prefill linear knots")
        return self

    def linear_s(self, new_tokens: float) -> float:
        """Time of the linear layers for a step of ``new_tokens`` tokens (:func:`formulas.linear_s`)."""
        return linear_s(self, new_tokens)

    @property
    def ctx_attention_s(self) -> float:
        """The per-pair cost against cached KV in use."""
        return ctx_attention_s(self)


class TransferCost(_Cost):
    """NIXL READ of KV for one request, per TP rank (ranks run in parallel, the slowest decides).

    NIXL's ``xferDuration`` = ``fixed_s + per_descriptor_s x d + per_byte_s x bytes`` (``d`` = regions x
    blocks) and it *contains* the post: ``nixlAgent::postXferReq`` starts the request's telemetry timer
    before posting, and ``nixlXferReqH::updateRequestStats`` stamps ``postDuration`` when the post returns
    and ``xferDuration`` when ``getXferStatus`` sees completion, both from that one start
    (ai-dynamo/nixl ``src/core/nixl_agent.cpp``). ``post_fixed_s + post_per_descriptor_s x d`` is therefore
    the post part of ``xferDuration`` (reported, never added).

    Request creation comes before that timer: vLLM's ``_read_blocks``
    (``vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py``) builds the descriptor ids and calls
    ``make_prepped_xfer`` (``nixlAgent::makeXferReq``: a loop over the descriptors and the backend's
    ``prepXfer``) and only then ``transfer`` (``postXferReq``), so ``prep_fixed_s + prep_per_descriptor_s x d``
    is in the visible pull but not in ``xferDuration``. The shipped P5en profiles fit it (an effective value:
    the published prefill ON exceeds kv_transfer_on + recompute by a descriptor-proportional amount).

    Visible pull latency on the reader = prep + ``xferDuration`` + ``poll_s`` (the engine step that notices
    completion: vLLM's NIXL worker checks ``check_xfer_state`` in ``get_finished`` once per step) +
    ``handshake_s`` on a pair's first use. The reader's engine thread is busy for the post plus
    ``thread_per_descriptor_s x d`` (+ ``thread_per_byte_s x bytes`` where the bytes move on that thread, i.e.
    ``deployment.kv_transport: tcp``) (:func:`~kvplan.models.formulas.read_thread_time_s`): the engine's step
    that posts the read cannot end before that work is done. ``per_byte_s`` is the inverse line rate; concurrent transfers on
    one link share it.
    """

    fixed_s: float = Field(default=0.0, ge=0, description="Per transfer, in xferDuration (post included).")
    per_descriptor_s: float = Field(default=0.0, ge=0, description="Per descriptor, in xferDuration (post included).")
    per_byte_s: float = Field(default=0.0, ge=0, description="Inverse bandwidth per rank (s/B).")
    post_fixed_s: float = Field(default=0.0, ge=0, description="Per transfer, in postDuration (part of xferDuration).")
    post_per_descriptor_s: float = Field(
        default=0.0, ge=0, description="Per descriptor, in postDuration (part of xferDuration)."
    )
    prep_fixed_s: float = Field(
        default=0.0, ge=0, description="Per transfer, request creation before the post (not in xferDuration)."
    )
    prep_per_descriptor_s: float = Field(
        default=0.0, ge=0, description="Per descriptor, request creation before the post (not in xferDuration)."
    )
    poll_s: float = Field(default=0.0, ge=0, description="Completion seen at the next engine step.")
    handshake_s: float = Field(default=0.0, ge=0, description="One-off side-channel handshake per pair.")
    thread_per_descriptor_s: float = Field(
        default=0.0, ge=0,
        description="Reader's engine-thread time per descriptor of building and posting a read (descriptor ids, "
                    "make_prepped_xfer), beside the post; overlapped with the step's forward (vLLM PR #53333). "
                    "0 unless measured.",
    )
    thread_per_byte_s: float = Field(
        default=0.0, ge=0,
        description="Reader's engine-thread time per byte the read moves (per rank): 0 when the NIC moves the bytes "
                    "(RDMA: EFA/LIBFABRIC, verbs); the link's per_byte_s under deployment.kv_transport tcp, where UCX's "
                    "TCP transport moves them inside the progress calls NIXL's UCX backend makes on the posting and "
                    "polling thread (postXfer and checkXfer end in nixlUcxBackendH::status, which progresses the "
                    "worker: ai-dynamo/nixl src/plugins/ucx/ucx_backend.cpp).",
    )


class DecodeCost(_Cost):
    """One decode step of ``B`` sequences holding ``S`` KV tokens in total:

    ``overhead_s + batch_s(B) + per_context(B) x S`` with ``batch_s(B) = fixed_s + per_seq_s x B``, or,
    when ``batch_knots`` is given (kernel-derived priors), the measured context-free step time at those batch
    sizes interpolated linearly (weight-read bound at small batches, GEMM-bound at large ones), flat below the
    first knot and ``per_seq_s`` per sequence past the last. ``per_context(B)`` is ``per_context_token_s``, or,
    when ``context_knots_s`` is given (kernel-derived priors), the time per context token at each batch knot
    interpolated linearly, flat outside the knots: the decode attention kernel reads KV at an efficiency that
    depends on the batch (aiconfigurator's ``generation_attention`` table of vLLM's flash-attention decode
    kernel, measured per batch size: for Llama-3.1-8B on A100 that table's own slope is 85-88 ns per context
    token, 73-75 % of HBM bandwidth, at batch 1-4, 72-76 ns (84-89 %) at batch 8-24 and 91-104 ns at batch 32-64;
    the shipped prior's fitted knots, which also absorb the step's other context-dependent ops, are 80-87 ns at
    1-4, 77-79 ns at 8-24 and 90-99 ns at 32-64), so one slope for every batch misstates long contexts
    (:mod:`kvplan.calibration.derive`).
    """

    fixed_s: float = Field(default=0.0, ge=0, description="GPU time per step (weight read, all-reduce latency).")
    overhead_s: float = Field(default=0.0, ge=0, description="Engine CPU overhead per step (not scaled by TP or GPU).")
    per_seq_s: float = Field(default=0.0, ge=0, description="Per running sequence.")
    per_context_token_s: float = Field(
        default=0.0, ge=0, description="Per KV token read (attention); context_knots_s replaces it."
    )
    batch_knots: tuple[int, ...] = Field(default=(), description="Batch sizes of the measured step time.")
    batch_knots_s: tuple[float, ...] = Field(default=(), description="Context-free GPU step time at each knot, s.")
    context_knots_s: tuple[float, ...] = Field(
        default=(), description="GPU time per KV token read at each batch knot, s (replaces per_context_token_s)."
    )

    @model_validator(mode="after")
    def _knots(self) -> DecodeCost:
        _check_knots(self.batch_knots, self.batch_knots_s, "decode batch knots")
        if self.context_knots_s:
            _check_knots(self.batch_knots, self.context_knots_s, "decode context knots (one per batch knot)")
        return self

    def per_context_s(self, batch: float) -> float:
        """GPU time per context token of a step of ``batch`` sequences (:func:`formulas.per_context_s`)."""
        return per_context_s(self, batch)

    def batch_s(self, batch: float) -> float:
        """GPU time of a step of ``batch`` sequences without the context term (:func:`formulas.batch_s`)."""
        return batch_s(self, batch)


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


def scale_prefill_gpu(cost: PrefillCost, linear: float = 1.0, attention: float = 1.0) -> PrefillCost:
    """``cost`` with its linear-layer terms (fixed, per token, weight floor, knots) multiplied by ``linear`` and
    its attention terms by ``attention`` (the engine's CPU overhead unchanged)."""
    upd: dict[str, Any] = {k: getattr(cost, k) * linear for k in ("fixed_s", "per_token_s", "weight_read_s")}
    upd["attention_s"] = cost.attention_s * attention
    if cost.context_attention_s is not None:
        upd["context_attention_s"] = cost.context_attention_s * attention
    upd["linear_knots_s"] = tuple(v * linear for v in cost.linear_knots_s)
    return cost.model_copy(update=upd)



#: NIXL's synchronous post per descriptor over UCX's TCP transport: vLLM issue #34054 (1P1D on one host whose KV
#: did not go over NVLink, so UCX fell back to TCP): "Avg post time (ms)=129.127 ... Avg number of
#: descriptors=40064.0" (xferDuration 173.8 ms, 313 MB per transfer), i.e. 3.22 us per descriptor spent in
#: ``postXferReq`` on the posting thread. That NIXL's post ends in progress-until-idle (``nixlUcxBackendH::status``,
#: NIXL >= 0.3.1, ai-dynamo/nixl PR #415), so the figure may hold part of that read's wire work (7.8 KB per
#: descriptor there); one measurement cannot split the two, so the whole of it is taken as the per-descriptor
#: post (an upper bound).
TCP_POST_PER_DESCRIPTOR_S = 129.127e-3 / 40064


def with_transport(costs: CostModel, transport: str, per_byte_s: float, given: set[str], notes: list[str]) -> CostModel:
    """``costs`` for the deployment's KV transport (``deployment.kv_transport``).

    ``rdma`` (the default) leaves them as they are. ``tcp`` puts the read's CPU work on the reader's engine
    thread (:func:`~kvplan.models.formulas.read_thread_time_s`): ``transfer.thread_per_byte_s`` = the link's
    ``per_byte_s`` (UCX's TCP transport moves the bytes in the progress calls NIXL makes on that thread and on its
    progress thread, serialised with the post by the worker's lock) and
    ``transfer.thread_per_descriptor_s`` = :data:`TCP_POST_PER_DESCRIPTOR_S` (the measured TCP post), each unless
    ``given`` inline (the names of the inline ``costs.transfer`` fields); ``notes`` says what was set.
    """
    if transport != "tcp":
        return costs
    upd: dict[str, float] = {}
    if "thread_per_byte_s" not in given:
        upd["thread_per_byte_s"] = per_byte_s
    if "thread_per_descriptor_s" not in given:
        upd["thread_per_descriptor_s"] = TCP_POST_PER_DESCRIPTOR_S
    rate = f"{1.0 / per_byte_s / 1e9:.2f} GB/s per rank" if per_byte_s > 0 else "no per-byte cost on this link"
    notes.append(f"kv_transport tcp: the reader's engine thread posts the read ({TCP_POST_PER_DESCRIPTOR_S * 1e6:.2f} us "
                 f"per descriptor, vLLM issue #34054) and moves its bytes (the link's {rate})"
                 + (f"; kept inline: {', '.join(sorted(given & {'thread_per_byte_s', 'thread_per_descriptor_s'}))}"
                    if given & {"thread_per_byte_s", "thread_per_descriptor_s"} else ""))
    return costs.model_copy(update={"transfer": costs.transfer.model_copy(update=upd)})


def scale_decode_gpu(cost: DecodeCost, scale: float) -> DecodeCost:
    """``cost`` with its GPU terms (fixed, per sequence, per context token, batch knots) multiplied by ``scale``
    (the engine's CPU overhead unchanged)."""
    upd: dict[str, Any] = {k: getattr(cost, k) * scale for k in ("fixed_s", "per_seq_s", "per_context_token_s")}
    upd["batch_knots_s"] = tuple(v * scale for v in cost.batch_knots_s)
    upd["context_knots_s"] = tuple(v * scale for v in cost.context_knots_s)
    return cost.model_copy(update=upd)

def prefill_step_time_array(cost: PrefillCost, new_tokens: Any, pairs: Any, ctx_pairs: Any = 0.0) -> np.ndarray:
    """:func:`prefill_step_time_s` over numpy arrays (the analytic screen)."""
    n = np.atleast_1d(np.asarray(new_tokens, dtype=float))
    p = np.broadcast_to(np.asarray(pairs, dtype=float), n.shape)
    c = np.broadcast_to(np.asarray(ctx_pairs, dtype=float), n.shape)
    return np.array([prefill_step_time_s(cost, float(a), float(b), float(d)) for a, b, d in zip(n, p, c, strict=True)])


def decode_step_coefficients(cost: DecodeCost) -> tuple[float, float, float]:
    """``(a, b, c)`` with step time ``~ a + b x batch + c x context tokens``, for the analytic screen.

    Exact without batch knots; with knots the chord between batch 1 and 32, and with context knots ``c`` the
    mean time per context token over batch 1 to 32.
    """
    b = (cost.batch_s(32) - cost.batch_s(1)) / 31
    c = sum(cost.per_context_s(n) for n in range(1, 33)) / 32
    return cost.overhead_s + cost.batch_s(1) - b, b, c


def mixed_step_time_s(
    prefill: PrefillCost, decode: DecodeCost, prefill_tokens: int, pairs: float, decode_seqs: int,
    decode_context_tokens: float, ctx_pairs: float = 0.0,
) -> float:
    """One step of an aggregated engine mixing prefill chunks and decode tokens (vLLM V1 chunked prefill).

    With prefill tokens in the step: ``prefill_step_time_s(prefill, prefill_tokens, pairs, ctx_pairs) +
    decode.per_seq_s x B + decode.per_context(B) x S`` (``B`` decoding sequences holding ``S`` KV tokens;
    ``ctx_pairs`` of the pairs against cached KV, priced as on a prefill node): the prefill step's
    fixed cost (launch, sampling, weight reads) is paid once and each decode token adds its marginal decode
    cost. A step without prefill tokens is a decode step, ``decode_step_time_s(decode, B, S)``.
    Assumption (stated, not measured): the marginal cost of a decode token is the same in a mixed step as in
    a pure decode step; no calibration here covers mixed batches, so the error is unknown.
    """
    if prefill_tokens <= 0:
        return decode_step_time_s(decode, decode_seqs, decode_context_tokens)
    return (
        prefill_step_time_s(prefill, prefill_tokens, pairs, ctx_pairs)
        + decode.per_seq_s * decode_seqs
        + per_context_s(decode, decode_seqs) * decode_context_tokens
    )
