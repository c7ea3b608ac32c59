"""A RAGPulse file whose clock restarts says what the replay did with it (helper new15: the warning ended in
"on_clock_restart='sort'", a name no scenario field or option sets, with no word on what sorting does to the load)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from kvplan.traces.readers import load_trace


def _ragpulse(path: Path) -> Path:
    rows = [(0, "a"), (100, "a"), (5000, "b"), (10, "c"), (200, "c")]  # the clock restarts at line 4
    path.write_text("".join(json.dumps({"timestamp": t, "input_length": 100, "output_length": 10, "session_id": s})
                            + "\n" for t, s in rows))
    return path


@pytest.mark.parametrize(("mode", "said"), [
    ("sort", "its segments were sorted together, each from its own time 0: they overlap, so the replay's arrival "
             "rate is their sum"),
    ("append", "each segment was appended after the previous segment's last arrival")])
def test_clock_restart_warning_says_what_the_replay_did(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                         mode: str, said: str) -> None:
    with caplog.at_level(logging.WARNING):
        load_trace(_ragpulse(tmp_path / "0_trace.jsonl"), "ragpulse", on_clock_restart=mode)  # type: ignore[arg-type]
    assert "the clock goes back by more than 3600 s at line(s) [4]" in caplog.text
    assert said in caplog.text
