"""The README's "Your own deployment" scenario runs as the README says (helper new15: the quick start ran only the
embedded P5en default; the one example scenario, benchmarks/reference.yaml, is the speed benchmark's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvplan.app.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "docs" / "examples" / "llama-3.3-70b-p5-agent.yaml"


def test_readme_names_the_example_and_its_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert EXAMPLE.exists()
    for cmd in ("simulate", "recommend", "capacity", "compare"):
        assert f".venv/bin/kvplan {cmd} docs/examples/llama-3.3-70b-p5-agent.yaml" in readme


def test_example_simulates_as_the_readme_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", str(EXAMPLE), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    s = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert s["model"] == "llama-3.3-70b" and s["hardware"] == "p5" and s["errors"] == 0
    assert "health: nothing saturated" in out  # "at TTL 480 s, nothing saturates ..."
    assert round(s["decode_kv_capacity_gib"]) == 392
    assert 0.80 <= s["pinned_kv_gib_peak"] / s["decode_kv_capacity_gib"] <= 0.92  # "... but pins reach 86% at peak"
