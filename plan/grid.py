"""Sweep grids: a base scenario plus axes (dotted scenario path -> list of values), validated up front.

A grid file (YAML) has ``base:`` (an inline scenario mapping, or a path to a scenario file, relative to
the grid file) and ``axes:`` (``{dotted.path: [values...]}``, e.g. ``policy.decoder_kv_blocks_ttl_s:
[30, 60, 120]``), plus optional ``replications:`` (default 1) and ``seed:`` (the base seed; default the
base scenario's), ``zip:`` (a list of groups ``{path: [...], path2: [...]}`` of equal-length lists whose
values vary together, one dimension each) and ``ties:`` (``{path: "axis.path - 10"}``: a value computed from
an axis of the point, :mod:`kvplan.plan.grid_ties`, parsed, never evaluated). Points are the cartesian product
of the axes in file order and then the zipped groups, the last varying fastest; point ``i`` is decoded from
``i`` in mixed radix. A point's values are the axes', then the zipped paths', then the tied paths'.
Replication ``k`` of every point runs with seed ``replication_seeds(seed, K)[k]``, spawned from
``SeedSequence(seed)`` (common random numbers: the same draws across points).

Everything a sweep could trip over is checked before any simulation starts and reported as one-line
:class:`~kvplan.errors.KvplanInputError`: unknown top-level keys, unknown dotted paths (with a
suggestion), empty or non-list axes, grids above :data:`MAX_POINTS` without ``yes``, and every point's
scenario (pydantic validation plus preset/profile resolution and empirical files).
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
import math
import os
import types
import typing
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from kvplan.errors import KvplanInputError, input_error
from kvplan.plan.grid_ties import Tie, parse_tie, parse_zip
from kvplan.sim.scenario import (
    MAX_SEED,
    Scenario,
    dist_mean_inline,
    load_scenario,
    read_yaml_file,
    scenario_from_dict,
    with_overrides,
)
from kvplan.sim.seeds import replication_seeds

MAX_POINTS = 10_000  # above it (or MAX_RUNS runs) only with --yes: validating 10,000 points takes ~1 s
MAX_RUNS = 100_000  # points x replications (each run is a full simulation)
MAX_REPLICATIONS = 1_000
# planned turns of every run together (points x replications x conversations x mean turns) above which a sweep
# needs --yes: about 3 CPU-hours at the measured ~12 s per million turns (README, "Scale"); MAX_RUNS alone let
# 100,000 runs of 10M turns each (years) start
MAX_TURNS = 1_000_000_000
GRID_KEYS = ("base", "axes", "replications", "seed", "zip", "ties")
# bump when the row schema, the seeding rule or the model's results change (invalidates resumable parts);
# 2: vLLM's memory accounting sizes the KV pools (models/memory.py), so rows of version 1 are not resumed
# 3: steady_served_turns_per_s is counted over the pricing window (plan/pricing.py, the second half of the arrival
#    window) and rows gain priced_window_start_s/_end_s: a version-2 row's served rate is over another window
# 4: rows gain follow_up_d_missed_fraction and follow_up_d_hit_token_fraction (plan/executor.py run_extras, the health
#    section's routing check): a version-3 row has them empty
FORMAT_VERSION = 4


@dataclass(frozen=True)
class Grid:
    """A validated sweep grid. Build it with :func:`load_grid` or :func:`grid_from_dict`; never mutate it."""

    base: Scenario
    axes: tuple[tuple[str, tuple[Any, ...]], ...]
    replications: int = 1
    base_seed: int = 0
    source: str = "grid"
    zips: tuple[tuple[tuple[str, ...], tuple[tuple[Any, ...], ...]], ...] = ()
    ties: tuple[tuple[str, Tie], ...] = ()

    @property
    def axis_names(self) -> list[str]:
        """Dotted paths of the axes, the zipped groups and the ties, in grid order (the columns of a sweep)."""
        return ([name for name, _ in self.axes] + [n for names, _ in self.zips for n in names]
                + [name for name, _ in self.ties])

    @property
    def n_points(self) -> int:
        """Number of points (product of the axis and zipped-group lengths; 1 for a grid without axes)."""
        return math.prod(len(v) for _, v in self.axes) * math.prod(len(rows) for _, rows in self.zips)

    @property
    def seeds(self) -> list[int]:
        """Seed of each replication, spawned from ``base_seed`` (:func:`kvplan.sim.seeds.replication_seeds`)."""
        return replication_seeds(self.base_seed, self.replications)

    def point_values(self, i: int) -> tuple[Any, ...]:
        """Values of point ``i`` in :attr:`axis_names` order (mixed radix over the axes then the zipped groups,
        the last fastest; tied values computed from them)."""
        dims: list[tuple[Any, ...]] = [tuple((v,) for v in vals) for _, vals in self.axes]
        dims += [rows for _, rows in self.zips]
        picked: list[tuple[Any, ...]] = []
        for rows in reversed(dims):
            i, r = divmod(i, len(rows))
            picked.append(rows[r])
        flat = [v for row in reversed(picked) for v in row]
        if not self.ties:
            return tuple(flat)
        known = dict(zip(self.axis_names, flat, strict=False))
        where = self.source + ": tie"
        return (*flat, *(tie.value(known[tie.source], f"{where} '{name}'") for name, tie in self.ties))

    def point_overrides(self, i: int) -> dict[str, Any]:
        """``{dotted path: value}`` of point ``i``, for :func:`~kvplan.sim.scenario.with_overrides`."""
        return dict(zip(self.axis_names, self.point_values(i), strict=True))

    def scenario(self, i: int) -> Scenario:
        """The validated scenario of point ``i``."""
        ov = self.point_overrides(i)
        return with_overrides(self.base, ov) if ov else self.base

    def fingerprint(self) -> str:
        """sha256 of everything that determines the results: base, axes, replications, seeds, the row format,
        the content of the shipped calibration profiles (a re-calibration invalidates resumable parts) and the
        bytes of every file a point reads (:meth:`input_files`: empirical samples, traces, profile JSON), so
        that ``--resume`` never mixes rows computed from an old and a new version of a file."""
        payload = {
            "format": FORMAT_VERSION,
            "profiles": _profiles_digest(),
            "inputs": {path: _file_digest(path) for path in self.input_files()},
            "base": self.base.model_dump(mode="json"),
            "axes": [[n, list(v)] for n, v in self.axes],
            "replications": self.replications,
            "base_seed": self.base_seed,
        }
        if self.zips:  # absent when unused, so that the fingerprints of older grids (and --resume) stay valid
            payload["zip"] = [[list(names), [list(r) for r in rows]] for names, rows in self.zips]
        if self.ties:
            payload["ties"] = [[name, t.text] for name, t in self.ties]
        text = json.dumps(payload, sort_keys=True, default=str, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()

    def input_files(self) -> list[str]:
        """Every file path any point of the grid reads, sorted: the ``path`` and ``profile`` strings of the base
        scenario and of the axis values (a shipped profile's name is listed too and digests to None; the
        shipped profiles are covered by their own digest)."""
        found = _referenced_files(self.base.model_dump(mode="json"))
        for name, values in self.axes:
            found |= _referenced_files(list(values), name.rsplit(".", 1)[-1])
        for names, rows in self.zips:
            for j, name in enumerate(names):
                found |= _referenced_files([r[j] for r in rows], name.rsplit(".", 1)[-1])
        return sorted(found)

    def with_replications(self, replications: int) -> Grid:
        """The same grid with another replication count (validated)."""
        ok = isinstance(replications, int) and not isinstance(replications, bool)
        if not ok or not 1 <= replications <= MAX_REPLICATIONS:
            raise input_error(
                f"{self.source}: replications", f"must be an integer in 1..{MAX_REPLICATIONS}, got {replications!r}"
            )
        return replace(self, replications=replications)


#: Scenario keys whose string value may name a file a run reads.
FILE_KEYS = ("path", "profile")


def _referenced_files(value: Any, key: str = "") -> set[str]:
    """Strings under a :data:`FILE_KEYS` key anywhere in ``value`` (nested mappings and lists)."""
    if isinstance(value, dict):
        return set().union(*(_referenced_files(v, str(k)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return set().union(*(_referenced_files(v, key) for v in value))
    if isinstance(value, str) and key in FILE_KEYS:
        return {value}
    return set()


def scenario_input_files(scenario: Any) -> list[str]:
    """The files a scenario reads (its ``path`` and ``profile`` strings; a shipped profile's name too, which
    names no file): the inputs an output must never replace."""
    return sorted(_referenced_files(scenario.model_dump(mode="json")))


def _file_digest(path: str) -> str | None:
    """sha256 of the file's bytes (None when it is absent: validation reports that separately)."""
    p = Path(path)
    if not p.is_file():
        return None
    with p.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def _profiles_digest() -> str:
    from kvplan.models.profile import _profiles_dir

    h = hashlib.sha256()
    for p in sorted(_profiles_dir().glob("*.json")):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()


