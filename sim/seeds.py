"""Replication seeds: independent streams spawned from the base seed (``numpy.random.SeedSequence``).

Replication ``k`` of a sweep, an advice or a capacity search runs with ``replication_seeds(seed, K)[k]``,
the first 32-bit word of ``SeedSequence(seed).spawn(K)[k]``: the same in every configuration (common
random numbers), unlike ``seed + k`` not shared between runs whose base seeds differ by less than ``K``.
"""

from __future__ import annotations

import numpy as np


def replication_seeds(seed: int, n: int) -> list[int]:
    """The ``n`` replication seeds of base ``seed`` (integers in [0, 2**32), deterministic)."""
    return [int(child.generate_state(1)[0]) for child in np.random.SeedSequence(seed).spawn(n)]
