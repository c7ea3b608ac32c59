"""Moved to :mod:`kvplan.inputfile` (bounded, checked reading of user files, below every layer that reads one).

A re-export kept so that code written against the old path still imports.
"""

from __future__ import annotations

from kvplan.inputfile import (
    DEFAULT_MAX_BYTES,
    PathLike,
    _human_bytes,
    _short,
    check_array,
    check_file,
    check_integral,
    file_label,
    find_non_finite,
    integer,
    is_number,
    load_json,
    median,
    number,
    number_array,
    read_text,
    short_repr,
)

__all__ = [
    "DEFAULT_MAX_BYTES", "PathLike", "_human_bytes", "_short", "check_array", "check_file", "check_integral",
    "file_label", "find_non_finite", "integer", "is_number", "load_json", "median", "number", "number_array",
    "read_text", "short_repr",
]
