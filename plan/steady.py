"""Does a run show the steady state its answer claims? The check ``capacity`` and ``compare`` apply before they trust
a candidate that meets the SLO, and the longer run they use when it does not.

A planner simulates each candidate for the scenario's arrival horizon (its conversations / rate). That run can
meet a TTFT SLO and still say nothing about the deployment: at a load near or over capacity the queue is still
growing when the run ends (an engine busy over 99% of the window, its TTFT p90 ~1 s after 100 s and ~29 s after
400 s), and with retention on, D's pool fills with pins only once the run is longer than the TTL plus a
conversation's span. Two signs, both read from the run itself (:func:`kvplan.plan.executor.run_extras`):

* **TTFT still growing** over the steady window (the second half of the arrivals, ``sim/health.py``): the mean
  TTFT of turns arriving in its second half above :data:`GROWTH_RATIO` x that of its first half plus
  :data:`GROWTH_MIN_S` (a queue in steady state has no trend; a transient or an overload has one);
* **retention not in steady state**: bidirectional on and the arrival span shorter than the TTL plus the p90
  conversation span (``run_extras``' definition: until then pins only accumulate).

Every candidate whose first run meets the SLO goes to one longer run (:func:`judging_conversations`:
:data:`EXTEND_FACTOR` x the conversations at the same rate, or enough for twice TTL + span of arrivals, at most
:data:`MAX_CONVERSATIONS`) and is judged on that run; the two signs are reported with the answer (``first_run_*``),
not used as the trigger: near utilisation 1 the TTFT trend over a 100 s window is too weak to tell a transient from
an overload, and an aggregated engine's busy share is no load measure (it steps while any request decodes).
ASSUMPTIONS (of this check, not of the model): the two thresholds, and that a run 4x longer shows what a transient
hid (a load within a few percent of capacity can still pass a 4x run and miss a 16x one: the answer then holds for
runs of that length, and the plan says which length judged it). A trace replay keeps its own clock and is not
extended (its answers say so).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from kvplan.sim.scenario import Scenario

MAX_CONVERSATIONS = 200_000  # bound on one run when the rate or the judging run grows
GROWTH_RATIO = 1.5
GROWTH_MIN_S = 0.05
EXTEND_FACTOR = 4
FIRST_KEY, SECOND_KEY = "steady_ttft_mean_first_s", "steady_ttft_mean_second_s"


def _num(m: Mapping[str, Any], key: str) -> float:
    v = m.get(key)
    return float(v) if v is not None else math.nan


def growing(m: Mapping[str, Any]) -> bool:
    """True when the mean TTFT of the steady window's second half exceeds its first half's by the margin."""
    first, second = _num(m, FIRST_KEY), _num(m, SECOND_KEY)
    return math.isfinite(first) and math.isfinite(second) and second > GROWTH_RATIO * first + GROWTH_MIN_S


def retention_unsteady(m: Mapping[str, Any]) -> bool:
    """True when retention is on and the arrivals end before TTL + p90 conversation span (``retention_steady`` 0)."""
    v = m.get("retention_steady")
    return v is not None and math.isfinite(float(v)) and float(v) < 1.0


def longer_conversations(conversations: int, rate_per_s: float | None, ttl_s: float, span_p90_s: float,
                         cap: int = MAX_CONVERSATIONS) -> int:
    """Conversations of the longer run: ``EXTEND_FACTOR`` x, and at ``rate_per_s`` enough for ``2 (TTL + span)`` of
    arrivals, at most ``cap``."""
    n = EXTEND_FACTOR * conversations
    if rate_per_s and math.isfinite(ttl_s + span_p90_s):
        n = max(n, math.ceil(rate_per_s * 2 * (ttl_s + span_p90_s)))
    return int(min(max(n, conversations), cap))


def judging_span_s(rows: Sequence[Mapping[str, Any]]) -> float:
    """The p90 conversation span a judging run is sized with: the mean over a candidate's successful replications
    (NaN when none has one). One rule for ``recommend``, ``compare`` and ``capacity`` (its metrics are means), so that
    the same deployment is judged on the same number of conversations by each (compare took the largest, recommend
    the mean: 770 against 746 conversations for one deployment)."""
    spans = [float(r["conversation_span_p90_s"]) for r in rows
             if r.get("error") is None and r.get("conversation_span_p90_s") is not None]
    spans = [x for x in spans if math.isfinite(x)]
    return sum(spans) / len(spans) if spans else math.nan


def judging_conversations(sc: Scenario, span_p90_s: float) -> int:
    """Conversations of the run that judges scenario ``sc`` (its first run's p90 conversation span ``span_p90_s``):
    :func:`longer_conversations` at its rate, with its TTL when retention is on (P/D with bidirectional)."""
    ttl = sc.policy.decoder_kv_blocks_ttl_s if sc.policy.bidirectional and sc.deployment.mode != "aggregated" else 0.0
    rate = getattr(sc.workload.arrival, "rate_per_s", None)
    return longer_conversations(sc.workload.conversations, rate, ttl, span_p90_s if math.isfinite(span_p90_s) else 0.0)
