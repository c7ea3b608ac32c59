"""``kvplan cost`` says whether pulling or recomputing its --tokens is faster (helper new15: it printed a prefill time
and a pull time of different things, the prefill including the step overhead, and no verdict)."""

from __future__ import annotations

import json

import pytest

from kvplan.app.cli import main
from kvplan.plan.breakeven import break_even
from kvplan.sim.engine import resolve
from kvplan.sim.scenario import Scenario

ARGS = ["cost", "--model", "llama-3.3-70b", "--hardware", "p5", "--tp", "8", "--cached-tokens", "30000"]


def _cost(tokens: int, capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:
    assert main([*ARGS, "--tokens", str(tokens), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert main([*ARGS, "--tokens", str(tokens)]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("pull or recompute"))
    return d, line


def test_verdict_flips_at_the_break_even_of_a_one_token_tail(capsys: pytest.CaptureFixture[str]) -> None:
    rs = resolve(Scenario.model_validate({"model": "llama-3.3-70b", "hardware": "p5"}))
    n_star = break_even(rs, 30000, 1).tokens  # the advisor's rule, one token computed anyway
    below, line_below = _cost(n_star - 1, capsys)
    at, line_at = _cost(n_star, capsys)
    assert below["recompute_marginal_s"] < below["kv_transfer_s"] and "recomputing is faster" in line_below
    assert at["kv_transfer_s"] <= at["recompute_marginal_s"] and "pulling is faster" in line_at
    assert f"pull {at['kv_transfer_s'] * 1e3:.2f} ms on an idle link, recompute " in line_at
