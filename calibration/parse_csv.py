"""Parsers of the two plain CSV inputs: measured points and the published P5en figures.

* Points CSV, header exactly ``kind,tokens,cached_tokens,value_ms``: ``kind`` is ``prefill`` (time to
  compute ``tokens`` new tokens on top of ``cached_tokens`` cached ones) or ``kv_transfer`` (time to
  move ``tokens`` tokens of KV); ``value_ms`` in milliseconds.
* Published CSV (``/work/shared/data/p5en_published.csv``), header exactly
  ``model,series,prompt_tokens,value_ms,note``; ``series`` is one of ``ttft_off``, ``ttft_on``,
  ``prefill_off``, ``prefill_on``, ``kv_transfer_on``.

Blank lines and lines starting with ``#`` are skipped; line numbers in errors count every physical
line (the header is line 1).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pandas as pd

from kvplan.errors import input_error
from kvplan.inputfile import DEFAULT_MAX_BYTES, PathLike, file_label, read_text

POINTS_COLUMNS = ("kind", "tokens", "cached_tokens", "value_ms")
POINT_KINDS = ("prefill", "kv_transfer")
PUBLISHED_COLUMNS = ("model", "series", "prompt_tokens", "value_ms", "note")
PUBLISHED_SERIES = ("ttft_off", "ttft_on", "prefill_off", "prefill_on", "kv_transfer_on")

MAX_TOKENS = 10_000_000  # one request: far above any context limit
MAX_VALUE_MS = 3.6e6  # one hour for one prefill or one transfer: anything above is a unit error
# Computing >= 1024 new tokens in under 1 ms (median) is not possible on any GPU: the values are seconds.
_PREFILL_MS_CHECK_MIN_TOKENS = 1024
_PREFILL_MS_IMPLAUSIBLE = 1.0


def _guarded(reader: Any, where: str) -> Iterator[list[str]]:
    """The rows of a :func:`csv.reader`, a :class:`csv.Error` (a field over the 131,072-character limit, a
    NUL byte, an unclosed quote) becoming a one-line error naming the line."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise input_error(where, f"line {reader.line_num}: malformed CSV ({exc})", "fix that line") from None
        yield row


def _rows(
    where: str, text: str, header: tuple[str, ...], *, free_text_last: bool = False
) -> Iterator[tuple[int, list[str]]]:
    """Yield ``(line_number, fields)`` of data rows after checking the header.

    With ``free_text_last`` unquoted commas in the last column (a free-text note) are kept in it."""
    reader = csv.reader(io.StringIO(text))
    seen_header = False
    for fields in _guarded(reader, where):
        lineno = reader.line_num
        if not fields or all(not f.strip() for f in fields) or fields[0].lstrip().startswith("#"):
            continue
        fields = [f.strip() for f in fields]
        if not seen_header:
            if tuple(fields) != header:
                raise input_error(
                    where,
                    f"line {lineno}: header is {','.join(fields)[:80]!r} but expected {','.join(header)!r}",
                    "use exactly that header",
                )
            seen_header = True
            continue
        if free_text_last and len(fields) > len(header):
            fields = fields[: len(header) - 1] + [",".join(fields[len(header) - 1 :])]
        if len(fields) != len(header):
            raise input_error(
                where, f"line {lineno}: has {len(fields)} fields, expected {len(header)} ({','.join(header)})"
            )
        yield lineno, fields
    if not seen_header:
        raise input_error(where, "no header line found", f"the first line must be {','.join(header)!r}")


