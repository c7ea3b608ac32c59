"""Terminal rendering shared by the commands (rich tables; JSON when asked)."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from kvplan.sim.results import Result, summary_json_bytes
from kvplan.sim.summary import profile_label
from kvplan.units import human_s


def console() -> Console:
    """A console on stdout that does not wrap or colour when piped."""
    # piped output (CI logs, files) gets a wide fixed width instead of rich's 80 columns
    return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)


def fmt_s(x: Any) -> str:
    """Seconds as text scaled for humans (see :func:`human_s`)."""
    return human_s(x)


TTFT_KEYS = ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s")

#: (upper bound of the column's largest value in seconds, factor, unit, decimals): :func:`human_s`'s steps.
_SECOND_UNITS = ((1.0, 1000.0, "ms", 1), (120.0, 1.0, "s", 2), (7200.0, 1 / 60, "min", 1), (math.inf, 1 / 3600, "h", 1))
#: At most this many decimals beyond a column's base precision, to keep its smallest value's leading digits.
_EXTRA_DECIMALS = 3


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


def _keep_smallest(decimals: int, values: list[float], significant: int = 2) -> int:
    """``decimals``, raised (by at most :data:`_EXTRA_DECIMALS`) so that the smallest non-zero magnitude of ``values``
    keeps ``significant`` digits."""
    nonzero = [abs(v) for v in values if v != 0]
    if not nonzero:
        return decimals
    need = significant - 1 - math.floor(math.log10(min(nonzero)))
    return max(decimals, min(need, decimals + _EXTRA_DECIMALS))


def seconds_column(values: Sequence[Any]) -> list[str]:
    """Seconds of one table column, in one unit and one precision: the unit :func:`human_s` gives the column's largest
    value (ms, s, min, h) with its decimals (more when the smallest value would lose its leading digits); 'n/a' for a
    missing or non-finite value. A column mixing '895.0 ms' and '2.76 s' read as two precisions."""
    finite = [float(v) for v in values if _finite(v)]
    if not finite:
        return ["n/a" for _ in values]
    top = max(abs(v) for v in finite)
    _, factor, unit, decimals = next(u for u in _SECOND_UNITS if top < u[0])
    decimals = _keep_smallest(decimals, [v * factor for v in finite])
    return [f"{float(v) * factor:.{decimals}f} {unit}" if _finite(v) else "n/a" for v in values]


def number_column(values: Sequence[Any]) -> list[str]:
    """Numbers of one table column at one precision: none when every value is whole, else enough decimals for four
    significant digits of the largest (0-3), more when the smallest would lose its leading digits; 'n/a' for a
    missing or non-finite value."""
    finite = [float(v) for v in values if _finite(v)]
    if not finite:
        return ["n/a" for _ in values]
    if all(v.is_integer() for v in finite):
        decimals = 0
    else:
        top = max(abs(v) for v in finite)
        decimals = min(max(3 - math.floor(math.log10(top)), 0), 3) if top > 0 else 0
        decimals = _keep_smallest(decimals, finite)
    return [f"{float(v):.{decimals}f}" if _finite(v) else "n/a" for v in values]


AXIS_SIGNIFICANT = 12  # an axis value is shown to this many significant digits (a computed 0.1 + 0.2 reads 0.3)
AXIS_MAX_DECIMALS = 15


def _decimals(v: float, cap: int = AXIS_MAX_DECIMALS) -> int:
    """Decimals of the shortest positional text of ``v`` at :data:`AXIS_SIGNIFICANT` significant digits (at most
    ``cap``): 1e-07 needs 7 ('0.0000001'), where its repr's exponent made it '0.000000' at a fixed 6."""
    import numpy as np

    text = np.format_float_positional(float(f"{float(v):.{AXIS_SIGNIFICANT}g}"), trim="-")
    _, _, frac = text.partition(".")
    return min(len(frac), cap)


def axis_column(values: Sequence[Any]) -> list[str]:
    """A sweep axis's values as one column: numbers with a fraction all at the most decimals any of them needs
    ('0.50', '60.25', '480.00'), anything else as written."""
    real = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool) and _finite(v)]
    if len(real) != len(values) or all(float(v).is_integer() for v in real):
        return [str(v) for v in values]
    decimals = max(_decimals(float(v)) for v in real)
    return [f"{float(v):.{decimals}f}" for v in real]


