"""Atomic file output: a result file either appears complete or not at all, and user paths are checked first."""

from __future__ import annotations

import os
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


def atomic_write_bytes(path: str | Path, data: bytes, flag: str = "--out") -> Path:
    """Write ``data`` to ``path`` via a temporary sibling and a rename; the temporary file never survives."""
    p = check_output_file(path, flag)
    tmp = p.with_name(f".{p.name}.tmp")
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, p)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise input_error(f"{flag} {p}", f"cannot write ({exc.strerror or exc})") from None
    return p