def _number(where: str, lineno: int, column: str, text: str, *, whole: bool, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        raise input_error(where, f"line {lineno}: column '{column}' is {text!r}, not a number") from None
    if not math.isfinite(value):
        raise input_error(
            where, f"line {lineno}: column '{column}' is {text}: NaN/Infinity is not a valid value"
        )
    if value < 0:
        raise input_error(where, f"line {lineno}: column '{column}' is negative ({value:g})")
    if positive and value == 0:
        raise input_error(where, f"line {lineno}: column '{column}' is 0, must be positive")
    if whole and value != int(value):
        raise input_error(
            where, f"line {lineno}: column '{column}' is {value:g}, not a whole number of tokens"
        )
    limit = MAX_TOKENS if whole else MAX_VALUE_MS
    if value > limit:
        raise input_error(where, f"line {lineno}: column '{column}' is {value:g}, more than {limit:g}",
                          "check the units (tokens; milliseconds)")
    return value


def _choice(where: str, lineno: int, column: str, text: str, allowed: tuple[str, ...]) -> str:
    if text not in allowed:
        raise input_error(
            where, f"line {lineno}: column '{column}' is {text!r}, expected one of {', '.join(allowed)}"
        )
    return text


def parse_points_csv(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> pd.DataFrame:
    """Parse a points CSV into a frame with exactly the columns ``kind, tokens, cached_tokens, value_ms``.

    ``tokens`` must be a positive whole number, ``cached_tokens`` a non-negative one, ``value_ms`` a
    positive number of ms. Raises :class:`~kvplan.errors.KvplanInputError` naming the line for a wrong
    header, a wrong field count, an unknown kind, non-numbers, NaN, negative values, no data rows, and
    prefill values that look like seconds.
    """
    where = file_label(path)
    text = read_text(path, max_bytes)
    kinds: list[str] = []
    numbers: list[tuple[float, float, float]] = []
    lines: list[int] = []
    for lineno, (kind, tokens, cached, value) in _rows(where, text, POINTS_COLUMNS):
        kinds.append(_choice(where, lineno, "kind", kind, POINT_KINDS))
        numbers.append(
            (
                _number(where, lineno, "tokens", tokens, whole=True, positive=True),
                _number(where, lineno, "cached_tokens", cached, whole=True, positive=False),
                _number(where, lineno, "value_ms", value, whole=False, positive=True),
            )
        )
        lines.append(lineno)
    if not kinds:
        raise input_error(where, "the file has a header but no data rows", "add at least one measured point")
    arr = np.asarray(numbers, dtype=np.float64)
    frame = pd.DataFrame(
        {
            "kind": pd.Series(kinds, dtype=str),
            "tokens": arr[:, 0].astype(np.int64),
            "cached_tokens": arr[:, 1].astype(np.int64),
            "value_ms": arr[:, 2],
        }
    )
    prefill = (frame["kind"] == "prefill").to_numpy() & (
        frame["tokens"].to_numpy() >= _PREFILL_MS_CHECK_MIN_TOKENS
    )
    if prefill.any():
        med = float(np.median(frame["value_ms"].to_numpy()[prefill]))
        if med < _PREFILL_MS_IMPLAUSIBLE:
            first = lines[int(np.flatnonzero(prefill)[0])]
            raise input_error(
                where,
                f"line {first}: column 'value_ms' of prefill rows of >= {_PREFILL_MS_CHECK_MIN_TOKENS} "
                f"tokens has median {med:g}: that looks like seconds, not ms",
                "multiply value_ms by 1000",
            )
    return frame


def parse_published_csv(path: PathLike, *, max_bytes: int = DEFAULT_MAX_BYTES) -> pd.DataFrame:
    """Parse the published-figures CSV (``model,series,prompt_tokens,value_ms,note``).

    Returns those five columns (``note`` is '' where empty). Errors name the line: wrong header,
    unknown series, empty model, non-numbers, NaN, non-positive values, duplicate (model, series,
    prompt_tokens) points, no data rows.
    """
    where = file_label(path)
    text = read_text(path, max_bytes)
    records: list[dict[str, Any]] = []
    seen: dict[tuple[str, str, int], int] = {}
    for lineno, (model, series, prompt_tokens, value, note) in _rows(
        where, text, PUBLISHED_COLUMNS, free_text_last=True
    ):
        if not model:
            raise input_error(where, f"line {lineno}: column 'model' is empty")
        tokens = int(_number(where, lineno, "prompt_tokens", prompt_tokens, whole=True, positive=True))
        key = (model, _choice(where, lineno, "series", series, PUBLISHED_SERIES), tokens)
        if key in seen:
            raise input_error(
                where, f"line {lineno}: repeats the point of line {seen[key]} ({model}, {series}, {tokens})"
            )
        seen[key] = lineno
        records.append(
            {
                "model": model,
                "series": series,
                "prompt_tokens": tokens,
                "value_ms": _number(where, lineno, "value_ms", value, whole=False, positive=True),
                "note": note,
            }
        )
    if not records:
        raise input_error(where, "the file has a header but no data rows")
    frame = pd.DataFrame.from_records(records, columns=list(PUBLISHED_COLUMNS))
    frame["prompt_tokens"] = frame["prompt_tokens"].astype(np.int64)
    frame["value_ms"] = frame["value_ms"].astype(np.float64)
    for col in ("model", "series", "note"):
        frame[col] = frame[col].astype(str)
    return frame


#: Parser per CSV kind, for :func:`kvplan.calibration.parsers.parse_any`.
CSV_PARSERS: dict[str, Callable[..., pd.DataFrame]] = {
    "points": parse_points_csv,
    "published": parse_published_csv,
}
