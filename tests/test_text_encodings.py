"""Text saved as UTF-16/32 (a Windows editor's "Unicode") or compressed is named as such, with the fix, in a scenario
or grid YAML as in a trace: decoded as UTF-8 it said "invalid YAML (truncated or mis-indented file?)" or "NUL byte:
this is a binary file"."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from kvplan.errors import KvplanInputError
from kvplan.inputfile import decode_text
from kvplan.sim.scenario import load_scenario

TEXT = "workload: {conversations: 3}\n"


@pytest.mark.parametrize(("encoding", "name"), [("utf-16", "UTF-16"), ("utf-16-be", None), ("utf-32", "UTF-32")])
def test_wide_encodings_are_named(tmp_path: Path, encoding: str, name: str | None) -> None:
    data = TEXT.encode(encoding)
    if name is None:  # no byte-order mark: only the NUL bytes tell
        with pytest.raises(KvplanInputError, match="NUL byte"):
            decode_text(data, "t.csv")
        return
    with pytest.raises(KvplanInputError, match=rf"^t\.csv: is {name} text .*, not UTF-8; save it as UTF-8$"):
        decode_text(data, "t.csv")
    path = tmp_path / "s.yaml"
    path.write_bytes(data)
    with pytest.raises(KvplanInputError, match=rf"s\.yaml: is {name} text .*; save it as UTF-8$"):
        load_scenario(path)


def test_a_compressed_scenario_says_so(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml.gz"
    path.write_bytes(gzip.compress(TEXT.encode()))
    with pytest.raises(KvplanInputError, match=r"is compressed \(gzip\), not a text file; decompress it first"):
        load_scenario(path)


def test_utf8_with_or_without_a_bom_still_loads(tmp_path: Path) -> None:
    for data in (TEXT.encode(), TEXT.encode("utf-8-sig")):
        path = tmp_path / "s.yaml"
        path.write_bytes(data)
        assert load_scenario(path).workload.conversations == 3
