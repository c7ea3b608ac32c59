"""Terminal rendering shared by the commands (rich tables; JSON when asked)."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from kvplan.sim.results import Result, summary_json_bytes


def console() -> Console:
    """A console on stdout that does not wrap or colour when piped."""
    # piped output (CI logs, files) gets a wide fixed width instead of rich's 80 columns
    return Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 160)


def human_s(x: Any) -> str:
    """Seconds scaled for a human: ms below 1 s, s below 2 min, min below 2 h, then h (files keep exact SI)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "n/a"
    if not math.isfinite(v):
        return "n/a"
    a = abs(v)
    if a < 1.0:
        return f"{v * 1000:.1f} ms"
    if a < 120.0:
        return f"{v:.2f} s"
    if a < 7200.0:
        return f"{v / 60:.1f} min"
    return f"{v / 3600:.1f} h"


def fmt_s(x: Any) -> str:
    """Seconds as text scaled for humans (see :func:`human_s`)."""
    return human_s(x)


TTFT_KEYS = ("ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s")


def print_summary(result: Result, out: Path | None, as_json: bool = False) -> None:
    """Headline metrics with the assumptions they rest on."""
    s = result.summary
    if as_json:
        sys.stdout.write(summary_json_bytes(s).decode())
        return
    c = console()
    t = Table(title=f"kvplan simulate: {s['model']} on {s['hardware']} (profile {s['profile']}, {s['profile_status']})")
    t.add_column("metric")
    t.add_column("value", justify="right")
    rows = [
        ("turns (errors)", f"{s['turns']} ({s['errors']})"),
        ("TTFT mean / p50 / p90 / p99", " / ".join(fmt_s(s[k]) for k in TTFT_KEYS)),
        ("hit rate (follow-up turns reusing retained KV)", f"{s['hit_rate']:.1%}"),
        ("decisions", ", ".join(f"{k} {v}" for k, v in s["decisions"].items() if v)),
        ("pulled / recomputed / local-hit tokens",
         f"{s['pulled_tokens']:,} / {s['recomputed_tokens']:,} / {s['local_hit_tokens']:,}"),
        ("D->P / P->D bytes", f"{s['d2p_bytes'] / 2**30:.2f} GiB / {s['p2d_bytes'] / 2**30:.2f} GiB"),
        ("pinned decode KV mean / peak", f"{s['pinned_kv_gib_mean']:.2f} / {s['pinned_kv_gib_peak']:.2f} GiB"),
        ("decode KV capacity (all D nodes)", f"{s['decode_kv_capacity_gib']:.0f} GiB"),
        ("prefill utilisation", f"{s['prefill_utilization']:.1%}"),
    ]
    for k, v in rows:
        t.add_row(k, v)
    c.print(t)
    if s.get("extrapolated"):
        c.print("[bold]EXTRAPOLATED profile[/bold]: costs scaled from another model's calibration.")
    for note in result.notes:
        c.print(f"assumption: {note}")
    if s.get("truncated_conversations"):
        c.print(f"note: {s['truncated_conversations']} conversations ended early at the model's context limit")
    if out is not None:
        c.print(f"wrote {out}/turns.csv, summary.json, pinned.csv, scenario.yaml")


def print_json(obj: Any) -> None:
    """Print an object as JSON (NaN -> null)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
