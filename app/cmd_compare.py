"""``kvplan compare``: the serving alternatives side by side at equal GPUs, workload and seeds."""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import typer

COMPARE_HELP = """Simulate SCENARIO.yaml under each policy on the same GPU count, workload and seeds, and
print one column per policy: health (ok, or SATURATED and the resources the runs' health sections name), TTFT
p50/p90/p99 and mean (± 95% CI over replications), TPOT (times in ms, s, min or h), hit rate, pinned and held
decode KV (mean, peak), errors, preemptions, prefill (engine) utilisation, the maximum load meeting
--slo-ttft-p90-ms (when given) and the cost per million turns. Policies: off, ttl (vLLM defaults),
ttl_recommended (kvplan recommend's values), lease, lease:no_end (clients do not know a conversation's end),
ttl_evictable, offload, aggregated[:routing] (the same GPUs as aggregated replicas), and the fastest
bidirectional policy whose pulls take >= 30% of its mean TTFT again with cross-layer blocks
(<policy>+cross_layer; not when the scenario sets them). A policy the simulator does not model is refused.
--json prints one object per policy; --html writes the plotly figures side by side."""


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""

    @app.command("compare", help=COMPARE_HELP, short_help="Retention policies side by side, same GPUs and seeds.")
    def compare_cmd(
        ctx: typer.Context,
        scenario: Path | None = typer.Argument(None, help="Scenario YAML (a P/D deployment; or --workload)."),
        workload: str | None = typer.Option(None, "--workload", help="chat | coding-agent | tool-agent | p5en-benchmark."),
        model: str = typer.Option("qwen3-32b", "--model", help="Model preset (with --workload)."),
        hardware: str = typer.Option("p5en", "--hardware", help="Hardware preset (with --workload)."),
        rate: float | None = typer.Option(None, "--rate", help="New conversations per second (with --workload)."),
        policies: str | None = typer.Option(
            None, "--policies",
            help="Comma-separated list (default: every modelled one but lease:no_end and aggregated:<routing>)."),
        replications: int = typer.Option(
            3, "--replications", help="Seeded replications per policy (seeds spawned from the scenario's seed)."),
        json_out: bool = typer.Option(False, "--json", help="Print one JSON object per policy."),
        html: Path | None = typer.Option(None, "--html", help="Write the figures to this HTML file."),
        slo_ttft_p90_ms: float | None = typer.Option(None, "--slo-ttft-p90-ms", help="TTFT p90 SLO in ms (max load)."),
        usd: float | None = typer.Option(None, "--usd-per-node-hour", help="Node price (default: the hardware's)."),
        conversations: int | None = typer.Option(None, "--conversations", help="Override workload.conversations."),
        trace: Path | None = typer.Option(None, "--trace", help="Replay this trace instead of the synthetic workload."),
        workers: int = typer.Option(1, "--workers", min=0, help="Parallel runs (0 = all CPUs)."),
        recommendation: Path | None = typer.Option(
            None, "--recommendation",
            help="`kvplan recommend --json` output for this scenario: ttl_recommended reuses it (same rows) instead "
                 "of rerunning the advisor; refused if made for another scenario, replication count, SLO, budget or grid."),
        overwrite: bool = typer.Option(
            False, "--overwrite", help="Replace an existing --html file kvplan did not write (its own it replaces anyway)."
        ),
        allow_unreliable: bool = typer.Option(
            False, "--allow-unreliable-profile",
            help="Use a profile of status 'unreliable' (a calibration that failed its self-check) anyway.",
        ),
    ) -> None:
        from kvplan.app.flags import (
            common_run_flags,
            positive_finite,
            refuse_conversations_with_trace,
            refuse_preset_flags,
        )
        from kvplan.atomic import check_output_file
        from kvplan.errors import input_error
        from kvplan.plan.compare import compare, compare_json, parse_policies
        from kvplan.plan.grid import scenario_input_files
        from kvplan.sim.presets import preset_scenario
        from kvplan.sim.scenario import load_scenario, with_overrides

        # the bounds recommend and capacity check (app/flags.py), before any work
        common_run_flags(replications, workers, conversations)
        positive_finite("--rate", rate, upper=1e6)
        positive_finite("--slo-ttft-p90-ms", slo_ttft_p90_ms, upper=1e10)
        positive_finite("--usd-per-node-hour", usd, upper=1e6, allow_zero=True)
        names = parse_policies(policies)
        rec = load_recommendation(recommendation) if recommendation is not None else None
        inputs: list[Path | str | None] = [scenario, trace, recommendation]
        if html is not None:
            check_output_file(html, "--html", inputs=inputs, overwrite=overwrite)
        if (scenario is None) == (workload is None):
            raise input_error("compare", "give SCENARIO.yaml or --workload PRESET (one of them)")
        refuse_preset_flags(ctx, scenario)
        if scenario is not None:
            if rate is not None:
                raise input_error("--rate", "only with --workload", "set workload.arrival.rate_per_s in the scenario")
            sc = load_scenario(scenario)
            if conversations is not None:
                sc = with_overrides(sc, {"workload.conversations": conversations})
        else:
            sc = preset_scenario(workload or "", model, hardware, rate_per_s=rate, conversations=conversations)
        refuse_conversations_with_trace(conversations, trace is not None or sc.workload.trace is not None)
        if trace is not None:
            if not trace.exists():  # a file, or a directory of weka traces
                raise input_error(f"--trace {trace}", "no such file")
            sc = with_overrides(sc, {"workload.trace": {"path": os.path.abspath(trace)}})
        if allow_unreliable:  # what the refusal of an 'unreliable' profile tells the user to pass
            sc = with_overrides(sc, {"simulation.allow_unreliable_profile": True})
        from kvplan.sim.engine import resolve

        resolve(sc)  # profile and cost errors (an 'unreliable' profile among them) in one line, before any run
        if policies is None:  # the default list: a policy this deployment cannot run is left out and said so
            from kvplan.plan.compare import default_left_out

            left_out = default_left_out(sc, names)
            names = [n for n in names if n.partition(":")[0] not in {x["policy"] for x in left_out}]
            for x in left_out:
                sys.stderr.write(f"warning: {x['policy']} not compared: {x['why']}\n")
        inputs += scenario_input_files(sc)
        if html is not None:
            check_output_file(html, "--html", inputs=inputs, overwrite=overwrite)
        from kvplan.app.cmd_sweep import _progress_bar

        n_workers = workers if workers > 0 else (os.cpu_count() or 1)
        bar, cb = _progress_bar()
        with bar:
            rows = compare(sc, names, replications=replications, slo_ttft_p90_ms=slo_ttft_p90_ms, usd_per_node_hour=usd,
                           workers=n_workers, progress=cb, recommendation=rec)
        if html is not None:
            from kvplan.app.figures import compare_figure
            from kvplan.atomic import atomic_write_bytes

            fig = compare_figure(rows)
            page = fig.to_html(include_plotlyjs=True, full_html=True, div_id="kvplan-compare")
            atomic_write_bytes(html, page.encode(), "--html", overwrite=overwrite, inputs=inputs)
        if json_out:
            sys.stdout.write(compare_json(rows) + "\n")
            return
        from kvplan.app.output import console

        c = console()
        for line in render_text(rows):
            c.print(line, markup=False)
        if html is not None:
            c.print(f"wrote {html}", markup=False)


