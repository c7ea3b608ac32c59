"""Shared helpers of the trace parsers: bounded reading, safe JSON loading and value checks.

Every helper raises :class:`kvplan.errors.KvplanInputError` with a one-line message of the form
``<file>: <where in the file>: <problem>; <fix>``. Nothing here evaluates or unpickles input: JSON is
read with the :mod:`json` module, text with plain UTF-8 decoding, and the size of a file is checked
with ``stat`` before a single byte of it is read.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Sequence
from typing import Any

import numpy as np

from kvplan.errors import input_error

#: Default upper bound on the size of a trace file (256 MiB); every parser takes ``max_bytes``.
DEFAULT_MAX_BYTES = 256 * 1024**2

#: What a parser accepts as a path.
PathLike = str | os.PathLike[str]


def file_label(path: PathLike) -> str:
    """Return the name used for ``path`` in error messages (the path exactly as the caller gave it)."""
    return os.fspath(path)


def _human_bytes(n: int) -> str:
    """Format a byte count as ``1.5 GiB`` (binary units), for error messages."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover - the loop always returns


def check_file(path: PathLike, max_bytes: int, field: str | None = None) -> int:
    """Check that ``path`` is a readable, non-empty regular file of at most ``max_bytes``; return its size.

    Only ``stat`` is called: an oversized file is refused before it is opened. Errors name ``field``
    (default: the path as given).
    """
    where = file_label(path) if field is None else field
    if max_bytes <= 0:
        raise input_error(where, f"max_bytes must be positive, got {max_bytes}")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise input_error(where, "file not found", "check the path") from None
    except OSError as exc:
        raise input_error(where, f"cannot access the file ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise input_error(where, "is a directory, not a file", "pass one file")
    if not stat.S_ISREG(st.st_mode):
        raise input_error(where, "is not a regular file", "copy it to a regular file first")
    if st.st_size > max_bytes:
        raise input_error(
            where,
            f"file is {_human_bytes(st.st_size)} ({st.st_size} bytes), larger than the "
            f"{_human_bytes(max_bytes)} limit, so it was not read",
            "pass a smaller file (split or filter it; API callers may raise max_bytes)",
        )
    if st.st_size == 0:
        if _kernel_file(st):  # /proc/self/status: stat says 0 bytes whatever it holds; never read here
            raise input_error(where, "is a special file of the kernel (/proc, /sys) whose size is unknown (stat "
                              "says 0 bytes), so it was not read", "copy its content to a regular file first")
        raise input_error(where, "file is empty", "pass the complete file (an empty file holds no data)")
    return st.st_size


def is_kernel_file(st: os.stat_result) -> bool:
    """Whether the file of stat ``st`` lies on procfs or sysfs (:func:`_kernel_file`): never read when it says 0
    bytes."""
    return _kernel_file(st)


def _kernel_file(st: os.stat_result) -> bool:
    """Whether the file of stat ``st`` lies on the kernel's procfs or sysfs (the device of /proc or /sys), where
    regular files report size 0; reading one is not safe (some block until the kernel has something to say)."""
    for root in ("/proc", "/sys"):
        try:
            # a mount point only: an unmounted /sys (a plain folder of the root file system) says nothing
            if os.path.ismount(root) and os.stat(root).st_dev == st.st_dev:
                return True
        except OSError:
            continue
    return False


def read_bytes(path: PathLike, max_bytes: int = DEFAULT_MAX_BYTES, field: str | None = None) -> bytes:
    """The bytes of a regular file of at most ``max_bytes``: refused from ``stat`` before it is opened
    (:func:`check_file`), and refused if it grew past the limit while being read (at most ``max_bytes + 1``
    bytes are ever read). Errors name ``field`` (default: the path as given). Hash this result where a hash
    of the file is needed."""
    where = file_label(path) if field is None else field
    check_file(path, max_bytes, where)
    try:
        with open(path, "rb") as fh:
            data = fh.read(max_bytes + 1)
    except OSError as exc:
        raise input_error(where, f"cannot read the file ({exc.strerror})") from None
    if len(data) > max_bytes:  # the file grew after stat()
        raise input_error(
            where, f"file is larger than the {_human_bytes(max_bytes)} limit (it grew while being read)",
            "pass a smaller file (split or filter it) that no process is writing"
        )
    return data


#: Leading bytes of the compressed and archive formats a trace is often shipped in, with how to unpack one.
COMPRESSED_MAGIC: tuple[tuple[bytes, str, str], ...] = (
    (b"\x1f\x8b", "gzip", "gunzip -k"),
    (b"\x28\xb5\x2f\xfd", "zstd", "zstd -d"),
    (b"PK\x03\x04", "zip", "unzip"),
    (b"PK\x05\x06", "zip", "unzip"),
    (b"\xfd7zXZ\x00", "xz", "unxz -k"),
    (b"BZh", "bzip2", "bunzip2 -k"),
)


def refuse_compressed(data: bytes, field: str) -> None:
    """Refuse bytes that start like a gzip, zstd, zip, xz or bzip2 file: named, with how to decompress it
    (decoded as text they would only say 'not valid UTF-8' or 'cannot tell the format', with mojibake)."""
    for magic, name, tool in COMPRESSED_MAGIC:
        if data.startswith(magic) and (name != "bzip2" or data[4:10] == b"1AY&SY"):  # BZh + level + block magic
            raise input_error(field, f"is compressed ({name}), not a text file",
                              f"decompress it first (e.g. {tool} FILE) and pass the result")


#: Byte-order marks of the wide Unicode encodings (UTF-32 first: its little-endian mark starts with UTF-16's).
WIDE_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
             (b"\xfe\xff", "UTF-16"))


