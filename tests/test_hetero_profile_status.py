"""A run priced by two profiles (heterogeneous TP) reports the less trustworthy one's status: summary.json's
``profile_status``/``extrapolated`` and simulate's header read tensor_parallel_size's profile alone, so qwen3-32b on
p5en at TP8 with P at TP4 (P on a composed profile borrowing p5en-qwen3-32b's corrections) was reported
'calibrated', ``extrapolated: false`` (found by helper rev15)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvplan.app.cli import main
from kvplan.sim.summary import profile_label

HETERO = """model: qwen3-32b
hardware: p5en
deployment: {prefill_nodes: 1, decode_nodes: 1, tensor_parallel_size: 8, prefill_tensor_parallel_size: 4}
policy: {bidirectional: true}
workload:
  conversations: 10
  arrival: {kind: poisson, rate_per_s: 1.0}
  turns: {dist: constant, value: 2}
  prefix_tokens: {dist: constant, value: 2000}
  user_tokens: {dist: constant, value: 100}
  output_tokens: {dist: constant, value: 50}
  turn_gap_s: {dist: constant, value: 5}
"""


def test_a_composed_role_profile_is_not_reported_calibrated(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sc = tmp_path / "hetero.yaml"
    sc.write_text(HETERO)
    assert main(["simulate", str(sc), "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    s = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert s["decode_profile_status"] == "calibrated" and s["profile"] == s["decode_profile"]
    assert s["prefill_profile_status"] != "calibrated" and s["prefill_profile"] != s["decode_profile"]
    assert s["profile_status"] == s["prefill_profile_status"]
    assert s["extrapolated"] is True
    assert f"P {s['prefill_profile']} ({s['prefill_profile_status']})" in out
    assert "Profile not calibrated on this deployment" in out


def test_one_profile_label_is_unchanged() -> None:
    s = {"profile": "p5en-qwen3-32b", "profile_status": "calibrated", "prefill_profile": "p5en-qwen3-32b",
         "decode_profile": "p5en-qwen3-32b"}
    assert profile_label(s) == "profile p5en-qwen3-32b, calibrated"
