"""D's batch holds at most ``max_num_seqs`` sequences (vLLM ``vllm/v1/core/sched/scheduler.py``: the waiting loop
stops at ``len(self.running) == self.max_num_running_reqs``); the P/D matrix of tests/test_native.py never
reaches the cap, so dropping it from sim/batch.py's join loop passed every sim test."""

from __future__ import annotations

import numpy as np

from kvplan.sim.api import run
from kvplan.sim.scenario import scenario_from_dict


def test_decode_batch_never_exceeds_max_num_seqs() -> None:
    data = {
        "deployment": {"prefill_nodes": 1, "decode_nodes": 1, "max_num_seqs": 2},
        "policy": {"bidirectional": False},
        "workload": {"conversations": 6, "arrival": {"kind": "poisson", "rate_per_s": 100.0},
                     "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 500},
                     "user_tokens": {"dist": "constant", "value": 10}, "output_tokens": {"dist": "constant", "value": 200}},
        "seed": 3,
    }
    t = run(scenario_from_dict(data)).turns
    first, fin = t["ttft_s"].to_numpy() + t["arrival_s"].to_numpy(), t["finish_s"].to_numpy()
    assert np.isfinite(fin).all()
    # sequences decoding at each first-token instant (a turn is in the batch from its first token to its last)
    live = [int(((first <= s) & (fin > s)).sum()) for s in first]
    assert max(live) == 2  # the cap is reached (without it all six would overlap: decodes last ~1 s)
    assert fin.max() - first.min() > 2.5 * (fin - first).mean()  # three waves of two, not one of six
