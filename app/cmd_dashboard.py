"""``kvplan dashboard [--port N]``: launch the Streamlit dashboard as a headless server and print its URL."""

from __future__ import annotations

import signal
import subprocess
import sys
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
    ]


def dashboard_url(port: int, address: str) -> str:
    """The URL a browser on this machine opens (``localhost`` for the wildcard addresses)."""
    host = "localhost" if address in ("0.0.0.0", "::", "") else address
    return f"http://{host}:{port}"


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""

    @app.command("dashboard", help="Launch the what-if dashboard (Streamlit, headless) and print its URL.")
    def dashboard_cmd(
        port: Annotated[int, typer.Option("--port", min=1, max=65535, help="TCP port to serve on.")] = DEFAULT_PORT,
        address: Annotated[
            str, typer.Option("--address", help="Interface to listen on (0.0.0.0 serves other machines too).")
        ] = "localhost",
    ) -> None:
        cmd = streamlit_command(port, address)
        typer.echo(f"kvplan dashboard: {dashboard_url(port, address)}  (Ctrl-C stops it)")
        # launching the server is this command's whole job, so a subprocess is right here
        proc = subprocess.Popen(cmd)
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
