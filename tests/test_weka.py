"""The weka trace format (AgentX / Weka kv-cache-tester coding-agent sessions): reading, reuse from hash
prefixes, sub-agents, replay timing, the context limit, malformed input, and the replay of the shared sample.

``tests/data/traces/weka_small.json`` is hand-built (its README lists the expected reuse of every request);
the 50 real traces in ``../shared/external_traces/agentx_weka`` are skipped when absent.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest
from conftest import need_shared

from kvplan.errors import KvplanInputError
from kvplan.sim.api import run
from kvplan.sim.scenario import TraceSource
from kvplan.sim.weka_plan import plan_from_weka
from kvplan.traces.readers import detect_trace_format, load_trace
from kvplan.traces.weka import read_weka, session_reuse

DATA = Path(__file__).resolve().parent / "data" / "traces"
SMALL = DATA / "weka_small.json"


def test_small_file_sessions_reuse_and_subagent() -> None:
    tr = read_weka(SMALL)
    assert [s.name for s in tr.sessions] == ["synthetic_agent", "synthetic_agent/agent_001"]
    assert [s.start_s for s in tr.sessions] == [0.0, 12.0]  # the sub-agent starts at its marker
    assert [s.shared_tokens for s in tr.sessions] == [1280, 600]
    assert tr.session.tolist() == [0, 0, 0, 0, 0, 1, 1]
    reuse, lcp = session_reuse(tr)
    # extended with room for the output; all blocks but no room; compaction; extended; sub-agent extended
    assert reuse.tolist() == [0, 1300 + 100, 25 * 64, 5 * 64, 900 + 80, 0, 700 + 50]
    assert lcp.tolist() == [0, 20, 25, 5, 14, 0, 10]
    no_out, _ = session_reuse(tr, with_output=False)
    assert no_out.tolist() == [0, 20 * 64, 25 * 64, 5 * 64, 14 * 64, 0, 10 * 64]


def test_detect_and_common_frame() -> None:
    assert detect_trace_format(SMALL) == "weka"
    assert detect_trace_format(DATA) == "weka"  # a directory is a folder of weka files
    tr = load_trace(SMALL)
    df = tr.requests
    assert tr.format == "weka" and tr.n_requests == 7 and tr.n_sessions == 2
    assert df["arrival_s"].is_monotonic_increasing
    sub = df[df["session_id"] == "synthetic_agent/agent_001"]
    assert sub["arrival_s"].tolist() == [12.0, 15.0] and sub["turn"].tolist() == [1, 2]
    assert df["service_s"].iloc[0] == 2.0  # api_time


def test_plan_think_timing_and_original() -> None:
    plan = plan_from_weka(TraceSource(path=str(SMALL)), 0, 40960)
    assert plan.turns.tolist() == [5, 2] and plan.start_s.tolist() == [0.0, 12.0]
    # gap after turn i = the next request's think_time (none after a conversation's last turn)
    assert plan.gap_s.tolist() == [8.0, 15.0, 18.0, 8.0, 0.0, 2.0, 0.0]
    assert plan.arrival_s is None and plan.reuse_tokens is not None
    assert plan.reuse_tokens.tolist() == [0, 1400, 1600, 320, 980, 0, 750]
    orig = plan_from_weka(TraceSource(path=str(SMALL), timing="original", time_scale=2), 0, 40960)
    assert orig.arrival_s is not None
    assert orig.arrival_s.tolist() == [0.0, 5.0, 15.0, 25.0, 30.0, 6.0, 7.5]  # (start + t) / time_scale
    rep = plan.trace_report
    assert rep is not None and rep["requests_replayed"] + rep["skipped_overlong"] == rep["input_requests"] == 7
    assert rep["hash_recompute_tokens"] == {"with_previous_output": 2000 + 200 + 100 + 580 + 120 + 150,
                                            "without_previous_output": 2000 + 320 + 100 + 580 + 204 + 260}


def test_context_limit_skips_or_truncates_and_counts() -> None:
    skip = plan_from_weka(TraceSource(path=str(SMALL)), 0, 1700)
    rep = skip.trace_report
    assert rep is not None and rep["skipped_overlong"] == 2  # 1600 + 120 and 1700 + 50 exceed 1,700
    assert skip.prompt_tokens.tolist() == [1300, 900, 1100, 700, 900]
    # reuse against the previous *kept* request; the skipped requests' think + API time join the next gap
    assert skip.reuse_tokens is not None and skip.reuse_tokens.tolist() == [0, 320, 980, 0, 750]
    assert skip.gap_s.tolist()[0] == 8.0 + 2.0 + 15.0 + 2.0 + 18.0
    cut = plan_from_weka(TraceSource(path=str(SMALL), overlong="truncate"), 0, 1700)
    assert cut.trace_report is not None and cut.trace_report["truncated_overlong"] == 2
    assert cut.prompt_tokens.tolist()[1:3] == [1580, 1650]
    assert (cut.prompt_tokens + cut.output_tokens <= 1700).all()


def test_context_limit_is_said_not_only_counted(caplog: pytest.LogCaptureFixture) -> None:
    """ans12: `kvplan simulate` / `recommend --trace` of trace_0046.json on qwen3-32b (40,960 tokens) replayed 1 of
    its 68 requests (67 over the context limit) and said nothing: the count was only in summary.json's trace
    report, and recommend advised bidirectional off from that one turn ("turns rarely come back"). The other trace
    formats warn through traces.select ("select: N request(s) over L tokens were skipped"); weka now does too."""
    import logging

    with caplog.at_level(logging.WARNING):
        plan_from_weka(TraceSource(path=str(SMALL)), 0, 1700)
    assert "select: 2 request(s) over 1700 tokens were skipped" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        plan_from_weka(TraceSource(path=str(SMALL), overlong="truncate"), 0, 1700)
    assert "select: 2 request(s) over 1700 tokens were truncated" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        plan_from_weka(TraceSource(path=str(SMALL)), 0, 40960)
    assert "select:" not in caplog.text  # nothing over the limit: nothing said


def _write(tmp: Path, obj: Any, name: str = "t.json") -> Path:
    p = tmp / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return p


@pytest.mark.parametrize("mutate, needle", [
    (lambda d: d["requests"][0].pop("in"), "missing field 'in'"),
    (lambda d: d["requests"][0].update(hash_ids=[1, 2]), "field 'hash_ids' has 2 ids"),
    (lambda d: d["requests"][0].update(hash_ids=[1.5] * 20), "integer ids"),
    (lambda d: d["requests"][1].update(t=-1.0), "field 't'"),
    (lambda d: d.update(block_size=16), "block_size"),
    (lambda d: d["requests"][0].update(think_time="x"), "think_time"),
    (lambda d: d.update(requests={}), "not a list"),
])
def test_malformed_is_one_line(tmp_path: Path, mutate: Any, needle: str) -> None:
    doc = json.loads(SMALL.read_text())
    mutate(doc)
    with pytest.raises(KvplanInputError) as exc:
        read_weka(_write(tmp_path, doc))
    assert needle in str(exc.value) and "\n" not in str(exc.value)


def test_bounds_depth_json_and_empty_dir(tmp_path: Path) -> None:
    deep: dict[str, Any] = {"t": 0.0, "type": "subagent", "requests": []}
    node = deep
    for _ in range(12):
        child: dict[str, Any] = {"t": 0.0, "type": "subagent", "requests": []}
        node["requests"].append(child)
        node = child
    with pytest.raises(KvplanInputError, match="nested more than"):
        read_weka(_write(tmp_path, {"id": "x", "requests": [deep]}))
    with pytest.raises(KvplanInputError, match="not valid JSON"):
        read_weka(_write(tmp_path, '{"id": "x", "requests": [', "bad.json"))
    with pytest.raises(KvplanInputError, match="not a JSON object"):
        read_weka(_write(tmp_path, "[1, 2]", "list.json"))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(KvplanInputError, match="no \\*.json"):
        read_weka(empty)
    with pytest.raises(KvplanInputError, match="larger than"):
        read_weka(SMALL, max_bytes=100)


def test_timing_refused_for_other_formats() -> None:
    sc = {"workload": {"trace": {"path": str(DATA / "sessions_small.csv"), "timing": "think"}}}
    with pytest.raises(KvplanInputError, match="weka only"):
        run(sc)


def _replay(path: Path, **trace: Any) -> dict[str, Any]:
    sc = {"model": "qwen3-32b", "hardware": "p5en", "policy": {"bidirectional": True},
          "deployment": {"prefill_prefix_caching": False},
          "workload": {"trace": {"path": str(path), "format": "weka", **trace}}}
    return run(sc).summary


def test_replay_small_every_request_a_turn_and_reuse_capped_by_hashes() -> None:
    s = _replay(SMALL)
    assert s["turns"] == 7 and s["conversations"] == 2
    # P caching off, TTL 480 s > every gap: every follow-up pulls min(D's context (prompt + output - 1), what the
    # hashes say it repeats); the first turns and the rest are recomputed
    assert s["decisions"].get("pull", 0) == 5
    assert s["pulled_tokens"] == 1399 + 1600 + 320 + 979 + 749
    assert s["recomputed_tokens"] == 1300 + (1600 - 1399) + (1700 - 1600) + (900 - 320) + (1100 - 979) + 700 + (900 - 749)


# --- the shared AgentX sample ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def agentx() -> Path:
    return need_shared("external_traces/agentx_weka")


def test_shared_every_request_is_a_turn_or_counted(agentx: Path) -> None:
    tr = read_weka(agentx)
    assert len(tr.files) == 50 and tr.n_requests == 4118  # SOURCE.md: 4,118 requests
    subs = [i for i, s in enumerate(tr.sessions) if s.parent >= 0]
    assert len(subs) == 5  # SOURCE.md: 5 sub-agent groups
    cases: tuple[tuple[int, Literal["skip", "truncate"]], ...] = ((202752, "skip"), (40960, "truncate"), (40960, "skip"))
    for limit, overlong in cases:
        plan = plan_from_weka(TraceSource(path=str(agentx), overlong=overlong), 0, limit)
        rep = plan.trace_report
        assert rep is not None
        assert rep["requests_replayed"] + rep["skipped_overlong"] == 4118
        assert (plan.prompt_tokens + plan.output_tokens <= limit).all()
        if overlong == "truncate":
            assert rep["requests_replayed"] == 4118 and rep["truncated_overlong"] > 0
    # sub-agent requests are conversations of their own
    plan = plan_from_weka(TraceSource(path=str(agentx)), 0, 10**9)
    assert len(plan.turns) == 55 and plan.total_turns == 4118
    sizes = sorted(np.bincount(tr.session)[subs].tolist())
    assert sizes == [5, 6, 7, 10, 12]


def test_shared_replay_recomputes_between_hash_bounds(agentx: Path) -> None:
    """GLM-5-FP8 on p5en, a TTL (and router TTL) longer than every gap, enough nodes that nothing saturates:
    the recomputed tokens lie between the hash bounds (reuse with and without the previous output), +-10%."""
    sc = {"model": "glm-5-fp8", "hardware": "p5en",
          "deployment": {"prefill_nodes": 64, "decode_nodes": 64, "routing": "session_affinity"},
          "policy": {"bidirectional": True, "decoder_kv_blocks_ttl_s": 50000, "router_ttl_s": 50000,
                     "kv_load_failure_policy": "recompute"},
          "workload": {"trace": {"path": str(agentx), "format": "weka"}}}
    s = run(sc).summary
    lo = s["trace"]["hash_recompute_tokens"]["with_previous_output"]
    hi = s["trace"]["hash_recompute_tokens"]["without_previous_output"]
    assert lo < hi
    assert 0.9 * lo <= s["recomputed_tokens"] <= 1.1 * hi
    assert s["errors"] == 0 and s["hit_rate"] == 1.0


def test_workload_show_agentic_statistics(capsys: pytest.CaptureFixture[str]) -> None:
    from kvplan.app.cli import main

    assert main(["workload", "show", str(SMALL), "--json"]) == 0
    st = json.loads(capsys.readouterr().out)["weka"]
    assert st["sessions"] == 2 and st["subagent_sessions"] == 1 and st["requests"] == 7
    assert st["compactions"] == 1 and st["compaction_kept_tokens"]["p50"] == 320.0  # request 4 keeps 5 blocks
    # reuse share: hash-prefix reuse over the follow-ups' prompt tokens
    assert st["reuse_share"] == pytest.approx((1400 + 1600 + 320 + 980 + 750) / (1600 + 1700 + 900 + 1100 + 900))
    assert st["think_time_s"]["p50"] == 8.0  # follow-ups' think times 8, 15, 18, 8, 2
    growth = st["growth_tokens_per_request"]  # non-compaction follow-ups: +300, +100, +200 (main), +200 (sub)
    assert growth["n"] == 4 and growth["p50"] == 200.0
    assert [r["compactions"] for r in st["per_session"]] == [1, 0]
    assert main(["workload", "show", str(SMALL)]) == 0
    out = capsys.readouterr().out
    assert "compaction events" in out and "synthetic_agent/agent_001" in out


def test_coding_agent_preset_is_the_agentx_fit(agentx: Path) -> None:
    """The coding-agent preset's constants are what kvplan.traces.weka_stats.coding_agent_fit gives on the sample."""
    from kvplan.sim import presets as P
    from kvplan.traces.weka_stats import coding_agent_fit

    fit = coding_agent_fit(read_weka(agentx))
    assert fit["tool_gap_share"] == pytest.approx(P.CODING_TOOL_SHARE, abs=5e-4)
    assert fit["tool_gap_p50_p90_s"] == pytest.approx((P.CODING_TOOL_P50_S, P.CODING_TOOL_P90_S), abs=0.5)
    assert fit["user_gap_p50_p90_s"] == pytest.approx((P.CODING_HUMAN_P50_S, P.CODING_HUMAN_P90_S), abs=0.5)
    assert fit["first_prompt_p50_p90"] == pytest.approx(P.CODING_FIRST_PROMPT, abs=0.5)
    assert fit["new_tokens_p50_p90"] == pytest.approx(P.CODING_APPEND, abs=0.5)
    assert fit["output_p50_p90"] == pytest.approx(P.CODING_OUTPUT, abs=0.5)
    assert tuple(fit["turns"]) == P.CODING_TURNS
    assert fit["shared_prefix_tokens"] == P.CODING_SHARED_PREFIX


