"""Inter-token gaps (sim/itl.py): the persistent histogram against NumPy, and ITL in simulated runs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from kvplan.sim.api import run
from kvplan.sim.itl import NO_SKIP, ItlTracker, TNode, bucket_key, bucket_value, stay_stats, turn_stats
from kvplan.sim.scenario import Scenario

REL = 0.0101  # two buckets' relative width: a bucket representative is within ALPHA (0.5 %) of its values


def _series(rng: np.random.Generator) -> tuple[float, float, int]:
    return float(rng.uniform(0.005, 0.5)), float(rng.choice([0.0, rng.uniform(0, 1e-3)])), int(rng.integers(1, 40))


@pytest.mark.parametrize("seed", range(40))
def test_stay_and_turn_stats_match_numpy(seed: int) -> None:
    """Median and maximum of a request's gaps from version differences equal NumPy's on the expanded gaps."""
    rng = np.random.default_rng(seed)
    itl = ItlTracker()
    for _ in range(20):  # history before the request joined
        f, inc, n = _series(rng)
        itl.add(f, inc, n, 1, bucket_key(f))
    old = itl.snapshot()
    gaps: list[float] = []
    first = True
    for _ in range(int(rng.integers(1, 12))):
        f, inc, n = _series(rng)
        itl.add(f, inc, n, 1, bucket_key(f))
        steps = [f + inc * i for i in range(n)]
        gaps += steps[1:] if first else steps
        if first:
            skip = bucket_key(f)
            first = False
    if not gaps:
        assert math.isnan(stay_stats(old, itl.current(), skip)[0])
        return
    med, top = stay_stats(old, itl.current(), skip)
    assert itl.stats_since(old, skip) == (med, top)  # the tracker's own reading (D's finish)
    assert med == pytest.approx(float(np.median(gaps)), rel=REL)
    assert top == pytest.approx(max(gaps), rel=REL)
    # the same through the general path, with two extra gaps around a preemption
    extra = [0.9, 0.0123]
    med2, top2 = turn_stats([(old, itl.current(), skip)], [bucket_key(x) for x in extra])
    assert med2 == pytest.approx(float(np.median(gaps + extra)), rel=REL)
    assert top2 == pytest.approx(max(gaps + extra), rel=REL)
    # the general path agrees with the one-stay fast path
    assert turn_stats([(old, itl.current(), skip)], []) == pytest.approx((med, top), rel=1e-12)


@pytest.mark.parametrize("seed", range(30))
def test_native_tree_answers_as_the_list_tree(seed: int) -> None:
    """The compiled build's TNode versions (ItlTracker(native=True)) and the interpreted build's list versions give
    the same medians, maxima and pooled counts, bit for bit, over random step series (one bucket or crossing
    buckets, clamped ends), stays kept from random versions (snapshots; the insertions between them update the
    TNode version in place), skips, several spans and extra gaps."""
    rng = np.random.default_rng(seed)
    trackers = (ItlTracker(native=True), ItlTracker(native=False))
    assert isinstance(trackers[0].current(), TNode) and isinstance(trackers[1].current(), list)
    versions: list[tuple[object, object]] = [(None, None)]
    for _ in range(int(rng.integers(5, 60))):
        kind = rng.random()
        if kind < 0.05:
            f = float(rng.choice([0.0, 1e-9, 1e5]))  # clamped to the first or last bucket
        else:
            f = float(rng.uniform(0.001, 2.0))
        inc = float(rng.choice([0.0, rng.uniform(0, 0.05), rng.uniform(0, 1e-4)]))
        n, w = int(rng.integers(1, 300)), int(rng.integers(1, 9))
        for t in trackers:
            t.add(f, inc, n, w, bucket_key(f))
        if rng.random() < 0.3:
            k = bucket_key(f)
            for t in trackers:
                t.unpool(k, 1)
        if rng.random() < 0.5:  # kept versions (others are updated in place by the next insertions)
            versions.append((trackers[0].snapshot(), trackers[1].snapshot()))
    assert trackers[0].pooled_counts() == trackers[1].pooled_counts()
    versions.append((trackers[0].current(), trackers[1].current()))  # read at once below
    for _ in range(40):
        i, j = sorted(int(x) for x in rng.integers(0, len(versions), 2))
        skip = int(rng.choice([NO_SKIP, bucket_key(float(rng.uniform(0.001, 2.0)))]))
        nat = stay_stats(versions[i][0], versions[j][0], skip)
        lst = stay_stats(versions[i][1], versions[j][1], skip)
        assert np.array_equal(np.array(nat), np.array(lst), equal_nan=True)
        cuts = sorted(int(x) for x in rng.integers(0, len(versions), 4))
        extra = [bucket_key(float(x)) for x in rng.uniform(0.001, 5.0, int(rng.integers(0, 3)))]
        spans = [((cuts[0], cuts[1]), skip), ((cuts[2], cuts[3]), NO_SKIP)]
        got = [turn_stats([(versions[a][m], versions[b][m], sk) for (a, b), sk in spans], extra) for m in (0, 1)]
        assert np.array_equal(np.array(got[0]), np.array(got[1]), equal_nan=True)


def test_pooled_counts_weight_steps_by_members() -> None:
    """Pooled gaps: every step counts once per member, less the joiners' first step."""
    itl = ItlTracker()
    k = bucket_key(0.02)
    itl.add(0.02, 0.0, 10, 3, k)
    itl.unpool(k, 2)
    assert itl.pooled_counts() == {k: 28}
    assert bucket_value(k) == pytest.approx(0.02, rel=0.005)
    assert stay_stats(None, itl.current(), NO_SKIP) == pytest.approx((0.02, 0.02), rel=0.005)


