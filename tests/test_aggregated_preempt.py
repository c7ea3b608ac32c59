"""Aggregated serving's KV blocks: per-step growth and recompute preemption of the newest running request.

vLLM ``vllm/v1/core/sched/scheduler.py`` ``schedule`` / ``kv_cache_manager.allocate_slots``: a waiting request
needs only the blocks of its prompt; running requests grow one block per ``block_size`` tokens; under pressure
``self.running.pop()`` (the newest) is preempted and later recomputes prompt + sampled tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from conftest import small

from kvplan.sim.api import run
from kvplan.sim.engine import simulate
from kvplan.sim.events import Ev
from kvplan.sim.scenario import scenario_from_dict

PROMPT, OUTPUT = 2000, 6000


def _pressure(pool_tokens: int, n: int = 24, output: int = OUTPUT) -> dict[str, Any]:
    """``n`` single-turn requests of 2k prompt / 6k output arriving together on one replica."""
    wl = {
        "conversations": n, "arrival": {"kind": "closed_loop", "clients": n, "max_active_conversations": n},
        "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": PROMPT},
        "user_tokens": {"dist": "constant", "value": 0}, "output_tokens": {"dist": "constant", "value": output},
    }
    dep = {
        "mode": "aggregated", "replicas": 1, "decode_kv_capacity_tokens": pool_tokens, "max_num_seqs": 64,
        "prefill_prefix_caching": True, "max_num_batched_tokens": 65536,
    }
    return small(workload=wl, deployment=dep, policy={"bidirectional": False})


def _max_concurrent(ev: Any) -> int:
    """Most requests holding blocks at once: admissions (first or after a preemption) minus finishes/preemptions."""
    step = {int(Ev.P_COMPUTE): 1, int(Ev.D_RECOMPUTE): 1, int(Ev.D_FINISH): -1, int(Ev.D_PREEMPT): -1}
    e = ev[ev["kind"].isin(list(step))]
    return int(e["kind"].map(step).cumsum().max())


def test_per_step_growth_admits_more_than_the_reservation() -> None:
    # pool 40,000 tokens = 2,500 blocks of 16. Reserving prompt + output (8,000 tokens = 500 blocks) at admission
    # would run 2,500 // 500 = 5 at once; admitting on the prompt's 125 blocks runs 2,500 // 125 = 20 (the whole
    # step budget of 65,536 tokens takes 20 prompts of 2,000 in the first step)
    sc = scenario_from_dict(_pressure(40_000))
    _rs, _plan, ctx = simulate(sc)
    assert ctx.block_size == 16 and ctx.decode_capacity_blocks == 2500
    node = ctx.replicas[0]
    assert node.pool.min_free >= 0
    r = run(_pressure(40_000))
    assert _max_concurrent(r.events) == 20
    # 20 growing requests do not fit at 500 blocks each: the 5 oldest (5 x 500 = 2,500) are never preempted
    t = r.turns.sort_values("conversation_id")
    first = r.events[r.events["kind"] == int(Ev.P_COMPUTE)].sort_values("t_s", kind="stable")["conv"].to_numpy()
    pre = t.set_index("conversation_id")["d_preemptions"]
    assert (pre.loc[first[:5]] == 0).all() and pre.sum() > 0
    # a pool holding every request in full admits all 24 and preempts nobody
    big = run(_pressure(24 * 8000 + 16))
    assert _max_concurrent(big.events) == 24 and big.summary["d_preemptions"] == 0


def test_preemption_takes_the_newest_and_conserves_tokens() -> None:
    r = run(_pressure(40_000))
    ev, t = r.events, r.turns
    # replay vLLM's ``self.running`` order from the log: every preempted request is its last element
    kinds = {int(Ev.P_COMPUTE), int(Ev.D_RECOMPUTE), int(Ev.D_PREEMPT), int(Ev.D_FINISH)}
    running: list[int] = []
    preempted = 0
    for kind, conv in zip(ev["kind"].to_numpy(), ev["conv"].to_numpy(), strict=True):
        if int(kind) not in kinds:
            continue
        if kind in (int(Ev.P_COMPUTE), int(Ev.D_RECOMPUTE)):
            running.append(int(conv))
            continue
        if kind == int(Ev.D_PREEMPT):
            assert running[-1] == int(conv)
            preempted += 1
        running.remove(int(conv))
    assert preempted > 0 and not running
    pre = ev[ev["kind"] == int(Ev.D_PREEMPT)].reset_index(drop=True)
    assert r.summary["d_preemptions"] == len(pre) == t["d_preemptions"].sum()
    # each readmission recomputes what it had (prompt + sampled tokens) minus the prefix that survived in the cache
    rec = ev[ev["kind"] == int(Ev.D_RECOMPUTE)].reset_index(drop=True)
    assert r.summary["d_preempted_recompute_tokens"] == rec["a"].sum() > 0
    for conv, p in pre.groupby("conv"):
        rc = rec[rec["conv"] == conv]
        assert len(rc) == len(p)
        np.testing.assert_array_equal(rc["a"].to_numpy() + rc["b"].to_numpy(), PROMPT + p["a"].to_numpy())
    # every request still streams all its tokens once; token and TTFT identities hold
    fin = ev[ev["kind"] == int(Ev.D_FINISH)]
    assert len(fin) == 24 and (fin["a"] == OUTPUT).all() and fin["conv"].is_unique
    assert (t["prompt_tokens"] == t["local_hit_tokens"] + t["recomputed_tokens"]).all()
    parts = t["overhead_s"] + t["prefill_queue_s"] + t["kv_pull_s"] + t["prefill_s"] + t["d_queue_s"]
    parts = parts + t["p2d_transfer_s"] + t["first_decode_s"]
    np.testing.assert_allclose(t["ttft_s"], parts, rtol=0, atol=1e-9)
    assert (t["finish_s"] > t["arrival_s"] + t["ttft_s"]).all()
    # a request preempted before its first token gets its TTFT at the end of the prefill that samples it
    before_first = pre[pre["a"] == 0]["conv"].unique()
    first_t = ev[ev["kind"] == int(Ev.D_FIRST)].set_index("conv")["t_s"]
    for conv in before_first:
        assert first_t.loc[conv] > pre[pre["conv"] == conv]["t_s"].min()
    assert (t["itl_max_s"] >= t["itl_p50_s"]).all()
    # reproducible
    again = run(_pressure(40_000))
    assert again.turns.equals(r.turns)


def test_used_peak_of_an_aggregated_replica_is_reported() -> None:
    # the replica's pool fills under preemption pressure (2,500 blocks for 20 growing requests); with a pool that
    # holds all 24 in full, the peak is their 24 x 500 blocks of 8,000 tokens (the last sampled token has no KV:
    # ceil(7,999 / 16) = 500) over the pool
    tight = run(_pressure(40_000)).summary["decode_kv_used_peak_fraction"]
    assert tight is not None and 0.95 <= tight <= 1.0
    roomy = run(_pressure(400_000)).summary["decode_kv_used_peak_fraction"]
    assert roomy == 24 * 500 / (400_000 // 16)
