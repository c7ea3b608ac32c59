"""Server paths in the dashboard: read only under the directory it was told to serve, never echoed.

``kvplan dashboard --serve-dir DIR`` passes ``DIR`` to the Streamlit process in :data:`SERVE_DIR_ENV`.
Without it (the default) the dashboard reads no path typed in the page at all: traces are uploaded. With
it, a typed path (relative to ``DIR``, or absolute) is resolved with every symlink followed and read only
when the result is a regular file inside ``DIR``. Every refusal is the same one line whatever exists on
the server (no existence, type or content of a file outside ``DIR`` is revealed), and an error a parser
raises on a served file has every quoted excerpt of that file's content replaced by ``'...'`` before it
reaches the page (:func:`redact`), so the page never shows what a file holds.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from kvplan.errors import KvplanInputError, input_error

#: Environment variable carrying the served directory from ``kvplan dashboard`` to the Streamlit process.
SERVE_DIR_ENV = "KVPLAN_DASHBOARD_SERVE_DIR"
#: The sidebar label (and error prefix) of the typed server path.
PATH_LABEL = "trace file (path on this server)"
#: How much of a served file :func:`redact` compares quoted excerpts against (the parsers quote from the
#: first records and the failing line; a longer file is compared on its first 8 MiB).
REDACT_SCAN_BYTES = 8 * 1024**2
#: Quoted excerpts in a parser's message: '...', "..." and {...} (Prometheus labels).
_QUOTED = re.compile(r"'[^'\n]{0,400}'|\"[^\"\n]{0,400}\"|\{[^{}\n]{0,400}\}")
#: The pieces of an excerpt compared with the file (a repr escapes some characters, so whole-excerpt
#: matching alone would miss them): runs of three or more characters between separators and escapes.
_TOKEN = re.compile(r"[^\s,'\"\\{}=:;]{3,}")


def serve_dir() -> Path | None:
    """The served directory (resolved), or ``None`` when the dashboard serves none (upload only)."""
    raw = os.environ.get(SERVE_DIR_ENV, "").strip()
    if not raw:
        return None
    root = Path(os.path.realpath(raw))
    return root if root.is_dir() else None


def _refused(typed: str) -> KvplanInputError:
    return input_error(PATH_LABEL, f"'{typed[:200]}' is not a regular file under the directory this dashboard "
                       "serves", "type a path relative to that directory, or upload the trace instead")


def served_path(typed: str) -> str:
    """The real path of ``typed`` when it is a regular file under the served directory (or a weka trace
    directory there, every file of it under the directory too), else a one-line
    :class:`KvplanInputError` that says the same for every path outside (nothing is opened to decide)."""
    root = serve_dir()
    if root is None:
        raise input_error(PATH_LABEL, "this dashboard reads no server path",
                          "upload the trace file, or start it with `kvplan dashboard --serve-dir DIR` to replay "
                          "traces under DIR")
    if "\x00" in typed:
        raise _refused(typed.replace("\x00", ""))
    try:  # a lone surrogate (a browser string may hold one) is no file name: os.stat would raise UnicodeEncodeError
        os.fsencode(typed)
    except UnicodeEncodeError:
        raise _refused(typed.encode("utf-8", "replace").decode("utf-8")) from None
    candidate = Path(typed).expanduser() if typed.startswith("~") else Path(typed)
    if not candidate.is_absolute():
        candidate = root / candidate
    real = os.path.realpath(candidate)
    if os.path.commonpath([real, str(root)]) != str(root):
        raise _refused(typed)
    try:
        st = os.stat(real)
    except OSError:
        raise _refused(typed) from None
    if stat.S_ISDIR(st.st_mode):  # a weka trace directory: every file it replays must lie under the root too
        from kvplan.traces.weka import weka_files

        try:
            files = weka_files(real)
        except KvplanInputError:
            raise _refused(typed) from None
        for f in files:
            inner = os.path.realpath(f)
            if os.path.commonpath([inner, str(root)]) != str(root) or not os.path.isfile(inner):
                raise _refused(typed)
        return real
    if not stat.S_ISREG(st.st_mode):
        raise _refused(typed)
    return real


def relative_label(path: str) -> str:
    """``path`` relative to the served directory (the page never shows the server's absolute layout)."""
    root = serve_dir()
    if root is not None and os.path.commonpath([path, str(root)]) == str(root):
        return os.path.relpath(path, root)
    return os.path.basename(path)


def redact(message: str, path: str | None) -> str:
    """``message`` with the served file's absolute path shortened and every quoted excerpt that occurs in
    the file's first :data:`REDACT_SCAN_BYTES` replaced by ``'...'`` (field names the parser quotes stay
    when the file does not hold them)."""
    if path is None:
        return message
    message = message.replace(path, relative_label(path))
    try:
        with open(path, "rb") as fh:
            head = fh.read(REDACT_SCAN_BYTES).decode("utf-8", "replace")
    except OSError:
        return message

    def sub(m: re.Match[str]) -> str:
        inner = m.group(0)[1:-1]
        tokens = _TOKEN.findall(inner)
        if inner in head or not tokens or any(t in head for t in tokens):
            return "'...'"
        return m.group(0)

    return _QUOTED.sub(sub, message)
