"""``kvplan sweep GRID.yaml --out RESULTS.parquet``: batch sweeps locally or on Ray, resumable."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import typer

SWEEP_HELP = """Run every point of GRID.yaml x K replications and write RESULTS.parquet (one row per point and
replication: axis values, point, replication, seed and every scalar summary metric), RESULTS.summary.parquet
(per-point mean and 95% t-interval) and RESULTS.screen.parquet (analytic screen vs simulator).

\b
GRID.yaml:
  base: scenario.yaml            # or an inline scenario mapping
  axes:                          # dotted scenario path -> list of values (cartesian product)
    policy.decoder_kv_blocks_ttl_s: [30, 60, 120, 300, 480, 900]
    workload.turn_gap_s.mean: [5, 30, 120]   # a parameter of the base's distribution (exponential: mean)
  ties:                          # optional: a path computed from an axis (PATH [* N] [+|- N], parsed, never eval'd)
    policy.router_ttl_s: "policy.decoder_kv_blocks_ttl_s - 10"
  zip:                           # optional: groups of equal-length lists that vary together (one dimension each)
    - {deployment.prefill_nodes: [1, 2], deployment.decode_nodes: [2, 4]}
  replications: 3                # optional (--replications overrides); replication k: seed k of SeedSequence(seed).spawn
  seed: 0                        # optional base seed (default: the base scenario's)

