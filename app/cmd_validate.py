"""``kvplan validate``: predictions against public measurements kvplan was not fitted on."""

from __future__ import annotations

import json
from typing import Any

import typer

VALIDATE_HELP = """Compare kvplan with public measurements shipped in the package (calibration/validation/*.yaml: each
case with its source, setup and licence): the Dynamo Qwen3-32B prefill TTFT-vs-ISL curve and decode ITLs,
the Dynamo 1P1D runs at concurrency 1/4/7/8, the llm-d 1P1D/2P1D A100 Llama-3.1-8B runs (and their
aggregated baselines) and the published P5en points (the calibration target: fitted, in-sample). Curves
are predicted with the cost functions, serving runs by simulating the described setup, both through the
profile resolution a simulation uses. Prints measured vs predicted with the relative error per point, a
summary per case (MAPE, max) and, per case, what kvplan cannot express (no prediction, or only an
approximation). --json prints the same as {"cases": [...]}; --markdown the per-case summary table.
Offline; nothing is fitted to these cases."""


def _print_case(c: dict[str, Any]) -> None:
    from rich.table import Table

    from kvplan.app.output import console

    con = console()
    s = c["summary"]
    src = c["source"]
    t = Table(title=f"{c['name']}: {c['title']}", title_justify="left")
    for col in ("point", "metric", "measured", "predicted", "rel_error"):
        t.add_column(col, justify="left" if col in ("point", "metric") else "right")
    for p in c["points"]:
        pred = f"{p['predicted']:.2f}" if p["predicted"] is not None else "-"
        err = f"{p['rel_error']:+.1%}" if p["rel_error"] is not None else "-"
        t.add_row(p["label"], p["metric"], f"{p['measured']:.2f}", pred, err)
    for why in c["not_expressible"]:
        t.add_row("not expressible", why, "", "", "")
    con.print(t)
    con.print(f"  source: {src['repository']} {src['path']} @ {src['commit']} ({src['licence']})")
    con.print(f"  status: {c['status']}; profile: {c['profile'] or '-'}; predicts: {c['predicts']}")
    mape = f"{s['mape_pct']:.1f}%" if s["mape_pct"] is not None else "-"
    mx = f"{s['max_abs_error_pct']:.1f}%" if s["max_abs_error_pct"] is not None else "-"
    con.print(f"  summary: {s['predicted']} of {s['points']} points predicted, MAPE {mape}, max abs error {mx}")
    con.print("")


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""

    @app.command("validate", help=VALIDATE_HELP)
    def validate_cmd(
        case: list[str] = typer.Option([], "--case", help="Run only this case (repeatable; default: all)."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
        markdown: bool = typer.Option(False, "--markdown", help="Print the per-case summary as a Markdown table."),
    ) -> None:
        from kvplan.calibration.validate import json_ready, markdown_table, validate

        results = validate(list(case))
        if json_out:
            typer.echo(json.dumps({"cases": json_ready(results)}, indent=2))
            return
        if markdown:
            typer.echo(markdown_table(results), nl=False)
            return
        for c in results:
            _print_case(c)
