"""A sweep's final files (review 2): written as a set, an interruption says what it kept, one sweep per --out."""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

import kvplan.plan.sweep as sweep
from kvplan.app.cli import main

GRID: dict[str, Any] = {
    "base": {"workload": {"conversations": 20, "arrival": {"kind": "poisson", "rate_per_s": 0.5}}},
    "axes": {"policy.decoder_kv_blocks_ttl_s": [30, 480]},
    "replications": 2,
}
FILES = ("r.parquet", "r.summary.parquet", "r.screen.parquet")


@pytest.fixture
def grid(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    p = tmp_path / "g.yaml"
    p.write_text(yaml.safe_dump(GRID))
    monkeypatch.chdir(tmp_path)
    return p


def _reference(tmp_path: Path, grid: Path) -> dict[str, bytes]:
    ref = tmp_path / "ref"
    ref.mkdir()
    assert main(["sweep", str(grid), "--out", str(ref / "r.parquet"), "--workers", "1"]) == 0
    return {f: (ref / f).read_bytes() for f in FILES}


def _idle_thread() -> threading.Event:
    """A thread that does not block signals (as the progress bar's refresh thread): the kernel may hand it a
    process-directed signal while the main thread holds them back."""
    stop = threading.Event()
    threading.Thread(target=stop.wait, daemon=True).start()
    return stop


def test_a_signal_while_the_final_files_are_written_leaves_the_whole_set(
        tmp_path: Path, grid: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """SIGTERM after the first final file is in place (another thread running, as in the CLI): the sweep left
    ``OUT.parquet`` without its summary and screen files and said 'nothing half-written was left'. Now the three go
    in together (signals wait until the last), and the set is the uninterrupted one."""
    ref = _reference(tmp_path, grid)
    real = sweep.atomic_write_bytes

    def write(path: Any, data: bytes, flag: str = "--out", **kw: Any) -> Path:
        out = real(path, data, flag, **kw)
        if Path(path).name == "r.summary.parquet":
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(sweep, "atomic_write_bytes", write)
    stop = _idle_thread()
    try:
        assert main(["sweep", str(grid), "--out", "r.parquet", "--workers", "1"]) == 128 + signal.SIGTERM
    finally:
        stop.set()
    assert "interrupted (SIGTERM)" in capsys.readouterr().err
    assert {f: (tmp_path / f).read_bytes() for f in FILES} == ref
    assert not (tmp_path / "r.parts").exists()  # retired with the set: nothing says the sweep is unfinished


def test_an_interrupted_sweep_says_it_kept_the_finished_runs_for_resume(
        tmp_path: Path, grid: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    ref = _reference(tmp_path, grid)
    capsys.readouterr()
    real = sweep.PartStore.commit
    done: list[int] = []

    def commit(self: Any, point: int, rep: int, row: dict[str, Any]) -> None:
        real(self, point, rep, row)
        done.append(point)
        if len(done) == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(sweep.PartStore, "commit", commit)
    assert main(["sweep", str(grid), "--out", "r.parquet", "--workers", "1"]) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert "sweep interrupted: 2 finished runs kept in r.parts/ for --resume" in err
    assert not any((tmp_path / f).exists() for f in FILES)
    monkeypatch.setattr(sweep.PartStore, "commit", real)
    assert main(["sweep", str(grid), "--out", "r.parquet", "--workers", "1", "--resume"]) == 0
    assert {f: (tmp_path / f).read_bytes() for f in FILES} == ref


def test_a_second_sweep_on_the_same_out_is_refused_while_the_first_runs(
        tmp_path: Path, grid: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A second sweep on the same --out was told to pass --resume while the first still ran (and, started together,
    both wrote the files). Now the first holds ``.OUT.kvplan-lock`` (as simulate locks its result directory) and the
    second is refused in one line naming the holder, before it touches anything."""
    import subprocess
    import sys

    holder = subprocess.Popen(
        [sys.executable, "-c", "from kvplan.atomic_dir import ResultDirLock\n"
         "lock = ResultDirLock('r.parquet').acquire()\nprint('held', flush=True)\ninput()\nlock.release()"],
        cwd=tmp_path, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)})
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert main(["sweep", str(grid), "--out", "r.parquet", "--workers", "1"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: --out r.parquet: another kvplan sweep (pid {holder.pid}) is writing it (it holds "
                       f"{tmp_path / '.r.parquet.kvplan-lock'}); wait for it to finish or choose another --out"]
        assert sorted(q.name for q in tmp_path.iterdir()) == [".r.parquet.kvplan-lock", "g.yaml"]  # nothing touched
    finally:
        holder.communicate("\n", timeout=30)
    assert main(["sweep", str(grid), "--out", "r.parquet", "--workers", "1"]) == 0  # free again
    assert not (tmp_path / ".r.parquet.kvplan-lock").exists()  # released with the run
