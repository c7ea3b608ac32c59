"""``kvplan workload show|fit``: retention statistics of a real trace, and a synthetic workload fitted to it."""

from __future__ import annotations

import json
from pathlib import Path

import typer
import yaml


def register(app: typer.Typer) -> None:
    """Add the ``workload`` command group to the CLI."""
    wl = typer.Typer(help="Statistics of real traces and synthetic workloads fitted to them.", no_args_is_help=True)
    app.add_typer(wl, name="workload")

    @wl.command("show")
    def show(
        trace: Path = typer.Argument(..., help="Trace file (mooncake JSONL, multi-turn stats JSON, RAGPulse JSONL, CSV)."),
        fmt: str | None = typer.Option(None, "--format", help="mooncake|multiturn|ragpulse|csv (default: detect)."),
        ttls: str = typer.Option("30,60,120,300,480,600,900", "--ttls", help="TTLs (s) for follow-up probabilities."),
        threshold: int = typer.Option(64, "--threshold", min=0, help="kv_recompute_threshold for the output share."),
        html: Path | None = typer.Option(None, "--html", help="Also write a plotly HTML figure."),
        json_out: bool = typer.Option(False, "--json", help="Print the statistics as JSON."),
    ) -> None:
        """Gap percentiles, follow-up probability within T, context per turn, share of short outputs."""
        from kvplan.app.flags import seconds_list
        from kvplan.app.output import console
        from kvplan.calibration.traces import json_ready, load_trace, stats_figure, stats_table, workload_stats

        ttl_list = seconds_list("--ttls", ttls)
        tr = load_trace(trace, fmt)
        stats = workload_stats(tr, ttl_list, threshold)
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
                " chains (see kvplan.calibration.traces); gaps are arrival to arrival."
            )
        if html is not None:
            from kvplan.atomic import atomic_write_bytes, check_output_file

            check_output_file(html, "--html")
            fig = stats_figure(tr, stats)
            atomic_write_bytes(html, fig.to_html(include_plotlyjs="cdn").encode(), "--html")

    @wl.command("fit")
    def fit(
        trace: Path = typer.Argument(..., help="Trace file."),
        out: Path = typer.Option(..., "--out", help="Workload YAML to write (a scenario 'workload:' section)."),
        fmt: str | None = typer.Option(None, "--format", help="mooncake|multiturn|ragpulse|csv (default: detect)."),
        gap_model: str = typer.Option(
            "empirical", "--gap-model", help="empirical (measured idle gaps, default) or fit (best parametric family)."
        ),
        scenario: Path | None = typer.Option(
            None, "--scenario", help="Scenario whose model/hardware/profile estimate service times (default p5en qwen3-32b)."
        ),
    ) -> None:
        """Fit turns per conversation, turn gaps (idle, with goodness of fit), new tokens and outputs."""
        from kvplan.app.output import console
        from kvplan.atomic import check_output_file
        from kvplan.calibration.traces import json_ready, load_trace
        from kvplan.calibration.workload_fit import fit_workload, workload_section
        from kvplan.errors import input_error
        from kvplan.sim.scenario import Scenario, load_scenario
        from kvplan.sim.service import unloaded_service_time_fn

        check_output_file(out)
        if gap_model not in ("empirical", "fit"):
            raise input_error("--gap-model", f"is '{gap_model}'", "use empirical or fit")
        tr = load_trace(trace, fmt)
        sc = load_scenario(scenario) if scenario is not None else Scenario()
        result = fit_workload(tr, unloaded_service_time_fn(sc), gap_model=gap_model)
        section = json_ready(workload_section(result))
        doc = {"workload": section, "fit_report": json_ready(result.get("report", {}))}
        from kvplan.atomic import atomic_write_bytes

        text = (
            "# Fitted by `kvplan workload fit` from " + f"{trace.name}; use the 'workload' section in a scenario.\n"
            + yaml.safe_dump(doc, sort_keys=False)
        )
        atomic_write_bytes(out, text.encode())
        rep = result.get("report", {})
        console().print(json.dumps(json_ready(rep.get("turn_gap_s", rep)), indent=2)[:3000])
        console().print(f"wrote {out}")
