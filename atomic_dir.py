"""Result directories (``kvplan simulate --out DIR``): complete or recognisably incomplete, never a mix.

* **Lock.** One run at a time writes ``DIR``: an exclusive non-blocking ``flock`` of ``.DIR.kvplan-lock`` next
  to it (holding the owner's pid), taken before any work and held until the commit is done; a second run
  refuses at once, naming the pid. The kernel drops the lock of a killed run.
* **Staging.** Streamed files go to a hidden ``.DIR.XXXXXXXX.stream/`` next to ``DIR`` (marked by a
  ``.kvplan-staging`` file inside), removed on every exit path; ones left by killed runs (their directory's
  lock is free) are removed by the next run into the same parent.
* **Manifest.** ``.kvplan-result.json`` lists each file of the result with its size and sha256; it is written
  last. Only files that still match it are kvplan's: a forged manifest naming a user file with other bytes
  makes nothing of it deletable.
* **Journal.** Committing into an existing ``DIR`` first writes ``.kvplan-commit.json`` (old and new files
  with their digests), then removes the manifest (so a half-done commit never looks complete), moves kvplan's
  old files aside (``.NAME.XXXXXXXX.old``), renames the new ones in, writes the manifest, and only then drops
  the old files and the journal. A commit that fails (``ENOSPC``) is undone at once; one that is killed
  (SIGKILL) is finished or undone by the next run that takes the lock: the old complete result comes back
  unless the new manifest was already written. Files kvplan did not write are never moved or deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import kvplan.atomic as _atomic
from kvplan.atomic import (
    RESULT_MANIFEST,
    PathLike,
    bytes_digest,
    deferred_signals,
    file_digest,
    matches,
    read_json_record,
    same_as_input,
    write_new_file,
    write_record,
)
from kvplan.errors import input_error

JOURNAL = ".kvplan-commit.json"
STAGE_MARK = ".kvplan-staging"
_STAGE = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.stream$")
_LOCK = re.compile(r"^\.(?P<name>.+)\.kvplan-lock$")
_TEMP = re.compile(r"^\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp$")
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
Entries = dict[str, dict[str, Any]]


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# --- the lock ----------------------------------------------------------------------------------------------


class ResultDirLock:
    """The exclusive lock of one result directory: ``flock`` of ``.DIR.kvplan-lock`` in its parent.

    :meth:`acquire` refuses (one-line error) when another process holds it; :meth:`try_acquire` says so.
    Released (and the lock file removed, safely: a waiter re-checks the inode) by :meth:`release`.
    """

    def __init__(self, out: PathLike, flag: str = "--out") -> None:
        self.out = Path(out)
        self.flag = flag
        self.path = self.out.absolute().parent / f".{self.out.name}.kvplan-lock"
        self.fd: int | None = None

    def _check_node(self) -> None:
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return
        ok = stat.S_ISREG(st.st_mode) and st.st_size <= 32
        if ok:
            try:
                ok = re.fullmatch(rb"\d*\n?", self.path.read_bytes()) is not None  # empty, or the pid of a run
            except OSError:
                ok = False
        if not ok:
            raise input_error(f"{self.flag} {self.out}", f"'{self.path}' exists and is not a kvplan lock file",
                              "move it away")

    def try_acquire(self) -> bool:
        """Take the lock if it is free (True), else False."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            self._check_node()
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                return False
            try:
                same = os.stat(self.path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if not same:  # released and removed by its owner between our open and flock: retry
                os.close(fd)
                continue
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
            self.fd = fd
            return True

    def holder(self) -> str:
        """The pid the lock file names (``?`` when unreadable)."""
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"

    def acquire(self) -> ResultDirLock:
        """Take the lock or refuse: another kvplan run is writing the directory."""
        if not self.try_acquire():
            raise input_error(f"{self.flag} {self.out}", f"another kvplan run (pid {self.holder()}) is writing this "
                              "directory", "wait for it to finish or choose another directory")
        return self

    def release(self) -> None:
        """Drop the lock and its file."""
        if self.fd is None:
            return
        try:
            self.path.unlink(missing_ok=True)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = None


def clean_stale_stages(parent: Path, own: str | None = None) -> list[str]:
    """Remove kvplan staging folders in ``parent`` left by killed runs (their directory's lock is free, or it
    is ``own``'s, whose lock the caller holds), and free lock files of killed runs. Returns the folders removed."""
    removed: list[str] = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    for e in entries:
        lk = _LOCK.match(e.name)
        if lk and lk["name"] != own and e.is_file(follow_symlinks=False):
            other = ResultDirLock(parent / lk["name"])
            with contextlib.suppress(Exception):
                if other.try_acquire():
                    other.release()  # a lock file left by a killed run: removed with the lock
            continue
        m = _STAGE.match(e.name)
        if not m or not e.is_dir(follow_symlinks=False) or not os.path.isfile(os.path.join(e.path, STAGE_MARK)):
            continue
        if m["name"] == own:
            shutil.rmtree(e.path, ignore_errors=True)
            removed.append(e.name)
            continue
        other = ResultDirLock(parent / m["name"])
        try:
            free = other.try_acquire()
        except Exception:  # noqa: BLE001 - a foreign node at the lock path: leave that folder alone
            continue
        if free:
            try:
                shutil.rmtree(e.path, ignore_errors=True)
                removed.append(e.name)
            finally:
                other.release()
    return removed


def make_stage(out: Path) -> Path:
    """A new marked staging folder ``.DIR.XXXXXXXX.stream`` next to ``out``."""
    parent = out.absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".stream", dir=parent))
    (stage / STAGE_MARK).write_text(f"{os.getpid()}\n")
    return stage


