"""``kvplan reproduce``: the published P5en points next to the simulator's, per model and series."""

from __future__ import annotations

import json
from pathlib import Path

import typer

REPRODUCE_HELP = """Simulate the published P5en benchmark (1P1D p5en TP8, prefix caching off on P, 10 conversations x 5
user turns of 150 tokens, 300-token responses, 2 clients; ON = bidirectional KV transfer) at every prefix size
and print, per published point: model, series, prompt_tokens, published_ms, simulated_ms, rel_error. --json
prints the same rows as a JSON array (exactly those keys). --html writes the plotly figures (TTFT vs prompt
length ON/OFF, prefill duration split into recompute and KV transfer) with the simulated curves at every
prefix size. The published points are embedded in kvplan (calibration/published_data.py)."""


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""

    @app.command("reproduce", help=REPRODUCE_HELP, short_help="The published P5en points against the simulator.")
    def reproduce_cmd(
        model: str | None = typer.Option(None, "--model", help="qwen3-32b or glm-5-fp8 (default: both)."),
        profile: str | None = typer.Option(None, "--profile", help="Profile name or JSON path (default: shipped)."),
        json_out: bool = typer.Option(False, "--json", help="Print the rows as a JSON array."),
        html: Path | None = typer.Option(None, "--html", help="Write the figures to this HTML file."),
        include_first_turn: bool = typer.Option(
            False, "--include-first-turn", help="Average every turn (default: turns 2..5, as --warmup-step measures)."
        ),
        overwrite: bool = typer.Option(
            False, "--overwrite", help="Replace an existing output file kvplan did not write (its own it replaces anyway)."
        ),
    ) -> None:
        from kvplan.calibration.reproduce import ROW_KEYS, TOLERANCE, ratio_checks, reproduce_rows, within_tolerance
        from kvplan.errors import input_error

        if html is not None and not html.parent.is_dir():
            raise input_error(f"--html {html}", "the directory does not exist", "create it first")
        if html is not None:
            from kvplan.atomic import check_output_file

            check_output_file(html, "--html", inputs=[profile], overwrite=overwrite)
        rows = reproduce_rows(model=model, profile=profile, include_first_turn=include_first_turn)
        published = [{k: r[k] for k in ROW_KEYS} for r in rows if r["published_ms"] is not None]
        if html is not None:
            from kvplan.calibration.figures import reproduce_figures, write_html

            write_html(reproduce_figures(rows), html, title="kvplan reproduce: published P5en vs simulated",
                       overwrite=overwrite, inputs=[profile])
        if json_out:
            typer.echo(json.dumps(published, indent=2))
            return
        from rich.table import Table

        from kvplan.app.output import console
        from kvplan.models.profile import load_profile

        c = console()
        t = Table(title="kvplan reproduce: published P5en points vs the simulated benchmark")
        for col in ROW_KEYS:
            t.add_column(col, justify="left" if col in ("model", "series") else "right")
        t.add_column("tolerance")
        t.add_column("within tolerance")
        for r in published:
            ok = within_tolerance(r)
            t.add_row(r["model"], r["series"], str(r["prompt_tokens"]), f"{r['published_ms']:.0f}",
                      f"{r['simulated_ms']:.1f}", f"{r['rel_error']:+.1%}", f"±{TOLERANCE[r['series']]:.0%}",
                      "yes" if ok else "NO")
        c.print(t)
        for ratio in ratio_checks(rows):
            c.print(f"{ratio['model']}: TTFT ON/OFF at {ratio['prompt_tokens']} tokens: published {ratio['published']:.3f}, "
                    f"simulated {ratio['simulated']:.3f} ({ratio['rel_error']:+.1%}; tolerance 10%: "
                    f"{'yes' if ratio['within'] else 'NO'})")
        for m in dict.fromkeys(r["model"] for r in published):
            prof = load_profile(profile if profile is not None else f"p5en-{m}")
            c.print(f"{m}: profile {prof.name} ({prof.status}; {prof.status_line()})", markup=False)
        c.print("aggregation: " + ("every turn" if include_first_turn else
                                   "turns 2..5 (the first turn of each conversation is the benchmark's warm-up)"))
        if html is not None:
            c.print(f"wrote {html}")
