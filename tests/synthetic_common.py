"""Shared pieces of the synthetic trace writers: timing-function types, histogram buckets, noise, writing."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

PrefillFn = Callable[[int], float]
CachedPrefillFn = Callable[[int, int], float]
DecodeStepFn = Callable[[int], float]
TransferFn = Callable[[int], float]

MIB = 2**20

# vLLM histogram buckets (VLLM_BEHAVIOUR.md 2.5).
TTFT_BUCKETS_S = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
REQUEST_TIME_BUCKETS_S = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
NIXL_XFER_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_POST_BUCKETS_S = (0.001, *NIXL_XFER_BUCKETS_S)
NIXL_BYTES_BUCKETS = tuple(float(2**k) for k in range(11, 34, 2))
NIXL_DESC_BUCKETS = (
    10.0,
    20.0,
    30.0,
    50.0,
    75.0,
    100.0,
    200.0,
    400.0,
    1000.0,
    2000.0,
    4000.0,
    10000.0,
    20000.0,
    50000.0,
)


def _noise(rng: np.random.Generator, noise_frac: float, size: int | None = None) -> Any:
    """Multiplicative noise exp(noise_frac * N(0,1)) (a float, or an array when ``size`` is given)."""
    if size is None:
        return float(np.exp(noise_frac * rng.standard_normal()))
    return np.exp(noise_frac * rng.standard_normal(size))


def _write_atomic(path: os.PathLike[str] | str, text: str) -> None:
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w", encoding="utf-8", newline="\n") as fh:
        fh.write(text)
    os.replace(tmp, path)