# --- dotted paths -----------------------------------------------------------------------------------------


def _members(ann: Any) -> list[Any]:
    """Flatten Annotated / Optional / Union annotations into their member types."""
    origin = typing.get_origin(ann)
    if origin is typing.Annotated:
        return _members(typing.get_args(ann)[0])
    if origin is typing.Union or origin is types.UnionType:
        out: list[Any] = []
        for a in typing.get_args(ann):
            out.extend(_members(a))
        return out
    return [ann]


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, BaseModel)


def _is_open_mapping(t: Any) -> bool:
    return t is dict or typing.get_origin(t) is dict


def scenario_paths() -> list[str]:
    """Every dotted path a grid axis may name (sections, leaves, and every distribution's parameters)."""
    out: list[str] = []

    def walk(model: type[BaseModel], prefix: str, depth: int) -> None:
        for name, f in model.model_fields.items():
            path = f"{prefix}{name}"
            out.append(path)
            if depth > 4:
                continue
            for m in _members(f.annotation):
                if _is_model(m):
                    walk(m, path + ".", depth + 1)

    walk(Scenario, "", 0)
    return sorted(set(out))


def check_path(path: str) -> None:
    """Raise a one-line error unless ``path`` names a scenario field (inline model/hardware specs allowed)."""
    parts = path.split(".")
    types_now: list[Any] = [Scenario]
    for depth, part in enumerate(parts):
        nxt: list[Any] = []
        open_map = False
        for t in types_now:
            if _is_model(t) and part in t.model_fields:
                nxt.extend(_members(t.model_fields[part].annotation))
            elif _is_open_mapping(t):
                open_map = True
        if open_map:
            return  # inline model / hardware specs: validated per point
        if not nxt:
            parent = ".".join(parts[:depth])
            known = [k for k in scenario_paths() if k.startswith(parent + ".") or not parent]
            known = [k for k in known if k.count(".") == depth] or scenario_paths()
            near = difflib.get_close_matches(".".join(parts[: depth + 1]), known, n=1, cutoff=0.3)
            hint = f"did you mean '{near[0]}'?" if near else "`kvplan simulate --help` lists the fields"
            where = ".".join(parts[: depth + 1])
            raise input_error(f"axis '{path}'", f"unknown scenario field '{where}'", hint)
        types_now = nxt


