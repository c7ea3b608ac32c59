"""Shared fixtures: small scenarios and the ../shared location (tests that need it skip when absent)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

# ../shared relative to the repository root; KVPLAN_SHARED points elsewhere (e.g. from a git worktree)
SHARED = Path(os.environ.get("KVPLAN_SHARED") or Path(__file__).resolve().parents[2] / "shared")


@pytest.fixture
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.skip("../shared is absent (a user's clone has no shared material)")
    return SHARED


def small(**over: Any) -> dict[str, Any]:
    """A small open-loop scenario dict; keyword args replace whole sections."""
    data: dict[str, Any] = {
        "model": "qwen3-32b",
        "hardware": "p5en",
        "deployment": {"max_num_seqs": 64, "prefill_prefix_caching": False},
        "policy": {"bidirectional": True},
        "workload": {
            "conversations": 60,
            "arrival": {"kind": "poisson", "rate_per_s": 0.5},
            "turns": {"dist": "uniform", "low": 1, "high": 6},
            "prefix_tokens": {"dist": "lognormal", "median": 3000, "sigma": 0.5},
            "user_tokens": {"dist": "uniform", "low": 20, "high": 400},
            "output_tokens": {"dist": "uniform", "low": 10, "high": 400},
            "turn_gap_s": {"dist": "exponential", "mean": 20},
        },
        "seed": 3,
    }
    data.update(over)
    return data
