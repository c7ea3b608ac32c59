"""What of the previous turn the next prompt repeats token for token (``workload.history``).

KV is reusable only as far as the new prompt starts with the same tokens as the context that produced it
(vLLM's prefix cache matches full blocks by hash, ``vllm/v1/core/kv_cache_utils.py`` ``hash_block_tokens``).
Three assumptions, per follow-up turn (prompt sizes are the same in all three: the prompt still holds a
version of the previous answer, only its tokens differ):

* ``verbatim`` (default, ``None``): the whole previous context, prompt and output, is repeated (a chat
  template that re-renders the history unchanged);
* ``prompt_only``: only the previous *prompt* is repeated; the previous output is re-rendered differently
  (Qwen3's chat template drops earlier ``<think>`` reasoning, so the answer's tokens change: vLLM docs and
  vllm#43094 warn that a bidirectional read of such a context reads KV for the wrong positions);
* ``partial`` with ``history_kept_share`` s: the first ``floor(s x (prompt + output))`` tokens of the
  previous context are repeated (an agent that compacts or rewrites its context from some point on).

The simulator caps every reuse of the conversation's KV by this (``Request.reuse``): P's local prefix
hit and D's hit in full blocks, and the D->P pull (P does not check the tokens in vLLM, so reading more
would be wrong KV; the model assumes a deployment that reads only what is valid). Pinned memory is what
vLLM pins, every finished request's whole context for the TTL, whatever the next prompt reuses; what
changes is how much of it is read back and how many tokens are recomputed.
"""

from __future__ import annotations

import numpy as np

from kvplan.sim.scenario import Workload


def history_reuse(workload: Workload, prompt: np.ndarray, output: np.ndarray, offsets: np.ndarray) -> np.ndarray | None:
    """Per turn: tokens of the previous turn's context the prompt repeats (0 on a first turn); None for verbatim."""
    h = workload.history
    if h is None or h == "verbatim":
        return None
    prev_prompt = np.zeros(len(prompt), dtype=np.int64)
    prev_out = np.zeros(len(prompt), dtype=np.int64)
    prev_prompt[1:] = prompt[:-1]
    prev_out[1:] = output[:-1]
    if h == "prompt_only":
        reuse = prev_prompt
    else:
        share = float(workload.history_kept_share if workload.history_kept_share is not None else 1.0)
        reuse = np.floor(share * (prev_prompt + prev_out)).astype(np.int64)
    first = offsets[:-1][offsets[:-1] < len(prompt)]
    reuse[first] = 0
    return reuse


def combine_reuse(a: np.ndarray | None, b: np.ndarray | None) -> np.ndarray | None:
    """The smaller of two per-turn reuse caps (None = no cap)."""
    if a is None:
        return b
    if b is None:
        return a
    return np.minimum(a, b)


def follow_up_tail_tokens(workload: Workload, user_tokens: float, output_tokens: float, prev_context: float) -> int:
    """Tokens a follow-up computes on top of what it reuses (for the break-even): the new user tokens plus the
    part of the previous context its prompt does not repeat, plus the one token vLLM always computes."""
    h = workload.history
    if h == "prompt_only":
        return int(round(user_tokens + output_tokens)) + 1
    if h == "partial":
        share = float(workload.history_kept_share if workload.history_kept_share is not None else 1.0)
        return int(round(user_tokens + (1.0 - share) * prev_context)) + 1
    return int(round(user_tokens)) + 1


def history_assumption(workload: Workload) -> str:
    """One sentence naming the history assumption a run or a recommendation used."""
    h = workload.history or "verbatim"
    if workload.trace is not None and _is_weka(workload.trace.path, workload.trace.format):
        extra = f"; workload.history {h} caps it further" if workload.history not in (None, "verbatim") else ""
        return ("History: the weka trace's hash prefixes decide what each prompt repeats of the previous context "
                f"(longest common prefix of hash_ids, plus the previous output where the context was extended){extra}.")
    text = {
        "verbatim": "the whole previous context (prompt and output) is repeated token for token",
        "prompt_only": "only the previous prompt is repeated token for token; the previous output is recomputed",
        "partial": f"the first {workload.history_kept_share} of the previous context is repeated token for token",
    }[h]
    return f"History (workload.history = {h}): {text}."


def _is_weka(path: str, fmt: str | None) -> bool:
    """Whether a trace source is (or is detected as) the weka format."""
    if fmt is not None:
        return fmt == "weka"
    from kvplan.errors import KvplanInputError
    from kvplan.traces.readers import detect_trace_format

    try:
        return detect_trace_format(path) == "weka"
    except KvplanInputError:
        return False
