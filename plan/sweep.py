"""Batch sweeps: ``run_grid(grid, ...) -> DataFrame`` with one row per (point, replication).

Public API (used by the CLI ``kvplan sweep`` and the dashboard):

* :func:`run_grid` runs every point of a :class:`~kvplan.plan.grid.Grid` (or a grid mapping / YAML path)
  ``replications`` times with seeds spawned from ``SeedSequence(base_seed)`` (common random numbers),
  in-process, on a local
  process pool or on Ray (``backend``), and returns the rows in canonical order (point, replication).
* :func:`aggregate` gives the per-point mean and 95% t-interval half-width of every metric.
* :func:`analytic_screen` (from :mod:`kvplan.plan.screen`) and :func:`screen_report` compare the analytic
  screen with the simulator; the simulator wins and every disagreement is listed.

Files (when ``out`` is given): each finished run is committed at once as ``OUT.parts/<shard>/<point>-<rep>.json``
(temp file + ``os.replace``; a manifest pins the grid's fingerprint), so a sweep killed at any moment
(SIGKILL included) and restarted with ``resume=True`` loses nothing and recomputes nothing finished. The
final ``OUT.parquet`` is assembled from the parts in canonical order with a fixed column order and
written atomically, so an interrupted-and-resumed sweep ends with a byte-identical file to an
uninterrupted one. Next to it: ``OUT.summary.parquet`` (per-point mean and CI) and
``OUT.screen.parquet`` (screen predictions, simulator means and agreement). The three are computed first and
written as one step (:func:`_write_set`: SIGINT/SIGTERM/SIGHUP wait until the last is in place, ``OUT.parquet``
last, and the parts are retired in the same step), so an interrupted sweep leaves either the complete set or its
finished runs in ``OUT.parts/`` for ``--resume`` (the CLI says how many). Parts are removed once the
final files exist. Parts are crash-safe against process death, not power loss (no fsync per part).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from kvplan.atomic import atomic_write_bytes, check_distinct, check_output_file, deferred_signals
from kvplan.atomic_dir import ResultDirLock
from kvplan.errors import input_error
from kvplan.plan.executor import Task, require_ray, run_tasks, t_quantile_975
from kvplan.plan.grid import Grid, as_grid, check_runs, check_turns, grid_from_dict, load_grid
from kvplan.plan.screen import (
    analytic_screen,
    compare_screen,
    finished_runs,
    ramp_up_comparisons,
    simulator_saturated,
)

__all__ = [
    "Grid",
    "aggregate",
    "analytic_screen",
    "grid_from_dict",
    "load_grid",
    "load_results",
    "run_grid",
    "screen_report",
    "summary_path",
]

log = logging.getLogger(__name__)

ID_COLUMNS = ["point", "replication", "seed"]
SHARD = 1000  # points per parts sub-directory
FINGERPRINT_KEY = b"kvplan.grid_fingerprint"
Progress = Callable[[int, int], None]


# --- paths -------------------------------------------------------------------------------------------------


def _out_path(out: str | Path) -> Path:
    p = Path(out)
    return p if p.suffix == ".parquet" else p.with_name(p.name + ".parquet")


def _sibling(out: Path, suffix: str) -> Path:
    return out.with_name(out.name[: -len(".parquet")] + suffix)


def summary_path(out: str | Path) -> Path:
    """Where the per-point aggregate of ``out`` is written (``OUT.summary.parquet``)."""
    return _sibling(_out_path(out), ".summary.parquet")


def screen_path(out: str | Path) -> Path:
    """Where the screen-vs-simulator table of ``out`` is written (``OUT.screen.parquet``)."""
    return _sibling(_out_path(out), ".screen.parquet")


def parts_dir(out: str | Path) -> Path:
    """The directory of committed per-run parts of ``out`` (``OUT.parts/``)."""
    return _sibling(_out_path(out), ".parts")


# --- committed parts ---------------------------------------------------------------------------------------


class PartStore:
    """One JSON file per finished (point, replication), committed atomically; a manifest names the grid."""

    def __init__(self, out: Path, grid: Grid) -> None:
        self.out = out
        self.dir = parts_dir(out)
        self.fingerprint = grid.fingerprint()
        self.shape = (grid.n_points, grid.replications)

    def _manifest(self) -> Path:
        return self.dir / "manifest.json"

    def open(self, resume: bool) -> dict[tuple[int, int], dict[str, Any]]:
        """Prepare the directory; with ``resume`` return the rows already committed.

        Refused (before any work) when the parts directory, or the trash of a killed clean-up, holds anything
        kvplan did not write there (:func:`foreign_in_parts`): such a directory is never deleted.
        """
        trash = self.dir.with_name(f".{self.dir.name}.done")
        for d in (trash, self.dir):
            if os.path.lexists(d):
                stray = foreign_in_parts(d)
                if stray is not None:
                    raise input_error(str(self.dir), f"holds '{stray}', which was not written by kvplan sweep",
                                      "move it away or use another --out")
        if trash.exists():  # a previous sweep was killed while deleting its finished parts
            shutil.rmtree(trash, ignore_errors=True)
        if self.dir.exists():
            try:
                manifest = json.loads(self._manifest().read_text())
            except (OSError, json.JSONDecodeError):
                manifest = {}
            found = self._load()
            if manifest.get("fingerprint") not in (None, self.fingerprint) and found:
                raise input_error(
                    str(self.dir), "holds runs of a different grid (or of an older calibration profile)",
                    "use another --out or delete that directory"
                )
            if not resume and found:
                raise input_error(
                    str(self.dir),
                    f"holds {len(found)} finished runs of an interrupted sweep",
                    "pass --resume (API: resume=True) to continue it, or delete the directory",
                )
            if manifest.get("fingerprint") == self.fingerprint:
                return found if resume else {}
            if "fingerprint" not in manifest:  # not a parts directory kvplan made: never delete it
                raise input_error(
                    str(self.dir), "exists and was not written by kvplan sweep", "move it away or use another --out"
                )
            shutil.rmtree(self.dir)
        self.dir.mkdir(parents=True)
        atomic_write_bytes(self._manifest(), json.dumps({"fingerprint": self.fingerprint}).encode(), ledger=False)
        return {}

    def _load(self) -> dict[tuple[int, int], dict[str, Any]]:
        rows: dict[tuple[int, int], dict[str, Any]] = {}
        for shard in sorted(self.dir.iterdir()):
            if not shard.is_dir():
                continue
            for f in shard.iterdir():
                if f.name.startswith("."):
                    f.unlink(missing_ok=True)  # a temp file of a write that was killed
                    continue
                try:
                    p, k = (int(x) for x in f.stem.split("-"))
                    if not (0 <= p < self.shape[0] and 0 <= k < self.shape[1]):
                        log.warning("ignoring part %s: the grid has no point %d, replication %d", f, p, k)
                        continue
                    data = json.loads(f.read_text())
                except (ValueError, json.JSONDecodeError):
                    log.warning("ignoring unreadable part %s (it will be recomputed)", f)
                    continue
                rows[(p, k)] = checked_part(f, data)
        return rows

    def commit(self, point: int, rep: int, row: dict[str, Any]) -> None:
        """Write one finished run atomically (with its checksum, :func:`checked_part`)."""
        shard = self.dir / f"{point // SHARD:06d}"
        shard.mkdir(exist_ok=True)
        data = {**row, PART_DIGEST_KEY: part_digest(row)}
        atomic_write_bytes(shard / f"{point}-{rep}.json", json.dumps(data).encode(), ledger=False)

    def _trash(self) -> Path:
        return self.dir.with_name(f".{self.dir.name}.done")

    def retire(self) -> None:
        """Rename the parts to their trash once the final files are written (so a kill never half-deletes, and the
        parts no longer say the sweep is unfinished); :meth:`remove` deletes them.

        A parts directory that came to hold a file kvplan did not write is kept as it is (with a warning).
        """
        if self.dir.exists():
            stray = foreign_in_parts(self.dir)
            if stray is not None:
                log.warning("%s holds '%s', which kvplan did not write: the directory is kept", self.dir, stray)
                return
            trash = self._trash()
            if trash.exists():
                shutil.rmtree(trash)
            os.replace(self.dir, trash)

    def remove(self) -> None:
        """Drop the parts once the final files are written (:meth:`retire`, then delete the trash)."""
        self.retire()
        trash = self._trash()
        if trash.exists() and foreign_in_parts(trash) is None:
            shutil.rmtree(trash, ignore_errors=True)


#: Key of a part's checksum (:func:`part_digest` of the rest of the part); never a metric, dropped on reading.
PART_DIGEST_KEY = "_sha256"


def part_digest(row: dict[str, Any]) -> str:
    """sha256 of a part's row (its canonical JSON text)."""
    return hashlib.sha256(json.dumps(row, sort_keys=True).encode()).hexdigest()


