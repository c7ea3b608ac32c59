"""The published P5en measurements, embedded so ``kvplan reproduce`` works without ``../shared``.

Source: the public write-up of vLLM's bidirectional KV transfer (vLLM blog / AWS, 2026: "bi-directional
KV cache transfer", vLLM 0.29.0 + NIXL 1.4.1 + PR #40186, 1P1D Amazon EC2 p5en, 8x H200 per node, EFA,
NixlConnector), as transcribed in the project's ``shared/data/p5en_published.csv`` (its README lists the
setup and the caveats). These are the write-up's numbers (facts reported in a public article), copied
verbatim: ``calibration/data/p5en_published.csv`` is the same file byte for byte (a test checks it), and
``calibration/data/README.md`` carries the attribution.
"""

from __future__ import annotations

import hashlib

#: The CSV, byte for byte (``model,series,prompt_tokens,value_ms,note``).
PUBLISHED_CSV = """model,series,prompt_tokens,value_ms,note
Qwen/Qwen3-32B,ttft_off,2000,158,TTFT with bidirectional KV transfer OFF (prefill recomputes whole context)
Qwen/Qwen3-32B,ttft_off,24000,778,
Qwen/Qwen3-32B,ttft_on,2000,122,TTFT with bidirectional KV transfer ON (D->P pull of retained KV)
Qwen/Qwen3-32B,ttft_on,24000,460,about 1.6-1.7x below OFF at the longest prompt
Qwen/Qwen3-32B,prefill_off,2000,153,prefill duration (server side) OFF = recompute only
Qwen/Qwen3-32B,prefill_off,24000,744,
Qwen/Qwen3-32B,prefill_on,2000,128,prefill duration ON = recompute of the suffix + D->P KV transfer
Qwen/Qwen3-32B,prefill_on,24000,414,
Qwen/Qwen3-32B,kv_transfer_on,2000,30,D->P KV transfer component of prefill ON ("about 30 ms to 130 ms")
Qwen/Qwen3-32B,kv_transfer_on,24000,130,
zai-org/GLM-5-FP8,ttft_off,2000,500,
zai-org/GLM-5-FP8,ttft_off,20000,2334,
zai-org/GLM-5-FP8,ttft_on,2000,358,
zai-org/GLM-5-FP8,ttft_on,20000,702,about 3.3x below OFF at the longest prompt
zai-org/GLM-5-FP8,prefill_off,2000,500,
zai-org/GLM-5-FP8,prefill_off,20000,2331,
zai-org/GLM-5-FP8,prefill_on,2000,316,
zai-org/GLM-5-FP8,prefill_on,20000,541,
zai-org/GLM-5-FP8,kv_transfer_on,2000,29,("about 29 ms to 110 ms")
zai-org/GLM-5-FP8,kv_transfer_on,20000,110,
"""

#: sha256 of :data:`PUBLISHED_CSV` (= of ``shared/data/p5en_published.csv``), for provenance.
PUBLISHED_SHA256 = hashlib.sha256(PUBLISHED_CSV.encode("utf-8")).hexdigest()

#: Where the numbers come from, for profiles' provenance and the report.
PUBLISHED_SOURCE = (
    "vLLM blog / AWS write-up 'bi-directional KV cache transfer' (2026-09-21): vllm 0.29.0 + nixl 1.4.1 + "
    "PR #40186, 1P1D p5en (8x H200 141 GB, EFA, LIBFABRIC), TP8, bf16, max_model_len 32768, max_num_seqs 8; "
    "transcribed in shared/data/p5en_published.csv"
)
