"""Numbers in scenario and grid YAML have no colon: PyYAML (YAML 1.1) reads an unquoted ``8:00`` as the base-60
integer 480, ``1:30:00`` as 5400 and ``1:30.5`` as 90.5, so ``decoder_kv_blocks_ttl_s: 8:00`` meant as eight minutes
ran at 480 s without a word. kvplan refuses them in one line naming the line, the field and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from kvplan.errors import KvplanInputError
from kvplan.safe_yaml import load_yaml_text


@pytest.mark.parametrize(("text", "read_as"), [("8:00", "480"), ("1:30:00", "5400"), ("1:30.5", "90.5"),
                                               ("-2:00", "-120"), ("1_0:00", "600")])
def test_base_60_numbers_are_refused_with_their_line_and_field(text: str, read_as: str) -> None:
    doc = f"workload:\n  conversations: 3\npolicy:\n  decoder_kv_blocks_ttl_s: {text}\n"
    with pytest.raises(KvplanInputError) as err:
        load_yaml_text(doc, "s.yaml")
    msg = str(err.value)
    assert msg.startswith(f"s.yaml line 4 field 'policy.decoder_kv_blocks_ttl_s': '{text}' is a YAML 1.1 base-60 "
                          f"number (read as {read_as}); write the number itself, e.g. {read_as}"), msg
    assert "quote it" in msg and "\n" not in msg


def test_list_items_are_named_and_quoted_values_and_plain_numbers_pass() -> None:
    with pytest.raises(KvplanInputError, match=r"^g\.yaml line 2 field 'axes\.policy\.decoder_kv_blocks_ttl_s\[1\]': "
                                               r"'1:00' is a YAML 1\.1 base-60 number \(read as 60\)"):
        load_yaml_text("axes:\n  policy.decoder_kv_blocks_ttl_s: [30, 1:00]\n", "g.yaml")
    assert load_yaml_text("a: '8:00'\nb: \"1:30:00\"\nc: 480\nd: 1.5\ne: 0:30\n", "s.yaml") == {
        "a": "8:00", "b": "1:30:00", "c": 480, "d": 1.5, "e": "0:30"}  # 0:30 is no number in YAML 1.1 either


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_cli_refuses_a_base_60_ttl_in_one_line_with_exit_2(tmp_path: Path, command: str) -> None:
    if command == "simulate":
        path = tmp_path / "s.yaml"
        path.write_text("workload:\n  conversations: 3\npolicy:\n  decoder_kv_blocks_ttl_s: 8:00\n")
        args = ["simulate", str(path), "--out", str(tmp_path / "out")]
        field = "policy.decoder_kv_blocks_ttl_s"
    else:
        path = tmp_path / "g.yaml"
        path.write_text("base:\n  workload: {conversations: 3}\naxes:\n  policy.decoder_kv_blocks_ttl_s: [60, 8:00]\n")
        args = ["sweep", str(path), "--out", str(tmp_path / "r.parquet")]
        field = "axes.policy.decoder_kv_blocks_ttl_s[1]"
    res = subprocess.run([sys.executable, "-m", "kvplan.app.cli", *args], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr, res.stderr
    assert f"field '{field}': '8:00' is a YAML 1.1 base-60 number (read as 480)" in res.stderr, res.stderr
    assert "write the number itself, e.g. 480" in res.stderr and "quote it ('8:00')" in res.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "r.parquet").exists()