def checked_part(path: Path, data: Any) -> dict[str, Any]:
    """The row of part file ``path`` (its JSON ``data``), or a one-line error when it is not what kvplan wrote: a
    checksum that does not match (the file was edited or damaged), an ``error`` that is not text, a metric that is
    not a number, or a finished run without any metric. A part of an older kvplan (no checksum) is checked the same
    way, so a damaged part stops ``--resume`` with the part named instead of reaching the results (or a traceback)."""
    fix = "delete that file (--resume recomputes its run) or use another --out"
    if not isinstance(data, dict):
        raise input_error(str(path), "is not a JSON object, so not a part kvplan sweep wrote", fix)
    row = dict(data)
    digest = row.pop(PART_DIGEST_KEY, None)
    if digest is not None and digest != part_digest(row):
        raise input_error(str(path), "was changed after kvplan sweep wrote it (its checksum does not match)", fix)
    error = row.get("error")
    if error is not None and not isinstance(error, str):
        raise input_error(str(path), f"field 'error' is {type(error).__name__}, not text or null", fix)
    for key, value in row.items():
        if key != "error" and (isinstance(value, bool) or not isinstance(value, int | float | None)):
            shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
            raise input_error(str(path), f"field '{key}' is {shown}, not a number", fix)
    if error is None and len(row) == 1:
        raise input_error(str(path), "holds a finished run without any metric", fix)
    return row


