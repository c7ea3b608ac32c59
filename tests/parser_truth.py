"""The "true" timing functions the synthetic writers sample from, shared by the parser tests."""

from __future__ import annotations

import numpy as np


def prefill_s(tokens: int) -> float:
    return 0.015 + 2.5e-5 * tokens + 4e-10 * tokens**2


def cached_prefill_s(new: int, cached: int) -> float:
    return 0.015 + 2.5e-5 * new + 4e-10 * new * (new + 2 * cached)


def decode_step_s(context: int) -> float:
    return 0.02 + 2e-7 * context


def transfer_s(tokens: int) -> float:
    return 0.003 + tokens * 32768 / 25e9


BYTES_PER_TOKEN_PER_RANK = 32768  # Qwen3-32B at TP8: 64 layers x 2 (K,V) x 1 KV head x 128 x 2 B


def _rng(seed: int = 7) -> np.random.Generator:
    return np.random.default_rng(seed)
