"""Conversation structure: Mooncake prefix-chain linking, sessions from ids, splitting at long gaps."""

from __future__ import annotations

import hashlib
import io
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from kvplan.errors import input_error
from kvplan.traces.trace import COLUMNS, CSV_HEADER, DEFAULT_MIN_BLOCKS, MOONCAKE_BLOCK_TOKENS, Trace


def link_prefix_chains(
    hash_ids: Sequence[Sequence[int]],
    input_tokens: Sequence[int],
    *,
    min_blocks: int = DEFAULT_MIN_BLOCKS,
    block_tokens: int = MOONCAKE_BLOCK_TOKENS,
) -> np.ndarray:
    """Parent index of every request (-1 when none) from chained block hashes, in file order.

    B's parent is the earlier request A whose full blocks (``input_tokens[A] // block_tokens``, at least
    ``min_blocks``) are a prefix of ``hash_ids[B]``: the deepest such A, and the latest among equally deep
    ones. Exact (a prefix trie, no hashing of prefixes), linear in the total number of block ids.
    """
    if min_blocks < 1:
        raise input_error("link_prefix_chains: min_blocks", f"is {min_blocks}, must be >= 1")
    trie: dict[tuple[int, int], int] = {}
    latest: dict[int, int] = {}  # trie node -> latest request whose full blocks end at that node
    parents = np.full(len(hash_ids), -1, dtype=np.int64)
    for b, (ids, n_in) in enumerate(zip(hash_ids, input_tokens, strict=True)):
        full = int(n_in) // block_tokens
        node, best, own = 0, -1, -1
        for depth, block in enumerate(ids, start=1):
            key = (node, block)
            nxt = trie.get(key)
            if nxt is None:
                nxt = len(trie) + 1  # node 0 is the root
                trie[key] = nxt
            node = nxt
            if depth >= min_blocks:
                cand = latest.get(node)
                if cand is not None:
                    best = cand  # deeper matches overwrite shallower ones
            if depth == full:
                own = node
        parents[b] = best
        if full >= min_blocks and own > 0:
            latest[own] = b  # registered after the lookup: a request is never its own parent
    return parents


