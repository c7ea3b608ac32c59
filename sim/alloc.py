"""Freed memory goes back to the operating system between the stages of a long run (glibc's malloc; elsewhere
nothing happens).

glibc keeps what a process frees inside its heap for reuse: a block below the top of the heap is never returned,
and since its mmap threshold rises each time a mapped block is freed (128 KiB up to 32 MiB), the per-chunk NumPy
temporaries of a streamed run (a flushed chunk of 131,072 event rows is ~1 MiB per column), the plan's
temporaries and the row groups soon all live in the heap. Its free holes pile up: on the 1M-turn benchmark the
resident memory ended ~50 MiB above what the run held, and the end-of-run derivation and the result files came
on top of that. ``malloc_trim(0)`` hands every free whole page of the heap back (``madvise``), at the cost of a
walk over the free lists and of faulting those pages in again when reused: :func:`kvplan.sim.api.run` calls
:func:`release_free_memory` once the plan is drawn, every :data:`TRIM_EVERY_CHUNKS` chunks of the event log, before
and after the end-of-run derivation, and :class:`kvplan.sim.result_files.ResultDirWriter` after each file it
writes at the end. (Fixing the mmap threshold at 128 KiB instead, so that every larger block is unmapped when
freed, gave about the same peak but cost ~3.5 CPU s of page faults on that run: 2.7M of them against 0.4M.)

Arrow's buffers (the tables the row groups of ``turns.parquet`` are sliced from, the Parquet writer's pages,
``pinned.parquet``) come from the same malloc: ``import kvplan`` sets ``ARROW_DEFAULT_MEMORY_POOL=system`` unless
set, before pyarrow reads it (``kvplan/__init__.py``; ``pyarrow.set_memory_pool`` would not reach the Parquet
writer, which allocates from the C++ default pool). Arrow's default mimalloc pool keeps freed segments for reuse:
on the 1M-turn benchmark it held ~30 MiB more at the end of the run and ~35 MiB more after writing
``pinned.parquet`` (whose 1M-row groups are encoded in memory).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import cache

TRIM_EVERY_CHUNKS = 8  # event-log chunks consumed between two trims during a run (~1 ms each)


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        fn = ctypes.CDLL(None).malloc_trim  # glibc only (musl has none)
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def release_free_memory() -> None:
    """Return the heap's free pages to the operating system (glibc's ``malloc_trim(0)``; elsewhere nothing)."""
    fn = _malloc_trim()
    if fn is not None:
        fn(0)