def committed_runs(out: str | Path) -> int:
    """How many finished runs the parts directory of ``out`` holds (0 when there is none)."""
    d = parts_dir(out)
    try:
        return sum(1 for shard in d.iterdir() if _SHARD_NAME.match(shard.name) and shard.is_dir()
                   for f in shard.iterdir() if _PART_NAME.match(f.name))
    except OSError:
        return 0


_SHARD_NAME = re.compile(r"^\d{6}$")
_PART_NAME = re.compile(r"^(\d+)-(\d+)\.json$")
_PART_TEMP = re.compile(r"^\.\d+-\d+\.json\.[a-z0-9_]{8}\.tmp$")
_MANIFEST_TEMP = re.compile(r"^\.manifest\.json\.[a-z0-9_]{8}\.tmp$")


def foreign_in_parts(d: Path) -> str | None:
    """The first entry of the parts directory ``d`` that kvplan sweep did not write there, else None.

    kvplan writes only ``manifest.json`` (a JSON object with the grid's fingerprint), shard folders
    ``NNNNNN/`` of part files ``P-K.json`` (each a JSON object with an ``error`` key) and the temporary files of
    those writes; a part's shard is ``P // 1000``.
    """
    if d.is_symlink() or not d.is_dir():
        return d.name
    for e in sorted(d.iterdir()):
        if e.name == "manifest.json" and e.is_file() and not e.is_symlink():
            data = _json_object(e)
            if data is None or "fingerprint" not in data:
                return e.name
        elif _MANIFEST_TEMP.match(e.name) and e.is_file() and not e.is_symlink():
            continue
        elif _SHARD_NAME.match(e.name) and e.is_dir() and not e.is_symlink():
            for f in sorted(e.iterdir()):
                m = _PART_NAME.match(f.name)
                if _PART_TEMP.match(f.name) and f.is_file() and not f.is_symlink():
                    continue
                if not m or f.is_symlink() or not f.is_file() or int(m[1]) // SHARD != int(e.name):
                    return f"{e.name}/{f.name}"
                data = _json_object(f)
                if data is None or "error" not in data:
                    return f"{e.name}/{f.name}"
        else:
            return e.name
    return None


def _json_object(path: Path) -> dict[str, Any] | None:
    try:
        if path.stat().st_size > 16 * 1024**2:
            return None
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


# --- assembly ----------------------------------------------------------------------------------------------


def _axis_column(values: list[Any]) -> pd.Series:
    """One axis as a typed column: bool, int64, float64, string, or canonical JSON text for anything else."""
    if all(isinstance(v, bool) for v in values):
        return pd.Series(values, dtype=bool)
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return pd.Series(values, dtype=np.int64)
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return pd.Series([float(v) for v in values], dtype=np.float64)
    if all(isinstance(v, str) for v in values):
        return pd.Series(values, dtype=object)
    return pd.Series([json.dumps(v, sort_keys=True, default=str) for v in values], dtype=object)