#: A ``kvplan recommend --json`` file is a few hundred KiB at most (its TTL curve and checks).
MAX_RECOMMENDATION_BYTES = 4 * 1024**2
#: The recommendation fields ``ttl_recommended`` uses, with the JSON types they must have.
RECOMMENDATION_FIELDS: dict[str, tuple[type, ...]] = {
    "bidirectional": (bool,), "decoder_kv_blocks_ttl_s": (int, float), "kv_recompute_threshold_tokens": (int,),
    "router_ttl_s": (int, float), "kv_load_failure_policy": (str,), "inputs": (dict,),
}


def load_recommendation(path: Path) -> dict[str, Any]:
    """A ``kvplan recommend --json`` file, bounded and checked field by field (one-line errors naming the option)."""
    from kvplan.errors import input_error
    from kvplan.inputfile import load_json

    where = f"--recommendation {path}"
    value, _ = load_json(path, MAX_RECOMMENDATION_BYTES, where)
    if not isinstance(value, dict):
        raise input_error(where, "not a JSON object", "pass the output of `kvplan recommend --json`")
    for key, types in RECOMMENDATION_FIELDS.items():
        v = value.get(key)
        ok = isinstance(v, types) and (bool in types or not isinstance(v, bool))
        if not ok or (isinstance(v, float) and not math.isfinite(v)):
            raise input_error(where, f"field '{key}' is missing or not a {'/'.join(t.__name__ for t in types)}",
                              "pass the output of `kvplan recommend --json`")
    return value