def test_max_model_len_per_scenario() -> None:
    sc = {"model": "qwen3-32b", "deployment": {"max_model_len": 1650},
          "workload": {"trace": {"path": str(SMALL)}}}
    s = run(sc).summary
    assert s["turns"] == 5 and s["trace"]["skipped_overlong"] == 2  # 1600 + 120 and 1700 + 50 > 1,650
    with pytest.raises(KvplanInputError, match="max_model_len"):
        run({"model": "qwen3-32b", "deployment": {"max_model_len": 100000}})


def test_directory_replays_every_file_with_distinct_sessions(tmp_path: Path) -> None:
    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(SMALL.read_text())
    (tmp_path / "notes.txt").write_text("not a trace")  # only *.json files are read
    tr = load_trace(tmp_path)
    assert tr.n_requests == 14 and tr.n_sessions == 4
    s = run({"policy": {"bidirectional": True}, "workload": {"trace": {"path": str(tmp_path)}}}).summary
    assert s["turns"] == 14 and s["conversations"] == 4 and s["trace"]["files"] == 2


def test_a_closed_loop_does_not_pace_a_trace() -> None:
    """A scenario's closed loop (the published benchmark's 2 clients) left with a weka trace: the trace keeps its own
    clock (session starts, think times after each answer), the turns are those of the open replay, and the ignored
    setting is said. Before, the clients paced the sessions (a sub-agent recorded at 6 s started at 0.36 s)."""
    trace: dict[str, Any] = {"path": str(SMALL), "format": "weka"}
    base: dict[str, Any] = {"model": "qwen3-32b", "hardware": "p5en", "policy": {"bidirectional": True},
                            "workload": {"trace": trace}}
    closed = {**base, "workload": {"trace": trace,
                                   "arrival": {"kind": "closed_loop", "clients": 1, "max_active_conversations": 1}}}
    a, b = run(base), run(closed)
    pd_cols = ["arrival_s", "ttft_s", "finish_s", "decision"]
    assert a.turns[pd_cols].equals(b.turns[pd_cols])
    assert any(n.startswith("no effect: workload.arrival closed_loop") for n in b.notes)
    assert not any("workload.arrival" in n for n in a.notes)


