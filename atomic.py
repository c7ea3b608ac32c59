"""The one output rule of kvplan and its single file writer.

Every file kvplan writes goes through :func:`atomic_write_bytes` (result directories through
:mod:`kvplan.atomic_dir`, which uses the same pieces). The rule, checked by :func:`check_output_file` before any
work and again, under a lock, just before the rename:

* the path is a regular file or nothing: never a directory, a device node, a FIFO, a socket or a symbolic
  link (``os.replace`` would replace the node or the link itself, not write into it);
* it is never the same file (``st_dev``, ``st_ino``) as any input of the command (each command passes them);
* an existing file that kvplan did not write is refused unless ``overwrite`` (``--overwrite``).

How kvplan knows it wrote a file: each directory that receives a kvplan output file gets a small ledger,
``.kvplan-outputs.json``, naming each file kvplan wrote there with the size and sha256 of what it wrote
(the formats kvplan writes, CSV among them, have no room for a marker of their own). A file is kvplan's only
while its bytes still match: a file the user edited afterwards, or one a forged ledger names with other
bytes, is the user's. The ledger is updated under an exclusive ``flock`` of the directory, around the
rename: the entry accepts the old and the new digest while the rename is under way, then only the new one,
so a writer killed at any instant never leaves a kvplan file that looks foreign, nor the reverse.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import signal
import stat
import tempfile
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from kvplan.errors import input_error

LEDGER = ".kvplan-outputs.json"
"""Per-directory record of the single files kvplan wrote there: ``{"files": {name: [{size, sha256}]}}``."""
MAX_LEDGER_BYTES = 4 * 1024**2
_SIGNALS = tuple(s for s in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)) if s is not None)

PathLike = str | Path


# --- low-level pieces (also the fault-injection points of the tests) ---------------------------------------


def _write_all(fh: Any, data: bytes) -> None:
    """Write ``data`` to the open binary file ``fh`` (every byte kvplan writes itself goes through here)."""
    fh.write(data)


def _rename(src: PathLike, dst: PathLike) -> None:
    """``os.replace`` (every rename of a commit goes through here)."""
    os.replace(src, dst)


def _rename_new_dir(src: PathLike, dst: PathLike) -> None:
    """``os.rename`` of a complete new result directory onto a path that must not exist yet."""
    os.rename(src, dst)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP back while the block runs (a commit step): they are delivered after it.

    Blocking them in this thread's signal mask is not enough when the process has other threads (a progress bar's
    refresh thread, a pool's management thread): the kernel hands a process-directed signal to any thread that
    does not block it, and Python runs its handler in the main thread at once. So in the main thread the Python
    handlers are also replaced, for the block, by one that only records the signal (and, should it still be
    called once the block is over, passes it on); the recorded signals are raised again, to the handlers of
    before, once the block is over.
    """
    received: list[int] = []
    saved: dict[int, Any] = {}
    holding = [True]

    def hold(signum: int, frame: Any) -> None:
        if holding[0]:
            received.append(signum)
            return
        _pass_on(signum, frame, saved.get(signum))

    if threading.current_thread() is threading.main_thread():
        for sig in _SIGNALS:
            try:
                saved[sig] = signal.signal(sig, hold)
            except (ValueError, OSError):  # pragma: no cover - not settable here
                continue
    try:
        old = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    except (AttributeError, ValueError, OSError):  # pragma: no cover - platforms without pthread_sigmask
        old = None
    try:
        yield
    finally:
        holding[0] = False
        for sig, handler in saved.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if old is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)
        for sig in dict.fromkeys(received):
            signal.raise_signal(sig)


def _pass_on(signum: int, frame: Any, handler: Any) -> None:
    """Deliver a signal to ``handler`` (a Python handler, SIG_IGN, or SIG_DFL/None: the default action)."""
    if callable(handler):
        handler(signum, frame)
    elif handler != signal.SIG_IGN:
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)


_DIGESTS: dict[tuple[int, int, int, int], str] = {}


def file_digest(path: PathLike) -> tuple[int, str] | None:
    """``(size, sha256 hex)`` of a regular file (not following a final symlink), or None if it is not one.

    Cached per (device, inode, size, mtime) for the life of the process: a commit checks the same big
    ``turns.parquet`` more than once.
    """
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode):
            return None
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key not in _DIGESTS:
            with open(path, "rb") as fh:
                _DIGESTS[key] = hashlib.file_digest(fh, "sha256").hexdigest()
        return st.st_size, _DIGESTS[key]
    except OSError:
        return None


def bytes_digest(data: bytes) -> tuple[int, str]:
    """``(size, sha256 hex)`` of ``data``."""
    return len(data), hashlib.sha256(data).hexdigest()


def matches(path: PathLike, entries: Iterable[Any]) -> bool:
    """True when the regular file at ``path`` has the size and sha256 of one of ``entries`` ({size, sha256})."""
    got = file_digest(path)
    if got is None:
        return False
    for e in entries:
        if isinstance(e, dict) and e.get("size") == got[0] and e.get("sha256") == got[1]:
            return True
    return False


