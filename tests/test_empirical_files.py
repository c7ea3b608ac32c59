"""An empirical distribution's ``path`` file (one number per line, or a CSV column): one header at most, and after it a
value that is not a number is that line's error, not a second header."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvplan.errors import KvplanInputError
from kvplan.sim.workload import load_empirical_values


def _file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "v.csv"
    path.write_text(text)
    return path


def test_a_non_number_in_the_named_column_is_its_line_s_error(tmp_path: Path) -> None:
    """The column exists; its first value is junk. Before: the data line was taken for a second header, and the
    error said "line 1: no column 'b' in the header", about a header that has it."""
    path = _file(tmp_path, "a,b\n1,x\n2,5\n")
    with pytest.raises(KvplanInputError, match=r"v\.csv: line 2: not a number: \['x'\]$"):
        load_empirical_values(path, "b")


def test_a_header_after_comments_is_found_and_named_by_its_line(tmp_path: Path) -> None:
    path = _file(tmp_path, "# measured on 2026-01-01\na,b\n1,3\n2,4\n")
    assert np.array_equal(load_empirical_values(path, "b"), [3.0, 4.0])
    with pytest.raises(KvplanInputError, match=r"v\.csv: line 2: no column 'zz' in the header$"):
        load_empirical_values(path, "zz")


def test_one_header_at_most_without_a_column(tmp_path: Path) -> None:
    assert np.array_equal(load_empirical_values(_file(tmp_path, "tokens\n7\n8\n")), [7.0, 8.0])
    with pytest.raises(KvplanInputError, match=r"v\.csv: line 2: not a number: \['units'\]$"):
        load_empirical_values(_file(tmp_path, "tokens\nunits\n8\n"))