# --- loading ----------------------------------------------------------------------------------------------


def _load_base(base: Any, where: str, base_dir: Path | None) -> Scenario:
    if isinstance(base, Scenario):
        return base
    if isinstance(base, str | Path):
        p = Path(base)
        if not p.is_absolute() and base_dir is not None:
            p = base_dir / p
        return load_scenario(p)
    if isinstance(base, dict):
        return scenario_from_dict(base, where=f"{where}: base")
    raise input_error(f"{where}: base", "must be a scenario mapping or a path to a scenario YAML file")


def _validate_point(grid: Grid, i: int, resolved: dict[str, Any]) -> None:
    """Validate point ``i``: pydantic, then preset/profile resolution and empirical files (cached by key)."""
    from kvplan.sim.engine import resolve
    from kvplan.sim.validity import check_tensor_parallel
    from kvplan.sim.workload import load_empirical_values

    ov = grid.point_overrides(i)
    try:
        sc = with_overrides(grid.base, ov) if ov else grid.base
        if sc.seed != grid.base.seed:
            raise input_error("seed", "is set by the grid (seed + replication)", "remove 'seed' from the axes")
        key = json.dumps(
            sc.model_dump(mode="json", include={"model", "hardware", "profile", "deployment", "costs"}),
            sort_keys=True,
        )
        if key not in resolved:
            resolved[key] = resolve(sc)
            check_tensor_parallel(resolved[key].arch, sc.deployment.tensor_parallel_size)
        for name in ("turns", "prefix_tokens", "user_tokens", "output_tokens", "turn_gap_s"):
            dist = getattr(sc.workload, name)
            if getattr(dist, "path", None):
                fkey = f"file:{dist.path}:{dist.column}"
                if fkey not in resolved:
                    resolved[fkey] = load_empirical_values(dist.path, dist.column).size
    except KvplanInputError as exc:
        msg = str(exc).replace("scenario with overrides: ", "")
        shown = json.dumps(ov, default=str)
        if len(shown) > 200:
            shown = shown[:197] + "..."
        raise KvplanInputError(f"{grid.source}: point {i} {shown}: {msg}") from None