def _pd(**over: object) -> Scenario:
    base: dict[str, object] = {
        "model": "qwen3-32b", "hardware": "p5en",
        "deployment": {"prefill_nodes": 1, "decode_nodes": 1, "tensor_parallel_size": 8},
        "workload": {"conversations": 30, "arrival": {"kind": "poisson", "rate_per_s": 3.0},
                     "turns": {"dist": "constant", "value": 3}, "prefix_tokens": {"dist": "constant", "value": 1000},
                     "user_tokens": {"dist": "constant", "value": 100}, "output_tokens": {"dist": "constant", "value": 60},
                     "turn_gap_s": {"dist": "constant", "value": 2.0}},
        "seed": 3,
    }
    base.update(over)
    return Scenario.model_validate(base)


def test_itl_in_a_pd_run_matches_its_tpot() -> None:
    """Without stalls, a turn's gaps are its decode steps: median ~ TPOT, max >= median, summary pooled."""
    r = run(_pd())
    t = r.turns
    assert t["itl_p50_s"].notna().all()
    assert (t["itl_max_s"] >= t["itl_p50_s"] * (1 - REL)).all()
    # TPOT is the mean gap: between the smallest and the largest gap
    assert (t["tpot_s"] <= t["itl_max_s"] * (1 + REL)).all()
    assert float((t["itl_p50_s"] / t["tpot_s"]).median()) == pytest.approx(1.0, rel=0.05)
    s = r.summary
    assert s["itl_p50_s"] <= s["itl_p90_s"] <= s["itl_p99_s"]
    assert s["itl_p50_s"] == pytest.approx(float(t["itl_p50_s"].median()), rel=0.05)


def test_itl_max_shows_a_preemption_stall() -> None:
    """A request preempted on D waits for its recompute: that gap is its itl_max, far above its median."""
    sc = _pd(deployment={"prefill_nodes": 1, "decode_nodes": 1, "tensor_parallel_size": 8,
                         "decode_kv_capacity_tokens": 6000},
             workload={"conversations": 12, "arrival": {"kind": "poisson", "rate_per_s": 20.0},
                       "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 1000},
                       "user_tokens": {"dist": "constant", "value": 100},
                       "output_tokens": {"dist": "constant", "value": 400},
                       "turn_gap_s": {"dist": "constant", "value": 1.0}})
    r = run(sc)
    t = r.turns
    pre = t[t["d_preemptions"] > 0]
    assert len(pre)
    calm = t[t["d_preemptions"] == 0]
    assert (pre["itl_max_s"] > 3 * pre["itl_p50_s"]).all()
    assert float(pre["itl_max_s"].min()) > float(calm["itl_max_s"].max())


def _pull_heavy(thread_per_descriptor_s: float, prefix: int) -> Scenario:
    return _pd(
        deployment={"prefill_nodes": 1, "decode_nodes": 1, "tensor_parallel_size": 8, "prefill_prefix_caching": False},
        policy={"bidirectional": True},
        costs={"transfer": {"thread_per_descriptor_s": thread_per_descriptor_s}},
        workload={"conversations": 40, "arrival": {"kind": "poisson", "rate_per_s": 4.0},
                  "turns": {"dist": "constant", "value": 3}, "prefix_tokens": {"dist": "constant", "value": prefix},
                  "user_tokens": {"dist": "constant", "value": 100}, "output_tokens": {"dist": "constant", "value": 40},
                  "turn_gap_s": {"dist": "constant", "value": 1.0}},
    )


