"""Hostile inputs across every command (issue 13, acceptance 1): each exits 2 with one line naming the field
and the fix, prints no traceback and nothing that looks like a result, writes nothing, and stays within
10 s and 1 GiB (a forked child under RLIMIT_AS, killed at the time limit: tests/hostile.py).
"""

from __future__ import annotations

import copy
import json
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostile import TIME_LIMIT_S, run_limited

DATA = Path(__file__).parent / "data"
TRACES = DATA / "traces"
BENCH = DATA / "llm-d-2p1d__benchmark_2025-05-11_23-39-15.json"

BASE: dict[str, Any] = {
    "model": "qwen3-32b",
    "hardware": "p5en",
    "deployment": {"max_num_seqs": 64},
    "policy": {"bidirectional": True},
    "workload": {
        "conversations": 20,
        "arrival": {"kind": "poisson", "rate_per_s": 1.0},
        "turns": {"dist": "constant", "value": 3},
        "prefix_tokens": {"dist": "constant", "value": 2000},
        "user_tokens": {"dist": "constant", "value": 100},
        "output_tokens": {"dist": "constant", "value": 50},
        "turn_gap_s": {"dist": "exponential", "mean": 5},
    },
    "seed": 1,
}

Files = dict[str, str | Callable[[Path], str]]


@dataclass(frozen=True)
class Case:
    """One hostile command line: ``argv`` with ``{d}`` for the case directory, files to create, the needle
    that the one-line error must contain (the field)."""

    id: str
    argv: list[str]
    needle: str
    files: Files = field(default_factory=dict)


def scenario(**dotted: Any) -> str:
    """The base scenario as YAML with dotted-path overrides (``None`` deletes)."""
    data = copy.deepcopy(BASE)
    for path, value in dotted.items():
        node = data
        parts = path.split("__")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(parts[-1], None)
        else:
            node[parts[-1]] = value
    return yaml.safe_dump(data, sort_keys=False)


def sim(cid: str, needle: str, **dotted: Any) -> Case:
    """``kvplan simulate s.yaml --out o`` on the base scenario with overrides (``a__b`` = ``a.b``)."""
    return Case(cid, ["simulate", "{d}/s.yaml", "--out", "{d}/o"], needle, {"s.yaml": scenario(**dotted)})


def sim_text(cid: str, needle: str, text: str | Callable[[Path], str]) -> Case:
    """``kvplan simulate`` on a raw scenario text."""
    return Case(cid, ["simulate", "{d}/s.yaml", "--out", "{d}/o"], needle, {"s.yaml": text})


def grid(cid: str, needle: str, text: str, extra: list[str] | None = None, files: Files | None = None) -> Case:
    """``kvplan sweep g.yaml --out r.parquet`` on a raw grid text."""
    return Case(cid, ["sweep", "{d}/g.yaml", "--out", "{d}/r.parquet", "--workers", "1", *(extra or [])], needle,
                {"g.yaml": text, **(files or {})})


def _base_inline() -> str:
    return json.dumps(BASE)


def dist(d: str, **kw: Any) -> dict[str, Any]:
    return {"dist": d, **kw}


def _anchor_bomb(_d: Path) -> str:
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\nhardware: *a8\n"


