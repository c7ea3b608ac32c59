"""``kvplan validate``: predictions against public measurements kvplan was not fitted on."""

from __future__ import annotations

import json
from typing import Any

import typer

VALIDATE_HELP = """Compare kvplan with public measurements shipped in the package (calibration/validation/*.yaml: each
case with its source, setup and licence): the Dynamo Qwen3-32B prefill TTFT-vs-ISL curve and decode ITLs,
the Dynamo 1P1D runs at concurrency 1/4/7/8, the llm-d "1P1D/2P1D" A100 Llama-3.1-8B runs (served as
aggregated replicas: their gateway did no P/D) and their aggregated baselines, Mooncake's vLLM 1P1D H800
Qwen3-8B TTFT at ISL 128-32k, and the published P5en points (the calibration target: fitted, in-sample). Curves
are predicted with the cost functions, serving runs by simulating the described setup, both through the
profile resolution a simulation uses. Prints measured vs predicted with the relative error per point, a
summary per case (MAPE, max) and, per case, what kvplan cannot express (no prediction, or only an
approximation). Each prediction has a sensitivity band: the same prediction with the GPU compute of prefill
and decode scaled by the prior's stated error, x(1-e) and x(1+e) (e: the kernel prior's worst fit error against
aiconfigurator, per component; --band-error sets one e for both), with, per case, how many measurements lie
inside it and which points are knife edges (band > 2x wide, or > 2x the scaling: the answer depends on the
prior's error). A serving run also has its seed spread: the lowest and highest prediction under seeds 0-3
(arrival times, sampled prompt lengths, random routing draws), the sampling spread of a run that long, of which
the measured run is one draw. --json prints the same as {"cases": [...]} (per point predicted_low /
predicted_high, in_band, knife_edge, seed_low / seed_high, in_seed_spread; per case band and seed_spread);
--markdown the per-case summary table (not both). A case given twice runs once. Offline; nothing is fitted to these cases."""


def band_cell(p: dict[str, Any]) -> str:
    """A point's band column: ``low-high``, ``*`` when the measurement is outside, ``KNIFE EDGE`` when flagged."""
    if p.get("predicted_low") is None:
        return "-"
    cell = f"{p['predicted_low']:.2f}-{p['predicted_high']:.2f}" + ("" if p["in_band"] else " *")
    return cell + (" KNIFE EDGE" if p["knife_edge"] else "")


def seed_cell(p: dict[str, Any]) -> str:
    """A point's seed-spread column: ``low-high``, ``*`` when the measurement is outside."""
    if p.get("seed_low") is None:
        return "-"
    return f"{p['seed_low']:.2f}-{p['seed_high']:.2f}" + ("" if p["in_seed_spread"] else " *")


def _print_case(c: dict[str, Any]) -> None:
    from rich.table import Table

    from kvplan.app.output import console

    con = console()
    s = c["summary"]
    src = c["source"]
    t = Table(title=f"{c['name']}: {c['title']}", title_justify="left")
    spread = c.get("seed_spread")
    seeds = spread is not None and not spread["deterministic"]  # a column of one value each says nothing
    cols = ("point", "metric", "measured", "predicted", "rel_error", "band") + (("seeds 0-3",) if seeds else ())
    for col in cols:
        t.add_column(col, justify="left" if col in ("point", "metric") else "right")
    for p in c["points"]:
        pred = f"{p['predicted']:.2f}" if p["predicted"] is not None else "-"
        err = f"{p['rel_error']:+.1%}" if p["rel_error"] is not None else "-"
        t.add_row(p["label"], p["metric"], f"{p['measured']:.2f}", pred, err, band_cell(p),
                  *((seed_cell(p),) if seeds else ()))
    for why in c["not_expressible"]:
        t.add_row("not expressible", why, *([""] * (len(cols) - 2)))
    con.print(t)
    con.print(f"  source: {src['repository']} {src['path']} @ {src['commit']} ({src['licence']})")
    con.print(f"  status: {c['status']}; profile: {c['profile'] or '-'}; predicts: {c['predicts']}")
    mape = f"{s['mape_pct']:.1f}%" if s["mape_pct"] is not None else "-"
    mx = f"{s['max_abs_error_pct']:.1f}%" if s["max_abs_error_pct"] is not None else "-"
    con.print(f"  summary: {s['predicted']} of {s['points']} points predicted, MAPE {mape}, max abs error {mx}")
    band = c.get("band")
    if band is not None:
        con.print(f"  band: {band['line']}", markup=False, highlight=False)
        for note in band["notes"][1:] if band["scaling"] is None else band["notes"]:
            con.print(f"    {note}", markup=False, highlight=False)
    if spread is not None:
        con.print(f"  seed spread: {spread['line']}", markup=False, highlight=False)
        for note in spread["notes"]:
            con.print(f"    {note}", markup=False, highlight=False)
    con.print("")


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""

    @app.command("validate", help=VALIDATE_HELP, short_help="Predictions against public measurements not fitted on.")
    def validate_cmd(
        case: list[str] = typer.Option([], "--case", help="Run only this case (repeatable; default: all)."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
        markdown: bool = typer.Option(False, "--markdown", help="Print the per-case summary as a Markdown table."),
        band_error: float | None = typer.Option(
            None, "--band-error", help="Relative GPU-compute error of the band for prefill and decode (e.g. 0.05), "
            "instead of each prior's stated one (an assumption you state)."),
    ) -> None:
        from kvplan.calibration.validate import json_ready, markdown_table, validate
        from kvplan.errors import input_error

        if json_out and markdown:  # before any work: one of them would be silently dropped
            raise input_error("--json --markdown", "are two output formats, only one can be printed",
                              "give one of them")
        results = validate(list(case), band_error)
        if json_out:
            typer.echo(json.dumps({"cases": json_ready(results)}, indent=2))
            return
        if markdown:
            typer.echo(markdown_table(results), nl=False)
            return
        for c in results:
            _print_case(c)
        typer.echo("band: low-high of the prediction with GPU compute x(1-e) and x(1+e); * measured outside; "
                   "KNIFE EDGE: the answer depends on the prior's error; seeds 0-3: lowest-highest prediction over "
                   "four seeds (a finite run's sampling spread), * measured outside")