def test_directory_skips_hidden_files_such_as_kvplans_own_ledger(tmp_path: Path) -> None:
    """``workload show DIR --html DIR/report.html`` leaves kvplan's ledger ``DIR/.kvplan-outputs.json`` beside the
    traces; the next read of ``DIR`` must not take it (or any hidden file, as a shell's ``*.json``) for a trace."""
    from kvplan.app.cli import main

    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(SMALL.read_text())
    assert main(["workload", "show", str(tmp_path), "--html", str(tmp_path / "report.html")]) == 0
    assert (tmp_path / ".kvplan-outputs.json").is_file()
    (tmp_path / ".editor-backup.json").write_text("{")
    tr = load_trace(tmp_path)
    assert tr.n_requests == 14 and tr.n_sessions == 4
    assert main(["workload", "show", str(tmp_path)]) == 0


def test_directory_skips_the_json_outputs_kvplan_wrote_there(tmp_path: Path) -> None:
    """``workload fit DIR --out DIR/w.yaml`` writes its report ``DIR/w.fit.json`` beside the traces; the next read of
    ``DIR`` took it for a trace ("field 'requests' is 91, not a list"). A file kvplan's ledger names (bytes unchanged)
    is kvplan's output, not a trace; once edited it is the user's again, and read."""
    from kvplan.app.cli import main

    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(SMALL.read_text())
    assert main(["workload", "fit", str(tmp_path), "--out", str(tmp_path / "w.yaml")]) == 0
    assert (tmp_path / "w.fit.json").is_file()
    tr = load_trace(tmp_path)
    assert tr.n_requests == 14 and tr.n_sessions == 4
    assert main(["workload", "fit", str(tmp_path), "--out", str(tmp_path / "w.yaml")]) == 0  # and again
    (tmp_path / "w.fit.json").write_text(SMALL.read_text())  # the user's now: a trace like the others
    assert load_trace(tmp_path).n_requests == 21


