"""Real production request traces: readers, conversation reconstruction, replay selection, statistics.

Every reader returns a :class:`Trace`: a frozen wrapper around a pandas frame with one row per request,
sorted by arrival, with the columns

=====================  =======================================================================================
``request_id``         int, 0-based position of the record in the file (file order, blank lines skipped)
``session_id``         str, the conversation (Mooncake: ``request_id`` of the first visible request)
``turn``               int, 1-based position in the conversation (Mooncake: depth in the prefix chain)
``arrival_s``          float, arrival on the trace's own clock, rebased so the first request is at 0
``input_tokens``       int, prompt tokens of the request (the whole resent context)
``output_tokens``      int, generated tokens
``parent_request_id``  int, ``request_id`` of the previous turn, -1 when none
``service_s``          float, measured service time (request start to last token) when the trace has it
                       (vLLM multi-turn ``latency_ms``), otherwise NaN
``linkable``           bool, whether a follow-up of this request could be seen at all (Mooncake: it has at
                       least ``min_blocks`` full blocks; session-id formats: always True)
=====================  =======================================================================================

plus the source path, the format, the sha256 of the bytes read and, for Mooncake, the linking statistics.

Formats (``format=`` of :func:`load_trace`; :func:`detect_trace_format` guesses it from the first line):

``mooncake``
    Mooncake FAST'25 JSONL (kvcache-ai/Mooncake ``FAST25-release/traces``): one object per line with
    ``timestamp`` (integer milliseconds from trace start), ``input_length``, ``output_length`` and
    ``hash_ids``, one id per 512-token block of the prompt, chained: the same id at position *k* means the
    whole prefix up to block *k* is identical. Rules checked on every line: timestamps are non-decreasing in
    file order, lengths are non-negative whole numbers, and ``len(hash_ids) == ceil(input_length / 512)``
    exactly (the last, partial block has an id too).
``multiturn``
    The per-request stats JSON of vLLM's ``benchmarks/multi_turn/benchmark_serving_multi_turn.py
    --stats-json-output``: an array of objects with ``conversation_id``, ``start_time_ms``
    (``time.perf_counter`` in ms, so only differences mean anything), ``input_num_tokens``,
    ``output_num_tokens`` and ``input_num_turns`` (older versions: ``session_id`` instead of
    ``conversation_id``); ``latency_ms`` when present becomes ``service_s``.
    The file is in per-client completion order, so it is sorted (stably) by ``start_time_ms``.
``ragpulse``
    RAGPulse ``0_trace.jsonl`` (flashserve/RAGPulse): ``timestamp`` (a string or number of whole seconds),
    ``input_length``, ``output_length``, ``session_id``; ``hash_ids`` is not read. Timestamps are not
    sorted in the published file, which is sorted stably here (``on_clock_restart="sort"``, as its
    SOURCE.md says). Note: the published file is two consecutive weeks, each counted from 0 (line 3,801
    goes back from 604,453 s to 0; the epoch prefixes of the session ids put the second part 604,800 s
    later), so sorting overlays the two weeks and doubles the apparent arrival rate.
    ``on_clock_restart="append"`` instead starts a new clock segment at every backwards step of more than
    ``CLOCK_RESTART_S`` and appends it after the previous segment's last arrival (a lower bound on the
    true offset). The restarts found are listed in ``Trace.notes["clock_restarts"]`` either way.
``csv``
    A generic CSV whose header is exactly ``session_id,timestamp_s,input_tokens,output_tokens``: one
    request per row, timestamps in seconds (any origin, non-decreasing in file order), whole-number token
    counts. Consecutive requests of a session (by arrival) are consecutive turns.

Every problem raises :class:`kvplan.errors.KvplanInputError` with a one-line message naming the file, the
line and the field: a file above ``max_bytes`` (refused from ``stat`` before reading), an empty file, a
line that is not JSON, a missing field, a negative / NaN / fractional count, a wrong ``hash_ids`` length,
timestamps going backwards (Mooncake, CSV).

Mooncake conversation reconstruction (no session id is published). Request B is taken as the next turn of
an earlier request A (earlier in file order, so A arrives no later than B) when A's *full* 512-token blocks,
``input_length // 512`` of them and at least ``min_blocks`` (default 2), are a prefix of B's ``hash_ids``.
Among candidates the deepest match wins and, at equal depth, the latest A. A's partial last block is left
out because its hash changes once the answer and the next user message are appended; requiring two full
blocks avoids linking every request through the shared first block (id 0 in the conversation trace).
Implementation: an exact prefix trie, a dict ``(parent node, block id) -> node`` grown as the file is read,
and a dict ``node -> latest request whose full blocks end there``; each request walks its own path once,
so the cost is linear in the number of block ids (12,031 requests in well under a second). Limits, all
inherited from the data: turns whose context is under ``512 * min_blocks`` = 1,024 tokens can neither be
linked as a parent nor (if the child is that short) as a child, and show up as one-request sessions; the
one-hour window censors gaps above ~30 min and cuts sessions at both ends (a session that began before
the window starts at "turn 1"); a regenerate or an edit gives a parent two children (28 of 3,932 parents
in the conversation trace); a trimmed or edited context breaks the chain; and the trace is *sampled*
("prioritising requests within the same user session", paper appendix A), so follow-up probabilities are
lower bounds. On ``conversation_trace.jsonl`` this links 3,975 of 12,031 requests into 8,056 sessions.

Statistics (:func:`workload_stats`). Gaps are measured **arrival to arrival** between a request and its
parent, so they include the parent's own prefill, decode and queueing time; the *idle* gap (end of the
response to the next arrival, what a decode-side TTL must cover) is estimated as that gap minus the
parent's service time, measured when the trace has it (``service_s``) or from ``service_time_fn``.
Follow-up probabilities are censored: a request counts only if it is ``linkable`` and arrived at least
``followup_horizon_s`` (default ``max(ttls_s)``) before the last arrival, so that every follow-up within
the horizon would be visible. WORKLOADS.md uses a 2,340 s horizon (parents in the first 20 minutes of the
39-minute Mooncake trace); pass ``followup_horizon_s=2340`` to reproduce it.
"""
