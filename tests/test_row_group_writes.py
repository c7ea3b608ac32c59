"""Streamed ``turns.parquet``: the Arrow conversion and the background row-group writes (sim/result_files.py)
give the bytes of the inline ``from_pandas`` path, and a failed write is never presented as complete."""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from test_commit_faults import SCENARIO

import kvplan.sim.result_files as rf
from kvplan.app.cli import main
from kvplan.sim.api import run
from kvplan.sim.scenario import load_scenario, with_overrides

REF = Path(__file__).resolve().parents[1] / "benchmarks" / "reference.yaml"


def _reference_turns(conversations: int = 300) -> pd.DataFrame:
    return run(with_overrides(load_scenario(REF), {"workload.conversations": conversations})).turns


def test_arrow_table_is_from_pandas_without_its_metadata() -> None:
    schema = rf.turns_arrow_schema()
    turns = _reference_turns()
    assert turns["d2p_xfer_s"].isna().any()  # NaN -> null is exercised (a turn that pulled nothing)
    odd = turns.head(50).copy()
    odd.loc[odd.index[:5], "decision"] = None  # a turn without a decision (a replayed log's)
    odd.loc[odd.index[5:9], "ttft_s"] = np.nan
    odd.loc[odd.index[9], "arrival_s"] = -0.0
    for frame in (turns, odd, turns.iloc[:0], turns.iloc[7:7 + 65]):
        want = pa.Table.from_pandas(frame, schema=schema, preserve_index=False).replace_schema_metadata()
        got = rf.turns_arrow_table(frame, schema)
        assert got.equals(want)
        assert got.schema.equals(want.schema, check_metadata=True)
        for c in ("ttft_s", "decision"):
            assert got.column(c).null_count == want.column(c).null_count


def _parquet_bytes(tmp: Path, turns: pd.DataFrame, parts: int) -> bytes:
    w = rf.ResultDirWriter(tmp / f"r{parts}", "parquet")
    try:
        for piece in np.array_split(np.arange(len(turns)), parts):
            w.write_turns(turns.iloc[piece])
        w._close_turns()
        return (w.stage / "turns.parquet").read_bytes()
    finally:
        w.abort()


def test_background_writes_give_the_inline_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    turns = _reference_turns(2_000)
    monkeypatch.setattr(rf, "ROW_GROUP_ROWS", 1_000)  # several row groups, each written on the thread
    threaded = _parquet_bytes(tmp_path, turns, 7)

    class Inline:
        def __init__(self) -> None:
            pass

        def submit(self, job: Any) -> None:
            job()

        def drain(self) -> None:
            pass

    monkeypatch.setattr(rf, "BackgroundWrites", Inline)
    inline = _parquet_bytes(tmp_path / "inline", turns, 3)
    assert hashlib.sha256(threaded).digest() == hashlib.sha256(inline).digest()


def test_background_writes_run_in_order_and_hand_errors_back() -> None:
    seen: list[int] = []
    w = rf.BackgroundWrites()
    for i in range(20):
        w.submit(functools.partial(seen.append, i))
    w.drain()
    assert seen == list(range(20))

    def fail() -> None:
        raise OSError(errno.ENOSPC, "full")

    for then_drain in (False, True):  # the error comes back at the next submit, or at drain
        w = rf.BackgroundWrites()
        w.submit(fail)
        with pytest.raises(OSError, match="full"):
            if not then_drain:
                w.submit(functools.partial(seen.append, 99))  # not made: an earlier write failed
            w.drain()
        w.drain()
        assert 99 not in seen
        assert not any(t.is_alive() for t in w._pool._threads)  # the thread stopped


def test_a_row_group_write_failing_on_the_thread_keeps_the_old_result(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    import pyarrow.parquet as pq

    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO)
    out = tmp_path / "r"
    assert main(["simulate", str(sc), "--out", str(out)]) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    monkeypatch.setattr(rf, "ROW_GROUP_ROWS", 4)  # groups are written during the run, not only at its end
    calls = []

    def full(self: Any, *_a: Any, **_k: Any) -> None:
        calls.append(threading.current_thread().name)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    capsys.readouterr()
    assert main(["simulate", str(sc), "--out", str(out), "--overwrite", "--seed", "5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "No space left" in err[0]
    assert calls and all(name.startswith("kvplan-row-groups") for name in calls)  # on the thread
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r", "s.yaml"]  # no staging directory, no lock left
    assert json.loads((out / "summary.json").read_text())["seed"] == 1
