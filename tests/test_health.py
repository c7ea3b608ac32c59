"""The health section (issue 13, acceptance 4): saturation named, failures explained, units for humans."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from conftest import small
from streamlit.testing.v1 import AppTest

from kvplan.app.cli import main
from kvplan.app.cmd_dashboard import DASHBOARD_SCRIPT
from kvplan.sim.api import run
from kvplan.sim.health import health_lines
from kvplan.units import human_s

MOONCAKE = Path("external_traces") / "mooncake_fast25" / "conversation_trace.jsonl"


def test_human_units() -> None:
    assert human_s(0.0123) == "12.3 ms"
    assert human_s(4.5) == "4.50 s"
    assert human_s(600) == "10.0 min"
    assert human_s(4385.9546) == "73.1 min"
    assert human_s(8014) == "2.2 h"
    assert human_s(float("nan")) == "n/a"


def test_healthy_run_names_nothing_saturated() -> None:
    h = run(small()).summary["health"]
    assert h["status"] == "ok" and h["saturated"] == [] and h["binding_resource"] is None
    assert health_lines(h)[0].startswith("health: nothing saturated")


def test_tiny_decode_pool_is_saturated_by_retention() -> None:
    wl = {**small()["workload"], "conversations": 40, "turns": {"dist": "constant", "value": 1}}
    r = run(small(workload=wl, deployment={"decode_kv_capacity_tokens": 12_000}, policy={"decoder_kv_blocks_ttl_s": 60}))
    h = r.summary["health"]
    assert h["binding_resource"] == "decode_kv" and "decode_kv" in h["saturated"]
    assert h["resources"]["decode_kv"]["by_retention"]
    assert h["resources"]["decode_kv"]["wait_p90_s"] == pytest.approx(float(r.turns["d_queue_s"].quantile(0.9)))
    assert "SATURATED decode HBM" in health_lines(h)[0] and "by retention" in health_lines(h)[0]


def test_failed_turns_are_explained() -> None:
    # turn gaps right at the TTL: P's read comes within the 5 s safety margin of D's expiry and is declined
    wl = {**small()["workload"], "turn_gap_s": {"dist": "uniform", "low": 20, "high": 40}}
    r = run(small(workload=wl, policy={"decoder_kv_blocks_ttl_s": 30, "router_ttl_s": 29}))
    h = r.summary["health"]
    assert r.summary["errors"] > 0
    assert h["errors"]["count"] == r.summary["errors"]
    line = [ln for ln in health_lines(h) if "turns failed" in ln][0]
    assert line.startswith(f"{r.summary['errors']} turns failed: read declined under kv_load_failure_policy: fail")


def test_router_ttl_above_decode_ttl_is_warned() -> None:
    h = run(small(policy={"decoder_kv_blocks_ttl_s": 30, "router_ttl_s": 60})).summary["health"]
    assert any("router_ttl_s (60 s) is above decoder_kv_blocks_ttl_s (30 s)" in w for w in h["warnings"])


def test_mooncake_replay_at_vllm_defaults_names_decode_saturation(
    shared_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = shared_dir / MOONCAKE
    if not trace.is_file():
        pytest.skip("shared Mooncake trace not available")
    out = tmp_path / "o"
    assert main(["simulate", "--trace", str(trace), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    line = [ln for ln in text.splitlines() if ln.startswith("SATURATED decode HBM")]
    assert line and "by retention" in line[0] and "binding" in line[0], text
    assert re.search(r"waited [0-9.]+ (min|h) at p90", line[0]), line[0]  # minutes or hours, not millions of ms
    # P holds the prompts D cannot admit: its pool is saturated too, as backpressure from D
    held = [ln for ln in text.splitlines() if ln.startswith("SATURATED prefill KV pool")]
    assert held and "backpressure" in held[0], text
    health = json.loads((out / "summary.json").read_text())["health"]
    assert health["binding_resource"] == "decode_kv" and health["resources"]["decode_kv"]["by_retention"]
    # the dashboard shows the same finding as a warning
    at = AppTest.from_file(str(DASHBOARD_SCRIPT), default_timeout=240)
    at.run()
    at.selectbox(key="sc_workload").select("replay a trace file").run()
    at.checkbox(key="sc_p_cache").check().run()
    at.file_uploader(key="sc_trace_upload").set_value((trace.name, trace.read_bytes(), "text/csv")).run()
    assert not at.exception, at.exception
    warnings = [w.value for w in at.warning]
    assert any(w.startswith("SATURATED decode HBM") and "by retention" in w for w in warnings), warnings


def test_near_capacity_warns_before_saturation() -> None:
    from kvplan.sim.health import compute_health

    r = run(small())
    s = dict(r.summary)
    s["pinned_kv_gib_peak"] = 0.998 * s["decode_kv_capacity_gib"]
    h = compute_health(s, r.turns, r.scenario, 1e-9)
    assert "decode_kv" not in h["saturated"]
    assert any("decode KV pool pinned at peak 99.8%: close to saturation" in w for w in h["warnings"])


def test_prefill_held_kv_is_reported_when_caching() -> None:
    d = small()
    d["deployment"] = {**d["deployment"], "prefill_prefix_caching": True}
    h = run(d).summary["health"]
    pk = h["prefill_kv"]
    assert 0 < pk["held_tokens_end"] <= pk["capacity_tokens"] and pk["evictable"]
    off = run(small()).summary["health"]["prefill_kv"]  # small() turns P's cache off
    assert not off["caching"] and off["held_tokens_end"] == 0 and math.isnan(off["held_fraction_end"])


def _busy_union_share(r: object, t0: float, t1: float) -> float:
    """Share of [t0, t1] in which P had a prompt in prefill (P_COMPUTE .. P_DONE intervals, one P node)."""
    from kvplan.sim.events import Ev

    ev = r.events  # type: ignore[attr-defined]
    c = ev[ev["kind"] == int(Ev.P_COMPUTE)].set_index(["conv", "turn"])["t_s"]
    d = ev[ev["kind"] == int(Ev.P_DONE)].set_index(["conv", "turn"])["t_s"].reindex(c.index)
    busy, lo, hi = 0.0, t0, t0
    for a, b in sorted(zip(c.to_numpy(), d.to_numpy(), strict=True)):
        a, b = max(a, t0), min(b, t1)
        if b <= a:
            continue
        if a > hi:
            busy += max(hi - lo, 0.0)
            lo, hi = a, b
        else:
            hi = max(hi, b)
    return (busy + max(hi - lo, 0.0)) / (t1 - t0)


def test_prefill_utilisation_is_measured_over_the_steady_window() -> None:
    """P nearly always busy while 40 long prompts arrive, then D decodes 3,000 tokens each after the last arrival:
    the health section's utilisation is over the steady window (the second half of the arrivals, as the prefill
    intervals of the event log give it), not diluted by the drain (the whole-run figure, kept as
    summary.prefill_utilization, is under half)."""
    wl = {**small()["workload"], "conversations": 40, "arrival": {"kind": "poisson", "rate_per_s": 2.0},
          "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 16000},
          "output_tokens": {"dist": "constant", "value": 3000}}
    r = run(small(workload=wl, policy={"bidirectional": False}))
    s, h = r.summary, r.summary["health"]["resources"]["prefill_compute"]
    t_b = float(r.turns["arrival_s"].max())
    assert (s["steady_window_start_s"], s["steady_window_end_s"]) == (t_b / 2, t_b)
    assert h["utilization"] == s["prefill_utilization_steady"]
    assert h["utilization"] == pytest.approx(_busy_union_share(r, t_b / 2, t_b), abs=0.03)
    assert h["utilization"] > 0.8 and s["prefill_utilization"] < 0.5  # the drain diluted the whole-run figure
    assert h["utilization_window"].startswith("steady window")
    assert "busy over the steady window" in health_lines(r.summary["health"])[0]


def test_closed_loop_utilisation_says_it_is_over_the_whole_run() -> None:
    d = small()
    d["workload"]["arrival"] = {"kind": "closed_loop", "clients": 2, "max_active_conversations": 4}
    s = run(d).summary
    h = s["health"]["resources"]["prefill_compute"]
    assert s["prefill_utilization_steady"] is None and h["utilization"] == s["prefill_utilization"]
    assert h["utilization_window"].startswith("active span")


def _llmd_2p1d(rate: float) -> dict[str, object]:
    """The llm-d 2P1D shape (Llama-3.1-8B TP1 on p4de, UCX TCP, reads posted before the forward, no retention):
    single-turn 10.5k-token prompts, 100 output tokens, at ``rate`` requests/s."""
    return {
        "model": "llama-3.1-8b", "hardware": "p4de",
        "deployment": {"tensor_parallel_size": 1, "prefill_nodes": 2, "decode_nodes": 1, "kv_transport": "tcp",
                       "kv_post_overlaps_forward": False},
        "policy": {"bidirectional": False},
        "workload": {"conversations": 250, "arrival": {"kind": "poisson", "rate_per_s": rate, "burstiness": 50},
                     "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 10500},
                     "user_tokens": {"dist": "constant", "value": 0}, "output_tokens": {"dist": "constant", "value": 100},
                     "turn_gap_s": {"dist": "constant", "value": 0}},
        "seed": 0,
    }


def test_a_saturated_decode_engine_thread_is_reported() -> None:
    """D posts every read over TCP before its forward (~0.36 s of thread work each): at 2.5 reads/s its arrivals
    demand more thread time than D has beside the decode steps that free its pool, so D's queue grows; health names
    D's engine thread saturated and binding; D's pool, which running requests fill (no retention), is reported full
    at its peak (``used_peak_fraction`` and a warning) but not judged: its pinned share is what a TTL controls."""
    h = run(_llmd_2p1d(2.5)).summary["health"]
    t, kv = h["resources"]["decode_engine_thread"], h["resources"]["decode_kv"]
    assert "decode_engine_thread" in h["saturated"] and "decode_kv" not in h["saturated"]
    assert h["binding_resource"] == "decode_engine_thread"
    assert any(w.startswith("decode KV pool full at its peak") for w in h["warnings"])
    assert t["utilization"] >= 0.9 and t["wait_p90_s"] > 1.0 and not t["post_overlaps_forward"]
    assert t["post_fraction"] <= t["busy_fraction"] <= t["utilization"]  # demand above what it got through
    assert kv["pinned_peak_fraction"] == kv["utilization"] == 0.0 and kv["used_peak_fraction"] >= 0.9
    assert not h["resources"]["prefill_engine_thread"]["saturated"]  # P posts nothing (no D->P pulls)
    assert any(ln.startswith("SATURATED D's engine thread") for ln in health_lines(h))


def test_a_light_tcp_load_saturates_no_engine_thread() -> None:
    """The same deployment at 0.5 reads/s: D's thread is busy (the posts), far from saturated; D's pool holds a few
    running requests."""
    h = run(_llmd_2p1d(0.5)).summary["health"]
    t, kv = h["resources"]["decode_engine_thread"], h["resources"]["decode_kv"]
    assert h["saturated"] == [] and not t["saturated"]
    assert 0.05 < t["post_fraction"] <= t["busy_fraction"] < 0.5
    assert t["utilization"] == pytest.approx(t["busy_fraction"], rel=0.05)  # it keeps up: demand = busy share
    assert 0.0 < kv["used_peak_fraction"] < 0.5 and kv["pinned_peak_fraction"] == kv["utilization"] == 0.0


def test_an_engine_thread_binds_over_its_engines_unsaturated_resource() -> None:
    """An engine thread shares its engine's queue wait: with equal waits the saturated one binds."""
    from kvplan.sim.health import compute_health

    r = run(small())
    s = dict(r.summary)
    w = r.turns["prefill_queue_s"]
    turns = r.turns.assign(prefill_queue_s=w + 5.0)
    s["prefill_thread_utilization"] = 0.97
    h = compute_health(s, turns, r.scenario, 1e-9)
    assert h["resources"]["prefill_engine_thread"]["saturated"] and not h["resources"]["prefill_compute"]["saturated"]
    assert h["binding_resource"] == "prefill_engine_thread"
    s["prefill_thread_utilization"] = 0.5
    assert compute_health(s, turns, r.scenario, 1e-9)["binding_resource"] == "prefill_compute"


