"""The profile parts printed for a heterogeneous-TP deployment name each role's own TP and profile."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvplan.app.cli import main

HETERO = """model: llama-3.3-70b
hardware: p5
deployment: {prefill_nodes: 1, decode_nodes: 1, tensor_parallel_size: 8, prefill_tensor_parallel_size: 4}
policy: {bidirectional: true}
workload:
  conversations: 20
  arrival: {kind: poisson, rate_per_s: 1.0}
  turns: {dist: constant, value: 2}
  prefix_tokens: {dist: constant, value: 3000}
  user_tokens: {dist: constant, value: 100}
  output_tokens: {dist: constant, value: 50}
  turn_gap_s: {dist: constant, value: 5}
"""


def test_heterogeneous_tp_profile_parts_name_each_roles_prior(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """P at TP4 and D at TP8 are priced by their own TP's kernel prior (summary.json's prefill_profile is the TP4 one),
    but `simulate` printed 'prefill.gpu: kernel-derived (prior llama-3.3-70b-h100-sxm-tp8 ...)' (the parts of
    tensor_parallel_size's profile for both roles), and recommend's warning said the same."""
    from kvplan.plan.advice_report import run_warnings
    from kvplan.sim.engine import resolve
    from kvplan.sim.scenario import load_scenario

    sc = tmp_path / "hetero.yaml"
    sc.write_text(HETERO)
    assert main(["simulate", str(sc), "--out", str(tmp_path / "run")]) == 0
    out = capsys.readouterr().out
    prefill = next(ln for ln in out.splitlines() if ln.strip().startswith("prefill.gpu:"))
    decode = next(ln for ln in out.splitlines() if ln.strip().startswith("decode.gpu:"))
    assert "llama-3.3-70b-h100-sxm-tp4" in prefill and "tp8" not in prefill.split("[")[0], prefill
    assert "[prefill at TP4: profile llama-3.3-70b-p5-tp4" in prefill
    assert "llama-3.3-70b-h100-sxm-tp8" in decode and "[decode" not in decode
    # summary.json's profile_components too (it named the TP8 prior for P's prefill)
    parts = json.loads((tmp_path / "run" / "summary.json").read_text())["profile_components"]
    assert "llama-3.3-70b-h100-sxm-tp4" in parts["prefill.gpu"] and "[prefill at TP4" in parts["prefill.gpu"]
    assert "llama-3.3-70b-h100-sxm-tp8" in parts["decode.gpu"]
    warning = next(w for w in run_warnings(resolve(load_scenario(sc)), []) if w.startswith("profile not calibrated"))
    assert "prefill.gpu: kernel-derived (prior llama-3.3-70b-h100-sxm-tp4" in warning
    assert "decode.gpu: kernel-derived (prior llama-3.3-70b-h100-sxm-tp8" in warning
