"""``kvplan simulate``: run one scenario and stream ``turns.parquet`` (or ``turns.csv``) and ``summary.json``."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from kvplan.sim.scenario import MAX_SEED, field_help

if TYPE_CHECKING:
    from kvplan.sim.engine import ProgressHook

_HELP_FIELDS = "\n".join(f"  {path} = {default}: {desc}" for path, default, desc in field_help())

SIMULATE_HELP = f"""Simulate SCENARIO.yaml (or the embedded P5en default when omitted) and write DIR/turns.parquet
(--format csv: turns.csv, both: both), DIR/summary.json, DIR/pinned.parquet (pinned.csv) and DIR/scenario.yaml.
Turns are streamed as the run goes (memory stays bounded); DIR appears or is updated only when the run is
complete; a non-empty DIR is refused unless --overwrite, which replaces only kvplan's own files there.

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

    @app.command("simulate", help=SIMULATE_HELP, short_help="One run of a scenario: turns, summary.json, pinned KV.")
    def simulate_cmd(
        scenario: Path | None = typer.Argument(None, help="Scenario YAML (default: the embedded P5en benchmark)."),
        out: Path = typer.Option(..., "--out", help="Output directory."),
        seed: int | None = typer.Option(None, "--seed", min=0, max=MAX_SEED, help="Override the scenario's seed."),
        trace: Path | None = typer.Option(None, "--trace", help="Replay a request trace instead of the synthetic workload."),
        json_out: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
        overwrite: bool = typer.Option(
            False, "--overwrite", help="Reuse a non-empty DIR: replace kvplan's own result files, keep all others."
        ),
        fmt: str = typer.Option("parquet", "--format", help="turns/pinned file format: parquet (zstd), csv or both."),
        verbose: bool = typer.Option(False, "--verbose", help="Also list the modelling assumptions of the run."),
        allow_unreliable: bool = typer.Option(
            False, "--allow-unreliable-profile",
            help="Use a profile of status 'unreliable' (a calibration that failed its self-check) anyway.",
        ),
    ) -> None:
        from kvplan.app.output import print_summary
        from kvplan.atomic_dir import check_result_dir
        from kvplan.plan.grid import scenario_input_files
        from kvplan.sim.api import run
        from kvplan.sim.defaults import default_scenario, trace_replay_scenario
        from kvplan.sim.results import ResultDirWriter, result_file_names
        from kvplan.sim.scenario import load_scenario, with_overrides

        names = result_file_names(None, fmt)
        inputs: list[Path | str | None] = [scenario, trace]
        check_result_dir(out, names, overwrite, inputs=inputs)  # before any work: never lose a user's files
        if scenario is not None:
            sc = load_scenario(scenario)
            if trace is not None:
                if sc.workload.trace is not None:
                    from kvplan.errors import input_error

                    raise input_error("--trace", f"the scenario already replays workload.trace "
                                      f"'{sc.workload.trace.path}'", "remove one of them")
                sc = with_overrides(sc, {"workload.trace": {"path": os.path.abspath(trace)}})
        elif trace is not None:  # the trace on the scenario defaults, as the dashboard replays one
            sc = trace_replay_scenario(os.path.abspath(trace))
        else:
            sc = default_scenario()
        if allow_unreliable:
            sc = with_overrides(sc, {"simulation.allow_unreliable_profile": True})
        writer = ResultDirWriter(out, fmt, overwrite, inputs=[*inputs, *scenario_input_files(sc)])
        try:
            with sim_progress(enabled=not json_out) as hook:
                result = run(sc, seed, keep=False, sink=writer.write_turns, progress=hook)
        except BaseException:
            writer.abort()
            raise
        writer.commit(result)
        if trace is not None and scenario is None:  # said (after the run: an input error stays one line)
            dep = sc.deployment
            typer.echo(f"note: --trace without a scenario replays the trace on the scenario defaults "
                       f"({dep.prefill_nodes}P{dep.decode_nodes}D {sc.hardware} {sc.model}, TP "
                       f"{dep.tensor_parallel_size}, max_num_seqs {dep.max_num_seqs}, max_num_batched_tokens "
                       f"{dep.max_num_batched_tokens}, bidirectional {'on' if sc.policy.bidirectional else 'off'}); "
                       "give a scenario YAML with your deployment to replay it "
                       "on yours", err=True)
        print_summary(result, out, as_json=json_out, verbose=verbose, files=names)


@contextmanager
def sim_progress(enabled: bool, after_s: float = 2.0) -> Iterator[ProgressHook | None]:
    """A rich progress bar over simulated time (ETA from it) for runs that last more than ``after_s`` wall
    seconds; nothing when disabled or when stderr is not a terminal."""
    import sys
    import time

    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn("simulating"), BarColumn(), TextColumn("{task.fields[now]:>10,.0f} / {task.total:,.0f} s simulated"),
        TimeElapsedColumn(), TimeRemainingColumn(), transient=True,
    )
    state: dict[str, Any] = {"task": None}
    t0 = time.perf_counter()

    def hook(now: float, horizon: float) -> None:
        if state["task"] is None:
            if time.perf_counter() - t0 < after_s:
                return
            bar.start()
            state["task"] = bar.add_task("sim", total=max(horizon, 1.0), now=0.0)
        bar.update(state["task"], completed=min(now, horizon), now=now)

    try:
        yield hook
    finally:
        if state["task"] is not None:
            bar.stop()
