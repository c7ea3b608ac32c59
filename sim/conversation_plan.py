"""The plan of a run: every conversation's turns, tokens, gaps and arrivals, drawn or read before it starts.

:func:`kvplan.sim.workload.make_plan` draws it from a synthetic workload, :func:`kvplan.sim.workload.plan_from_trace`
and :func:`kvplan.sim.weka_plan.plan_from_weka` read it from a trace; the driver and the nodes only read it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class ConversationPlan:
    """All conversations of a run, drawn up front. Per-turn arrays are flat, indexed via ``offsets``.

    ``prompt_tokens[offsets[c] + k]`` is conversation ``c``'s turn ``k+1`` prompt (prefix on turn 1, then
    previous prompt + previous output + new user tokens: the whole grown context is resent).
    ``start_s`` is each conversation's first arrival (open loop) or NaN (closed loop).
    """

    start_s: np.ndarray
    turns: np.ndarray
    offsets: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    gap_s: np.ndarray
    truncated_conversations: int
    arrival_s: np.ndarray | None = None  # per-turn arrival times (trace replay: open loop on the trace clock)
    trace_report: dict[str, Any] | None = None
    # per turn: tokens of the previous turn's context (prompt + output) the prompt repeats token for token
    # (sim/history.py); None = all of it (verbatim history)
    reuse_tokens: np.ndarray | None = None
    # per conversation: its shared-prefix group (-1: none) and its tokens of that prefix (sim/shared.py)
    shared_group: np.ndarray | None = None
    shared_tokens: np.ndarray | None = None

    @property
    def total_turns(self) -> int:
        """Number of turns in the plan."""
        return int(self.turns.sum())
