"""Heterogeneous TP between P and D: which ranks a NIXL read touches, its bytes and descriptors per rank.

Source (vLLM): ``nixl/tp_mapping.py`` ``compute_tp_mapping`` (heterogeneous TP, vLLM PR #27274):
- GQA, reader TP >= source TP: reader rank ``i`` reads its own heads from the one source rank
  ``i * source_tp // reader_tp`` (an offset inside that rank's blocks: ``rank_offset_factor``);
- GQA, reader TP < source TP: reader rank ``i`` reads from the ``source_tp / reader_tp`` source ranks
  ``i * abs .. (i + 1) * abs - 1``, deduplicated when several hold the same (replicated) head;
- MLA: the latent is replicated on every rank, so each reader rank reads it whole from one source rank.
Descriptors are built per (reader rank, source rank) pair: ``regions x blocks`` for each source rank a
reader rank reads from. Bytes a reader rank receives are its own KV share; bytes a source rank sends are
the sum over the reader ranks reading from it.

With per-rank NICs a read takes as long as its busiest NIC: ``max(bytes into a reader rank, bytes out of
the busiest source rank)`` at the line rate; with equal TP both are the per-rank KV share.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.models.arch import ModelArch, kv_bytes_per_token_per_rank


def source_ranks(arch: ModelArch, reader_rank: int, reader_tp: int, source_tp: int) -> list[int]:
    """Source TP ranks one reader rank reads from (``compute_tp_mapping``'s attention source ranks)."""
    if arch.attention == "mla" or reader_tp >= source_tp:
        return [reader_rank * source_tp // reader_tp]
    n = source_tp // reader_tp
    start = reader_rank * n
    seen: dict[int, int] = {}  # head index -> first source rank holding it (GQA dedup)
    for r in range(start, start + n):
        seen.setdefault(r * arch.num_kv_heads // source_tp, r)
    return sorted(seen.values())


@dataclass(frozen=True)
class RankPlan:
    """Per-token figures of one read direction."""

    reader_tp: int
    source_tp: int
    sources_per_reader: int  # source ranks each reader rank reads from (descriptor multiplier)
    reader_bytes_per_token: int  # into each reader rank
    source_bytes_per_token: int  # out of the busiest source rank
    total_bytes_per_token: int  # summed over reader ranks

    @property
    def bottleneck_bytes_per_token(self) -> int:
        """Bytes per token through the busiest NIC of the read."""
        return max(self.reader_bytes_per_token, self.source_bytes_per_token)


def rank_plan(arch: ModelArch, reader_tp: int, source_tp: int) -> RankPlan:
    """The read's per-rank bytes and descriptor multiplier, by enumerating vLLM's rank mapping."""
    if reader_tp < source_tp and source_tp % reader_tp:
        raise ValueError(f"TP {source_tp} is not a multiple of TP {reader_tp}")
    if reader_tp > source_tp and reader_tp % source_tp:
        raise ValueError(f"TP {reader_tp} is not a multiple of TP {source_tp}")
    per_reader = kv_bytes_per_token_per_rank(arch, reader_tp)
    per_source = kv_bytes_per_token_per_rank(arch, source_tp)
    sent: dict[int, int] = {}
    n_src = 1
    for i in range(reader_tp):
        srcs = source_ranks(arch, i, reader_tp, source_tp)
        n_src = max(n_src, len(srcs))
        # one source: the reader's own share out of it; several: each source's whole share
        each = per_reader if len(srcs) == 1 else per_source
        for s in srcs:
            sent[s] = sent.get(s, 0) + each
    return RankPlan(reader_tp, source_tp, n_src, per_reader, max(sent.values()), per_reader * reader_tp)