def test_directory_skips_the_result_kvplan_committed_there(tmp_path: Path) -> None:
    """``simulate --trace DIR --out DIR --overwrite`` commits ``summary.json`` (and the rest of a result) into the
    trace folder, named in ``DIR/.kvplan-result.json`` rather than in the single-file ledger; the next read of
    ``DIR`` took it for a trace ("summary: missing field 'requests'") and the folder could no longer be replayed.
    The result's files (bytes unchanged) are kvplan's output, not traces; once edited they are the user's again."""
    from kvplan.app.cli import main

    for name in ("a.json", "b.json"):
        (tmp_path / name).write_text(SMALL.read_text())
    assert main(["simulate", "--trace", str(tmp_path), "--out", str(tmp_path), "--overwrite"]) == 0
    assert (tmp_path / "summary.json").is_file() and (tmp_path / ".kvplan-result.json").is_file()
    tr = load_trace(tmp_path)
    assert tr.n_requests == 14 and tr.n_sessions == 4
    assert main(["workload", "show", str(tmp_path)]) == 0
    assert main(["simulate", "--trace", str(tmp_path), "--out", str(tmp_path), "--overwrite"]) == 0  # and again
    (tmp_path / "summary.json").write_text(SMALL.read_text())  # the user's now: a trace like the others
    assert load_trace(tmp_path).n_requests == 21