def shown_ci(row: Mapping[str, Any], key: str) -> float | None:
    """The 95% CI of ``key`` to print: every finite one when the row has more than one replication (a CI of
    exactly 0 too, so that every cell of a row reads alike), none with a single replication (no CI exists)."""
    ci, reps = row.get(f"{key}_ci95"), row.get("replications")
    if isinstance(reps, int) and reps <= 1:
        return None
    return float(ci) if isinstance(ci, float) and math.isfinite(ci) else None


#: Why every CI is 0: what :func:`identical_replications` found, said where the CIs are printed.
IDENTICAL_NOTE = ("the replications gave identical results (the replay has no random part): the figures are exact for "
                  "this trace, and the ±0 says nothing about traffic like it")


def identical_replications(rows: Sequence[Mapping[str, Any]]) -> bool:
    """Whether every row's replications agree exactly on every TTFT figure (CI 0 throughout): a trace replay with
    nothing random in it (the seeds change nothing), whose ±0 must not read as certainty about similar traffic."""
    cis = [row.get(f"{key}_ci95") for row in rows for _, key in TIME_LINES[:4]]
    return bool(cis) and all(isinstance(c, float) and c == 0.0 for c in cis)


#: Shares (0..1) whose CI is shown as its range clipped to 0-100% (a t interval of 2 replications can be wider)
SHARES = frozenset({"hit_rate", "reuse_rate"})
#: Busy shares printed at most 100%, as the health lines print them (sim/health.py): the steady-window figure can
#: exceed 1 when a step straddles the window's edges; the raw figure stays in the JSON rows.
CAPPED = frozenset({"prefill_utilization_steady"})
CAPPED_NOTE = ("prefill/engine util: the busiest engine's busy share of the steady window, printed at most 100% as the "
               "health lines print it (above 1 in the JSON: a step straddling the window's edges)")


#: What each row counts, the words simulate's table uses (a newcomer read 'hit rate 0.0' beside 'reuse rate 99.7' for
#: retention off, and 'held' beside 'pinned' KV, with nothing saying what either was).
ROWS_NOTE = ("rows: hit rate = follow-ups whose previous context was still retained (D's pin or P's cache: a router "
             "hit); reuse rate = follow-ups that reused any KV (a local prefix hit or a pull); pinned KV = finished "
             "turns' KV that D retains for P's read-back (all D); held KV = prompt KV that P holds until D reads it "
             "(all P); errors = failed turns and preemptions = D's recompute preemptions, per run")


def capped(row: dict[str, Any]) -> bool:
    """Whether a :data:`CAPPED` figure of ``row`` is above 100% (printed as 100%)."""
    return any(isinstance(v, int | float) and v > 1.0 for v in (row.get(k) for k in CAPPED))


def _cell(row: dict[str, Any], key: str, scale: float = 1.0, fmt: str = ".0f") -> str:
    v = row.get(key)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if key in CAPPED:
        v = min(float(v), 1.0)
    ci = shown_ci(row, key)
    if ci is not None and key in SHARES:
        lo, hi = max(v - ci, 0.0), min(v + ci, 1.0)
        return f"{v * scale:{fmt}} [{lo * scale:{fmt}}-{hi * scale:{fmt}}]"
    return f"{v * scale:{fmt}}" + (f" ±{ci * scale:{fmt}}" if ci is not None else "")


def _time_cell(row: dict[str, Any], key: str) -> str:
    """A time and its CI in human units (ms, s, min, h: :func:`kvplan.units.human_s`), whatever its size."""
    from kvplan.units import human_s

    v = row.get(key)
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    ci = shown_ci(row, key)
    return human_s(v) + (f" ±{human_s(ci)}" if ci is not None else "")


#: Time rows: label, row key (seconds; printed by :func:`_time_cell`).
TIME_LINES = (
    ("TTFT p50", "ttft_p50_s"),
    ("TTFT p90", "ttft_p90_s"),
    ("TTFT p99", "ttft_p99_s"),
    ("TTFT mean", "ttft_mean_s"),
    ("TPOT mean", "tpot_mean_s"),
)
LINES = (
    ("hit rate %", "hit_rate", 100.0, ".1f"),
    ("reuse rate %", "reuse_rate", 100.0, ".1f"),
    ("pinned KV mean GiB", "pinned_kv_gib_mean", 1.0, ".1f"),
    ("pinned KV peak GiB", "pinned_kv_gib_peak", 1.0, ".1f"),
    ("held KV mean GiB", "held_kv_gib_mean", 1.0, ".1f"),
    ("held KV peak GiB", "held_kv_gib_peak", 1.0, ".1f"),
    ("errors", "errors", 1.0, ".1f"),
    ("preemptions", "preemptions", 1.0, ".1f"),
    ("prefill/engine util %", "prefill_utilization_steady", 100.0, ".1f"),
    ("max conv/s at SLO", "max_rate_per_s_meeting_slo", 1.0, ".3g"),
    ("$ per M turns", "usd_per_million_turns", 1.0, ",.0f"),
)


