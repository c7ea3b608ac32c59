"""``kvplan recommend``: TTL, threshold and router TTL advice with the deployable config."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""

    @app.command("recommend")
    def recommend_cmd(
        scenario: Path | None = typer.Argument(None, help="Scenario YAML (default: the --workload preset)."),
        model: str = typer.Option("qwen3-32b", "--model", help="Model preset (with --workload)."),
        hardware: str = typer.Option("p5en", "--hardware", help="Hardware preset (with --workload)."),
        workload: str | None = typer.Option(None, "--workload", help="chat | coding-agent | tool-agent | p5en-benchmark."),
        rate: float | None = typer.Option(None, "--rate", help="New conversations per second (target load)."),
        slo_ttft_p90_ms: float | None = typer.Option(None, "--slo-ttft-p90-ms", help="TTFT p90 SLO in ms."),
        budget: float | None = typer.Option(None, "--decode-hbm-budget-gib", help="Max pinned decode KV (GiB, all D)."),
        replications: int = typer.Option(3, "--replications", help="Seeded replications per configuration."),
        ttl_grid: str | None = typer.Option(None, "--ttl-grid", help="TTLs to try, e.g. '30,60,120,300,480,900'."),
        workers: int = typer.Option(0, "--workers", help="Parallel runs (0 = all CPUs)."),
        json_out: bool = typer.Option(False, "--json", help="Print the recommendation as JSON."),
    ) -> None:
        """Recommend decoder_kv_blocks_ttl, kv_recompute_threshold and the router TTL from simulated sweeps.

        Prints expected TTFT p50/p90/p99 and hit rate against vLLM's defaults (480 s, 64) and bidirectional
        off, pinned decode HBM and decode batch capacity, the binding constraint, 95% CIs, both rules with
        their assumptions, and the --kv-transfer-config JSON for the prefill and decode servers.
        """
        from kvplan.app.cmd_sweep import _progress_bar
        from kvplan.app.output import console
        from kvplan.errors import input_error
        from kvplan.sim.advice import DEFAULT_TTL_GRID_S, recommend, render_text
        from kvplan.sim.presets import preset_scenario
        from kvplan.sim.scenario import ClosedLoopArrival, load_scenario, with_overrides

        if scenario is not None and workload is not None:
            raise input_error("recommend", "give SCENARIO.yaml or --workload, not both")
        if scenario is not None:
            sc = load_scenario(scenario)
            if rate is not None:
                if isinstance(sc.workload.arrival, ClosedLoopArrival):
                    raise input_error("--rate", "the scenario is closed-loop", "use a poisson arrival")
                sc = with_overrides(sc, {"workload.arrival.rate_per_s": rate})
        else:
            sc = preset_scenario(workload or "chat", model, hardware, rate_per_s=rate)
        grid = DEFAULT_TTL_GRID_S
        if ttl_grid is not None:
            try:
                grid = tuple(float(x) for x in ttl_grid.replace(" ", "").split(",") if x)
            except ValueError:
                raise input_error("--ttl-grid", f"'{ttl_grid}' is not a comma-separated list of seconds") from None
        bar, cb = _progress_bar()
        with bar:
            rec = recommend(sc, slo_ttft_p90_ms=slo_ttft_p90_ms, decode_hbm_budget_gib=budget, replications=replications,
                            ttl_grid=grid, progress=cb, workers=workers if workers > 0 else (os.cpu_count() or 1))
        if json_out:
            sys.stdout.write(rec.to_json() + "\n")
            return
        c = console()
        for line in render_text(rec):
            c.print(line, markup=False)
