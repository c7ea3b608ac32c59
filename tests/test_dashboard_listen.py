"""``kvplan dashboard`` checks where it will listen before Streamlit starts: an address that is not this machine's
is the --address's fault, a port in use the --port's (one line each, exit 2, no server left running)."""

from __future__ import annotations

import socket

import pytest

from kvplan.app.cli import main
from kvplan.app.cmd_dashboard import check_listen
from kvplan.errors import KvplanInputError

NOT_HERE = "192.0.2.1"  # TEST-NET-1 (RFC 5737): never an address of this machine


def test_an_address_of_another_machine_names_the_address(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dashboard", "--address", NOT_HERE, "--port", "8765"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --address {NOT_HERE}: is not an address of this machine") and err.count("\n") == 1
    assert "--port" not in err


def test_a_port_in_use_names_the_port() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(KvplanInputError, match=rf"^--port {port}: cannot listen on 127\.0\.0\.1:{port}"):
            check_listen(port, "127.0.0.1")