def read_json_record(path: PathLike) -> Any:
    """A small kvplan JSON record (ledger, manifest, journal), or None when absent, not regular or unreadable."""
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_LEDGER_BYTES:
            return None
        with open(path, "rb") as fh:
            return json.loads(fh.read())
    except (OSError, ValueError, RecursionError):
        return None


def foreign_record(path: PathLike) -> bool:
    """True when something exists at ``path`` (the name of a kvplan ledger, manifest or journal) that kvplan did
    not write: a node that is not a regular file, or a file that is not a JSON object with ``"writer": "kvplan"``
    (every record kvplan writes has it). Such a file is the user's: never replaced."""
    if not os.path.lexists(path):
        return False
    record = read_json_record(path)
    return not (isinstance(record, dict) and record.get("writer") == "kvplan")


def write_record(path: Path, record: Any) -> None:
    """Write a small JSON record atomically (unique temporary sibling + rename)."""
    data = (json.dumps(record, indent=2, sort_keys=True) + "\n").encode()
    write_new_file(path, data, mode=0o644)


def write_new_file(path: Path, data: bytes, *, mode: int = 0o644, fsync: bool = False) -> None:
    """Write ``data`` to a unique temporary sibling of ``path`` and rename it over ``path`` (no checks)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            _write_all(fh, data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        _rename(tmp, path)
        tmp = ""
    finally:
        if tmp:
            Path(tmp).unlink(missing_ok=True)


@contextlib.contextmanager
def locked_dir(directory: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``directory`` itself for the block (writers of one directory take turns)."""
    fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:  # a file system without flock on directories (some NFS): the rename is still atomic
            if exc.errno not in (errno.EBADF, errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP):
                raise
        yield
    finally:
        os.close(fd)


# --- the ledger of single files ----------------------------------------------------------------------------


def _ledger(directory: Path) -> dict[str, list[dict[str, Any]]]:
    data = read_json_record(directory / LEDGER)
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict):
        return {}
    return {str(k): [e for e in v if isinstance(e, dict)] for k, v in files.items() if isinstance(v, list)}


def written_by_kvplan(path: PathLike) -> bool:
    """True when the ledger of the file's directory names it with its current size and sha256."""
    p = Path(path)
    return matches(p, _ledger(p.parent).get(p.name, []))


def kvplan_outputs(directory: PathLike) -> set[str]:
    """Names of the files in ``directory`` that kvplan wrote there, their bytes unchanged (the ledger's entries)."""
    d = Path(directory)
    return {name for name, entries in _ledger(d).items() if matches(d / name, entries)}


def _set_ledger(directory: Path, name: str, entries: list[dict[str, Any]]) -> None:
    if foreign_record(directory / LEDGER):  # appeared since check_output_file: kept (the output goes unrecorded)
        raise input_error(str(directory / LEDGER), "was not written by kvplan, so kvplan did not replace it",
                          "move it away (kvplan records the files it writes in a directory under that name)")
    files = _ledger(directory)
    files[name] = entries
    files = {k: v for k, v in files.items() if k == name or os.path.lexists(directory / k)}  # drop gone files
    write_record(directory / LEDGER, {"writer": "kvplan", "files": dict(sorted(files.items()))})


# --- the rule ----------------------------------------------------------------------------------------------