def check_runs(n_points: int, replications: int, where: str, yes: bool) -> None:
    """Refuse more than :data:`MAX_RUNS` simulations (points x replications) unless ``yes``."""
    if n_points * replications > MAX_RUNS and not yes:
        raise input_error(
            where, f"{n_points:,} points x {replications:,} replications = {n_points * replications:,} runs "
            f"(more than {MAX_RUNS:,})", "pass --yes to run it anyway",
        )


def planned_turns(sc: Scenario) -> float:
    """The turns one run of ``sc`` plans: conversations x mean turns (at least one each; one for turns drawn from a
    file); for a trace replay the trace's requests (an upper bound: a window or a session sample keeps fewer), read
    once per file version (:func:`_trace_requests`): a run is bounded by the trace's own limit, but a command
    replaying it many times (replications x TTLs) is bounded here like a synthetic workload."""
    wl = sc.workload
    if wl.trace is not None:
        return float(_trace_requests(wl.trace.path, wl.trace.format))
    mean = dist_mean_inline(wl.turns)
    return wl.conversations * max(1.0, mean if mean is not None else 1.0)


def _trace_requests(path: str, fmt: str | None) -> int:
    """Requests of the trace at ``path`` (read with its reader, so a bad file is the reader's one-line error), cached
    by path, format, size and modification time."""
    try:
        st = os.stat(path)
    except OSError:
        st = None
    key = (os.path.abspath(path), fmt, st.st_size if st else -1, st.st_mtime_ns if st else -1)
    return _trace_requests_cached(*key)


@functools.lru_cache(maxsize=32)
def _trace_requests_cached(path: str, fmt: str | None, _size: int, _mtime_ns: int) -> int:
    from kvplan.traces.readers import load_trace

    return int(load_trace(path, fmt).n_requests)


def check_planned_work(runs: int, sc: Scenario, where: str, fix: str) -> None:
    """Refuse, before any run, a command planning at least ``runs`` simulations of ``sc`` whose turns together exceed
    :data:`MAX_TURNS` (recommend, compare and capacity; a sweep: :func:`check_turns`)."""
    per_run = planned_turns(sc)
    total = runs * per_run
    if total > MAX_TURNS:
        raise input_error(where, f"{runs:,} planned simulations x {per_run:,.0f} turns = {total:,.0f} simulated turns "
                          f"(more than {MAX_TURNS:,}: hours to days of CPU)", fix)


def check_turns(grid: Grid, yes: bool) -> None:
    """Refuse a sweep planning more than :data:`MAX_TURNS` turns over all its runs unless ``yes``."""
    if yes:
        return
    if any(n == "workload" or n.startswith("workload.") for n in grid.axis_names):
        per_rep = sum(planned_turns(with_overrides(grid.base, grid.point_overrides(i))) for i in range(grid.n_points))
    else:
        per_rep = grid.n_points * planned_turns(grid.base)
    total = per_rep * grid.replications
    if total > MAX_TURNS:
        raise input_error(grid.source, f"{grid.n_points:,} points x {grid.replications:,} replications plan "
                          f"{total:,.0f} simulated turns (more than {MAX_TURNS:,}: hours to days of CPU)",
                          "lower the points, replications or workload.conversations, or pass --yes to run it anyway")