def _grid_anchor_bomb(_d: Path) -> str:
    # the aliases sit inside base.hardware, as in the issue (6 GB once expanded)
    lines = ["base:", "  model: qwen3-32b", "  hardware:", "    x0: &x0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for i in range(1, 8):
        lines.append(f"    x{i}: &x{i} [" + ", ".join([f"*x{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def _deep(_d: Path) -> str:
    return "model: " + "[" * 5000 + "]" * 5000 + "\n"


def _deep_map(_d: Path) -> str:
    return "".join("  " * i + f"k{i}:\n" for i in range(400)) + "  " * 400 + "v: 1\n"


def _big_inline(_d: Path) -> str:
    values = ", ".join(["100.0"] * 300_000)  # a 2 MB inline list (the was 3.9 MB: 735 MB of memory)
    return scenario(workload__user_tokens=None) + f"  user_tokens: {{dist: empirical, values: [{values}]}}\n"


def _recursive_alias(_d: Path) -> str:
    return "model: &m [*m]\n"


CSV_HEADER = "session_id,timestamp_s,input_tokens,output_tokens\n"
POINTS_HEADER = "kind,tokens,cached_tokens,value_ms\n"


def _bench_with(**kw: Any) -> Callable[[Path], str]:
    def make(_d: Path) -> str:
        data = json.loads(BENCH.read_text())
        data.update(kw)
        return json.dumps(data)

    return make


SIM_CASES: list[Case] = [
    # the hangs, livelocks and unbounded memory
    sim("gap 1e8", "turn_gap_s", workload__turn_gap_s=dist("constant", value=1e8)),
    sim("gap 1e9", "turn_gap_s", workload__turn_gap_s=dist("constant", value=1e9)),
    sim("gap exp mean 1e9", "turn_gap_s", workload__turn_gap_s=dist("exponential", mean=1e9)),
    sim("rate 1e-300", "workload", workload__arrival={"kind": "poisson", "rate_per_s": 1e-300}),
    sim("rate 1e-9", "workload", workload__arrival={"kind": "poisson", "rate_per_s": 1e-9}),
    sim("rate 1e-9 one conversation", "workload", workload__conversations=1,
        workload__arrival={"kind": "poisson", "rate_per_s": 1e-9}),
    sim("lognormal sigma 1e6", "sigma", workload__turn_gap_s=dist("lognormal", median=5, sigma=1e6)),
    sim("lognormal gap sigma 10 median 1e6", "turn_gap_s", workload__turn_gap_s=dist("lognormal", median=1e6, sigma=10)),
    sim("turns 1e9", "turns", workload__turns=dist("constant", value=1e9)),
    sim("turns 1e5 x 200", "turns", workload__conversations=200, workload__turns=dist("constant", value=1e5)),
    sim("conversations 1e7", "conversations", workload__conversations=10_000_000),
    sim("conversations 1e6 x 11 turns", "turns", workload__conversations=1_000_000,
        workload__turns=dist("constant", value=11)),
    sim("turns exp mean 1e9", "turns", workload__turns=dist("exponential", mean=1e9)),
    sim("empirical turns huge", "turns", workload__turns=dist("empirical", values=[1, 1e12])),
    sim_text("inline empirical 300k values", "values", _big_inline),
    # silent nonsense of the issue
    sim("prefix .inf", "prefix_tokens", workload__prefix_tokens=dist("constant", value=float("inf"))),
    sim("prefix 1e30", "prefix_tokens", workload__prefix_tokens=dist("constant", value=1e30)),
    sim("output 1e30", "output_tokens", workload__output_tokens=dist("constant", value=1e30)),
    sim("user uniform high 1e30", "user_tokens", workload__user_tokens=dist("uniform", low=1, high=1e30)),
    sim("prefix nan", "prefix_tokens", workload__prefix_tokens=dist("constant", value=float("nan"))),
    sim("ttl .inf", "decoder_kv_blocks_ttl_s", policy__decoder_kv_blocks_ttl_s=float("inf")),
    sim("ttl 1e30", "decoder_kv_blocks_ttl_s", policy__decoder_kv_blocks_ttl_s=1e30),
    sim("ttl nan", "decoder_kv_blocks_ttl_s", policy__decoder_kv_blocks_ttl_s=float("nan")),
    sim("router ttl inf", "router_ttl_s", policy__router_ttl_s=float("inf")),
    sim("rate .inf", "rate_per_s", workload__arrival={"kind": "poisson", "rate_per_s": float("inf")}),
    sim("rate .nan", "rate_per_s", workload__arrival={"kind": "poisson", "rate_per_s": float("nan")}),
    sim("rate 1e300", "rate_per_s", workload__arrival={"kind": "poisson", "rate_per_s": 1e300}),
    sim("margin .inf", "expiry_safety_margin_s", policy__expiry_safety_margin_s=float("inf")),
    sim("margin nan", "expiry_safety_margin_s", policy__expiry_safety_margin_s=float("nan")),
    sim("margin 1e9", "expiry_safety_margin_s", policy__expiry_safety_margin_s=1e9),
    sim("skew .inf", "clock_skew_s", policy__clock_skew_s=float("inf")),
    sim("skew -.inf", "clock_skew_s", policy__clock_skew_s=float("-inf")),
    sim("skew nan", "clock_skew_s", policy__clock_skew_s=float("nan")),
    sim("skew 1e9", "clock_skew_s", policy__clock_skew_s=1e9),
    sim("tp 3", "tensor_parallel_size", deployment__tensor_parallel_size=3),
    sim("tp 5", "tensor_parallel_size", deployment__tensor_parallel_size=5),
    sim("tp 16 over node", "tensor_parallel_size", deployment__tensor_parallel_size=16),
    sim("tp 0", "tensor_parallel_size", deployment__tensor_parallel_size=0),
    sim("batched < seqs", "max_num_batched_tokens", deployment__max_num_batched_tokens=32),
    sim("max_num_seqs 2**70", "max_num_seqs", deployment__max_num_seqs=2**70),
    sim("batched 2**70", "max_num_batched_tokens", deployment__max_num_batched_tokens=2**70),
    sim("decode capacity 16", "decode_kv_capacity_tokens", deployment__decode_kv_capacity_tokens=16),
    sim("decode capacity 1000", "decode_kv_capacity_tokens", deployment__decode_kv_capacity_tokens=1000),
    sim("decode capacity 2**80", "decode_kv_capacity_tokens", deployment__decode_kv_capacity_tokens=2**80),
    sim("prefill capacity 16", "prefill_kv_capacity_tokens", deployment__prefill_kv_capacity_tokens=16),
    sim("prefill nodes 1000", "prefill_nodes", deployment__prefill_nodes=1000),
    sim("decode nodes -1", "decode_nodes", deployment__decode_nodes=-1),
    sim("gpu util 0", "gpu_memory_utilization", deployment__gpu_memory_utilization=0),
    sim("gpu util 1.5", "gpu_memory_utilization", deployment__gpu_memory_utilization=1.5),
    sim("gpu util nan", "gpu_memory_utilization", deployment__gpu_memory_utilization=float("nan")),
    sim("routing bogus", "routing", deployment__routing="carrier-pigeon"),
    sim("link bogus", "link", deployment__link="carrier-pigeon"),
    sim("threshold 2**70", "kv_recompute_threshold_tokens", policy__kv_recompute_threshold_tokens=2**70),
    sim("threshold float", "kv_recompute_threshold_tokens", policy__kv_recompute_threshold_tokens=6.5),
    sim("bidirectional maybe", "bidirectional", policy__bidirectional="maybe"),
    sim("seed -1", "seed", seed=-1),
    sim("seed 2**70", "seed", seed=2**70),
    sim("seed string", "seed", seed="abc"),
    sim("unknown section", "bogus", bogus={"a": 1}),
    sim("unknown policy field", "policy.ttl", policy__ttl=5),
    sim("closed loop clients 0", "clients", workload__arrival={"kind": "closed_loop", "clients": 0,
                                                                 "max_active_conversations": 2}),
    sim("closed loop clients 1e9", "clients", workload__arrival={"kind": "closed_loop", "clients": 10**9,
                                                                   "max_active_conversations": 2}),
    sim("closed loop gap 1e9", "turn_gap_s", workload__arrival={"kind": "closed_loop", "clients": 1,
                                                                  "max_active_conversations": 2},
        workload__turn_gap_s=dist("constant", value=1e9)),
    sim("arrival kind bogus", "workload.arrival", workload__arrival={"kind": "bursty"}),
    sim("empirical empty", "values", workload__user_tokens=dist("empirical", values=[])),
    sim("empirical nan", "values", workload__user_tokens=dist("empirical", values=[1.0, float("nan")])),
    sim("empirical negative", "values", workload__user_tokens=dist("empirical", values=[1.0, -5.0])),
    sim("empirical both", "values", workload__user_tokens=dist("empirical", values=[1.0], path="x.csv")),
    sim("empirical path missing", "nonexistent", workload__user_tokens=dist("empirical", path="/nonexistent/x.csv")),
    sim("uniform reversed", "user_tokens", workload__user_tokens=dist("uniform", low=10, high=1)),
    sim("uniform inf", "user_tokens", workload__user_tokens=dist("uniform", low=1, high=float("inf"))),
    sim("exponential mean 0", "turn_gap_s", workload__turn_gap_s=dist("exponential", mean=0)),
    sim("exponential mean -1", "turn_gap_s", workload__turn_gap_s=dist("exponential", mean=-1)),
    sim("constant negative", "user_tokens", workload__user_tokens=dist("constant", value=-1)),
    sim("dist pareto", "turn_gap_s", workload__turn_gap_s=dist("pareto", alpha=2)),
    sim("costs prefill inf", "costs", costs={"prefill": {"fixed_s": float("inf")}}),
    sim("costs decode nan", "costs", costs={"decode": {"fixed_s": float("nan")}}),
    sim("costs transfer 1e300", "costs", costs={"transfer": {"per_byte_s": 1e300}}),
    sim("model unknown", "unknown model", model="gpt-9"),
    sim("hardware unknown", "unknown hardware", hardware="tpu-v9"),
    sim("profile missing", "profile", profile="/nonexistent/profile.json"),
    sim("trace missing file", "trace", workload__trace={"path": "/nonexistent/trace.csv"}),
    sim("trace format bogus", "format", workload__trace={"path": str(TRACES / "sessions_small.csv"), "format": "parquet"}),
    sim("trace time_scale 0", "time_scale", workload__trace={"path": str(TRACES / "sessions_small.csv"), "time_scale": 0}),
    sim("trace time_scale inf", "time_scale",
        workload__trace={"path": str(TRACES / "sessions_small.csv"), "time_scale": float("inf")}),
    sim("trace time_scale 1e-9", "time_scale",
        workload__trace={"path": str(TRACES / "sessions_small.csv"), "time_scale": 1e-9}),
    sim("trace window reversed", "window_s",
        workload__trace={"path": str(TRACES / "sessions_small.csv"), "window_s": [100, 10]}),
    sim("trace window nan", "window_s",
        workload__trace={"path": str(TRACES / "sessions_small.csv"), "window_s": [0, float("nan")]}),
    sim("trace sample 0", "sample_sessions",
        workload__trace={"path": str(TRACES / "sessions_small.csv"), "sample_sessions": 0}),
    sim("trace sample 2", "sample_sessions",
        workload__trace={"path": str(TRACES / "sessions_small.csv"), "sample_sessions": 2}),
    # YAML itself
    sim_text("yaml anchor bomb", "YAML expands", _anchor_bomb),
    sim_text("yaml nested 5000 deep", "nested deeper", _deep),
    sim_text("yaml mapping nested 400 deep", "nested deeper", _deep_map),
    sim_text("yaml recursive alias", "recursive", _recursive_alias),
    sim_text("yaml duplicate key", "given twice", "model: qwen3-32b\nmodel: glm-5-fp8\n"),
    sim_text("yaml duplicate nested key", "given twice",
             "policy:\n  decoder_kv_blocks_ttl_s: 1\n  decoder_kv_blocks_ttl_s: 2\n"),
    sim_text("yaml not a mapping", "expected a mapping", "- a\n- b\n"),
    sim_text("yaml python tag", "YAML error", "model: !!python/object/apply:os.system ['true']\n"),
    sim_text("yaml truncated", "YAML error", "model: qwen3-32b\npolicy:\n  bidirectional: [true,\n"),
    sim_text("yaml binary junk", "binary file", "\x00\x01\x02\x03: [\n"),
    sim_text("yaml empty", "empty scenario", ""),
    Case("scenario missing file", ["simulate", "{d}/nope.yaml", "--out", "{d}/o"], "no such scenario file"),
    Case("scenario 5 MiB", ["simulate", "{d}/s.yaml", "--out", "{d}/o"], "larger than 4 MiB",
         {"s.yaml": lambda _d: "# " + "x" * (5 * 1024**2) + "\n"}),
    # trace plus --trace, trace parsers
    Case("scenario trace plus --trace", ["simulate", "{d}/s.yaml", "--trace", str(TRACES / "sessions_small.csv"),
                                         "--out", "{d}/o"], "--trace",
         {"s.yaml": scenario(workload__trace={"path": str(TRACES / "sessions_small.csv")})}),
    Case("trace csv 1e300 tokens", ["simulate", "--trace", "{d}/t.csv", "--out", "{d}/o"], "input_tokens",
         {"t.csv": CSV_HEADER + "a,0,1e300,10\n"}),
    Case("trace csv 1e300 timestamp", ["simulate", "--trace", "{d}/t.csv", "--out", "{d}/o"], "simulated time",
         {"t.csv": CSV_HEADER + "a,0,100,10\nb,1e300,100,10\n"}),
    Case("trace csv nan timestamp", ["simulate", "--trace", "{d}/t.csv", "--out", "{d}/o"], "timestamp_s",
         {"t.csv": CSV_HEADER + "a,nan,100,10\n"}),
    Case("trace csv inf tokens", ["simulate", "--trace", "{d}/t.csv", "--out", "{d}/o"], "input_tokens",
         {"t.csv": CSV_HEADER + "a,0,inf,10\n"}),
    Case("trace csv wrong header", ["simulate", "--trace", "{d}/t.csv", "--out", "{d}/o"],
         "session_id,timestamp_s,input_tokens,output_tokens", {"t.csv": "a,b,c\n1,2,3\n"}),
    Case("trace csv backwards", ["simulate", "--trace", "{d}/t.csv", "--out", "{d}/o"], "timestamp",
         {"t.csv": CSV_HEADER + "a,10,100,10\nb,5,100,10\n"}),
    Case("trace csv span 1e9 s", ["simulate", "--trace", "{d}/t.csv", "--out", "{d}/o"], "simulated time",
         {"t.csv": CSV_HEADER + "a,0,100,10\nb,1000000000,100,10\n"}),
    Case("trace empty", ["simulate", "--trace", "{d}/t.jsonl", "--out", "{d}/o"], "t.jsonl", {"t.jsonl": ""}),
    Case("trace junk", ["simulate", "--trace", "{d}/t.jsonl", "--out", "{d}/o"], "t.jsonl",
         {"t.jsonl": "hello world\n"}),
    Case("trace mooncake bad hash length", ["simulate", "--trace", "{d}/t.jsonl", "--out", "{d}/o"], "hash_ids",
         {"t.jsonl": '{"timestamp": 0, "input_length": 1500, "output_length": 10, "hash_ids": [1]}\n'}),
    Case("trace mooncake 1e300 length", ["simulate", "--trace", "{d}/t.jsonl", "--out", "{d}/o"], "input_length",
         {"t.jsonl": '{"timestamp": 0, "input_length": 1e300, "output_length": 10, "hash_ids": [1]}\n'}),
    Case("trace mooncake negative output", ["simulate", "--trace", "{d}/t.jsonl", "--out", "{d}/o"], "output_length",
         {"t.jsonl": '{"timestamp": 0, "input_length": 10, "output_length": -3, "hash_ids": [1]}\n'}),
    Case("trace missing", ["simulate", "--trace", "{d}/none.csv", "--out", "{d}/o"], "none.csv"),
    Case("simulate --seed -1", ["simulate", "--out", "{d}/o", "--seed", "-1"], "--seed"),
    Case("simulate --seed 2**70", ["simulate", "--out", "{d}/o", "--seed", str(2**70)], "--seed"),
]

GRID_CASES: list[Case] = [
    grid("grid duplicate axes", "given twice",
         f"base: {_base_inline()}\naxes:\n  policy.decoder_kv_blocks_ttl_s: [30]\n  policy.decoder_kv_blocks_ttl_s: [60]\n"),
    grid("grid replications 1e8", "replications", f"base: {_base_inline()}\nreplications: 100000000\n"),
    grid("grid replications 0", "replications", f"base: {_base_inline()}\nreplications: 0\n"),
    grid("grid replications float", "replications", f"base: {_base_inline()}\nreplications: 2.5\n"),
    grid("grid --replications 1e8", "replications", f"base: {_base_inline()}\n", ["--replications", "100000000"]),
    grid("grid --replications 0", "replications", f"base: {_base_inline()}\n", ["--replications", "0"]),
    grid("grid 1e6+ points", "points",
         f"base: {_base_inline()}\naxes:\n  policy.decoder_kv_blocks_ttl_s: {list(range(1, 1001))}\n"
         f"  policy.router_ttl_s: {list(range(1, 1002))}\n"),
    grid("grid 200k points", "points", f"base: {_base_inline()}\naxes:\n"
         f"  policy.decoder_kv_blocks_ttl_s: {list(range(1, 201))}\n  policy.router_ttl_s: {list(range(1, 1001))}\n"),
    grid("grid points x replications", "runs", f"base: {_base_inline()}\nreplications: 1000\naxes:\n"
         f"  policy.decoder_kv_blocks_ttl_s: {list(range(1, 201))}\n"),
    grid("grid unknown axis", "unknown scenario field", f"base: {_base_inline()}\naxes:\n  policy.ttl: [1, 2]\n"),
    grid("grid empty axis", "is empty", f"base: {_base_inline()}\naxes:\n  policy.router_ttl_s: []\n"),
    grid("grid axis not list", "must be a list", f"base: {_base_inline()}\naxes:\n  policy.router_ttl_s: 5\n"),
    grid("grid seed axis", "seed", f"base: {_base_inline()}\naxes:\n  seed: [1, 2]\n"),
    grid("grid seed -1", "seed", f"base: {_base_inline()}\nseed: -1\n"),
    grid("grid unknown key", "unknown grid key", f"base: {_base_inline()}\nbogus: 1\n"),
    grid("grid no base", "base", "axes:\n  policy.router_ttl_s: [1]\n"),
    grid("grid base missing file", "no such scenario file", "base: nothere.yaml\n"),
    grid("grid point inf ttl", "decoder_kv_blocks_ttl_s",
         f"base: {_base_inline()}\naxes:\n  policy.decoder_kv_blocks_ttl_s: [30, .inf]\n"),
    grid("grid point nan rate", "rate_per_s",
         f"base: {_base_inline()}\naxes:\n  workload.arrival.rate_per_s: [1, .nan]\n"),
    grid("grid point tp 3", "tensor_parallel_size",
         f"base: {_base_inline()}\naxes:\n  deployment.tensor_parallel_size: [8, 3]\n"),
    grid("grid point gap 1e9", "turn_gap_s", f"base: {_base_inline()}\naxes:\n  workload.turn_gap_s.mean: [5, 1.0e+9]\n"),
    grid("grid anchor bomb in base.hardware", "YAML expands", "", files={"g.yaml": _grid_anchor_bomb}),
    grid("grid nested deep", "nested deeper", "base: " + "[" * 3000 + "]" * 3000 + "\n"),
    grid("grid not a mapping", "mapping", "- 1\n- 2\n"),
    grid("grid empty", "empty grid", ""),
    Case("sweep --out r.csv", ["sweep", "{d}/g.yaml", "--out", "{d}/r.csv"], ".parquet",
         {"g.yaml": f"base: {_base_inline()}\n"}),
    Case("sweep --out dir", ["sweep", "{d}/g.yaml", "--out", "{d}"], "--out", {"g.yaml": f"base: {_base_inline()}\n"}),
    Case("sweep backend bogus", ["sweep", "{d}/g.yaml", "--out", "{d}/r.parquet", "--backend", "slurm"], "backend",
         {"g.yaml": f"base: {_base_inline()}\n"}),
    Case("sweep --workers 1e6", ["sweep", "{d}/g.yaml", "--out", "{d}/r.parquet", "--workers", "1000000"], "--workers",
         {"g.yaml": f"base: {_base_inline()}\n"}),
    Case("sweep missing grid", ["sweep", "{d}/none.yaml", "--out", "{d}/r.parquet"], "no such grid file"),
]

CLI_CASES: list[Case] = [
    # cost
    Case("cost --tokens 1e13", ["cost", "--profile", "p5en-qwen3-32b", "--tokens", "10000000000000"], "--tokens"),
    Case("cost --tokens 1e13 sci", ["cost", "--profile", "p5en-qwen3-32b", "--tokens", "1e13"], "--tokens"),
    Case("cost --tokens 0", ["cost", "--profile", "p5en-qwen3-32b", "--tokens", "0"], "--tokens"),
    Case("cost --cached 1e15", ["cost", "--profile", "p5en-qwen3-32b", "--tokens", "10", "--cached-tokens",
                                "1000000000000000"], "--cached-tokens"),
    Case("cost chunk 1 tokens 1e7", ["cost", "--profile", "p5en-qwen3-32b", "--tokens", "10000000", "--chunk-tokens",
                                     "1"], "--chunk-tokens"),
    # --tp without --model is honoured now (the profile's model at that TP, issue 9): a bad TP is still refused
    Case("cost --tp 3 without --model", ["cost", "--profile", "p5en-qwen3-32b", "--tokens", "100", "--tp", "3"], "--tp"),
    Case("cost --tp 3 with --model", ["cost", "--profile", "p5en-qwen3-32b", "--tokens", "100", "--model",
                                      "llama-3.3-70b", "--tp", "3"], "--tp"),
    Case("cost profile missing", ["cost", "--profile", "/nonexistent.json", "--tokens", "100"], "profile"),
    Case("cost model unknown", ["cost", "--profile", "p5en-qwen3-32b", "--tokens", "100", "--model", "gpt-9"], "model"),
    # recommend
    Case("recommend --ttl-grid 2000 values", ["recommend", "--workload", "chat", "--ttl-grid",
                                              ",".join(str(i) for i in range(1, 2001))], "--ttl-grid"),
    Case("recommend --ttl-grid words", ["recommend", "--workload", "chat", "--ttl-grid", "a,b"], "--ttl-grid"),
    Case("recommend --ttl-grid inf", ["recommend", "--workload", "chat", "--ttl-grid", "30,inf"], "--ttl-grid"),
    Case("recommend --ttl-grid nan", ["recommend", "--workload", "chat", "--ttl-grid", "nan"], "--ttl-grid"),
    Case("recommend --ttl-grid negative", ["recommend", "--workload", "chat", "--ttl-grid", "-5,30"], "--ttl-grid"),
    Case("recommend --replications 1e8", ["recommend", "--workload", "chat", "--replications", "100000000"],
         "--replications"),
    Case("recommend --rate nan", ["recommend", "--workload", "chat", "--rate", "nan"], "--rate"),
    Case("recommend --rate inf", ["recommend", "--workload", "chat", "--rate", "inf"], "--rate"),
    Case("recommend --rate 0", ["recommend", "--workload", "chat", "--rate", "0"], "--rate"),
    Case("recommend --rate 1e-9", ["recommend", "--workload", "chat", "--rate", "1e-9"], "rate"),
    Case("recommend --slo nan", ["recommend", "--workload", "chat", "--slo-ttft-p90-ms", "nan"], "--slo-ttft-p90-ms"),
    Case("recommend --slo -1", ["recommend", "--workload", "chat", "--slo-ttft-p90-ms", "-1"], "--slo-ttft-p90-ms"),
    Case("recommend --budget nan", ["recommend", "--workload", "chat", "--decode-hbm-budget-gib", "nan"],
         "--decode-hbm-budget-gib"),
    Case("recommend --budget -5", ["recommend", "--workload", "chat", "--decode-hbm-budget-gib", "-5"],
         "--decode-hbm-budget-gib"),
    Case("recommend --conversations 1e9", ["recommend", "--workload", "chat", "--conversations", "1000000000"],
         "conversations"),
    Case("recommend --conversations 0", ["recommend", "--workload", "chat", "--conversations", "0"], "conversations"),
    Case("recommend workload bogus", ["recommend", "--workload", "bogus"], "bogus"),
    Case("recommend scenario and workload", ["recommend", "{d}/s.yaml", "--workload", "chat"], "not both",
         {"s.yaml": scenario()}),
    # capacity
    Case("capacity --rate nan", ["capacity", "--rate", "nan", "--slo-ttft-p90-ms", "500"], "--rate"),
    Case("capacity --rate inf", ["capacity", "--rate", "inf", "--slo-ttft-p90-ms", "500"], "--rate"),
    Case("capacity --rate 0", ["capacity", "--rate", "0", "--slo-ttft-p90-ms", "500"], "--rate"),
    Case("capacity --rate -1", ["capacity", "--rate", "-1", "--slo-ttft-p90-ms", "500"], "--rate"),
    Case("capacity --slo nan", ["capacity", "--rate", "1", "--slo-ttft-p90-ms", "nan"], "--slo-ttft-p90-ms"),
    Case("capacity --slo 0", ["capacity", "--rate", "1", "--slo-ttft-p90-ms", "0"], "--slo-ttft-p90-ms"),
    Case("capacity --max-nodes 0", ["capacity", "--rate", "1", "--slo-ttft-p90-ms", "500", "--max-nodes", "0"],
         "--max-nodes"),
    Case("capacity --max-nodes 1e6", ["capacity", "--rate", "1", "--slo-ttft-p90-ms", "500", "--max-nodes", "1000000"],
         "--max-nodes"),
    Case("capacity --replications 1e8", ["capacity", "--rate", "1", "--slo-ttft-p90-ms", "500", "--replications",
                                         "100000000"], "--replications"),
    Case("capacity --usd nan", ["capacity", "--rate", "1", "--slo-ttft-p90-ms", "500", "--usd-per-node-hour", "nan"],
         "--usd-per-node-hour"),
    Case("capacity --conversations 1e9", ["capacity", "--rate", "1", "--slo-ttft-p90-ms", "500", "--conversations",
                                          "1000000000"], "conversations"),
    Case("capacity workload bogus", ["capacity", "--rate", "1", "--slo-ttft-p90-ms", "500", "--workload", "x"], "x"),
    # workload show / fit
    Case("workload show --ttls nan", ["workload", "show", str(TRACES / "sessions_small.csv"), "--ttls", "nan"],
         "--ttls"),
    Case("workload show --ttls words", ["workload", "show", str(TRACES / "sessions_small.csv"), "--ttls", "a"],
         "--ttls"),
    Case("workload show --ttls -1", ["workload", "show", str(TRACES / "sessions_small.csv"), "--ttls", "-1"], "--ttls"),
    Case("workload show --format bogus", ["workload", "show", str(TRACES / "sessions_small.csv"), "--format", "xml"],
         "format"),
    Case("workload show junk", ["workload", "show", "{d}/t.csv"], "t.csv", {"t.csv": "x,y\n1,2\n"}),
    Case("workload fit all-zero tokens", ["workload", "fit", "{d}/t.csv", "--out", "{d}/w.yaml"], "tokens",
         {"t.csv": CSV_HEADER + "".join(f"s{i % 3},{i},0,0\n" for i in range(30))}),
    Case("workload fit gap model bogus", ["workload", "fit", str(TRACES / "sessions_small.csv"), "--out", "{d}/w.yaml",
                                          "--gap-model", "magic"], "--gap-model"),
    Case("workload fit 1e300", ["workload", "fit", "{d}/t.csv", "--out", "{d}/w.yaml"], "input_tokens",
         {"t.csv": CSV_HEADER + "a,0,1e300,10\na,5,1e300,10\n"}),
    # calibrate
    Case("calibrate bench of another model", ["calibrate", "--bench", str(BENCH), "--model", "qwen3-32b",
                                              "--hardware", "p5en", "--out", "{d}/p.json"], "model_id"),
    Case("calibrate points 1e300 ms", ["calibrate", "--points", "{d}/p.csv", "--model", "qwen3-32b", "--hardware",
                                       "p5en", "--out", "{d}/p.json"], "value_ms",
         {"p.csv": POINTS_HEADER + "prefill,1000,0,1e300\nprefill,2000,0,1e300\nprefill,4000,0,5\n"}),
    Case("calibrate points inf", ["calibrate", "--points", "{d}/p.csv", "--model", "qwen3-32b", "--hardware",
                                  "p5en", "--out", "{d}/p.json"], "value_ms",
         {"p.csv": POINTS_HEADER + "prefill,1000,0,inf\n"}),
    Case("calibrate points tokens 1e300", ["calibrate", "--points", "{d}/p.csv", "--model", "qwen3-32b", "--hardware",
                                           "p5en", "--out", "{d}/p.json"], "tokens",
         {"p.csv": POINTS_HEADER + "prefill,1e300,0,5\n"}),
    Case("calibrate points wrong header", ["calibrate", "--points", "{d}/p.csv", "--model", "qwen3-32b", "--hardware",
                                           "p5en", "--out", "{d}/p.json"], "kind,tokens,cached_tokens,value_ms",
         {"p.csv": "a,b\n1,2\n"}),
    Case("calibrate no inputs", ["calibrate", "--model", "qwen3-32b", "--hardware", "p5en", "--out", "{d}/p.json"],
         "calibrate"),
    Case("calibrate model unknown", ["calibrate", "--points", str(BENCH), "--model", "gpt-9", "--hardware", "p5en",
                                     "--out", "{d}/p.json"], "model"),
    Case("calibrate hardware p5en-tcp", ["calibrate", "--bench", str(BENCH), "--model", "qwen3-32b", "--hardware",
                                         "tpu", "--out", "{d}/p.json"], "hardware"),
    Case("calibrate bench nan", ["calibrate", "--bench", "{d}/b.json", "--model", "qwen3-32b", "--hardware", "p5en",
                                 "--out", "{d}/p.json"], "b.json",
         {"b.json": _bench_with(model_id="Qwen/Qwen3-32B", mean_ttft_ms="NaN")}),
    Case("calibrate tp 3", ["calibrate", "--bench", "{d}/b.json", "--model", "qwen3-32b", "--hardware", "p5en",
                            "--out", "{d}/p.json", "--tp", "3"], "--tp",
         {"b.json": _bench_with(model_id="Qwen/Qwen3-32B")}),
    # reproduce, dashboard
    Case("reproduce --html DIR", ["reproduce", "--model", "qwen3-32b", "--html", "{d}"], "--html"),
    Case("reproduce --html missing dir", ["reproduce", "--model", "qwen3-32b", "--html", "{d}/no/x.html"], "--html"),
    Case("reproduce --model bogus", ["reproduce", "--model", "gpt-9"], "gpt-9"),
    Case("dashboard --address 999.1.1.1", ["dashboard", "--address", "999.1.1.1", "--port", "1"], "--address"),
    Case("dashboard --port 0", ["dashboard", "--port", "0"], "--port"),
    Case("dashboard --port 70000", ["dashboard", "--port", "70000"], "--port"),
]

CASES = SIM_CASES + GRID_CASES + CLI_CASES


def test_table_is_big_enough() -> None:
    assert len(CASES) >= 120
    assert len({c.id for c in CASES}) == len(CASES)


def _materialise(case: Case, d: Path) -> list[str]:
    for name, content in case.files.items():
        text = content(d) if callable(content) else content
        (d / name).write_text(text)
    return [a.replace("{d}", str(d)) for a in case.argv]


def check_refused(case: Case, d: Path) -> None:
    """Run one case and assert the contract of acceptance 1."""
    d.mkdir(parents=True, exist_ok=True)
    argv = _materialise(case, d)
    before = sorted(p.name for p in d.iterdir())
    res = run_limited(argv, d)
    err_lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.code is not None, f"killed after {TIME_LIMIT_S} s: {res.stderr[-300:]}"
    assert res.wall_s < TIME_LIMIT_S
    assert "Traceback" not in res.stderr and "Traceback" not in res.stdout, res.stderr[-2000:]
    assert res.code == 2, (res.code, res.stderr[-500:], res.stdout[-500:])
    assert len(err_lines) == 1 and err_lines[0].startswith("error: "), res.stderr[-1000:]
    assert case.needle.lower() in err_lines[0].lower(), err_lines[0]
    assert "wrote" not in res.stdout
    after = sorted(p.name for p in d.iterdir())
    assert after == before, f"files left behind: {set(after) - set(before)}"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_refused(case: Case, tmp_path: Path) -> None:
    check_refused(case, tmp_path / "case")


def test_dashboard_port_in_use_exits_2(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        case = Case("dashboard port in use", ["dashboard", "--address", "127.0.0.1", "--port", str(port)], "--port")
        check_refused(case, tmp_path / "case")
