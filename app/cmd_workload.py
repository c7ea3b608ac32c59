"""``kvplan workload show|fit``: retention statistics of a real trace, and a synthetic workload fitted to it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import typer
import yaml

from kvplan.traces.trace import TRACE_FORMAT_TEXT, TRACE_FORMATS

if TYPE_CHECKING:
    from kvplan.traces.trace import Trace


def register(app: typer.Typer) -> None:
    """Add the ``workload`` command group to the CLI."""
    wl = typer.Typer(help="Statistics of real traces and synthetic workloads fitted to them.", no_args_is_help=True)
    app.add_typer(wl, name="workload", short_help="Statistics of a real trace (show) or a workload fitted to it.")

    @wl.command("show", short_help="Gap, follow-up, context and token statistics of a trace (HTML figures too).")
    def show(
        trace: Path = typer.Argument(..., help=f"Trace file: {TRACE_FORMAT_TEXT}."),
        fmt: str | None = typer.Option(
            None, "--format", help=f"{'|'.join(TRACE_FORMATS)} (detected; a directory is weka)."
        ),
        ttls: str = typer.Option("30,60,120,300,480,600,900", "--ttls", help="TTLs (s) for follow-up probabilities."),
        threshold: int = typer.Option(64, "--threshold", min=0, help="kv_recompute_threshold for the output share."),
        html: Path | None = typer.Option(None, "--html", help="Also write a plotly HTML figure."),
        json_out: bool = typer.Option(False, "--json", help="Print the statistics as JSON."),
        overwrite: bool = typer.Option(
            False, "--overwrite", help="Replace an existing output file kvplan did not write (its own it replaces anyway)."
        ),
    ) -> None:
        """Gap percentiles, follow-up probability within T, context per turn, share of short outputs."""
        from kvplan.app.flags import int_range, seconds_list
        from kvplan.app.output import console
        from kvplan.sim.scenario import MAX_THRESHOLD_TOKENS
        from kvplan.traces.readers import load_trace
        from kvplan.traces.stats import json_ready, stats_figure, stats_table, workload_stats

        ttl_list = seconds_list("--ttls", ttls)
        int_range("--threshold", threshold, 0, MAX_THRESHOLD_TOKENS)  # policy.kv_recompute_threshold_tokens' range
        if html is not None:
            from kvplan.atomic import check_output_file

            check_output_file(html, "--html", inputs=[trace], overwrite=overwrite)  # before any work
        agentic = _weka_stats(trace, fmt)  # a weka trace (AgentX): read once, its agentic statistics too
        tr = agentic[0] if agentic is not None else load_trace(trace, fmt)
        stats = workload_stats(tr, ttl_list, threshold)
        if agentic is not None:
            stats["weka"] = agentic[1]
        if json_out:
            typer.echo(json.dumps(json_ready(stats), indent=2, sort_keys=True))
        else:
            from rich.table import Table

            t = Table(title=f"workload statistics of {trace.name}")
            t.add_column("statistic")
            t.add_column("value", justify="right")
            for k, v in stats_table(stats):
                t.add_row(k, v)
            console().print(t)
            console().print(
                "method: sessions as given by the trace's ids, or for Mooncake rebuilt from 512-token hash-prefix"
                " chains (see kvplan.traces); gaps are arrival to arrival."
            )
            if agentic is not None:
                _print_weka(agentic[1], trace.name)
        if html is not None:
            from kvplan.atomic import atomic_write_bytes

            fig = stats_figure(tr, stats)
            page = fig.to_html(include_plotlyjs=True, div_id="kvplan-workload")
            atomic_write_bytes(html, page.encode(), "--html", inputs=[trace], overwrite=overwrite)

    @wl.command("fit", short_help="Fit a scenario workload section to a trace, checked by drawing from it.")
    def fit(
        trace: Path = typer.Argument(..., help="Trace file."),
        out: Path = typer.Option(..., "--out", help="Workload YAML to write (a scenario 'workload:' section)."),
        fmt: str | None = typer.Option(
            None, "--format", help=f"{'|'.join(TRACE_FORMATS)} (detected; a directory is weka)."
        ),
        gap_model: str = typer.Option(
            "empirical", "--gap-model", help="empirical (measured idle gaps, default) or fit (best parametric family)."
        ),
        scenario: Path | None = typer.Option(
            None, "--scenario", help="Scenario whose model/hardware/profile estimate service times (default p5en qwen3-32b)."
        ),
        json_out: bool = typer.Option(False, "--json", help="Print the fit report (goodness of fit) as JSON."),
        overwrite: bool = typer.Option(
            False, "--overwrite", help="Replace an existing output file kvplan did not write (its own it replaces anyway)."
        ),
    ) -> None:
        """Fit turns per conversation, turn gaps (idle, with goodness of fit), new tokens and outputs."""
        from kvplan.app.output import console
        from kvplan.atomic import check_distinct, check_output_file
        from kvplan.calibration.workload_fit import fit_workload, workload_section
        from kvplan.errors import input_error
        from kvplan.sim.scenario import Scenario, load_scenario
        from kvplan.sim.service import unloaded_service_time_fn
        from kvplan.traces.readers import load_trace
        from kvplan.traces.stats import json_ready

        if not out.name or out.is_dir():  # '.', '/' or a directory: no file name to write to (nor to derive from)
            raise input_error(f"--out {out}", "is a directory, not a workload YAML file", "give a file path, e.g. "
                              "workload.yaml")
        report_path = out.with_name(out.stem + ".fit.json")
        inputs: list[Path | str | None] = [trace, scenario]
        sc = load_scenario(scenario) if scenario is not None else Scenario()
        if scenario is not None:  # and every file the scenario reads (a profile JSON, a trace, empirical samples)
            from kvplan.plan.grid import scenario_input_files

            inputs += scenario_input_files(sc)
        check_distinct([("--out", out), ("--out (report)", report_path)])
        check_output_file(out, inputs=inputs, overwrite=overwrite)
        check_output_file(report_path, "--out (report)", inputs=inputs, overwrite=overwrite)  # both before any work
        if gap_model not in ("empirical", "fit"):
            raise input_error("--gap-model", f"is '{gap_model}'", "use empirical or fit")
        tr = load_trace(trace, fmt)
        fn = unloaded_service_time_fn(sc)
        fn.__name__ = f"unloaded service time on {sc.hardware} {sc.model} (kvplan.sim.service)"
        result = fit_workload(tr, fn, gap_model=gap_model)
        section = json_ready(workload_section(result))
        report = json_ready(result.get("report", {}))
        from kvplan.calibration.workload_fit import check_runnable, reproduction_check

        check_runnable(section, str(trace))  # before anything is written: simulate would refuse this workload
        from kvplan.sim.engine import resolve

        # the fitted workload's own requests against the trace, statistic by statistic (what simulate would send)
        report["reproduction"] = json_ready(reproduction_check(tr, section, fn, resolve(sc).arch.max_model_len, report))
        from kvplan.atomic import atomic_write_bytes

        # the YAML is a scenario (only its workload section): `kvplan simulate OUT` runs it as it is
        text = (
            f"# Fitted by `kvplan workload fit` from {trace.name}; a scenario with only its workload section\n"
            f"# (`kvplan simulate {out.name} --out DIR`, or paste the section into a scenario).\n"
            f"# Goodness of fit and the fitting method: {report_path.name}\n"
            + (f"# WARNING: arrival.rate_per_s is not measured: {report['arrival_warning']}\n"
               if report.get("arrival_warning") else "")
            + yaml.safe_dump({"workload": section}, sort_keys=False, default_flow_style=None, width=120)
        )
        atomic_write_bytes(out, text.encode(), inputs=inputs, overwrite=overwrite)
        atomic_write_bytes(report_path, (json.dumps(report, indent=2, sort_keys=True) + "\n").encode(), "--out (report)",
                           inputs=inputs, overwrite=overwrite)
        if json_out:
            typer.echo(json.dumps(report, indent=2, sort_keys=True))
            return
        c = console()
        arr = section.get("arrival", {})
        c.print(f"{section.get('conversations')} conversations at {float(arr.get('rate_per_s', 0)):.4g} new per s; "
                f"turns per conversation: {_dist_text(section.get('turns'))}", markup=False)
        if report.get("arrival_warning"):
            c.print(f"warning: arrival.rate_per_s is not measured: {report['arrival_warning']}", markup=False)
        gap_fit = (report.get("turn_gap") or {}).get("fit") or {}
        chosen = gap_fit.get("chosen_family")
        c.print(f"idle turn gap: {_dist_text(section.get('turn_gap_s'))}"
                + (f" (best parametric family: {chosen})" if chosen else ""), markup=False)
        _print_reproduction(report["reproduction"])
        c.print(f"wrote {out} (simulate it as it is) and {report_path} (goodness of fit, reproduction)", markup=False)


def _print_reproduction(rep: dict[str, object]) -> None:
    """The statistics the fitted workload does not reproduce, with the trace's and the synthetic figure, and why."""
    from kvplan.app.output import console

    c = console()
    rows = rep.get("statistics")
    missed = [r for r in rows if isinstance(r, dict) and not r.get("reproduced")] if isinstance(rows, list) else []
    tol = rep.get("tolerance") or {}
    rel = float(tol.get("relative", 0.1)) if isinstance(tol, dict) else 0.1
    if not missed:
        c.print(f"reproduction: every statistic `kvplan workload show` prints, and the load, is within {rel:.0%} in "
                "the fitted workload's requests (unloaded)", markup=False)
        return
    c.print(f"reproduction: {len(missed)} of {len(rows) if isinstance(rows, list) else 0} statistics (`kvplan workload "
            f"show`'s and the load) differ by more than {rel:.0%} in the fitted workload's requests (unloaded; trace -> "
            "synthetic): " + "; ".join(f"{r['statistic']} {_num(float(r['trace']))} -> {_num(float(r['synthetic']))}"
                                       for r in missed), markup=False)
    reasons = rep.get("reasons")
    for why in reasons if isinstance(reasons, list) else []:
        c.print(f"  why: {why}", markup=False)


