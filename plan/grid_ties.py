"""Tied sweep axes: a path whose value follows another axis, ``"policy.decoder_kv_blocks_ttl_s - 10"``.

A tie expression is affine in one axis and parsed by a regular expression, never evaluated::

    [NUMBER *] PATH [* NUMBER] [(+|-) NUMBER]

e.g. ``policy.decoder_kv_blocks_ttl_s - 10``, ``2 * deployment.decode_nodes``, ``x.y * 0.5 + 1``. Numbers
are decimal literals (``10``, ``-2.5``, ``1e3``). The value is ``scale x axis + offset``; it stays an int when
the axis value and both constants are integers (so a tied ``deployment.prefill_nodes`` is still an int).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from kvplan.errors import input_error

_NUM = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_PATH = r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*"
_EXPR = re.compile(rf"^\s*(?:(?P<pre>{_NUM})\s*\*\s*)?(?P<path>{_PATH})\s*(?:\*\s*(?P<post>{_NUM})\s*)?"
                   rf"(?:(?P<sign>[+-])\s*(?P<off>{_NUM})\s*)?$")
MAX_EXPR_CHARS = 200
SYNTAX = "write 'PATH', 'PATH - 10', 'PATH * 0.5 + 1' or '2 * PATH' (PATH an axis of the grid)"


def _number(text: str) -> int | float:
    v = float(text)
    return int(v) if v.is_integer() and not any(c in text for c in ".eE") else v


@dataclass(frozen=True)
class Tie:
    """``target = scale x source + offset`` (the parsed expression and its text, for the fingerprint)."""

    source: str
    scale: int | float
    offset: int | float
    text: str

    def value(self, source_value: Any, where: str) -> int | float:
        """The tied value for one point's ``source_value`` (a one-line error if it is not a number)."""
        if isinstance(source_value, bool) or not isinstance(source_value, int | float):
            raise input_error(where, f"'{self.source}' = {source_value!r} is not a number", "tie only numeric axes")
        out = self.scale * source_value + self.offset
        if not math.isfinite(out):
            raise input_error(where, f"gives {out!r}", "use finite numbers")
        return out


def parse_tie(text: Any, where: str) -> Tie:
    """Parse one tie expression (grammar in the module docstring); anything else is a one-line error."""
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise input_error(where, f"must be an expression string, got {type(text).__name__}", SYNTAX)
    s = str(text)
    m = _EXPR.match(s) if len(s) <= MAX_EXPR_CHARS else None
    if m is None:
        raise input_error(where, f"cannot parse {s[:60]!r}", SYNTAX)
    if m["pre"] is not None and m["post"] is not None:
        raise input_error(where, f"two factors in {s!r}", SYNTAX)
    scale = _number(m["pre"] or m["post"] or "1")
    off = _number(m["off"]) if m["off"] is not None else 0
    if m["sign"] == "-":
        off = -off
    if not (math.isfinite(scale) and math.isfinite(off)):
        raise input_error(where, f"non-finite number in {s!r}", SYNTAX)
    return Tie(source=m["path"], scale=scale, offset=off, text=s.strip())


def parse_zip(group: Any, where: str) -> tuple[tuple[str, ...], tuple[tuple[Any, ...], ...]]:
    """One zipped group ``{path: [v0, v1, ...], path2: [w0, w1, ...]}`` (equal lengths) -> (paths, rows)."""
    if not isinstance(group, dict) or not group:
        raise input_error(where, "must be a non-empty mapping {dotted.path: [values, ...]} of equal-length lists")
    names: list[str] = []
    cols: list[list[Any]] = []
    for name, vals in group.items():
        if not isinstance(name, str) or not name:
            raise input_error(where, f"axis name {name!r} must be a dotted scenario path")
        if not isinstance(vals, list) or not vals:
            raise input_error(f"{where} '{name}'", "must be a non-empty list of values")
        names.append(name)
        cols.append(vals)
    n = len(cols[0])
    for name, vals in zip(names, cols, strict=True):
        if len(vals) != n:
            raise input_error(f"{where} '{name}'", f"has {len(vals)} values, '{names[0]}' has {n}",
                              "zipped axes vary together: give every list the same length")
    return tuple(names), tuple(tuple(c[i] for c in cols) for i in range(n))
