"""``kvplan compare``: one row per policy at equal GPUs, workload and seeds; reproducible; unmodelled policies refused."""

from __future__ import annotations

import json
import math
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import small

from kvplan.app.cli import main
from kvplan.errors import KvplanInputError
from kvplan.plan.compare import compare, parse_policies
from kvplan.sim.scenario import scenario_from_dict

KEYS = ("policy", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_mean_s", "tpot_mean_s", "hit_rate",
        "pinned_kv_gib_mean", "pinned_kv_gib_peak", "errors", "gpus")


def _scenario(tmp_path: Path) -> Path:
    data = small(deployment={"max_num_seqs": 64, "prefill_nodes": 1, "decode_nodes": 1})
    data["workload"]["conversations"] = 40
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def test_compare_json_keys_and_identical_seeds(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sc = _scenario(tmp_path)
    args = ["compare", str(sc), "--policies", "off,ttl,aggregated", "--replications", "2", "--json"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert main(args) == 0
    assert capsys.readouterr().out == first  # byte-identical
    rows = json.loads(first)
    assert [r["policy"] for r in rows] == ["off", "ttl", "aggregated"]
    for r in rows:
        assert all(k in r for k in KEYS)
        assert r["gpus"] == 16 and r["ttft_p90_s"] >= r["ttft_p50_s"] > 0
    off, ttl, agg = rows
    assert off["pinned_kv_gib_mean"] == 0 and ttl["pinned_kv_gib_mean"] > 0 and agg["pinned_kv_gib_peak"] == 0
    assert ttl["hit_rate"] > off["hit_rate"] == 0
    assert agg["settings"]["deployment.replicas"] == 2
    from kvplan.plan.pricing import COST_BASIS

    assert all(r["cost_basis"] == COST_BASIS and len(r["ttft_p90_s_by_replication"]) == 2 for r in rows)
    assert main(args[:-1]) == 0
    assert COST_BASIS in capsys.readouterr().out  # the text output states the basis too


def test_compare_tpot_from_turns() -> None:
    rows = compare(scenario_from_dict(small()), ["off"], replications=1)
    # per-turn (finish - first token) / (output - 1): the calibrated decode step at small batch is a few ms
    assert 0.001 < rows[0]["tpot_mean_s"] < 0.05


def test_compare_html_written_atomically(tmp_path: Path) -> None:
    sc = _scenario(tmp_path)
    out = tmp_path / "c.html"
    assert main(["compare", str(sc), "--policies", "off,aggregated", "--replications", "1", "--html", str(out)]) == 0
    text = out.read_text()
    assert "plotly" in text and "aggregated" in text
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize("policies,needle", [
    ("nope", "unknown policy"), ("off,off", "twice"), ("ttl:prefix_aware", "suffix"), ("aggregated:zigzag", "suffix"),
    ("lease:prefix_aware", "suffix"),
    ("", "empty"),
])
def test_bad_policy_lists_refused(policies: str, needle: str) -> None:
    with pytest.raises(KvplanInputError, match=needle):
        parse_policies(policies)


def test_unmodelled_policy_refused(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                   tmp_path: Path) -> None:
    import kvplan.plan.compare as cmp

    monkeypatch.setattr(cmp, "implemented", lambda name: name != "lease")
    assert "lease" not in cmp.parse_policies(None)
    assert main(["compare", str(_scenario(tmp_path)), "--policies", "off,lease"]) == 2
    assert "not modelled" in capsys.readouterr().err


def test_compare_max_load_meeting_slo() -> None:
    sc = scenario_from_dict(small())
    rows = compare(sc, ["off"], replications=1, slo_ttft_p90_ms=2000)
    r = rows[0]
    best = r["max_rate_per_s_meeting_slo"]
    assert r["ttft_p90_s"] < 2.0 and 0.5 <= best < 0.5 * 2**5  # met at the base rate, broken within 5 doublings
    from kvplan.plan.capacity import conversations_for
    from kvplan.sim.scenario import with_overrides

    def p90(rate: float) -> float:
        v = with_overrides(sc, {"workload.arrival.rate_per_s": rate, "workload.conversations": conversations_for(sc, rate)})
        return float(compare(v, ["off"], replications=1)[0]["ttft_p90_s"])

    assert p90(best) <= 2.0 < p90(best * 1.25)


def _row(policy: str, p90: float, pinned: float, errors: float = 0.0, ci: float = 0.0, peak: float = 0.0) -> dict:
    return {"policy": policy, "ttft_p90_s": p90, "ttft_p90_s_ci95": ci, "pinned_kv_gib_mean": pinned, "errors": errors,
            "turns": 1000.0, "pinned_kv_gib_peak": peak, "hit_rate": 0.5}


def test_best_policy_rule() -> None:
    from kvplan.plan.compare import best_policy

    rows = [_row("off", 0.300, 0.0), _row("ttl_recommended", 0.200, 50.0, peak=90.0), _row("lease", 0.201, 10.0, peak=40.0),
            _row("offload", 0.150, 80.0, errors=50.0)]
    # offload is fastest but errs on 5% of turns; lease is within 1% of the best p90 and holds least memory
    assert best_policy(rows)["policy"] == "lease"
    assert best_policy(rows, budget_gib=5.0)["policy"] == "off"
    assert best_policy(rows, slo_ttft_p90_ms=100)["why"].startswith("no policy")


def test_recommend_names_best_policy(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    p = _scenario(tmp_path)
    assert main(["recommend", str(p), "--json", "--replications", "1", "--ttl-grid", "30,60", "--workers", "1"]) == 0
    d = json.loads(capsys.readouterr().out)
    best = d["best_policy"]
    assert best["policy"] in {r["policy"] for r in best["compared"]}
    assert {r["policy"] for r in best["compared"]} == {"off", "ttl_recommended", "lease", "ttl_evictable", "offload",
                                                       "aggregated"}


def test_compare_counts_gpus_with_split_tp() -> None:
    d = small(deployment={"max_num_seqs": 64, "prefill_nodes": 2, "decode_nodes": 1, "tensor_parallel_size": 4,
                          "decode_tensor_parallel_size": 8})
    d["workload"]["conversations"] = 20
    rows = compare(scenario_from_dict(d), ["off", "aggregated"], replications=1)
    assert [r["gpus"] for r in rows] == [16, 16]  # 2 x TP4 + 1 x TP8
    assert rows[1]["settings"]["deployment.replicas"] == 4  # the same 16 GPUs as TP4 aggregated replicas
    with pytest.raises(KvplanInputError, match="whole number"):
        d["deployment"]["decode_tensor_parallel_size"] = 2
        compare(scenario_from_dict(d), ["aggregated"], replications=1)


def test_ttl_recommended_reuses_a_recommendation(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A recommendation the caller already has gives the same rows as rerunning the advisor, without rerunning it."""
    from kvplan.plan import advice
    from kvplan.sim.scenario import load_scenario

    path = _scenario(tmp_path)
    rec = advice.recommend(load_scenario(path), replications=1)
    rec_file = tmp_path / "rec.json"
    rec_file.write_text(rec.to_json())
    args = ["compare", str(path), "--policies", "off,ttl_recommended", "--replications", "1", "--json"]
    assert main(args) == 0  # runs the advisor itself
    rerun = capsys.readouterr().out

    def no_rerun(*_a: object, **_k: object) -> None:
        raise AssertionError("the advisor was rerun")

    monkeypatch.setattr(advice, "recommend", no_rerun)
    assert main([*args, "--recommendation", str(rec_file)]) == 0
    assert capsys.readouterr().out == rerun  # identical rows
    sc = load_scenario(path)
    assert compare(sc, ["ttl_recommended"], replications=1, recommendation=rec)[0]["settings"] == \
        json.loads(rerun)[1]["settings"]
    # another replication count (or scenario, SLO, budget, grid) is refused before any work, naming the option
    with pytest.raises(KvplanInputError, match=r"^--recommendation: .*replications"):
        compare(sc, ["ttl_recommended"], replications=2, recommendation=json.loads(rec.to_json()))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**json.loads(rec.to_json()), "kv_recompute_threshold_tokens": "64"}))
    assert main([*args, "--recommendation", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --recommendation {bad}: field 'kv_recompute_threshold_tokens'") and "Traceback" not in err


@pytest.mark.parametrize("field, value", [("decoder_kv_blocks_ttl_s", -5), ("router_ttl_s", 1e300),
                                          ("kv_recompute_threshold_tokens", -1), ("kv_load_failure_policy", "bogus")])
def test_a_recommendation_with_values_no_scenario_takes_is_refused_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, field: str, value: Any
) -> None:
    """An edited `recommend --json` file (its inputs intact) with a negative TTL or threshold, an absurd router TTL
    or an unknown failure policy ran the other policies first, then failed as 'scenario with overrides: ...'
    without naming the file."""
    import kvplan.plan.compare as cmp
    from kvplan.plan.advice import DEFAULT_TTL_GRID_S, recommendation_inputs
    from kvplan.sim.scenario import load_scenario

    path = _scenario(tmp_path)
    rec = {"bidirectional": True, "decoder_kv_blocks_ttl_s": 90, "kv_recompute_threshold_tokens": 64,
           "router_ttl_s": 84, "kv_load_failure_policy": "recompute",
           "inputs": recommendation_inputs(load_scenario(path), 1, DEFAULT_TTL_GRID_S, None, None), field: value}
    rec_file = tmp_path / "rec.json"
    rec_file.write_text(json.dumps(rec))

    def no_run(*_a: object, **_k: object) -> None:
        raise AssertionError("a simulation ran")

    monkeypatch.setattr(cmp, "run_tasks", no_run)
    argv = ["compare", str(path), "--policies", "off,ttl_recommended", "--replications", "1",
            "--recommendation", str(rec_file)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --recommendation") and f"'policy.{field}'" in err and err.count("\n") == 1, err


def test_best_policy_on_paired_differences_ties_to_the_cheaper() -> None:
    """The pick uses per-seed differences (common random numbers), not each row's own CI width: a policy always
    0.1 s slower is significantly worse even with wide per-row CIs; one whose difference is noise ties, and the
    tie goes to the cheaper policy (less pinned KV at equal $/M turns)."""
    from kvplan.plan.compare import best_policy

    def row(policy: str, reps: list[float], pinned: float, usd: float = 1000.0) -> dict:
        mean = sum(reps) / len(reps)
        return {**_row(policy, mean, pinned, ci=2.5), "ttft_p90_s_by_replication": reps, "usd_per_million_turns": usd}

    lo = row("ttl_recommended", [1.0, 2.0, 3.0], 50.0)
    slower = row("lease", [1.1, 2.1, 3.1], 10.0)  # +0.1 s at every seed: significant, beyond 1%
    noisy = row("aggregated", [0.5, 2.5, 3.3], 0.0)  # +0.1 s on average, differences -0.5..+0.5: not significant
    assert best_policy([lo, slower])["policy"] == "ttl_recommended"  # the old CI-width rule picked lease here
    best = best_policy([lo, slower, noisy])
    assert best["policy"] == "aggregated" and best["ties"] == ["ttl_recommended", "aggregated"]
    assert best["lowest_ttft_p90_policy"] == "ttl_recommended"
    # a tie that costs more per million turns loses to the cheaper one whatever its pinned KV
    assert best_policy([lo, row("aggregated", [0.5, 2.5, 3.3], 0.0, usd=1100.0)])["policy"] == "ttl_recommended"
    # one replication: within 1% is a tie, beyond it is not
    assert best_policy([row("a", [1.0], 5.0), row("b", [1.005], 1.0)])["policy"] == "b"
    assert best_policy([row("a", [1.0], 5.0), row("b", [1.05], 1.0)])["policy"] == "a"


def test_best_policy_excludes_saturated_policies_as_recommend_does() -> None:
    """ans12b: a policy that saturates a resource (its queue grows with the run) has a wide per-replication spread, so
    its paired difference to the lowest p90 ties, and it won on cost: compare named a saturated policy best.
    recommend's saturation rule (plan/advice_rules.py: a saturated TTL is not feasible; when every TTL saturates, the
    fewest replications) now applies to compare's best policy too."""
    from kvplan.plan.compare import BEST_RULE, best_policy

    def row(policy: str, reps: list[float], usd: float, saturated: dict[str, int] | None = None) -> dict:
        mean = sum(reps) / len(reps)
        sat = saturated or {}
        return {**_row(policy, mean, 1.0), "ttft_p90_s_by_replication": reps, "usd_per_million_turns": usd,
                "replications": len(reps), "saturated": list(sat), "saturated_replications": sat}

    fast = row("ttl_recommended", [1.0, 1.1, 1.2], 1000.0)
    # decode HBM saturated in 2 of 3 replications: p90 1 s, 9 s, 0.5 s; the paired differences' interval reaches 0
    cheap = row("aggregated", [1.0, 9.0, 0.5], 500.0, {"decode_kv": 2})
    best = best_policy([fast, cheap])
    assert best["policy"] == "ttl_recommended" and best["ties"] == ["ttl_recommended"] and best["why"] == ""
    assert [c["saturated"] for c in best["compared"]] == [[], ["decode_kv"]]
    assert "saturating no resource" in BEST_RULE
    # every policy saturates: the ones saturating in the fewest replications are compared, and it is said
    worse = row("ttl_recommended", [1.0, 1.1, 1.2], 1000.0, {"prefill_compute": 3})
    best = best_policy([worse, cheap])
    assert best["policy"] == "aggregated" and best["why"].startswith("every policy within the constraints saturates")
    assert best["why"].endswith("among those saturating in the fewest replications")
    # no policy meets the SLO: the unsaturated one still goes first
    best = best_policy([fast, cheap], slo_ttft_p90_ms=100)
    assert best["policy"] == "ttl_recommended" and best["why"].endswith("among those saturating nothing")
    # rows without saturation fields (older JSON) are unsaturated: as before
    assert best_policy([_row("off", 0.3, 0.0), _row("lease", 0.2, 1.0)])["policy"] == "lease"


def _long_pull_scenario() -> dict:
    d = small()
    d["workload"].update({"prefix_tokens": {"dist": "constant", "value": 30000}, "conversations": 30,
                          "turns": {"dist": "constant", "value": 4}})
    return d


def test_compare_tries_cross_layer_blocks_when_the_pull_dominates() -> None:
    from kvplan.models.arch import descriptors_per_transfer, get_model

    rows = compare(scenario_from_dict(_long_pull_scenario()), ["off", "ttl"], replications=1)
    assert [r["policy"] for r in rows] == ["off", "ttl", "ttl+cross_layer"]
    ttl, xl = rows[1], rows[2]
    assert ttl["kv_pull_mean_s"] >= 0.3 * ttl["ttft_mean_s"]
    assert xl["settings"]["deployment.cross_layer_blocks"] is True and xl["kv_pull_mean_s"] < ttl["kv_pull_mean_s"] / 5
    arch = get_model("qwen3-32b")
    note = xl["notes"][-1]
    n = int(note.split("a mean pull of ")[1].split(" tokens")[0].replace(",", ""))
    assert f"{descriptors_per_transfer(arch, n):,} NIXL descriptors" in note
    assert f"{descriptors_per_transfer(arch, n, True):,} with cross-layer" in note
    # already on, or pulls a small part of TTFT: no extra row
    on = _long_pull_scenario()
    on["deployment"]["cross_layer_blocks"] = True
    assert [r["policy"] for r in compare(scenario_from_dict(on), ["ttl"], replications=1)] == ["ttl"]
    short = small()
    short["workload"]["prefix_tokens"] = {"dist": "constant", "value": 100}
    rows = compare(scenario_from_dict(short), ["ttl"], replications=1)
    assert [r["policy"] for r in rows] == ["ttl"] and rows[0]["kv_pull_mean_s"] < 0.3 * rows[0]["ttft_mean_s"]


def test_compare_text_prints_times_in_human_units_and_marks_saturation() -> None:
    """A saturated run's TTFT prints in the units human_s picks (not '431000' ms) and its health row says SATURATED
    with the resource its health section names."""
    from kvplan.app.cmd_compare import render_text
    from kvplan.units import human_s

    wl = {**small()["workload"], "conversations": 40, "turns": {"dist": "constant", "value": 1}}
    sc = scenario_from_dict(small(workload=wl, deployment={"max_num_seqs": 64, "decode_kv_capacity_tokens": 12_000}))
    rows = compare(sc, ["off", "ttl"], replications=1)
    off, ttl = rows
    assert ttl["saturated"] == ["decode_kv"] and off["saturated"] == []
    text = render_text(rows)
    health = next(ln for ln in text if ln.startswith("health"))
    assert "SATURATED: D HBM" in health and health.split()[1] == "ok"
    p50 = next(ln for ln in text if ln.startswith("TTFT p50"))
    assert human_s(ttl["ttft_p50_s"]) in p50 and human_s(off["ttft_p50_s"]) in p50
    assert ttl["ttft_p50_s"] > 1.0 and f"{ttl['ttft_p50_s'] * 1000:.0f}" not in p50  # not raw milliseconds
    assert any(ln.startswith("SATURATED:") for ln in text)


def test_recommend_policies_reuses_the_advisors_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``recommend --policies`` does not rerun what the advisor simulated (bidirectional off, the recommended
    configuration, same scenario and seeds): fewer runs, the same best policy as rerunning them."""
    import kvplan.plan.executor as executor
    from kvplan.plan.advice import recommend_simulated
    from kvplan.plan.compare import (
        BEST_CANDIDATES,
        best_policy,
        recommend_with_best_policy,
        recommendation_overrides,
    )
    from kvplan.sim.scenario import load_scenario

    runs = [0]
    real = executor.run_task

    def counting(*a: object) -> dict:
        runs[0] += 1
        return real(*a)  # type: ignore[arg-type]

    monkeypatch.setattr(executor, "run_task", counting)
    sc = load_scenario(_scenario(tmp_path))
    rec = recommend_with_best_policy(sc, replications=2, ttl_grid=(30, 60))
    reused = runs[0]
    runs[0] = 0
    plain, simulated = recommend_simulated(sc, replications=2, ttl_grid=(30, 60))
    rows = compare(simulated, list(BEST_CANDIDATES), replications=2, recommended=recommendation_overrides(plain))
    assert rec.bidirectional  # so that both the off and the recommended runs are reusable
    assert runs[0] - reused == 2 * 2  # off and ttl_recommended, 2 replications each
    assert rec.best_policy == best_policy(rows)
    assert rec.to_json() == replace(plain, best_policy=best_policy(rows)).to_json()


def _text_row(policy: str, replications: int, ci: float) -> dict[str, Any]:
    """A compare row of fixed values for the text table: every metric ``ci`` wide (exactly 0: all replications
    agree), or NaN as with one replication."""
    from kvplan.plan.compare import METRICS

    row: dict[str, Any] = {"policy": policy, "gpus": 16, "saturated": [], "replications": replications, "seed": 0,
                           "description": policy, "notes": [], "slo_ttft_p90_ms": None}
    for k in METRICS:
        row[k], row[f"{k}_ci95"] = 0.5, ci
    return row


def test_compare_text_caps_the_engine_busy_share_at_100_percent() -> None:
    """ans12b: the "prefill/engine util %" line printed the steady-window busy share raw (e.g. 104.0: a step straddling
    the window's edges) where the health lines print it at most 100%. The table and the dashboard now cap the shown
    share and say so; the JSON rows keep the raw figure."""
    from kvplan.app.cmd_compare import render_text
    from kvplan.app.dash_compare import compare_display_frame
    from kvplan.plan.compare import compare_json

    busy = {**_text_row("aggregated", 3, 0.02), "prefill_utilization_steady": 1.04}
    rows = [_text_row("off", 3, 0.01), busy]
    text = render_text(rows)
    line = next(ln for ln in text if ln.startswith("prefill/engine util %"))
    assert "104.0" not in line and line.split()[-2:] == ["100.0", "±2.0"], line
    assert "50.0 ±1.0" in line  # a share at most 1 prints as before
    assert json.loads(compare_json(rows))[1]["prefill_utilization_steady"] == 1.04  # raw in JSON
    assert compare_display_frame(rows)["prefill/engine util"].tolist() == ["50.0%", "100.0%"]
    from kvplan.app.cmd_compare import CAPPED_NOTE

    assert CAPPED_NOTE in text
    assert CAPPED_NOTE not in render_text([_text_row("off", 3, 0.01)])  # nothing capped: no note


def test_compare_text_shows_every_ci_with_replications_and_none_with_one() -> None:
    """With more than one replication every cell prints its CI, a CI of exactly 0 too (not '92.3 ±2.8' next to a
    bare '0.0'); with one replication no cell does, and the footnote says so."""
    from kvplan.app.cmd_compare import render_text
    from kvplan.app.dash_compare import compare_display_frame

    text = render_text([_text_row("off", 3, 0.0), _text_row("ttl", 3, 0.01)])
    for label in ("TTFT p50", "TPOT mean", "pinned KV mean GiB", "errors", "prefill/engine util %"):
        line = next(ln for ln in text if ln.startswith(label))
        assert line.count("±") == 2, line
    assert "500.0 ms ±0.0 ms" in next(ln for ln in text if ln.startswith("TTFT p50"))
    # a share's CI is its range clipped to 0-100% (a t interval of few replications can be wider than the scale)
    hit = next(ln for ln in text if ln.startswith("hit rate %"))
    assert hit.count("[") == 2 and "50.0 [50.0-50.0]" in hit, hit
    wide = render_text([{**_text_row("off", 2, 0.0), "hit_rate": 0.6, "hit_rate_ci95": 3.177}])
    assert "60.0 [0.0-100.0]" in next(ln for ln in wide if ln.startswith("hit rate %"))
    assert any(ln.startswith("(± 95% CI over 3 replications") for ln in text)
    single = render_text([_text_row("off", 1, math.nan), _text_row("ttl", 1, 0.0)])
    assert not any("±" in ln for ln in single if not ln.startswith("(")), single
    assert any(ln.startswith("(no ±: one replication has no CI") for ln in single)
    frame = compare_display_frame([_text_row("off", 3, 0.0), _text_row("ttl", 1, 0.0)])
    assert "±" in frame["TTFT p50"].iloc[0] and "±" not in frame["TTFT p50"].iloc[1]


def test_compare_text_columns_never_run_together() -> None:
    """Every cell is right-aligned in a column at least two spaces wider than the widest cell of any row: the
    hit-rate row of 0% and 100% shares read '0.0 [0.0-0.0]100.0 [100.0-100.0]' (its width ignored those rows)."""
    from kvplan.app.cmd_compare import render_text

    rows = [{**_text_row(p, 3, 0.0), "hit_rate": h, "reuse_rate": h, "usd_per_million_turns": 1.234e9}
            for p, h in (("off", 0.0), ("ttl", 1.0), ("ttl+cross_layer", 1.0))]
    text = render_text(rows)
    hit = next(ln for ln in text if ln.startswith("hit rate %"))
    cells = [c.strip() for c in re.split(r"\s{2,}", hit[24:].strip())]
    assert cells == ["0.0 [0.0-0.0]", "100.0 [100.0-100.0]", "100.0 [100.0-100.0]"], hit
    table = text[:text.index(next(ln for ln in text if ln.startswith("(")))]
    assert len({len(ln) for ln in table}) == 1, table  # one width per column, on every row
    width = (len(table[0]) - 24) // 3
    for ln in table:
        for k in range(3):
            cell = ln[24 + k * width: 24 + (k + 1) * width]
            assert cell.startswith("  ") and cell.strip(), (ln, k)


def test_advice_and_compare_report_the_steady_window_utilisation() -> None:
    """P nearly always busy while 40 long prompts arrive, then idle while D decodes 3,000 tokens each: the advisor's
    metrics and compare's util row take the health section's steady-window figure (> 80%, so prefill compute
    binds), not the whole-run one the drain dilutes to under half (tests/test_health.py, same scenario)."""
    from kvplan.plan.advice_rules import PREFILL_UTILIZATION_COLUMN, TURN_GAPS, binding_constraint, metrics
    from kvplan.plan.executor import run_row
    from kvplan.sim.seeds import replication_seeds

    wl = {**small()["workload"], "conversations": 40, "arrival": {"kind": "poisson", "rate_per_s": 2.0},
          "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 16000},
          "output_tokens": {"dist": "constant", "value": 3000}}
    sc = scenario_from_dict(small(workload=wl, policy={"bidirectional": False}))
    row = run_row(sc, replication_seeds(sc.seed, 1)[0])
    assert row[PREFILL_UTILIZATION_COLUMN] > 0.8 and row["prefill_utilization"] < 0.5
    m = metrics([row], sc.deployment.max_num_seqs, sc.deployment.decode_nodes)
    assert m["prefill_utilization_steady"] == row[PREFILL_UTILIZATION_COLUMN]
    assert m["prefill_utilization"] == row["prefill_utilization"]  # the whole-run share, as before 5c5ab7a
    assert binding_constraint(TURN_GAPS, m, {}, False) == "prefill compute"
    (off,) = compare(sc, ["off"], replications=1)
    assert off["prefill_utilization_steady"] == row[PREFILL_UTILIZATION_COLUMN]
    assert off["prefill_utilization"] == row["prefill_utilization"]


def test_a_closed_loop_is_priced_over_its_active_span() -> None:
    """The published benchmark is a closed loop (2 clients): its last new conversation starts ~12 s in, so the
    arrival-based window [t_b / 2, t_b] held a handful of first turns and priced off and ttl alike (42,227 $ per M
    turns each, though ttl serves more turns per second). The window is now the active span: the rate is every
    finished turn over first arrival -> last response."""
    from kvplan.plan.executor import run_extras
    from kvplan.sim.api import run
    from kvplan.sim.defaults import published_benchmark

    for on in (False, True):
        res = run(published_benchmark(bidirectional=on))
        x = run_extras(res)
        t = res.turns[res.turns["decision"] != "error"]
        span = float(res.turns["finish_s"].max() - res.turns["arrival_s"].min())
        assert x["steady_served_turns_per_s"] == pytest.approx(t["finish_s"].notna().sum() / span)
        assert x["steady_window_s"] == pytest.approx(span)


def test_a_ttl_run_too_short_for_steady_state_is_noted() -> None:
    """ans12: `compare --workload tool-agent --rate 1 --conversations 150` showed the vLLM-defaults row (TTL 480 s) at
    TTFT p90 404 ms, health ok, beside retention off at 402 ms: over 150 s of arrivals its pins never expire, while
    a run long enough for TTL 480 s saturates decode HBM (p90 37 s). recommend flags such runs; compare said
    nothing. Its TTL rows now carry the note, and only when their run is too short."""
    from kvplan.sim.presets import preset_scenario

    note = "run too short for steady state at TTL 480 s"
    rows = {r["policy"]: r for r in compare(preset_scenario("tool-agent", rate_per_s=1.0, conversations=40),
                                            policies="off,ttl,ttl_evictable", replications=1)}
    assert not rows["ttl"]["saturated"] and any(n.startswith(note) for n in rows["ttl"]["notes"]), rows["ttl"]["notes"]
    assert any(n.startswith(note) for n in rows["ttl_evictable"]["notes"])
    assert not any("steady state" in n for n in rows["off"]["notes"])
    calm = {r["policy"]: r for r in compare(preset_scenario("tool-agent", rate_per_s=0.05, conversations=40),
                                            policies="ttl", replications=1)}  # 800 s of arrivals: steady
    assert not any("steady state" in n for n in calm["ttl"]["notes"]), calm["ttl"]["notes"]


def test_conversations_cut_at_the_context_limit_are_noted() -> None:
    """ans12: compare on the coding-agent preset with qwen3-32b cut 9 of 10 conversations at the 40,960-token limit
    without a word; every row now says so (and capacity in its notes)."""
    from kvplan.plan.capacity import plan_capacity
    from kvplan.sim.presets import preset_scenario

    sc = preset_scenario("coding-agent", conversations=10)
    for row in compare(sc, policies="off,ttl", replications=1):
        assert any(n.startswith("9 of 10 (90%) conversation(s) per run were cut at the model's context limit")
                   for n in row["notes"]), row["notes"]
    plan = plan_capacity(sc, None, 60000.0, max_nodes=2, replications=1, ttl_grid=(60.0,), max_rate=False)
    # (its judging runs are 4x as long: 36 of 40 cut)
    assert any(n.startswith("WARNING: 36 of 40 (90%) conversation(s) per run were cut") for n in plan.notes), plan.notes


def test_recommend_says_a_cut_workload_under_its_headline(capsys: pytest.CaptureFixture[str]) -> None:
    """coding-agent on qwen3-32b: 18 of 20 conversations cut at 40,960 tokens. The advice describes that shorter
    workload, so the warning (with the share) stands under the headline, not after forty lines of rationale."""
    assert main(["recommend", "--workload", "coding-agent", "--conversations", "20", "--replications", "1",
                 "--no-policies", "--ttl-grid", "30,60"]) == 0
    lines = capsys.readouterr().out.splitlines()
    first_blank = lines.index("")
    cut = [i for i, line in enumerate(lines) if "per run were cut at the model's context limit" in line]
    assert len(cut) == 1 and cut[0] < first_blank, lines[:first_blank + 1]
    assert "18 of 20 (90%) conversation(s)" in lines[cut[0]]


def test_recommended_row_includes_an_adopted_cross_layer_flag() -> None:
    """The recommendation's deployable config carries the cross-layer flag its trial adopted, so compare's row for
    it simulates that deployment; a trial that did not adopt it (or retention off) adds nothing."""
    from kvplan.plan.compare import recommendation_overrides

    rec: dict[str, Any] = {"bidirectional": True, "decoder_kv_blocks_ttl_s": 60, "kv_recompute_threshold_tokens": 500,
                           "router_ttl_s": 50, "kv_load_failure_policy": "recompute", "transfer": {"adopted": True}}
    ov, what = recommendation_overrides(rec)
    assert ov["deployment.cross_layer_blocks"] is True and "cross-layer" in what
    for transfer in ({"adopted": False}, {}, None):
        ov, _ = recommendation_overrides({**rec, "transfer": transfer})
        assert "deployment.cross_layer_blocks" not in ov
    ov, _ = recommendation_overrides({**rec, "bidirectional": False})
    assert "deployment.cross_layer_blocks" not in ov
    # retention off whose own trial (the off deployment's P->D reads) adopted the flag: its row runs it
    off = {**rec, "bidirectional": False, "transfer": {"adopted": True, "tried_on": "bidirectional off"}}
    ov, what = recommendation_overrides(off)
    assert ov["deployment.cross_layer_blocks"] is True and what == "retention off, cross-layer blocks"


def test_cost_per_million_turns_carries_its_ci(capsys: pytest.CaptureFixture[str]) -> None:
    """The '$ per M turns' row was the only one printed without its CI, under a footnote saying every figure is
    ± its 95% CI: on 2P2D p5en, 150 conversations, 2 replications, off 143,977 and ttl 146,685 (+1.9% for the same
    offered load, neither saturated) read as a difference, while the steady served rate it divides by is uncertain
    by ±22% (off) and ±49% (ttl): 143,977 ±32,105 and 146,685 ±71,920. The row and the JSON now carry it
    (first-order: the rate's relative half-width), recomputed here from the rows' served rates."""
    from kvplan.app.cmd_compare import render_text

    sc = scenario_from_dict({"deployment": {"prefill_nodes": 2, "decode_nodes": 2},
                             "workload": {"conversations": 60}})
    rows = compare(sc, ["off", "ttl"], replications=2)
    for r in rows:
        rate, ci = r["steady_served_turns_per_s"], r["steady_served_turns_per_s_ci95"]
        assert r["usd_per_million_turns"] == pytest.approx(4 * 63.3 / 3600 / rate * 1e6)
        assert r["usd_per_million_turns_ci95"] == pytest.approx(r["usd_per_million_turns"] * ci / rate)
        assert r["usd_per_million_turns_ci95"] > 0
    line = next(ln for ln in render_text(rows) if ln.startswith("$ per M turns"))
    assert line.count("±") == 2


def test_compare_text_says_a_note_every_policy_has_once() -> None:
    """The workload cut at the context limit is every policy's note: the tool-agent preset printed the same 250
    characters once per column (seven times); now once as 'every policy:', each policy's own notes on its line."""
    from kvplan.app.cmd_compare import render_text

    cut = "7 of 1,000 (1%) conversation(s) per run were cut at the model's context limit"
    rows = [{**_text_row(p, 3, 0.0), "notes": [cut, *own]} for p, own in
            (("off", []), ("ttl", ["run too short for steady state at TTL 480 s"]), ("lease", ["lease 30 s"]))]
    text = render_text(rows)
    assert sum(cut in ln for ln in text) == 1 and f"every policy: {cut}" in text
    assert "ttl: ttl; run too short for steady state at TTL 480 s" in text and "off: off" in text
    assert "lease: lease; lease 30 s" in text
    solo = render_text([{**_text_row("off", 3, 0.0), "notes": [cut]}])  # one column: its note on its line
    assert f"off: off; {cut}" in solo and not any(ln.startswith("every policy") for ln in solo)


def test_a_recommendation_of_retention_off_is_described_as_that(tmp_path: Path) -> None:
    """When recommend answers retention off, the ttl_recommended column runs the off deployment: it was described
    as 'bidirectional at kvplan recommend's TTL, threshold and router TTL (...) (retention off)'."""
    from kvplan.plan import advice
    from kvplan.plan.compare import RECOMMENDED_OFF
    from kvplan.sim.scenario import load_scenario

    sc = load_scenario(_scenario(tmp_path))
    rec = json.loads(advice.recommend(sc, replications=1).to_json())
    off = {**rec, "bidirectional": False, "retention_off": True}
    rows = compare(sc, ["off", "ttl_recommended"], replications=1, recommendation=off)
    assert rows[1]["description"] == RECOMMENDED_OFF and "bidirectional at" not in rows[1]["description"]
    assert rows[1]["settings"]["policy.bidirectional"] is False
    assert rows[1]["ttft_p90_s"] == rows[0]["ttft_p90_s"]  # the same deployment, the same seeds
    if rec["bidirectional"]:  # a recommendation with retention on keeps its values in the description
        on = compare(sc, ["ttl_recommended"], replications=1, recommendation=rec)[0]["description"]
        assert on.startswith("bidirectional at kvplan recommend's TTL") and f"TTL {rec['decoder_kv_blocks_ttl_s']} s" in on


def test_every_policy_of_one_comparison_is_priced_over_one_window() -> None:
    """Retention off, vLLM's TTL and aggregated replicas on the same seed: every row's steady served rate (the cost's
    divisor) counts the turns finished in the second half of the arrival window, [t_b / 2, t_b], t_b the last
    conversation's first arrival, computed here from the turns. The window used to start at min(t_b / 2, TTL + p90
    conversation span): off's (TTL 0) reached into the ramp-up and priced it 2.7% above a 10 s TTL on this
    scenario from the window alone, more than compare's 1% cost tie-break (plan/pricing.py)."""
    from kvplan.models.hardware import get_hardware
    from kvplan.plan.executor import run_extras
    from kvplan.sim.api import run
    from kvplan.sim.scenario import with_overrides
    from kvplan.sim.seeds import replication_seeds

    data = small(deployment={"max_num_seqs": 64, "prefill_prefix_caching": False, "tensor_parallel_size": 2,
                             "prefill_nodes": 2, "decode_nodes": 2})
    data["workload"].update({"conversations": 200, "arrival": {"kind": "poisson", "rate_per_s": 2.0},
                             "turns": {"dist": "uniform", "low": 2, "high": 4},
                             "turn_gap_s": {"dist": "exponential", "mean": 5}})
    sc = scenario_from_dict(data)
    rows = compare(sc, ["off", "ttl", "aggregated"], replications=1)
    seed = replication_seeds(sc.seed, 1)[0]
    node = get_hardware(sc.hardware)
    windows = set()
    for row in rows:
        res = run(with_overrides(sc, row["settings"]), seed)
        t = res.turns
        t_b = float(t.loc[t["turn"] == 1, "arrival_s"].max())
        t_a = max(float(t["arrival_s"].min()), t_b / 2)
        fin = t.loc[t["decision"] != "error", "finish_s"]
        rate = float(((fin >= t_a) & (fin <= t_b)).sum() / (t_b - t_a))
        assert row["steady_served_turns_per_s"] == pytest.approx(rate, rel=1e-12), row["policy"]
        billed = row["gpus"] / node.gpus_per_node
        assert row["usd_per_million_turns"] == pytest.approx(billed * node.usd_per_hour / 3600 / rate * 1e6, rel=1e-12)
        x = run_extras(res)
        assert (x["priced_window_start_s"], x["priced_window_end_s"]) == pytest.approx((t_a, t_b), rel=1e-12)
        windows.add((x["priced_window_start_s"], x["priced_window_end_s"]))
    assert len(windows) == 1  # one window for the three policies
