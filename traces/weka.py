"""The ``weka`` trace format: AgentX / Weka kv-cache-tester coding-agent traces (one session per JSON file).

Source: github.com/callanjfox/kv-cache-tester, ``traces/`` (Apache-2.0; the corpus AIPerf replays with
``--scenario agentx`` and AISimulate with ``format: weka``); format and statistics of the shared sample in
``external_traces/agentx_weka/SOURCE.md``. One JSON object per file: ``id``, ``block_size`` (64),
``tool_tokens`` and ``system_tokens`` (shared by every request of the trace), and ``requests`` in time
order. A request has ``t`` (s from its session's start), ``in`` / ``out`` tokens, ``hash_ids`` (one id per
*full* 64-token block of the prompt: ``len == in // 64``; the partial last block has none), ``api_time``
and ``think_time`` (the client's idle time between the previous answer and this request). A request of
``type: subagent`` is a nested session: a sub-agent running concurrently with its parent from the
marker's ``t`` on, with its own ``requests`` (``t`` from the sub-agent's start).

:func:`read_weka` reads one file or every ``*.json`` file of a directory (sorted by name) into a
:class:`WekaTrace`: flat per-request arrays, one session per file and one per sub-agent. Reading is
bounded: bytes per file and in all, files, nesting depth of sub-agents and requests, each refused with
a one-line error naming the file and the field. :func:`to_trace` gives the common :class:`Trace` frame
(``kvplan workload show/fit``); :func:`reuse_tokens` the hash-prefix reuse of consecutive requests.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvplan.errors import input_error
from kvplan.inputfile import DEFAULT_MAX_BYTES, _short, decode_text, read_bytes
from kvplan.traces.sessions import _frame
from kvplan.traces.trace import Trace, _count, _get, _number

#: Tokens per hash block of the kv-cache-tester traces (their ``block_size``).
WEKA_BLOCK_TOKENS = 64
#: At most this many files are read from a directory.
MAX_WEKA_FILES = 10_000
#: Sub-agents nested deeper than this (a sub-agent of a sub-agent of ...) are refused.
MAX_WEKA_DEPTH = 8
#: Requests over all files (the simulator's own turn limit is lower).
MAX_WEKA_REQUESTS = 10_000_000
#: Bytes over all files of a directory.
MAX_WEKA_TOTAL_BYTES = 4 * 1024**3
#: Hash ids over all files (8 bytes each in memory).
MAX_WEKA_HASH_IDS = 500_000_000
#: Characters of a trace ``id`` or sub-agent ``agent_id`` (they name sessions in reports and errors).
MAX_NAME_CHARS = 256


@dataclass(frozen=True)
class WekaSession:
    """One session: a file's main agent or one of its sub-agents."""

    name: str  # "<trace id>" or "<trace id>/<agent_id>"
    file: str
    parent: int  # index of the parent session, -1 for a file's main agent
    start_s: float  # on the file's clock: 0 for the main agent, the marker's absolute t for a sub-agent
    depth: int
    shared_tokens: int  # tool_tokens + system_tokens of the agent (shared by all its requests)
    prefix_key: tuple[int, int] = (0, 0)  # (tool_tokens, system_tokens): sessions with equal keys share them


@dataclass(frozen=True, eq=False)
class WekaTrace:
    """Requests of one or more Weka trace files, flat and grouped by session (time order within one).

    ``session[i]`` indexes :attr:`sessions`; ``t_s`` is on the session's own clock; ``hashes`` holds
    every request's block ids back to back, request ``i`` at ``hashes[hash_off[i]:hash_off[i + 1]]``.
    """

    source: str
    sha256: str
    files: tuple[str, ...]
    sessions: tuple[WekaSession, ...]
    session: np.ndarray
    t_s: np.ndarray
    think_s: np.ndarray
    api_s: np.ndarray
    input_tokens: np.ndarray
    output_tokens: np.ndarray
    hashes: np.ndarray
    hash_off: np.ndarray
    tool_result: np.ndarray | None = None  # the request answers a tool call (``input_types`` has tool_result)

    @property
    def n_requests(self) -> int:
        """Number of requests (sub-agents' included)."""
        return len(self.session)

    def ids(self, i: int) -> np.ndarray:
        """Block ids of request ``i``."""
        return self.hashes[self.hash_off[i]:self.hash_off[i + 1]]


