"""The per-step cost formulas of :mod:`kvplan.models.costs` (pure arithmetic on a profile's parameters).

They are the formulas documented on :class:`~kvplan.models.costs.PrefillCost`,
:class:`~kvplan.models.costs.TransferCost` and :class:`~kvplan.models.costs.DecodeCost`, kept in a module
without pydantic so that the simulator's compiled build (sim/native.py) can compile them with the hot path;
``kvplan.models.costs`` re-exports every one of them and stays the place to read and call them. The
parameter objects are typed by the protocols below (the pydantic models satisfy them).
"""

from __future__ import annotations

import math
from bisect import bisect_left as _bisect_left
from typing import Final, Protocol

_bisect: Final = _bisect_left  # interpreted; the compiled build bisects with _bisect_typed (below)
_COMPILED: Final = not __file__.endswith(".py")  # see kvplan/sim/clock.py


class PrefillParams(Protocol):
    """What the prefill formulas read (:class:`kvplan.models.costs.PrefillCost`)."""

    fixed_s: float
    per_token_s: float
    weight_read_s: float
    attention_s: float
    context_attention_s: float | None
    overhead_s: float
    linear_knots_tokens: tuple[int, ...]
    linear_knots_s: tuple[float, ...]


class TransferParams(Protocol):
    """What the transfer formulas read (:class:`kvplan.models.costs.TransferCost`)."""

    fixed_s: float
    per_descriptor_s: float
    per_byte_s: float
    post_fixed_s: float
    post_per_descriptor_s: float
    prep_fixed_s: float
    prep_per_descriptor_s: float
    poll_s: float
    handshake_s: float
    thread_per_descriptor_s: float
    thread_per_byte_s: float


class DecodeParams(Protocol):
    """What the decode formulas read (:class:`kvplan.models.costs.DecodeCost`)."""

    fixed_s: float
    overhead_s: float
    per_seq_s: float
    per_context_token_s: float
    batch_knots: tuple[int, ...]
    batch_knots_s: tuple[float, ...]
    context_knots_s: tuple[float, ...]


class NativePrefill:
    """A plain copy of a :class:`PrefillParams` (a native class in the compiled build) for the simulator's step loop.

    The formulas read their parameters by name (a ``Protocol``); on a pydantic model each read is a generic
    attribute lookup through the model's class, on this object a slot read: the same values, cheaper to read."""

    __slots__ = ("fixed_s", "per_token_s", "weight_read_s", "attention_s", "context_attention_s", "overhead_s",
                 "linear_knots_tokens", "linear_knots_s")

    def __init__(self, p: PrefillParams) -> None:
        self.fixed_s: float = p.fixed_s
        self.per_token_s: float = p.per_token_s
        self.weight_read_s: float = p.weight_read_s
        self.attention_s: float = p.attention_s
        self.context_attention_s: float | None = p.context_attention_s
        self.overhead_s: float = p.overhead_s
        self.linear_knots_tokens: tuple[int, ...] = p.linear_knots_tokens
        self.linear_knots_s: tuple[float, ...] = p.linear_knots_s

    def step_time_s(self, new_tokens: float, pairs: float, ctx_pairs: float = 0.0) -> float:
        """= :func:`prefill_step_time_s` ``(self, new_tokens, pairs, ctx_pairs)``: the same operations in the same
        order (the same float), read from typed fields (compiled: no attribute lookup by name through the Protocol).
        ``tests/test_costs.py`` compares the two."""
        if self.linear_knots_tokens:
            linear = piecewise_linear(self.linear_knots_tokens, self.linear_knots_s, new_tokens, self.per_token_s)
        else:
            linear = self.per_token_s * new_tokens
            if not linear > self.weight_read_s:
                linear = self.weight_read_s
        c = self.context_attention_s
        ctx_attention = self.attention_s if c is None else c
        return self.overhead_s + (self.fixed_s + linear + self.attention_s * (pairs - ctx_pairs)
                                  + ctx_attention * ctx_pairs)