def grid_from_dict(
    data: Any, where: str = "grid", base_dir: Path | None = None, yes: bool = False, validate_points: bool = True
) -> Grid:
    """Validate a grid mapping into a :class:`Grid` (all points checked unless ``validate_points=False``).

    Raises a one-line :class:`KvplanInputError` for unknown keys or dotted paths, empty/non-list axes,
    bad replications/seed, more than :data:`MAX_POINTS` points without ``yes=True``, or any point whose
    scenario does not validate. No simulation runs here.
    """
    if not isinstance(data, dict):
        raise input_error(where, "a grid is a mapping with 'base:' and 'axes:'")
    unknown = [k for k in data if k not in GRID_KEYS]
    if unknown:
        raise input_error(f"{where}: '{unknown[0]}'", "unknown grid key", f"use {', '.join(GRID_KEYS)}")
    if "base" not in data:
        raise input_error(where, "missing 'base:' (an inline scenario or a path to one)")
    # an empty or misspelt section ('ties: []', 'zip: {}') is an error, not a grid without it
    axes = _axes({} if data.get("axes") is None else data["axes"], where)
    zips = _zips([] if data.get("zip") is None else data["zip"], where)
    names = [n for n, _ in axes] + [n for group, _ in zips for n in group]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise input_error(f"{where}: '{twice[0]}'", "is an axis twice (in axes and/or zip groups)", "keep one")
    ties = _ties({} if data.get("ties") is None else data["ties"], where, names)
    _check_nested([*names, *(n for n, _ in ties)], where)
    n_points = math.prod(len(v) for _, v in axes) * math.prod(len(rows) for _, rows in zips)
    if n_points > MAX_POINTS and not yes:
        raise input_error(
            where, f"{n_points:,} points (more than {MAX_POINTS:,})", "pass --yes (API: yes=True) to run it anyway"
        )
    reps = data.get("replications", 1)
    if not isinstance(reps, int) or isinstance(reps, bool) or not 1 <= reps <= MAX_REPLICATIONS:
        raise input_error(f"{where}: replications", f"must be an integer in 1..{MAX_REPLICATIONS}, got {reps!r}")
    check_runs(n_points, reps, where, yes)
    base = _load_base(data["base"], where, base_dir)
    seed = data.get("seed", base.seed)
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise input_error(f"{where}: seed", f"must be an integer in 0..{MAX_SEED} (a scenario's seed range), "
                          f"got {seed!r:.40}")
    grid = Grid(base=base, axes=tuple(axes), replications=reps, base_seed=seed, source=where, zips=tuple(zips),
                ties=tuple(ties))
    if validate_points:
        resolved: dict[str, Any] = {}
        for i in range(grid.n_points):
            _validate_point(grid, i, resolved)
    check_turns(grid, yes)
    return grid


def _axes(axes_raw: Any, where: str) -> list[tuple[str, tuple[Any, ...]]]:
    """The axes in order, each a known dotted scenario path (not the seed) with a non-empty list of values."""
    if not isinstance(axes_raw, dict):
        raise input_error(f"{where}: axes", "must be a mapping {dotted.path: [values, ...]}")
    axes: list[tuple[str, tuple[Any, ...]]] = []
    for name, vals in axes_raw.items():
        if not isinstance(name, str) or not name:
            raise input_error(f"{where}: axes", f"axis name {name!r} must be a dotted scenario path")
        if not isinstance(vals, list):
            raise input_error(f"{where}: axis '{name}'", f"must be a list of values, got {type(vals).__name__}")
        if not vals:
            raise input_error(f"{where}: axis '{name}'", "is empty", "give at least one value or remove the axis")
        seen: set[Any] = set()
        for v in vals:  # a value listed twice ran the same point twice, unsaid (replications repeat a point)
            key = _value_key(v)
            if key in seen:
                raise input_error(f"{where}: axis '{name}'", f"lists {v!r} twice",
                                  "list each value once (replications: N repeats every point with new seeds)")
            seen.add(key)
        axes.append((name, tuple(vals)))
    for name, _ in axes:
        _check_axis_path(name, where)
    return axes


