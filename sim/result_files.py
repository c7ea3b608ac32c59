"""Result files of a run: ``turns.csv``/``turns.parquet``, ``summary.json``, ``pinned.*``, ``scenario.yaml``,
streamed into a hidden staging directory and moved into ``--out`` only when complete (:mod:`kvplan.atomic`)."""


from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd

from kvplan.atomic_dir import open_result_dir, write_result_dir_files
from kvplan.sim.alloc import release_free_memory
from kvplan.sim.events import Release, RouterResult
from kvplan.sim.scenario import Scenario

GIB = 1024**3
ROUTER_NAMES = {int(v): v.name.lower() for v in RouterResult}
RELEASE_NAMES = {int(v): v.name.lower() for v in Release}

TURN_COLUMNS = [
    "conversation_id",
    "turn",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "p_node",
    "d_node",
    "router",
    "decision",
    "local_hit_tokens",
    "pulled_tokens",
    "recomputed_tokens",
    "failed_tokens",
    "d_hit_tokens",
    "p2d_tokens",
    "overhead_s",
    "prefill_queue_s",
    "kv_pull_s",
    "prefill_s",
    "d_queue_s",
    "p2d_transfer_s",
    "first_decode_s",
    "ttft_s",
    "p_leg_s",
    "d2p_xfer_s",
    "finish_s",
    "d2p_bytes",
    "p2d_bytes",
    "d_preemptions",
    "p_hold_s",
    "tpot_s",
    "itl_p50_s",
    "itl_max_s",
]



class ResultView(Protocol):
    """What the writers read of a run; :class:`kvplan.sim.results.Result` has it. A protocol rather than that
    class because :mod:`kvplan.sim.results` imports this module (no import circle, ``tests/test_import_graph.py``)."""

    @property
    def scenario(self) -> Scenario:
        """The scenario run (written as ``scenario.yaml``)."""

    @property
    def summary(self) -> dict[str, Any]:
        """The ``summary.json`` content."""

    @property
    def turns(self) -> pd.DataFrame:
        """The per-turn records (``turns.*``) of a kept run."""

    def pinned_series(self) -> pd.DataFrame:
        """The pinned decode KV series (``pinned.*``)."""


# --- writers ---------------------------------------------------------------------------------------------

FLOAT_FORMAT = "%.9f"


def turns_csv_bytes(turns: pd.DataFrame) -> bytes:
    """``turns.csv`` content with fixed column order and float format."""
    return turns.to_csv(index=False, float_format=FLOAT_FORMAT, lineterminator="\n").encode()


def _json_default(o: Any) -> Any:
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    raise TypeError(f"not JSON serialisable: {type(o)}")