class NativeTransfer:
    """A plain copy of a :class:`TransferParams` (see :class:`NativePrefill`), for the reads the simulator starts."""

    __slots__ = ("fixed_s", "per_descriptor_s", "per_byte_s", "post_fixed_s", "post_per_descriptor_s", "prep_fixed_s",
                 "prep_per_descriptor_s", "poll_s", "handshake_s", "thread_per_descriptor_s", "thread_per_byte_s")

    def __init__(self, p: TransferParams) -> None:
        self.fixed_s: float = p.fixed_s
        self.per_descriptor_s: float = p.per_descriptor_s
        self.per_byte_s: float = p.per_byte_s
        self.post_fixed_s: float = p.post_fixed_s
        self.post_per_descriptor_s: float = p.post_per_descriptor_s
        self.prep_fixed_s: float = p.prep_fixed_s
        self.prep_per_descriptor_s: float = p.prep_per_descriptor_s
        self.poll_s: float = p.poll_s
        self.handshake_s: float = p.handshake_s
        self.thread_per_descriptor_s: float = p.thread_per_descriptor_s
        self.thread_per_byte_s: float = p.thread_per_byte_s

    # The formulas below restated as methods with typed reads (same operations, same order, so the same floats;
    # ``tests/test_costs.py`` compares them): compiled, the module functions read a Protocol-typed ``cost`` by name.
    def xfer_time_s(self, nbytes_per_rank: float, descriptors: int) -> float:
        """= :func:`xfer_time_s` ``(self, nbytes_per_rank, descriptors)``."""
        return self.fixed_s + self.per_descriptor_s * descriptors + self.per_byte_s * nbytes_per_rank

    def post_time_s(self, descriptors: int) -> float:
        """= :func:`post_time_s` ``(self, descriptors)``."""
        return self.post_fixed_s + self.post_per_descriptor_s * descriptors

    def prep_time_s(self, descriptors: int) -> float:
        """= :func:`prep_time_s` ``(self, descriptors)``."""
        return self.prep_fixed_s + self.prep_per_descriptor_s * descriptors


