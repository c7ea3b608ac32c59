"""``kvplan sweep``'s per-point table prints each column in one unit and one precision: it mixed '895.0 ms' with
'2.76 s' (TTFT), '4.425' with '10.76' and '0' (pinned GiB, errors: ``.4g``) and '0.5' with '60.25' and '480.0'
(a float axis: ``str``)."""

from __future__ import annotations

import math
import re

import pandas as pd
import pytest

from kvplan.app.cmd_sweep import print_summary_table
from kvplan.app.output import axis_column, number_column, seconds_column

CELL = re.compile(r"^-?\d+(?:\.(\d+))?(?: ?(ms|s|min|h|%))?$")


def _table_columns(text: str) -> list[list[str]]:
    rows = [[c.strip() for c in line.strip().strip("│").split("│")] for line in text.splitlines()
            if line.startswith("│")]
    return [list(col) for col in zip(*rows, strict=True)]


def _forms(cells: list[str]) -> set[tuple[int, str]]:
    """(decimals, unit) of each numeric cell ('failed' and 'n/a' are words, not figures)."""
    out = set()
    for c in cells:
        m = CELL.match(c)
        if m:
            out.add((len(m.group(1) or ""), m.group(2) or ""))
        else:
            assert c in ("failed", "n/a") or not any(ch.isdigit() for ch in c), c
    return out


def test_every_column_of_the_sweep_table_has_one_unit_and_one_precision(capsys: pytest.CaptureFixture[str]) -> None:
    nan = math.nan
    summ = pd.DataFrame({
        "policy.decoder_kv_blocks_ttl_s": [0.5, 5.0, 60.25, 480.0, 30.0],
        "deployment.routing": ["round_robin", "prefix_aware", "round_robin", "sticky", "sticky"],
        "ttft_p50_s_mean": [0.421, 0.7183, 0.2223, 1.5, nan],
        "ttft_p90_s_mean": [0.895, 2.76, 0.5285, 2.57, nan],
        "hit_rate_mean": [0.0, 0.889, 1.0, 0.5, nan],
        "pinned_kv_gib_peak_mean": [4.425, 10.76, 0.0123, 48.14, nan],
        "errors_mean": [53.5, 6.0, 0.0, 2.0, nan],
        "errors": [1, 0, 0, 0, 2], "replications": [2, 2, 2, 2, 2],
    })
    print_summary_table(summ, ["policy.decoder_kv_blocks_ttl_s", "deployment.routing"])
    cols = _table_columns(capsys.readouterr().out)
    assert len(cols) == 7 and all(len(c) == 5 for c in cols)
    for col in cols:
        assert len(_forms(col)) <= 1, col  # one unit and one count of decimals per column
    ttl, routing, p50, p90, hit, pinned, errors = cols
    assert ttl == ["0.50", "5.00", "60.25", "480.00", "30.00"] and routing[1] == "prefix_aware"
    assert p50[:4] == ["0.42 s", "0.72 s", "0.22 s", "1.50 s"]  # was 421.0 ms, 718.3 ms, 222.3 ms, 1.50 s
    assert p90[:4] == ["0.90 s", "2.76 s", "0.53 s", "2.57 s"]
    assert pinned[:4] == ["4.425", "10.760", "0.012", "48.140"]  # the smallest keeps its two leading digits
    assert errors[:4] == ["53.50", "6.00", "0.00", "2.00"]
    assert [c[4] for c in (p50, p90, hit, pinned, errors)] == ["failed"] * 5  # every run of that point failed


def test_column_formatters() -> None:
    assert seconds_column([0.0123, 2.5, None, math.inf]) == ["0.012 s", "2.500 s", "n/a", "n/a"]
    assert seconds_column([0.0004, 0.5]) == ["0.40 ms", "500.00 ms"]
    assert seconds_column([0.421, 150.0]) == ["0.0070 min", "2.5000 min"]  # one unit, the smallest legible
    assert seconds_column([1800.0, 7200.0]) == ["0.50 h", "2.00 h"]
    assert number_column([0.0, 6.0, 54.0]) == ["0", "6", "54"]  # whole numbers: no decimals
    assert number_column([1234.5, 2.3]) == ["1234.5", "2.3"] and number_column([48.14, 4.425]) == ["48.14", "4.42"]
    assert number_column([math.nan]) == ["n/a"]
    assert axis_column([30.0, 60.0]) == ["30.0", "60.0"]  # whole floats keep their one form
    assert axis_column([1, 2.5]) == ["1.0", "2.5"] and axis_column(["a", True]) == ["a", "True"]


def test_axis_values_keep_their_digits() -> None:
    # rev15: 1e-7 printed as '0.000000' (a fixed 6 decimals for any exponent form) and 0.1 + 0.2 as '0.300000'
    assert axis_column([1e-7, 2e-7]) == ["0.0000001", "0.0000002"]
    assert axis_column([0.1 + 0.2, 0.5]) == ["0.3", "0.5"]
    assert axis_column([0.5, 60.25, 480.0]) == ["0.50", "60.25", "480.00"]
