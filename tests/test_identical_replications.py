"""A replay with nothing random in it gives identical replications: compare and recommend say what their ±0 means."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.app.cli import main
from kvplan.app.cmd_compare import IDENTICAL_NOTE, identical_replications

TRACE = Path(__file__).parent / "data" / "traces" / "mooncake_small.jsonl"


def test_compare_and_recommend_say_a_replay_s_replications_are_identical(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--workload", "chat", "--trace", str(TRACE), "--replications", "2",
                 "--policies", "off,ttl"]) == 0
    assert IDENTICAL_NOTE in capsys.readouterr().out
    assert main(["recommend", "--workload", "chat", "--trace", str(TRACE), "--replications", "2",
                 "--ttl-grid", "30,60", "--no-policies"]) == 0
    assert IDENTICAL_NOTE in capsys.readouterr().out


def test_sampled_traffic_has_no_such_note(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--workload", "tool-agent", "--conversations", "40", "--replications", "2",
                 "--policies", "off,ttl"]) == 0
    out = capsys.readouterr().out
    assert "± 95% CI over 2 replications" in out and IDENTICAL_NOTE not in out


def test_identical_means_every_ttft_ci_is_zero() -> None:
    row = {"ttft_p50_s_ci95": 0.0, "ttft_p90_s_ci95": 0.0, "ttft_p99_s_ci95": 0.0, "ttft_mean_s_ci95": 0.0}
    assert identical_replications([row, dict(row)])
    assert not identical_replications([row, {**row, "ttft_p99_s_ci95": 0.004}])
    assert not identical_replications([{**row, "ttft_mean_s_ci95": None}])  # one replication: no CI at all
    assert not identical_replications([])
