"""The saturated 16P56D deployment of issue 18 and its hand sweep, shared by tests/test_advice_saturation.py (scaled
down) and benchmarks/bench_recommend.py (full size): Llama-3.3-70B on p5, TP8, a 30k-token prefix growing by 1,500
user + 500 output tokens per turn, 10 turns, gaps uniform 20-60 s, 3 new conversations/s at full size."""

from __future__ import annotations

from typing import Any

#: The issue's hand sweep: TTL 60/90/120/180 s with router TTL = TTL - 10 s (failure policy recompute), and
#: retention off; (name, scenario overrides).
HAND_SWEEP: tuple[tuple[str, dict[str, Any]], ...] = (
    *((f"ttl_{t}_router_{t - 10}", {"policy.decoder_kv_blocks_ttl_s": t, "policy.router_ttl_s": t - 10,
                                    "policy.kv_load_failure_policy": "recompute"}) for t in (60, 90, 120, 180)),
    ("retention_off", {"policy.bidirectional": False}),
)


def shape_16p56d(conversations: int, scale: int = 1) -> dict[str, Any]:
    """The scenario (a dict for ``scenario_from_dict``) with ``16 // scale`` P, ``56 // scale`` D and
    ``3 / scale`` new conversations per second: the same load per node at every ``scale``."""
    return {"model": "llama-3.3-70b", "hardware": "p5",
            "deployment": {"prefill_nodes": 16 // scale, "decode_nodes": 56 // scale, "tensor_parallel_size": 8},
            "workload": {"conversations": conversations, "arrival": {"kind": "poisson", "rate_per_s": 3 / scale},
                         "turns": {"dist": "constant", "value": 10},
                         "prefix_tokens": {"dist": "constant", "value": 30000},
                         "user_tokens": {"dist": "constant", "value": 1500},
                         "output_tokens": {"dist": "constant", "value": 500},
                         "turn_gap_s": {"dist": "uniform", "low": 20, "high": 60}},
            "seed": 1}
