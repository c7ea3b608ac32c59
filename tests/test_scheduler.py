"""The scheduler core (sim/scheduler.py): prefix hits, allocate_slots' free-block check, and the scheduling pass.

vLLM ``vllm/v1/core/sched/scheduler.py``: RUNNING first, then WAITING FCFS under ``max_num_seqs`` and the token
budget; a waiting request whose blocks cannot be allocated stops the waiting loop; no waiting request joins a
step that preempted.
"""

from __future__ import annotations

from collections import deque

import pytest
from conftest import rerun_pure

from kvplan.sim.blocks import BlockPool
from kvplan.sim.evlog import RowBuffer
from kvplan.sim.request import Request
from kvplan.sim.scheduler import Scheduler, prefix_hit, reserve


def test_prefix_hit_is_full_blocks_below_the_last_token() -> None:
    assert prefix_hit(1000, 1000, 10**9, 16) == 992  # the last token is always computed: 999 -> 62 full blocks
    assert prefix_hit(500, 1000, 10**9, 16) == 500  # a cached prefix shorter than the cap counts in full
    assert prefix_hit(500, 1000, 300, 16) == 288  # only what the prompt repeats, in full blocks
    assert prefix_hit(0, 1000, 10**9, 16) == 0


class _Reclaim:
    def __init__(self, pool: BlockPool, frees: int) -> None:
        self.pool, self.frees = pool, frees
        self.calls: list[str] = []

    def before_evict(self, want: int) -> None:
        self.calls.append(f"before {self.pool.cached}")

    def after_evict(self, want: int, keep: int | None) -> None:
        self.calls.append(f"after {self.pool.cached} keep={keep}")
        self.pool.pinned -= self.frees


def test_reserve_evicts_cache_then_asks_the_node_and_puts_the_entry_back_on_failure() -> None:
    pool = BlockPool(10, 16, True)
    pool.pinned = 6
    pool.to_cache(1, 64)  # 4 cached blocks, nothing free
    entry = pool.take(2)
    assert entry is None and pool.free() == 0
    rec = _Reclaim(pool, frees=0)
    assert reserve(pool, 3, 1, None, rec, keep=7)  # the cache covers it: evicted tail first, one block left
    assert pool.cache[1] == (16, 1) and rec.calls == ["before 4"]
    # short even without any cache: the node is asked after eviction; an entry taken for the lookup goes back
    pool.held = 3
    taken = pool.take(1)
    assert taken == (16, 1)
    rec2 = _Reclaim(pool, frees=0)
    assert not reserve(pool, 5, 1, taken, rec2, keep=None)
    assert pool.cache[1] == (16, 1) and pool.cached == 1 and rec2.calls == ["before 0", "after 0 keep=None"]
    rec3 = _Reclaim(pool, frees=6)  # the node frees pinned blocks: enough now
    assert reserve(pool, 5, 1, None, rec3)
    assert pool.free() >= 5


def _req(conv: int, prompt: int) -> Request:
    return Request(conv, 0, conv, prompt, 1, None)


def test_pass_running_first_then_waiting_fcfs_under_seqs_budget_and_blocks(request: pytest.FixtureRequest) -> None:
    if rerun_pure(request):  # it subclasses the compiled Scheduler: pure Python only
        return

    class Toy(Scheduler):
        def _can_schedule(self, r: Request) -> bool:
            hit = self._allocate(r, r.prompt, r.reuse, 0, None)
            if hit < 0:
                return False
            r.p_ctx, r.p_remaining = hit, r.prompt - hit
            return True

    pool = BlockPool(20, 16, True)
    s = Toy(RowBuffer(), 0, 3, 100, pool)
    a, b, c, d = _req(1, 60), _req(2, 250), _req(3, 40), _req(4, 16)
    for r in (a, b, c, d):
        s._enqueue(0.0, r)
    s.schedule()
    # a takes 60 tokens, b the remaining 40 of the budget; c is not scheduled (no budget left)
    assert [(r.conv, n) for r, n in s.chunks] == [(1, 60), (2, 40)] and s.budget == 0
    assert s.new_tokens == 100 and s.pairs == pytest.approx(60 * 61 / 2 + 40 * 41 / 2)
    assert pool.held == 4 + 16 and [r.conv for r in s.waiting] == [3, 4]
    # next pass: b runs first (its last 10 tokens); c cannot get its 3 blocks (2 free) and stops the waiting
    # loop although d's one block would fit (FCFS)
    pool.held -= a.p_blocks
    s.running, s.waiting = [b], deque([c, d])
    b.p_remaining, b.p_ctx = 10, 240
    pool.pinned = 2
    s.schedule()
    assert [(r.conv, n) for r, n in s.chunks] == [(2, 10)] and [r.conv for r in s.waiting] == [3, 4]
    assert s.ctx_pairs == pytest.approx(10 * 240) and pool.cached == 0
    pool.pinned = 0
    s.max_seqs = 1  # max_num_seqs reached: nothing joins
    s.schedule()
    assert [(r.conv, n) for r, n in s.chunks] == [(2, 10)] and [r.conv for r in s.waiting] == [3, 4]
    s.max_seqs = 3
    s.schedule()
    assert [(r.conv, n) for r, n in s.chunks] == [(2, 10), (3, 40), (4, 16)] and s.budget == 34
    assert pool.free() == 0 and [r.conv for r in s.running] == [2, 3, 4]