def json_safe(v: Any) -> Any:
    """A JSON-ready copy: tuples to lists, NumPy scalars to Python, NaN and infinities to None."""
    if isinstance(v, dict):
        return {str(k): json_safe(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [json_safe(x) for x in v]
    if isinstance(v, np.generic):
        return json_safe(v.item())
    if isinstance(v, float) and not np.isfinite(v):
        return None
    return v


def summary_json_bytes(summary: dict[str, Any]) -> bytes:
    """``summary.json`` content (sorted keys, NaN written as null)."""
    return (json.dumps(json_safe(summary), indent=2, sort_keys=True, default=_json_default) + "\n").encode()


FORMATS = ("parquet", "csv", "both")
ROW_GROUP_ROWS = 65_536  # turns per parquet row group (streamed runs write one as soon as it is full)
INT_COLUMNS = (
    "conversation_id", "turn", "prompt_tokens", "output_tokens", "p_node", "d_node", "local_hit_tokens",
    "pulled_tokens", "recomputed_tokens", "failed_tokens", "d_hit_tokens", "p2d_tokens", "d2p_bytes", "p2d_bytes",
    "d_preemptions",
)
STR_COLUMNS = ("router", "decision")


def _formats(fmt: str) -> tuple[str, ...]:
    if fmt not in FORMATS:
        from kvplan.errors import input_error

        raise input_error("--format", f"unknown format '{fmt}'", "use csv, parquet or both")
    return ("parquet", "csv") if fmt == "both" else (fmt,)


def result_file_names(extra_files: dict[str, bytes] | None = None, fmt: str = "csv") -> list[str]:
    """The files :func:`write_result_dir` / :class:`ResultDirWriter` write into a result directory."""
    names = [f"turns.{f}" for f in _formats(fmt)] + [f"pinned.{f}" for f in _formats(fmt)]
    return [*names, "summary.json", "scenario.yaml", *(extra_files or {})]


def turns_arrow_schema() -> Any:
    """The fixed Arrow schema of ``turns.parquet`` (int64 counts, float64 times, string labels)."""
    import pyarrow as pa

    def typ(c: str) -> Any:
        return pa.int64() if c in INT_COLUMNS else pa.string() if c in STR_COLUMNS else pa.float64()

    return pa.schema([pa.field(c, typ(c)) for c in TURN_COLUMNS])


def turns_arrow_table(turns: pd.DataFrame, schema: Any) -> Any:
    """``turns`` as an Arrow table of ``schema`` (its columns, in its order; the frame's other columns dropped).

    The table ``pa.Table.from_pandas(turns, schema, preserve_index=False)`` gives without its pandas metadata
    (NaN and None become nulls, as there), a column at a time: a third of its cost at the few thousand rows a
    streamed chunk releases (it planned a thread pool per call).
    """
    import pyarrow as pa

    arrays = [pa.array(turns[f.name] if pa.types.is_string(f.type) else turns[f.name].to_numpy(), type=f.type,
                       from_pandas=True) for f in schema]
    return pa.Table.from_arrays(arrays, schema=schema)


class BackgroundWrites:
    """Runs a file writer's calls on one background thread, in the order they were submitted (a one-thread
    ``concurrent.futures.ThreadPoolExecutor``).

    Arrow encodes and compresses a Parquet row group without holding the GIL (~70 ms for a group of
    :data:`ROW_GROUP_ROWS` turns; 1.0 of the 13 CPU s of a 1M-turn run), so a streamed run's event loop goes on on
    the other core meanwhile. One write is in flight at most (it holds one row group's table: memory stays bounded):
    :meth:`submit` first waits for the previous one, which a group filling every few hundred milliseconds of
    simulation has long finished. A write's error is raised by the next :meth:`submit` or by :meth:`drain`, and no
    write is made after it: a failed write is never presented as complete. The file's bytes are those of the same
    writes made inline (one thread, same order).
    """

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kvplan-row-groups")
        self._last: Future[None] | None = None

    def submit(self, job: Callable[[], None]) -> None:
        """Run ``job`` once the previous one is done (raises the previous one's error instead)."""
        last, self._last = self._last, None  # its error is handed back once
        if last is not None:
            last.result()
        self._last = self._pool.submit(job)

    def drain(self) -> None:
        """Wait for the last job and stop the thread; raises that job's error."""
        last, self._last = self._last, None
        try:
            if last is not None:
                last.result()
        finally:
            self._pool.shutdown(wait=True)


class ResultDirWriter:
    """Writes a result directory while a run goes: ``turns.parquet`` (zstd, row groups) and/or ``turns.csv``
    are streamed into a hidden staging directory next to ``out`` and moved into ``out`` only by
    :meth:`commit`, together with ``pinned.*``, ``scenario.yaml`` and ``summary.json``, through
    :func:`kvplan.atomic.write_result_dir_files` (manifest last). A run killed midway leaves only the hidden
    staging directory, never anything at ``out`` that looks complete; :meth:`abort` removes it.
    """

    def __init__(self, out: str | Path, fmt: str = "parquet", overwrite: bool = False, inputs: Any = ()) -> None:
        self.out = Path(out)
        self.formats = _formats(fmt)
        self.fmt = fmt
        self.overwrite = overwrite
        self.inputs = list(inputs)
        # checks, takes the directory's lock (held until commit/abort), repairs an interrupted commit
        self.lock, self.stage = open_result_dir(out, result_file_names(None, fmt), overwrite, inputs=self.inputs)
        self._pq: Any = None
        self._csv: Any = None
        self._schema: Any = None
        # released turns not yet in a row group, as Arrow tables converted on arrival (the frames are not kept):
        # a row group is a zero-copy slice of their concatenation, so no frame is ever joined or copied again
        self._pending: list[Any] = []
        self._pending_rows = 0
        self._rows = 0
        self._writes: BackgroundWrites | None = None  # created with the Parquet writer

    def write_turns(self, turns: pd.DataFrame) -> None:
        """Append finished turns (in order); parquet row groups are written as they fill."""
        if "csv" in self.formats:
            if self._csv is None:
                self._csv = open(self.stage / "turns.csv", "wb")  # noqa: SIM115 - closed in commit/abort
                self._csv.write(turns_csv_bytes(turns))
            elif len(turns):
                body = turns.to_csv(index=False, header=False, float_format=FLOAT_FORMAT, lineterminator="\n")
                self._csv.write(body.encode())
        self._rows += len(turns)
        if "parquet" in self.formats:
            if self._schema is None:
                self._schema = turns_arrow_schema()
            for i in range(0, len(turns), ROW_GROUP_ROWS):  # a kept run's whole frame: one group's rows at a time
                part = turns.iloc[i:i + ROW_GROUP_ROWS]
                self._pending.append(turns_arrow_table(part, self._schema))
                self._pending_rows += len(part)
                while self._pending_rows >= ROW_GROUP_ROWS:
                    self._flush_parquet(ROW_GROUP_ROWS)

    def _flush_parquet(self, n: int | None) -> None:
        """Write the first ``n`` pending rows (all: None) as one row group. The group is a slice of the pending
        tables' chunks, written as it stands: the file's bytes do not depend on how its rows are chunked (a row
        group's column chunk is at most 512 KiB of PLAIN or dictionary data, below the 1 MiB page and dictionary
        limits, so no page boundary falls at a chunk boundary)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self._schema is None:
            self._schema = turns_arrow_schema()
        if self._pq is None:
            self._pq = pq.ParquetWriter(self.stage / "turns.parquet", self._schema, compression="zstd")
            self._writes = BackgroundWrites()  # the writer's row groups, encoded on a thread of their own
        if not self._pending:
            return
        rows = pa.concat_tables(self._pending) if len(self._pending) > 1 else self._pending[0]
        n = rows.num_rows if n is None else n
        if n and self._writes is not None:
            self._writes.submit(partial(self._pq.write_table, rows.slice(0, n), row_group_size=ROW_GROUP_ROWS))
        rest = rows.slice(n)
        self._pending = [rest] if rest.num_rows else []
        self._pending_rows = rest.num_rows

    def _close_turns(self) -> None:
        if "csv" in self.formats:
            if self._csv is None:
                self.write_turns(pd.DataFrame({c: pd.Series(dtype=float) for c in TURN_COLUMNS}))
            self._csv.close()
        if "parquet" in self.formats:
            self._flush_parquet(None)
            if self._writes is not None:
                self._writes.drain()
            self._pq.close()

    def commit(self, result: ResultView, extra_files: dict[str, bytes] | None = None) -> Path:
        """Close the streams and move the complete result into ``out`` (summary and manifest last)."""
        import shutil

        import yaml

        try:
            self._close_turns()
            staged = {f"turns.{f}": self.stage / f"turns.{f}" for f in self.formats}
            release_free_memory()  # the last row group's (sim/alloc.py)
            staged.update(_stage_pinned(result.pinned_series(), self.stage, self.formats))
            release_free_memory()  # the pinned file's slices and pages
            files: dict[str, bytes] = {}
            files["scenario.yaml"] = yaml.safe_dump(
                result.scenario.model_dump(mode="json", exclude_none=True), sort_keys=False
            ).encode()
            files.update(extra_files or {})
            files["summary.json"] = summary_json_bytes(result.summary)  # last: its presence means the rest is there
            return write_result_dir_files(self.out, files, self.overwrite, staged=staged, inputs=self.inputs,
                                          lock=self.lock)
        finally:
            shutil.rmtree(self.stage, ignore_errors=True)
            self.lock.release()

    def abort(self) -> None:
        """Drop the staged files (a failed or interrupted run)."""
        import shutil

        for fh in (self._csv,):
            if fh is not None and not fh.closed:
                fh.close()
        if self._writes is not None:
            try:
                self._writes.drain()  # the thread stops before its file goes
            except BaseException:  # noqa: BLE001 - the run failed already; the staging directory goes anyway
                pass
        if self._pq is not None:
            try:
                self._pq.close()
            except Exception:  # noqa: BLE001 - best effort: the staging directory goes anyway
                pass
        shutil.rmtree(self.stage, ignore_errors=True)
        self.lock.release()


PINNED_SLICE_ROWS = 1_000_000  # pinned rows written per slice (a day's series never exists twice in memory)


def _stage_pinned(series: pd.DataFrame, stage: Path, formats: tuple[str, ...]) -> dict[str, Path]:
    """Write ``pinned.parquet`` (change points: one row per instant, the level after it; zstd) and/or
    ``pinned.csv`` (every change) into ``stage`` slice by slice."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out: dict[str, Path] = {}
    n = len(series)
    if "parquet" in formats:
        t = series["t_s"].to_numpy()
        keep = np.flatnonzero(np.append(t[1:] != t[:-1], True)) if n else np.zeros(0, dtype=np.int64)
        cols = {c: series[c].to_numpy(dtype=np.float64) for c in series.columns}
        schema = pa.schema([pa.field(c, pa.float64()) for c in series.columns])
        out["pinned.parquet"] = stage / "pinned.parquet"
        with pq.ParquetWriter(out["pinned.parquet"], schema, compression="zstd") as w:
            for i in range(0, max(len(keep), 1), PINNED_SLICE_ROWS):
                idx = keep[i:i + PINNED_SLICE_ROWS]
                table = pa.table({c: v[idx] for c, v in cols.items()}, schema=schema)
                w.write_table(table, row_group_size=PINNED_SLICE_ROWS)
    if "csv" in formats:
        out["pinned.csv"] = stage / "pinned.csv"
        with open(out["pinned.csv"], "wb") as fh:
            fh.write(series.iloc[:0].to_csv(index=False, lineterminator="\n").encode())
            for i in range(0, n, PINNED_SLICE_ROWS):
                part = series.iloc[i:i + PINNED_SLICE_ROWS]
                fh.write(part.to_csv(index=False, header=False, float_format=FLOAT_FORMAT, lineterminator="\n").encode())
    return out


def write_result_dir(
    result: ResultView, out: str | Path, extra_files: dict[str, bytes] | None = None, overwrite: bool = False,
    fmt: str = "csv", inputs: Any = (),
) -> Path:
    """Write a kept run's ``turns.*``, ``summary.json``, ``pinned.*`` and ``scenario.yaml`` into ``out``.

    A new directory appears only when complete; an existing non-empty one is refused unless ``overwrite``,
    which replaces only kvplan's own files there and keeps every other file (:mod:`kvplan.atomic`).
    """
    w = ResultDirWriter(out, fmt, overwrite, inputs)
    try:
        w.write_turns(result.turns)
    except BaseException:
        w.abort()
        raise
    return w.commit(result, extra_files)
