"""Decode/prefill memory fidelity (issue 10): block pool invariants, growth and preemption, P leases, NICs, TP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from conftest import full_costs, rerun_pure, small

from kvplan.sim.api import run
from kvplan.sim.engine import simulate
from kvplan.sim.events import Ev, HoldRelease
from kvplan.sim.scenario import scenario_from_dict


def _sim(sc: dict[str, Any]) -> Any:
    _rs, _plan, ctx = simulate(scenario_from_dict(sc))
    return ctx


def test_block_pool_never_negative_and_drains() -> None:
    """free >= 0 after every allocation; at the end nothing is held or pinned, every block is free or cached."""
    for dep in ({"decode_kv_capacity_tokens": 30_000, "max_num_seqs": 16}, {"decode_nodes": 2}):
        ctx = _sim(small(deployment={"prefill_prefix_caching": False, **dep}))
        for dn in ctx.decode:
            pool = dn.pool
            assert pool.min_free >= 0
            assert pool.held == 0 and pool.pinned == 0
            assert pool.cached == sum(b for _, b in pool.cache.values())
            assert pool.free() + pool.cached == pool.capacity
            assert not dn.retention.pins


def _pressure(pool_tokens: int, mode: str = "fast", watermark: float = 0.0, **over: Any) -> dict[str, Any]:
    """Acceptance 1's workload: 1,024-token prompts, outputs of 4 x the prompt, D pool of ``pool_tokens``."""
    wl = {
        "conversations": 40, "arrival": {"kind": "closed_loop", "clients": 40, "max_active_conversations": 40},
        "turns": {"dist": "constant", "value": 1},
        "prefix_tokens": {"dist": "constant", "value": 1024}, "user_tokens": {"dist": "constant", "value": 0},
        "output_tokens": {"dist": "constant", "value": 4096},
    }
    dep = {
        "decode_kv_capacity_tokens": pool_tokens, "max_num_seqs": 64, "prefill_prefix_caching": False,
        "max_num_batched_tokens": 65536, "kv_watermark": watermark,
    }
    return small(workload=wl, deployment=dep, policy={"bidirectional": False}, simulation={"decode_mode": mode}, **over)


def _max_concurrent(ev: Any, kind_in: Ev, kind_out: Ev) -> int:
    e = ev[ev["kind"].isin([int(kind_in), int(kind_out)])].sort_values("t_s", kind="stable")
    return int((e["kind"].map({int(kind_in): 1, int(kind_out): -1})).cumsum().max())


def test_per_step_growth_admits_more_and_preempts_newest() -> None:
    """Acceptance 1: admission needs only the prompt, so 10 prompts' worth of pool decodes 10 at once (reserving
    prompt + output would fit 2); growth then preempts, every preempted request still finishes with its tokens."""
    r = run(_pressure(10 * 1024))
    ev, t = r.events, r.turns
    assert _max_concurrent(ev, Ev.D_ADMIT, Ev.D_FINISH) == 10
    pre = ev[ev["kind"] == int(Ev.D_PREEMPT)]
    assert r.summary["d_preemptions"] == len(pre) > 0
    assert r.summary["d_preempted_recompute_tokens"] > 0
    assert t["d_preemptions"].sum() == len(pre)
    assert (t["finish_s"].notna()).all() and len(t) == 40
    fin = ev[ev["kind"] == int(Ev.D_FINISH)].set_index("conv")["a"]
    assert (fin == 4096).all()
    # conservation: each readmission recomputes exactly the tokens it had (prompt + sampled) minus what survived
    rec = ev[ev["kind"] == int(Ev.D_RECOMPUTE)].reset_index(drop=True)
    pre = pre.reset_index(drop=True)
    for conv, p in pre.groupby("conv"):
        rc = rec[rec["conv"] == conv]
        assert len(rc) == len(p)
        np.testing.assert_array_equal(rc["a"].to_numpy() + rc["b"].to_numpy(), 1024 + p["a"].to_numpy())
    # the newest running request is the one preempted: nobody admitted earlier is preempted while a later one runs
    assert (pre["a"] < 4096).all()
    big = run(_pressure(1_000_000))
    assert big.summary["d_preemptions"] == 0 and big.turns["d_preemptions"].sum() == 0


