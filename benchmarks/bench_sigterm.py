"""How fast ``kill -TERM`` ends a ``kvplan sweep --workers 2`` whose points each take several seconds (issue 22, item 6).

Starts the documented command on a 6-point x 2-replication grid of 3,000-conversation points in its own session,
waits until the pool is up and busy, sends SIGTERM to the main process only (as ``kill -TERM PID`` does) and
reports the exit status, the seconds until the main process exited and until no process of the session (main,
forkserver, resource tracker, workers) was left. Writes benchmarks/results/sigterm.json.

    .venv/bin/python benchmarks/bench_sigterm.py
"""

from __future__ import annotations

import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from kvplan.atomic import atomic_write_bytes

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from test_sweep_signals import GRID, session_processes  # noqa: E402

BUSY_S = 3.0  # the pool runs this long before the signal


def main() -> None:
    grid = json.loads(json.dumps(GRID))
    grid["base"]["workload"].update(conversations=3000, arrival={"kind": "poisson", "rate_per_s": 5.0})
    with tempfile.TemporaryDirectory(prefix="kvplan-sigterm-") as tmp:
        g = Path(tmp) / "g.yaml"
        g.write_text(yaml.safe_dump(grid))
        cmd = [sys.executable, "-m", "kvplan.app.cli", "sweep", str(g), "--out", str(Path(tmp) / "r.parquet"),
               "--workers", "2"]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        while len(session_processes(proc.pid)) < 5 and proc.poll() is None:
            time.sleep(0.05)
        time.sleep(BUSY_S)
        before = len(session_processes(proc.pid))
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=600)
        exit_s = time.monotonic() - t0
        while session_processes(proc.pid) and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        left = session_processes(proc.pid)
        gone_s = time.monotonic() - t0
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    result = {"processes_before": before, "exit_status": code, "exit_after_s": round(exit_s, 2),
              "no_process_after_s": round(gone_s, 2), "left_behind": len(left), "machine": platform.machine(),
              "cpus": os.cpu_count()}
    print(json.dumps(result, indent=2))
    atomic_write_bytes(HERE / "results" / "sigterm.json", (json.dumps(result, indent=2) + "\n").encode(), ledger=False)


if __name__ == "__main__":
    main()
