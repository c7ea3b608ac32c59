"""``Retention.due_from`` is the earliest deadline still filed (the decode node's one-comparison "is anything due?"),
through random pins, renewals, releases and expiry passes, checked against a brute-force list of filed deadlines."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from kvplan.sim.retention import Retention

_OPS = st.lists(st.tuples(st.sampled_from(["add", "renew", "pop", "due"]), st.integers(0, 40),
                          st.floats(0.0, 100.0, allow_nan=False)), max_size=60)


@settings(max_examples=200, deadline=None)
@given(_OPS)
def test_due_from_is_the_earliest_filed_deadline(ops: list[tuple[str, int, float]]) -> None:
    ret = Retention(0, 1)
    filed: list[float] = []  # every deadline filed and not yet taken by due()
    pids: list[int] = []
    now = 0.0
    for op, k, x in ops:
        if op == "add":
            pid, _ = ret.add(k, 10, 1, now + x)
            pids.append(pid)
            filed.append(now + x)
        elif op == "renew" and pids:
            pid = pids[k % len(pids)]
            if pid in ret.pins:
                ret.renew(pid, now + x)
                filed.append(now + x)
        elif op == "pop" and pids:
            ret.pop(pids[k % len(pids)])  # a release files and takes nothing
        elif op == "due":
            now += x / 4
            ret.due(now)
            filed = [t for t in filed if t > now]  # due() takes every entry at or before now
        assert ret.due_from == (min(filed) if filed else math.inf)
        assert ret.next_expiry_due(now) == any(t <= now for t in filed)
    ret.clear_deadlines()
    assert ret.due_from == math.inf
