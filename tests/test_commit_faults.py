"""Result-directory commits under faults (issue 22, items 3 and 5): SIGKILL at each rename, ENOSPC on each file,
two concurrent ``--overwrite`` runs, forged manifests, stale staging folders. Afterwards the directory holds
either the old complete result or the new complete result (after the next run's recovery), never a mix; files
kvplan did not write are never touched; and the next run succeeds.

Kills run the commit step in a child process (``python -c``, a few stdlib imports) under a time and memory
limit, with :func:`kvplan.atomic._rename` wrapped to SIGKILL the child before or after its k-th rename.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import kvplan.atomic as atomic
from kvplan.app.cli import main
from kvplan.atomic import RESULT_MANIFEST
from kvplan.atomic_dir import (
    JOURNAL,
    STAGE_MARK,
    ResultDirLock,
    check_result_dir,
    own_files,
    recover,
    write_result_dir_files,
)
from kvplan.errors import KvplanInputError

CHILD_TIME_S = 20.0
CHILD_MEM_BYTES = 1024**3
FOREIGN = {"notes.txt": b"precious user notes\n", "data.csv": b"a,b\n1,2\n"}
OLD = {"turns.csv": b"old turns\n" * 50, "pinned.csv": b"old pinned\n", "scenario.yaml": b"seed: 1\n",
       "summary.json": b'{"seed": 1}\n'}
NEW = {"turns.parquet": b"new turns\n" * 70, "pinned.parquet": b"new pinned\n", "scenario.yaml": b"seed: 2\n",
       "summary.json": b'{"seed": 2}\n'}
STAGED_NAMES = ("turns.parquet", "pinned.parquet")  # streamed into a staging folder, moved in by rename


def _limits() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (CHILD_MEM_BYTES * 4, CHILD_MEM_BYTES * 4))  # a python -c child
    resource.setrlimit(resource.RLIMIT_CPU, (int(CHILD_TIME_S), int(CHILD_TIME_S) + 1))


CHILD = textwrap.dedent("""
    import ast, os, signal, sys
    from pathlib import Path
    import kvplan.atomic as A
    from kvplan.atomic_dir import write_result_dir_files
    out, k, when, new = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3], ast.literal_eval(sys.argv[4])
    staged_names = {"turns.parquet", "pinned.parquet"}
    stage = out.parent / "stage-src"
    stage.mkdir(exist_ok=True)
    staged = {}
    for n in staged_names:
        (stage / n).write_bytes(new[n])
        staged[n] = stage / n
    files = {n: v for n, v in new.items() if n not in staged_names}
    count = [0]
    real = A._rename
    def hook(src, dst):
        count[0] += 1
        if count[0] == k and when == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        real(src, dst)
        if count[0] == k and when == "after":
            os.kill(os.getpid(), signal.SIGKILL)
    A._rename = hook
    write_result_dir_files(out, files, overwrite=True, staged=staged)
    print(count[0])
