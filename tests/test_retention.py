"""Retention alternatives on D: heartbeat-renewed lease, evictable TTL pins, and the CPU offload tier."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from kvplan.errors import KvplanInputError
from kvplan.models.hardware import GBIT_BYTES
from kvplan.sim.api import run
from kvplan.sim.events import Ev, Release
from kvplan.sim.presets import preset_scenario
from kvplan.sim.scenario import Scenario, scenario_from_dict, with_overrides

LEASE = {"kind": "lease", "lease_s": 30.0, "heartbeat_s": 5.0, "idle_timeout_s": 480.0}
DEFAULTS = {"policy.bidirectional": True, "policy.decoder_kv_blocks_ttl_s": 480.0, "policy.router_ttl_s": 450.0,
            "policy.kv_recompute_threshold_tokens": 64}


@pytest.fixture(scope="module")
def chat_full() -> Scenario:
    """The chat preset at a load where vLLM's 480 s TTL fills the decode pool."""
    return with_overrides(preset_scenario("chat", "qwen3-32b", "p5en", rate_per_s=3.0, conversations=2500), DEFAULTS)


@pytest.fixture(scope="module")
def ttl_run(chat_full: Scenario) -> Any:
    return run(chat_full)


def test_lease_holds_less_hbm_and_lowers_ttft_where_ttl_fills_the_pool(chat_full: Scenario, ttl_run: Any) -> None:
    ttl = ttl_run.summary
    assert ttl["pinned_kv_gib_peak"] >= 0.97 * ttl["decode_kv_capacity_gib"]  # the TTL fills the pool
    lease = run(with_overrides(chat_full, {"policy.retention": LEASE})).summary
    assert lease["pinned_kv_gib_mean"] < 0.5 * ttl["pinned_kv_gib_mean"]  # time-weighted
    assert lease["ttft_p90_s"] < 0.1 * ttl["ttft_p90_s"]


def test_lease_hit_rate_equals_ttl_with_short_deterministic_gaps() -> None:
    sc = preset_scenario("chat", "qwen3-32b", "p5en", rate_per_s=0.5, conversations=600)
    sc = with_overrides(sc, {**DEFAULTS, "workload.turn_gap_s": {"dist": "constant", "value": 10.0}})
    ttl = run(sc).summary
    lease = run(with_overrides(sc, {"policy.retention": LEASE})).summary
    assert ttl["follow_up_turns"] > 300
    assert lease["hit_rate"] == ttl["hit_rate"]
    assert lease["pinned_kv_gib_mean"] < ttl["pinned_kv_gib_mean"]  # final turns are freed 30 s after, not 480 s


def test_lease_frees_final_turns_after_lease_s() -> None:
    sc = scenario_from_dict({
        "policy": {"retention": LEASE},
        "workload": {"conversations": 20, "arrival": {"kind": "poisson", "rate_per_s": 0.2},
                     "turns": {"dist": "constant", "value": 2}, "turn_gap_s": {"dist": "constant", "value": 1000.0}},
    })
    ev = run(sc).events
    pins = ev[ev["kind"] == int(Ev.PIN)]
    unpin = ev[ev["kind"] == int(Ev.UNPIN)]
    assert (unpin["b"] == int(Release.EXPIRED)).all() and len(unpin) == len(pins) == 40
    # gap 1000 s > idle timeout 480 s: turn 1's lease lapses 480 + 30 s after it finished; the final turn's 30 s
    for conv, p in pins.groupby("conv"):
        u = np.sort(unpin[unpin["conv"] == conv]["t_s"].to_numpy())
        held = u - np.sort(p["t_s"].to_numpy())
        assert held == pytest.approx([510.0, 30.0])
    assert run(sc).summary["hit_rate"] == 0.0  # the router saw the heartbeats stop: misses, not declined reads


def test_lease_without_known_end_holds_final_turns_until_idle_timeout() -> None:
    sc = preset_scenario("chat", "qwen3-32b", "p5en", rate_per_s=0.5, conversations=300)
    known = run(with_overrides(sc, {"policy.retention": LEASE})).events
    unknown = run(with_overrides(sc, {"policy.retention": {**LEASE, "client_knows_end": False}})).events

    def held(ev: Any) -> np.ndarray:
        pin = ev[ev["kind"] == int(Ev.PIN)].groupby("conv")["t_s"].max()
        unpin = ev[ev["kind"] == int(Ev.UNPIN)].groupby("conv")["t_s"].max()
        return (unpin - pin).to_numpy()  # the last turn's pin of every conversation

    assert held(known) == pytest.approx(30.0)
    assert held(unknown) == pytest.approx(510.0)


def test_lease_heartbeat_must_be_shorter_than_lease() -> None:
    with pytest.raises(KvplanInputError, match="heartbeat_s"):
        scenario_from_dict({"policy": {"retention": {"kind": "lease", "lease_s": 5, "heartbeat_s": 5}}})


def test_ttl_evictable_never_blocks_admission_on_pins(chat_full: Scenario, ttl_run: Any) -> None:
    ev_sc = with_overrides(chat_full, {"policy.retention": {"kind": "ttl_evictable"},
                                       "policy.kv_load_failure_policy": "recompute"})
    r = run(ev_sc)
    t, tt = r.turns, ttl_run.turns
    assert tt["d_queue_s"].quantile(0.9) > 1.0  # with plain TTL pins, admission waits behind them
    assert t["d_queue_s"].max() < 1e-9  # evictable pins never make a D admission wait
    assert r.summary["releases"]["evicted"] > 0 and r.summary["d_preemptions"] == 0
    # an evicted pin's later read is declined and recomputed (kv_load_failure_policy recompute)
    assert r.summary["decisions"]["expired"] > ttl_run.summary["decisions"]["expired"]
    assert r.summary["errors"] == 0


