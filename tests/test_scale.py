"""Issue 12: the typed columnar log, streamed derivation and outputs equal the one-shot derivation.

The oracle is the derivation kvplan used before the streamed log (a pandas join of every event, kept
here verbatim in spirit): on the 20,000-turn reference run the streamed turns and summary must equal it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvplan.sim.api import run
from kvplan.sim.events import SCHEMA, Ev, EventChunk, EventLog, col
from kvplan.sim.results import TURN_COLUMNS, ResultDirWriter, summary_json_bytes
from kvplan.sim.scenario import load_scenario
from kvplan.sim.turns import tpot_series

REF = Path(__file__).resolve().parents[1] / "benchmarks" / "reference.yaml"


def _by_turn(ev: pd.DataFrame, kind: Ev, cols: dict[str, str]) -> pd.DataFrame:
    sub = ev[ev["kind"] == int(kind)]
    return sub[["conv", "turn", *cols.keys()]].rename(columns=cols).set_index(["conv", "turn"])


def oracle_turns(ev: pd.DataFrame) -> pd.DataFrame:
    """The pre-issue-12 ``turns_frame``: one left join per event kind over the whole log."""
    from kvplan.sim.events import DECISION_NAMES, Decision
    from kvplan.sim.results import ROUTER_NAMES

    base = _by_turn(ev, Ev.ARRIVE, {"t_s": "arrival_s", "a": "prompt_tokens", "b": "output_tokens"})
    spec = [
        (Ev.ROUTER, {"a": "router_code"}), (Ev.P_ENQUEUE, {"t_s": "p_enq", "node": "p_node"}),
        (Ev.P_DECISION, {"a": "decision_code", "b": "local_hit_tokens"}),
        (Ev.PULL_START, {"t_s": "pull_t0", "a": "pulled_tokens", "b": "d2p_bytes"}),
        (Ev.PULL_DONE, {"t_s": "pull_t1", "a": "d2p_xfer_s"}), (Ev.P_COMPUTE, {"t_s": "p_comp"}),
        (Ev.P_DONE, {"t_s": "p_done", "a": "prefill_s"}), (Ev.D_ENQUEUE, {"t_s": "d_enq", "node": "d_node"}),
        (Ev.D_ADMIT, {"t_s": "d_admit", "a": "d_hit_tokens"}),
        (Ev.P2D_START, {"t_s": "p2d_t0", "a": "p2d_tokens", "b": "p2d_bytes"}), (Ev.P2D_DONE, {"t_s": "p2d_t1"}),
        (Ev.D_FIRST, {"t_s": "d_first"}), (Ev.D_FINISH, {"t_s": "finish_s"}), (Ev.P_UNHOLD, {"t_s": "hold_t1"}),
        (Ev.D_ITL, {"a": "itl_p50_s", "b": "itl_max_s"}),
    ]
    parts: list[pd.DataFrame | pd.Series] = [_by_turn(ev, k, c) for k, c in spec]
    pre = ev[ev["kind"] == int(Ev.D_PREEMPT)]
    if len(pre):
        parts.append(pre.groupby(["conv", "turn"]).size().rename("d_preemptions").to_frame())
    df = base.join(parts, how="left").sort_index().reset_index().rename(columns={"conv": "conversation_id"})
    if "d_preemptions" not in df:
        df["d_preemptions"] = 0.0
    err = df["decision_code"] == int(Decision.ERROR)
    for c in ("pulled_tokens", "d2p_bytes", "p2d_bytes", "p2d_tokens", "d_hit_tokens", "local_hit_tokens",
              "d_preemptions"):
        df[c] = df[c].fillna(0.0)
    df["kv_pull_s"] = (df["pull_t1"] - df["pull_t0"]).fillna(0.0)
    df["prefill_queue_s"] = df["p_comp"] - df["p_enq"] - df["kv_pull_s"]
    df["overhead_s"] = (df["p_enq"] - df["arrival_s"]) + (df["d_enq"] - df["p_done"])
    df["d_queue_s"] = df["d_admit"] - df["d_enq"]
    df["p2d_transfer_s"] = (df["p2d_t1"] - df["p2d_t0"]).fillna(0.0)
    df["first_decode_s"] = df["d_first"] - df["p2d_t1"].fillna(df["d_admit"])
    df["ttft_s"] = df["d_first"] - df["arrival_s"]
    df["p_leg_s"] = df["p_done"] - df["arrival_s"]
    df["p_hold_s"] = (df["hold_t1"] - df["p_done"]).fillna(0.0)
    df["tpot_s"] = tpot_series(df["d_first"], df["finish_s"], df["output_tokens"])
    df["failed_tokens"] = np.where(err, df["prompt_tokens"] - df["local_hit_tokens"], 0.0)
    df["recomputed_tokens"] = np.where(err, 0.0, df["prompt_tokens"] - df["local_hit_tokens"] - df["pulled_tokens"])
    df["decision"] = df["decision_code"].map({int(k): v for k, v in DECISION_NAMES.items()})
    df["router"] = df["router_code"].map(ROUTER_NAMES)
    for c in ("prompt_tokens", "output_tokens", "local_hit_tokens", "pulled_tokens", "recomputed_tokens",
              "failed_tokens", "d_hit_tokens", "p2d_tokens", "d2p_bytes", "p2d_bytes", "d_preemptions"):
        df[c] = df[c].astype(np.int64)
    df["d_node"] = df["d_node"].fillna(-1).astype(np.int64)
    df["p_node"] = df["p_node"].fillna(-1).astype(np.int64)
    return df[TURN_COLUMNS]


def oracle_pinned_gib(ev: pd.DataFrame, bytes_per_token: int) -> tuple[float, float]:
    """(time-weighted mean, peak) pinned GiB from the whole log, the pre-issue-12 way."""
    pin = ev[ev["kind"] == int(Ev.PIN)][["t_s", "a"]]
    unpin = ev[ev["kind"] == int(Ev.UNPIN)][["t_s", "a"]]
    d = pd.concat([pin.assign(delta=pin["a"], order=1), unpin.assign(delta=-unpin["a"], order=0)],
                  ignore_index=True).sort_values(["t_s", "order"], kind="stable")
    gib = d["delta"].cumsum().to_numpy() * bytes_per_token / 2**30
    t = d["t_s"].to_numpy()
    t_end = float(ev["t_s"].max())
    return float((gib * np.diff(np.append(t, t_end))).sum() / t_end), float(gib.max())


@pytest.fixture(scope="module")
def reference() -> dict:
    sc = load_scenario(REF)
    kept = run(sc)
    streamed_rows: list[pd.DataFrame] = []
    streamed = run(sc, keep=False, sink=streamed_rows.append)
    return {"sc": sc, "kept": kept, "streamed": streamed, "rows": streamed_rows}


def test_reference_turns_equal_the_one_shot_join(reference: dict) -> None:
    kept = reference["kept"]
    assert len(kept.turns) == 20_000
    pd.testing.assert_frame_equal(kept.turns, oracle_turns(kept.events), check_exact=True)
    streamed = pd.concat(reference["rows"], ignore_index=True)
    assert len(reference["rows"]) > 1  # released in several batches while the run went
    pd.testing.assert_frame_equal(streamed, kept.turns, check_exact=True)
    assert reference["streamed"].turns.empty and reference["streamed"].events.empty


def test_reference_summary_identical(reference: dict) -> None:
    kept, streamed = reference["kept"], reference["streamed"]
    assert summary_json_bytes(kept.summary) == summary_json_bytes(streamed.summary)
    t, s = kept.turns, kept.summary
    ok = t[t["decision"] != "error"]
    assert s["ttft_p99_s"] == float(np.percentile(ok["ttft_s"].dropna(), 99))  # exact percentiles, no sketch
    assert s["ttft_mean_s"] == float(ok["ttft_s"].dropna().to_numpy().mean())
    assert s["p_leg_mean_s"] == float(ok["p_leg_s"].mean())
    assert s["pulled_tokens"] == int(t["pulled_tokens"].sum()) and s["turns"] == len(t)
    assert s["hit_rate"] == float(t[t["turn"] >= 2]["decision"].isin(["pull", "local", "recompute_below_threshold",
                                                                         "host_pull"]).mean())
    mean, peak = oracle_pinned_gib(kept.events, s["kv_bytes_per_token_all_ranks"])
    assert s["pinned_kv_gib_mean"] == mean and s["pinned_kv_gib_peak"] == peak
    assert s["pins"] == int((kept.events["kind"] == int(Ev.PIN)).sum())


def test_parquet_reads_back_as_the_csv_frame(reference: dict, tmp_path: Path) -> None:
    kept = reference["kept"]
    w = ResultDirWriter(tmp_path / "out", "both")
    for rows in reference["rows"]:
        w.write_turns(rows)
    w.commit(reference["streamed"])
    pq = pd.read_parquet(tmp_path / "out" / "turns.parquet")
    csv = pd.read_csv(tmp_path / "out" / "turns.csv")
    assert list(pq.columns) == list(csv.columns) == TURN_COLUMNS
    pd.testing.assert_frame_equal(pq, kept.turns, check_exact=True)  # full precision
    for c in TURN_COLUMNS:
        if pq[c].dtype.kind == "f":
            np.testing.assert_allclose(pq[c], csv[c], rtol=0, atol=5e-10, err_msg=c)  # csv keeps 9 decimals
        else:
            assert pq[c].astype(str).tolist() == csv[c].astype(str).tolist(), c
    manifest = json.loads((tmp_path / "out" / ".kvplan-result.json").read_text())
    assert {"turns.parquet", "turns.csv", "pinned.parquet", "summary.json"} <= set(manifest["files"])
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".stream")]  # staging removed


def test_interrupted_stream_leaves_no_result(tmp_path: Path) -> None:
    sc = load_scenario(REF)
    w = ResultDirWriter(tmp_path / "out", "parquet")
    seen = []

    def sink(rows: pd.DataFrame) -> None:
        w.write_turns(rows)
        seen.append(len(rows))
        if len(seen) == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        try:
            run(sc, keep=False, sink=sink)
        except BaseException:
            staged = [p for p in tmp_path.iterdir() if p.name.endswith(".stream")]
            assert staged and not (tmp_path / "out").exists()  # streamed so far, only under a hidden name
            w.abort()
            raise
    assert list(tmp_path.iterdir()) == []


def test_event_log_flushes_typed_chunks() -> None:
    log = EventLog(keep=True)
    log.append((1.0, Ev.ARRIVE, 7, 1, -1, 120, 30))
    log.append((2.5, Ev.P_DONE, 7, 1, 0, 0.25, 4096))
    first = log.flush()
    assert len(log) == 0 and log.total == 2 and first.kind.dtype == np.int16
    log.append((3.0, Ev.UNPIN, 7, -1, 0, 150, 2))
    whole = log.chunk()
    assert whole.t_s.tolist() == [1.0, 2.5, 3.0] and whole.turn.tolist() == [1, 1, -1]
    assert getattr(whole, col(Ev.P_DONE, "held_bytes"))[1] == 4096
    assert col(Ev.ARRIVE, "output_tokens") == "b" and SCHEMA[Ev.PIN].a == "tokens"
    with pytest.raises(KeyError):
        col(Ev.PIN, "bytes")
    assert len(EventChunk.concat([first, EventChunk.empty()])) == 2


def test_typed_summary_is_the_summary_json(reference: dict) -> None:
    from kvplan.plan.executor import flatten_summary
    from kvplan.sim.summary import Summary

    res = reference["kept"]
    assert res.stats is not None and res.stats.to_dict() == res.summary
    assert Summary.from_dict(res.summary) == res.stats
    row = res.stats.to_row()
    assert row == flatten_summary(res.summary)
    assert row["decisions.pull"] == res.summary["decisions"]["pull"] and "model" not in row
    assert res.stats.ttft_p90_s == res.summary["ttft_p90_s"] and res.stats.run["seed"] == res.seed


def test_killed_cli_run_leaves_nothing_that_looks_complete(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    import yaml

    sc = yaml.safe_load(REF.read_text())
    sc["workload"]["conversations"] = 20_000  # long enough to be killed mid-stream
    (tmp_path / "sc.yaml").write_text(yaml.safe_dump(sc))
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "kvplan.app.cli", "simulate", str(tmp_path / "sc.yaml"), "--out",
                             str(out), "--format", "both"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any((p / "turns.csv").exists() for p in tmp_path.glob(".out.*")):
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not out.exists()  # streamed files only ever under the hidden staging name
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # it was killed mid-stream


def test_progress_bar_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from kvplan.app.cmd_simulate import sim_progress

    calls: list[tuple[float, float]] = []
    with sim_progress(enabled=True) as hook:  # pytest's stderr is not a terminal
        assert hook is None
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True, raising=False)
    with sim_progress(enabled=False) as hook:
        assert hook is None
    with sim_progress(enabled=True, after_s=0.0) as hook:
        assert hook is not None
        bar = hook

        def progress(now: float, horizon: float) -> None:
            calls.append((now, horizon))
            bar(now, horizon)

        res = run(load_scenario(REF), progress=progress)
    assert len(calls) > 10 and calls[-1][0] >= res.summary["sim_end_s"] * 0.5
    assert all(b[0] >= a[0] for a, b in zip(calls, calls[1:], strict=False))  # simulated time only advances


def test_aggregated_and_policy_runs_stream_like_kept_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    import kvplan.sim.engine as engine

    monkeypatch.setattr(engine, "SLICE_EVENTS", 4096)  # many small flushes
    sc = yaml.safe_load(REF.read_text())
    sc["workload"]["conversations"] = 600
    variants = [
        {**sc, "deployment": {**sc["deployment"], "mode": "aggregated", "replicas": 2, "prefill_nodes": 1,
                              "decode_nodes": 1}},
        {**sc, "policy": {**sc["policy"], "retention": {"kind": "ttl_evictable"}}},
    ]
    for v in variants:
        kept = run(v)
        rows: list[pd.DataFrame] = []
        streamed = run(v, keep=False, sink=rows.append)
        assert len(rows) > 1  # released while the run went, not all at the end
        pd.testing.assert_frame_equal(pd.concat(rows, ignore_index=True), kept.turns, check_exact=True)
        assert summary_json_bytes(streamed.summary) == summary_json_bytes(kept.summary)
        pd.testing.assert_frame_equal(kept.turns, oracle_turns(kept.events), check_exact=True)


def test_series_buffer_grows_sorts_and_keeps_in_order() -> None:
    """The change-point buffer (sim/stream.py): growing past its capacity keeps every point; ``steps`` orders by
    time, releases before additions at equal times, then log order; ``keep`` drops points and keeps the order."""
    from kvplan.sim.stream import SeriesBuffer

    buf = SeriesBuffer(capacity=1)
    buf.add(np.array([2.0, 1.0]), np.array([5.0, 3.0]), 1)
    buf.add(np.array([], dtype=np.float64), np.array([], dtype=np.float64), 0)
    buf.add(np.array([2.0, 3.0]), np.array([-3.0, -5.0]), 0)
    buf.add(np.arange(5000.0) + 10.0, np.ones(5000), 1)  # past any initial size
    assert len(buf) == 5004
    t, d, o = buf.arrays()
    assert t[:4].tolist() == [2.0, 1.0, 2.0, 3.0] and o[:4].tolist() == [1, 1, 0, 0] and d[3] == -5.0
    buf.keep(np.arange(len(buf)) < 4)
    assert len(buf) == 4 and buf.arrays()[1].tolist() == [5.0, 3.0, -3.0, -5.0]
    t, level = buf.steps()
    assert t.tolist() == [1.0, 2.0, 2.0, 3.0] and level.tolist() == [3.0, 0.0, 5.0, 0.0]  # release first at t=2
    assert len(buf) == 0 and len(buf.steps()[0]) == 0


def test_outstanding_holds_behave_like_the_dict_they_replace() -> None:
    """OutstandingHolds (sim/stream.py) against a dict updated with each chunk's holds and popped by its releases,
    with the earliest bounding P_DONE time per outstanding key: random chunks with repeated keys, releases of keys
    never held, double releases, holds released in the same chunk."""
    import numpy as np

    from kvplan.sim.stream import OutstandingHolds

    rng = np.random.default_rng(7)
    holds = OutstandingHolds()
    ref: dict[int, float] = {}
    since: dict[int, float] = {}
    t = 0.0
    for _ in range(300):
        n_h, n_r = int(rng.integers(0, 12)), int(rng.integers(0, 12))
        keys = rng.integers(0, 40, n_h)
        held = rng.choice([0.0, 1.0, 2.5, 1e9], n_h)
        times = t + np.sort(rng.random(n_h))
        bound = rng.random(n_h) < 0.7
        t += 1.0
        holds.add(keys, held, np.where(bound, times, np.inf))
        for k, b, tt, bd in zip(keys.tolist(), held.tolist(), times.tolist(), bound.tolist(), strict=True):
            ref[k] = b
            if bd:
                since[k] = min(since.get(k, np.inf), tt)
        rel = rng.integers(0, 45, n_r)
        got = holds.release(rel)
        want = np.array([ref.pop(k, np.nan) for k in rel.tolist()])
        for k in rel.tolist():
            if k not in ref:
                since.pop(k, None)
        assert np.array_equal(got, want, equal_nan=True)
        assert holds.keys.tolist() == sorted(ref) and holds.bytes.tolist() == [ref[k] for k in sorted(ref)]
        assert holds.earliest() == min((since[k] for k in ref if k in since), default=np.inf)
