"""``kvplan dashboard [--port N]``: launch the Streamlit dashboard as a headless server and print its URL."""

from __future__ import annotations

import errno
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

#: The Streamlit entry script (``app/dashboard.py`` next to this file).
DASHBOARD_SCRIPT = Path(__file__).resolve().parent / "dashboard.py"
DEFAULT_PORT = 8501


def streamlit_command(port: int, address: str) -> list[str]:
    """The ``streamlit run`` command line of the dashboard (headless, on ``address:port``).

    Uploads are capped at the dashboard's own limit; usage statistics stay off (no outbound calls).
    """
    from kvplan.app.dash_upload import MAX_UPLOAD_MB

    return [
        sys.executable, "-m", "streamlit", "run", str(DASHBOARD_SCRIPT),
        "--server.headless", "true",
        "--server.port", str(port),
        "--server.address", address,
        "--server.maxUploadSize", str(MAX_UPLOAD_MB),
        "--browser.gatherUsageStats", "false",
        "--client.toolbarMode", "minimal",  # no Deploy button or developer menu for an operator's tool
        # an unexpected exception shows its type only: its message could quote a file the server read
        "--client.showErrorDetails", "type",
    ]


def serve_env(serve_dir: Path | None) -> dict[str, str]:
    """The Streamlit process's environment: this one, with the served directory (or none) in
    ``dash_serve.SERVE_DIR_ENV``; the dashboard reads typed server paths only under it."""
    from kvplan.app.dash_serve import SERVE_DIR_ENV

    env = {k: v for k, v in os.environ.items() if k != SERVE_DIR_ENV}
    if serve_dir is not None:
        env[SERVE_DIR_ENV] = os.path.realpath(serve_dir)
    return env


def check_serve_dir(serve_dir: Path | None) -> None:
    """Refuse a ``--serve-dir`` that is not an existing directory (before Streamlit starts)."""
    from kvplan.errors import input_error

    if serve_dir is not None and not serve_dir.is_dir():
        raise input_error(f"--serve-dir {serve_dir}", "is not an existing directory",
                          "pass the directory holding the traces the dashboard may replay, or leave it out "
                          "(uploads only)")


def dashboard_url(port: int, address: str) -> str:
    """The URL a browser on this machine opens (``localhost`` for the wildcard addresses)."""
    host = "localhost" if address in ("0.0.0.0", "::", "") else address
    return f"http://{host}:{port}"


def check_listen(port: int, address: str) -> None:
    """Refuse, before launching Streamlit, an address that does not resolve or is not this machine's, or a port
    that cannot be bound (in use, or privileged): Streamlit itself only logs it and exits 0."""
    from kvplan.errors import input_error

    try:
        infos = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        raise input_error(f"--address {address}", "is not a host name or IP address of this machine",
                          "use localhost, 127.0.0.1 or 0.0.0.0") from None
    family, _, _, _, sockaddr = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(sockaddr)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:  # the address is no interface of this machine: not the port's fault
                raise input_error(f"--address {address}", f"is not an address of this machine ({exc.strerror or exc})",
                                  "use localhost, 127.0.0.1, 0.0.0.0 or one of this machine's own addresses") from None
            raise input_error(f"--port {port}", f"cannot listen on {address}:{port} ({exc.strerror or exc})",
                              "choose another --port (e.g. 8502) or stop what holds it") from None


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


@contextmanager
def running_dashboard(
    port: int | None = None, address: str = "127.0.0.1", log: Path | None = None, timeout_s: float = 60.0,
    serve_dir: Path | None = None,
) -> Iterator[str]:
    """Run the dashboard server for the duration of a ``with`` block and yield its URL once healthy.

    Used by the browser test and the re-render benchmark. The server is polled on ``/_stcore/health``
    until it answers ``ok``; on exit it is terminated (killed after 10 s). Raises ``RuntimeError``
    with the end of the server log when it exits or is not healthy within ``timeout_s``.
    """
    import urllib.request  # here, not at the top: it loads ssl and http, which no other command needs

    port = port or free_port(address)
    cmd = [*streamlit_command(port, address), "--server.fileWatcherType", "none"]
    out = log.open("wb") if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=serve_env(serve_dir))
    url = f"http://{address}:{port}"

    def tail() -> str:
        return log.read_text(errors="replace")[-2000:] if log is not None else "(no log)"

    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"streamlit exited with status {proc.returncode}: {tail()}")
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as resp:
                    if resp.read().strip() == b"ok":
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"streamlit not healthy after {timeout_s:.0f} s: {tail()}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log is not None and hasattr(out, "close"):
            out.close()


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""

    @app.command("dashboard", help="Launch the what-if dashboard (Streamlit, headless) and print its URL.",
                 short_help="The what-if dashboard (Streamlit); prints its URL.")
    def dashboard_cmd(
        port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port to serve on.")] = DEFAULT_PORT,
        address: Annotated[
            str, typer.Option("--address", help="Interface to listen on (0.0.0.0 serves other machines too).")
        ] = "localhost",
        serve_dir: Annotated[
            Path | None, typer.Option("--serve-dir", help="Directory whose trace files the What-if page may replay by "
                                      "path (default: none, uploads only; nothing outside it is read).")
        ] = None,
    ) -> None:
        check_serve_dir(serve_dir)
        check_listen(port, address)
        cmd = streamlit_command(port, address)
        typer.echo(f"kvplan dashboard: {dashboard_url(port, address)}  (Ctrl-C stops it)")
        # launching the server is this command's whole job, so a subprocess is right here
        proc = subprocess.Popen(cmd, env=serve_env(serve_dir))
        # a SIGTERM to this command stops the server too (no orphaned streamlit)
        signal.signal(signal.SIGTERM, lambda _signum, _frame: proc.terminate())
        try:
            code = proc.wait()
        except KeyboardInterrupt:
            proc.terminate()
            try:
                code = proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
        if code not in (0, -15):
            raise typer.Exit(code)