def test_one_p_falling_behind_saturates_prefill_compute_though_the_mean_is_low() -> None:
    # 16P56D at TTL 60 s (bench_recommend): 10 of 16 P busy all the window, 6 half busy, mean 81%, P queue 511 s at
    # p90. Judged on the mean, prefill compute was "ok"; judged on the busiest engine it is saturated.
    from kvplan.sim.health import Waits, compute_health
    from kvplan.sim.scenario import as_scenario

    sc = as_scenario(small(deployment={"prefill_nodes": 16, "decode_nodes": 4}))
    summary = {"prefill_utilization": 0.7, "prefill_utilization_steady": 0.81, "prefill_utilization_steady_max": 1.0,
               "prefill_steady_engines_over_busy": 10, "steady_window_start_s": 100.0, "steady_window_end_s": 200.0}
    waits = Waits(span_s=300.0, prefill=(511.0, 200.0), decode=(0.0, 0.0), link=(0.0, 0.0))
    h = compute_health(summary, waits, sc, 0.0)
    pc = h["resources"]["prefill_compute"]
    assert pc["utilization"] == 1.0 and pc["utilization_mean"] == 0.81 and pc["engines_over_busy"] == 10
    assert h["saturated"] == ["prefill_compute"] and h["binding_resource"] == "prefill_compute"
    line = health_lines(h)[0]
    assert "the busiest of 16 engines (10 at 90% or more; mean 81%)" in line, line
    # the same run judged on its mean (no per-engine figure): not saturated, as before
    h_mean = compute_health({**summary, "prefill_utilization_steady_max": None}, waits, sc, 0.0)
    assert h_mean["saturated"] == []


