"""``kvplan memory`` prints vLLM's per-rank memory lines; a newcomer read 'Available KV cache memory: 49.01 GiB' against
simulate's 'decode KV capacity (all D nodes) 392 GiB' for the same 1P1D TP8 deployment as two pools. It now says the
memory lines are per GPU and gives the engine's pool in the unit simulate prints (helper new15)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from kvplan.app.cli import main


def test_memory_says_per_gpu_and_matches_simulates_pool(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["memory", "--model", "llama-3.3-70b", "--hardware", "p5", "--tp", "8", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert main(["memory", "--model", "llama-3.3-70b", "--hardware", "p5", "--tp", "8"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"Available KV cache memory: {d['available_kv_gib']:.2f} GiB" in lines  # vLLM's wording, unchanged
    note = next(ln for ln in lines if ln.startswith("(memory figures are per GPU"))
    engine_gib = d["available_kv_gib"] * 8
    assert f"its 8 GPU(s) hold {engine_gib:.2f} GiB of KV cache" in note
    sc = tmp_path / "s.yaml"  # the same engine as one D instance of a simulation
    sc.write_text(yaml.safe_dump({"model": "llama-3.3-70b", "hardware": "p5",
                                  "deployment": {"max_num_seqs": 1024, "max_num_batched_tokens": 8192},
                                  "workload": {"conversations": 2, "turns": {"dist": "constant", "value": 1}}}))
    assert main(["simulate", str(sc), "--out", str(tmp_path / "o")]) == 0
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["decode_kv_capacity_gib"] == pytest.approx(engine_gib, abs=0.01)
    assert s["decode_kv_capacity_tokens"] == d["kv_cache_tokens"]
