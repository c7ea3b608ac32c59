"""Run one ``kvplan`` command line in a forked child under a time and memory limit (hostile-input tests).

The child inherits the already-imported interpreter (a fork, so a case costs milliseconds, not an import),
limits its data segment (RLIMIT_DATA: heap and private writable mappings, so reserved-but-unused address
space of thread arenas does not count) to its current size plus :data:`MEM_LIMIT_BYTES`, sends stdout and stderr
to files and calls :func:`kvplan.app.cli.main`. The parent kills it after :data:`TIME_LIMIT_S`.
"""

from __future__ import annotations

import os
import resource
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import kvplan.app.cli  # noqa: F401 - imported before forking, so every child starts warm
import kvplan.calibration.traces  # noqa: F401
import kvplan.plan.sweep  # noqa: F401
import kvplan.sim.api  # noqa: F401

TIME_LIMIT_S = 10.0
#: A scenario of 5 two-turn conversations that simulates in well under a second (the hostile-input tests' valid base).
SMALL_SCENARIO = """model: qwen3-32b
hardware: p5en
workload:
  conversations: 5
  arrival: {kind: poisson, rate_per_s: 1.0}
  turns: {dist: constant, value: 2}
  prefix_tokens: {dist: constant, value: 1000}
  user_tokens: {dist: constant, value: 100}
  output_tokens: {dist: constant, value: 20}
  turn_gap_s: {dist: exponential, mean: 5}
"""
MEM_LIMIT_BYTES = 1024**3


@dataclass(frozen=True)
class Outcome:
    """What one command did: exit status (``None`` when killed at the time limit), outputs, wall time."""

    code: int | None
    stdout: str
    stderr: str
    wall_s: float


def _data_bytes() -> int:
    """This process's data segment (heap and private writable mappings: what RLIMIT_DATA limits)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0


def run_limited(argv: list[str], cwd: Path, time_limit_s: float = TIME_LIMIT_S) -> Outcome:
    """Run ``kvplan *argv`` in a forked child with ``cwd`` as working directory, under the limits."""
    out_f, err_f = cwd / ".hostile.stdout", cwd / ".hostile.stderr"
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:  # child
        code = 99
        try:
            os.chdir(cwd)
            fo = os.open(out_f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            fe = os.open(err_f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fo, 1)
            os.dup2(fe, 2)
            limit = _data_bytes() + MEM_LIMIT_BYTES
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
            import sys

            sys.stdout = os.fdopen(1, "w", closefd=False)
            sys.stderr = os.fdopen(2, "w", closefd=False)
            import logging

            # as in a real `kvplan` process: no handler on the root logger (pytest's log capture would swallow
            # a warning that a user sees on stderr as a second line)
            for handler in list(logging.root.handlers):
                logging.root.removeHandler(handler)
            from kvplan.app.cli import main

            try:
                code = main(argv)
            except MemoryError:
                import traceback

                traceback.print_exc()
                code = 98
            except BaseException:  # noqa: BLE001 - the test reports it
                import traceback

                traceback.print_exc()
                code = 97
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)
    status_code: int | None = None
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            status_code = os.waitstatus_to_exitcode(status)
            break
        if time.monotonic() - t0 > time_limit_s:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            break
        time.sleep(0.01)
    wall = time.monotonic() - t0
    stdout = out_f.read_text(errors="replace") if out_f.exists() else ""
    stderr = err_f.read_text(errors="replace") if err_f.exists() else ""
    for f in (out_f, err_f):
        f.unlink(missing_ok=True)
    return Outcome(status_code, stdout, stderr, wall)
