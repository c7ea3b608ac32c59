"""Azure trace TIMESTAMP fractions (helper in15): the fraction after the second was read with float('0.' + frac), so
'2023-11-16 18:17:03.5e9' silently became 5e8 s (about 16 years) later than its second, and '03.1_5' read as 03.15.
Only digits are a fraction; anything else is the one-line TIMESTAMP error."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.errors import KvplanInputError
from kvplan.traces.readers import load_trace

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


@pytest.mark.parametrize("stamp", ["2023-11-16 18:17:03.5e9", "2023-11-16 18:17:03.1_5",
                                   "2023-11-16 18:17:03.\u0661\u0662", "2023-11-16 18:17:03.inf"])
def test_a_fraction_that_is_not_digits_is_refused(tmp_path: Path, stamp: str) -> None:
    p = tmp_path / "a.csv"
    p.write_text(HEADER + f"2023-11-16 18:17:03.0,100,10\n\"{stamp}\",200,20\n")
    with pytest.raises(KvplanInputError, match=r"a\.csv: line 3: field 'TIMESTAMP' is .*YYYY-MM-DD HH:MM:SS\.fffffff"):
        load_trace(p)


def test_digits_are_the_fraction(tmp_path: Path) -> None:
    p = tmp_path / "a.csv"
    p.write_text(HEADER + "2023-11-16 18:17:03.9799600,100,10\n2023-11-16 18:17:04,200,20\n")
    arrivals = load_trace(p).requests["arrival_s"].to_numpy()
    assert arrivals[1] - arrivals[0] == pytest.approx(0.02004, abs=1e-6)
