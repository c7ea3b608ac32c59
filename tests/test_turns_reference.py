"""sim/turns.py ``_gather`` (lookup-table or binary-search rows, one stable sort by kind) against a plain loop.

Random event chunks: turns arriving once, twice or not at all, conversation-id gaps (which push the row lookup
from the lookup table to binary search), retention rows with turn -1, empty chunks, one turn.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.sim.events import Ev, EventChunk, col
from kvplan.sim.turns import _GATHER, _gather, turn_columns


def _reference(ev: EventChunk, offsets: np.ndarray) -> dict[str, list[Any]]:
    """One row per distinct arrived (conversation, turn) key in key order; each column the last event of its kind."""
    keys = [int(offsets[c]) + int(t) - 1 for c, t in zip(ev.conv, ev.turn, strict=True)]
    first: dict[int, int] = {}
    for i, k in enumerate(keys):
        if ev.kind[i] == int(Ev.ARRIVE) and k not in first:
            first[k] = i
    rows = sorted(first)
    at = {k: j for j, k in enumerate(rows)}
    out: dict[str, list[Any]] = {"conversation_id": [int(ev.conv[first[k]]) for k in rows],
                                 "turn": [int(ev.turn[first[k]]) for k in rows]}
    raw = {"t_s": ev.t_s, "node": ev.node, "a": ev.a, "b": ev.b}
    for name, (kind, fname) in _GATHER.items():
        v = [math.nan] * len(rows)
        field = fname if fname in ("t_s", "node") else col(kind, fname)
        for i, k in enumerate(keys):
            if ev.kind[i] == int(kind) and k in at:
                v[at[k]] = float(raw[field][i])
        out[name] = v
    pre = [0.0] * len(rows)
    for i, k in enumerate(keys):
        if ev.kind[i] == int(Ev.D_PREEMPT) and k in at:
            pre[at[k]] += 1
    out["d_preemptions"] = pre
    return out


_KINDS = sorted({int(k) for k, _ in _GATHER.values()} | {int(Ev.D_PREEMPT), int(Ev.UNPIN)})


@st.composite
def _chunks(draw: st.DrawFn) -> tuple[EventChunk, np.ndarray]:
    n_conv = draw(st.integers(1, 5))
    turns = draw(st.lists(st.integers(1, 4), min_size=n_conv, max_size=n_conv))
    gaps = draw(st.lists(st.sampled_from([0, 0, 3, 20_000]), min_size=n_conv, max_size=n_conv))
    offsets = np.cumsum([0] + [t + g for t, g in zip(turns, gaps, strict=True)][:-1]).astype(np.int64)
    turn_of = st.integers(0, n_conv - 1).flatmap(lambda c: st.tuples(st.just(c), st.integers(1, turns[c])))
    rows: list[tuple[Any, ...]] = []
    for c, t in draw(st.lists(turn_of, max_size=8)):  # arrivals: some turns twice, some never
        rows.append((draw(st.floats(0, 100)), int(Ev.ARRIVE), c, t, 0, float(draw(st.integers(1, 99))), 3.0))
    for kind, (c, t) in draw(st.lists(st.tuples(st.sampled_from(_KINDS), turn_of), max_size=30)):
        turn = -1 if kind == int(Ev.UNPIN) else t
        rows.append((draw(st.floats(0, 100)), kind, c, turn, draw(st.integers(0, 3)),
                     float(draw(st.integers(0, 9))), float(draw(st.integers(0, 9)))))
    order = draw(st.permutations(range(len(rows))))
    return EventChunk.from_tuples([rows[i] for i in order]), offsets


@settings(max_examples=300, deadline=None)
@given(_chunks())
def test_gather_matches_a_plain_loop(case: tuple[EventChunk, np.ndarray]) -> None:
    ev, offsets = case
    got, want = _gather(ev, offsets), _reference(ev, offsets)
    assert set(got) == set(want)
    for name, v in want.items():
        np.testing.assert_array_equal(np.asarray(got[name], dtype=float), np.asarray(v, dtype=float), err_msg=name)


def test_turn_columns_of_an_empty_chunk_and_of_one_turn() -> None:
    empty = turn_columns(EventChunk.empty(), np.zeros(1, dtype=np.int64))
    assert len(empty) == 0 and "ttft_s" in empty.columns
    ev = EventChunk.from_tuples([(1.0, int(Ev.ARRIVE), 0, 1, 0, 100.0, 5.0), (3.5, int(Ev.D_FIRST), 0, 1, 0, 0.0, 0.0)])
    one = turn_columns(ev, np.zeros(1, dtype=np.int64))
    assert len(one) == 1 and one["ttft_s"].iloc[0] == 2.5 and one["prompt_tokens"].iloc[0] == 100
