"""The CLI reference (``docs/CLI.md``): every command and every option, rendered from the Typer app itself.

The README's command table shows the common forms; this file lists all of it, with each option's help text and
default, so nothing the CLI accepts is undocumented. ``tests/test_cli_reference.py`` fails when the file is stale;
regenerate it with ``python -m kvplan.app.cli_reference > docs/CLI.md``.
"""

from __future__ import annotations

from typing import Any

import typer

HEADER = ("# kvplan CLI reference\n\n"
          "Generated from the command-line app (`python -m kvplan.app.cli_reference > docs/CLI.md`; "
          "`tests/test_cli_reference.py` checks it is current). `kvplan COMMAND --help` prints the same.\n")


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _param_row(p: Any, ctx: Any) -> str:
    """One table row, from the parameter's own help record (what ``--help`` prints: flags, help, default)."""
    rec = p.get_help_record(ctx)
    if rec is None:
        return f"| `{p.name}` | {p.param_type_name} | |"
    flags, text = rec
    return f"| `{_cell(flags)}` | {p.param_type_name} | {_cell(text)} |"


def _walk(cmd: Any, path: list[str], out: list[str]) -> None:
    if hasattr(cmd, "commands"):  # a group
        for name in sorted(cmd.commands):
            sub = cmd.commands[name]
            if not sub.hidden:
                _walk(sub, [*path, name], out)
        return
    out.append(f"\n## `{' '.join(path)}`\n")
    if cmd.help:
        out.append(_cell(cmd.help.split("\n\n")[0]) + "\n")
    ctx = cmd.make_context(" ".join(path), [], resilient_parsing=True)
    params = [p for p in cmd.params if not getattr(p, "hidden", False) and p.name != "help"]
    if params:
        out.append("| parameter | kind | what it does |\n|---|---|---|")
        out.extend(_param_row(p, ctx) for p in params)


def render() -> str:
    """The reference as markdown."""
    from kvplan.app.cli import app

    root = typer.main.get_command(app)
    out = [HEADER]
    _walk(root, ["kvplan"], out)
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    print(render(), end="")
