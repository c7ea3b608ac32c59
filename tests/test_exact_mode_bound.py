"""``simulation.decode_mode: exact`` steps every decode token as an event, so its cost is the plan's output tokens, not
its turns: the turn bound alone let one scenario cost days (10,000,000 turns of 40,000-token outputs). A run that
plans more than ``MAX_EXACT_DECODE_TOKENS`` output tokens in exact mode is refused before it starts (one line naming
the field and the fix); fast mode, the same per-turn times, is not limited by it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from kvplan.app.cli import main
from kvplan.errors import KvplanInputError
from kvplan.sim import validity
from kvplan.sim.api import run
from kvplan.sim.validity import MAX_EXACT_DECODE_TOKENS, check_exact_decode_cost

SMALL = {"workload": {"conversations": 4, "turns": {"dist": "constant", "value": 2},
                      "output_tokens": {"dist": "constant", "value": 50}}}


def test_the_bound_counts_output_tokens_in_exact_mode_only() -> None:
    over = SimpleNamespace(output_tokens=np.array([MAX_EXACT_DECODE_TOKENS // 2 + 1] * 2, dtype=np.int64))
    with pytest.raises(KvplanInputError, match=r"^simulation\.decode_mode: exact steps every decode token, and this run "
                       r"plans 500,000,002 output tokens .*; use decode_mode: fast"):
        check_exact_decode_cost(over, "exact")
    check_exact_decode_cost(over, "fast")
    check_exact_decode_cost(SimpleNamespace(output_tokens=np.array([MAX_EXACT_DECODE_TOKENS])), "exact")


def test_an_exact_run_over_the_bound_is_refused_before_it_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(validity, "MAX_EXACT_DECODE_TOKENS", 399)  # the plan holds 4 x 2 x 50 = 400
    sc = tmp_path / "s.yaml"
    sc.write_text("workload: {conversations: 4, turns: {dist: constant, value: 2}, output_tokens: {dist: constant, "
                  "value: 50}}\nsimulation: {decode_mode: exact}\n")
    assert main(["simulate", str(sc), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: simulation.decode_mode: exact steps every decode token, and this run plans 400 ")
    assert err.count("\n") == 1 and not (tmp_path / "o").exists()
    assert run({**SMALL}).summary["turns"] == 8  # fast mode: the same plan runs
    monkeypatch.setattr(validity, "MAX_EXACT_DECODE_TOKENS", 400)
    assert run({**SMALL, "simulation": {"decode_mode": "exact"}}).summary["turns"] == 8