def test_busiest_prefill_engine_share_is_reported_beside_the_mean() -> None:
    wl = {**small()["workload"], "conversations": 120, "arrival": {"kind": "poisson", "rate_per_s": 4.0},
          "prefix_tokens": {"dist": "lognormal", "median": 30000, "sigma": 1.2}}
    s = run(small(workload=wl, deployment={"max_num_seqs": 64, "prefill_prefix_caching": False, "prefill_nodes": 2,
                                           "routing": "prefix_aware"})).summary
    mean, top = s["prefill_utilization_steady"], s["prefill_utilization_steady_max"]
    # two engines: the busiest is above the mean, and the other one's share is what is left of twice the mean
    assert top > mean + 0.05 and 0.0 <= 2 * mean - top < mean
    assert s["health"]["resources"]["prefill_compute"]["utilization"] == top
    assert s["health"]["resources"]["prefill_compute"]["utilization_mean"] == mean
    assert s["prefill_steady_engines_over_busy"] == 0


def test_a_prefill_engine_busy_the_whole_window_warns_that_it_is_at_capacity() -> None:
    """A P engine busy for the whole steady window never emptied its queue: a run that short says nothing saturated
    only because no request has waited a second yet; the health section says so (printing at most 100%: a busy
    share over 1 is a step straddling the window's edges). An aggregated engine as busy warns nothing: it steps while
    any request decodes, so its busy share is not its load."""
    from kvplan.sim.health import Waits, compute_health
    from kvplan.sim.scenario import as_scenario

    summary = {"prefill_utilization": 0.9, "prefill_utilization_steady": 1.008, "prefill_utilization_steady_max": 1.011,
               "prefill_steady_engines_over_busy": 3, "steady_window_start_s": 50.0, "steady_window_end_s": 100.0}
    waits = Waits(span_s=150.0, prefill=(0.4, 0.1), decode=(0.0, 0.0), link=(0.0, 0.0))
    h = compute_health(summary, waits, as_scenario(small(deployment={"prefill_nodes": 3, "decode_nodes": 1})), 0.0)
    assert h["saturated"] == [] and h["status"] == "warning"
    (w,) = [w for w in h["warnings"] if w.startswith("prefill compute busy")]
    assert "100.0% of the steady window: at or over capacity" in w
    line = next(x for x in health_lines(h) if "nothing saturated" in x)
    assert "prefill 100% (busiest engine; mean 100%)" in line and "101%" not in line
    near = compute_health({**summary, "prefill_utilization_steady_max": 0.96}, waits,
                          as_scenario(small(deployment={"prefill_nodes": 3, "decode_nodes": 1})), 0.0)
    assert any("96.0%: close to saturation" in w for w in near["warnings"])
    agg = as_scenario(small(deployment={"mode": "aggregated", "replicas": 3}))
    assert not any(w.startswith("prefill compute") for w in compute_health(summary, waits, agg, 0.0)["warnings"])