def assemble(grid: Grid, keys: list[tuple[int, int]], rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows in canonical order as a frame: ``point, replication, seed``, the axes, ``error``, then the metrics.

    Metric columns appear in first-seen order; a metric column is int64 when every run has an integer,
    float64 otherwise (NaN where a run failed).
    """
    seeds = grid.seeds  # computed once: a property that spawns the seed sequence
    data: dict[str, Any] = {
        "point": np.array([p for p, _ in keys], dtype=np.int64),
        "replication": np.array([k for _, k in keys], dtype=np.int64),
        "seed": np.array([seeds[k] for _, k in keys], dtype=np.int64),
    }
    for j, name in enumerate(grid.axis_names):
        data[name] = _axis_column([grid.point_values(p)[j] for p, _ in keys]).to_numpy()
    data["error"] = np.array([r.get("error") for r in rows], dtype=object)
    metrics: dict[str, None] = {}
    for r in rows:
        for k in r:
            if k != "error" and k not in data:
                metrics.setdefault(k)
    for m in metrics:
        vals = [r.get(m) for r in rows]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in vals):
            data[m] = np.array(vals, dtype=np.int64)
        else:
            data[m] = np.array([np.nan if v is None else float(v) for v in vals], dtype=np.float64)
    return pd.DataFrame(data)


def _numeric_metrics(df: pd.DataFrame, grid: Grid) -> list[str]:
    skip = set(ID_COLUMNS) | set(grid.axis_names) | {"error"}
    return [c for c in df.columns if c not in skip and pd.api.types.is_numeric_dtype(df[c])]


def aggregate(df: pd.DataFrame, grid: Grid) -> pd.DataFrame:
    """Per point: the axes, ``replications``, ``errors``, then ``<metric>_mean`` and ``<metric>_ci95``.

    ``_ci95`` is the half-width of the 95% Student-t interval of the mean across replications
    (``t_{0.975, n-1} x sd / sqrt(n)``; NaN with a single replication).
    """
    metrics = _numeric_metrics(df, grid)
    points = sorted(df["point"].unique().tolist())
    out: dict[str, Any] = {"point": np.array(points, dtype=np.int64)}
    for j, name in enumerate(grid.axis_names):
        out[name] = _axis_column([grid.point_values(p)[j] for p in points]).to_numpy()
    g = df.groupby("point", sort=True)
    out["replications"] = g.size().reindex(points).to_numpy(dtype=np.int64)
    out["errors"] = g["error"].apply(lambda s: int(s.notna().sum())).reindex(points).to_numpy(dtype=np.int64)
    values = df[metrics].astype(float)
    values.insert(0, "point", df["point"].to_numpy())
    gv = values.groupby("point", sort=True)
    mean = gv.mean().reindex(points)
    sd = gv.std(ddof=1).reindex(points)
    n = gv.count().reindex(points)
    for m in metrics:
        tq = np.array([t_quantile_975(int(k)) for k in n[m].to_numpy()])
        out[f"{m}_mean"] = mean[m].to_numpy()
        out[f"{m}_ci95"] = tq * sd[m].to_numpy() / np.sqrt(np.maximum(n[m].to_numpy(), 1))
    return pd.DataFrame(out)


def sweep_outputs(out: str | Path) -> list[tuple[str, Path]]:
    """Every file a sweep into ``out`` writes, with the flag an error names: ``OUT.parquet``, the summary and
    the screen table (``OUT.parts/`` is checked by :class:`PartStore`)."""
    o = _out_path(out)
    return [("--out", o), ("--out (summary)", summary_path(o)), ("--out (screen)", screen_path(o))]


def check_sweep_outputs(out: str | Path, overwrite: bool = False, inputs: Iterable[Any] = (),
                        extra: Iterable[tuple[str, Any]] = ()) -> None:
    """Apply the output rule (:func:`kvplan.atomic.check_output_file`) to every file of a sweep, and refuse a
    parts directory holding anything kvplan did not write, before any work."""
    inputs = list(inputs)
    outs = [*sweep_outputs(out), *extra]
    check_distinct(outs)
    for flag, p in outs:
        if p is not None:
            check_output_file(p, flag, inputs=inputs, overwrite=overwrite)
    parts = parts_dir(out)
    for d in (parts.with_name(f".{parts.name}.done"), parts):
        stray = foreign_in_parts(d) if os.path.lexists(d) else None
        if stray is not None:
            raise input_error(str(parts), f"holds '{stray}', which was not written by kvplan sweep",
                              "move it away or use another --out")


def _parquet_bytes(df: pd.DataFrame, fingerprint: str) -> bytes:
    table = pa.Table.from_pandas(df, preserve_index=False)
    meta = dict(table.schema.metadata or {})
    meta[FINGERPRINT_KEY] = fingerprint.encode()
    table = table.replace_schema_metadata(meta)
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return bytes(sink.getvalue().to_pybytes())


def _write_set(files: list[tuple[str, Path, bytes]], overwrite: bool, inputs: Iterable[Any],
               then: Callable[[], None] | None = None) -> None:
    """Write the final files of a sweep (flag, path, bytes; each atomically, in order) as one step: every file is
    checked first, and SIGINT/SIGTERM/SIGHUP wait until the last is in place and ``then`` (retiring the parts) has
    run, so an interrupt never leaves a new ``OUT.parquet`` without its summary and screen table. A SIGKILL in
    between leaves the parts (``OUT.parts/``), which ``--resume`` finishes from; ``OUT.parquet`` goes last."""
    inputs = list(inputs)
    for flag, path, _ in files:
        check_output_file(path, flag, inputs=inputs, overwrite=overwrite)
    with deferred_signals():
        for flag, path, data in files:
            atomic_write_bytes(path, data, flag, fsync=True, overwrite=overwrite, inputs=inputs)
        if then is not None:
            then()


def _final_fingerprint(path: Path) -> str | None:
    try:
        meta = pq.read_schema(path).metadata or {}
    except (OSError, pa.ArrowInvalid):
        return None
    v = meta.get(FINGERPRINT_KEY)
    return v.decode() if v else None


def load_results(out: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read a finished sweep: (rows, per-point summary)."""
    p = _out_path(out)
    return pd.read_parquet(p), pd.read_parquet(summary_path(p))


# --- the sweep ---------------------------------------------------------------------------------------------


def _schedule(
    grid: Grid, done: set[tuple[int, int]], screen: pd.DataFrame | None, prune: bool
) -> tuple[list[Task], set[int]]:
    """Tasks still to run, longest predicted first (screen order), and the points pruned to one replication."""
    n = grid.n_points
    order = list(range(n))
    pruned: set[int] = set()
    if screen is not None:
        cost = np.nan_to_num(screen["screen_cost"].to_numpy(dtype=float), nan=np.inf)  # not screened: first
        order = sorted(range(n), key=lambda i: (-cost[i], i))  # longest first: better pool balance
        if prune:
            pruned = {int(p) for p in screen.loc[screen["screen_feasible"] == 0, "point"]}
    tasks: list[Task] = []
    seeds = grid.seeds
    for p in order:
        reps = [0] if p in pruned else range(grid.replications)
        tasks.extend(((p, k), grid.point_overrides(p), seeds[k]) for k in reps if (p, k) not in done)
    return tasks, pruned


def run_grid(
    grid: Grid | dict[str, Any] | str | Path,
    replications: int | None = None,
    backend: str = "local",
    workers: int = 1,
    ray_address: str | None = None,
    progress: Progress | None = None,
    out: str | Path | None = None,
    resume: bool = False,
    yes: bool = False,
    order: str = "screen",
    prune: bool = False,
    overwrite: bool = False,
    inputs: Iterable[Any] = (),
) -> pd.DataFrame:
    """Run every (point, replication) of ``grid`` and return one row each, in canonical order.

    ``grid``: a :class:`Grid`, a grid mapping or a grid YAML path (validated completely before any run).
    ``replications``: overrides the grid's; replication ``k`` uses seed ``grid.seeds[k]`` at every point.
    ``backend``: ``'local'`` (process pool; ``workers=1`` runs in-process) or ``'ray'`` (``ray_address``
    or a local Ray). ``progress(done, total)`` is called as runs finish. ``out``: write the rows, the
    per-point aggregate and the screen comparison there (``.parquet``); ``resume=True`` continues an
    interrupted sweep of the same grid. ``order='screen'`` runs the longest predicted points first
    (``'canonical'`` in point order). ``prune=True`` runs one replication of points the screen deems
    infeasible and the rest only if the simulator disagrees (the simulator wins). The returned rows and
    the files never depend on backend, workers, order or interruptions. The output files follow kvplan's
    output rule, checked before any work: an existing file kvplan did not write is replaced only with
    ``overwrite``, and none may be one of ``inputs`` (the grid's files are added to them).
    """
    g = as_grid(grid, yes=yes)
    if replications is not None:
        g = g.with_replications(replications)
        check_runs(g.n_points, g.replications, g.source, yes)
        check_turns(g, yes)
    _check_run_options(order, backend, workers)
    out_p = _out_path(out) if out is not None else None
    inputs = [*inputs, *g.input_files()]
    if out_p is None:
        return _run(g, None, resume, order, prune, backend, workers, ray_address, progress, overwrite, inputs)
    check_sweep_outputs(out_p, overwrite, inputs)
    lock = _lock_out(out_p)
    try:
        return _run(g, out_p, resume, order, prune, backend, workers, ray_address, progress, overwrite, inputs)
    finally:
        lock.release()


def _lock_out(out: Path) -> ResultDirLock:
    """Take the lock of a sweep's outputs (``.OUT.parquet.kvplan-lock`` next to it, as ``simulate`` locks its result
    directory: :class:`kvplan.atomic_dir.ResultDirLock`), or refuse in one line naming the sweep that holds it."""
    lock = ResultDirLock(out, "--out")
    try:
        free = lock.try_acquire()
    except OSError as exc:
        raise input_error(f"--out {out}", f"cannot create the lock file {lock.path} ({exc.strerror or exc})") from None
    if not free:
        raise input_error(f"--out {out}", f"another kvplan sweep (pid {lock.holder()}) is writing it (it holds "
                          f"{lock.path})", "wait for it to finish or choose another --out")
    return lock


def _run(g: Grid, out_p: Path | None, resume: bool, order: str, prune: bool, backend: str, workers: int,
         ray_address: str | None, progress: Progress | None, overwrite: bool, inputs: list[Any]) -> pd.DataFrame:
    """The sweep of :func:`run_grid` once its options are checked (and, with ``out_p``, its outputs locked)."""
    fp = g.fingerprint()
    if out_p is not None and resume and not parts_dir(out_p).exists() and _final_fingerprint(out_p) == fp:
        if progress:
            total = len(pd.read_parquet(out_p))
            progress(total, total)
        _write_set(_summary_files(g, pd.read_parquet(out_p), out_p, fp, None), overwrite, inputs)
        return pd.read_parquet(out_p)
    store = PartStore(out_p, g) if out_p is not None else None
    if out_p is not None:
        out_p.parent.mkdir(parents=True, exist_ok=True)
    rows = store.open(resume) if store is not None else {}
    screen = analytic_screen(g) if (order == "screen" or prune) else None
    tasks, pruned = _schedule(g, set(rows), screen, prune)
    seeds = g.seeds
    # resumed pruned points whose single replication already disagreed get their other replications
    for p in sorted(pruned):
        if (p, 0) in rows and _disagrees(rows[(p, 0)]):
            tasks.extend(((p, k), g.point_overrides(p), seeds[k]) for k in range(1, g.replications)
                         if (p, k) not in rows)
    collector = _Collector(g, rows, store, pruned, progress, len(rows) + len(tasks))
    run_tasks(g.base, fp, tasks, collector.on_result, backend=backend, workers=workers, ray_address=ray_address)
    keys = sorted(rows)
    df = assemble(g, keys, [rows[k] for k in keys])
    if out_p is not None and store is not None:
        files = [*_summary_files(g, df, out_p, fp, screen), ("--out", out_p, _parquet_bytes(df, fp))]
        _write_set(files, overwrite, inputs, then=store.retire)
        store.remove()
        return pd.read_parquet(out_p)
    return df


def _check_run_options(order: str, backend: str, workers: int) -> None:
    if order not in ("screen", "canonical"):
        raise input_error("order", f"unknown order '{order}'", "use 'screen' or 'canonical'")
    if backend == "ray":
        require_ray()
    elif backend != "local":
        raise input_error("--backend", f"unknown backend '{backend}'", "use local or ray")
    if not isinstance(workers, int) or workers < 1:
        raise input_error("--workers", f"must be an integer >= 1, got {workers!r}")


def _disagrees(row: dict[str, Any]) -> bool:
    """Whether the first run of a pruned point contradicts the screen's 'saturated': it finished unsaturated (a
    failed run has no verdict and adds no replications)."""
    return row.get("error") is None and not simulator_saturated(row)


class _Collector:
    """Commits each finished run, reports progress, and adds the replications of a pruned point the simulator
    finds unsaturated (the simulator wins)."""

    def __init__(self, grid: Grid, rows: dict[tuple[int, int], dict[str, Any]], store: PartStore | None,
                 pruned: set[int], progress: Progress | None, total: int) -> None:
        self.grid, self.rows, self.store, self.pruned, self.progress = grid, rows, store, pruned, progress
        self.seeds = grid.seeds
        self.total = total
        if progress:
            progress(len(rows), total)

    def on_result(self, key: Any, row: dict[str, Any]) -> Iterable[Task] | None:
        """Record ``row`` of run ``key = (point, replication)``; returns the runs to add."""
        g = self.grid
        p, k = int(key[0]), int(key[1])
        row = json.loads(json.dumps(row))  # exactly what a resumed sweep reads back from the part
        if self.store is not None:
            self.store.commit(p, k, row)
        self.rows[(p, k)] = row
        more: list[Task] = []
        if p in self.pruned and k == 0 and _disagrees(row):
            log.info("point %d: the screen predicted saturation, the simulator disagrees: running all replications", p)
            more = [((p, j), g.point_overrides(p), self.seeds[j]) for j in range(1, g.replications)]
            self.total += len(more)
        if self.progress:
            self.progress(len(self.rows), self.total)
        return more


def _summary_files(grid: Grid, df: pd.DataFrame, out: Path, fp: str,
                   screen: pd.DataFrame | None) -> list[tuple[str, Path, bytes]]:
    """The summary and screen files of the rows ``df`` (flag, path, bytes), computed before anything is written."""
    summ = aggregate(df, grid)
    rep = screen_report(grid, summ, screen)
    return [("--out (summary)", summary_path(out), _parquet_bytes(summ, fp)),
            ("--out (screen)", screen_path(out), _parquet_bytes(rep, fp))]


def screen_report(grid: Grid, summary: pd.DataFrame, screen: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per point: the screen's predictions, the simulator's means and ``disagreements`` (the simulator wins).

    ``disagreements`` is a ';'-separated list of ``metric(screen=..., simulator=...)``; empty when they agree.
    ``not_steady``: the same for the steady-state figures not compared because the simulated window started in the
    ramp-up (:func:`kvplan.plan.screen.ramp_up_comparisons`: the run is too short to confirm or refute the screen).
    ``simulator_runs``: the runs of the point that finished, which the means are over (0: every run failed, the
    simulator has no verdict and nothing is compared).
    """
    scr = analytic_screen(grid) if screen is None else screen
    dis = compare_screen(scr, summary)
    txt = _comparison_text(dis)
    ramp = _comparison_text(ramp_up_comparisons(scr, summary))
    keep = ["point", *grid.axis_names]
    sim_cols = [c for c in ("hit_rate_mean", "steady_pinned_kv_gib_mean_mean", "prefill_utilization_steady_mean",
                            "prefill_utilization_mean")
                if c in summary.columns]
    rep = scr.merge(summary[["point", *sim_cols]], on="point", how="left")
    runs = {int(r["point"]): finished_runs(r) for _, r in summary.iterrows()}
    rep["simulator_runs"] = np.array([runs.get(int(p)) or 0 for p in rep["point"]], dtype=np.int64)
    rep["disagreements"] = [txt.get(int(p), "") for p in rep["point"]]
    rep["not_steady"] = [ramp.get(int(p), "") for p in rep["point"]]
    return rep[keep + [c for c in rep.columns if c not in keep]]


def _comparison_text(rows: pd.DataFrame) -> dict[int, str]:
    """Per point, ``metric(screen=..., simulator=...)`` of each row, ';'-separated."""
    return {
        int(cast(int, p)): "; ".join(f"{r.metric}(screen={r.screen:.4g}, simulator={r.simulator:.4g})"
                                     for r in grp.itertuples())
        for p, grp in rows.groupby("point")
    }
