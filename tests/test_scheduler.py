"""The scheduler core (sim/scheduler.py): prefix hits, allocate_slots' free-block check, and the scheduling pass.

vLLM ``vllm/v1/core/sched/scheduler.py``: RUNNING first, then WAITING FCFS under ``max_num_seqs`` and the token
budget; a waiting request whose blocks cannot be allocated stops the waiting loop; no waiting request joins a
step that preempted.
"""

from __future__ import annotations

import pytest
from conftest import rerun_pure

from kvplan.sim.blocks import BlockPool
from kvplan.sim.evlog import RowBuffer
from kvplan.sim.fifo import new_fifo
from kvplan.sim.request import Request
from kvplan.sim.scheduler import Scheduler, prefix_hit, reserve


def test_prefix_hit_is_full_blocks_below_the_last_token() -> None:
    assert prefix_hit(1000, 1000, 10**9, 16) == 992  # the last token is always computed: 999 -> 62 full blocks
    assert prefix_hit(500, 1000, 10**9, 16) == 500  # a cached prefix shorter than the cap counts in full
    assert prefix_hit(500, 1000, 300, 16) == 288  # only what the prompt repeats, in full blocks
    assert prefix_hit(0, 1000, 10**9, 16) == 0
    assert prefix_hit(992, 992, 10**9, 16) == 976  # a whole-block prompt fully cached: its last block is computed


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
    s.running, s.waiting = [b], new_fifo()
    s.waiting.append(c)
    s.waiting.append(d)
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


class _Decoding(Scheduler):
    """A toy engine over the core: waiting requests allocate their prompt; a running request with nothing left
    to prefill decodes one token into ``p_ctx``, growing a block when it crosses one, preempting the newest
    running request (``self.running.pop()``, re-queued at the front of WAITING) when the pool is short."""

    def __init__(self, *args: object) -> None:
        super().__init__(*args)  # type: ignore[arg-type]
        self.decoded: list[int] = []

    def _can_schedule(self, r: Request) -> bool:
        hit = self._allocate(r, r.prompt, 0, 0, None)
        if hit < 0:
            return False
        r.p_ctx, r.p_remaining = 0, r.prompt
        return True

    def _decode_token(self, r: Request) -> bool:
        blocks = -(-(r.p_ctx + 1) // self.pool.block_size)
        if blocks > r.p_blocks and not self._grow(r, blocks):
            return False
        self.decoded.append(r.conv)
        return True

    def _grow(self, r: Request, blocks: int) -> bool:
        need = blocks - r.p_blocks
        while self.pool.free() < need:
            victim = self.running.pop()
            self.pool.held -= victim.p_blocks
            victim.p_blocks = 0
            self.preempted_now = True
            self.waiting.appendleft(victim)
            if victim is r:
                return False
        self.pool.held += need
        r.p_blocks = blocks
        return True


def _running(s: Scheduler, conv: int, ctx: int, remaining: int = 0, prompt: int = 16) -> Request:
    r = _req(conv, prompt)
    r.p_ctx, r.p_remaining = ctx, remaining
    r.p_blocks = -(-ctx // s.pool.block_size)
    s.pool.held += r.p_blocks
    s.running.append(r)
    return r


def test_pass_preempts_the_newest_and_admits_no_waiting_request_in_that_step(request: pytest.FixtureRequest) -> None:
    if rerun_pure(request):
        return
    pool = BlockPool(10, 16, False)
    s = _Decoding(RowBuffer(), 0, 8, 100, pool)
    _running(s, 1, 32)  # two full blocks: its next token needs a third
    _running(s, 2, 48, prompt=16)  # the newest; re-admitted it would need one block
    pool.pinned = 5  # nothing free
    s._enqueue(0.0, _req(3, 16))
    s.schedule()
    # 1 grows by preempting 2 (3 blocks back, 1 taken): 2 free blocks would admit 2 and 3, but not in this step
    assert s.decoded == [1] and [r.conv for r in s.running] == [1] and [r.conv for r in s.waiting] == [2, 3]
    assert s.preempted_now and s.chunks == [] and pool.free() == 2
    s.decoded = []
    s.schedule()  # next step: 1 decodes (no new block), then 2 (front of WAITING) and 3 are scheduled
    assert s.decoded == [1] and [(r.conv, n) for r, n in s.chunks] == [(2, 16), (3, 16)] and not s.preempted_now
    # a request that must preempt itself (the newest left) stops the running loop; the others ran
    s2 = _Decoding(RowBuffer(), 0, 8, 100, BlockPool(4, 16, False))
    _running(s2, 1, 20)
    _running(s2, 2, 32)
    s2.schedule()
    assert s2.decoded == [1] and [r.conv for r in s2.running] == [1] and [r.conv for r in s2.waiting] == [2]


def test_pass_decode_tokens_and_running_chunks_take_the_token_budget(request: pytest.FixtureRequest) -> None:
    if rerun_pure(request):
        return
    pool = BlockPool(100, 16, False)
    s = _Decoding(RowBuffer(), 0, 8, 10, pool)
    for conv in (1, 2, 3):
        _running(s, conv, 20)
    s._enqueue(0.0, _req(4, 100))
    s.schedule()  # three decode tokens, then the waiting prompt's first chunk takes the 7 left
    assert s.decoded == [1, 2, 3] and [(r.conv, n) for r, n in s.chunks] == [(4, 7)] and s.budget == 0
    s = _Decoding(RowBuffer(), 0, 8, 2, pool)
    for conv in (1, 2, 3):
        _running(s, conv, 20)
    s._enqueue(0.0, _req(4, 16))
    s.schedule()  # the budget (2) runs out in RUNNING: the third decoder and the waiting request wait
    assert s.decoded == [1, 2] and s.chunks == [] and [r.conv for r in s.waiting] == [4] and s.budget == 0
    s = _Decoding(RowBuffer(), 0, 8, 30, pool)
    _running(s, 1, 64, remaining=50, prompt=114)  # a running prefill larger than the budget takes all of it
    s._enqueue(0.0, _req(2, 16))
    s.schedule()
    assert [(r.conv, n) for r, n in s.chunks] == [(1, 30)] and s.budget == 0 and len(s.running) == 1