def test_a_pin_that_leaves_no_room_for_the_next_request_saturates_the_pool() -> None:
    """Qwen3-32B at TP1 on H100s (vLLM's pool ~18k tokens), single-turn 10k-token requests, vLLM's TTL: each finished
    request's pin holds 57% of D's pool for 480 s and the next request cannot be admitted until it expires, though the
    pool is never 90% full. Before, health said "nothing saturated" and blamed prefill compute (0.2% busy) for a
    TTFT p90 of hours; now D's pool is saturated by retention and binds, P's held pool is its backpressure."""
    sc = {"model": "qwen3-32b", "hardware": "p5",
          "deployment": {"prefill_nodes": 1, "decode_nodes": 1, "tensor_parallel_size": 1},
          "workload": {"conversations": 40, "arrival": {"kind": "poisson", "rate_per_s": 0.05},
                       "turns": {"dist": "constant", "value": 1},
                       "prefix_tokens": {"dist": "constant", "value": 10000},
                       "output_tokens": {"dist": "constant", "value": 300}}}
    res = run(sc)
    h = res.summary["health"]
    dkv = h["resources"]["decode_kv"]
    assert dkv["pinned_peak_fraction"] < 0.9 and dkv["pinned_peak_fraction"] + dkv["request_fraction"] >= 1.0
    assert dkv["no_room_for_a_request"] and dkv["saturated"] and dkv["by_retention"]
    assert h["binding_resource"] == "decode_kv" and h["status"] == "saturated"
    assert h["resources"]["prefill_held_kv"].get("backpressure_from_decode")
    assert "no room for the next one" in "\n".join(health_lines(h))
    # the same without retention: no pins, nothing saturated by retention
    off = run({**sc, "policy": {"bidirectional": False}}).summary["health"]
    assert not off["resources"]["decode_kv"]["no_room_for_a_request"]