def _chains(parents: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Root index and depth (1-based turn) of every request; parents must precede their children."""
    n = len(parents)
    root = np.arange(n, dtype=np.int64)
    turn = np.ones(n, dtype=np.int64)
    par = parents.tolist()
    root_l, turn_l = root.tolist(), turn.tolist()
    for i, p in enumerate(par):
        if p >= 0:
            root_l[i] = root_l[p]
            turn_l[i] = turn_l[p] + 1
    return np.asarray(root_l, dtype=np.int64), np.asarray(turn_l, dtype=np.int64)


def _frame(
    request_id: np.ndarray,
    session_id: Sequence[str],
    turn: np.ndarray,
    arrival_s: np.ndarray,
    input_tokens: np.ndarray,
    output_tokens: np.ndarray,
    parent: np.ndarray,
    service_s: np.ndarray,
    linkable: np.ndarray,
) -> pd.DataFrame:
    """Assemble the request frame with the documented column order and dtypes."""
    return pd.DataFrame(
        {
            "request_id": np.asarray(request_id, dtype=np.int64),
            "session_id": pd.Series(list(session_id), dtype=str),
            "turn": np.asarray(turn, dtype=np.int64),
            "arrival_s": np.asarray(arrival_s, dtype=float),
            "input_tokens": np.asarray(input_tokens, dtype=np.int64),
            "output_tokens": np.asarray(output_tokens, dtype=np.int64),
            "parent_request_id": np.asarray(parent, dtype=np.int64),
            "service_s": np.asarray(service_s, dtype=float),
            "linkable": np.asarray(linkable, dtype=bool),
        },
        columns=list(COLUMNS),
    )


def _link_sessions(
    session: Sequence[str],
    arrival_s: np.ndarray,
    input_tokens: np.ndarray,
    output_tokens: np.ndarray,
    service_s: np.ndarray | None = None,
) -> pd.DataFrame:
    """Frame for session-id formats: stable sort by arrival, consecutive requests of a session are turns."""
    n = len(session)
    arrival = np.asarray(arrival_s, dtype=float)
    order = np.argsort(arrival, kind="stable")
    ids = np.arange(n, dtype=np.int64)[order]
    sess = pd.Series(np.asarray(session, dtype=object)[order], dtype=str)
    grouped = pd.Series(ids).groupby(sess.to_numpy(), sort=False)
    turn = grouped.cumcount().to_numpy() + 1
    parent = grouped.shift(1).fillna(-1).to_numpy().astype(np.int64)
    svc = np.full(n, np.nan) if service_s is None else np.asarray(service_s, dtype=float)[order]
    arr = arrival[order]
    return _frame(
        ids,
        sess.tolist(),
        turn,
        arr - (arr[0] if n else 0.0),
        np.asarray(input_tokens)[order],
        np.asarray(output_tokens)[order],
        parent,
        svc,
        np.ones(n, dtype=bool),
    )


def trace_from_sessions(
    session_id: Sequence[Any],
    arrival_s: Sequence[float] | np.ndarray,
    input_tokens: Sequence[int] | np.ndarray,
    output_tokens: Sequence[int] | np.ndarray,
    *,
    source: str = "<memory>",
) -> Trace:
    """Build a :class:`Trace` from in-memory columns (session-id linking, as for the CSV format).

    For synthetic traces and tests; ``sha256`` is the digest of the equivalent CSV text.
    """
    n = len(session_id)
    if not (len(arrival_s) == len(input_tokens) == len(output_tokens) == n) or n == 0:
        raise input_error(source, "columns must be non-empty and of equal length")
    arr = np.asarray(arrival_s, dtype=float)
    n_in = np.asarray(input_tokens, dtype=np.int64)
    n_out = np.asarray(output_tokens, dtype=np.int64)
    if not np.isfinite(arr).all() or (n_in < 0).any() or (n_out < 0).any():
        raise input_error(source, "arrivals must be finite and token counts >= 0")
    sess = [str(s) for s in session_id]
    buf = io.StringIO()
    buf.write(",".join(CSV_HEADER) + "\n")
    for row in zip(sess, arr.tolist(), n_in.tolist(), n_out.tolist(), strict=True):
        buf.write(f"{row[0]},{row[1]!r},{row[2]},{row[3]}\n")
    digest = hashlib.sha256(buf.getvalue().encode()).hexdigest()
    return Trace(requests=_link_sessions(sess, arr, n_in, n_out), source=source, format="csv", sha256=digest)


def split_sessions(trace: Trace, max_gap_s: float) -> tuple[Trace, dict[str, Any]]:
    """Cut every parent link whose arrival-to-arrival gap exceeds ``max_gap_s``; returns ``(trace, report)``.

    A request cut from its parent starts a new session ``"<session_id>@<request_id>"`` (its descendants
    follow it) and turns are renumbered. Use it before :func:`workload_stats` or fitting when a revisit
    after hours or days should count as a new conversation (RAGPulse has gaps of days).
    """
    if not (isinstance(max_gap_s, int | float) and max_gap_s > 0):
        raise input_error("split_sessions: max_gap_s", f"is {max_gap_s!r}", "give seconds > 0")
    df = trace.requests
    n = len(df)
    rid = df["request_id"].to_numpy(dtype=np.int64)
    ppos = pd.Index(rid).get_indexer(df["parent_request_id"].to_numpy(dtype=np.int64))
    arr = df["arrival_s"].to_numpy(dtype=float)
    gap = np.where(ppos >= 0, arr - arr[np.maximum(ppos, 0)], 0.0)
    cut = (ppos >= 0) & (gap > max_gap_s)
    ppos = np.where(cut, -1, ppos)
    sess = df["session_id"].to_numpy(dtype=object)
    root_l, turn_l, ppos_l = list(range(n)), [1] * n, ppos.tolist()
    for i in range(n):  # parents precede children in arrival order
        p = ppos_l[i]
        if p >= 0:
            root_l[i] = root_l[p]
            turn_l[i] = turn_l[p] + 1
    new_sess = [str(sess[i]) if not cut[r] else f"{sess[i]}@{rid[r]}" for i, r in enumerate(root_l)]
    out = _frame(
        rid,
        new_sess,
        np.asarray(turn_l),
        arr,
        df["input_tokens"].to_numpy(),
        df["output_tokens"].to_numpy(),
        np.where(ppos >= 0, rid[np.maximum(ppos, 0)], -1),
        df["service_s"].to_numpy(dtype=float),
        df["linkable"].to_numpy(dtype=bool),
    )
    report = {
        "max_gap_s": float(max_gap_s),
        "links_cut": int(cut.sum()),
        "sessions": int(out["session_id"].nunique()),
    }
    return replace(trace, requests=out, notes={**dict(trace.notes), "split_sessions": report}), report