def test_fast_and_exact_agree_with_preemption() -> None:
    """Acceptance 5: the closed-form jumps stop where the pool runs out and give the exact per-step times."""
    for pool, caching in ((10 * 1024, True), (7 * 1024 + 100, False)):
        dep = {"decode_prefix_caching": caching}
        fast = run(_pressure(pool))
        exact = run(_pressure(pool, "exact"))
        assert fast.summary["d_preemptions"] == exact.summary["d_preemptions"] > 0, dep
        for col in ("ttft_s", "finish_s", "first_decode_s", "d_queue_s"):
            np.testing.assert_allclose(fast.turns[col], exact.turns[col], rtol=0, atol=1e-7)
        assert (fast.turns["d_preemptions"] == exact.turns["d_preemptions"]).all()
        ctx = _sim(_pressure(pool, "exact"))
        assert ctx.decode[0].pool.min_free >= 0


def test_p_holds_prompt_until_d_reads_it() -> None:
    """Acceptance 2 (unsaturated D): P holds each prompt from its prefill to D's read, no longer."""
    r = run(small(deployment={"max_num_seqs": 64, "prefill_prefix_caching": True}))
    ev, t = r.events, r.turns
    hold = ev[ev["kind"] == int(Ev.P_DONE)].set_index(["conv", "turn"])  # P holds from its prefill's end
    unhold = ev[ev["kind"] == int(Ev.P_UNHOLD)].set_index(["conv", "turn"])
    p_done = hold["t_s"]
    p2d = ev[ev["kind"] == int(Ev.P2D_DONE)].set_index(["conv", "turn"])["t_s"]
    ok = t[t["decision"] != "error"]
    assert len(hold) == len(unhold) == len(ok)
    # P_DONE carries the held bytes: whole blocks of the prompt at P's TP, all ranks
    blocks = -(-ok.set_index(["conversation_id", "turn"])["prompt_tokens"] // 16)
    np.testing.assert_array_equal(hold["b"].sort_index().to_numpy(), blocks.sort_index().to_numpy() * 16 * 262_144)
    np.testing.assert_array_equal(unhold["a"].sort_index().to_numpy(), blocks.sort_index().to_numpy() * 16)
    admit = ev[ev["kind"] == int(Ev.D_ADMIT)].set_index(["conv", "turn"])["t_s"]
    read = unhold[unhold["b"] == int(HoldRelease.READ)]
    notified = unhold[unhold["b"] == int(HoldRelease.NOTIFIED)]  # D recomputed a tail below the threshold
    assert len(read) + len(notified) == len(unhold) and len(notified) > 0
    np.testing.assert_allclose(read["t_s"].sort_index(), p2d.sort_index())
    np.testing.assert_allclose(notified["t_s"].sort_index(), admit.loc[notified.index].sort_index())
    assert r.summary["p_lease_expiries"] == 0
    # about one prompt per request between P's finish and D's read: held KV never exceeds a few prompts
    per_token = r.summary["kv_bytes_per_token_all_ranks"] / 2**30
    assert 0 < r.summary["p_held_kv_gib_peak"] <= 3 * t["prompt_tokens"].max() * per_token
    assert r.summary["p_held_kv_gib_mean"] < t["prompt_tokens"].mean() * per_token
    series = r.held_series()
    assert series["held_gib"].max() == pytest.approx(r.summary["p_held_kv_gib_peak"])
    assert series["held_gib"].iloc[-1] == pytest.approx(0.0, abs=1e-9) and series["held_tokens"].iloc[-1] == 0
    end = pd.concat([p2d, admit.loc[notified.index]]).sort_index()
    np.testing.assert_allclose(t.loc[ok.index, "p_hold_s"], (end - p_done.sort_index()).to_numpy())
    ctx = _sim(small(deployment={"max_num_seqs": 64, "prefill_prefix_caching": True}))
    for pn in ctx.prefill:
        assert pn.pool.min_free >= 0 and pn.pool.pinned == 0 and pn.pool.held == 0


def test_saturated_d_fills_p_with_held_prompts() -> None:
    """Acceptance 2 (saturated D): retention fills D, requests wait on D, and P's pool fills with held prompts
    until P stops admitting (held KV reaches P's capacity)."""
    p_cap = 40_000
    sc = small(
        deployment={"decode_kv_capacity_tokens": 60_000, "prefill_kv_capacity_tokens": p_cap, "max_num_seqs": 64},
        policy={"decoder_kv_blocks_ttl_s": 900},
        workload={**small()["workload"], "arrival": {"kind": "poisson", "rate_per_s": 2.0}, "conversations": 80},
    )
    r = run(sc)
    per_token = r.summary["kv_bytes_per_token_all_ranks"] / 2**30
    assert r.summary["p_held_kv_gib_peak"] >= 0.85 * p_cap * per_token
    assert r.summary["p_held_kv_gib_peak"] <= p_cap * per_token + 1e-9
    assert r.turns["prefill_queue_s"].max() > 60  # P admission waited for D's reads
    ctx = _sim(sc)
    assert ctx.prefill[0].pool.min_free >= 0


def test_lapsed_lease_frees_p_and_d_recomputes() -> None:
    """A lease whose first heartbeat comes too late lapses: P frees the prompt, D's read fails and D recomputes."""
    sc = small(costs={"overhead": {"p_leg_s": 0.0, "d_leg_s": 31.0}})
    r = run(sc)
    ev, t = r.events, r.turns
    ok = t[t["decision"] != "error"]
    assert r.summary["p_lease_expiries"] == len(ok) == r.summary["p2d_failed_reads"]
    assert (t["p2d_bytes"] == 0).all()
    un = ev[ev["kind"] == int(Ev.P_UNHOLD)].set_index(["conv", "turn"])["t_s"].sort_index()
    done = ev[ev["kind"] == int(Ev.P_DONE)].set_index(["conv", "turn"])["t_s"].sort_index()
    np.testing.assert_allclose(un - done, 30.0)
    assert (ok["finish_s"] > 0).all()
    # a 20 s D leg: the first heartbeat (every 5 s) comes before the 30 s deadline, nothing lapses
    r2 = run(small(costs={"overhead": {"p_leg_s": 0.0, "d_leg_s": 20.0}}))
    assert r2.summary["p_lease_expiries"] == 0


def test_mooncake_1p1d_retention_fills_p(shared_dir: Path) -> None:
    """Acceptance 2 on the real trace: D saturated by 480 s retention -> P's held KV rises to P's capacity.

    Leases do not lapse: D heartbeats every request from the moment it enters D's scheduler, waiting or not
    (docs/design/nixl_kv_cache_lease.md), so ``p_lease_expiries`` stays 0 with a healthy D.
    """
    trace = shared_dir / "external_traces" / "mooncake_fast25" / "conversation_trace.jsonl"
    r = run(scenario_from_dict({"workload": {"trace": {"path": str(trace)}}}))
    s = r.summary
    cap_gib = s["decode_kv_capacity_gib"]  # P and D are the same kind of node: the same pool size
    assert s["p_held_kv_gib_peak"] >= 0.99 * cap_gib
    assert s["p_held_kv_gib_mean"] >= 0.8 * cap_gib
    assert s["p_lease_expiries"] == 0


def test_eviction_is_tail_first() -> None:
    """kv_cache_manager.free frees in reverse: evicting part of the oldest entry leaves its prefix cached."""
    from kvplan.sim.blocks import BlockPool

    pool = BlockPool(10, 16, caching=True)
    pool.held = 4
    pool.to_cache(1, 3 * 16 + 5)  # 3 full blocks cached, the partial one freed
    pool.to_cache(2, 2 * 16)
    assert pool.cached == 5 and pool.free() == 1
    pool.evict(3)  # 2 more blocks: the tail of conversation 1
    assert pool.cache[1] == (16, 1) and pool.cache[2] == (32, 2) and pool.free() == 3
    assert list(pool.cache) == [1, 2]
    pool.evict(5)  # the rest of 1 and the tail of 2
    assert 1 not in pool.cache and pool.cache[2] == (16, 1) and pool.free() == 5
    pool.evict(100)
    assert not pool.cache and pool.cached == 0 and pool.free() == 6


@pytest.mark.parametrize("dep,ttl", [
    ({"decode_kv_capacity_tokens": 20_000, "max_num_seqs": 32, "prefill_prefix_caching": True}, 60),
    # pins expiring while the batch grows into a full cache; a small P pool; P TP4 reads
    ({"decode_kv_capacity_tokens": 30_000, "max_num_seqs": 8, "prefill_tensor_parallel_size": 4,
      "prefill_kv_capacity_tokens": 20_000}, 100),
    ({"decode_kv_capacity_tokens": 25_000, "max_num_seqs": 16, "prefill_nodes": 2, "decode_nodes": 2,
      "prefill_prefix_caching": True}, 40),
])
def test_fast_and_exact_agree_with_retention_and_preemption(dep: dict[str, Any], ttl: float) -> None:
    """Acceptance 5 with pins, prefix cache (tail-first eviction), P leases and multi-turn pulls together."""
    sc = small(deployment=dep, policy={"decoder_kv_blocks_ttl_s": ttl}, seed=1)
    fast, exact = run(sc), run({**sc, "simulation": {"decode_mode": "exact"}})
    assert fast.summary["d_preemptions"] == exact.summary["d_preemptions"] > 0
    for col in ("ttft_s", "finish_s", "first_decode_s", "d_queue_s", "p_hold_s", "d_hit_tokens"):
        np.testing.assert_allclose(fast.turns[col], exact.turns[col], rtol=0, atol=1e-7)
    assert (fast.turns["decision"] == exact.turns["decision"]).all()


def test_threshold_applies_to_p2d_by_default_with_bidirectional() -> None:
    """vLLM PR #55801: with bidirectional on, P->D tails below kv_recompute_threshold are recomputed on D."""
    from kvplan.sim.context import Ctx

    assert scenario_from_dict(small()).policy.threshold_applies_to_p2d is None
    wl = {**small()["workload"], "user_tokens": {"dist": "constant", "value": 20},
          "output_tokens": {"dist": "constant", "value": 10}, "turn_gap_s": {"dist": "constant", "value": 1.0}}
    dep = {"max_num_seqs": 64, "prefill_prefix_caching": False, "routing": "sticky"}
    on = run(small(workload=wl, deployment=dep))
    off = run(small(workload=wl, deployment=dep, policy={"bidirectional": True, "threshold_applies_to_p2d": False}))
    follow_on, follow_off = on.turns[on.turns["turn"] >= 2], off.turns[off.turns["turn"] >= 2]
    assert (follow_off["p2d_tokens"] > 0).all() and (follow_off["p2d_tokens"] < 64).all()
    assert (follow_on["p2d_tokens"] == 0).all()
    ctx = _sim(small(policy={"bidirectional": False}))
    assert isinstance(ctx, Ctx) and ctx.threshold_applies_to_p2d is False


def _nic_run(pairs: list[tuple[int, int]], nbytes: float, per_byte_s: float) -> list[float]:
    """Start one P->D read per (P, D) pair at t=0 through a fabric; their bandwidth-phase durations."""
    from kvplan.sim.clock import SimEnv
    from kvplan.sim.context import Ctx
    from kvplan.sim.link import Fabric, Link

    env = SimEnv()
    fabric = Fabric()
    links: dict[tuple[int, int], Link] = {}
    out: list[float] = [0.0] * len(pairs)
    for i, (p, d) in enumerate(pairs):
        if (p, d) not in links:
            links[(p, d)] = Link(env, per_byte_s, (Ctx.nic("p", p, False), Ctx.nic("d", d, True)), fabric)

        def record(s: float, i: int = i) -> None:
            out[i] = s

        links[(p, d)].send(i, nbytes, record)
    env.run()
    return out


def test_nic_processor_sharing() -> None:
    """Acceptance 3: two D nodes pulling from one P at once take twice as long through P's egress as one alone;
    different P's into different D's do not interfere; one shared ingress with an extra flow elsewhere is max-min."""
    b, pb = 1e9, 1 / 50e9
    (alone,) = _nic_run([(0, 0)], b, pb)
    assert alone == pytest.approx(b * pb)
    two = _nic_run([(0, 0), (0, 1)], b, pb)
    assert two == pytest.approx([2 * alone, 2 * alone])
    assert _nic_run([(0, 0), (1, 1)], b, pb) == pytest.approx([alone, alone])
    # P0 egress carries P0->D0 and P0->D1; D1 ingress also takes P1->D1: each gets half while all three run
    three = _nic_run([(0, 0), (0, 1), (1, 1)], b, pb)
    assert three == pytest.approx([2 * alone] * 3)
    # two flows on one pair plus one flow to another D: P0's egress is split three ways
    assert _nic_run([(0, 0), (0, 0), (0, 1)], b, pb) == pytest.approx([3 * alone] * 3)


def test_two_decodes_share_one_prefill_nic_in_a_run() -> None:
    """End to end (2 D nodes, 1 P): simultaneous P->D reads through P's egress slow each other down."""
    wl = {"conversations": 2, "arrival": {"kind": "closed_loop", "clients": 2, "max_active_conversations": 2},
          "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 20_000},
          "user_tokens": {"dist": "constant", "value": 0}, "output_tokens": {"dist": "constant", "value": 5}}
    costs = full_costs(transfer={"per_byte_s": 1 / 5e9})  # bytes only: no fixed or per-descriptor terms
    one = run(small(workload={**wl, "conversations": 1, "arrival": {"kind": "closed_loop", "clients": 1,
                                                                     "max_active_conversations": 1}},
                    costs=costs))
    two = run(small(workload=wl, deployment={"decode_nodes": 2, "max_num_batched_tokens": 65536}, costs=costs))
    t1, t2 = one.turns["p2d_transfer_s"].iloc[0], two.turns["p2d_transfer_s"].to_numpy()
    assert two.turns["d_node"].tolist() == [0, 1]
    np.testing.assert_allclose(t2, 2 * t1, rtol=1e-9)
    util = two.summary["nic_utilization"]
    assert util["p0_egress"] > 0 and util["d0_ingress"] > 0 and util["d1_ingress"] > 0 and util["p0_ingress"] == 0


def test_heterogeneous_tp_prefill_tp2_x4_decode_tp8() -> None:
    """Acceptance 4: P TP2 x 4 nodes, D TP8 x 1 (vLLM PR #27274 rank mapping), hand-computed for Qwen3-32B:
    64 layers x 8 KV heads x 128 x bf16 x (K, V) = 262,144 B/token; 131,072 per TP2 rank, 32,768 per TP8 rank;
    128 regions (K and V per layer)."""
    from kvplan.sim.context import D2P, P2D
    from kvplan.sim.engine import resolve
    from kvplan.sim.scenario import with_overrides
    from kvplan.sim.tp import source_ranks

    dep = {"prefill_nodes": 4, "decode_nodes": 1, "tensor_parallel_size": 8, "prefill_tensor_parallel_size": 2,
           "max_num_seqs": 64, "prefill_prefix_caching": False}
    sc = small(deployment=dep)
    ctx = _sim(sc)
    p2d, d2p = ctx.plans[P2D], ctx.plans[D2P]
    # D rank i reads its one head from P rank i // 4; each P rank serves 4 D ranks
    assert [source_ranks(ctx.arch, i, 8, 2) for i in range(8)] == [[0]] * 4 + [[1]] * 4
    assert (p2d.reader_bytes_per_token, p2d.source_bytes_per_token, p2d.sources_per_reader) == (32_768, 131_072, 1)
    # P rank j reads heads 4j..4j+3 from D ranks 4j..4j+3
    assert [source_ranks(ctx.arch, j, 2, 8) for j in range(2)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert (d2p.reader_bytes_per_token, d2p.source_bytes_per_token, d2p.sources_per_reader) == (131_072, 32_768, 4)
    assert p2d.total_bytes_per_token == d2p.total_bytes_per_token == 262_144
    # each role's profile is the one resolved for its own TP
    rs_p = resolve(with_overrides(scenario_from_dict(sc), {"deployment.tensor_parallel_size": 2}))
    rs_d = resolve(with_overrides(scenario_from_dict(sc), {"deployment.tensor_parallel_size": 8}))
    assert ctx.costs == rs_p.costs and ctx.d_costs == rs_d.costs
    assert ctx.decode[0].pool.capacity == rs_d.decode_capacity_tokens // 16
    assert ctx.prefill[0].pool.capacity == rs_p.prefill_capacity_tokens // 16
    r = run(sc)
    t = r.turns
    assert sorted(t["p_node"].unique()) == [0, 1, 2, 3]
    np.testing.assert_array_equal(t["p2d_bytes"], t["p2d_tokens"] * 262_144)
    assert r.summary["prefill_profile"] == rs_p.profile.name and r.summary["decode_profile"] == rs_d.profile.name
    # one uncontended read: bandwidth through the busiest NIC (a P rank: 131,072 B/token) + descriptors
    pb, per_desc = 1 / 50e9, 1e-7
    one = {"conversations": 1, "turns": {"dist": "constant", "value": 1},
           "prefix_tokens": {"dist": "constant", "value": 10_000}, "output_tokens": {"dist": "constant", "value": 3}}
    r1 = run(small(deployment=dep, workload={**small()["workload"], **one},
                   costs=full_costs(transfer={"per_byte_s": pb, "per_descriptor_s": per_desc})))
    tok = int(r1.turns["p2d_tokens"].iloc[0])
    want = tok * 131_072 * pb + 128 * -(-tok // 16) * per_desc
    assert r1.turns["p2d_transfer_s"].iloc[0] == pytest.approx(want, rel=1e-9)


def test_heterogeneous_tp_bad_sizes_are_input_errors() -> None:
    from kvplan.errors import KvplanInputError

    with pytest.raises(KvplanInputError, match="prefill_tensor_parallel_size"):
        _sim(small(deployment={"tensor_parallel_size": 8, "prefill_tensor_parallel_size": 3}))
    with pytest.raises(KvplanInputError, match="decode_tensor_parallel_size"):
        _sim(small(deployment={"tensor_parallel_size": 8, "decode_tensor_parallel_size": 16}))


def test_preemption_takes_the_newest_running_request(
    monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    """vLLM ``self.running.pop()``: the victim is always the request that entered running last (a batch join
    of a fresh request, or the start of a preempted request's local recompute)."""
    if rerun_pure(request):  # it instruments the decode classes: pure Python only
        return
    from kvplan.sim import decode as decode_mod
    from kvplan.sim.batch import DecodeBatch

    entered: dict[int, int] = {}
    inside: set[int] = set()
    clock = [0]
    victims: list[bool] = []

    def mark(r: Any) -> None:
        key = id(r)
        if key not in inside:
            clock[0] += 1
            entered[key] = clock[0]
            inside.add(key)

    orig_add, orig_rec, orig_pre, orig_fin = (
        DecodeBatch._add, decode_mod.DecodeNode._recompute, decode_mod.DecodeNode._preempt, decode_mod.DecodeNode.finish)

    def add(self: Any, r: Any, p: int, g0: int, rem: int) -> None:
        mark(r)
        orig_add(self, r, p, g0, rem)

    def rec(self: Any, r: Any, tokens: int, hit: int) -> None:
        mark(r)
        orig_rec(self, r, tokens, hit)

    def pre(self: Any, r: Any) -> None:
        victims.append(entered[id(r)] == max(entered[k] for k in inside))
        inside.discard(id(r))
        orig_pre(self, r)

    def fin(self: Any, r: Any, now: float) -> None:
        inside.discard(id(r))
        orig_fin(self, r, now)

    monkeypatch.setattr(DecodeBatch, "_add", add)
    monkeypatch.setattr(decode_mod.DecodeNode, "_recompute", rec)
    monkeypatch.setattr(decode_mod.DecodeNode, "_preempt", pre)
    monkeypatch.setattr(decode_mod.DecodeNode, "finish", fin)
    _sim(_pressure(10 * 1024))
    assert len(victims) > 10 and all(victims)


def test_pools_too_small_for_one_request_are_input_errors() -> None:
    from kvplan.errors import KvplanInputError

    with pytest.raises(KvplanInputError, match="decode_kv_capacity_tokens"):
        _sim(_pressure(4096))  # 1,024 + 4,096 - 1 tokens cannot fit
    with pytest.raises(KvplanInputError, match="prefill_kv_capacity_tokens"):
        _sim(small(deployment={"prefill_kv_capacity_tokens": 500}))


def test_watermark_keeps_blocks_free_at_admission() -> None:
    """SchedulerConfig.watermark: waiting requests are admitted only with that share of the pool left free."""
    base = run(_pressure(10 * 1024))
    wm = run(_pressure(10 * 1024, watermark=0.25))
    assert _max_concurrent(base.events, Ev.D_ADMIT, Ev.D_FINISH) == 10
    # the first admission has nothing scheduled (no watermark); each later one must leave 160 of the 640
    # blocks free after taking its 64: 640 - 64 k >= 64 + 160 for k = 1..6, so 7 at once
    assert _max_concurrent(wm.events, Ev.D_ADMIT, Ev.D_FINISH) == 7
    assert wm.summary["d_preemptions"] < base.summary["d_preemptions"]


def test_router_keeps_no_entry_after_a_conversations_last_lookup() -> None:
    """D stores no router entry for a turn after which its conversation sends no lookup (open loop: its last
    planned turn; a trace: its request sent last), so the router's map empties as conversations end."""
    _rs, plan, ctx = simulate(scenario_from_dict(small()))
    assert int(plan.turns.sum()) > len(plan.turns) > 0 and ctx.router.entries() == 0
    trace = Path(__file__).resolve().parent / "data" / "traces" / "mooncake_small.jsonl"
    _rs, plan, ctx = simulate(scenario_from_dict(small(workload={"trace": {"path": str(trace)}})))
    assert ctx.router.entries() < len(plan.turns)


def test_block_pool_front_cut_matches_the_plain_lru() -> None:
    """BlockPool keeps the LRU entry's evicted tail aside (``_trim``): random operations give the same entries, order
    and counts as a plain OrderedDict that writes every cut into the entry."""
    import random
    from collections import OrderedDict

    from kvplan.sim.blocks import BlockPool

    rng = random.Random(7)
    for _ in range(40):
        bs = rng.choice([1, 4, 16])
        pool = BlockPool(200, bs, caching=True)
        ref: OrderedDict[int, tuple[int, int]] = OrderedDict()
        ref_cached = 0
        for _ in range(300):
            op = rng.random()
            conv = rng.randrange(12)
            if op < 0.35:
                tokens = rng.randrange(0, 40 * bs)
                pool.to_cache(conv, tokens)
                old = ref.pop(conv, None)
                if old is not None:
                    ref_cached -= old[1]
                full = (tokens // bs) * bs
                ref[conv] = (full, full // bs)
                ref_cached += full // bs
            elif op < 0.55:
                got = pool.take(conv)
                want = ref.pop(conv, None)
                if want is not None:
                    ref_cached -= want[1]
                assert got == want
                if got is not None and rng.random() < 0.5:
                    pool.put_back(conv, got)
                    ref[conv] = got
                    ref_cached += got[1]
            elif op < 0.9:
                need = rng.randrange(0, 30)
                pool.evict(need)
                deficit = need - (pool.capacity - pool.held - pool.pinned - ref_cached)
                while deficit > 0 and ref:
                    c, (t, b) = next(iter(ref.items()))
                    if b > deficit:
                        ref[c] = (t - deficit * bs, b - deficit)
                        ref_cached -= deficit
                        break
                    del ref[c]
                    ref_cached -= b
                    deficit -= b
            else:
                assert pool.entry(conv) == ref.get(conv)
            assert pool.cached == ref_cached
        assert list(pool.cache.items()) == list(ref.items())


def test_retention_deadlines_come_out_as_from_one_heap() -> None:
    """Retention files deadlines in an ordered list plus a heap for those out of order: ``due`` and the next-deadline
    queries give what one heap of every (deadline, pin id) gives, with renewals and reads (random programs)."""
    import heapq
    import random

    from kvplan.sim.retention import Retention

    rng = random.Random(11)
    for _ in range(40):
        ret = Retention(3, 2)
        heap: list[tuple[float, int]] = []
        expiry: dict[int, float] = {}
        reading: set[int] = set()
        now = 0.0
        for _ in range(400):
            op = rng.random()
            if op < 0.4:
                t = now + (60.0 if rng.random() < 0.8 else rng.choice([0.0, 1.0, 30.0, 90.0]))
                pid, _old = ret.add(rng.randrange(50), 10, 1, t)
                expiry[pid] = t
                heapq.heappush(heap, (t, pid))
            elif op < 0.5 and expiry:
                pid = rng.choice(list(expiry))
                t = now + rng.choice([5.0, 60.0])
                ret.renew(pid, t)
                expiry[pid] = t
                heapq.heappush(heap, (t, pid))
            elif op < 0.55 and expiry:
                pid = rng.choice(list(expiry))
                ret.mark_reading(pid)
                reading.add(pid)
            elif op < 0.6 and expiry:
                pid = rng.choice(list(expiry))
                ret.pop(pid)
                del expiry[pid]
            else:
                now += rng.choice([0.0, 0.5, 7.0, 40.0])
                assert ret.next_expiry() == (heap[0][0] if heap else None)
                assert ret.next_expiry_due(now) == (bool(heap) and heap[0][0] <= now)
                want = []
                while heap and heap[0][0] <= now:
                    t, pid = heapq.heappop(heap)
                    if pid in expiry and pid not in reading and expiry[pid] <= t:
                        want.append((t, pid))
                        del expiry[pid]  # released by the caller before the next entry is looked at
                got = ret.due(now)
                assert got == want
                for _t, pid in got:
                    ret.pop(pid)
