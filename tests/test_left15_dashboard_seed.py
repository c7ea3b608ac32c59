"""The dashboard takes any seed the CLI takes (``--seed``: 0 to 2**63 - 1), not only those a JavaScript number holds
exactly (Streamlit's number input: up to 2**53, so 2**53 + 1 became 2**53, another run)."""

from __future__ import annotations

from typing import Any

import click
import pytest
from streamlit.testing.v1 import AppTest

from kvplan.app import dash_state as ds
from kvplan.app.cmd_dashboard import DASHBOARD_SCRIPT
from kvplan.errors import KvplanInputError
from kvplan.sim.api import run
from kvplan.sim.scenario import MAX_SEED
from kvplan.units import human_s

TIMEOUT_S = 120
BIG = 2**53 + 1  # the first integer a float64 cannot hold


def _cli_seed(text: str) -> Any:
    """What typer makes of ``--seed TEXT`` (an int option with min 0 and max MAX_SEED: click's IntRange)."""
    value: Any = text
    return click.IntRange(0, MAX_SEED).convert(value, None, None)


@pytest.mark.parametrize("text", ["0", "7", str(BIG), str(MAX_SEED), " 42 ", "+3", "1_000"])
def test_parse_seed_takes_what_the_cli_takes(text: str) -> None:
    cli = _cli_seed(text)
    assert ds.parse_seed(text) == cli
    assert ds.build_scenario(ds.ScenarioInputs(seed=ds.parse_seed(text))).seed == cli


@pytest.mark.parametrize("text", ["-1", str(MAX_SEED + 1), "1e3", "5.0", "abc", ""])
def test_parse_seed_refuses_what_the_cli_refuses(text: str) -> None:
    with pytest.raises(click.BadParameter):
        _cli_seed(text)
    with pytest.raises(KvplanInputError) as exc:
        ds.parse_seed(text)
    msg = str(exc.value)
    assert msg.startswith("seed: ") and len(msg.splitlines()) == 1 and str(MAX_SEED) in msg


def _chat(seed: int) -> ds.ScenarioInputs:
    return ds.ScenarioInputs(workload="chat", preset_conversations=20, seed=seed,
                             prefill_prefix_caching=ds.cli_prefix_caching_default("chat"))


def test_whatif_page_runs_a_seed_above_2_to_the_53() -> None:
    expected = run(ds.build_scenario(_chat(BIG))).summary
    rounded = run(ds.build_scenario(_chat(2**53))).summary  # what a float input made of it
    assert expected["ttft_mean_s"] != rounded["ttft_mean_s"]
    at = AppTest.from_file(str(DASHBOARD_SCRIPT), default_timeout=TIMEOUT_S)
    at.run()
    at.selectbox(key="sc_workload").select("chat").run()
    at.number_input(key="sc_preset_conversations").set_value(20).run()
    at.text_input(key="sc_seed_text").set_value(str(BIG)).run()
    assert not at.exception and not at.error, (at.exception, [e.value for e in at.error])
    m = {x.label: x for x in at.metric}
    assert m["TTFT mean"].value == human_s(expected["ttft_mean_s"]) != human_s(rounded["ttft_mean_s"])


def test_whatif_page_refuses_a_bad_seed_in_one_line() -> None:
    at = AppTest.from_file(str(DASHBOARD_SCRIPT), default_timeout=TIMEOUT_S)
    at.run()
    at.text_input(key="sc_seed_text").set_value(str(MAX_SEED + 1)).run()
    assert not at.exception
    errors = [e.value for e in at.error]
    assert len(errors) == 1 and errors[0].startswith("seed: ") and len(errors[0].splitlines()) == 1, errors