# --- records -----------------------------------------------------------------------------------------------


def _entries(record: Any, key: str) -> Entries:
    """``{name: {size, sha256}}`` under ``key`` of a manifest or journal (plain names only)."""
    raw = record.get(key) if isinstance(record, dict) else None
    if not isinstance(raw, dict):
        return {}
    out: Entries = {}
    for name, e in raw.items():
        if isinstance(name, str) and _NAME.match(name) and isinstance(e, dict):
            if isinstance(e.get("size"), int) and isinstance(e.get("sha256"), str):
                out[name] = {"size": e["size"], "sha256": e["sha256"]}
    return out


def _verified(p: Path, entries: Entries) -> Entries:
    return {n: e for n, e in entries.items() if matches(p / n, [e])}


def own_files(p: Path) -> set[str]:
    """Names in ``p`` that are kvplan's: manifest (or pending-journal) entries whose bytes still match."""
    own = set(_verified(p, _entries(read_json_record(p / RESULT_MANIFEST), "files")))
    journal = read_json_record(p / JOURNAL)
    if journal is not None:
        own |= set(_verified(p, _entries(journal, "old"))) | set(_verified(p, _entries(journal, "new")))
        aside = journal.get("aside") if isinstance(journal, dict) else None
        own |= {a for a in (aside or {}).values() if isinstance(a, str) and _NAME.match(a.lstrip("."))}
    return own


def _clean_temps(p: Path, names: set[str]) -> None:
    """Remove temporary files of killed writes of ``names`` (kvplan-named, inside a kvplan result)."""
    try:
        for e in os.scandir(p):
            m = _TEMP.match(e.name)
            if m and m["name"] in names and e.is_file(follow_symlinks=False):
                os.unlink(e.path)
    except OSError:
        pass