def refuse_wide_encoding(data: bytes, field: str) -> None:
    """Refuse text saved as UTF-16 or UTF-32 (Windows editors' "Unicode"), named by its byte-order mark: decoded as
    UTF-8 it would only say 'NUL byte: a binary file' or 'invalid YAML'."""
    for bom, name in WIDE_BOMS:
        if data.startswith(bom):
            raise input_error(field, f"is {name} text (it starts with a {name} byte-order mark), not UTF-8",
                              "save it as UTF-8")


def decode_text(data: bytes, field: str) -> str:
    """Decode the bytes of a text file as UTF-8 (a leading BOM is dropped); compressed data, UTF-16/32 text, a NUL
    byte (a binary file) or invalid UTF-8 is an error naming ``field`` (and the line)."""
    refuse_compressed(data, field)
    refuse_wide_encoding(data, field)
    nul = data.find(b"\x00")
    if nul >= 0:
        raise input_error(field, f"byte {nul} is a NUL byte: this is a binary file, not a text file")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise input_error(
            field, f"line {line}: byte {exc.start} is not valid UTF-8", "save it as UTF-8"
        ) from None


def decode_head(data: bytes, field: str, complete: bool) -> str:
    """:func:`decode_text` of the first bytes of a file (``complete``: the whole file); a UTF-8 character cut by
    the end of an incomplete head is dropped, not called invalid."""
    if not complete:
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as exc:
            if exc.end == len(data) and exc.reason == "unexpected end of data":
                data = data[: exc.start]
    return decode_text(data, field)


def read_text(path: PathLike, max_bytes: int = DEFAULT_MAX_BYTES, field: str | None = None) -> str:
    """Read a UTF-8 text file of at most ``max_bytes`` (:func:`read_bytes`, then :func:`decode_text`)."""
    where = file_label(path) if field is None else field
    return decode_text(read_bytes(path, max_bytes, where), where)


def load_json(path: PathLike, max_bytes: int = DEFAULT_MAX_BYTES, field: str | None = None) -> tuple[Any, bool]:
    """Parse a JSON file with :func:`json.loads` (errors name ``field``, default: the path).

    Returns ``(value, has_non_finite)``: Python's JSON reader accepts the non-standard constants
    ``NaN``, ``Infinity`` and ``-Infinity``; they become floats here and the flag tells the caller to
    look for them (and name the field) with :func:`find_non_finite`.
    """
    where = file_label(path) if field is None else field
    text = read_text(path, max_bytes, where)
    stripped = text.rstrip()
    if not stripped:
        raise input_error(where, "file holds only whitespace, no JSON")
    try:
        value, seen = json_loads(text, where)
    except json.JSONDecodeError as exc:
        truncated = exc.msg.startswith("Unterminated string") or (
            exc.msg != "Extra data" and exc.pos >= len(stripped) - 1
        )
        if truncated:
            raise input_error(
                where,
                f"line {exc.lineno} column {exc.colno}: JSON ends unexpectedly ({exc.msg}): the file looks "
                f"truncated",
                "re-copy the complete file or re-run the benchmark",
            ) from None
        raise input_error(where, f"line {exc.lineno} column {exc.colno}: invalid JSON ({exc.msg})") from None
    return value, seen