def test_recommend_quotes_the_gaps_of_the_requests_replayed() -> None:
    """ans12b: `recommend --trace trace_0046.json` on qwen3-32b (40,960 tokens) quoted "turn gaps p50 14 s, p90 6.9
    min" and screened its TTLs with them, from all 68 requests, though 67 are over the context and only 1 replays;
    the break-even's local prefix (114,140 tokens) was also the mean of requests the model cannot take. The gaps,
    the screen and the follow-up shape now come from the requests replayed, and the text says which those are."""
    from kvplan.plan.advice import recommend
    from kvplan.plan.advice_runs import trace_gap_sample, trace_pairs, workload_gaps
    from kvplan.sim.scenario import as_scenario

    # the rationale and the break-even (local prefix: mean replayed parent prompt, (1300 + 900 + 700) / 3;
    # the whole trace's gaps are p90 20 s, its mean parent prompt 1,240)
    rec = recommend({"model": "qwen3-32b", "hardware": "p5en", "deployment": {"max_model_len": 1700},
                     "workload": {"trace": {"path": str(SMALL)}}}, replications=1, ttl_grid=(30,), workers=1)
    text = " ".join([rec.binding_constraint, *rec.rationale])
    assert "turn gaps of the 5 of 7 trace requests replayed" in text and "p90 42.00 s" in text, text
    assert "p90 20.00 s" not in text
    assert rec.threshold_check["local_prefix_tokens"] == 966
    sc = as_scenario({"model": "qwen3-32b", "workload": {"trace": {"path": str(SMALL)}}})
    # arrivals: main agent 0, 10, 30, 50, 60 s; sub-agent 12, 15 s; at 1,700 tokens the requests at 10 s (1600 + 120)
    # and 30 s (1700 + 50) are skipped, so the one at 50 s follows the one at 0 s (as the replay pairs them)
    all_pairs = trace_pairs(sc, 40960)
    assert all_pairs is not None
    whole = trace_gap_sample(all_pairs)
    assert whole is not None and sorted(whole.tolist()) == [3.0, 10.0, 10.0, 20.0, 20.0]
    pairs = trace_pairs(sc, 1700)
    assert pairs is not None and sorted(pairs["gap_s"].tolist()) == [3.0, 10.0, 50.0]
    assert sorted(pairs["parent_input"].tolist()) == [700, 900, 1300]
    gaps = workload_gaps(sc, trace_gap_sample(pairs), pairs.attrs["selection"])
    assert gaps is not None and gaps.p50 == 10.0 and gaps.p90 == pytest.approx(42.0)
    assert gaps.what.startswith("turn gaps of the 5 of 7 trace requests replayed (arrival to arrival; 2 over the "
                                "1,700-token context skipped)")
    full = workload_gaps(sc, whole, all_pairs.attrs["selection"])  # nothing left out: as before
    assert full is not None and full.what == "trace turn gaps (arrival to arrival, as workload show)"
    scaled = trace_pairs(as_scenario({"workload": {"trace": {"path": str(SMALL), "time_scale": 2}}}), 1700)
    assert scaled is not None and sorted(scaled["gap_s"].tolist()) == [1.5, 5.0, 25.0]  # divided once
    # nothing left to replay: refused in one line before any run (every run would fail: no advice from nothing)
    with pytest.raises(KvplanInputError, match="nothing to replay"):
        recommend({"model": "qwen3-32b", "deployment": {"max_model_len": 600},
                   "workload": {"trace": {"path": str(SMALL)}}}, replications=1, ttl_grid=(30,), workers=1)


