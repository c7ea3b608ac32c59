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


# --- result directories ------------------------------------------------------------------------------------

RESULT_MANIFEST = ".kvplan-result.json"
"""Written last into every result directory: the files kvplan wrote there (the only ones it may replace)."""


def _manifest_files(out: Path) -> set[str] | None:
    """Names listed in ``out``'s kvplan manifest, or None when there is none (or it is unreadable)."""
    import json

    try:
        data = json.loads((out / RESULT_MANIFEST).read_text())
        files = data.get("files") if isinstance(data, dict) else None
        if isinstance(files, list) and all(isinstance(f, str) for f in files):
            return set(files)
    except (OSError, ValueError):
        pass
    return None


def check_result_dir(out: str | Path, names: list[str] | tuple[str, ...], overwrite: bool, flag: str = "--out") -> Path:
    """Check before any work that ``out`` can receive the result files ``names`` without losing anything.

    A new or empty directory is fine. A non-empty one is refused unless ``overwrite``; with it, only files
    that kvplan wrote there earlier (listed in its manifest) may be replaced, and every other file is kept.
    """
    if str(out).strip() == "":
        raise input_error(flag, "is empty", "give a directory name, e.g. --out results/run1")
    p = Path(out)
    if p.exists() and not p.is_dir():
        raise input_error(f"{flag} {p}", "exists and is not a directory", "give a new or existing directory")
    parent = p.resolve().parent
    if parent.exists() and not parent.is_dir():
        raise input_error(f"{flag} {p}", f"'{parent}' is not a directory", "give a path inside a directory")
    if not p.exists():
        return p
    try:
        entries = sorted(e.name for e in p.iterdir())
    except OSError as exc:
        raise input_error(f"{flag} {p}", f"cannot read the directory ({exc.strerror or exc})") from None
    if not entries:
        return p
    if not overwrite:
        raise input_error(
            f"{flag} {p}", f"is not empty ({len(entries)} entries)",
            "choose a new directory, or pass --overwrite to replace kvplan's own result files there (other files are kept)",
        )
    listed = _manifest_files(p)
    own = set() if listed is None else listed | {RESULT_MANIFEST}
    foreign = [n for n in names if (p / n).exists() and n not in own]
    if foreign:
        raise input_error(
            f"{flag} {p}", f"holds '{foreign[0]}', which kvplan did not write there",
            "move that file away or choose another directory (kvplan never overwrites files it did not write)",
        )
    return p


def write_result_dir_files(
    out: str | Path, files: dict[str, bytes], overwrite: bool, flag: str = "--out", staged: dict[str, Path] | None = None
) -> Path:
    """Write ``files`` (name -> bytes) into the directory ``out`` so that nothing foreign is ever lost.

    ``staged`` (name -> path) are files already written in full elsewhere on the same file system (streamed
    while a run went, under temporary names): they are moved in by rename like the others and listed in
    the manifest; ``files`` go in after them, in their order (put the one whose presence means "complete" last).

    - ``out`` missing: files go to a temporary sibling directory that is renamed to ``out`` when complete.
    - ``out`` existing: checked by :func:`check_result_dir`; the old manifest goes first (the directory then no
      longer claims a complete result), then kvplan's own old files, then each new file via a temporary file
      and a rename, the manifest last. A run killed midway leaves no manifest, so it never looks complete.
    """
    import json
    import shutil
    import tempfile

    staged = dict(staged or {})
    names = [*staged, *files, RESULT_MANIFEST]
    p = check_result_dir(out, names, overwrite, flag)
    manifest = (json.dumps({"writer": "kvplan", "files": sorted([*staged, *files])}, indent=2) + "\n").encode()
    umask = os.umask(0)
    os.umask(umask)
    try:
        if not p.exists():
            p.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent))
            try:
                os.chmod(tmp, 0o777 & ~umask)
                for name, src in staged.items():
                    os.chmod(src, 0o666 & ~umask)
                    os.replace(src, tmp / name)
                for name, data in files.items():
                    (tmp / name).write_bytes(data)
                (tmp / RESULT_MANIFEST).write_bytes(manifest)
                os.rename(tmp, p)  # fails if someone created ``out`` meanwhile: then nothing is replaced
            except BaseException:
                shutil.rmtree(tmp, ignore_errors=True)
                raise
            return p
        old_own = _manifest_files(p) or set()
        (p / RESULT_MANIFEST).unlink(missing_ok=True)
        for name in sorted(old_own - set(files) - set(staged)):
            if "/" not in name and name != RESULT_MANIFEST:
                (p / name).unlink(missing_ok=True)  # a kvplan file of an earlier run that this run does not write
        for name, src in staged.items():
            os.chmod(src, 0o666 & ~umask)
            os.replace(src, p / name)
        for name, data in [*files.items(), (RESULT_MANIFEST, manifest)]:
            tmp_file = p / f".{name}.tmp"
            try:
                tmp_file.write_bytes(data)
                os.chmod(tmp_file, 0o666 & ~umask)
                os.replace(tmp_file, p / name)
            except BaseException:
                tmp_file.unlink(missing_ok=True)
                raise
    except OSError as exc:
        raise input_error(f"{flag} {p}", f"cannot write ({exc.strerror or exc})") from None
    return p
