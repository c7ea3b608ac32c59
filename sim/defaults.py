"""Embedded default scenarios (no files needed): the published P5en benchmark setting."""

from __future__ import annotations

from typing import Any

from kvplan.sim.scenario import Scenario, scenario_from_dict

# The published write-up's benchmark (VLLM_BEHAVIOUR.md header; ../shared/data/README.md): 1P1D p5en,
# TP8, max_num_seqs 8, max_model_len 32768, prefix caching off on P only, 10 conversations of 5 user
# turns, 150-token user messages, 300-token responses, 2 clients, at most 10 active conversations, no
# think time, bidirectional on with vLLM's defaults (TTL 480 s, threshold 64, router TTL 450 s).
PUBLISHED_BENCHMARK: dict[str, Any] = {
    "model": "qwen3-32b",
    "hardware": "p5en",
    "deployment": {
        "prefill_nodes": 1,
        "decode_nodes": 1,
        "tensor_parallel_size": 8,
        "max_num_seqs": 8,
        "max_num_batched_tokens": 8192,
        "prefill_prefix_caching": False,
        "decode_prefix_caching": True,
    },
    "policy": {"bidirectional": True},
    "workload": {
        "conversations": 10,
        "arrival": {"kind": "closed_loop", "clients": 2, "max_active_conversations": 10},
        "turns": {"dist": "constant", "value": 5},
        "prefix_tokens": {"dist": "constant", "value": 24000},
        "user_tokens": {"dist": "constant", "value": 150},
        "output_tokens": {"dist": "constant", "value": 300},
        "turn_gap_s": {"dist": "constant", "value": 0},
    },
    "seed": 0,
}


def published_benchmark(model: str = "qwen3-32b", prefix_tokens: int = 24000, bidirectional: bool = True) -> Scenario:
    """The published P5en benchmark at one prefix size, ON or OFF."""
    data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in PUBLISHED_BENCHMARK.items()}
    data["model"] = model
    wl = dict(data["workload"])
    wl["prefix_tokens"] = {"dist": "constant", "value": prefix_tokens}
    data["workload"] = wl
    data["policy"] = {"bidirectional": bidirectional}
    return scenario_from_dict(data, where="embedded published benchmark")


def default_scenario() -> Scenario:
    """The scenario ``kvplan simulate`` runs when none is given: the published benchmark at 24k, ON."""
    return published_benchmark()


def trace_replay_scenario(path: str) -> Scenario:
    """What ``kvplan simulate --trace F`` (no scenario) and the dashboard's trace replay run: the trace on the
    scenario's field defaults (1P1D p5en Qwen3-32B TP8, ``max_num_seqs`` 1024, bidirectional on with vLLM's TTL and
    threshold; ``kvplan simulate --help`` lists them). Not the published benchmark's deployment: its
    ``max_num_seqs`` 8 and closed loop of 2 clients were that benchmark's, and a trace brings its own clock."""
    return scenario_from_dict({"workload": {"trace": {"path": str(path)}}}, where="trace replay")