#: health resource -> the short name the health row prints.
SHORT_RESOURCE = {"decode_kv": "D HBM", "prefill_held_kv": "P KV pool", "prefill_compute": "P compute",
                  "link": "links", "decode_engine_thread": "D thread", "prefill_engine_thread": "P thread"}


def health_cell(row: dict[str, Any]) -> str:
    """'ok', or 'SATURATED: <resources>' from the row's ``saturated`` list (the runs' health sections), a resource
    saturated in only k of the n replications marked 'k/n'."""
    sat = row.get("saturated")
    if sat is None:
        return "-"
    counts, n = row.get("saturated_replications") or {}, row.get("replications") or 0

    def name(s: str) -> str:
        k = counts.get(s, n)
        return SHORT_RESOURCE.get(s, s) + (f" {k}/{n}" if 0 < k < n else "")

    return "SATURATED: " + ", ".join(name(s) for s in sat) if sat else "ok"


def render_text(rows: list[dict[str, Any]]) -> list[str]:
    """Metrics as lines, one column per policy (the CLI prints them)."""
    table: list[tuple[str, list[str]]] = [
        ("", [r["policy"] for r in rows]), ("GPUs", [str(r["gpus"]) for r in rows]),
        ("health", [health_cell(r) for r in rows]),
    ]
    table.extend((label, [_time_cell(r, key) for r in rows]) for label, key in TIME_LINES)
    table.extend((label, [_cell(r, key, scale, fmt) for r in rows]) for label, key, scale, fmt in LINES
                 if key != "max_rate_per_s_meeting_slo" or rows[0].get("slo_ttft_p90_ms") is not None)
    # one width for every column, at least two spaces wider than its widest cell: cells never run together
    width = max(16, *(len(c) + 2 for _, cells in table for c in cells))
    out = [f"{label:24}" + "".join(f"{c:>{width}}" for c in cells) for label, cells in table]
    reps = rows[0]["replications"]
    seeds = (f"replication seeds spawned from seed {rows[0]['seed']} (SeedSequence, the same for every policy)")
    ci = (f"± 95% CI over {reps} replications (shares: the CI as a range within 0-100%)" if reps > 1
          else "no ±: one replication has no CI")
    if reps > 1 and identical_replications(rows):
        ci += f"; {IDENTICAL_NOTE}"
    out.append(f"({ci}, {seeds}; '-' = not modelled or not applicable)")
    out.append(ROWS_NOTE)
    if any(r.get("saturated") for r in rows):
        out.append("SATURATED: the health section of at least one replication (k/n: k of the n) found requests waiting "
                   "> 1 s at p90 on a resource >= 90% busy; that column's TTFT measures the queue, not the policy")
    if any(capped(r) for r in rows):
        out.append(CAPPED_NOTE)
    if rows[0].get("cost_basis"):
        out.append(rows[0]["cost_basis"])
    if rows[0].get("slo_ttft_p90_ms") is not None:
        out.append(f"max load: new conversations/s with mean TTFT p90 <= {rows[0]['slo_ttft_p90_ms']:g} ms and <= 1% errors")
    # a note every policy has (the workload cut at the context limit, ...) is said once, not once per column
    common = [n for n in rows[0]["notes"] if all(n in r["notes"] for r in rows[1:])] if len(rows) > 1 else []
    out.extend(f"every policy: {n}" for n in common)
    for r in rows:
        out.append(f"{r['policy']}: {r['description']}" + "".join(f"; {n}" for n in r["notes"] if n not in common)
                   + (recommended_note(r["replications"]) if r["policy"].startswith("ttl_recommended") else ""))
    return out


def recommended_note(replications: int) -> str:
    """Which recommend the ttl_recommended column ran: the advisor at this command's replications, which can answer
    otherwise than ``kvplan recommend`` at its default of 3 when the gain is within the noise (a newcomer got TTL 45 s
    from recommend and 'retention off' in compare --replications 2's column, for the same scenario)."""
    return (f"; recommend run at this command's {replications} replication(s), as `kvplan recommend --replications "
            f"{replications}` runs it (at another count a gain within the noise can flip its answer; compare "
            "--replications 3 runs it as plain `kvplan recommend` does)")
