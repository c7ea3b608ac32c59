"""D's batch holds at most ``max_num_seqs`` sequences (vLLM ``vllm/v1/core/sched/scheduler.py``: the waiting loop
stops at ``len(self.running) == self.max_num_running_reqs``); the P/D matrix of tests/test_native.py never
reaches the cap, so dropping it from sim/batch.py's join loop passed every sim test."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import lone_decode_owner

from kvplan.sim.api import run
from kvplan.sim.scenario import scenario_from_dict


def _one_turn_requests(n: int, rate_per_s: float) -> dict:
    """``n`` one-turn requests of 510 prompt / 200 output tokens at ``rate_per_s`` on 1P1D with max_num_seqs 2."""
    return {
        "deployment": {"prefill_nodes": 1, "decode_nodes": 1, "max_num_seqs": 2},
        "policy": {"bidirectional": False},
        "workload": {"conversations": n, "arrival": {"kind": "poisson", "rate_per_s": rate_per_s},
                     "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 500},
                     "user_tokens": {"dist": "constant", "value": 10}, "output_tokens": {"dist": "constant", "value": 200}},
        "seed": 3,
    }


def test_decode_batch_never_exceeds_max_num_seqs() -> None:
    t = run(scenario_from_dict(_one_turn_requests(6, 100.0))).turns
    first, fin = t["ttft_s"].to_numpy() + t["arrival_s"].to_numpy(), t["finish_s"].to_numpy()
    assert np.isfinite(fin).all()
    # sequences decoding at each first-token instant (a turn is in the batch from its first token to its last)
    live = [int(((first <= s) & (fin > s)).sum()) for s in first]
    assert max(live) == 2  # the cap is reached (without it all six would overlap: decodes last ~1 s)
    assert fin.max() - first.min() > 2.5 * (fin - first).mean()  # three waves of two, not one of six


def test_a_full_decode_batch_starts_no_allocation_or_p2d_read() -> None:
    """vLLM stops its waiting loop at a full running batch *before* a request's remote-KV load is started (a request
    still loading is not running), so D admits (allocates blocks, starts the P->D read of) a request only while
    fewer than ``max_num_seqs`` sequences decode: arrivals 0.2 s apart meet a batch of two ~1 s decodes."""
    t = run(scenario_from_dict(_one_turn_requests(8, 5.0))).turns
    admit = (t["arrival_s"] + t["overhead_s"] + t["prefill_queue_s"] + t["kv_pull_s"] + t["prefill_s"]
             + t["d_queue_s"]).to_numpy()
    first, fin = t["ttft_s"].to_numpy() + t["arrival_s"].to_numpy(), t["finish_s"].to_numpy()
    assert np.isfinite(admit).all() and np.isfinite(fin).all()
    # sequences in D's batch (first token to last) at each admission instant, the admitted one excluded
    in_batch = [int(((first <= a + 1e-9) & (fin > a + 1e-9)).sum()) for a in admit]
    assert max(in_batch) <= 1  # never admitted beside a full batch of two
    assert (t["d_queue_s"] > 0.1).sum() >= 2  # and some did wait for a finish (the check decided something)


def _join_after_preemption(preempt_once_after_s: float | None) -> dict[int, float]:
    """Finish times of two one-step-cost requests on a lone DecodeBatch: A from t=0, B ready at 0.105 s; the
    owner reports a preemption at the first step boundary after ``preempt_once_after_s`` (None: never)."""
    from kvplan.models.costs import DecodeCost
    from kvplan.sim.batch import DecodeBatch
    from kvplan.sim.clock import SimEnv, call_later
    from kvplan.sim.evlog import RowBuffer
    from kvplan.sim.request import Request

    env = SimEnv()
    done: dict[int, float] = {}
    state = {"preempted": False}

    def fit(step: int) -> bool:
        if preempt_once_after_s is not None and not state["preempted"] and env.now > preempt_once_after_s:
            state["preempted"] = True
            return True
        return False

    owner = lone_decode_owner(lambda r: done.__setitem__(r.conv, env.now), fit)
    batch = DecodeBatch(env, RowBuffer(), 0, DecodeCost(fixed_s=0.01), 64, False, 16, owner)
    batch.ready(Request(0, 0, 0, 100, 100, None), 100, 0)
    call_later(env, 0.105, lambda _e: batch.ready(Request(1, 0, 0, 100, 100, None), 100, 0))
    env.run()
    return done


def test_no_request_joins_d_batch_in_a_step_that_preempted() -> None:
    """vLLM's scheduler admits no waiting request in a step in which it preempted (``if preempted_reqs`` ... the
    waiting loop is skipped, vllm/v1/core/sched/scheduler.py): B, ready at 0.105 s, joins at the 0.11 s boundary
    normally, and one step later (0.12 s) when that boundary preempted."""
    plain = _join_after_preemption(None)
    assert plain[1] - plain[0] == pytest.approx(0.11 - 0.0, abs=1e-9)  # B joined at 0.11: finishes 0.11 after A
    late = _join_after_preemption(0.105)
    assert late[1] - plain[1] == pytest.approx(0.01, abs=1e-9)  # joined one step later
