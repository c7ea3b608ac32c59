"""The ``kvplan`` command line. Each sub-command lives in ``app/cmd_<name>.py`` with a ``register(app)``.

User errors (:class:`kvplan.errors.KvplanInputError`, bad flags) print one line and exit with status 2,
never a traceback. A reader that closes stdout early (``kvplan ... | head -1``) ends the command quietly with
the status a standard tool killed by SIGPIPE gives, 141 (:func:`_stdout_closed`).
"""

from __future__ import annotations

import errno
import os
import select
import signal
import sys
from collections.abc import Callable, Iterator
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
from kvplan.app.logs import warnings_once
from kvplan.errors import KvplanInputError, clip_message

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
    _say(f"error: {' '.join(message.split())}")
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
    _say(f"interrupted ({signal.Signals(signum).name}): nothing half-written was left")
    return 128 + signum


#: Exit status when stdout's reader has gone: 128 + SIGPIPE, what the shell reports for a tool SIGPIPE killed
#: (``yes | head -1``), in line with the 128 + N of SIGINT, SIGTERM and SIGHUP above.
STDOUT_CLOSED_STATUS = 128 + int(getattr(signal, "SIGPIPE", 13))


def _epipe(exc: BaseException | None) -> OSError | None:
    """The EPIPE ``exc`` is, or was raised from or during (click and rich turn an EPIPE into ``SystemExit(1)``)."""
    for _ in range(8):  # a short chain; never loop on a cycle
        if exc is None:
            return None
        if isinstance(exc, OSError) and exc.errno == errno.EPIPE:
            return exc
        exc = exc.__cause__ or exc.__context__
    return None


def _stdout_identity() -> tuple[int, int] | None:
    """(device, inode) of the file descriptor behind stdout, None when there is none."""
    try:
        st = os.fstat(sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):  # replaced by a stream without a descriptor (tests)
        return None
    return st.st_dev, st.st_ino


_STDOUT_AT_START: list[tuple[int, int] | None] = []  # stdout's identity when this run started (main)


def _stdout_reader_gone() -> bool:
    """Whether stdout's reader has gone: poll reports POLLERR/POLLHUP for writing to it (a pipe or socket nobody
    reads), or its descriptor is no longer the one the run started with (rich's ``Console.on_broken_pipe`` has
    already pointed it at /dev/null). True where poll cannot tell (no ``select.poll``), as click assumes."""
    now = _stdout_identity()
    if now is None:
        return False
    if _STDOUT_AT_START and _STDOUT_AT_START[-1] not in (None, now):
        return True
    if not hasattr(select, "poll"):  # pragma: no cover - not on Linux/macOS
        return True
    poller = select.poll()
    poller.register(sys.stdout.fileno(), select.POLLOUT)
    return any(ev & (select.POLLERR | select.POLLHUP) for _fd, ev in poller.poll(0))


def _stdout_closed() -> int:
    """Stdout's reader has gone: point stdout at /dev/null, so that the interpreter's last flush of what is still
    buffered does not fail again ("Exception ignored ... BrokenPipeError"; the recipe of Python's ``signal``
    docs), and end quietly with :data:`STDOUT_CLOSED_STATUS`. Nothing is printed: the reader chose to stop, and
    stderr may be the same closed pipe. Whatever the command wrote before (a result directory, an output file) is
    complete, as every result is committed atomically before it is printed; a command stopped before its commit
    left nothing, its clean-up having run as the error unwound."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (AttributeError, OSError, ValueError):
        pass
    return STDOUT_CLOSED_STATUS


def _os_error(exc: OSError) -> int:
    """One line for an unwritable or unreadable path the user gave (results are written atomically, so nothing
    half-written is left behind); status 2."""
    where = f" '{exc.filename}'" if getattr(exc, "filename", None) else ""
    _say(f"error: cannot access{where}: {exc.strerror or exc}")
    return 2


def _quiet_on_closed_pipe(write: Callable[[], object]) -> None:
    """Run ``write``; a stream nobody reads any more (``kvplan ... 2>&1 | head -1``) loses the text quietly, and
    the caller still returns its own exit status."""
    try:
        write()
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise


def _say(message: str) -> None:
    """One line on stderr, whatever the message holds (a file name may contain a newline), as
    :class:`~kvplan.errors.KvplanInputError` makes its own (:func:`_quiet_on_closed_pipe`)."""
    line = clip_message(" ".join(message.split()))  # a 100 kB unknown option is not echoed whole
    _quiet_on_closed_pipe(lambda: typer.echo(line, err=True))


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point. SIGINT, SIGTERM and SIGHUP end a run the same way: its temporary files
    are removed, nothing half-written is left, and the exit status is 128 + the signal's number."""
    if sys.stdout is None:  # fd 1 closed at start (`kvplan ... >&-`): Python leaves sys.stdout None
        # every command prints its result or what it wrote there: refused before any work, as a write error would
        # be (a traceback from rich, or a silently dropped JSON with status 0, before)
        _say("error: standard output is closed; redirect it to a file or /dev/null instead (kvplan prints its "
             "results there)")
        return 2
    _STDOUT_AT_START[:] = [_stdout_identity()]
    with _signals_end_like_sigint(), warnings_once():  # each distinct warning once per command (app/logs.py)
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
        _say(f"error: {exc}")
        return 2
    except typer.Exit as exc:
        if isinstance(exc.__cause__, KeyboardInterrupt):
            return _interrupted(exc.__cause__)
        return int(exc.exit_code or 0)
    except SystemExit as exc:  # click's and rich's EPIPE handling raise it; otherwise pragma: no cover
        pipe = _epipe(exc)
        if pipe is not None:
            return _stdout_closed() if _stdout_reader_gone() else _os_error(pipe)
        return int(exc.code or 0) if isinstance(exc.code, int) else 2
    except OSError as exc:
        if _epipe(exc) is not None and _stdout_reader_gone():  # outside the command (e.g. printing a usage error)
            return _stdout_closed()
        return _os_error(exc)
    except KeyboardInterrupt as exc:
        return _interrupted(exc)
    except Exception as exc:
        # click usage errors (typer vendors click, so match by behaviour rather than by class)
        show, code = getattr(exc, "show", None), getattr(exc, "exit_code", None)
        if callable(show) and isinstance(code, int):
            fmt = getattr(exc, "format_message", None)
            if type(exc).__name__ == "NoArgsIsHelpError" or not callable(fmt):
                _quiet_on_closed_pipe(show)
                return code
            ctx = getattr(exc, "ctx", None)
            cmd = " ".join(["kvplan", *(ctx.command_path.split()[1:] if ctx is not None else [])])
            if ctx is not None and ctx.command_path.startswith("python"):
                cmd = " ".join(["kvplan", *ctx.command_path.split()[3:]])
            _say(f"error: {cmd}: {' '.join(str(fmt()).split())}; see `{cmd} --help`")
            return code
        if type(exc).__name__ == "Abort":
            return 1
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
