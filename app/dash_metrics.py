"""Headline metrics of the dashboard (pure: no Streamlit): values scaled for people, deltas and their colours."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

# --- headline metrics (pure) --------------------------------------------------------------------------------


DeltaColour = Literal["normal", "inverse", "off"]


@dataclass(frozen=True)
class Metric:
    """One ``st.metric``: label, value text, delta text (or ``None``), colour rule and help."""

    label: str
    value: str
    delta: str | None
    delta_color: DeltaColour
    help: str


def _number(v: Any) -> float:
    """A summary figure as a float, NaN when missing (``None``) or not a number."""
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else math.nan


def _delta(cur: float, base: float, unit: str, scale: float, digits: int) -> str | None:
    if not (math.isfinite(cur) and math.isfinite(base)):
        return None
    d = (cur - base) * scale
    if abs(d) < 0.5 * 10**-digits:
        return None
    return f"{d:+,.{digits}f} {unit}".rstrip()


#: What ``kvplan simulate`` prints for the hit and reuse rates of a run without a follow-up turn.
NO_FOLLOW_UPS = "n/a (no follow-up turns)"


def has_follow_ups(summary: Mapping[str, Any]) -> bool:
    """Whether the run had a follow-up turn, i.e. whether its hit and reuse rates are defined (``summary.json``
    says 0.0 for both when there was none)."""
    return summary.get("follow_up_turns") != 0


def rate_text(summary: Mapping[str, Any], key: str) -> str:
    """``hit_rate`` or ``reuse_rate`` as the CLI prints it: a percentage, or :data:`NO_FOLLOW_UPS`."""
    return f"{float(summary[key]):.1%}" if has_follow_ups(summary) else NO_FOLLOW_UPS


def headline_metrics(current: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[Metric]:
    """Headline metrics of ``current`` with their change against ``defaults`` (the vLLM-defaults run).

    TTFT, TPOT, errors and pinned HBM: lower is better (inverse colours); hit and reuse rates: higher is better.
    A figure the run has not (``None``, e.g. TPOT when every output is one token) reads 'n/a'.
    """
    spec: list[tuple[str, str, str, float, int, DeltaColour, str]] = [
        ("TTFT p50", "ttft_p50_s", "ms", 1000.0, 1, "inverse", "Median time to first token (turns without error)."),
        ("TTFT p90", "ttft_p90_s", "ms", 1000.0, 1, "inverse", "90th percentile TTFT (turns without error)."),
        ("TTFT mean", "ttft_mean_s", "ms", 1000.0, 1, "inverse", "Mean TTFT (turns without error)."),
        ("TPOT mean", "tpot_mean_s", "ms", 1000.0, 1, "inverse",
         "Mean time per output token after the first, (last token - first token) / (output tokens - 1), as vLLM's "
         "benchmark_serving measures it (turns without error and with more than one output token)."),
        ("TPOT p90", "tpot_p90_s", "ms", 1000.0, 1, "inverse", "90th percentile TPOT (summary.json tpot_p90_s)."),
        ("Hit rate", "hit_rate", "pp", 100.0, 1, "normal",
         "Follow-up turns whose previous context was still held (decision pull, local or recompute_below_threshold; "
         "summary.json hit_rate). A hit below the threshold recomputes: it reuses nothing unless P has it cached."),
        ("Reuse rate", "reuse_rate", "pp", 100.0, 1, "normal",
         "Follow-up turns that reused any KV of their context: a local prefix hit on P or a pull (summary.json "
         "reuse_rate), whatever the decision was."),
        ("Errors", "errors", "", 1.0, 0, "inverse", "Turns failed by kv_load_failure_policy=fail (declined reads)."),
        ("Pinned decode KV mean", "pinned_kv_gib_mean", "GiB", 1.0, 1, "inverse",
         "Time-weighted mean decode HBM held by retention, all decode nodes."),
        ("Pinned decode KV peak", "pinned_kv_gib_peak", "GiB", 1.0, 1, "inverse", "Peak decode HBM held by retention."),
    ]
    out = []
    for label, key, unit, scale, digits, colour, help_text in spec:
        cur, base = _number(current.get(key)), _number(defaults.get(key))
        if key in ("hit_rate", "reuse_rate") and not has_follow_ups(current):
            # no follow-up turn: no rate (summary.json keeps its 0.0, a number by contract), as the CLI prints it
            out.append(Metric(label, NO_FOLLOW_UPS, None, colour, help_text))
            continue
        if key in ("hit_rate", "reuse_rate"):
            value = f"{cur:.1%}" if math.isfinite(cur) else "n/a"
        elif not math.isfinite(cur):
            value = "n/a"
        else:
            value = f"{cur * scale:,.{digits}f} {unit}".rstrip()
        delta = _delta(cur, base, unit, scale, digits)
        if unit == "ms":
            # times of a second and more scaled for people (s, min, h), like the CLI
            from kvplan.units import human_s

            if math.isfinite(cur) and cur >= 1.0:
                value = human_s(cur)
            if delta is not None and abs(cur - base) >= 1.0:
                delta = ("+" if cur > base else "") + human_s(cur - base)
        out.append(Metric(label, value, delta, colour, help_text))
    return out


# --- what the CLI prints after its table (pure) ----------------------------------------------------------------------

def context_limit_lines(summary: Mapping[str, Any]) -> list[str]:
    """The workload cut at the model's context limit, as ``kvplan simulate`` says it: conversations ended early
    (its ``note:`` line) and trace requests skipped or truncated (the ``select:`` line it logs)."""
    out = []
    trace = summary.get("trace") or {}
    limit = trace.get("max_context_tokens")
    for key, verb in (("skipped_overlong", "skipped"), ("truncated_overlong", "truncated")):
        n = int(trace.get(key) or 0)
        if n:
            over = f" over {int(limit):,} tokens" if isinstance(limit, int) else ""
            out.append(f"{n:,} trace request(s){over} were {verb} (the model's context limit)")
    if summary.get("truncated_conversations"):
        out.append(f"{summary['truncated_conversations']} conversations ended early at the model's context limit")
    return out


def no_effect_lines(notes: Sequence[str]) -> list[str]:
    """The run's notes about settings it ignored (``sim.api.NO_EFFECT``), which ``kvplan simulate`` prints as
    warnings whatever ``--verbose`` says (the other notes are assumptions, listed on request)."""
    from kvplan.sim.api import NO_EFFECT

    return [n for n in notes if n.startswith(NO_EFFECT)]


def run_notes(summary: Mapping[str, Any]) -> list[str]:
    """The notes ``kvplan simulate`` prints after its table about how the numbers were made: trace requests with
    0 tokens replayed with 1, trace rows replayed sorted, percentiles from the quantile sketch."""
    out = []
    trace = summary.get("trace") or {}
    for key, n in sorted(trace.items()):
        if key.endswith("_zero_replayed_as_1") and n:
            out.append(f"{n:,} trace requests with {key.removesuffix('_zero_replayed_as_1')} 0 were replayed with 1 "
                       "(a request has at least one prompt and one generated token)")
    if trace.get("rows_out_of_order_sorted"):
        out.append(f"{trace['rows_out_of_order_sorted']:,} trace rows were earlier than the row before them; the trace "
                   "was replayed sorted by arrival")
    if summary.get("percentile_method") == "sketch":
        out.append(f"percentiles: quantile sketch, within {summary.get('percentile_relative_error', 0.0):.1%} relative")
    return out
