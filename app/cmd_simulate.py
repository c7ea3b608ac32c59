"""``kvplan simulate``: run one scenario and write ``turns.csv`` and ``summary.json``."""

from __future__ import annotations

from pathlib import Path

import typer

from kvplan.sim.scenario import field_help

_HELP_FIELDS = "\n".join(f"  {path} = {default}: {desc}" for path, default, desc in field_help())

SIMULATE_HELP = f"""Simulate SCENARIO.yaml (or the embedded P5en default when omitted) and write DIR/turns.csv,
DIR/summary.json, DIR/pinned.csv and DIR/scenario.yaml (a new DIR
appears only when complete; a non-empty DIR is refused unless --overwrite, which replaces only kvplan's own
files there).

Distributions: {{dist: constant, value}} | {{dist: exponential, mean}} | {{dist: lognormal, median, sigma}} |
{{dist: uniform, low, high}} | {{dist: empirical, values: [...] | path: FILE}}. Token and turn counts are
rounded to integers (turns >= 1, outputs >= 1). Arrival: {{kind: poisson, rate_per_s}} or
{{kind: closed_loop, clients, max_active_conversations}}. costs.<prefill|transfer|decode|overhead> given
inline replace only the parameters they name; the rest stay the resolved profile's.

\b
Scenario fields (dotted path = default: meaning):
{_HELP_FIELDS}
"""


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""

    @app.command("simulate", help=SIMULATE_HELP)
    def simulate_cmd(
        scenario: Path | None = typer.Argument(None, help="Scenario YAML (default: the embedded P5en benchmark)."),
        out: Path = typer.Option(..., "--out", help="Output directory."),
        seed: int | None = typer.Option(None, "--seed", min=0, max=2**63 - 1, help="Override the scenario's seed."),
        trace: Path | None = typer.Option(None, "--trace", help="Replay a request trace instead of the synthetic workload."),
        json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
        overwrite: bool = typer.Option(
            False, "--overwrite", help="Reuse a non-empty DIR: replace kvplan's own result files, keep all others."
        ),
        verbose: bool = typer.Option(False, "--verbose", help="Also list the modelling assumptions of the run."),
    ) -> None:
        from kvplan.app.output import print_summary
        from kvplan.atomic import check_result_dir
        from kvplan.sim.api import run
        from kvplan.sim.defaults import default_scenario
        from kvplan.sim.results import result_file_names, write_result_dir
        from kvplan.sim.scenario import load_scenario, with_overrides

        check_result_dir(out, result_file_names(), overwrite)  # before any work: never lose a user's files
        sc = load_scenario(scenario) if scenario is not None else default_scenario()
        if trace is not None and sc.workload.trace is not None:
            from kvplan.errors import input_error

            raise input_error("--trace", f"the scenario already replays workload.trace '{sc.workload.trace.path}'",
                              "remove one of them")
        if trace is not None:
            sc = with_overrides(sc, {"workload.trace": {"path": str(trace)}})
        result = run(sc, seed)
        write_result_dir(result, out, overwrite=overwrite)
        print_summary(result, out, as_json=json_out, verbose=verbose)