def _node_problem(st: os.stat_result) -> str | None:
    if stat.S_ISREG(st.st_mode):
        return None
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link (kvplan replaces only regular files)"
    if stat.S_ISDIR(st.st_mode):
        return "is an existing directory"
    kind = ("a FIFO" if stat.S_ISFIFO(st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode)
            else "a device node" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a regular file")
    return f"is {kind}, not a regular file"


def same_as_input(path: PathLike, inputs: Iterable[PathLike | None]) -> str | None:
    """The first input that is the same file as ``path`` (by device and inode), else None."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    for src in inputs:
        if src is None or str(src) == "":
            continue
        try:
            s = os.stat(src)
        except OSError:
            continue
        if (s.st_dev, s.st_ino) == (st.st_dev, st.st_ino):
            return str(src)
    return None


def _check_can_create_in(parent: Path, name: str, where: str) -> None:
    """Refuse, before any work, a directory (or, when it does not exist yet, its nearest existing ancestor, which
    the writer will create it in) where no file can be created: a probe file is created and removed at once
    (``os.access`` says yes to root in ``/proc`` and to some network file systems that then refuse). The probe is
    named as :func:`write_new_file` names its temporary file (``.NAME.XXXXXXXX.tmp``), so that one left by a kill
    is what every clean-up already knows as kvplan's (a sweep's parts directory accepts nothing else)."""
    d = parent
    while not d.exists() and d != d.parent:
        d = d.parent
    fd = -1
    probe = ""
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=d)
    except OSError as exc:
        raise input_error(where, f"cannot write in '{d}' ({exc.strerror or exc})",
                          "give a path in a directory you can write to") from None
    finally:
        if fd >= 0:
            os.close(fd)
        if probe:
            Path(probe).unlink(missing_ok=True)


def check_output_file(
    path: PathLike, flag: str = "--out", *, inputs: Iterable[PathLike | None] = (), overwrite: bool = False,
    ledger: bool = True,
) -> Path:
    """Refuse, with a one-line error naming ``flag``, an output path that breaks the output rule (module doc).

    ``inputs``: every file the command reads. ``overwrite``: replace an existing regular file kvplan did not
    write. ``ledger=False``: a location kvplan owns (sweep parts): only the node-type and input checks apply.
    """
    if str(path).strip() == "":
        raise input_error(flag, "is empty", "give a file path")
    p = Path(path)
    where = f"{flag} {p}"
    if p.name in (LEDGER, "..", ".") or p.name == "":
        raise input_error(where, "is not a file name kvplan may write", "give another file name")
    parent = p.parent if str(p.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise input_error(where, f"'{parent}' is not a directory", "give a path inside a directory")
    _check_can_create_in(parent, p.name, where)
    if ledger and foreign_record(parent / LEDGER):  # the ledger would be written over it (with --overwrite too)
        raise input_error(where, f"its directory holds '{LEDGER}', which was not written by kvplan (kvplan records "
                          "the files it writes in a directory under that name)",
                          "move that file away or write to another directory")
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return p
    except OSError as exc:
        raise input_error(where, f"cannot inspect the path ({exc.strerror or exc})") from None
    problem = _node_problem(st)
    if problem is not None:
        raise input_error(where, problem, "give the path of a regular file or of a new one")
    clash = same_as_input(p, list(inputs))
    if clash is not None:
        raise input_error(where, f"is the same file as the input '{clash}'", "write the output to another path")
    if ledger and not overwrite and not written_by_kvplan(p):
        raise input_error(where, "exists and was not written by kvplan (or was changed since)",
                          "choose another path, or pass --overwrite to replace it")
    return p


def check_distinct(paths: Iterable[tuple[str, PathLike | None]]) -> None:
    """Refuse two outputs of one command at the same path (``flag``, path pairs; None skipped)."""
    seen: dict[str, str] = {}
    for flag, path in paths:
        if path is None:
            continue
        key = os.path.abspath(path)
        if key in seen:
            raise input_error(f"{flag} {path}", f"is also the path of {seen[key]}", "give each output its own path")
        seen[key] = flag


def atomic_write_bytes(
    path: PathLike, data: bytes, flag: str = "--out", *, fsync: bool = False, inputs: Iterable[PathLike | None] = (),
    overwrite: bool = False, ledger: bool = True,
) -> Path:
    """Write ``data`` to ``path`` under the output rule, via a uniquely named temporary sibling and a rename.

    The only single-file writer of kvplan (profiles, figures, workload fits, sweep results and parts,
    uploads). The rule is checked again under an exclusive lock of the directory, right before the rename;
    the temporary file (``.NAME.XXXXXXXX.tmp``) never survives an exception (``KeyboardInterrupt`` and the
    SIGTERM/SIGHUP the CLI turns into one included). ``fsync`` flushes the data before the rename. The file
    gets mode 0644. With ``ledger`` (the default) the directory's ledger records the file as kvplan's.
    An ``OSError`` becomes a one-line :class:`~kvplan.errors.KvplanInputError` naming ``flag`` and the path.
    """
    inputs = list(inputs)
    p = check_output_file(path, flag, inputs=inputs, overwrite=overwrite, ledger=ledger)
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        with locked_dir(p.parent):
            check_output_file(p, flag, inputs=inputs, overwrite=overwrite, ledger=ledger)  # nothing changed meanwhile
            if not ledger:
                write_new_file(p, data, fsync=fsync)
                return p
            old = [e for e in _ledger(p.parent).get(p.name, []) if matches(p, [e])]
            size, sha = bytes_digest(data)
            new = {"size": size, "sha256": sha}
            with deferred_signals():
                _set_ledger(p.parent, p.name, [*old, new])  # old or new bytes: kvplan's either way
                write_new_file(p, data, fsync=fsync)
                _set_ledger(p.parent, p.name, [new])
    except OSError as exc:
        if exc.errno == errno.ENOSPC:
            raise input_error(f"{flag} {p}", "cannot write (no space left on device); nothing was replaced") from None
        raise input_error(f"{flag} {p}", f"cannot write ({exc.strerror or exc})") from None
    return p


# --- result directories ---------------------------------------------------------------------------------

RESULT_MANIFEST = ".kvplan-result.json"
"""Written last into every result directory (:mod:`kvplan.atomic_dir`): each file of the result with its
size and sha256 (only files that still match are kvplan's)."""
