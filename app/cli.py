"""The ``kvplan`` command line. Each sub-command lives in ``app/cmd_<name>.py`` with a ``register(app)``.

User errors (:class:`kvplan.errors.KvplanInputError`, bad flags) print one line and exit with status 2,
never a traceback.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer

import kvplan.sim.engine  # noqa: F401 - first: the engine installs the compiled hot path (sim/engine.py)
from kvplan.app import (
    cmd_calibrate,
    cmd_capacity,
    cmd_compare,
    cmd_cost,
    cmd_dashboard,
    cmd_memory,
    cmd_native,
    cmd_profile,
    cmd_recommend,
    cmd_reproduce,
    cmd_simulate,
    cmd_sweep,
    cmd_validate,
    cmd_workload,
)
from kvplan.app.flags import refuse_empty_paths
from kvplan.errors import KvplanInputError

#: Sub-command modules in ``--help`` order, imported explicitly so that the layer contract sees every edge.
COMMAND_MODULES = (
    cmd_simulate, cmd_calibrate, cmd_reproduce, cmd_cost, cmd_memory, cmd_profile, cmd_sweep, cmd_recommend, cmd_capacity,
    cmd_compare, cmd_workload,
    cmd_dashboard, cmd_validate, cmd_native,
)

app = typer.Typer(
    name="kvplan",
    help="Simulator and capacity planner for bidirectional KV-cache transfer in vLLM P/D disaggregated serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


@app.callback()
def _root() -> None:
    """Simulator and capacity planner for bidirectional KV-cache transfer in vLLM P/D disaggregated serving."""


for _module in COMMAND_MODULES:
    _module.register(app)


def fail(message: str) -> None:
    """Print a one-line error and exit with status 2."""
    typer.echo(f"error: {' '.join(message.split())}", err=True)
    raise typer.Exit(2)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where the program is, so that a run ends like on Ctrl-C (clean-up included)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


_RECEIVED: list[int] = []  # signals of this run (typer turns the interrupt into a bare exit status 130)


def _raise_terminated(signum: int, _frame: object) -> None:
    _RECEIVED.append(signum)
    raise Terminated(signum)


@contextmanager
def _signals_end_like_sigint() -> Iterator[None]:
    """While the block runs, SIGINT, SIGTERM and SIGHUP raise :class:`Terminated` (main thread only)."""
    saved: dict[int, Any] = {}
    _RECEIVED.clear()
    try:
        for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            if sig is not None:
                saved[sig] = signal.signal(sig, _raise_terminated)
    except ValueError:  # not the main thread: leave the handlers alone
        pass
    try:
        yield
    finally:
        for sig, old in saved.items():
            signal.signal(sig, old)


def _interrupted(exc: KeyboardInterrupt) -> int:
    """One line on stderr and the exit status 128 + N of the signal (SIGINT, or SIGTERM/SIGHUP)."""
    signum = exc.signum if isinstance(exc, Terminated) else int(signal.SIGINT)
    typer.echo(f"interrupted ({signal.Signals(signum).name}): nothing half-written was left", err=True)
    return 128 + signum


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point. SIGINT, SIGTERM and SIGHUP end a run the same way: its temporary files
    are removed, nothing half-written is left, and the exit status is 128 + the signal's number."""
    with _signals_end_like_sigint():
        return _main(argv)


def _main(argv: list[str] | None) -> int:
    try:
        # without standalone mode click *returns* the code of a ``typer.Exit`` raised by a command; the
        # command tree as ``app()`` builds it, its path parameters refusing an empty value (app/flags.py)
        rv = refuse_empty_paths(typer.main.get_command(app))(args=argv, standalone_mode=False)
        if rv == 130 and _RECEIVED:  # typer's status for any interrupt: give the signal's own
            return _interrupted(Terminated(_RECEIVED[-1]))
        if isinstance(rv, int) and not isinstance(rv, bool):
            return rv
    except KvplanInputError as exc:
        typer.echo(f"error: {exc}", err=True)
        return 2
    except typer.Exit as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):
            return _interrupted(exc.__cause__)
        return int(exc.exit_code or 0)
    except SystemExit as exc:  # pragma: no cover - click may still raise it
        return int(exc.code or 0) if isinstance(exc.code, int) else 2
    except OSError as exc:
        # an unwritable or unreadable path the user gave (results are written atomically, so nothing
        # half-written is left behind)
        where = f" '{exc.filename}'" if getattr(exc, "filename", None) else ""
        typer.echo(f"error: cannot access{where}: {exc.strerror or exc}", err=True)
        return 2
    except KeyboardInterrupt as exc:
        return _interrupted(exc)
    except Exception as exc:
        # click usage errors (typer vendors click, so match by behaviour rather than by class)
        show, code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(code, int):
            fmt = getattr(exc, "format_message", None)
            if type(exc).__name__ == "NoArgsIsHelpError" or not callable(fmt):
                show()
                return code
            ctx = getattr(exc, "ctx", None)
            cmd = " ".join(["kvplan", *(ctx.command_path.split()[1:] if ctx is not None else [])])
            if ctx is not None and ctx.command_path.startswith("python"):
                cmd = " ".join(["kvplan", *ctx.command_path.split()[3:]])
            typer.echo(f"error: {cmd}: {' '.join(str(fmt()).split())}; see `{cmd} --help`", err=True)
            return code
        if type(exc).__name__ == "Abort":
            return 1
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
