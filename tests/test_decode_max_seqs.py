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


def test_a_full_decode_batch_starts_no_allocation_or_p2d_read() -> None:
    """vLLM stops its waiting loop at a full running batch *before* a request's remote-KV load is started (a request
    still loading is not running), so D admits (allocates blocks, starts the P->D read of) a request only while
    fewer than ``max_num_seqs`` sequences decode: arrivals 0.2 s apart meet a batch of two ~1 s decodes."""
    data = {
        "deployment": {"prefill_nodes": 1, "decode_nodes": 1, "max_num_seqs": 2},
        "policy": {"bidirectional": False},
        "workload": {"conversations": 8, "arrival": {"kind": "poisson", "rate_per_s": 5.0},
                     "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 500},
                     "user_tokens": {"dist": "constant", "value": 10}, "output_tokens": {"dist": "constant", "value": 200}},
        "seed": 3,
    }
    t = run(scenario_from_dict(data)).turns
    admit = (t["arrival_s"] + t["overhead_s"] + t["prefill_queue_s"] + t["kv_pull_s"] + t["prefill_s"]
             + t["d_queue_s"]).to_numpy()
    first, fin = t["ttft_s"].to_numpy() + t["arrival_s"].to_numpy(), t["finish_s"].to_numpy()
    assert np.isfinite(admit).all() and np.isfinite(fin).all()
    # sequences in D's batch (first token to last) at each admission instant, the admitted one excluded
    in_batch = [int(((first <= a + 1e-9) & (fin > a + 1e-9)).sum()) for a in admit]
    assert max(in_batch) <= 1  # never admitted beside a full batch of two
    assert (t["d_queue_s"] > 0.1).sum() >= 2  # and some did wait for a finish (the check decided something)
