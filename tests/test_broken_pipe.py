"""A reader that closes stdout early (``kvplan ... | head -1``): the command ends quietly with 141 (128 + SIGPIPE,
what the shell reports for a standard tool SIGPIPE killed), prints no traceback and no error, and whatever it
committed before is complete; an error whose message cannot be printed keeps its exit status 2."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvplan.app.cli import STDOUT_CLOSED_STATUS, main

DATA = Path(__file__).parent / "data"
TRACE = DATA / "traces" / "weka_small.json"


def _run_with_closed_stdout(args: list[str], cwd: Path, stderr_too: bool = False) -> tuple[int, str]:
    """Run ``kvplan *args`` with stdout a pipe whose read end is closed before the child starts (so its first
    write fails, deterministically); stderr to a file (or the same closed pipe). Returns (status, stderr)."""
    r, w = os.pipe()
    os.close(r)
    err_path = cwd / "stderr.txt"
    with open(err_path, "wb") as err:
        proc = subprocess.run([sys.executable, "-m", "kvplan.app.cli", *args], stdout=w,
                              stderr=w if stderr_too else err, cwd=cwd, timeout=300, check=False)
    os.close(w)
    return proc.returncode, err_path.read_text()


@pytest.mark.parametrize("args", [
    ["cost", "--tokens", "1000"],                         # rich table
    ["cost", "--tokens", "1000", "--json"],               # typer.echo
    ["workload", "show", str(TRACE), "--json"],
    ["--help"],
])
def test_closed_stdout_ends_quietly_with_141(tmp_path: Path, args: list[str]) -> None:
    code, err = _run_with_closed_stdout(args, tmp_path)
    assert code == STDOUT_CLOSED_STATUS == 141
    assert err == ""


def test_an_error_whose_message_cannot_be_printed_keeps_status_2(tmp_path: Path) -> None:
    code, _ = _run_with_closed_stdout(["cost", "--tokens", "100000000000"], tmp_path, stderr_too=True)
    assert code == 2
    code, _ = _run_with_closed_stdout(["cost", "--no-such-flag"], tmp_path, stderr_too=True)
    assert code == 2


def test_a_result_committed_before_the_pipe_closed_is_complete(tmp_path: Path) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text("workload: {conversations: 3, turns: {dist: constant, value: 2}}\n")
    code, err = _run_with_closed_stdout(["simulate", str(sc), "--out", str(tmp_path / "o")], tmp_path)
    assert code == 141 and err == ""
    manifest = json.loads((tmp_path / "o" / ".kvplan-result.json").read_text())
    assert sorted(manifest["files"]) == ["pinned.parquet", "scenario.yaml", "summary.json", "turns.parquet"]
    assert all((tmp_path / "o" / f).stat().st_size == m["size"] for f, m in manifest["files"].items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o", "s.yaml", "stderr.txt"]  # no staging left


def test_an_epipe_of_another_stream_stays_an_error(monkeypatch: pytest.MonkeyPatch,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    """Only stdout's reader going away is the quiet 141; a broken pipe elsewhere (stdout fine) is an error."""
    import kvplan.models.hardware as hardware

    def broken(*_a: object, **_k: object) -> None:
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")

    monkeypatch.setattr(hardware, "get_hardware", broken)
    assert main(["cost", "--tokens", "1000"]) == 2
    assert "Broken pipe" in capfd.readouterr().err


@pytest.mark.parametrize("args", [["cost", "--tokens", "1000"], ["cost", "--tokens", "1000", "--json"]])
def test_a_stdout_closed_at_start_is_an_error_not_a_traceback_or_a_silent_success(tmp_path: Path,
                                                                                    args: list[str]) -> None:
    """``kvplan ... >&-``: Python starts with ``sys.stdout = None``; rich's console raised an AttributeError
    traceback, and a JSON result was dropped by click's echo with status 0."""
    proc = subprocess.run([sys.executable, "-m", "kvplan.app.cli", *args], stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=300, check=False,
                          preexec_fn=lambda: os.close(1))  # noqa: PLW1509 - the child must start with fd 1 closed
    assert proc.returncode == 2
    assert proc.stderr == ("error: standard output is closed; redirect it to a file or /dev/null instead (kvplan "
                           "prints its results there)\n")
