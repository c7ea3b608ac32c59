"""The ``deployment.handoff`` section: a prefill-to-decode handoff stage of a P/D stack other than vLLM's.

vLLM's proxy + NixlConnector (what kvplan models by default) has no such stage: the proxy sends the D leg as
soon as the P leg returns and D pulls the prompt's KV with one NIXL READ per rank, concurrently with other
reads (sim/link.py). Some stacks put a **serialised** transfer stage between the two legs instead. The case
that needs it is NVIDIA Dynamo with TensorRT-LLM workers (Dynamo 0.7.0, ``dynamo.trtllm``): Dynamo's
``PrefillRouter`` (``lib/llm/src/kv_router/prefill_router.rs``) runs the P leg with ``max_tokens = 1`` to
completion, takes the ``disaggregated_params`` from its output and only then routes the D leg; the decode
worker's TensorRT-LLM cache transceiver then receives the prompt's KV, and by default it does so **one request
at a time** (TensorRT-LLM ``docs/source/features/disagg-serving.md``: ``TRTLLM_REQUEST_KV_CACHE_CONCURRENT``
default 0, "the generation executor will reuse the same resource to process KV cache transfer for each request
sequentially"; ``TRTLLM_KVCACHE_SEND_MAX_CONCURRENCY_NUM`` default 1 concurrent send), and moves every block
of the prompt whatever the decode side already holds (ai-dynamo/enhancements DEP 0002). The stage's cost is
the stack's, so it is a deployment parameter with a stated source, never a calibrated vLLM profile term.

The model: after the D leg's proxy/HTTP overhead, a request spends ``fixed_s + prompt KV bytes /
bandwidth_bytes_per_s`` in the stage of the D instance it was routed to, FCFS one at a time when
``serialised`` (each request independently otherwise), then reaches D as usual (kvplan's own P->D READ still
follows; on an RDMA link it is milliseconds). The prompt's KV bytes are one copy of the whole model's
(``kv_bytes_per_token_per_rank(arch, 1)`` per token): the stage does not scale with either side's TP. Off
(``null``) by default: no other scenario changes.
"""

from __future__ import annotations

from pydantic import Field

from kvplan.sim.scenario_base import _Frozen


class Handoff(_Frozen):
    """A prefill-to-decode handoff stage between the P leg and the D leg (off unless given)."""

    serialised: bool = Field(
        default=True, description="One request at a time per decode instance, FCFS (TensorRT-LLM's default cache "
                                  "transceiver); false: every request's stage runs independently.",
    )
    fixed_s: float = Field(default=0.0, ge=0, le=3600, description="Seconds per request in the stage.")
    bandwidth_bytes_per_s: float | None = Field(
        default=None, gt=0, le=1e15,
        description="Bytes per second the stage moves the prompt's KV at (one copy of the model's KV per token); "
                    "null: no per-byte cost.",
    )
    source: str = Field(default="", max_length=2000, description="Where the stage's costs come from.")