def _value_key(v: Any) -> Any:
    """An axis value's identity as a point: 30 and 30.0 are one TTL, True is not 1, mappings by content."""
    try:
        hash(v)
    except TypeError:
        return ("json", json.dumps(v, sort_keys=True, default=str))
    return (isinstance(v, bool), v)


def _check_nested(paths: list[str], where: str) -> None:
    """Refuse a path inside another (``workload.turn_gap_s`` and ``workload.turn_gap_s.mean``): which of the two
    values a point gets would depend on the order the overrides are applied in."""
    for a in paths:
        for b in paths:
            if b.startswith(a + "."):
                raise input_error(f"{where}: '{b}'", f"lies inside '{a}', also an axis, zipped axis or tie",
                                  "vary one of them (give the whole mapping, or only the field)")


def _check_axis_path(name: str, where: str) -> None:
    if name == "seed" or name.startswith("seed."):
        raise input_error(f"{where}: axis 'seed'", "seeds are set by the grid", "use replications and 'seed:'")
    try:
        check_path(name)
    except KvplanInputError as exc:
        raise KvplanInputError(f"{where}: {exc}") from None


def _zips(raw: Any, where: str) -> list[tuple[tuple[str, ...], tuple[tuple[Any, ...], ...]]]:
    """The zipped groups (``zip:`` is a list of mappings of equal-length lists), each path checked."""
    if not isinstance(raw, list):
        raise input_error(f"{where}: zip", "must be a list of groups {dotted.path: [values, ...], ...}")
    out = [parse_zip(g, f"{where}: zip group {k}") for k, g in enumerate(raw)]
    for names, _ in out:
        for name in names:
            _check_axis_path(name, where)
    return out


def _ties(raw: Any, where: str, axis_names: list[str]) -> list[tuple[str, Tie]]:
    """The ties ``{path: "axis.path - 10"}``: each target a scenario path that is no axis, each source an axis."""
    if not isinstance(raw, dict):
        raise input_error(f"{where}: ties", 'must be a mapping {dotted.path: "axis.path - 10"}')
    out: list[tuple[str, Tie]] = []
    for name, text in raw.items():
        if not isinstance(name, str) or not name:
            raise input_error(f"{where}: ties", f"tied name {name!r} must be a dotted scenario path")
        _check_axis_path(name, where)
        if name in axis_names:
            raise input_error(f"{where}: tie '{name}'", "is also an axis", "remove it from the axes or from ties")
        tie = parse_tie(text, f"{where}: tie '{name}'")
        if tie.source not in axis_names:
            raise input_error(f"{where}: tie '{name}'", f"'{tie.source}' is not an axis of the grid",
                              f"tie to one of {', '.join(axis_names) or '(no axes)'}")
        out.append((name, tie))
    return out


def load_grid(path: str | Path, yes: bool = False) -> Grid:
    """Read and validate a grid YAML file (safe loader, size-bounded, one-line errors, every point checked)."""
    p = Path(path)
    data = read_yaml_file(p, "grid", "give 'base:' and 'axes:'")
    return grid_from_dict(data, where=str(p), base_dir=p.parent, yes=yes)


def as_grid(grid: Grid | dict[str, Any] | str | Path, yes: bool = False) -> Grid:
    """Accept a :class:`Grid`, a grid mapping or a grid YAML path."""
    if isinstance(grid, Grid):
        if grid.n_points > MAX_POINTS and not yes:
            raise input_error(grid.source, f"{grid.n_points:,} points (more than {MAX_POINTS:,})", "pass yes=True")
        check_turns(grid, yes)
        return grid
    if isinstance(grid, dict):
        return grid_from_dict(grid, yes=yes)
    return load_grid(grid, yes=yes)
