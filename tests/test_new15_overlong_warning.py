"""A replay cut at the context limit says out of how many requests and which setting changes it (helper new15: 'select:
6 request(s) over 131072 tokens were skipped' named neither the total nor a setting, and 'select' is no word a user
wrote). The old first clause stays (scripts and the older tests match it)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from kvplan.sim.api import run
from kvplan.sim.scenario import TraceSource, scenario_from_dict
from kvplan.sim.weka_plan import plan_from_weka

DATA = Path(__file__).resolve().parent / "data" / "traces"


def test_csv_replay_says_total_and_setting(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    tr = tmp_path / "t.csv"
    tr.write_text("session_id,timestamp_s,input_tokens,output_tokens\na,0,1000,100\na,60,41000,100\nb,120,500,50\n")
    with caplog.at_level(logging.WARNING):
        run(scenario_from_dict({"workload": {"trace": {"path": str(tr)}}}))  # Qwen3-32B: 40,960 tokens
    assert ("select: 1 request(s) over 40960 tokens were skipped (trace replay: 1 of its 3 requests have prompt + "
            "output beyond the context limit, deployment.max_model_len or else the model's; workload.trace.overlong: "
            "truncate replays them cut to it") in caplog.text


def test_weka_replay_says_total_and_setting(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        plan_from_weka(TraceSource(path=str(DATA / "weka_small.json")), 0, 1700)
    assert "select: 2 request(s) over 1700 tokens were skipped (trace replay: 2 of its " in caplog.text
    assert "workload.trace.overlong: truncate" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        plan_from_weka(TraceSource(path=str(DATA / "weka_small.json"), overlong="truncate"), 0, 1700)
    assert "were truncated (trace replay: 2 of its " in caplog.text
    assert "a model with a longer context replays them whole)" in caplog.text