def _num(v: float) -> str:
    """A statistic in the table's style: whole numbers with separators from 100 up, 3 significant digits below."""
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:.3g}"


def _weka_stats(trace: Path, fmt: str | None) -> tuple[Trace, dict[str, object]] | None:
    """(common trace frame, agentic statistics) of a weka trace; None for any other format."""
    from kvplan.traces.readers import detect_trace_format

    if (fmt or detect_trace_format(trace)) != "weka":
        return None
    from kvplan.traces.weka import read_weka, to_trace
    from kvplan.traces.weka_stats import weka_stats

    wt = read_weka(trace)
    return to_trace(wt), weka_stats(wt)


def _print_weka(st: dict[str, object], name: str) -> None:
    """The agentic table: reuse, think-time percentiles, context growth, compactions; then per session."""
    from rich.table import Table

    from kvplan.app.output import console
    from kvplan.traces.weka_stats import weka_table

    t = Table(title=f"agentic statistics of {name} (weka: 64-token hash prefixes)")
    t.add_column("statistic")
    t.add_column("value", justify="right")
    for k, v in weka_table(st):
        t.add_row(k, v)
    console().print(t)
    per = Table(title="per session")
    for col in ("session", "requests", "first / max input", "reuse share", "compactions"):
        per.add_column(col, justify="left" if col == "session" else "right")
    rows = st["per_session"]
    assert isinstance(rows, list)
    for r in rows:
        per.add_row(str(r["session"]), str(r["requests"]), f"{r['first_input_tokens']:,} / {r['max_input_tokens']:,}",
                    f"{r['reuse_share']:.1%}", str(r["compactions"]))
    console().print(per)


def _dist_text(d: object) -> str:
    """A distribution section in a few words."""
    if not isinstance(d, dict):
        return "n/a"
    if d.get("dist") == "empirical":
        vals = d.get("values") or []
        return f"empirical, {len(vals):,} measured values" if vals else "empirical"
    return ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in d.items())