""")


def _child(out: Path, k: int, when: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    return subprocess.run([sys.executable, "-c", CHILD, str(out), str(k), when, repr(NEW)], capture_output=True,
                          text=True, timeout=CHILD_TIME_S, preexec_fn=_limits, env=env, check=False)


def _old_result(out: Path) -> None:
    out.mkdir(parents=True)
    for n, data in FOREIGN.items():
        (out / n).write_bytes(data)
    write_result_dir_files(out, OLD, overwrite=True)


def _state(out: Path) -> str:
    """'old', 'new' (complete, manifest matching) or 'incomplete'; asserts foreign files are intact."""
    for n, data in FOREIGN.items():
        assert (out / n).read_bytes() == data, n
    man = atomic.read_json_record(out / RESULT_MANIFEST)
    if man is None:
        return "incomplete"
    listed = set(man["files"])
    for name, want in (("old", OLD), ("new", NEW)):
        if listed == set(want) and all((out / n).read_bytes() == d for n, d in want.items()):
            # hidden bookkeeping of an unfinished commit (journal, old files aside) is checked after recovery
            present = {p.name for p in out.iterdir() if not p.name.startswith(".")} - set(FOREIGN)
            assert present == set(want), f"{name} result with extra files {present - set(want)}"
            return name
    raise AssertionError(f"a manifest over a mix: {sorted(listed)}")


def test_commit_counts_its_renames(tmp_path: Path) -> None:
    out = tmp_path / "r"
    _old_result(out)
    run = _child(out, 0, "never")
    assert run.returncode == 0, run.stderr
    assert int(run.stdout) >= 9  # journal, 4 old files aside, 2 staged, 2 new, manifest
    assert _state(out) == "new"


N_RENAMES = 10  # test_commit_counts_its_renames pins at least 9; the last k are past the end (no kill)


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("k", range(1, N_RENAMES + 2))
def test_sigkill_at_each_rename(tmp_path: Path, k: int, when: str) -> None:
    out = tmp_path / "r"
    _old_result(out)
    run = _child(out, k, when)
    killed = run.returncode == -signal.SIGKILL
    state = _state(out)
    if not killed:
        assert run.returncode == 0, run.stderr
        assert state == "new"
    # the next run takes the lock and finishes or undoes the commit: old or new, complete, nothing left over
    lock = ResultDirLock(out).acquire()
    try:
        recover(out)
    finally:
        lock.release()
    assert _state(out) in ("old", "new")
    leftovers = [p.name for p in out.iterdir() if p.name.endswith((".old", ".tmp")) or p.name == JOURNAL]
    assert leftovers == []
    # and succeeds, replacing kvplan's files only
    write_result_dir_files(out, {"summary.json": b"{}\n"}, overwrite=True)
    assert {p.name for p in out.iterdir()} == {*FOREIGN, "summary.json", RESULT_MANIFEST}
    for n, data in FOREIGN.items():
        assert (out / n).read_bytes() == data


@pytest.mark.parametrize("k", range(1, 6))
def test_enospc_on_each_file_keeps_the_old_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    """The k-th file the commit writes (journal, scenario.yaml, summary.json, manifest, ...) hits a full disk."""
    out = tmp_path / "r"
    _old_result(out)
    calls = [0]
    real = atomic._write_all

    def full(fh: Any, data: bytes) -> None:
        calls[0] += 1
        if calls[0] == k:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fh, data)

    monkeypatch.setattr(atomic, "_write_all", full)
    stage = tmp_path / "stage"
    stage.mkdir()
    staged = {}
    for n in STAGED_NAMES:
        (stage / n).write_bytes(NEW[n])
        staged[n] = stage / n
    files = {n: v for n, v in NEW.items() if n not in STAGED_NAMES}
    if k <= 4:
        with pytest.raises(KvplanInputError, match="no space left on device"):
            write_result_dir_files(out, files, overwrite=True, staged=staged)
        assert _state(out) == "old"  # undone at once
    else:
        write_result_dir_files(out, files, overwrite=True, staged=staged)  # past the last write
        assert _state(out) == "new"
    assert not [p for p in out.iterdir() if p.name.endswith((".old", ".tmp")) or p.name == JOURNAL]
    monkeypatch.setattr(atomic, "_write_all", real)
    write_result_dir_files(out, {"summary.json": b"{}\n"}, overwrite=True)  # the next run succeeds


# --- end to end through `kvplan simulate` ----------------------------------------------------------------------

SCENARIO = """model: qwen3-32b
hardware: p5en
workload:
  conversations: 8
  arrival: {kind: poisson, rate_per_s: 1.0}
  turns: {dist: constant, value: 2}
  prefix_tokens: {dist: constant, value: 1000}
  turn_gap_s: {dist: exponential, mean: 5}
