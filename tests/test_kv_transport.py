"""deployment.kv_transport (issue 20): over UCX's TCP transport the reader's engine thread posts and moves the
KV bytes of every NIXL read, so D's decode steps stall for each P->D read; over RDMA they do not."""

from __future__ import annotations

import json

import pytest
from conftest import lone_decode_owner
from typer.testing import CliRunner

from kvplan.app.cli import app, main
from kvplan.models.costs import TCP_POST_PER_DESCRIPTOR_S, CostModel, TransferCost, read_thread_time_s, with_transport
from kvplan.sim.api import run
from kvplan.sim.engine import resolve
from kvplan.sim.scenario import Scenario


def _pd(transport: str | None, overlap: bool | None = None, **costs: object) -> Scenario:
    """A 1P1D Llama-3.1-8B TP1 run of long single-turn prompts (the llm-d shape, scaled down)."""
    dep: dict[str, object] = {"prefill_nodes": 1, "decode_nodes": 1, "tensor_parallel_size": 1}
    if transport is not None:
        dep["kv_transport"] = transport
    if overlap is not None:
        dep["kv_post_overlaps_forward"] = overlap
    data: dict[str, object] = {
        "model": "llama-3.1-8b", "hardware": "p4de", "deployment": dep, "policy": {"bidirectional": False},
        "workload": {"conversations": 40, "arrival": {"kind": "poisson", "rate_per_s": 1.5},
                     "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 6000},
                     "user_tokens": {"dist": "constant", "value": 1}, "output_tokens": {"dist": "constant", "value": 60},
                     "turn_gap_s": {"dist": "constant", "value": 1.0}},
        "seed": 1,
    }
    if costs:
        data["costs"] = {"transfer": costs}
    return Scenario.model_validate(data)


def test_read_thread_time_adds_the_bytes_a_software_transport_moves() -> None:
    """``read_thread_time_s``: post + per descriptor + per byte; the per-byte part is 0 unless set."""
    tc = TransferCost(post_fixed_s=1e-3, thread_per_descriptor_s=2e-6)
    assert read_thread_time_s(tc, 1000, 5e8) == pytest.approx(1e-3 + 2e-3)
    tcp = tc.model_copy(update={"thread_per_byte_s": 1 / 5e9})
    assert read_thread_time_s(tcp, 1000, 5e8) == pytest.approx(1e-3 + 2e-3 + 0.1)


def test_with_transport_sets_the_tcp_costs_and_keeps_inline_ones() -> None:
    """tcp: thread_per_byte_s = the link's per_byte_s, thread_per_descriptor_s = the measured TCP post (vLLM issue
    #34054: 129.127 ms over 40,064 descriptors); rdma changes nothing; inline values win."""
    base = CostModel(transfer=TransferCost(per_byte_s=1 / 6.25e9))
    notes: list[str] = []
    assert with_transport(base, "rdma", 1 / 6.25e9, set(), notes) is base and notes == []
    tcp = with_transport(base, "tcp", 1 / 6.25e9, set(), notes).transfer
    assert tcp.thread_per_byte_s == pytest.approx(1 / 6.25e9)
    assert tcp.thread_per_descriptor_s == pytest.approx(129.127e-3 / 40064) == TCP_POST_PER_DESCRIPTOR_S
    assert notes and "kv_transport tcp" in notes[0]
    kept = with_transport(base.model_copy(update={"transfer": TransferCost(thread_per_byte_s=0.0)}), "tcp", 1e-9,
                          {"thread_per_byte_s"}, []).transfer
    assert kept.thread_per_byte_s == 0.0 and kept.thread_per_descriptor_s == TCP_POST_PER_DESCRIPTOR_S


def test_resolve_uses_the_effective_link_and_rdma_is_the_default() -> None:
    """The default (rdma) resolves as before; tcp moves the bytes at the link the run uses."""
    rdma = resolve(_pd(None))
    assert rdma.costs.transfer.thread_per_byte_s == 0.0
    assert rdma.costs == resolve(_pd("rdma")).costs
    tcp = resolve(_pd("tcp"))
    assert tcp.costs.transfer.thread_per_byte_s == pytest.approx(tcp.per_byte_s) and tcp.per_byte_s > 0
    assert any("kv_transport tcp" in n for n in tcp.notes)
    assert "kv_transport" not in json.dumps(_pd(None).model_dump(exclude_defaults=True))


