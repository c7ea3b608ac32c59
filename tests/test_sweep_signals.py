"""SIGTERM to ``kvplan sweep --workers 2`` (issue 22, item 6): the run ends like on Ctrl-C (exit 143), no process
of it is left behind (forkserver, resource tracker, workers), and ``--resume`` ends with byte-identical files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from kvplan.plan.sweep import parts_dir, run_grid, screen_path, summary_path

BASE: dict[str, Any] = {
    "model": "qwen3-32b",
    "hardware": "p5en",
    "deployment": {"max_num_seqs": 64, "prefill_prefix_caching": False},
    "workload": {
        "conversations": 120,
        "arrival": {"kind": "poisson", "rate_per_s": 0.5},
        "turns": {"dist": "constant", "value": 3},
        "prefix_tokens": {"dist": "lognormal", "median": 3000, "sigma": 0.5},
        "turn_gap_s": {"dist": "exponential", "mean": 20},
    },
    "seed": 3,
}
GRID = {"base": BASE, "axes": {"policy.decoder_kv_blocks_ttl_s": [10, 60, 480], "workload.turn_gap_s.mean": [5, 50]},
        "replications": 2}


def session_processes(sid: int) -> dict[int, str]:
    """pid -> command line of every live process in session ``sid`` (psutil when installed, else /proc)."""
    try:
        import psutil  # type: ignore[import-untyped]
    except ImportError:
        psutil = None
    found: dict[int, str] = {}
    if psutil is not None:
        for p in psutil.process_iter(["pid", "cmdline", "status"]):
            try:
                if os.getsid(p.info["pid"]) == sid and p.info["status"] != psutil.STATUS_ZOMBIE:
                    found[p.info["pid"]] = " ".join(p.info["cmdline"] or [])
            except (OSError, psutil.Error):
                continue
        return found
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if int(fields[3]) == sid and fields[0] != "Z":
            found[int(entry)] = cmd
    return found


def _wait(pred: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def _start_sweep(grid: Path, out: Path) -> tuple[subprocess.Popen[str], list[str], dict[str, str]]:
    """``kvplan sweep GRID --out OUT --workers 2`` in a session of its own: (process, command, environment)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    cmd = [sys.executable, "-m", "kvplan.app.cli", "sweep", str(grid), "--out", str(out), "--workers", "2"]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    return proc, cmd, env


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_of_a_pool_sweep_leaves_no_process_and_resume_is_identical(tmp_path: Path, sig: int) -> None:
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump(GRID))
    ref = tmp_path / "ref.parquet"
    run_grid(grid, out=ref, workers=1)
    out = tmp_path / "r.parquet"
    proc, cmd, env = _start_sweep(grid, out)
    try:
        parts = parts_dir(out)
        started = _wait(lambda: len(session_processes(proc.pid)) >= 4 and parts.exists()
                        and len(list(parts.glob("*/*.json"))) >= 1, 90)
        assert started and proc.poll() is None, "the sweep did not get going (or finished) before the signal"
        assert len(session_processes(proc.pid)) >= 4  # main, forkserver, resource tracker, 2 workers
        os.kill(proc.pid, sig)  # the main process only, as `kill -TERM PID` does
        code = proc.wait(timeout=60)
        err = proc.stderr.read() if proc.stderr else ""
        assert code == 128 + sig, err
        assert "interrupted" in err and "Traceback" not in err, err
        assert _wait(lambda: not session_processes(proc.pid), 15), f"left behind: {session_processes(proc.pid)}"
    finally:
        for pid in session_processes(proc.pid):
            os.kill(pid, signal.SIGKILL)
    assert not out.exists() and parts.exists()
    done = len(list(parts.glob("*/*.json")))
    assert 1 <= done < 12
    res = subprocess.run([*cmd, "--resume"], env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    for a, b in ((out, ref), (summary_path(out), summary_path(ref)), (screen_path(out), screen_path(ref))):
        assert a.read_bytes() == b.read_bytes(), a.name
    assert not parts.exists()


@pytest.mark.parametrize("after_s", [0.0, 0.05, 0.15, 0.3])
def test_a_signal_while_the_pool_starts_its_workers_prints_no_traceback(tmp_path: Path, after_s: float) -> None:
    """SIGTERM as the forkserver hands out the workers: a worker still being started when the pool was torn down
    used to fail unpickling the pool's gone semaphore and print the forkserver's traceback (executor.py now holds
    signals back while a submit may start one)."""
    grid = tmp_path / "g.yaml"
    grid.write_text(yaml.safe_dump(GRID))
    out = tmp_path / "r.parquet"
    proc, _, _ = _start_sweep(grid, out)
    try:
        started = _wait(lambda: any("forkserver" in c for c in session_processes(proc.pid).values()), 90)
        assert started and proc.poll() is None, "the pool did not start"
        time.sleep(after_s)
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=60)
        err = proc.stderr.read() if proc.stderr else ""
        assert code == 128 + signal.SIGTERM, err
        assert _wait(lambda: not session_processes(proc.pid), 15), f"left behind: {session_processes(proc.pid)}"
        err += proc.stderr.read() if proc.stderr else ""
        assert "Traceback" not in err and "Error" not in err, err
    finally:
        for pid in session_processes(proc.pid):
            os.kill(pid, signal.SIGKILL)
    assert not out.exists()
