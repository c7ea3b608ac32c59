"""docs/CLI.md lists every command and option the CLI accepts (generated; stale -> this fails)."""

from __future__ import annotations

from pathlib import Path

import typer

from kvplan.app.cli import app
from kvplan.app.cli_reference import render

DOC = Path(__file__).resolve().parents[1] / "docs" / "CLI.md"


def test_cli_reference_is_current() -> None:
    assert DOC.read_text() == render(), "docs/CLI.md is stale: python -m kvplan.app.cli_reference > docs/CLI.md"


def test_every_option_of_every_command_is_in_the_reference() -> None:
    text = DOC.read_text()
    root = typer.main.get_command(app)
    seen = 0
    stack = [root]
    while stack:
        cmd = stack.pop()
        if hasattr(cmd, "commands"):
            stack.extend(c for c in cmd.commands.values() if not c.hidden)
            continue
        for p in cmd.params:
            for opt in getattr(p, "opts", []):
                if opt.startswith("--") and opt != "--help":
                    assert f"`{opt}" in text, f"{cmd.name}: {opt} missing from docs/CLI.md"
                    seen += 1
    assert seen > 50  # the walk reached the commands