class _Reader:
    """Accumulates the requests of every file while checking the bounds."""

    def __init__(self) -> None:
        self.sessions: list[WekaSession] = []
        self.cols: dict[str, list[Any]] = {k: [] for k in ("session", "t", "think", "api", "in", "out", "tool")}
        self.ids: list[np.ndarray] = []
        self.n_ids = 0
        self.ids_seen: set[str] = set()

    def file(self, obj: Any, label: str) -> None:
        if not isinstance(obj, dict):
            raise input_error(label, f"is {_short(obj)}, not a JSON object",
                              "one kv-cache-tester trace object per file")
        bs = obj.get("block_size", WEKA_BLOCK_TOKENS)
        if bs != WEKA_BLOCK_TOKENS:
            raise input_error(label, f"field 'block_size' is {_short(bs)}",
                              f"weka traces hash {WEKA_BLOCK_TOKENS}-token blocks")
        name = obj.get("id", Path(label).stem)
        if (isinstance(name, bool) or not isinstance(name, str | int) or not str(name).strip()
                or len(str(name)) > MAX_NAME_CHARS):
            raise input_error(label, f"field 'id' is {_short(name)}, not a non-empty string of at most "
                              f"{MAX_NAME_CHARS} characters")
        sid = str(name)
        if sid in self.ids_seen:  # two files with one id (a copy): keep their sessions apart
            sid = f"{sid}@{Path(label).name}"
        self.ids_seen.add(sid)
        self.agent(obj, label, sid, -1, 0.0, 0)

    def agent(self, obj: dict[str, Any], label: str, name: str, parent: int, start_s: float, depth: int) -> None:
        if depth > MAX_WEKA_DEPTH:
            raise input_error(f"{label}: {name}", f"sub-agents nested more than {MAX_WEKA_DEPTH} deep")
        tool, system = (_count(obj.get(k, 0), k, f"{label}: {name}") for k in ("tool_tokens", "system_tokens"))
        reqs = _get(obj, "requests", f"{label}: {name}")
        if not isinstance(reqs, list):
            raise input_error(f"{label}: {name}", f"field 'requests' is {_short(reqs)}, not a list")
        idx = len(self.sessions)
        self.sessions.append(WekaSession(name, label, parent, start_s, depth, tool + system, (tool, system)))
        last_t = -np.inf
        for k, r in enumerate(reqs):
            where = f"{label}: {name}: request {k}"
            if not isinstance(r, dict):
                raise input_error(where, f"is {_short(r)}, not a JSON object")
            t = _number(_get(r, "t", where), "t", where)
            if t < 0 or t < last_t:
                raise input_error(where, f"field 't' is {t:g} s, negative or earlier than the request before",
                                  "requests must be in time order")
            last_t = t
            if r.get("type") == "subagent":
                sub = r.get("agent_id", f"agent@{k}")
                if isinstance(sub, bool) or not isinstance(sub, str | int) or len(str(sub)) > MAX_NAME_CHARS:
                    raise input_error(where, f"field 'agent_id' is {_short(sub)}, not a string of at most "
                                      f"{MAX_NAME_CHARS} characters")
                self.agent(r, label, f"{name}/{sub}", idx, start_s + t, depth + 1)
                continue
            self.request(r, where, idx, t)

    def request(self, r: dict[str, Any], where: str, session: int, t: float) -> None:
        n_in = _count(_get(r, "in", where), "in", where)
        n_out = _count(_get(r, "out", where), "out", where)
        think = r.get("think_time", 0.0)
        think = 0.0 if think is None else _number(think, "think_time", where)
        api = r.get("api_time", 0.0)
        api = 0.0 if api is None else _number(api, "api_time", where)
        if think < 0 or api < 0:
            raise input_error(where, "field 'think_time' or 'api_time' is negative", "give seconds >= 0")
        ids = _get(r, "hash_ids", where)
        if not isinstance(ids, list):
            raise input_error(where, f"field 'hash_ids' is {_short(ids)}, not a list of block ids")
        if len(ids) not in (n_in // WEKA_BLOCK_TOKENS, -(-n_in // WEKA_BLOCK_TOKENS)):
            raise input_error(where, f"field 'hash_ids' has {len(ids)} ids but 'in' {n_in} has "
                              f"{n_in // WEKA_BLOCK_TOKENS} full {WEKA_BLOCK_TOKENS}-token blocks",
                              "one id per 64-token block of the prompt")
        try:  # a ragged list ([[1], [2, 3]]) or an out-of-range number is refused below, not a NumPy traceback
            arr = np.asarray(ids) if ids else np.zeros(0, dtype=np.int64)
        except (ValueError, TypeError, OverflowError):
            arr = np.zeros((0, 0))
        if arr.dtype.kind not in "iu" or arr.ndim != 1:
            raise input_error(where, "field 'hash_ids' holds something other than integer ids")
        self.n_ids += len(ids)
        if len(self.cols["session"]) >= MAX_WEKA_REQUESTS or self.n_ids > MAX_WEKA_HASH_IDS:
            raise input_error(where, f"more than {MAX_WEKA_REQUESTS:,} requests or {MAX_WEKA_HASH_IDS:,} hash ids",
                              "replay fewer files")
        self.ids.append(arr.astype(np.int64, copy=False))
        types = r.get("input_types")
        tool = isinstance(types, list) and "tool_result" in types
        for key, v in (("session", session), ("t", t), ("think", think), ("api", api), ("in", n_in), ("out", n_out),
                       ("tool", tool)):
            self.cols[key].append(v)


def weka_files(path: str | os.PathLike[str]) -> list[Path]:
    """The files a weka path names: itself, or every ``*.json`` of a directory (sorted, at most
    :data:`MAX_WEKA_FILES`). Hidden files are skipped, as a shell's ``*.json`` does: kvplan's own ledger
    ``.kvplan-outputs.json`` lands beside the traces when an output is written into the folder; so are the files
    that ledger names as kvplan's outputs (``workload fit DIR --out DIR/w.yaml`` writes ``DIR/w.fit.json``), and
    those of a result kvplan committed there (``simulate --trace DIR --out DIR --overwrite`` writes
    ``DIR/summary.json``, named in ``DIR/.kvplan-result.json``), bytes unchanged in both cases."""
    p = Path(path)
    if p.is_dir():
        from kvplan.atomic import kvplan_outputs
        from kvplan.atomic_dir import own_files

        own = kvplan_outputs(p) | own_files(p)
        files = sorted(f for f in p.iterdir() if f.suffix == ".json" and not f.name.startswith(".")
                       and f.name not in own and f.is_file())
        if not files:
            raise input_error(os.fspath(path), "directory holds no *.json trace file",
                              "pass a kv-cache-tester traces folder")
        if len(files) > MAX_WEKA_FILES:
            raise input_error(os.fspath(path), f"directory holds {len(files):,} *.json files (more than "
                              f"{MAX_WEKA_FILES:,})", "pass a smaller folder")
        return files
    return [p]


def read_weka(path: str | os.PathLike[str], max_bytes: int = DEFAULT_MAX_BYTES) -> WekaTrace:
    """Read a weka trace file or directory (module docstring); ``max_bytes`` bounds each file."""
    label = os.fspath(path)
    files = weka_files(path)
    rd = _Reader()
    digest = hashlib.sha256()
    total = 0
    for f in files:
        data = read_bytes(f, max_bytes, os.fspath(f))
        total += len(data)
        if total > MAX_WEKA_TOTAL_BYTES:
            raise input_error(label, f"the files hold more than {MAX_WEKA_TOTAL_BYTES / 1024**3:.0f} GiB",
                              "replay fewer files")
        digest.update(hashlib.sha256(data).digest())
        text = decode_text(data, os.fspath(f))
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise input_error(f"{f}: line {exc.lineno}", f"not valid JSON ({exc.msg} at column {exc.colno})") from None
        except RecursionError:
            raise input_error(os.fspath(f), "JSON nested too deeply") from None
        rd.file(obj, os.fspath(f))
    c = rd.cols
    if not c["session"]:
        raise input_error(label, "no requests found", "pass a kv-cache-tester trace with a non-empty 'requests' list")
    lengths = np.asarray([len(a) for a in rd.ids], dtype=np.int64)
    off = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=off[1:])
    session = np.asarray(c["session"], dtype=np.int64)
    order = np.argsort(session, kind="stable")  # sub-agents were read inside their parent: group by session
    hashes = np.concatenate(rd.ids) if rd.ids else np.zeros(0, dtype=np.int64)
    if not np.array_equal(order, np.arange(len(order))):
        hashes = np.concatenate([rd.ids[i] for i in order.tolist()])
        lengths = lengths[order]
        np.cumsum(lengths, out=off[1:])
    return WekaTrace(
        source=label, sha256=digest.hexdigest(), files=tuple(os.fspath(f) for f in files),
        sessions=tuple(rd.sessions), session=session[order],
        t_s=np.asarray(c["t"], dtype=float)[order], think_s=np.asarray(c["think"], dtype=float)[order],
        api_s=np.asarray(c["api"], dtype=float)[order], input_tokens=np.asarray(c["in"], dtype=np.int64)[order],
        output_tokens=np.asarray(c["out"], dtype=np.int64)[order], hashes=hashes, hash_off=off,
        tool_result=np.asarray(c["tool"], dtype=bool)[order],
    )


