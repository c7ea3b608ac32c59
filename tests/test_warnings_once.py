"""kvplan's warnings reach the terminal once per command (app/logs.py), and the CLI uses it."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from kvplan.app.logs import warnings_once


def test_each_distinct_warning_once_per_command(capsys: pytest.CaptureFixture[str]) -> None:
    log = logging.getLogger("kvplan.traces.select")
    with warnings_once():
        for _ in range(8):  # compare's eight policies replaying the same trace
            log.warning("select: %d request(s) over %d tokens were %s", 574, 40960, "skipped")
        log.warning("select: %d request(s) over %d tokens were %s", 3, 40960, "skipped")
        logging.getLogger("kvplan.plan.sweep").warning("select: 574 request(s) over 40960 tokens were skipped")
        log.info("not a warning")
    err = capsys.readouterr().err.splitlines()
    assert err == ["select: 574 request(s) over 40960 tokens were skipped",
                   "select: 3 request(s) over 40960 tokens were skipped",
                   "select: 574 request(s) over 40960 tokens were skipped"]  # another logger's own message
    with warnings_once():  # the next command says it again
        log.warning("select: %d request(s) over %d tokens were %s", 574, 40960, "skipped")
    assert capsys.readouterr().err.splitlines() == ["select: 574 request(s) over 40960 tokens were skipped"]
    assert not logging.getLogger("kvplan").handlers  # nothing left installed


def test_records_still_propagate(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("kvplan.traces.select")
    with caplog.at_level(logging.WARNING), warnings_once():
        log.warning("same")
        log.warning("same")
    assert [r.getMessage() for r in caplog.records] == ["same", "same"]


def test_compare_says_a_trace_s_skipped_requests_once(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"  # one request beyond qwen3-32b's 40,960-token context among ordinary ones
    trace.write_text("session_id,timestamp_s,input_tokens,output_tokens\n"
                     "a,0.0,1000,100\nb,1.0,50000,100\na,20.0,1300,80\nc,30.0,800,60\n", encoding="utf-8")
    # a process of its own: pytest's log capture would take the records before Python's last-resort handler
    out = subprocess.run([sys.executable, "-m", "kvplan.app.cli", "compare", "--workload", "chat", "--trace", str(trace),
                          "--replications", "2", "--policies", "off,ttl,lease"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    # every one of the six runs (3 policies x 2 replications) reads the trace and skips the request: said once
    assert out.stderr.count("select: 1 request(s) over 40960 tokens were skipped") == 1, out.stderr