def test_read_posting_on_the_engine_thread_delays_other_requests() -> None:
    """P posts D->P pulls on its engine thread (vLLM ``start_load_kv``): the other requests' prefill steps wait
    for that work, and more so the more descriptors the pulls have; D's decode steps wait for P->D posts."""
    def first_turns(r: object) -> tuple[float, float]:
        t = r.turns  # type: ignore[attr-defined]
        return float(t[t["turn"] == 1]["ttft_s"].mean()), float(t["itl_max_s"].max())

    base = run(_pull_heavy(0.0, 3000))
    assert base.summary["decisions"]["pull"] > 0
    slow = run(_pull_heavy(1e-5, 3000))
    longer = run(_pull_heavy(1e-5, 6000))
    base6 = run(_pull_heavy(0.0, 6000))
    (b, b_itl), (s, s_itl) = first_turns(base), first_turns(slow)
    (l6, _), (b6, _) = first_turns(longer), first_turns(base6)
    assert s > b * 1.05  # the pulls' thread work stalls P's steps for first turns that pull nothing
    assert (l6 - b6) > (s - b)  # twice the descriptors per pull: a larger delay
    assert s_itl > b_itl  # D's steps wait for its P->D posts: longer gaps


def test_short_p2d_tail_is_computed_in_ds_mixed_step() -> None:
    """PR #55801: D recomputes a P->D tail below the threshold in the mixed step that samples its first token
    (vLLM schedules it as a prompt chunk): cheaper than pulling it, and it lengthens the other members' step."""
    from conftest import small

    from kvplan.sim.scenario import scenario_from_dict

    wl = {**small()["workload"], "user_tokens": {"dist": "constant", "value": 20},
          "output_tokens": {"dist": "constant", "value": 10}, "turn_gap_s": {"dist": "constant", "value": 1.0}}
    dep = {"max_num_seqs": 64, "prefill_prefix_caching": False, "routing": "sticky"}
    on = run(scenario_from_dict(small(workload=wl, deployment=dep)))
    off = run(scenario_from_dict(small(workload=wl, deployment=dep,
                                       policy={"bidirectional": True, "threshold_applies_to_p2d": False})))
    f_on, f_off = on.turns[on.turns["turn"] >= 2], off.turns[off.turns["turn"] >= 2]
    assert (f_on["p2d_tokens"] == 0).all() and (f_off["p2d_tokens"] > 0).all()
    # one mixed step instead of a pull + a decode step (before: a separate prefill, then a decode step: slower)
    assert f_on["ttft_s"].mean() < f_off["ttft_s"].mean()
    assert on.summary["itl_p99_s"] > off.summary["itl_p99_s"]  # the tail's chunk is in the others' step


def test_async_scheduling_adds_a_step_only_when_the_engine_is_busy() -> None:
    """vLLM async scheduling plans step N+1 while step N runs: a request arriving at P, or whose receive finishes on
    D, during a step joins one step later; on idle engines nothing changes."""
    def turns(rate: float, on: bool) -> pd.DataFrame:
        sc = _pd(deployment={"prefill_nodes": 1, "decode_nodes": 1, "tensor_parallel_size": 8,
                             "async_scheduling": on},
                 workload={"conversations": 40, "arrival": {"kind": "poisson", "rate_per_s": rate},
                           "turns": {"dist": "constant", "value": 1},
                           "prefix_tokens": {"dist": "constant", "value": 3000},
                           "user_tokens": {"dist": "constant", "value": 0},
                           "output_tokens": {"dist": "constant", "value": 200},
                           "turn_gap_s": {"dist": "constant", "value": 1.0}})
        return run(sc).turns

    idle_on, idle_off = turns(0.01, True), turns(0.01, False)
    assert idle_on["ttft_s"].tolist() == idle_off["ttft_s"].tolist()  # every request finds both engines idle
    on, off = turns(8.0, True), turns(8.0, False)
    step = 0.005  # a decode step of this batch is 5-7 ms
    assert on["first_decode_s"].mean() > off["first_decode_s"].mean() + 0.5 * step  # D: one more step to join
    assert on["prefill_queue_s"].mean() > off["prefill_queue_s"].mean()  # P: arrivals wait for the next plan