def _bisect_typed(knots: tuple[int, ...], x: float) -> int:
    """``bisect.bisect_left(knots, x)`` (the first index whose knot is not below ``x``), as typed code: compiled, the
    builtin is a generic call comparing a float with ints through Python's rich comparison (exact here too: knots
    are integers well below 2**53)."""
    lo = 0
    hi = len(knots)
    while lo < hi:
        mid = (lo + hi) // 2
        if knots[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


def piecewise_linear(knots: tuple[int, ...], values: tuple[float, ...], x: float, slope_after: float) -> float:
    """``values`` interpolated linearly at ``x`` over ``knots``: flat below the first, ``slope_after`` past the last."""
    if x <= knots[0]:
        return values[0]
    j = _bisect_typed(knots, x) if _COMPILED else _bisect(knots, x)
    if j >= len(knots):
        return values[-1] + slope_after * (x - knots[-1])
    k0, k1 = knots[j - 1], knots[j]
    return values[j - 1] + (values[j] - values[j - 1]) * (x - k0) / (k1 - k0)


def linear_s(cost: PrefillParams, new_tokens: float) -> float:
    """Time of the linear layers for a step of ``new_tokens`` tokens: the measured knots interpolated when given,
    else ``max(per_token_s x n, weight_read_s)``."""
    if cost.linear_knots_tokens:
        return piecewise_linear(cost.linear_knots_tokens, cost.linear_knots_s, new_tokens, cost.per_token_s)
    linear = cost.per_token_s * new_tokens
    return linear if linear > cost.weight_read_s else cost.weight_read_s


def ctx_attention_s(cost: PrefillParams) -> float:
    """The per-pair cost against cached KV in use (``context_attention_s``, or ``attention_s`` when None)."""
    c = cost.context_attention_s
    return cost.attention_s if c is None else c


def batch_s(cost: DecodeParams, batch: float) -> float:
    """GPU time of a decode step of ``batch`` sequences without the context term."""
    if cost.batch_knots:
        return piecewise_linear(cost.batch_knots, cost.batch_knots_s, batch, cost.per_seq_s)
    return cost.fixed_s + cost.per_seq_s * batch


def per_context_s(cost: DecodeParams, batch: float) -> float:
    """Decode time per context token of a step of ``batch`` sequences: ``context_knots_s`` interpolated linearly
    over ``batch_knots`` (flat outside them) when given, else ``per_context_token_s``."""
    if cost.context_knots_s:
        return piecewise_linear(cost.batch_knots, cost.context_knots_s, batch, 0.0)
    return cost.per_context_token_s


def causal_pairs(new_tokens: float, context_tokens: float) -> float:
    """Attention (query, key) pairs of ``new_tokens`` computed after ``context_tokens``: n c + n (n + 1) / 2."""
    return new_tokens * context_tokens + new_tokens * (new_tokens + 1) / 2


def prefill_gpu_step_s(cost: PrefillParams, new_tokens: float, pairs: float, ctx_pairs: float = 0.0) -> float:
    """GPU time of one prefill step (the :class:`~kvplan.models.costs.PrefillCost` formula without ``overhead_s``)."""
    return (cost.fixed_s + linear_s(cost, new_tokens) + cost.attention_s * (pairs - ctx_pairs)
            + ctx_attention_s(cost) * ctx_pairs)


def prefill_step_time_s(cost: PrefillParams, new_tokens: float, pairs: float, ctx_pairs: float = 0.0) -> float:
    """Time of one prefill engine step with ``new_tokens`` in total and ``pairs`` attention pairs, ``ctx_pairs``
    of them against cached KV (GPU + engine CPU overhead)."""
    return cost.overhead_s + prefill_gpu_step_s(cost, new_tokens, pairs, ctx_pairs)


def prefill_time_s(
    cost: PrefillParams, new_tokens: int, cached_tokens: int = 0, chunk_tokens: int | None = 8192, *, gpu_only: bool = False
) -> float:
    """Prefill of ``new_tokens`` on top of ``cached_tokens`` alone on an engine, chunked at ``chunk_tokens``.

    Sum over chunks of :func:`prefill_step_time_s` with ``causal_pairs(chunk, context)``; ``chunk_tokens``
    ``None`` is one step (no chunking); ``gpu_only`` leaves out the engine's CPU overhead per step.
    """
    if new_tokens <= 0:
        return 0.0
    step = prefill_gpu_step_s if gpu_only else prefill_step_time_s
    chunk_max = new_tokens if chunk_tokens is None else chunk_tokens
    total = 0.0
    done = 0
    while done < new_tokens:
        chunk = min(chunk_max, new_tokens - done)
        ctx = cached_tokens + done
        total += step(cost, chunk, causal_pairs(chunk, ctx), chunk * ctx)
        done += chunk
    return total


def xfer_time_s(cost: TransferParams, nbytes_per_rank: float, descriptors: int) -> float:
    """NIXL xferDuration of one rank's READ, post included: ``fixed_s + per_descriptor_s x d + per_byte_s x bytes``."""
    return cost.fixed_s + cost.per_descriptor_s * descriptors + cost.per_byte_s * nbytes_per_rank


def post_time_s(cost: TransferParams, descriptors: int) -> float:
    """NIXL postDuration, the part of xferDuration spent posting: ``post_fixed_s + post_per_descriptor_s x d``."""
    return cost.post_fixed_s + cost.post_per_descriptor_s * descriptors


def prep_time_s(cost: TransferParams, descriptors: int) -> float:
    """NIXL request creation before the post (not in xferDuration): ``prep_fixed_s + prep_per_descriptor_s x d``."""
    return cost.prep_fixed_s + cost.prep_per_descriptor_s * descriptors


def read_thread_time_s(cost: TransferParams, descriptors: int, nbytes_per_rank: float = 0.0) -> float:
    """Engine-thread time of one READ on the reader: the post, ``thread_per_descriptor_s x d`` and
    ``thread_per_byte_s x bytes`` (the bytes a software transport moves on that thread).

    vLLM's NIXL worker builds the descriptor ids and calls ``make_prepped_xfer`` then ``transfer`` inside
    ``_read_blocks``, called from ``start_load_kv`` on the reading engine's worker thread
    (``vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py``); since PR #53333 that runs while the
    step's forward is on the GPU, so it stalls the engine only by what exceeds the step (open PR #57987:
    large pulls still stall decode). The post is NIXL's measured ``postDuration`` (synchronous in
    ``postXferReq``); the request creation's thread share is ``thread_per_descriptor_s`` (0 unless measured:
    the profiles' fitted ``prep_*`` is an effective latency, not known to be thread time).

    ``thread_per_byte_s`` is 0 over RDMA (the NIC moves the bytes; progress only polls completions). Over UCX's
    TCP transport (``UCX_TLS`` without an RDMA transport: ``deployment.kv_transport: tcp``) the bytes move inside
    ``ucp_worker_progress`` (each call handles up to ``UCX_TCP_MAX_POLL`` = 16 socket events of <= 64 KB
    ``RX_SEG_SIZE``, UCX 1.18 ``src/uct/tcp/tcp_iface.c``), and NIXL's UCX backend progresses the worker on the
    calling thread at the end of every post (NIXL 0.2.0; 0.1.1 returns at once) and every ``check_xfer_state``
    (``nixlUcxBackendH::status``: one ``ucp_worker_progress`` per pending request through ``nixlUcxWorker::test`` in
    NIXL <= 0.3.0, i.e. ~40k calls per check of a 10k-token Llama-8B read, far more than its bytes need; until idle
    from 0.3.1, ai-dynamo/nixl PR #415; ai-dynamo/nixl
    ``src/plugins/ucx/ucx_backend.cpp``, ``src/utils/ucx/ucx_utils.cpp``). NIXL's own progress thread is on too
    (``nixl_agent_config(enable_prog_thread=True)`` is the Python default in 0.1.1/0.2.0 and vLLM passes no config),
    but both threads progress one ``UCS_THREAD_MODE_MULTI`` worker (``NIXL_UCX_MT_WORKER``) whose lock
    (``UCP_WORKER_THREAD_CS_ENTER_CONDITIONAL`` in ``ucp_get_nbx`` and ``ucp_worker_progress``) serialises the
    post's one GET per descriptor with the byte movement, so the reader's engine thread is busy for the post plus
    the read's wire time: ``thread_per_byte_s`` = the link's ``per_byte_s``. The sum is an upper bound where the
    byte movement is not CPU-bound; the measured TCP post (vLLM issue #34054, 129 of a 174 ms xferDuration) may
    itself hold some of its wire. No public measurement tests this sum: the llm-d exp-7 "P/D" runs it was first
    checked against turned out to be served by aggregated replicas (their endpoint picker did no P/D; the
    validation case files).
    """
    return (post_time_s(cost, descriptors) + cost.thread_per_descriptor_s * descriptors
            + cost.thread_per_byte_s * nbytes_per_rank)


def pull_visible_time_s(cost: TransferParams, nbytes_per_rank: float, descriptors: int, first_use: bool = False) -> float:
    """Pull latency the request sees on the reader: prep + xferDuration + ``poll_s`` (+ ``handshake_s`` on first use).

    The post is inside xferDuration (see :class:`~kvplan.models.costs.TransferCost`), so it is not added again.
    """
    hs = cost.handshake_s if first_use else 0.0
    return prep_time_s(cost, descriptors) + xfer_time_s(cost, nbytes_per_rank, descriptors) + cost.poll_s + hs


def transfer_time_s(cost: TransferParams, nbytes_per_rank: float, descriptors: int) -> float:
    """Request-visible pull latency on an idle link and engine: prep + xferDuration + poll (no handshake)."""
    return pull_visible_time_s(cost, nbytes_per_rank, descriptors)


def decode_step_time_s(cost: DecodeParams, batch: float, context_tokens: float, *, gpu_only: bool = False) -> float:
    """One decode step with ``batch`` sequences holding ``context_tokens`` KV tokens in total."""
    t = batch_s(cost, batch) + per_context_s(cost, batch) * context_tokens
    return t if gpu_only else t + cost.overhead_s


def decode_step_increment_s(cost: DecodeParams, batch: int) -> float:
    """How much each step of an unchanged batch is slower than the previous one (each sequence adds a token)."""
    return per_context_s(cost, batch) * batch


class DecodeSteps:
    """:func:`decode_step_time_s` and :func:`decode_step_increment_s` of one cost for batches of ``0..max_batch``
    sequences, with ``batch_s`` and ``per_context_s`` computed once per batch size (the same floats: the same
    functions on the same arguments, then the same arithmetic). D plans a stretch with them at every batch
    change; the knots' interpolation is most of a step time's cost."""

    def __init__(self, cost: DecodeParams, max_batch: int) -> None:
        self.batch_s = [batch_s(cost, b) for b in range(max_batch + 1)]
        self.per_context_s = [per_context_s(cost, b) for b in range(max_batch + 1)]
        self.overhead_s = cost.overhead_s

    def step_time_s(self, batch: int, context_tokens: float) -> float:
        """= ``decode_step_time_s(cost, batch, context_tokens)``."""
        t = self.batch_s[batch] + self.per_context_s[batch] * context_tokens
        return t + self.overhead_s

    def increment_s(self, batch: int) -> float:
        """= ``decode_step_increment_s(cost, batch)``."""
        return self.per_context_s[batch] * batch


def decode_steps_time_s(cost: DecodeParams, batch: int, context_tokens: float, steps: int) -> float:
    """Time of ``steps`` consecutive decode steps of an unchanged batch (closed form).

    Each step appends one token per sequence, so step ``i`` (0-based) sees ``context + batch x i``:
    ``k (fixed + per_seq b + per_ctx S) + per_ctx b k (k - 1) / 2``.
    """
    k = steps
    first = decode_step_time_s(cost, batch, context_tokens)
    return k * first + decode_step_increment_s(cost, batch) * k * (k - 1) / 2


def steps_within(elapsed_s: float, first_s: float, increment_s: float) -> int:
    """Whole decode steps of an unchanged batch finished ``elapsed_s`` after its first began: the largest ``k``
    with ``k first + increment k (k - 1) / 2 <= elapsed`` (the inverse of :func:`decode_steps_time_s`).

    The quadratic's root is only the first guess; the answer is settled on the series itself (the time of ``k``
    steps, :func:`decode_steps_time_s`'s series, written out below: compiled, a nested function was a closure
    object and a generic call per evaluation).
    """
    if increment_s > 0:
        a = first_s - increment_s / 2
        k = int((-a + math.sqrt(a * a + 2 * increment_s * elapsed_s)) / increment_s)
    else:
        k = int(elapsed_s / first_s) if first_s > 0 else 0
    if k < 0:  # (not max(k, 0): a builtin call per evaluation interpreted)
        k = 0
    while k > 0 and k * first_s + increment_s * k * (k - 1) / 2 > elapsed_s:
        k -= 1
    j = k + 1
    while j * first_s + increment_s * j * (j - 1) / 2 <= elapsed_s:
        j += 1
    return j - 1