Every point is validated before any run. Each finished run is committed atomically, so a sweep killed at any
moment continues with --resume, recomputes nothing finished and ends with a byte-identical file.
"""


SUMMARY_COLUMNS = (("ttft_p50_s_mean", "TTFT p50"), ("ttft_p90_s_mean", "TTFT p90"), ("hit_rate_mean", "hit rate"),
                   ("pinned_kv_gib_peak_mean", "pinned peak GiB"), ("errors_mean", "errors"))
MAX_TABLE_ROWS = 40
#: The screen's figures compare_screen holds against the simulator (a point with none of them is not compared).
COMPARED_SCREEN_COLUMNS = ("screen_hit_rate", "screen_pinned_kv_gib_mean", "screen_prefill_utilization", "screen_feasible")


def print_summary_table(summ: Any, axes: list[str]) -> None:
    """Per-point means (axes, TTFT p50/p90 scaled for humans, hit rate, pinned peak) as a terminal table, each column
    in one unit and one precision over the rows shown (:func:`kvplan.app.output.seconds_column`, ``number_column``,
    ``axis_column``)."""
    import pandas as pd
    from rich.table import Table

    from kvplan.app.output import axis_column, console, number_column, seconds_column

    t = Table(title=f"per-point means ({len(summ)} points" + (f", first {MAX_TABLE_ROWS}" if len(summ) > MAX_TABLE_ROWS
                                                           else "") + ")")
    for a in axes:
        t.add_column(a, justify="right")
    cols = [(k, name) for k, name in SUMMARY_COLUMNS if k in summ.columns]
    for _, name in cols:
        t.add_column(name, justify="right")
    shown = summ.head(MAX_TABLE_ROWS)
    columns = [axis_column(list(shown[a])) for a in axes]
    for k, _ in cols:
        values = list(shown[k])
        text = (seconds_column(values) if k.startswith("ttft") else [f"{v:.1%}" for v in values]
                if k == "hit_rate_mean" else number_column(values))
        columns.append(text)
    for i, (_, r) in enumerate(shown.iterrows()):
        cells = [c[i] for c in columns]
        failed = "replications" in r.index and "errors" in r.index and int(r["errors"]) >= int(r["replications"])
        for j, (k, _) in enumerate(cols, start=len(axes)):
            if pd.isna(r[k]):  # no finished run to average (every run of the point failed), or no such figure
                cells[j] = "failed" if failed else "n/a"
        t.add_row(*cells)
    console().print(t)


def runs_header(df: Any, replications: int) -> str:
    """'N points x K replications = R runs' of the rows ``df``; with points run fewer times (``--prune``), how many
    and the sum: '4 points x 3 replications, 2 of them pruned to 1 (--prune) = 2 x 3 + 2 x 1 = 8 runs'."""
    per_point = df.groupby("point").size()
    n = len(per_point)
    counts = per_point.value_counts().sort_index(ascending=False)  # runs per point -> points
    head = f"{n} point{'s' * (n != 1)} x {replications} replication{'s' * (replications != 1)}"
    runs = f"{len(df)} run{'s' * (len(df) != 1)}"
    if list(counts.index) == [replications]:
        return f"{head} = {runs}"
    fewer = ", ".join(f"{int(k)} of them pruned to {int(r)}" for r, k in counts.items() if r != replications)
    terms = " + ".join(f"{int(k)} x {int(r)}" for r, k in counts.items())
    return f"{head}, {fewer} (--prune) = {terms} = {runs}"


def _progress_bar() -> tuple[Any, Any]:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    console = Console(stderr=True)
    bar = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("elapsed"), TimeElapsedColumn(),
        TextColumn("ETA"), TimeRemainingColumn(), console=console, transient=False,
    )
    state: dict[str, Any] = {}
    if not console.is_terminal:  # a log or a CI job: rich draws nothing until the end, so a plain line now and then
        return contextlib.nullcontext(), _plain_progress(sys.stderr)

    def cb(done: int, total: int) -> None:
        if "task" not in state:
            bar.start()  # at the first count: an input error raised before any run stays one line (no bar, no blank)
            # resumed runs are counted at creation, so they do not inflate the speed estimate behind the ETA
            state["task"] = bar.add_task("simulating", total=total, completed=done)
        else:
            bar.update(state["task"], completed=done, total=total)

    @contextlib.contextmanager
    def shown() -> Iterator[None]:
        try:
            yield
        finally:
            if "task" in state:
                bar.stop()

    return shown(), cb


#: With stderr not a terminal, a progress line at most this often (wall seconds), and at the last run.
PLAIN_PROGRESS_EVERY_S = 30.0


def _plain_progress(stream: Any, every_s: float = PLAIN_PROGRESS_EVERY_S,
                    clock: Callable[[], float] = time.monotonic) -> Callable[[int, int], None]:
    """A progress callback writing ``simulating: 12/50 runs, 3m05s elapsed`` to ``stream`` at most every ``every_s``
    and at the last run (in15: a 694 s capacity run with stderr redirected said nothing until it ended)."""
    t0 = clock()
    state = {"last": t0}

    def cb(done: int, total: int) -> None:
        now = clock()
        if done < total and now - state["last"] < every_s:
            return
        state["last"] = now
        el = int(now - t0)
        try:
            stream.write(f"simulating: {done}/{total} runs, {el // 60}m{el % 60:02d}s elapsed\n")
            stream.flush()
        except (OSError, ValueError):  # stderr closed or gone: progress is not worth failing a run over
            pass

    return cb


def grid_inputs(grid: Path) -> list[Path]:
    """The grid file and, when its ``base:`` names one, the base scenario file (relative to the grid)."""
    out = [grid]
    from kvplan.errors import KvplanInputError
    from kvplan.sim.scenario import read_yaml_file

    try:
        data = read_yaml_file(grid, "grid")
    except (KvplanInputError, OSError):  # load_grid reports a bad grid file in one line
        return out
    base = data.get("base") if isinstance(data, dict) else None
    if isinstance(base, str):
        out.append(grid.parent / base)
    return out


def steady_sweep_conversations(grid: Any, rows: Any, points: Any) -> tuple[int, int] | None:
    """(conversations the base asks for, conversations at the same rates whose steady windows start after the
    ramp-up in every run of ``points``), or None when no run measured its spans. The window of a run is the second
    half of its arrivals (``t_b / 2`` to ``t_b``, :mod:`kvplan.plan.executor`), past the ramp-up when ``t_b / 2``
    reaches TTL (retention on) + p90 conversation span: conversations x 2 (TTL + span) / ``t_b``."""
    import math

    need = 0.0
    for p in {int(x) for x in points}:
        sc = grid.scenario(p)
        retained = sc.policy.bidirectional and sc.deployment.mode != "aggregated"
        ttl = sc.policy.decoder_kv_blocks_ttl_s if retained else 0.0
        runs = rows[(rows["point"] == p) & rows["error"].isna()]
        for _, r in runs.iterrows():
            t_b, span, n = (float(r.get(k, math.nan)) for k in ("arrival_span_s", "conversation_span_p90_s",
                                                                "conversations"))
            if all(math.isfinite(x) for x in (t_b, span, n)) and t_b > 0:
                need = max(need, sc.workload.conversations * 2 * (ttl + span) / t_b)
    if need <= 0:
        return None
    return grid.base.workload.conversations, int(math.ceil(need))


def raise_conversations_text(grid: Any, rows: Any, points: Any) -> str:
    """'raise workload.conversations to at least N (from M) ...', or without a number when no run measured its spans
    (it said only 'raise workload.conversations')."""
    got = steady_sweep_conversations(grid, rows, points)
    if got is None or got[1] <= got[0]:
        return "raise workload.conversations"
    return (f"raise workload.conversations to at least {got[1]:,} (from {got[0]:,}; the base's: a point that sets its "
            "own scales with it): the second half of the arrivals then starts after TTL + the p90 conversation span "
            "measured here (a floor: a longer run's conversations can span longer)")


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""

    @app.command("sweep", help=SWEEP_HELP, short_help="Every point of a grid of scenario fields x replications.")
    def sweep_cmd(
        grid: Path = typer.Argument(..., help="Grid YAML (base + axes)."),
        out: Path = typer.Option(..., "--out", help="Results file (.parquet)."),
        backend: str = typer.Option("local", "--backend", help="local (process pool) or ray."),
        workers: int = typer.Option(0, "--workers", min=0, help="Parallel runs (0 = all CPUs; 1 = in-process)."),
        ray_address: str | None = typer.Option(None, "--ray-address", help="Ray cluster address (default: local Ray)."),
        replications: int | None = typer.Option(None, "--replications", help="Seeded replications per point."),
        resume: bool = typer.Option(False, "--resume", help="Continue an interrupted sweep of the same grid."),
        yes: bool = typer.Option(
            False, "--yes", help="Allow grids of more than 10,000 points, 100,000 runs or 10^9 planned turns."),
        prune: bool = typer.Option(False, "--prune", help="One replication for points the screen deems saturated."),
        csv_out: Path | None = typer.Option(None, "--csv", help="Also write the per-point summary as CSV."),
        show_disagreements: bool = typer.Option(
            False, "--show-disagreements", help="List every point where the analytic screen disagrees."
        ),
        overwrite: bool = typer.Option(
            False, "--overwrite", help="Replace existing output files kvplan did not write (its own it replaces anyway)."
        ),
    ) -> None:
        from kvplan.app.flags import MAX_WORKERS, check_ray_address
        from kvplan.app.output import console
        from kvplan.errors import input_error
        from kvplan.plan.grid import MAX_REPLICATIONS, load_grid
        from kvplan.plan.sweep import check_sweep_outputs, run_grid, screen_path, summary_path

        if out.suffix != ".parquet":
            example = out.with_suffix(".parquet") if out.name else Path("results.parquet")  # '.' or '/': no name
            raise input_error(f"--out {out}", "results are Parquet files", f"give a path ending in .parquet "
                              f"(e.g. {example}); --csv {example.with_suffix('.csv')} writes a CSV too")
        inputs = grid_inputs(grid)
        check_sweep_outputs(out, overwrite, inputs, [("--csv", csv_out)])  # every output, before any work
        if backend not in ("local", "ray"):
            raise input_error("--backend", f"'{backend}' is not a backend", "use local or ray")
        check_ray_address(ray_address, backend)
        if workers > MAX_WORKERS:
            raise input_error("--workers", f"{workers} is more than {MAX_WORKERS}", "give at most the CPUs you have")
        if replications is not None and not 1 <= replications <= MAX_REPLICATIONS:
            raise input_error("--replications", f"{replications} is not in 1..{MAX_REPLICATIONS}")
        g = load_grid(grid, yes=yes)
        check_sweep_outputs(out, overwrite, [*inputs, *g.input_files()], [("--csv", csv_out)])
        n_workers = workers if workers > 0 else (os.cpu_count() or 1)
        bar, cb = _progress_bar()
        try:
            with bar:
                df = run_grid(g, replications=replications, backend=backend, workers=n_workers, ray_address=ray_address,
                              progress=cb, out=out, resume=resume, yes=yes, prune=prune, overwrite=overwrite,
                              inputs=inputs)
        except KeyboardInterrupt:
            from kvplan.plan.sweep import committed_runs, parts_dir

            if (kept := committed_runs(out)):
                typer.echo(f"sweep interrupted: {kept} finished run{'s' * (kept != 1)} kept in {parts_dir(out)}/ for "
                           f"--resume (rerun with --resume to continue; {out} and its summary and screen files are "
                           "written together when the sweep completes)", err=True)
            raise
        import pandas as pd

        c = console()
        errors = int(df["error"].notna().sum())
        reps = replications if replications is not None else g.replications
        c.print(f"{runs_header(df, reps)} ({errors} failed); wrote {out}, {summary_path(out)}, {screen_path(out)}")
        if errors:
            first = df.loc[df["error"].notna()].iloc[0]
            c.print(f"first failure: point {int(first['point'])}: {first['error']}")
        summ = pd.read_parquet(summary_path(out))
        print_summary_table(summ, g.axis_names)
        if csv_out is not None:
            from kvplan.atomic import atomic_write_bytes

            atomic_write_bytes(csv_out, summ.to_csv(index=False, float_format="%.9g", lineterminator="\n").encode(), "--csv",
                               overwrite=overwrite, inputs=[*inputs, *g.input_files()])
            c.print(f"wrote {csv_out}")
        scr = pd.read_parquet(screen_path(out))
        from kvplan.plan.screen import CLOSED_LOOP_DECLINED, TRACE_DECLINED

        declined = scr["screen_declined"] if "screen_declined" in scr.columns else pd.Series("", index=scr.index)
        for kind, why in (("closed loop", CLOSED_LOOP_DECLINED), ("trace", TRACE_DECLINED)):
            if (n_declined := int((declined == kind).sum())):
                c.print(f"analytic screen: {n_declined} {why}")
        unjudged = scr["simulator_runs"] == 0 if "simulator_runs" in scr.columns else pd.Series(False, index=scr.index)
        if (n_unjudged := int(unjudged.sum())):
            ps = scr.loc[unjudged, "point"]
            c.print(f"analytic screen: {n_unjudged} point{'s' * (n_unjudged > 1)} not compared, every run failed (no "
                    f"simulator verdict): point{'s' * (n_unjudged > 1)} " + ", ".join(str(int(p)) for p in ps.head(20))
                    + (", ..." if n_unjudged > 20 else ""))
        ramp = scr[scr["not_steady"] != ""] if "not_steady" in scr.columns else scr.iloc[:0]
        if len(ramp):
            c.print(f"analytic screen: {len(ramp)} of {len(scr)} points not compared on steady-state figures (listed "
                    "as not_steady): their simulated steady window starts in the ramp-up (before TTL + p90 "
                    "conversation span for pinned KV, one p90 span for P's load), so the run is too short to confirm "
                    f"or refute the screen; {raise_conversations_text(g, df, ramp['point'])}", markup=False)
            if show_disagreements:
                for _, r in ramp.iterrows():
                    c.print(f"  point {int(r['point'])}: {r['not_steady']}", markup=False)
        dis = scr[scr["disagreements"] != ""]
        if len(dis):
            c.print(f"analytic screen vs simulator: {len(dis)} of {len(scr)} points disagree (the simulator wins; "
                    f"details in {screen_path(out)}" + (")" if show_disagreements else ", or --show-disagreements)"))
            if show_disagreements:
                for _, r in dis.iterrows():
                    c.print(f"  point {int(r['point'])}: {r['disagreements']}")
        else:
            compared = scr[[k for k in COMPARED_SCREEN_COLUMNS if k in scr.columns]].notna().any(axis=1) & ~unjudged
            if not compared.any():
                c.print("analytic screen: no point compared with the simulator")
            else:
                c.print("analytic screen and simulator agree on every point"
                        + ("" if compared.all() and not len(ramp) else " compared"))
        if len(df) and errors == len(df):
            # the files are complete and record each failure, but nothing was simulated: a script must not read a
            # zero status as a sweep that ran (status 1, as a command that ran and failed; 2 stays bad input)
            typer.echo(f"error: every run of the sweep failed (first failure above; each is in {out}'s error column)",
                       err=True)
            raise typer.Exit(1)