def recover(p: Path) -> str | None:
    """Finish or undo a commit into ``p`` that was interrupted (a journal is there); the caller holds the lock.

    Returns 'forward', 'back' or None (nothing to do).
    """
    jp = p / JOURNAL
    journal = read_json_record(jp)
    if journal is None:
        _clean_temps(p, {RESULT_MANIFEST, JOURNAL})
        return None
    old, new = _entries(journal, "old"), _entries(journal, "new")
    aside_raw = journal.get("aside") if isinstance(journal, dict) else None
    aside = {n: a for n, a in (aside_raw or {}).items() if n in old and isinstance(a, str) and "/" not in a}
    manifest = read_json_record(p / RESULT_MANIFEST)
    if manifest is not None and _entries(manifest, "files") == new:
        how = "forward"  # the new manifest was written: only the old files and the journal remained to go
        for n, a in aside.items():
            if matches(p / a, [old[n]]):
                (p / a).unlink()
    else:
        how = "back"
        for n, e in new.items():
            moved = n in aside and os.path.lexists(p / aside[n])
            if (n not in old or moved) and matches(p / n, [e]):
                (p / n).unlink()  # a new file already in place: not part of the old result
        for n, a in aside.items():
            if matches(p / a, [old[n]]) and not os.path.lexists(p / n):
                _atomic._rename(p / a, p / n)
        if old:
            write_record(p / RESULT_MANIFEST, {"writer": "kvplan", "files": old})
    _clean_temps(p, set(old) | set(new) | {RESULT_MANIFEST, JOURNAL})
    jp.unlink(missing_ok=True)
    return how


# --- the check ---------------------------------------------------------------------------------------------


def check_result_dir(
    out: PathLike, names: list[str] | tuple[str, ...], overwrite: bool, flag: str = "--out",
    inputs: Iterable[PathLike | None] = (),
) -> Path:
    """Check before any work that ``out`` can receive the result files ``names`` without losing anything.

    A new or empty directory is fine. A non-empty one is refused unless ``overwrite``; with it, only files
    kvplan wrote there (matching its manifest, or the journal of an interrupted commit) may be replaced, and
    every other file is kept. A result file that is not a regular file, or that is one of the command's
    ``inputs``, is refused either way.
    """
    if str(out).strip() == "":
        raise input_error(flag, "is empty", "give a directory name, e.g. --out results/run1")
    p = Path(out)
    if os.path.lexists(p) and not p.is_dir():
        raise input_error(f"{flag} {p}", "exists and is not a directory", "give a new or existing directory")
    parent = p.absolute().parent
    if parent.exists() and not parent.is_dir():
        raise input_error(f"{flag} {p}", f"'{parent}' is not a directory", "give a path inside a directory")
    if not p.exists():
        return p
    try:
        entries = sorted(e.name for e in p.iterdir())
    except OSError as exc:
        raise input_error(f"{flag} {p}", f"cannot read the directory ({exc.strerror or exc})") from None
    inputs = list(inputs)
    for n in names:
        clash = same_as_input(p / n, inputs)
        if clash is not None:
            raise input_error(f"{flag} {p}", f"its '{n}' is the input '{clash}' of this command",
                              "write the result to another directory")
    if not entries:
        return p
    if not overwrite:
        raise input_error(
            f"{flag} {p}", f"is not empty ({len(entries)} entries)",
            "choose a new directory, or pass --overwrite to replace kvplan's own result files there (other files are kept)",
        )
    own = own_files(p)
    for n in [*names, RESULT_MANIFEST, JOURNAL]:
        q = p / n
        if not os.path.lexists(q):
            continue
        if not stat.S_ISREG(os.lstat(q).st_mode):
            raise input_error(f"{flag} {p}", f"its '{n}' is not a regular file", "move it away or choose another directory")
        if n in (RESULT_MANIFEST, JOURNAL) and _atomic.foreign_record(q):  # the commit would replace or remove it
            raise input_error(
                f"{flag} {p}", f"holds '{n}', which kvplan did not write there (kvplan keeps its record of a result "
                "under that name)", "move that file away or choose another directory",
            )
        if n in names and n not in own:
            raise input_error(
                f"{flag} {p}", f"holds '{n}', which kvplan did not write there (or which was changed since)",
                "move that file away or choose another directory (kvplan never overwrites files it did not write)",
            )
    return p


# --- the commit --------------------------------------------------------------------------------------------


def open_result_dir(out: PathLike, names: list[str], overwrite: bool, flag: str = "--out",
                    inputs: Iterable[PathLike | None] = ()) -> tuple[ResultDirLock, Path]:
    """Before a run: check ``out``, take its lock, finish or undo an interrupted commit there, remove stale
    staging folders next to it and make this run's. Returns the lock (held) and the staging folder."""
    inputs = list(inputs)
    p = check_result_dir(out, names, overwrite, flag, inputs)
    lock = ResultDirLock(p, flag)
    try:
        lock.acquire()
        if p.is_dir():
            recover(p)
        check_result_dir(p, names, overwrite, flag, inputs)
        clean_stale_stages(p.absolute().parent, own=p.name)
        stage = make_stage(p)
    except OSError as exc:
        lock.release()
        raise input_error(f"{flag} {p}", f"cannot write ({exc.strerror or exc})") from None
    except BaseException:
        lock.release()
        raise
    return lock, stage