def _offload_pair(host_gbps: float) -> tuple[Any, Any]:
    base: dict[str, Any] = {
        "policy": {"bidirectional": True, "decoder_kv_blocks_ttl_s": 20.0, "router_ttl_s": 10**6,
                   "kv_load_failure_policy": "recompute"},
        "deployment": {"prefill_prefix_caching": False},
        "workload": {"conversations": 80, "arrival": {"kind": "poisson", "rate_per_s": 0.2},
                     "turns": {"dist": "constant", "value": 3}, "prefix_tokens": {"dist": "constant", "value": 4000},
                     "turn_gap_s": {"dist": "uniform", "low": 1.0, "high": 60.0}},
        "seed": 4,
    }
    off = run(base)
    base["policy"]["offload"] = {"host_capacity_gib": 100.0, "host_bandwidth_gbps": host_gbps}
    return off, run(base)


def test_offload_turns_expired_reads_into_host_pulls_at_host_bandwidth() -> None:
    host_gbps = 16.0
    ttl, off = _offload_pair(host_gbps)
    d_ttl, d_off = ttl.summary["decisions"], off.summary["decisions"]
    assert d_ttl["expired"] > 20 and d_ttl["host_pull"] == 0
    assert d_off["host_pull"] > 0 and d_off["expired"] + d_off["host_pull"] == d_ttl["expired"]
    t = off.turns
    host = t[t["decision"] == "host_pull"]
    gpu = t[t["decision"] == "pull"]
    tp = 8
    per_rank_bytes = host["d2p_bytes"] / tp
    floor_s = per_rank_bytes * tp / (host_gbps * GBIT_BYTES)  # the node's host bandwidth shared by its 8 ranks
    assert (host["d2p_xfer_s"] >= floor_s * (1 - 1e-9)).all()
    assert float((host["d2p_xfer_s"] / floor_s).median()) < 1.2  # alone on the link: bandwidth-bound
    # the same tokens from HBM over EFA are much faster than from host memory at 16 Gb/s
    assert (gpu["d2p_xfer_s"] / (gpu["d2p_bytes"] / tp)).median() < 0.1 * (host["d2p_xfer_s"] / per_rank_bytes).median()


def test_offload_needs_host_numbers_for_inline_hardware() -> None:
    hw = {"name": "x", "gpu": {"name": "g", "hbm_bytes": 141e9, "hbm_bandwidth_bytes_per_s": 4.8e12,
                               "bf16_dense_flops": 1e15, "fp8_dense_flops": 2e15},
          "gpus_per_node": 8, "link": {"name": "l", "bandwidth_bytes_per_s_per_rank": 5e10}}
    sc = {"hardware": hw, "profile": "p5en-qwen3-32b", "policy": {"offload": {}}, "workload": {"conversations": 2}}
    with pytest.raises(KvplanInputError, match="host_capacity_gib"):
        run(sc)


def test_non_vllm_policies_say_so_in_every_result() -> None:
    small = {"workload": {"conversations": 3}}
    assert not any("proposal" in n for n in run(small).notes)
    assert any("proposal" in n for n in run({**small, "policy": {"retention": {"kind": "ttl_evictable"}}}).notes)
    assert any("host-to-NIC" in n for n in run({**small, "policy": {"offload": {}}}).notes)


def test_request_waiting_for_a_pin_expiry_is_admitted_at_the_deadline() -> None:
    """vLLM's scheduler retries its waiting queue every engine step (``vllm/v1/core/sched/scheduler.py``
    ``schedule``; the engine steps while ``has_requests()``), so blocks freed by an expired pin admit the head
    of the queue at once. Three one-turn conversations, D's pool holds two: the third waits for the first pin's
    deadline. Its wake-up used to land one ulp before the deadline (``now + (deadline - now)`` rounds down
    here), found nothing due, and never came again: the turn was lost (NaN TTFT) when the run drained."""
    data = {
        "deployment": {"prefill_nodes": 1, "decode_nodes": 1, "max_num_seqs": 64, "prefill_prefix_caching": False,
                       "decode_prefix_caching": False, "decode_kv_capacity_tokens": 8000, "routing": "sticky"},
        "policy": {"bidirectional": True, "decoder_kv_blocks_ttl_s": 7.0, "router_ttl_s": 6.0,
                   "kv_recompute_threshold_tokens": 0},
        "workload": {"conversations": 3, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                     "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 3000},
                     "user_tokens": {"dist": "constant", "value": 100}, "output_tokens": {"dist": "constant", "value": 50}},
        # a seed whose wake-up rounds below the deadline with the shipped costs (18 did before the decode priors'
        # per-batch context slopes)
        "seed": 16,
    }
    r = run(scenario_from_dict(data))
    t, ev = r.turns, r.events
    assert np.isfinite(t["ttft_s"]).all() and np.isfinite(t["finish_s"]).all()  # no turn lost
    enq = ev[(ev["kind"] == int(Ev.D_ENQUEUE)) & (ev["conv"] == 2)]["t_s"].iloc[0]
    admit = ev[(ev["kind"] == int(Ev.D_ADMIT)) & (ev["conv"] == 2)]["t_s"].iloc[0]
    deadline = ev[(ev["kind"] == int(Ev.PIN)) & (ev["conv"] == 0)]["b"].iloc[0]
    assert enq + (deadline - enq) < deadline, "the scenario no longer exercises the rounding: pick another seed"
    assert admit == deadline  # admitted at the first pin's deadline, exactly
    unpin = ev[(ev["kind"] == int(Ev.UNPIN)) & (ev["conv"] == 0)]
    assert unpin["t_s"].iloc[0] == deadline and int(unpin["b"].iloc[0]) == int(Release.EXPIRED)
