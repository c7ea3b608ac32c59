"""Sweeps: grid validation before any work, rows and aggregates, CRN seeds, SIGKILL + resume byte identity,
local pool == in-process == Ray, and the analytic screen against the simulator."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy import stats

import kvplan.plan.executor as executor
from kvplan.app.cli import main
from kvplan.errors import KvplanInputError
from kvplan.plan.grid import MAX_POINTS, as_grid, grid_from_dict, load_grid
from kvplan.plan.screen import screen_scenarios
from kvplan.plan.sweep import aggregate, analytic_screen, load_results, parts_dir, run_grid
from kvplan.sim.scenario import with_overrides

BASE: dict[str, Any] = {
    "model": "qwen3-32b",
    "hardware": "p5en",
    "deployment": {"max_num_seqs": 64, "prefill_prefix_caching": False},
    "workload": {
        "conversations": 30,
        "arrival": {"kind": "poisson", "rate_per_s": 0.5},
        "turns": {"dist": "constant", "value": 3},
        "prefix_tokens": {"dist": "lognormal", "median": 3000, "sigma": 0.5},
        "turn_gap_s": {"dist": "exponential", "mean": 20},
    },
    "seed": 3,
}


def grid(**over: Any) -> dict[str, Any]:
    g: dict[str, Any] = {
        "base": BASE,
        "axes": {"policy.decoder_kv_blocks_ttl_s": [10, 60, 480], "workload.turn_gap_s.mean": [5, 50]},
        "replications": 2,
    }
    g.update(over)
    return g


def _write_grid(tmp_path: Path, data: Any) -> Path:
    p = tmp_path / "grid.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


# --- acceptance 6: bad grids fail in one line before any work ---------------------------------------------

BIG_TURNS = grid(base={**BASE, "workload": {**BASE["workload"], "conversations": 1_000_000}},
                 axes={"policy.decoder_kv_blocks_ttl_s": list(range(10, 110))}, replications=4)

BAD = [
    ("unknown dotted path", grid(axes={"policy.decoder_ttl": [1, 2]}), "unknown scenario field 'policy.decoder_ttl'"),
    ("unknown leaf", grid(axes={"workload.turn_gap_s.foo": [1]}), "workload.turn_gap_s.foo"),
    ("empty axis", grid(axes={"policy.decoder_kv_blocks_ttl_s": []}), "is empty"),
    ("value twice", grid(axes={"policy.decoder_kv_blocks_ttl_s": [30, 60, 30.0]}), "lists 30.0 twice"),
    ("mapping twice", grid(axes={"workload.turn_gap_s": [{"dist": "constant", "value": 5},
                                                         {"value": 5, "dist": "constant"}]}), "twice"),
    ("not a list", grid(axes={"policy.decoder_kv_blocks_ttl_s": 30}), "must be a list"),
    ("wrong type", grid(axes={"policy.decoder_kv_blocks_ttl_s": [30, "abc"]}), "decoder_kv_blocks_ttl_s"),
    ("negative", grid(axes={"policy.decoder_kv_blocks_ttl_s": [30, -1]}), "greater than or equal to 0"),
    ("dist param of another dist", grid(axes={"workload.turn_gap_s.median": [5]}), "median"),
    ("10^7 points", grid(axes={f"policy.{k}": list(range(10)) for k in (
        "decoder_kv_blocks_ttl_s", "kv_recompute_threshold_tokens", "router_ttl_s", "expiry_safety_margin_s",
        "clock_skew_s")} | {"workload.conversations": list(range(1, 11)), "deployment.max_num_seqs": list(range(1, 11))}),
     "10,000,000 points"),
    ("unknown model", grid(axes={"model": ["qwen3-32b", "nope"]}), "unknown model 'nope'"),
    ("tp too large", grid(axes={"deployment.tensor_parallel_size": [8, 16]}), "exceeds the 8 GPUs"),
    ("unknown key", {**grid(), "axis": {}}, "unknown grid key"),
    ("seed axis", grid(axes={"seed": [1, 2]}), "seeds are set by the grid"),
    ("seed negative", grid(seed=-1), "seed: must be an integer in 0..9223372036854775807"),
    ("seed beyond 64 bits", grid(seed=10**22), "seed: must be an integer in 0..9223372036854775807"),
    ("seed a string", grid(seed="7"), "seed: must be an integer in 0..9223372036854775807"),
    ("bad replications", grid(replications=0), "replications"),
    ("no base", {"axes": {}}, "missing 'base:'"),
    ("tie not parsed", grid(ties={"policy.router_ttl_s": "__import__('os').system('x')"}), "cannot parse"),
    ("tie call", grid(ties={"policy.router_ttl_s": "abs(policy.decoder_kv_blocks_ttl_s)"}), "cannot parse"),
    ("tie to a non-axis", grid(ties={"policy.router_ttl_s": "policy.clock_skew_s - 1"}), "is not an axis"),
    ("tie on an axis", grid(ties={"workload.turn_gap_s.mean": "policy.decoder_kv_blocks_ttl_s"}), "is also an axis"),
    ("tie unknown path", grid(ties={"policy.router_tl": "policy.decoder_kv_blocks_ttl_s"}), "unknown scenario field"),
    ("tie out of range", grid(ties={"policy.router_ttl_s": "policy.decoder_kv_blocks_ttl_s - 100"}),
     "router_ttl_s"),
    ("ties not a mapping", grid(ties=["a"]), "ties"),
    ("zip lengths", grid(zip=[{"policy.router_ttl_s": [1, 2], "policy.clock_skew_s": [1]}]), "same length"),
    ("zip twice", grid(zip=[{"policy.decoder_kv_blocks_ttl_s": [1, 2]}]), "is an axis twice"),
    ("zip not a list", grid(zip={"policy.router_ttl_s": [1]}), "must be a list of groups"),
    # review2: an empty section of the wrong kind is an error (was silently a grid without it)
    ("ties empty list", grid(ties=[]), "ties: must be a mapping"),
    ("zip empty mapping", grid(zip={}), "must be a list of groups"),
    ("axes empty list", grid(axes=[]), "axes: must be a mapping"),
    # review2: a path inside another would take whichever override was applied last
    ("axis inside an axis", grid(axes={"workload.turn_gap_s": [{"dist": "exponential", "mean": 5}],
                                       "workload.turn_gap_s.mean": [5, 50]}), "lies inside 'workload.turn_gap_s'"),
    ("tie inside an axis", grid(axes={"policy.decoder_kv_blocks_ttl_s": [10, 60],
                                      "workload.turn_gap_s": [{"dist": "exponential", "mean": 5}]},
                                ties={"workload.turn_gap_s.mean": "policy.decoder_kv_blocks_ttl_s"}), "lies inside"),
    ("zip inside a tie", grid(zip=[{"policy.router_ttl_s": [1, 2]}], ties={"policy": "policy.router_ttl_s"}),
     "lies inside 'policy'"),
    ("tie self-reference", grid(ties={"policy.router_ttl_s": "policy.router_ttl_s - 1"}), "is not an axis"),
    ("tie to a tie", grid(ties={"policy.router_ttl_s": "policy.decoder_kv_blocks_ttl_s - 10",
                                "policy.clock_skew_s": "policy.router_ttl_s"}), "is not an axis"),
    ("tie too long", grid(ties={"policy.router_ttl_s": "1" * 300}), "cannot parse"),
    ("tie overflows", grid(ties={"policy.router_ttl_s": "policy.decoder_kv_blocks_ttl_s * 1e308"}), "gives inf"),
    ("tie negative TTL", grid(ties={"policy.router_ttl_s": "policy.decoder_kv_blocks_ttl_s * -1"}),
     "greater than or equal to 0"),
    # 400 runs is well within MAX_RUNS, but each plans 3M turns: 1.2e9 turns (hours of CPU) started without --yes
    ("1.2e9 turns", BIG_TURNS, "1,200,000,000 simulated turns"),
    ("1.2e9 turns on a workload axis", grid(axes={"workload.conversations": [30, 1_000_000],
                                                  "policy.decoder_kv_blocks_ttl_s": list(range(10, 110))},
                                            replications=4), "1,200,036,000 simulated turns"),
]


@pytest.mark.parametrize("name,data,needle", BAD, ids=[b[0] for b in BAD])
def test_bad_grid_one_line_before_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                       name: str, data: Any, needle: str) -> None:
    def boom(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("a simulation started")

    monkeypatch.setattr(executor, "run_row", boom)
    out = tmp_path / "r.parquet"
    t0 = time.perf_counter()
    with pytest.raises(KvplanInputError) as exc:
        run_grid(data, out=out)
    msg = str(exc.value)
    assert "\n" not in msg and needle in msg, msg
    assert not out.exists() and not parts_dir(out).exists()
    assert time.perf_counter() - t0 < 5
    assert main(["sweep", str(_write_grid(tmp_path, data)), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and needle in err[0]
    assert not out.exists()


def test_yes_allows_large_grid_count() -> None:
    axes = {"policy.decoder_kv_blocks_ttl_s": list(range(1001)), "policy.router_ttl_s": list(range(1000))}
    with pytest.raises(KvplanInputError, match="1,001,000 points"):
        grid_from_dict(grid(axes=axes))
    g = grid_from_dict(grid(axes=axes), yes=True, validate_points=False)
    assert g.n_points == 1_001_000 > MAX_POINTS
    assert g.point_overrides(1_000_999) == {"policy.decoder_kv_blocks_ttl_s": 1000, "policy.router_ttl_s": 999}
    assert grid_from_dict(BIG_TURNS, yes=True).n_points == 100  # --yes allows more than MAX_TURNS too


def test_replications_override_is_bounded_by_turns_too(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("a simulation started")

    monkeypatch.setattr(executor, "run_row", boom)
    with pytest.raises(KvplanInputError, match="1,200,000,000 simulated turns"):
        run_grid(grid_from_dict(BIG_TURNS | {"replications": 3}), replications=4)
    with pytest.raises(KvplanInputError, match="1,200,000,000 simulated turns"):  # a Grid built with yes=True
        run_grid(grid_from_dict(BIG_TURNS, yes=True))


def test_ties_and_zipped_axes() -> None:
    """A tied path follows its axis (parsed, never evaluated); zipped paths vary together as one dimension; both
    are sweep columns and enter the --resume fingerprint, which stays the same for a grid that uses neither."""
    g = grid_from_dict(grid(axes={"policy.decoder_kv_blocks_ttl_s": [60, 90, 120]},
                            zip=[{"workload.turn_gap_s.mean": [5, 50], "workload.conversations": [20, 10]}],
                            ties={"policy.router_ttl_s": "policy.decoder_kv_blocks_ttl_s - 10",
                                  "policy.clock_skew_s": "0.01 * policy.decoder_kv_blocks_ttl_s"}))
    assert g.n_points == 6
    assert g.axis_names == ["policy.decoder_kv_blocks_ttl_s", "workload.turn_gap_s.mean", "workload.conversations",
                            "policy.router_ttl_s", "policy.clock_skew_s"]
    assert [g.point_values(i) for i in (0, 1, 5)] == [(60, 5, 20, 50, 0.6), (60, 50, 10, 50, 0.6),
                                                      (120, 50, 10, 110, 1.2)]
    assert isinstance(g.point_values(0)[3], int)
    assert g.scenario(3).policy.router_ttl_s == 80 and g.scenario(3).workload.conversations == 10
    plain = grid_from_dict(grid(axes={"policy.decoder_kv_blocks_ttl_s": [60, 90, 120]}))
    other = grid_from_dict(grid(axes={"policy.decoder_kv_blocks_ttl_s": [60, 90, 120]},
                                ties={"policy.router_ttl_s": "policy.decoder_kv_blocks_ttl_s - 20"}))
    tied = grid_from_dict(grid(axes={"policy.decoder_kv_blocks_ttl_s": [60, 90, 120]},
                               ties={"policy.router_ttl_s": "policy.decoder_kv_blocks_ttl_s - 10"}))
    assert len({plain.fingerprint(), other.fingerprint(), tied.fingerprint(), g.fingerprint()}) == 4
    import dataclasses
    assert dataclasses.replace(tied, ties=()).fingerprint() == plain.fingerprint()


def test_tied_sweep_writes_the_tied_column(tmp_path: Path) -> None:
    data = grid(axes={"policy.decoder_kv_blocks_ttl_s": [30, 60]}, replications=1,
                ties={"policy.router_ttl_s": "policy.decoder_kv_blocks_ttl_s - 10"})
    df = run_grid(data, out=tmp_path / "t.parquet")
    assert df["policy.router_ttl_s"].tolist() == [20, 50]
    assert df["policy.decoder_kv_blocks_ttl_s"].tolist() == [30, 60]


# --- rows, seeds, aggregate ---------------------------------------------------------------------------------


def test_rows_seeds_and_aggregate(tmp_path: Path) -> None:
    out = tmp_path / "r.parquet"
    calls: list[float] = []
    df = run_grid(grid(), out=out, progress=lambda d, t: calls.append(d / t))
    g = load_grid(_write_grid(tmp_path, grid()))
    assert len(df) == 12 and calls[-1] == 1.0
    assert list(df.columns[:6]) == ["point", "replication", "seed", "policy.decoder_kv_blocks_ttl_s",
                                    "workload.turn_gap_s.mean", "error"]
    for col in ("ttft_p90_s", "hit_rate", "pinned_kv_gib_mean", "pinned_kv_gib_peak", "decisions.pull", "decisions.miss",
                "releases.expired", "steady_pinned_kv_gib_mean", "prefill_utilization"):
        assert col in df.columns
    # replication k -> the k-th seed spawned from SeedSequence(3), the same at every point (CRN)
    assert df["seed"].tolist() == [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(3).spawn(2)] * 6
    assert set(df["seed"]).isdisjoint(range(0, 100))  # not base + k: base seeds 3 and 4 share no stream
    assert df["policy.decoder_kv_blocks_ttl_s"].tolist() == [10] * 4 + [60] * 4 + [480] * 4
    assert df["error"].isna().all()
    # same seed, same arrivals at every point: turn-1 count and prompt tokens do not depend on the TTL axis
    # (the gap axis changes only the gap stream); the two replications draw different conversations
    assert df.groupby("replication")["prompt_tokens"].nunique().tolist() == [1, 1]
    assert df.groupby("replication")["prompt_tokens"].first().nunique() == 2
    rows, summ = load_results(out)
    pd.testing.assert_frame_equal(rows, df)
    assert summ.equals(aggregate(df, g))
    x = df.loc[df["point"] == 3, "ttft_mean_s"].to_numpy()
    half = stats.t.ppf(0.975, 1) * x.std(ddof=1) / math.sqrt(2)
    row = summ.loc[summ["point"] == 3].iloc[0]
    assert row["ttft_mean_s_mean"] == pytest.approx(x.mean()) and row["ttft_mean_s_ci95"] == pytest.approx(half)
    assert not parts_dir(out).exists()
    # a second identical sweep gives identical bytes (fixed column order, atomic writes)
    out2 = tmp_path / "r2.parquet"
    run_grid(grid(), out=out2, order="canonical")
    assert out.read_bytes() == out2.read_bytes()


def test_pool_equals_inprocess(tmp_path: Path) -> None:
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    run_grid(grid(), out=a, workers=1)
    run_grid(grid(), out=b, workers=2)
    assert a.read_bytes() == b.read_bytes()


def test_leftover_parts_need_resume(tmp_path: Path) -> None:
    out = tmp_path / "r.parquet"
    d = parts_dir(out)
    g = grid_from_dict(grid())
    from kvplan.plan.sweep import PartStore

    store = PartStore(out, g)
    store.open(False)
    store.commit(0, 0, {"error": None, "x": 1})
    with pytest.raises(KvplanInputError, match="--resume"):
        run_grid(grid(), out=out)
    other = grid(axes={"policy.decoder_kv_blocks_ttl_s": [10, 60]})
    with pytest.raises(KvplanInputError, match="different grid"):
        run_grid(other, out=out, resume=True)
    assert d.exists()


def test_resume_ignores_parts_outside_the_grid(tmp_path: Path) -> None:
    """A part file named for a point or replication the grid does not have (a forged or stray file under a valid
    name) went into the results as an extra row (point 999 with the last point's axis values), or ended the resume
    in a traceback (an IndexError on the replication's seed)."""
    from kvplan.plan.sweep import PartStore

    data = grid(axes={"policy.decoder_kv_blocks_ttl_s": [10, 60]}, replications=1)
    ref = run_grid(data, out=tmp_path / "ref.parquet")
    out = tmp_path / "r.parquet"
    store = PartStore(out, grid_from_dict(data))
    store.open(False)
    store.commit(999, 0, {"error": None, "x": 1})
    store.commit(0, 7, {"error": None, "x": 1})
    df = run_grid(data, out=out, resume=True)
    pd.testing.assert_frame_equal(df, ref)


def test_a_file_left_by_a_kill_while_probing_the_output_directory_does_not_block_resume(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The output rule creates and removes a probe file in the directory before writing (an unwritable directory is
    refused before any work); one left by a kill in between must not make the parts directory foreign."""
    import tempfile

    from kvplan.plan.sweep import PartStore, foreign_in_parts

    data = grid(axes={"policy.decoder_kv_blocks_ttl_s": [10]}, replications=1)
    out = tmp_path / "r.parquet"
    store = PartStore(out, grid_from_dict(data))
    store.open(False)
    made: list[str] = []
    real = tempfile.mkstemp

    def spy(*a: Any, **k: Any) -> tuple[int, str]:
        fd, name = real(*a, **k)
        made.append(name)
        return fd, name

    monkeypatch.setattr(tempfile, "mkstemp", spy)
    store.commit(0, 0, {"error": None, "x": 1})
    monkeypatch.undo()
    assert made
    for name in made:  # as a SIGKILL between each temporary file's creation and its removal or rename leaves it
        Path(name).touch()
    assert foreign_in_parts(parts_dir(out)) is None


# --- acceptance 4: SIGKILL halfway, resume, byte-identical; Ray == local ------------------------------------


def test_sigkill_resume_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = grid(replications=3)
    data["base"] = {**BASE, "workload": {**BASE["workload"], "conversations": 120}}
    path = _write_grid(tmp_path, data)
    ref = tmp_path / "ref.parquet"
    run_grid(path, out=ref)
    total = 18
    out = tmp_path / "killed.parquet"
    kv = Path(sys.executable).with_name("kvplan")
    proc = subprocess.Popen([str(kv), "sweep", str(path), "--out", str(out), "--workers", "2"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    parts = parts_dir(out)
    deadline = time.monotonic() + 60
    n = 0
    while time.monotonic() < deadline and proc.poll() is None:
        n = len(list(parts.glob("*/*.json"))) if parts.exists() else 0
        if n >= total // 2:
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the sweep finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists()
    done_before = len(list(parts.glob("*/*.json")))
    assert total // 2 <= done_before < total
    calls = []
    real = executor.run_row

    def counting(sc: Any, seed: int) -> dict[str, Any]:
        calls.append(seed)
        return real(sc, seed)

    monkeypatch.setattr(executor, "run_row", counting)
    run_grid(path, out=out, resume=True, workers=1)
    assert len(calls) == total - done_before  # nothing finished is recomputed
    assert out.read_bytes() == ref.read_bytes()
    # resuming a finished sweep is a no-op that keeps the file
    calls.clear()
    run_grid(path, out=out, resume=True, workers=1)
    assert calls == [] and out.read_bytes() == ref.read_bytes()


def test_ray_equals_local(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    a, b = tmp_path / "local.parquet", tmp_path / "ray.parquet"
    local = run_grid(grid(), out=a, workers=1)
    remote = run_grid(grid(), out=b, backend="ray", workers=2)
    pd.testing.assert_frame_equal(local, remote)
    assert a.read_bytes() == b.read_bytes()


def test_ray_missing_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def fake(name: str, *a: Any, **k: Any) -> Any:
        if name == "ray":
            raise ImportError("no ray")
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(KvplanInputError, match=r"kvplan\[ray\]"):
        run_grid(grid(), backend="ray")


# --- the analytic screen ---------------------------------------------------------------------------------------


def test_screen_agrees_with_simulator_on_long_runs() -> None:
    g = grid_from_dict(grid())
    for i in range(g.n_points):
        sc = with_overrides(g.scenario(i), {"workload.conversations": 2500})
        row = executor.run_row(sc, 1)
        s = screen_scenarios([sc]).iloc[0]
        assert abs(s["screen_hit_rate"] - row["hit_rate"]) < 0.03, (i, s["screen_hit_rate"], row["hit_rate"])
        assert s["screen_pinned_kv_gib_mean"] == pytest.approx(row["steady_pinned_kv_gib_mean"], rel=0.1)
    scr = analytic_screen(g)
    assert list(scr.columns[:3]) == ["point", "policy.decoder_kv_blocks_ttl_s", "workload.turn_gap_s.mean"]
    assert np.all(scr["screen_hit_rate"].between(0, 1))


def test_screen_report_lists_disagreements(tmp_path: Path) -> None:
    out = tmp_path / "r.parquet"
    run_grid(grid(), out=out)
    rep = pd.read_parquet(tmp_path / "r.screen.parquet")
    assert {"screen_hit_rate", "hit_rate_mean", "disagreements"} <= set(rep.columns)
    # 30 conversations in 60 s never reach the 480 s TTL's steady state: the simulated pinned KV is the ramp-up's,
    # below the screen's steady figure, and the report says the run is too short to compare it (not a disagreement)
    at_480 = rep.loc[rep["policy.decoder_kv_blocks_ttl_s"] == 480].iloc[0]
    assert "steady_pinned_kv_gib_mean" in at_480["not_steady"]
    assert "steady_pinned_kv_gib_mean" not in at_480["disagreements"]


def test_prune_runs_one_replication_of_saturated_points(tmp_path: Path) -> None:
    data = grid(axes={"workload.arrival.rate_per_s": [0.5, 50.0]}, replications=2)
    data["base"] = {**BASE, "workload": {**BASE["workload"], "conversations": 200}}
    df = run_grid(data, prune=True)
    reps = df.groupby("workload.arrival.rate_per_s")["replication"].nunique().to_dict()
    assert reps == {0.5: 2, 50.0: 1}  # the simulator confirmed the screen's verdict: one replication is enough
    assert df.loc[df["workload.arrival.rate_per_s"] == 50.0, "prefill_queue_mean_s"].iloc[0] > 1.0


def test_fingerprint_covers_the_bytes_of_every_file_a_point_reads(tmp_path: Path) -> None:
    """Editing an empirical sample or a trace file changes the fingerprint, so --resume cannot mix old and new rows."""
    gaps, other = tmp_path / "gaps.txt", tmp_path / "other.txt"
    gaps.write_text("value\n10\n20\n30\n")
    other.write_text("value\n5\n")
    trace = tmp_path / "t.csv"
    trace.write_text("session_id,timestamp_s,input_tokens,output_tokens\na,0,100,10\na,5,150,10\n")
    base = {**BASE, "workload": {**BASE["workload"], "turn_gap_s": {"dist": "empirical", "path": str(gaps)}}}
    axes = {"workload.turn_gap_s": [{"dist": "empirical", "path": str(other)}, {"dist": "constant", "value": 1}]}
    g = as_grid({"base": base, "axes": axes})
    assert g.input_files() == sorted([str(gaps), str(other)])
    before = g.fingerprint()
    assert as_grid({"base": base, "axes": axes}).fingerprint() == before  # same files, same fingerprint
    other.write_text("value\n6\n")  # a file only an axis value names
    after_axis = g.fingerprint()
    assert after_axis != before
    gaps.write_text("value\n10\n20\n31\n")  # the base's file
    assert g.fingerprint() != after_axis
    tg = as_grid({"base": {"workload": {"trace": {"path": str(trace)}}},
                  "axes": {"policy.decoder_kv_blocks_ttl_s": [10, 60]}})
    fp = tg.fingerprint()
    trace.write_text("session_id,timestamp_s,input_tokens,output_tokens\na,0,100,10\na,6,150,10\n")
    assert tg.fingerprint() != fp


def test_screen_declines_closed_loops_it_cannot_model() -> None:
    """A closed loop of 2 clients x 10 active conversations: the simulator's hit rate is far below the turn-gap
    CDF (a conversation waits for its client's 9 other conversations), and its throughput is clients / (response
    + think time) by Little's law, not a rate: the screen says NaN (and the sweep's pruning and disagreement
    list leave the point alone) instead of 90% hits and 'feasible'. One conversation per client: the gap is the
    think time, and the screened hit rate matches the simulator."""
    import math

    from conftest import small

    from kvplan.plan.screen import CLOSED_LOOP_DECLINED, compare_screen, screen_scenarios
    from kvplan.sim.api import run
    from kvplan.sim.scenario import scenario_from_dict

    def closed(clients: int, active: int) -> Any:
        d = small(policy={"bidirectional": True, "decoder_kv_blocks_ttl_s": 30, "router_ttl_s": 24})
        d["workload"]["arrival"] = {"kind": "closed_loop", "clients": clients, "max_active_conversations": active}
        d["workload"]["turn_gap_s"] = {"dist": "exponential", "mean": 10}
        return scenario_from_dict(d)

    many, one = closed(2, 20), closed(4, 4)
    scr = screen_scenarios([many, one])
    sim_many, sim_one = run(many), run(one)
    assert sim_many.summary["hit_rate"] < 0.1  # the turn-gap CDF alone would say ~0.9
    assert math.isnan(scr["screen_hit_rate"][0]) and scr["screen_feasible"].isna().all()
    assert scr[["screen_pinned_kv_gib_mean", "screen_prefill_utilization"]].isna().all().all()
    assert abs(scr["screen_hit_rate"][1] - sim_one.summary["hit_rate"]) < 0.05
    # Little's law on the simulated loop: turns/s = clients / (mean response + mean think time)
    t = sim_many.turns
    resp = float((t["finish_s"] - t["arrival_s"]).mean())
    rate = len(t) / float(t["finish_s"].max() - t["arrival_s"].min())
    assert rate == pytest.approx(2 / (resp + 10.0), rel=0.15)
    summary = pd.DataFrame([{"point": 0, "hit_rate_mean": sim_many.summary["hit_rate"], "prefill_utilization_mean": 0.0}])
    assert compare_screen(scr.assign(point=[0, 1]).iloc[:1], summary).empty  # nothing claimed, nothing contradicted
    assert "Little's law" in CLOSED_LOOP_DECLINED


#: The row columns of the small grid below, per FORMAT_VERSION (sha256 of their sorted names, first 16 hex digits).
#: A new or renamed row column changes the rows a resumed sweep would mix: bump plan/grid.py FORMAT_VERSION (so
#: parts of the old version are not resumed) and record the new digest here.
ROW_COLUMNS_BY_FORMAT = {3: "5a8c8f1ff2f13ef4", 4: "70c9085db6388fad"}


def test_a_changed_row_schema_comes_with_a_new_format_version() -> None:
    """steady_served_turns_per_s moved to the pricing window and rows gained priced_window_start_s/_end_s without a
    FORMAT_VERSION bump, so --resume of an older sweep's parts would have mixed rows whose served rate (and $ per
    million turns) is counted over another window, with the new columns empty."""
    import hashlib
    import json

    from kvplan.plan.grid import FORMAT_VERSION

    df = run_grid(grid(axes={"policy.decoder_kv_blocks_ttl_s": [30]}, replications=1))
    digest = hashlib.sha256(json.dumps(sorted(df.columns)).encode()).hexdigest()[:16]
    assert ROW_COLUMNS_BY_FORMAT.get(FORMAT_VERSION) == digest, (FORMAT_VERSION, digest)
