"""Units for people and for files: the terminal and dashboard scale times (ms, s, min, h); files keep SI."""

from __future__ import annotations

import math
from typing import Any


def human_s(x: Any) -> str:
    """Seconds scaled for a human: ms below 1 s, s below 2 min, min below 2 h, then h."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "n/a"
    if not math.isfinite(v):
        return "n/a"
    a = abs(v)
    if a < 1.0:
        return f"{v * 1000:.1f} ms"
    if a < 120.0:
        return f"{v:.2f} s"
    if a < 7200.0:
        return f"{v / 60:.1f} min"
    return f"{v / 3600:.1f} h"


def si_s(x: Any) -> str:
    """Seconds as exact SI text (what files carry)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "n/a"
    return f"{v:.6g} s" if math.isfinite(v) else "n/a"