def write_result_dir_files(
    out: PathLike, files: dict[str, bytes], overwrite: bool, flag: str = "--out",
    staged: dict[str, Path] | None = None, inputs: Iterable[PathLike | None] = (), lock: ResultDirLock | None = None,
) -> Path:
    """Commit ``files`` (name -> bytes) and ``staged`` (name -> a complete file on the same file system) into
    the directory ``out`` (module doc): a new directory appears complete by one rename; an existing one goes
    through the journal. ``lock``: the directory's lock if the caller holds it (else taken here). Files go
    in in order, staged first; the manifest is last. An ``OSError`` (``ENOSPC``) undoes the commit and
    becomes a one-line error.
    """
    staged = dict(staged or {})
    names = [*staged, *files]
    mine = lock is None
    held = ResultDirLock(out, flag).acquire() if lock is None else lock
    p = Path(out)
    try:
        if p.is_dir():
            recover(p)
        p = check_result_dir(out, names, overwrite, flag, inputs)
        new: Entries = {}
        for n, src in staged.items():
            d = file_digest(src)
            if d is None:
                raise input_error(f"{flag} {p}", f"the staged '{n}' is gone", "run again")
            new[n] = {"size": d[0], "sha256": d[1]}
        for n, data in files.items():
            size, sha = bytes_digest(data)
            new[n] = {"size": size, "sha256": sha}
        with deferred_signals():
            if not p.exists():
                _commit_new(p, staged, files, new)
            else:
                _commit_existing(p, staged, files, new)
    except OSError as exc:
        why = "no space left on device" if exc.errno == 28 else (exc.strerror or str(exc))
        raise input_error(f"{flag} {p}", f"cannot write ({why}); the directory keeps its previous result") from None
    finally:
        if mine:
            held.release()
    return p


def _place(dest: Path, staged: dict[str, Path], files: dict[str, bytes], new: Entries, mode: int) -> None:
    """Move the staged files into ``dest``, write ``files`` there, then the manifest (last: its presence means
    complete). Shared by both commits, so the order of renames the fault-injection tests count is one."""
    for n, src in staged.items():
        os.chmod(src, mode)
        _atomic._rename(src, dest / n)
    for n, data in files.items():
        write_new_file(dest / n, data, mode=mode)
    write_record(dest / RESULT_MANIFEST, {"writer": "kvplan", "files": new})


def _commit_new(p: Path, staged: dict[str, Path], files: dict[str, bytes], new: Entries) -> None:
    mode = 0o666 & ~_umask()
    tmp = make_stage(p)
    try:
        build = tmp / "result"
        build.mkdir()
        os.chmod(build, 0o777 & ~_umask())
        _place(build, staged, files, new, mode)
        _atomic._rename_new_dir(build, p)  # fails if someone created ``out`` meanwhile: then nothing is replaced
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _commit_existing(p: Path, staged: dict[str, Path], files: dict[str, bytes], new: Entries) -> None:
    mode = 0o666 & ~_umask()
    old = _verified(p, _entries(read_json_record(p / RESULT_MANIFEST), "files"))
    token = secrets.token_hex(4)
    aside = {n: f".{n}.{token}.old" for n in old}
    write_record(p / JOURNAL, {"writer": "kvplan", "old": old, "new": new, "aside": aside})
    try:
        (p / RESULT_MANIFEST).unlink(missing_ok=True)
        for n in old:
            _atomic._rename(p / n, p / aside[n])
        _place(p, staged, files, new, mode)
    except BaseException:
        recover(p)  # undo: the old complete result is back
        raise
    for a in aside.values():
        (p / a).unlink(missing_ok=True)
    (p / JOURNAL).unlink(missing_ok=True)