def lcp_blocks(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two block-id arrays."""
    m = min(len(a), len(b))
    if m == 0:
        return 0
    diff = np.flatnonzero(a[:m] != b[:m])
    return int(diff[0]) if diff.size else m


def reuse_tokens(prev_in: int, prev_out: int, cur_in: int, lcp: int, prev_blocks: int,
                 with_output: bool = True) -> int:
    """Tokens of the previous request's KV (``prev_in + prev_out``) the current prompt repeats.

    ``lcp`` full 64-token blocks are shared. When every full block of the previous prompt is repeated and the
    current prompt has room for the previous output (``cur_in >= prev_in + prev_out``), the hashes show the
    conversation was extended, not rewritten: the whole previous context is reused (``with_output``; the
    last output token has no KV, the simulator caps at what D holds). Otherwise only the shared blocks are.
    """
    if with_output and lcp >= prev_blocks and cur_in >= prev_in + prev_out:
        return prev_in + prev_out
    return min(lcp * WEKA_BLOCK_TOKENS, prev_in, cur_in)


def session_reuse(tr: WekaTrace, with_output: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Per request: the reused tokens of the previous request of its session (0 for a first request) and
    the shared full blocks (LCP of hash ids)."""
    n = tr.n_requests
    reuse = np.zeros(n, dtype=np.int64)
    lcp = np.zeros(n, dtype=np.int64)
    sess, n_in, n_out = tr.session.tolist(), tr.input_tokens.tolist(), tr.output_tokens.tolist()
    for i in range(1, n):
        if sess[i] != sess[i - 1]:
            continue
        a, b = tr.ids(i - 1), tr.ids(i)
        lcp[i] = k = lcp_blocks(a, b)
        reuse[i] = reuse_tokens(n_in[i - 1], n_out[i - 1], n_in[i], k, len(a), with_output)
    return reuse, lcp


def to_trace(tr: WekaTrace) -> Trace:
    """The common request frame: sessions as read, arrival = session start + ``t`` (every file starts at 0),
    ``service_s`` = ``api_time``, each request's parent the previous request of its session."""
    n = tr.n_requests
    start = np.asarray([s.start_s for s in tr.sessions], dtype=float)[tr.session]
    arrival = start + tr.t_s
    order = np.argsort(arrival, kind="stable")
    first = np.ones(n, dtype=bool)
    first[1:] = tr.session[1:] != tr.session[:-1]
    parent = np.where(first, -1, np.arange(n) - 1)
    turn = np.arange(n) - np.maximum.accumulate(np.where(first, np.arange(n), 0)) + 1
    names = [tr.sessions[s].name for s in tr.session.tolist()]
    df = _frame(np.arange(n)[order], [names[i] for i in order.tolist()], turn[order], arrival[order],
                tr.input_tokens[order], tr.output_tokens[order], parent[order], tr.api_s[order], np.ones(n, dtype=bool))
    notes = {"weka": {"files": len(tr.files), "sessions": len(tr.sessions),
                      "subagent_sessions": sum(1 for s in tr.sessions if s.parent >= 0),
                      "block_tokens": WEKA_BLOCK_TOKENS}}
    return Trace(requests=df, source=tr.source, format="weka", sha256=tr.sha256, notes=notes)