def test_recommend_on_trace_0046_says_what_is_replayed(agentx: Path) -> None:
    """The audited case: 1 of trace_0046.json's 68 requests fits qwen3-32b's 40,960 tokens, so no follow-up turn is
    replayed and no gap is quoted from the 67 others."""
    from kvplan.plan.advice_runs import no_follow_ups, trace_gap_sample, trace_pairs, workload_gaps
    from kvplan.sim.scenario import as_scenario

    sc = as_scenario({"model": "qwen3-32b", "workload": {"trace": {"path": str(agentx / "trace_0046.json")}}})
    pairs = trace_pairs(sc, 40960)
    assert pairs is not None and len(pairs) == 0
    assert workload_gaps(sc, trace_gap_sample(pairs), pairs.attrs["selection"]) is None
    assert no_follow_ups(pairs.attrs["selection"]) == ("no follow-up turns among the 1 of 68 trace requests replayed "
                                                       "(67 over the 40,960-token context skipped)")


def test_a_replay_whose_sessions_start_together_is_not_told_to_replay_a_longer_window() -> None:
    """ans12b: weka sessions all start at t = 0 (every file on its own clock), so recommend flagged every TTL "runs too
    short for steady state ... replay a longer window" (and compare every TTL row), though weka refuses window_s and
    no replay of such a trace, however long or large, has a stream of arrivals to be steady. The warning now says
    what limits the evidence (one cohort ramping up and draining) and what would give a steady judgement (a fitted
    workload at a Poisson rate); other traces and synthetic workloads keep their advice."""
    from kvplan.plan.advice import recommend
    from kvplan.plan.compare import compare
    from kvplan.sim.scenario import as_scenario

    sc = {"model": "qwen3-32b", "hardware": "p5en", "workload": {"trace": {"path": str(SMALL)}}}
    rec = recommend(sc, replications=1, ttl_grid=(30,), workers=1)
    text = " ".join(rec.warnings)
    assert "replay a longer window" not in text and "runs too short" not in text, rec.warnings
    from kvplan.plan.advice_report import COHORT_FIX, sessions_start_together

    assert any(w.startswith("no steady state at TTL 30 s: the trace's sessions all start together") and
               w.endswith(COHORT_FIX) for w in rec.warnings), rec.warnings
    assert any(w.startswith("the vLLM-defaults column (TTL 480 s) has no steady state either") for w in rec.warnings)
    assert rec.steady_state["sessions_start_together"] is True and rec.steady_state["unsteady_ttls_s"] == [30.0]
    row = compare(as_scenario(sc), ["ttl"], replications=1)[0]
    assert row["notes"][0].startswith("no steady state at TTL 480 s: the trace's sessions all start together"), row
    assert not any("longer window" in n for n in row["notes"])
    # what starts together: a weka trace (named or detected), not another trace format or a synthetic workload
    assert sessions_start_together(as_scenario({"workload": {"trace": {"path": str(SMALL), "format": "weka"}}}))
    assert not sessions_start_together(as_scenario({"workload": {"trace": {"path": str(DATA / "sessions_small.csv")}}}))
    assert not sessions_start_together(as_scenario({}))