def test_a_saturated_prefill_engine_is_never_printed_over_100_percent() -> None:
    """ans12: one aggregated TP8 replica with a 40k-token pool, 2 conversations/s of 2k-prompt 3k-output turns printed
    "SATURATED prefill compute ...: engine busy 102% of the steady window": a busy share over 1 is a step straddling
    the window's edges (the summary keeps the raw 1.02); the other health lines print at most 100%, this one now too."""
    from kvplan.sim.api import run

    sc = small(deployment={"mode": "aggregated", "replicas": 1, "tensor_parallel_size": 8, "max_num_seqs": 64,
                           "decode_kv_capacity_tokens": 40000},
               workload={"conversations": 60, "arrival": {"kind": "poisson", "rate_per_s": 2},
                         "turns": {"dist": "constant", "value": 2}, "prefix_tokens": {"dist": "constant", "value": 2000},
                         "user_tokens": {"dist": "constant", "value": 100},
                         "output_tokens": {"dist": "constant", "value": 3000},
                         "turn_gap_s": {"dist": "constant", "value": 1}},
               seed=0)
    s = run(sc).summary
    assert s["prefill_utilization_steady_max"] > 1.0  # the raw share: a step straddling the window's end
    (line,) = [x for x in health_lines(s["health"]) if x.startswith("SATURATED prefill compute")]
    assert "busy 100% of the steady window" in line, line


def test_nothing_saturated_line_prints_the_used_decode_peak() -> None:
    """'decode KV peak' is the share of one D's pool held at once by running requests and pins, the pinned peak is
    beside it: the line printed the pinned peak twice (retention off: 'peak 0% of the pool (pinned 0%)' while
    running requests held 18% of it)."""
    dep = {"max_num_seqs": 64, "prefill_prefix_caching": False, "decode_kv_capacity_tokens": 100_000}
    s = run(small(deployment=dep, policy={"bidirectional": False})).summary
    h = s["health"]
    used = s["decode_kv_used_peak_fraction"]
    assert h["saturated"] == [] and h["resources"]["decode_kv"]["pinned_peak_fraction"] == 0.0 and used >= 0.05
    line = health_lines(h)[0]
    assert f"decode KV peak {used:.0%} of the pool (pinned 0%)" in line, line
