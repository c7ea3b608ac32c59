"""``kvplan native build|status``: the compiled build of the simulator's hot path (sim/native.py)."""

from __future__ import annotations

import typer

BUILD_HELP = """Compile the simulator's hot modules with mypyc (pip install 'kvplan[native]'; needs a C compiler) for
the sources as they are now. Later runs use the build only while every source file it depends on (the package
root, models, sim and traces; not plan, calibration or app) is unchanged; otherwise (or with KVPLAN_NATIVE=0) the
same model runs in pure Python, several times slower (README, Performance, has the measured figures). Results are
byte-identical either way."""


def register(app: typer.Typer) -> None:
    """Add the ``native`` command group to the CLI."""
    group = typer.Typer(help="The compiled build of the simulator's hot path (same results, several times faster).",
                        no_args_is_help=True)
    app.add_typer(group, name="native", short_help="Compile the hot path (build) or say which build runs.")

    @group.command("build", help=BUILD_HELP, short_help="Compile the hot modules with mypyc (same results, ~6x faster).")
    def build_cmd() -> None:
        from kvplan.sim import native

        if native.current_build() is not None:
            typer.echo(f"compiled build is current: {native.cache_dir() / native.source_digest()}")
            return
        native.check_cache_dir()  # a bad KVPLAN_NATIVE_DIR is refused before the compile, not after it
        typer.echo(f"compiling {len(native.HOT_MODULES)} modules with mypyc (about 30 s) ...")
        try:
            path = native.build()
        except RuntimeError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from exc
        typer.echo(f"compiled build written: {path} (used by the next kvplan process)")

    @group.command("status", help="Whether this process runs the compiled build, and why.")
    def status_cmd() -> None:
        from kvplan.sim import native

        st = native.status()
        state = "compiled" if st["active"] else "pure Python"
        typer.echo(f"{state}: {st['reason']} (sources {st['digest']}, builds in {st['cache_dir']})")