def print_summary(
    result: Result, out: Path | None, as_json: bool = False, verbose: bool = False, files: list[str] | None = None
) -> None:
    """Headline metrics, the health findings (saturation, failures) and, with ``verbose``, the assumptions."""
    s = result.summary
    if as_json:
        sys.stdout.write(summary_json_bytes(s).decode())
        return
    c = console()
    t = Table(title=f"kvplan simulate: {s['model']} on {s['hardware']} ({profile_label(s)})")
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [
        ("turns (failed)", f"{s['turns']} ({s['errors']})"),
        ("TTFT mean / p50 / p90 / p99", " / ".join(fmt_s(s[k]) for k in TTFT_KEYS)),
        # a router hit: the follow-up's context was still held (D's pin or P's cache); how much of it the prompt
        # could reuse is the tokens row (workload.history may leave none valid)
        # no follow-up turn: no rate (summary.json keeps its 0.0, a number by contract)
        ("hit rate (follow-ups whose context was still held)",
         "n/a (no follow-up turns)" if s.get("follow_up_turns") == 0 else f"{s['hit_rate']:.1%}"),
        ("reuse rate (follow-ups that reused KV: local hit or pull)",
         "n/a (no follow-up turns)" if s.get("follow_up_turns") == 0 else f"{s['reuse_rate']:.1%}"),
        # a first turn has nothing retained: 'miss 40' on 40 conversations read as 40 failures
        ("decisions per turn (miss: nothing retained, as on every first turn)",
         ", ".join(f"{k} {v}" for k, v in s["decisions"].items() if v)),
        ("prompt tokens pulled / computed / local-hit",
         f"{s['pulled_tokens']:,} / {s['recomputed_tokens']:,} / {s['local_hit_tokens']:,}"),
        ("D->P bytes (retained KV read back) / P->D (prompt KV to D)",
         f"{s['d2p_bytes'] / 2**30:.2f} GiB / {s['p2d_bytes'] / 2**30:.2f} GiB"),
        ("pinned decode KV mean / peak", f"{s['pinned_kv_gib_mean']:.2f} / {s['pinned_kv_gib_peak']:.2f} GiB"),
        ("decode KV capacity (all D nodes)", f"{s['decode_kv_capacity_gib']:.0f} GiB"),
        ("prefill utilisation (busy share, whole run)", f"{s['prefill_utilization']:.1%}"),
    ]
    if s.get("tpot_mean_s") is not None:
        tpot = " / ".join(fmt_s(s.get(k)) for k in ("tpot_mean_s", "tpot_p50_s", "tpot_p90_s"))
        rows.insert(2, ("TPOT mean / p50 / p90", tpot))
    steady = s.get("prefill_utilization_steady_max")
    if steady is not None and s.get("steady_window_start_s") is not None:  # what health judges P on (a closed loop
        # has no steady window: the whole-run figure is its figure)
        rows.append(("prefill utilisation, steady window (busiest P; health judges this)", f"{min(steady, 1.0):.1%}"))
    if "d_preemptions" in s:
        rows.append(("D preemptions (recomputed tokens)",
                     f"{s['d_preemptions']:,} ({s.get('d_preempted_recompute_tokens', 0):,})"))
    if "p_held_kv_gib_mean" in s:
        rows.append(("P held KV mean / peak (lease expiries)",
                     f"{s['p_held_kv_gib_mean']:.2f} / {s['p_held_kv_gib_peak']:.2f} GiB ({s.get('p_lease_expiries', 0)})"))
    if s.get("percentile_method") == "sketch":  # a run above the exact threshold (kvplan.sim.quantiles)
        rows.append(("percentiles", f"quantile sketch, within {s.get('percentile_relative_error', 0.0):.1%} relative"))
    for k, v in rows:
        t.add_row(k, v)
    c.print(t)
    if s.get("extrapolated"):
        c.print("[bold]Profile not calibrated on this deployment[/bold]; its parts:")
        # each role's own profile's parts under heterogeneous TP (sim/engine.py profile_parts, in summary.json)
        for k, v in sorted((s.get("profile_components") or {}).items()):
            c.print(f"  {k}: {v}", markup=False)
    from kvplan.sim.health import health_lines

    for line in health_lines(s.get("health", {}), human_s):
        c.print(line, markup=False)
    for note in result.notes:  # settings the run ignored: always said, one line each
        if note.startswith("no effect:"):
            c.print(f"warning: {note}", markup=False)
    if verbose:
        for note in result.notes:
            c.print(f"assumption: {note}", markup=False)
    elif result.notes:
        c.print(f"{len(result.notes)} modelling assumptions behind the profile and costs: --verbose lists them")
    if s.get("truncated_conversations"):
        c.print(f"note: {s['truncated_conversations']} conversations ended early at the model's context limit")
        asked = result.scenario.workload.conversations if result.scenario.workload.trace is None else None
        if asked is not None and s.get("conversations") is not None and asked > s["conversations"]:
            # summary.json's 'conversations' counts those simulated: 48 against the scenario's 60 read as a bug
            from kvplan.models.arch import get_model

            limit = result.scenario.deployment.max_model_len or get_model(result.scenario.model).max_model_len
            c.print(f"note: of those, {asked - s['conversations']:,} have no turn at all (even the first prompt + "
                    f"output is over {limit:,} tokens): {s['conversations']:,} of the {asked:,} conversations asked "
                    "for (workload.conversations) were simulated (summary.json 'conversations'); a longer-context model "
                    "(or deployment.max_model_len raised up to the model's) keeps them",
                    markup=False)
    for key, n in sorted((s.get("trace") or {}).items()):
        if key.endswith("_zero_replayed_as_1") and n:
            c.print(f"note: {n:,} trace requests with {key.removesuffix('_zero_replayed_as_1')} 0 were replayed with 1 "
                    "(a request has at least one prompt and one generated token)", markup=False)
    unsorted = (s.get("trace") or {}).get("rows_out_of_order_sorted")
    if unsorted:
        c.print(f"note: {unsorted:,} trace rows were earlier than the row before them; the trace was replayed sorted "
                "by arrival", markup=False)
    if out is not None:
        names = files or ["turns.csv", "summary.json", "pinned.csv", "scenario.yaml"]
        c.print(f"wrote {out}/{names[0]}, {', '.join(names[1:])}")


def print_json(obj: Any) -> None:
    """Print an object as JSON (NaN -> null)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def warn_unreliable(reasons: list[str], out: Path) -> None:
    """The warning every unreliable fit prints (stderr), with its reasons (``kvplan calibrate``, both paths)."""
    typer.echo(f"WARNING: {out} is written with status 'unreliable' (kvplan simulate refuses it without "
               f"--allow-unreliable-profile): {'; '.join(reasons)}", err=True)
