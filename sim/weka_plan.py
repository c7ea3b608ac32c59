"""Replay plan of a ``weka`` trace (AgentX / Weka kv-cache-tester coding-agent sessions, :mod:`kvplan.traces.weka`).

Every session (a file's main agent, and each sub-agent) is its own conversation; its requests are turns in
order. Timing (``workload.trace.timing``):

* ``think`` (default, the kv-cache-tester replay's default): a conversation starts at its session's start
  on the file's clock (0 for a main agent, the marker's ``t`` for a sub-agent, every file at 0) and each next
  request arrives ``think_time`` after the previous answer (open loop per conversation, ``turn_gap_s``);
* ``original``: every request at its recorded ``t`` (session start + ``t``), independent of responses.

Sizes are ``in`` / ``out``. A request's reuse of the previous request's KV is the longest common prefix of
their ``hash_ids`` (64-token blocks), plus the previous output where the hashes show the context was
extended (:func:`kvplan.traces.weka.reuse_tokens`); the simulator counts it in the model's full blocks.
Requests with ``in + out`` above the context limit are skipped or truncated (``overlong``) and counted;
reuse and gaps then refer to the previous *kept* request (a skipped request's think and API time are added
to the next gap). ``sample_sessions`` keeps whole files (a main agent with its sub-agents), drawn from the
seed; ``time_scale`` divides every start, gap and arrival; ``window_s`` is refused (sessions would be cut).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from kvplan.errors import input_error
from kvplan.sim.conversation_plan import ConversationPlan
from kvplan.sim.scenario import MAX_SIM_TIME_S, MAX_TOTAL_TURNS, TraceSource
from kvplan.traces.select import overlong_message
from kvplan.traces.weka import WEKA_BLOCK_TOKENS, WekaTrace, lcp_blocks, read_weka, reuse_tokens

log = logging.getLogger(__name__)


def _kept_files(tr: WekaTrace, fraction: float | None, seed: int) -> np.ndarray:
    """Per session: kept by ``sample_sessions`` (whole files, ``default_rng(seed)``)."""
    files = sorted({s.file for s in tr.sessions})
    if fraction is None:
        return np.ones(len(tr.sessions), dtype=bool)
    k = max(1, round(fraction * len(files)))
    chosen = {files[i] for i in np.random.default_rng(seed).permutation(len(files))[:k].tolist()}
    return np.asarray([s.file in chosen for s in tr.sessions], dtype=bool)


class _Builder:
    """Walks the requests of each session, applying the context limit, and collects the plan's arrays."""

    def __init__(self, tr: WekaTrace, max_len: int, overlong: str) -> None:
        self.tr, self.max_len, self.overlong = tr, max_len, overlong
        self.prompt: list[int] = []
        self.out: list[int] = []
        self.reuse: list[int] = []
        self.reuse_no_out: list[int] = []
        self.gap_before: list[float] = []
        self.t: list[float] = []
        self.turns: list[int] = []
        self.session_of: list[int] = []
        self.skipped = self.truncated = 0

    def session(self, s: int, idx: list[int]) -> None:
        tr = self.tr
        n_in, n_out = tr.input_tokens, tr.output_tokens
        prev: tuple[int, int, np.ndarray] | None = None
        pending = 0.0  # think + API time of skipped requests, added to the next gap
        count = 0
        for i in idx:
            p, o = int(n_in[i]), int(n_out[i])
            ids = tr.ids(i)
            if p + o > self.max_len:
                if self.overlong == "skip":
                    self.skipped += 1
                    pending += float(tr.think_s[i]) + float(tr.api_s[i])
                    continue
                self.truncated += 1
                p = min(p, max(1, self.max_len - o))  # as traces.select: the input first, then the output
                o = min(o, self.max_len - p)
                ids = ids[: p // WEKA_BLOCK_TOKENS]
            if prev is None:
                r = r0 = 0
            else:
                k = lcp_blocks(prev[2], ids)
                r = reuse_tokens(prev[0], prev[1], p, k, len(prev[2]))
                r0 = reuse_tokens(prev[0], prev[1], p, k, len(prev[2]), with_output=False)
            self.prompt.append(max(p, 1))
            self.out.append(max(o, 1))
            self.reuse.append(r)
            self.reuse_no_out.append(r0)
            self.gap_before.append(pending + float(tr.think_s[i]))
            self.t.append(float(tr.t_s[i]))
            pending = 0.0
            prev = (p, o, ids)
            count += 1
        if count:
            self.turns.append(count)
            self.session_of.append(s)


def plan_from_weka(source: TraceSource, seed: int, max_model_len: int) -> ConversationPlan:
    """The replay plan of a weka trace file or directory (module docstring); counts in ``trace_report``."""
    where = f"workload.trace '{source.path}'"
    if source.window_s is not None:
        raise input_error(f"{where}: window_s", "is not supported for format weka (it would cut sessions)",
                          "use sample_sessions or a folder with fewer files")
    tr = read_weka(source.path)
    keep = _kept_files(tr, source.sample_sessions, seed)
    b = _Builder(tr, max_model_len, source.overlong)
    bounds = np.flatnonzero(np.r_[True, tr.session[1:] != tr.session[:-1], True])
    for lo, hi in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        s = int(tr.session[lo])
        if keep[s]:
            b.session(s, list(range(lo, hi)))
    if not b.prompt:
        raise input_error(where, "no request left after sampling and the context limit",
                          "set overlong: truncate or use a model with a longer max_model_len")
    if b.skipped or b.truncated:  # said as traces.select says it for the other formats, not only counted
        log.warning("%s", overlong_message(b.skipped + b.truncated, len(b.prompt) + b.skipped, max_model_len,
                                           source.overlong))
    if len(b.prompt) > MAX_TOTAL_TURNS:
        raise input_error(where, f"{len(b.prompt):,} requests (more than {MAX_TOTAL_TURNS:,})", "replay fewer files")
    turns = np.asarray(b.turns, dtype=np.int64)
    offsets = np.zeros(len(turns) + 1, dtype=np.int64)
    np.cumsum(turns, out=offsets[1:])
    scale = float(source.time_scale)
    sess_start = np.asarray([tr.sessions[s].start_s for s in b.session_of], dtype=float)
    t = np.asarray(b.t, dtype=float)
    first = offsets[:-1]
    start = (sess_start + t[first]) / scale
    gap_before = np.asarray(b.gap_before, dtype=float) / scale
    gap = np.zeros(len(t))
    gap[:-1] = gap_before[1:]  # gap_s[i]: after turn i, before turn i + 1 of the same conversation
    gap[offsets[1:] - 1] = 0.0
    timing = source.timing or "think"
    arrival = (np.repeat(sess_start, turns) + t) / scale if timing == "original" else None
    span = float(np.max(arrival)) if arrival is not None else float(np.max(start + np.bincount(
        np.repeat(np.arange(len(turns)), turns), weights=gap, minlength=len(turns))))
    if not span <= MAX_SIM_TIME_S:
        raise input_error(where, f"arrivals span {span:.3g} s (more than {MAX_SIM_TIME_S:.0e} s of simulated time)",
                          "raise time_scale")
    prompt = np.asarray(b.prompt, dtype=np.int64)
    reuse = np.asarray(b.reuse, dtype=np.int64)
    report = _report(tr, b, source, prompt, reuse, np.asarray(b.reuse_no_out, dtype=np.int64), first, timing)
    report["max_context_tokens"] = max_model_len  # the limit the overlong counts are against (as traces.select)
    group = shared = None
    if source.shared_prefix:
        group, shared = _shared_prefix(tr, b.session_of, prompt[first])
        report["shared_prefix_groups"] = int(np.unique(group).size)
    return ConversationPlan(
        start_s=start, turns=turns, offsets=offsets, prompt_tokens=prompt,
        output_tokens=np.asarray(b.out, dtype=np.int64), gap_s=gap, truncated_conversations=0,
        arrival_s=arrival, trace_report=report, reuse_tokens=reuse, shared_group=group, shared_tokens=shared,
    )


def _shared_prefix(tr: WekaTrace, session_of: list[int], first_prompt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per conversation: its group (sessions with equal tool_tokens and system_tokens; an ASSUMPTION: the hashes
    are local to a file, so equal counts stand for equal tool definitions and system prompt) and its shared
    tokens (tool + system, within its first prompt)."""
    keys: dict[tuple[int, int], int] = {}
    group = np.asarray([keys.setdefault(tr.sessions[s].prefix_key, len(keys)) for s in session_of], dtype=np.int64)
    tokens = np.asarray([tr.sessions[s].shared_tokens for s in session_of], dtype=np.int64)
    return group, np.minimum(tokens, first_prompt)


def _report(tr: WekaTrace, b: _Builder, source: TraceSource, prompt: np.ndarray, reuse: np.ndarray,
            reuse0: np.ndarray, first: np.ndarray, timing: str) -> dict[str, Any]:
    """What was read, kept and counted; the hash bounds of the recomputed tokens."""
    follow = np.ones(len(prompt), dtype=bool)
    follow[first] = False
    return {
        "format": "weka", "source": tr.source, "sha256": tr.sha256, "files": len(tr.files), "timing": timing,
        "input_requests": tr.n_requests, "input_sessions": len(tr.sessions),
        "subagent_sessions": sum(1 for s in tr.sessions if s.parent >= 0),
        "time_scale": float(source.time_scale), "sample_sessions": source.sample_sessions,
        "overlong": source.overlong, "skipped_overlong": b.skipped, "truncated_overlong": b.truncated,
        "requests_replayed": len(prompt), "sessions_replayed": len(b.turns),
        # every follow-up's uncached tokens when the previous context is reused as the hashes say, with and
        # without the previous output (the lower and upper bounds of the tokens recomputed at an unlimited TTL)
        "hash_recompute_tokens": {
            "with_previous_output": int((prompt - np.minimum(reuse, prompt - 1))[follow].sum() + prompt[~follow].sum()),
            "without_previous_output": int((prompt - np.minimum(reuse0, prompt - 1))[follow].sum()
                                           + prompt[~follow].sum()),
        },
        "prompt_tokens": int(prompt.sum()),
    }
