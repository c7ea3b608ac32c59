"""``kvplan --help`` lists every command with a whole one-line summary (helper new15: click cut each first sentence
at ~45 characters, 'Recommend decoder_kv_blocks_ttl, kv_recompute_threshold and...', 'Find the smallest deployment
meeting --slo-ttft-p90-ms for...')."""

from __future__ import annotations

import typer
from typer.testing import CliRunner

from kvplan.app.cli import app


def test_every_command_summary_is_whole() -> None:
    res = CliRunner().invoke(app, ["--help"], terminal_width=200)
    assert res.exit_code == 0
    commands = res.output.split("Commands:")[1]
    root = typer.main.get_command(app)
    names = [n for n, c in root.commands.items() if not c.hidden]  # type: ignore[attr-defined]
    for name in names:
        line = next(ln for ln in commands.splitlines() if ln.split() and ln.split()[0] == name)
        assert not line.rstrip().endswith("..."), line
        assert len(line.split(None, 1)) == 2, line


def test_every_subcommand_summary_is_whole() -> None:
    """The groups' own --help (workload, native, profile) cut their commands' summaries the same way."""
    root = typer.main.get_command(app)
    for group in ("workload", "native", "profile"):
        res = CliRunner().invoke(app, [group, "--help"], terminal_width=200)
        assert res.exit_code == 0, res.output
        commands = res.output.split("Commands:")[1]
        for name in root.commands[group].commands:  # type: ignore[attr-defined]
            line = next(ln for ln in commands.splitlines() if ln.split() and ln.split()[0] == name)
            assert not line.rstrip().endswith("..."), line
