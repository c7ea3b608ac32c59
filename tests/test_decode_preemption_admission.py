"""D admits nothing in a step that preempted: the next chance is the next ``schedule()`` call (vLLM
``vllm/v1/core/sched/scheduler.py`` ``schedule``: the waiting loop runs only ``if not preempted_reqs``).

Without async scheduling that call is at the next step boundary, after the preempting step; blocks that come
back during that step (here a TTL pin expiring) admit the waiting request only at the step's end. With async
scheduling (``vllm/v1/engine/core.py`` ``step_with_batch_queue``) the next ``schedule()`` runs as the
preempting step starts, so the expiry admits at once. A preemption that empties the batch still resumes
admission (no lost wake-up).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import full_costs

from kvplan.sim.api import run
from kvplan.sim.events import Ev, Release

STEP_S = 0.01  # every decode step costs exactly this (the only non-zero cost)


def _scenario(tmp: Path, requests: list[tuple[int, int, int]], ttl_s: float, **over: Any) -> dict[str, Any]:
    """``requests`` (arrival ms, prompt, output) on 1P1D with a 2,560-token (160-block) D pool and TTL pins."""
    records = [
        {"timestamp": t, "input_length": i, "output_length": o, "hash_ids": [10 * k + b for b in range(-(-i // 512))]}
        for k, (t, i, o) in enumerate(requests)
    ]
    path = tmp / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    sc: dict[str, Any] = {
        "model": "qwen3-32b",
        "hardware": "p5en",
        "deployment": {"decode_kv_capacity_tokens": 2560, "max_num_seqs": 64, "prefill_prefix_caching": False},
        "policy": {"bidirectional": True, "decoder_kv_blocks_ttl_s": ttl_s},
        "workload": {"trace": {"path": str(path)}},
        "costs": full_costs(decode={"fixed_s": STEP_S}),
        "seed": 1,
    }
    for key, val in over.items():
        sc[key] = {**sc.get(key, {}), **val}
    return sc


def _times(ev: Any, kind: Ev, conv: int) -> list[float]:
    return ev[(ev.kind == int(kind)) & (ev.conv == conv)]["t_s"].tolist()


# X (conversation 0) finishes at once and pins 11 blocks; A and B (1, 2) decode until their growth meets the
# pin and B, the newest, is preempted; it needs its blocks back plus the one the growth took: X's 11 blocks
# are enough, so B is readmitted (``D_RECOMPUTE``) by the first admission attempt after X's pin expired.
TRIO = [(0, 160, 2), (10, 1024, 600), (20, 1024, 600)]


def _expiry_inside_the_preempting_step(tmp_path: Path, **over: Any) -> tuple[float, float, float]:
    """(preemption time, X's expiry, B's readmission) with X's deadline half a step after the preemption."""
    probe = run(_scenario(tmp_path, TRIO, 100.0, **over)).events  # X's pin outlives the preemption
    (t_pre,) = _times(probe, Ev.D_PREEMPT, 2)
    (x_done,) = _times(probe, Ev.D_FINISH, 0)
    ev = run(_scenario(tmp_path, TRIO, t_pre + STEP_S / 2 - x_done, **over)).events
    assert _times(ev, Ev.D_PREEMPT, 2)[0] == t_pre  # the same preemption: the pin is still there at it
    unpin = ev[(ev.kind == int(Ev.UNPIN)) & (ev.conv == 0)]
    assert unpin["b"].tolist() == [int(Release.EXPIRED)]
    return t_pre, float(unpin["t_s"].iloc[0]), _times(ev, Ev.D_RECOMPUTE, 2)[0]


@pytest.mark.parametrize("mode", ["fast", "exact"])
def test_blocks_freed_during_a_preempting_step_admit_at_its_end(tmp_path: Path, mode: str) -> None:
    t_pre, expiry, readmit = _expiry_inside_the_preempting_step(tmp_path, simulation={"decode_mode": mode})
    assert expiry == pytest.approx(t_pre + STEP_S / 2, abs=1e-9)  # inside the step that preempted
    assert readmit == pytest.approx(t_pre + STEP_S, abs=1e-9)  # at its end, the next schedule(), not at the expiry


def test_with_async_scheduling_the_next_schedule_runs_as_the_preempting_step_starts(tmp_path: Path) -> None:
    t_pre, expiry, readmit = _expiry_inside_the_preempting_step(tmp_path, deployment={"async_scheduling": True})
    assert t_pre < expiry == readmit < t_pre + STEP_S


def test_a_preemption_that_empties_the_batch_still_readmits(tmp_path: Path) -> None:
    """A lone request outgrows the pool beside X's pin: preempted, the batch is empty (an empty step costs
    nothing, admission resumes at once and fails), so it is readmitted when the pin expires and finishes."""
    res = run(_scenario(tmp_path, [(0, 160, 2), (10, 1024, 1530)], 100.0))
    ev = res.events
    (t_pre,) = _times(ev, Ev.D_PREEMPT, 1)
    (expiry,) = _times(ev, Ev.UNPIN, 0)
    assert t_pre < expiry
    assert _times(ev, Ev.D_RECOMPUTE, 1) == [expiry]
    assert res.turns["finish_s"].notna().all() and (res.turns["d_preemptions"] == [0, 1]).all()
