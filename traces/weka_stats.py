"""Agentic statistics of a weka trace (``kvplan workload show`` on AgentX / kv-cache-tester files).

Per session: requests, the hash-prefix reuse share (tokens of each prompt that repeat the previous request's
context, :func:`kvplan.traces.weka.reuse_tokens`, over all prompt tokens after the first), compactions.
Over the trace: think-time (idle gap) percentiles, context growth per request, compaction events (a request
whose shared prefix with the previous one is below half of the previous prompt, as in the issue that asked
for them), sub-agents and the shared tool + system prefix.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kvplan.traces.stats import percentile_summary
from kvplan.traces.weka import WEKA_BLOCK_TOKENS, WekaTrace, session_reuse

#: A request whose shared prefix with the previous request is below this share of the previous prompt compacted.
COMPACTION_SHARE = 0.5


def weka_stats(tr: WekaTrace) -> dict[str, Any]:
    """The statistics (plain data; module docstring)."""
    reuse, lcp = session_reuse(tr)
    reuse0, _ = session_reuse(tr, with_output=False)
    n_in = tr.input_tokens
    first = np.ones(tr.n_requests, dtype=bool)
    first[1:] = tr.session[1:] != tr.session[:-1]
    follow = ~first
    prev_in = np.r_[0, n_in[:-1]]
    compaction = follow & (lcp * WEKA_BLOCK_TOKENS < COMPACTION_SHARE * prev_in)
    growth = (n_in - prev_in)[follow & ~compaction]
    sessions = []
    for s, info in enumerate(tr.sessions):
        m = tr.session == s
        f = m & follow
        sessions.append({
            "session": info.name, "subagent": info.parent >= 0, "requests": int(m.sum()),
            "start_s": info.start_s, "shared_prefix_tokens": info.shared_tokens,
            "first_input_tokens": int(n_in[m][0]) if m.any() else 0,
            "max_input_tokens": int(n_in[m].max()) if m.any() else 0,
            "reuse_share": float(reuse[f].sum() / n_in[f].sum()) if f.any() and n_in[f].sum() else float("nan"),
            "compactions": int((compaction & m).sum()),
        })
    share = np.asarray([s["reuse_share"] for s in sessions], dtype=float)
    return {
        "files": len(tr.files), "sessions": len(tr.sessions),
        "subagent_sessions": sum(1 for s in tr.sessions if s.parent >= 0), "requests": tr.n_requests,
        "reuse_share": float(reuse[follow].sum() / max(n_in[follow].sum(), 1)),
        "reuse_share_without_output": float(reuse0[follow].sum() / max(n_in[follow].sum(), 1)),
        "session_reuse_share": percentile_summary(share[np.isfinite(share)]),
        "think_time_s": percentile_summary(tr.think_s[follow]),
        "input_tokens": percentile_summary(n_in),
        "first_input_tokens": percentile_summary(n_in[first]),
        "output_tokens": percentile_summary(tr.output_tokens),
        "growth_tokens_per_request": percentile_summary(growth),
        "compactions": int(compaction.sum()),
        "compaction_kept_tokens": percentile_summary((lcp * WEKA_BLOCK_TOKENS)[compaction]),
        "shared_prefix_tokens": percentile_summary(np.asarray([s.shared_tokens for s in tr.sessions])),
        "per_session": sessions,
    }


def _p(d: Mapping[str, Any], key: str, digits: int = 0) -> str:
    v = d.get(key)
    return "n/a" if v is None or (isinstance(v, float) and not np.isfinite(v)) else f"{v:,.{digits}f}"


def weka_table(st: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Rows (label, value) for the CLI table."""
    def pct(name: str, d: Mapping[str, Any], digits: int = 0) -> tuple[str, str]:
        return name, " / ".join(_p(d, k, digits) for k in ("p10", "p50", "p90", "p99"))

    rows = [
        ("sessions (sub-agents) / requests", f"{st['sessions']} ({st['subagent_sessions']}) / {st['requests']:,}"),
        ("hash-prefix reuse share of follow-up prompts (without the previous output)",
         f"{st['reuse_share']:.1%} ({st['reuse_share_without_output']:.1%})"),
        pct("per-session reuse share p10 / p50 / p90 / p99 (%)",
            {k: 100 * v for k, v in st["session_reuse_share"].items() if isinstance(v, float)}, 1),
        pct("think time (idle gap) p10 / p50 / p90 / p99 (s)", st["think_time_s"], 1),
        pct("input tokens p10 / p50 / p90 / p99", st["input_tokens"]),
        pct("first-request input tokens p10 / p50 / p90 / p99", st["first_input_tokens"]),
        pct("context growth per request p10 / p50 / p90 / p99 (tokens)", st["growth_tokens_per_request"]),
        pct("output tokens p10 / p50 / p90 / p99", st["output_tokens"]),
        ("compaction events (shared prefix < half the previous prompt)", f"{st['compactions']:,}"),
        pct("tokens kept by a compaction p10 / p50 / p90 / p99", st["compaction_kept_tokens"]),
        pct("tool + system tokens per session p10 / p50 / p90 / p99", st["shared_prefix_tokens"]),
    ]
    return rows


def coding_agent_fit(tr: WekaTrace) -> dict[str, Any]:
    """The ``coding-agent`` preset's parameters from an AgentX sample (``kvplan.sim.presets`` holds the values
    for the shared 50-trace sample; ``benchmarks/derive_agentx_preset.py`` prints them, a test re-derives them).

    Lognormals are given by (p50, p90) as the other presets: idle gaps after a tool result and after a user
    message (``input_types``) with their shares; the first request's input; the new tokens of a follow-up
    (``in - previous in - previous out``, compactions left out, negative values counted as 0); outputs. Turns
    per session are the sessions' request counts; the shared prefix is the median ``tool_tokens`` (the system
    prompt carries per-session details and is not shared across sessions).
    """
    reuse, lcp = session_reuse(tr)
    first = np.ones(tr.n_requests, dtype=bool)
    first[1:] = tr.session[1:] != tr.session[:-1]
    follow = ~first
    prev_in = np.r_[0, tr.input_tokens[:-1]]
    prev_out = np.r_[0, tr.output_tokens[:-1]]
    compaction = follow & (lcp * WEKA_BLOCK_TOKENS < COMPACTION_SHARE * prev_in)
    user = np.maximum(tr.input_tokens - prev_in - prev_out, 0)[follow & ~compaction]
    tool = tr.tool_result if tr.tool_result is not None else np.ones(tr.n_requests, dtype=bool)
    gaps_tool, gaps_user = tr.think_s[follow & tool], tr.think_s[follow & ~tool]

    def p50_p90(x: np.ndarray) -> tuple[float, float]:
        return float(np.percentile(x, 50)), float(np.percentile(x, 90))

    return {
        "tool_gap_share": float(len(gaps_tool) / max(int(follow.sum()), 1)),
        "tool_gap_p50_p90_s": p50_p90(gaps_tool), "user_gap_p50_p90_s": p50_p90(gaps_user),
        "first_prompt_p50_p90": p50_p90(tr.input_tokens[first]), "new_tokens_p50_p90": p50_p90(user),
        "output_p50_p90": p50_p90(tr.output_tokens),
        "turns": sorted(np.bincount(tr.session, minlength=len(tr.sessions)).tolist()),
        "shared_prefix_tokens": int(np.median([s.prefix_key[0] for s in tr.sessions])),
        "compaction_share": float(compaction.sum() / max(int(follow.sum()), 1)),
        "reuse_share": float(reuse[follow].sum() / max(int(tr.input_tokens[follow].sum()), 1)),
    }