seed: 1
"""


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file() and p.name != RESULT_MANIFEST}


def test_enospc_while_streaming_or_pinning_keeps_the_old_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    import kvplan.sim.result_files as rf

    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO)
    out = tmp_path / "r"
    assert main(["simulate", str(sc), "--out", str(out)]) == 0
    before = _files(out)

    def full(*_a: Any, **_k: Any) -> Any:
        raise OSError(errno.ENOSPC, "No space left on device")

    for target in ("write_turns", "_stage_pinned"):
        with monkeypatch.context() as m:
            if target == "write_turns":
                m.setattr(rf.ResultDirWriter, "write_turns", full)
            else:
                m.setattr(rf, "_stage_pinned", full)
            capsys.readouterr()
            assert main(["simulate", str(sc), "--out", str(out), "--overwrite", "--seed", "5"]) == 2
            assert len(capsys.readouterr().err.strip().splitlines()) == 1
        assert _files(out) == before, target
        assert sorted(p.name for p in tmp_path.iterdir()) == ["r", "s.yaml"], target  # no staging, no lock left
    assert main(["simulate", str(sc), "--out", str(out), "--overwrite", "--seed", "5"]) == 0
    assert json.loads((out / "summary.json").read_text())["seed"] == 5


def test_two_concurrent_overwrites_never_mix(tmp_path: Path) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO)
    kv = [sys.executable, "-m", "kvplan.app.cli"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    refs = {}
    for seed in ("1", "2"):
        ref = tmp_path / f"ref{seed}"
        subprocess.run([*kv, "simulate", str(sc), "--out", str(ref), "--seed", seed], check=True, env=env,
                       capture_output=True, timeout=120)
        refs[seed] = _files(ref)
    out = tmp_path / "r"
    subprocess.run([*kv, "simulate", str(sc), "--out", str(out)], check=True, env=env, capture_output=True, timeout=120)
    (out / "notes.txt").write_text("mine")
    procs = [subprocess.Popen([*kv, "simulate", str(sc), "--out", str(out), "--overwrite", "--seed", s], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for s in ("1", "2")]
    results = [(p.wait(timeout=120), p.stderr.read() if p.stderr else "") for p in procs]
    for code, err in results:
        assert code == 0 or (code == 2 and "another kvplan run" in err), err
    got = {k: v for k, v in _files(out).items() if k != "notes.txt"}
    assert got in (refs["1"], refs["2"]), "a mix of two runs"
    assert (out / "notes.txt").read_text() == "mine"
    assert subprocess.run([*kv, "simulate", str(sc), "--out", str(out), "--overwrite"], env=env,
                          capture_output=True, timeout=120).returncode == 0


def test_a_held_lock_refuses_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "r"
    lock = ResultDirLock(out).acquire()
    try:
        assert main(["simulate", "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"pid {os.getpid()}" in err and "another kvplan run" in err
        assert not out.exists()
    finally:
        lock.release()
    assert main(["simulate", "--out", str(out)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r"]  # the lock file went with the lock


@pytest.mark.parametrize("manifest", [
    {"writer": "kvplan", "files": ["turns.parquet", "notes.txt"]},  # the old format: names only
    {"writer": "kvplan", "files": {"notes.txt": {"size": 4, "sha256": "0" * 64}}},  # wrong digest
    {"writer": "kvplan", "files": {"../outside.txt": {"size": 4, "sha256": "0" * 64}}},  # not a plain name
    "not a mapping",
])
def test_a_forged_manifest_never_makes_a_user_file_deletable(tmp_path: Path, manifest: Any) -> None:
    out = tmp_path / "r"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    (tmp_path / "outside.txt").write_text("mine too")
    (out / RESULT_MANIFEST).write_text(json.dumps(manifest))
    assert "notes.txt" not in own_files(out)
    # a manifest that is not even kvplan's record (no "writer": "kvplan") is the user's file: refused, kept
    foreign = not (isinstance(manifest, dict) and manifest.get("writer") == "kvplan")
    assert main(["simulate", "--out", str(out), "--overwrite"]) == (2 if foreign else 0)
    assert (out / "notes.txt").read_text() == "mine"
    assert (tmp_path / "outside.txt").read_text() == "mine too"
    if foreign:
        assert json.loads((out / RESULT_MANIFEST).read_text()) == manifest


def test_a_forged_manifest_naming_a_result_file_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "r"
    out.mkdir()
    (out / "summary.json").write_text('{"mine": 1}')
    (out / RESULT_MANIFEST).write_text(json.dumps({"files": {"summary.json": {"size": 1, "sha256": "f" * 64}}}))
    with pytest.raises(KvplanInputError, match="did not write"):
        check_result_dir(out, ["summary.json"], overwrite=True)
    assert main(["simulate", "--out", str(out), "--overwrite"]) == 2
    assert (out / "summary.json").read_text() == '{"mine": 1}'


def _stage(parent: Path, name: str, marked: bool = True) -> Path:
    d = parent / name
    d.mkdir()
    (d / "turns.parquet").write_bytes(b"half")
    if marked:
        (d / STAGE_MARK).write_text("12345\n")
    return d


def test_stale_staging_folders_go_with_the_next_run_into_the_parent(tmp_path: Path) -> None:
    stale = _stage(tmp_path, ".a.abcd1234.stream")  # a killed run into a/: its lock is free
    busy = _stage(tmp_path, ".b.efgh5678.stream")  # a live run into b/ holds its lock
    user = _stage(tmp_path, ".c.ijkl9012.stream", marked=False)  # not kvplan's: no marker
    lock = ResultDirLock(tmp_path / "b").acquire()
    try:
        assert main(["simulate", "--out", str(tmp_path / "other")]) == 0
    finally:
        lock.release()
    assert not stale.exists() and busy.exists() and user.exists()
    assert (user / "turns.parquet").read_bytes() == b"half"


def _wait_for(pred: Any, timeout_s: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.02)
    return False


# long enough to be signalled mid-run: with 4,000 conversations (8,000 turns, ~0.2 s of simulation compiled) the
# run sometimes committed its result within the 0.3 s the test waits after the staging folder appears
LONG = SCENARIO.replace("conversations: 8", "conversations: 40000").replace("rate_per_s: 1.0", "rate_per_s: 20.0")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT, signal.SIGKILL])
def test_a_signalled_simulate_leaves_nothing_or_is_cleaned_by_the_next_run(tmp_path: Path, sig: int) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text(LONG)
    out = tmp_path / "r"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-m", "kvplan.app.cli", "simulate", str(sc), "--out", str(out)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=None)
    try:
        assert _wait_for(lambda: any(p.name.endswith(".stream") for p in tmp_path.iterdir())), "no staging folder"
        time.sleep(0.3)
        assert proc.poll() is None, "the run ended before the signal"
        os.kill(proc.pid, sig)
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    err = proc.stderr.read() if proc.stderr else ""
    assert not out.exists()
    if sig == signal.SIGKILL:
        assert code == -signal.SIGKILL
        assert any(p.name.endswith(".stream") for p in tmp_path.iterdir())
        small = tmp_path / "s2.yaml"
        small.write_text(SCENARIO)
        assert main(["simulate", str(small), "--out", str(tmp_path / "next")]) == 0
    else:
        assert code == 128 + sig, err
        assert "interrupted" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_a_user_file_named_like_a_lock_file_is_never_touched(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    mine = tmp_path / ".r.kvplan-lock"
    mine.write_text("my notes")
    assert main(["simulate", "--out", str(tmp_path / "r")]) == 2
    assert "not a kvplan lock file" in capsys.readouterr().err
    assert main(["simulate", "--out", str(tmp_path / "other")]) == 0  # its stale-lock sweep leaves it alone too
    assert mine.read_text() == "my notes"
    assert not (tmp_path / "r").exists()
