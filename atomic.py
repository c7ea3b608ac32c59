"""Atomic file output: a result file either appears complete or not at all, and user paths are checked first."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from kvplan.errors import input_error


def check_output_file(path: str | Path, flag: str = "--out") -> Path:
    """Refuse an output path that is an existing directory or whose parent cannot hold files."""
    p = Path(path)
    if p.is_dir():
        raise input_error(f"{flag} {p}", "is an existing directory", "give a file path")
    parent = p.parent if str(p.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise input_error(f"{flag} {p}", f"'{parent}' is not a directory", "give a path inside a directory")
    return p


def atomic_write_bytes(path: str | Path, data: bytes, flag: str = "--out", *, fsync: bool = False) -> Path:
    """Write ``data`` to ``path`` via a uniquely named temporary sibling and a rename.

    The only file writer of kvplan (results, profiles, sweep parts and manifests, figures, uploads). The
    temporary file (``.NAME.XXXXXXXX.tmp``, unique, so concurrent writers of the same path never share one)
    never survives, whatever is raised (also ``KeyboardInterrupt``). ``fsync`` flushes the data to disk
    before the rename (the sweep's final file). The file gets mode 0644 (``mkstemp`` creates 0600). An
    ``OSError`` becomes a one-line :class:`~kvplan.errors.KvplanInputError` naming ``flag`` and the path.
    """
    p = check_output_file(path, flag)
    tmp: str | None = None
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            if fsync:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
        tmp = None
    except OSError as exc:
        raise input_error(f"{flag} {p}", f"cannot write ({exc.strerror or exc})") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    return p