def test_tcp_reads_stall_decode_for_their_wire_time() -> None:
    """Over TCP each P->D read keeps D's engine thread busy for its post and wire time: the other requests' gaps
    include stalls of that length and TPOT rises; over RDMA D's gaps are its decode steps."""
    rdma, tcp = run(_pd("rdma")), run(_pd("tcp"))
    rs = resolve(_pd("tcp"))
    tokens = 6001
    desc = 64 * -(-tokens // 16)  # Llama-3.1-8B: 32 layers x K,V regions, 16-token blocks
    stall = read_thread_time_s(rs.costs.transfer, desc, tokens * 131072.0)
    assert stall > 0.15  # ~0.13 s of bytes at p4de's 6.25 GB/s per GPU + ~0.08 s of posting
    s_r, s_t = rdma.summary, tcp.summary
    assert s_r["itl_p99_s"] < 0.1 < stall * 0.9 < s_t["itl_p99_s"]  # the stalls are in the gaps, as long as a read
    assert s_t["itl_p99_s"] < stall * 1.5
    assert s_t["tpot_mean_s"] > 1.5 * s_r["tpot_mean_s"]
    assert rdma.turns["ttft_s"].mean() < tcp.turns["ttft_s"].mean()  # the first token waits for the thread too


def test_the_tcp_post_alone_stalls_decode_per_descriptor() -> None:
    """With the wire time kept off the thread (inline ``thread_per_byte_s: 0``), the measured TCP post still stalls
    D's steps, by ~3.22 us per descriptor of each read."""
    post_only = run(_pd("tcp", thread_per_byte_s=0.0))
    rdma = run(_pd("rdma"))
    desc = 64 * -(-6001 // 16)
    post = desc * TCP_POST_PER_DESCRIPTOR_S  # ~0.08 s
    assert rdma.summary["itl_p99_s"] < 0.5 * post < post * 0.9 < post_only.summary["itl_p99_s"] < post * 1.5


def test_a_post_before_the_forward_adds_a_step_to_each_stall() -> None:
    """``deployment.kv_post_overlaps_forward: false`` (the llm-d pods' vLLM, neuralmagic disagg_pd_dev @ 8beac5e:
    ``execute_model`` calls ``start_load_kv`` before it launches the forward): the step that posts a read lasts the
    posting work plus its forward, so each stall is one decode step longer than with PR #53333's overlap; the default
    is the overlap and leaves the scenario's fingerprint alone."""
    over, serial = run(_pd("tcp", True)), run(_pd("tcp", False))
    step = run(_pd("rdma")).summary["itl_p50_s"]  # a decode step of this batch
    gain = serial.summary["itl_p99_s"] - over.summary["itl_p99_s"]
    assert 0.6 * step < gain < 1.5 * step
    assert serial.summary["tpot_mean_s"] > over.summary["tpot_mean_s"]
    assert run(_pd("tcp")).summary == over.summary
    assert "kv_post_overlaps_forward" not in json.dumps(_pd("tcp", True).model_dump(exclude_defaults=True))
    with pytest.raises(ValueError, match="not true or false"):
        _pd("tcp", "no")  # type: ignore[arg-type]


def test_cost_shows_the_tcp_engine_thread_time() -> None:
    """``kvplan cost --kv-transport tcp`` prices the read's engine-thread time; rdma keeps the post only."""
    args = ["cost", "--model", "llama-3.1-8b", "--hardware", "p4de", "--tp", "1", "--tokens", "10000", "--json"]
    r = CliRunner().invoke(app, args)
    t = CliRunner().invoke(app, [*args, "--kv-transport", "tcp"])
    assert r.exit_code == 0 and t.exit_code == 0
    rd, td = json.loads(r.stdout), json.loads(t.stdout)
    assert rd["kv_transport"] == "rdma" and rd["thread_per_byte_s"] == 0.0
    wire = 10000 * 131072 * td["thread_per_byte_s"]
    assert td["read_thread_s"] == pytest.approx(rd["read_thread_s"] + 40000 * TCP_POST_PER_DESCRIPTOR_S + wire)
    assert td["kv_transfer_s"] == rd["kv_transfer_s"]  # the visible pull is priced as before

def test_cost_refuses_an_unknown_transport(capsys: pytest.CaptureFixture[str]) -> None:
    """Bad input: a one-line error naming the option, exit 2."""
    rc = main(["cost", "--model", "llama-3.1-8b", "--hardware", "p4de", "--tp", "1", "--tokens", "10",
               "--kv-transport", "udp"])
    err = capsys.readouterr().err
    assert rc == 2 and "--kv-transport" in err and "rdma or tcp" in err and "Traceback" not in err


def _decode_finish(serial: bool, works: list[float]) -> float:
    """When one request of 100 decode steps of 10 ms finishes on a lone DecodeBatch whose engine thread gets
    ``works`` posted together at 0.105 s (mid-step)."""
    from kvplan.models.costs import DecodeCost
    from kvplan.sim.batch import DecodeBatch
    from kvplan.sim.clock import SimEnv, call_later
    from kvplan.sim.evlog import RowBuffer
    from kvplan.sim.request import Request

    env = SimEnv()
    done: list[float] = []
    owner = lone_decode_owner(lambda r: done.append(env.now))
    batch = DecodeBatch(env, RowBuffer(), 0, DecodeCost(fixed_s=0.01), 64, False, 16, owner)
    batch.post_serial = serial
    batch.ready(Request(0, 0, 0, 100, 100, None), 100, 0)

    def post(_e: object) -> None:
        for w in works:
            batch.charge_thread(w)

    call_later(env, 0.105, post)
    env.run()
    return done[0]


def test_reads_posted_for_one_step_stall_it_by_their_sum() -> None:
    """vLLM's ``start_load_kv`` loops over every read of the step's connector metadata on the engine thread
    (neuralmagic disagg_pd_dev @ 8beac5e and later), so two reads admitted in the same step make one gap of both
    posts: 0.3 s each -> that step lasts 0.6 s (overlapped with its 10 ms forward, PR #53333) or 0.61 s (posted
    before the forward)."""
    base = _decode_finish(False, [])
    assert base == pytest.approx(1.0)
    assert _decode_finish(False, [0.3]) - base == pytest.approx(0.29)
    assert _decode_finish(False, [0.3, 0.3]) - base == pytest.approx(0.59)
    assert _decode_finish(True, [0.3]) - base == pytest.approx(0.30)
    assert _decode_finish(True, [0.3, 0.3]) - base == pytest.approx(0.60)
    assert _decode_finish(True, [0.005]) - base == pytest.approx(0.005)  # serial: even a short post is not hidden
    assert _decode_finish(False, [0.005]) == pytest.approx(base)  # overlapped: hidden by the forward


def _b_finish(serial: bool, exact: bool, post: str) -> float:
    """When B (100 decode steps of 10 ms) finishes on a lone DecodeBatch that also runs A (10 steps), with 0.05 s
    of engine-thread work posted at A's finish (``post="boundary"``: the step boundary at 0.1 s, as a read the
    finish admits), mid-step just before it (``"mid"``: 0.095 s), or not at all (``"none"``)."""
    from kvplan.models.costs import DecodeCost
    from kvplan.sim.batch import DecodeBatch
    from kvplan.sim.clock import SimEnv, call_later
    from kvplan.sim.evlog import RowBuffer
    from kvplan.sim.request import Request

    env = SimEnv()
    done: dict[int, float] = {}

    def finished(r: Request) -> None:
        done[r.conv] = env.now
        if r.conv == 0 and post == "boundary":
            batch.charge_thread(0.05)

    batch = DecodeBatch(env, RowBuffer(), 0, DecodeCost(fixed_s=0.01), 64, exact, 16, lone_decode_owner(finished))
    batch.post_serial = serial
    batch.ready(Request(0, 0, 0, 100, 10, None), 100, 0)
    batch.ready(Request(1, 0, 0, 100, 100, None), 100, 0)
    if post == "mid":
        call_later(env, 0.095, lambda _e: batch.charge_thread(0.05))
    env.run()
    assert done[0] == pytest.approx(0.1)
    return done[1]


@pytest.mark.parametrize("exact", [False, True])
def test_work_posted_at_a_step_boundary_stalls_the_step_starting_there(exact: bool) -> None:
    """A read admitted by a finish at a step boundary is posted in the ``start_load_kv`` of the step that
    ``schedule()`` starts there: that step ends when its forward and the 0.05 s posting are both done (PR #53333:
    0.05 s instead of 0.01 s) or lasts both (posted before the forward: 0.06 s), as the same work posted
    mid-step before that boundary does. (It used to be charged to the step after and then dropped: no stall.)"""
    base = _b_finish(False, exact, "none")
    assert _b_finish(True, exact, "none") == base
    assert _b_finish(False, exact, "boundary") - base == pytest.approx(0.04)
    assert _b_finish(True, exact, "boundary") - base == pytest.approx(0.05)
    assert _b_finish(False, exact, "boundary") == pytest.approx(_b_finish(False, exact, "mid"))
    assert _b_finish(True, exact, "boundary") == pytest.approx(_b_finish(True, exact, "mid"))


@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("serial", [False, True])
def test_work_posted_on_an_idle_engine_delays_the_next_steps_start(serial: bool, exact: bool) -> None:
    """An idle D posts a read in a zero-token step (vLLM's ``kv_connector_no_forward`` still calls
    ``start_load_kv``); a request ready while that 0.05 s of work runs starts its first step when the thread is
    free, whether or not a forward could overlap a posting: 100 steps of 10 ms from 0.05 s, not from 0.04 s."""
    from kvplan.models.costs import DecodeCost
    from kvplan.sim.batch import DecodeBatch
    from kvplan.sim.clock import SimEnv, call_later
    from kvplan.sim.evlog import RowBuffer
    from kvplan.sim.request import Request

    env = SimEnv()
    done: list[float] = []
    batch = DecodeBatch(env, RowBuffer(), 0, DecodeCost(fixed_s=0.01), 64, exact, 16,
                        lone_decode_owner(lambda r: done.append(env.now)))
    batch.post_serial = serial
    batch.charge_thread(0.05)
    call_later(env, 0.01, lambda _e: batch.ready(Request(0, 0, 0, 100, 100, None), 100, 0))
    env.run()
    assert done == [pytest.approx(1.05)]


def _pulls_on_p(overlap: bool) -> Scenario:
    """Multi-turn conversations whose later turns P pulls from D (D->P reads posted on P's engine thread)."""
    return Scenario.model_validate({
        "model": "qwen3-32b", "hardware": "p5en",
        "deployment": {"prefill_nodes": 1, "decode_nodes": 1, "tensor_parallel_size": 8, "prefill_prefix_caching": False,
                       "kv_post_overlaps_forward": overlap},
        "policy": {"bidirectional": True},
        "costs": {"transfer": {"thread_per_descriptor_s": 1e-5}},
        "workload": {"conversations": 40, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                     "turns": {"dist": "constant", "value": 3}, "prefix_tokens": {"dist": "constant", "value": 3000},
                     "user_tokens": {"dist": "constant", "value": 100}, "output_tokens": {"dist": "constant", "value": 40},
                     "turn_gap_s": {"dist": "constant", "value": 1.0}},
        "seed": 3,
    })


def test_a_post_before_the_forward_delays_ps_other_prefills_more() -> None:
    """On P too: with the posting before the forward, a step that posts pulls lasts posting + forward instead of the
    longer of the two, so first turns (which pull nothing) wait longer for P. P runs near saturation here, so one
    seed's mean TTFT swings by +-40% with any cost change (seeds 0-15: serial/overlapped from 0.6 to 1.9): the turns
    of eight seeds are pooled, so the test checks the mechanism, not one draw."""
    first: list[list[float]] = [[], []]
    pulled: list[list[float]] = [[], []]
    for seed in range(8):
        for i, overlap in enumerate((True, False)):
            res = run(_pulls_on_p(overlap).model_copy(update={"seed": seed}))
            assert res.summary["decisions"]["pull"] > 0
            first[i] += list(res.turns[res.turns["turn"] == 1]["ttft_s"])
            pulled[i] += list(res.turns[res.turns["turn"] > 1]["ttft_s"])
    assert sum(first[1]) / len(first[1]) > sum(first[0]) / len(first[0]) * 1.03
    assert sum(pulled[1]) / len(pulled[1]) > sum(pulled[0]) / len(pulled[0]) * 1.1


def _lone_prefill(serial: bool, idle_work_s: float, ready_s: float) -> float:
    """When a lone PrefillNode finishes one 100-token prompt (one step of 10 ms) that reaches it at ``ready_s``,
    with ``idle_work_s`` of engine-thread work posted at 0 while it is idle (an empty step's read posting)."""
    from types import SimpleNamespace

    from kvplan.models.costs import PrefillCost
    from kvplan.sim.clock import SimEnv, call_later
    from kvplan.sim.events import EventLog
    from kvplan.sim.node_config import PrefillConfig
    from kvplan.sim.peers import CallbackDriver
    from kvplan.sim.prefill import PrefillNode
    from kvplan.sim.request import Request

    env = SimEnv()
    done: list[float] = []
    ctx = SimpleNamespace(env=env, log=EventLog(), shared_group=None, decode=[],
                          driver=CallbackDriver(lambda r: done.append(env.now)))
    cfg = PrefillConfig(max_num_seqs=8, max_num_batched_tokens=8192, async_scheduling=False,
                        kv_post_overlaps_forward=not serial, block_size=16, capacity_blocks=1000, prefix_caching=False,
                        bytes_per_block=1, costs=PrefillCost(fixed_s=0.01), kv_recompute_threshold_tokens=0,
                        read_margin_s=5.0, fail_on_decline=False, kv_lease_duration_s=30.0, d_leg_s=0.0)
    node = PrefillNode(ctx, 0, cfg)
    env.run()  # the engine loop starts and goes idle
    node.charge_thread(idle_work_s)
    call_later(env, ready_s, lambda _e: node.submit(Request(0, 0, 0, 100, 10, None)))
    env.run()
    return done[0]


@pytest.mark.parametrize("serial", [False, True])
def test_work_posted_on_an_idle_prefill_delays_its_next_steps_start(serial: bool) -> None:
    """P as D (vLLM's ``kv_connector_no_forward`` posts an empty step's loads before the engine loop's next step):
    a prompt reaching an idle P while 0.05 s of posting runs starts its 10 ms step when the thread is free (0.06 s),
    whether or not a forward could overlap a posting (overlapped, it used to end at 0.05 s, beside that work);
    without the work it ends 10 ms after it arrives."""
    assert _lone_prefill(serial, 0.0, 0.01) == pytest.approx(0.02)
    assert _lone_prefill(serial, 0.05, 0.01) == pytest.approx(0.06)
    assert _lone_prefill(serial, 0.005, 0.01) == pytest.approx(0.02)  # done before it arrived: no wait


@pytest.mark.parametrize("exact", [False, True])
def test_work_posted_in_a_stretchs_last_step_is_not_dropped(exact: bool) -> None:
    """A read posted during the last step of a stretch (A's, after which D goes idle) runs on D's thread when the
    next stretch starts: B, ready just after A's finish, starts its first step only when that work is done. The
    shortcut "hidden by the next step's forward" holds only for a next step inside the same stretch (it dropped
    such work: B finished at 0.201 s with 9 ms of work as without it, and at 0.211 s with 11 ms)."""
    from kvplan.models.costs import DecodeCost
    from kvplan.sim.batch import DecodeBatch
    from kvplan.sim.clock import SimEnv, call_later
    from kvplan.sim.evlog import RowBuffer
    from kvplan.sim.request import Request

    def b_done(work: float) -> float:
        env = SimEnv()
        done: dict[int, float] = {}
        batch = DecodeBatch(env, RowBuffer(), 0, DecodeCost(fixed_s=0.01), 64, exact, 16,
                            lone_decode_owner(lambda r: done.__setitem__(r.conv, env.now)))
        batch.ready(Request(0, 0, 0, 100, 10, None), 100, 0)  # A: 10 steps of 10 ms, done at 0.1 s
        call_later(env, 0.095, lambda _e: batch.charge_thread(work))  # posted during A's last step
        call_later(env, 0.101, lambda _e: batch.ready(Request(1, 0, 0, 100, 10, None), 100, 0))
        env.run()
        return done[1]

    assert b_done(0.0) == pytest.approx(0.201)
    assert b_done(0.009) == pytest.approx(0.209)  # the work runs from 0.095 to 0.104: B's first step starts then
    assert b_done(0.011) == pytest.approx(0.211)
