"""``workload.first_turn_user_tokens``: turn 1 with or without a user_tokens draw on top of prefix_tokens.

A trace's first prompt is the whole first request (``kvplan workload fit`` fits prefix_tokens to it), so the
fitted workload sets the switch false; the simulator, the analytic screen and the planners' formulas must then
all take turn 1 as the prefix alone, and nothing changes while it holds its default."""

from __future__ import annotations

import numpy as np
import pytest

from kvplan.calibration.workload_fit import fit_workload, workload_section
from kvplan.plan.screen import screen_scenarios
from kvplan.sim.scenario import Scenario, Workload
from kvplan.sim.workload import make_plan
from kvplan.traces.sessions import trace_from_sessions

_SYNTH = {
    "conversations": 300, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
    "turns": {"dist": "uniform", "low": 1, "high": 6},
    "prefix_tokens": {"dist": "lognormal", "median": 1500, "sigma": 0.5},
    "user_tokens": {"dist": "uniform", "low": 50, "high": 400},
    "output_tokens": {"dist": "uniform", "low": 20, "high": 300},
    "turn_gap_s": {"dist": "exponential", "mean": 10},
}


def _plan(first_user: bool, **over: object) -> tuple[np.ndarray, np.ndarray]:
    wl = Workload.model_validate({**_SYNTH, **over, "first_turn_user_tokens": first_user})
    p = make_plan(wl, seed=3, max_model_len=10**6)
    return p.prompt_tokens, p.offsets


def test_first_turn_without_user_draw_is_the_prefix_and_moves_nothing_else() -> None:
    with_user, off = _plan(True)
    alone, off2 = _plan(False)
    assert np.array_equal(off, off2)  # same conversations and turns: the draw is made either way
    first = off[:-1]
    prefix = make_plan(Workload.model_validate(_SYNTH), 3, 10**6)  # the default is true
    assert np.array_equal(prefix.prompt_tokens, with_user)
    # every turn of a conversation is shorter by exactly its first user draw (nothing else moved)
    diff = with_user - alone
    conv = np.repeat(np.arange(len(first)), np.diff(off))
    assert np.array_equal(diff, diff[first][conv])
    assert (diff[first] >= 50).all() and (diff[first] <= 400).all()


def test_default_is_not_dumped_so_fingerprints_stay() -> None:
    assert "first_turn_user_tokens" not in Workload.model_validate(_SYNTH).model_dump()
    assert Workload.model_validate({**_SYNTH, "first_turn_user_tokens": False}).model_dump()[
        "first_turn_user_tokens"] is False
    with pytest.raises(ValueError, match="first_turn_user_tokens"):
        Workload.model_validate({**_SYNTH, "first_turn_user_tokens": "no"})


def _constant_scenario(prefix: int, first_user: bool) -> Scenario:
    wl = {**_SYNTH, "prefix_tokens": {"dist": "constant", "value": prefix},
          "user_tokens": {"dist": "constant", "value": 150}, "first_turn_user_tokens": first_user}
    return Scenario.model_validate({"model": "qwen3-32b", "hardware": "p5en", "workload": wl,
                                    "policy": {"bidirectional": True}})


def test_simulator_and_screen_agree_turn_one_is_the_prefix_alone() -> None:
    # prefix 2,000 without the first draw is the same workload as prefix 1,850 with it (user tokens constant 150)
    a, b = _constant_scenario(2000, False), _constant_scenario(1850, True)
    pa = make_plan(a.workload, 5, 10**6)
    pb = make_plan(b.workload, 5, 10**6)
    assert np.array_equal(pa.prompt_tokens, pb.prompt_tokens)
    assert pa.prompt_tokens[pa.offsets[:-1]].tolist() == [2000] * a.workload.conversations
    sa, sb = screen_scenarios([a, b]).to_dict("records")
    assert sa == pytest.approx(sb, nan_ok=True)  # the analytic screen takes turn 1 the simulator's way


def test_workload_fit_first_prompts_are_the_traces() -> None:
    rng = np.random.default_rng(11)
    sid, arr, n_in, n_out = [], [], [], []
    firsts = []
    for s in range(400):
        t = float(rng.uniform(0, 50_000))
        x = int(rng.integers(300, 5000))
        firsts.append(x)
        for _ in range(int(rng.integers(1, 4))):
            o = int(rng.integers(20, 400))
            sid.append(f"s{s}")
            arr.append(t)
            n_in.append(x)
            n_out.append(o)
            t += 60.0 + float(rng.exponential(30.0))
            x += o + int(rng.integers(10, 300))
    order = np.argsort(arr, kind="stable")
    tr = trace_from_sessions([sid[i] for i in order], [arr[i] for i in order], [n_in[i] for i in order],
                             [n_out[i] for i in order], source="synthetic")
    section = workload_section(fit_workload(tr))
    assert section["first_turn_user_tokens"] is False
    plan = make_plan(Workload.model_validate(section), 1, 10**6)
    synth_first = plan.prompt_tokens[plan.offsets[:-1]]
    assert set(synth_first.tolist()) <= set(firsts)  # every synthetic first prompt is one the trace had