#: Longest digit string of a JSON integer kept exact; a longer one becomes a float (``inf`` past 1e308, then
#: refused by the caller's finiteness check) before Python's int() (4,300-digit limit) or float() could raise.
MAX_JSON_INT_DIGITS = 18
#: Deepest nesting of a JSON document kvplan reads (its own files nest 4 levels; traces 3).
MAX_JSON_DEPTH = 64


def json_depth_exceeds(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """True when lists and objects nest deeper than ``limit`` in a parsed JSON value (an explicit stack:
    no recursion, so the check itself cannot overflow)."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if isinstance(node, dict):
            node = list(node.values())
        if isinstance(node, list):
            if depth > limit:
                return True
            stack.extend((item, depth + 1) for item in node if isinstance(item, list | dict))
    return False


def json_loads(text: str, where: str, *, unique_keys: bool = False) -> tuple[Any, bool]:
    """:func:`json.loads` with bounded numbers and depth: ``(value, has_non_finite)``.

    Integers longer than :data:`MAX_JSON_INT_DIGITS` digits and every float are converted by ``float()``
    (never raising: out of range gives ``inf``); ``NaN``/``Infinity`` constants and overflowing numbers set
    the flag (the caller names the field with :func:`find_non_finite`). Nesting deeper than
    :data:`MAX_JSON_DEPTH` levels (or than the C scanner's recursion bound) is a one-line error naming
    ``where``; :class:`json.JSONDecodeError` propagates. ``unique_keys`` (hand-edited files: profiles, config.json):
    a key given twice in one object is a one-line error naming it (JSON would silently keep the last, as a YAML
    scenario refuses, :mod:`kvplan.safe_yaml`).
    """
    seen: list[str] = []

    def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, val in pairs:
            if key in out:
                raise input_error(where, f"key '{key[:80]}' given twice in one JSON object",
                                  "keep one (JSON would silently keep the last)")
            out[key] = val
        return out

    def _constant(name: str) -> float:
        seen.append(name)
        return float(name.replace("Infinity", "inf"))

    def _float(token: str) -> float:
        out = float(token)
        if not math.isfinite(out):
            seen.append(token[:20])
        return out

    def _int(token: str) -> int | float:
        if len(token.lstrip("-")) <= MAX_JSON_INT_DIGITS:
            return int(token)
        return _float(token)

    try:
        value = json.loads(text, parse_constant=_constant, parse_float=_float, parse_int=_int,
                           object_pairs_hook=_pairs if unique_keys else None)
    except RecursionError:  # the C scanner's bound, Python's recursion limit
        value = None
        too_deep = True
    else:
        too_deep = json_depth_exceeds(value)
    if too_deep:
        raise input_error(where, f"JSON nests deeper than {MAX_JSON_DEPTH} levels", "is this the right file?")
    return value, bool(seen)


def find_non_finite(value: Any, field: str) -> str | None:
    """Return a description such as ``'ttfts' entry 3`` of the first NaN/Infinity inside ``value``."""
    if isinstance(value, float):
        return None if math.isfinite(value) else field
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = find_non_finite(item, f"{field} entry {i}")
            if found is not None:
                return found
    if isinstance(value, dict):
        for key, item in value.items():
            found = find_non_finite(item, f"{field}.{key}")
            if found is not None:
                return found
    return None


def is_number(value: Any) -> bool:
    """True for JSON numbers (``int``/``float``), False for booleans, strings and ``None``."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def number(where: str, field: str, value: Any, *, minimum: float | None = 0.0) -> float:
    """Validate one JSON number: finite, not a boolean or string, and at least ``minimum`` if given."""
    if not is_number(value):
        raise input_error(where, f"field '{field}' is {_short(value)}, not a number")
    if isinstance(value, int) and value.bit_length() > 1000:
        raise input_error(where, f"field '{field}' is {_short(value)}, too large to be a measurement")
    out = float(value)
    if not math.isfinite(out):
        raise input_error(where, f"field '{field}' is {out}: NaN/Infinity is not a valid measurement")
    if minimum is not None and out < minimum:
        kind = "negative" if minimum == 0.0 else f"below {minimum:g}"
        raise input_error(where, f"field '{field}' is {kind} ({out:g})")
    return out


def integer(where: str, field: str, value: Any, *, minimum: int = 0) -> int:
    """Validate a JSON count: an integer (``3`` or ``3.0``) of at least ``minimum``."""
    out = number(where, field, value, minimum=None)
    if out != int(out):
        raise input_error(where, f"field '{field}' is {out:g}, not a whole number")
    if out < minimum:
        raise input_error(where, f"field '{field}' is {int(out)}, must be at least {minimum}")
    return int(out)


def number_array(
    where: str, field: str, values: Any, *, minimum: float | None = 0.0, label: str = "entry"
) -> np.ndarray:
    """Validate a JSON list of numbers and return it as a float64 array.

    Errors name the field and the index of the first bad entry: not a list, empty, a non-number,
    NaN/Infinity, or a value below ``minimum``.
    """
    if not isinstance(values, list):
        raise input_error(where, f"field '{field}' is {_short(values)}, not a list")
    if not values:
        raise input_error(
            where, f"field '{field}' is an empty list", "re-run the benchmark; no requests were recorded"
        )
    for i, v in enumerate(values):
        if not is_number(v):
            raise input_error(where, f"field '{field}' {label} {i} is {_short(v)}, not a number")
    arr = np.asarray(values, dtype=np.float64)
    check_array(where, field, arr, minimum=minimum, label=label)
    return arr


def check_array(
    where: str,
    field: str,
    arr: np.ndarray,
    *,
    minimum: float | None = 0.0,
    label: str = "entry",
    offset: int = 0,
) -> None:
    """Reject NaN/Infinity and values below ``minimum`` in a float array, naming the first bad index."""
    bad = np.flatnonzero(~np.isfinite(arr))
    if bad.size:
        i = int(bad[0])
        raise input_error(
            where,
            f"field '{field}' {label} {i + offset} is {arr[i]}: NaN/Infinity is not a valid measurement",
        )
    if minimum is not None:
        low = np.flatnonzero(arr < minimum)
        if low.size:
            i = int(low[0])
            kind = "negative" if minimum == 0.0 else f"below {minimum:g}"
            raise input_error(where, f"field '{field}' {label} {i + offset} is {kind} ({arr[i]:g})")


def check_integral(where: str, field: str, arr: np.ndarray, *, label: str = "entry") -> np.ndarray:
    """Check that a float array holds whole numbers and return it as int64."""
    frac = np.flatnonzero(arr != np.floor(arr))
    if frac.size:
        i = int(frac[0])
        raise input_error(where, f"field '{field}' {label} {i} is {arr[i]:g}, not a whole number")
    return arr.astype(np.int64)


def _short(value: Any, limit: int = 40) -> str:
    """A short ``repr`` of a JSON value for an error message (long strings and lists are cut)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return f"a list of {len(value)} entries"
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, int) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def short_repr(value: Any) -> str:
    """Public alias of the short value formatter used in error messages."""
    return _short(value)


def median(values: Sequence[float] | np.ndarray) -> float:
    """Median of a non-empty sequence as a float (NaN when empty)."""
    arr = np.asarray(values, dtype=np.float64)
    return float(np.median(arr)) if arr.size else math.nan


__all__ = [
    "DEFAULT_MAX_BYTES",
    "PathLike",
    "check_array",
    "check_file",
    "check_integral",
    "decode_head",
    "decode_text",
    "file_label",
    "find_non_finite",
    "integer",
    "is_number",
    "load_json",
    "median",
    "number",
    "number_array",
    "read_bytes",
    "read_text",
    "short_repr",
    "is_kernel_file",
]
