"""Issue 22 (items 7-11, 14, 15): the round-3 hostile inputs, one table per fault class, each with the issue's
reproducer and variants. Every case runs in a forked child under 10 s and 1 GiB (tests/hostile.py) and must exit 2
with one line naming the field, no traceback, nothing written (``check_refused`` of test_hostile.py).

Classes: inline costs (7), inline model/hardware specs (8), big or deep numbers and non-regular files (9), log
lines that made the regexes backtrack (10), work bounds inside the size caps (11), inconsistent or empty
combinations (14), late checks (15). Items 12 and 13 are not refusals: tests/test_native.py and
test_seed_is_recorded below; the dashboard (item 4) is tests/test_dash_serve.py and tests/test_browser.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_hostile import (
    BENCH,
    CASES,
    CSV_HEADER,
    POINTS_HEADER,
    TRACES,
    Case,
    check_refused,
    dist,
    scenario,
    sim,
    sim_text,
)

from kvplan.models.arch import QWEN3_32B
from kvplan.models.costs import DecodeCost, OverheadCost, PrefillCost, TransferCost
from kvplan.models.hardware import HARDWARE_PRESETS

HUGE = "1" * 5000  # a YAML/JSON integer beyond Python's 4,300-digit int() limit
BIG = "1" + "0" * 400  # beyond the float range (a JSON integer over ~309 digits)
SMALL_CSV = TRACES / "sessions_small.csv"


def _raw(cid: str, needle: str, tail: str, **dotted: Any) -> Case:
    """``kvplan simulate`` on the base scenario (with overrides) followed by raw YAML text ``tail``."""
    return sim_text(cid, needle, scenario(**dotted) + tail)


def _costs(comp: str, **params: Any) -> dict[str, Any]:
    return {comp: params}


# --- 7: inline costs ------------------------------------------------------------------------------------------------

_NUMERIC_COST_PARAMS = [
    (comp, name) for comp, cls in (("prefill", PrefillCost), ("transfer", TransferCost), ("decode", DecodeCost),
                                   ("overhead", OverheadCost))
    for name, f in cls.model_fields.items() if "knots" not in name
]

COST_CASES: list[Case] = [
    # the reproducers
    _raw("costs fixed_s 5e-4 yaml string", "costs.prefill.fixed_s", "costs:\n  prefill:\n    fixed_s: 5e-4\n"),
    sim("costs decode per_seq_s unused in P/D", "costs.decode.per_seq_s", costs=_costs("decode", per_seq_s=0.5)),
    _raw("costs fixed_s 10**30 int", "costs.prefill.fixed_s", f"costs:\n  prefill:\n    fixed_s: {10**30}\n"),
    sim("costs per_byte_s 0 below the line rate", "costs.transfer.per_byte_s", costs=_costs("transfer", per_byte_s=0)),
    # every numeric parameter as a YAML 1.1 string and as .inf
    *[sim(f"costs {c}.{n} string", f"costs.{c}.{n}", costs=_costs(c, **{n: "1e-3"})) for c, n in _NUMERIC_COST_PARAMS],
    *[sim(f"costs {c}.{n} .inf", f"costs.{c}.{n}", costs=_costs(c, **{n: float("inf")}))
      for c, n in _NUMERIC_COST_PARAMS],
    # unused by the resolved model (the shipped prior has knots)
    sim("costs decode.fixed_s unused with knots", "costs.decode.fixed_s", costs=_costs("decode", fixed_s=0.01)),
    sim("costs prefill.weight_read_s unused with knots", "costs.prefill.weight_read_s",
        costs=_costs("prefill", weight_read_s=0.01)),
    sim("costs prefill.per_token_s unused below the last knot", "costs.prefill.per_token_s",
        costs=_costs("prefill", per_token_s=1e-4)),
    sim("costs decode per_seq_s unused at max_num_seqs 128", "costs.decode.per_seq_s",
        deployment__max_num_seqs=128, costs=_costs("decode", per_seq_s=0.5)),
    sim("costs decode.per_context_token_s unused with context knots", "costs.decode.per_context_token_s",
        costs=_costs("decode", per_context_token_s=1e-8)),
    # physical bounds
    sim("costs attention_s 1e-15", "costs.prefill.attention_s", costs=_costs("prefill", attention_s=1e-15)),
    sim("costs per_token_s 1e-12 past the knots", "costs.prefill.per_token_s", deployment__max_num_batched_tokens=65536,
        costs=_costs("prefill", per_token_s=1e-12)),
    sim("costs per_context_token_s 0", "costs.decode.per_context_token_s",
        costs=_costs("decode", per_context_token_s=0)),
    sim("costs decode knots too fast", "costs.decode.batch_knots_s",
        costs=_costs("decode", batch_knots=[1, 64], batch_knots_s=[1e-9, 1e-9])),
    sim("costs per_byte_s 1e-15", "costs.transfer.per_byte_s", costs=_costs("transfer", per_byte_s=1e-15)),
    # knots
    sim("costs knots length mismatch", "costs.decode", costs=_costs("decode", batch_knots=[1, 64], batch_knots_s=[0.01])),
    sim("costs context knots length mismatch", "costs.decode", costs=_costs("decode", context_knots_s=[1e-8])),
    sim("costs context knots too fast", "costs.decode.context_knots_s",
        costs=_costs("decode", batch_knots=[1, 64], batch_knots_s=[0.01, 0.02], context_knots_s=[1e-8, 1e-12])),
    sim("costs knots decreasing", "costs.prefill",
        costs=_costs("prefill", linear_knots_tokens=[64, 32], linear_knots_s=[0.02, 0.01])),
    sim("costs knots 300 long", "costs.decode.batch_knots",
        costs=_costs("decode", batch_knots=list(range(1, 301)), batch_knots_s=[0.01] * 300)),
    sim("costs knots with a string", "costs.decode.batch_knots_s",
        costs=_costs("decode", batch_knots=[1, 64], batch_knots_s=[0.01, "0.02"])),
    sim("costs knots .nan", "costs.decode.batch_knots_s",
        costs=_costs("decode", batch_knots=[1, 64], batch_knots_s=[0.01, float("nan")])),
    sim("costs list for a scalar", "costs.decode.fixed_s", costs=_costs("decode", fixed_s=[1, 2])),
    sim("costs bool", "costs.prefill.overhead_s", costs=_costs("prefill", overhead_s=True)),
    sim("costs negative", "costs.transfer.fixed_s", costs=_costs("transfer", fixed_s=-1.0)),
    sim("costs unknown component", "costs.gpu", costs={"gpu": {"fixed_s": 1.0}}),
    _raw("costs huge yaml int", "YAML integer", f"costs:\n  decode:\n    overhead_s: {HUGE}\n"),
]

# --- 8: inline model and hardware specs -----------------------------------------------------------------------------

_MODEL = QWEN3_32B.model_dump()
_HW = HARDWARE_PRESETS["p5en"].model_dump()


def _model(cid: str, needle: str, **fields: Any) -> Case:
    return sim(cid, needle, model={**_MODEL, **fields})


def _hw(cid: str, needle: str, gpu: dict[str, Any] | None = None, link: dict[str, Any] | None = None,
        **fields: Any) -> Case:
    spec = {**_HW, **fields, "gpu": {**_HW["gpu"], **(gpu or {})}, "link": {**_HW["link"], **(link or {})}}
    return sim(cid, needle, hardware=spec)


SPEC_CASES: list[Case] = [
    _model("model attention_flops_per_pair .inf", "model.attention_flops_per_pair",
           attention_flops_per_pair=float("inf")),
    _model("model attention_flops_per_pair .nan", "model.attention_flops_per_pair",
           attention_flops_per_pair=float("nan")),
    _model("model attention_flops_per_pair string", "model.attention_flops_per_pair", attention_flops_per_pair="5e5"),
    _model("model attention_flops_per_pair 1e30", "model.attention_flops_per_pair", attention_flops_per_pair=1e30),
    _model("model params_total .inf", "model.params_total", params_total=float("inf")),
    _model("model params_active .nan", "model.params_active", params_active=float("nan")),
    _model("model weight_bytes_total string", "model.weight_bytes_total", weight_bytes_total="65e9"),
    _model("model num_layers 10**30", "model.num_layers", num_layers=10**30),
    _model("model hidden_size true", "model.hidden_size", hidden_size=True),
    _model("model num_kv_heads .inf", "model.num_kv_heads", num_kv_heads=float("inf")),
    _model("model max_model_len string", "model.max_model_len", max_model_len="40960"),
    _model("model params_total -1", "model.params_total", params_total=-1.0),
    _model("model unknown field", "model.flops", flops=1),
    _hw("hardware hbm_bytes .inf", "hardware.gpu.hbm_bytes", gpu={"hbm_bytes": float("inf")}),
    _hw("hardware hbm_bytes .nan", "hardware.gpu.hbm_bytes", gpu={"hbm_bytes": float("nan")}),
    _hw("hardware hbm_bytes string", "hardware.gpu.hbm_bytes", gpu={"hbm_bytes": "141e9"}),
    _hw("hardware hbm_bytes 1e30", "hardware.gpu.hbm_bytes", gpu={"hbm_bytes": 1e30}),
    _hw("hardware hbm bandwidth .inf", "hardware.gpu.hbm_bandwidth_bytes_per_s",
        gpu={"hbm_bandwidth_bytes_per_s": float("inf")}),
    _hw("hardware bf16 flops .inf", "hardware.gpu.bf16_dense_flops", gpu={"bf16_dense_flops": float("inf")}),
    _hw("hardware fp8 flops .nan", "hardware.gpu.fp8_dense_flops", gpu={"fp8_dense_flops": float("nan")}),
    _hw("hardware nvlink .inf", "hardware.gpu.nvlink_bytes_per_s", gpu={"nvlink_bytes_per_s": float("inf")}),
    _hw("hardware link bandwidth .inf", "hardware.link.bandwidth_bytes_per_s_per_rank",
        link={"bandwidth_bytes_per_s_per_rank": float("inf")}),
    _hw("hardware link bandwidth 0", "hardware.link.bandwidth_bytes_per_s_per_rank",
        link={"bandwidth_bytes_per_s_per_rank": 0}),
    _hw("hardware gpus_per_node 10**30", "hardware.gpus_per_node", gpus_per_node=10**30),
    _hw("hardware usd_per_hour .nan", "hardware.usd_per_hour", usd_per_hour=float("nan")),
    _hw("hardware activation reserve .inf", "hardware.activation_reserve_bytes_per_gpu",
        activation_reserve_bytes_per_gpu=float("inf")),
    _hw("hardware host_kv_gib string", "hardware.host_kv_gib", host_kv_gib="1024"),
    _hw("hardware nic_gbps true", "hardware.nic_gbps", nic_gbps=True),
]

# --- 9: big or deep numbers, over-long CSV fields, files that are not regular ------------------------------------


def _deep_json(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


def _mooncake(**over: Any) -> str:
    rec = {"timestamp": 0, "input_length": 1500, "output_length": 10, "hash_ids": [1, 2, 3]}
    text = json.dumps({**rec, **{k: "@" + k for k in over}})
    for k, v in over.items():
        text = text.replace(f'"@{k}"', v)
    return text + "\n"


def _fifo(name: str) -> Callable[[Path], str]:
    def make(d: Path) -> str:
        os.mkfifo(d / name)
        return "x\n"

    return make


def _calibrate(files: dict[str, Any], flag: str, name: str, needle: str, cid: str) -> Case:
    return Case(cid, ["calibrate", flag, f"{{d}}/{name}", "--model", "qwen3-32b", "--hardware", "p5en", "--out",
                      "{d}/p.json"], needle, files)


def _derive(cid: str, needle: str, config: str) -> Case:
    return Case(cid, ["profile", "derive", "--model", "qwen3-32b", "--gpu", "h200", "--tp", "8", "--model-config",
                      "{d}/m", "--out", "{d}/p.json"], needle, {"m/config.json": config})


def _config(**over: Any) -> str:
    base = {"architectures": ["Qwen3ForCausalLM"], "num_hidden_layers": 64, "hidden_size": 5120,
            "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 25600,
            "vocab_size": 151936, "max_position_embeddings": 40960}
    text = json.dumps({**base, **{k: "@" + k for k in over}})
    for k, v in over.items():
        text = text.replace(f'"@{k}"', v)
    return text


def _profile_text(mutate: Callable[[str], str]) -> Callable[[Path], str]:
    def make(_d: Path) -> str:
        from kvplan.models.profile import load_profile

        return mutate(load_profile("p5en-qwen3-32b").model_dump_json())

    return make


NUMBER_CASES: list[Case] = [
    # YAML integers beyond int() (4,300 digits) and beyond any field
    _raw("yaml seed 5000 digits", "YAML integer", f"seed: {HUGE}\n", seed=None),
    _raw("yaml conversations 5000 digits", "YAML integer", f"extra: {HUGE}\n"),
    _raw("yaml ttl 41 digits", "YAML integer", "costs:\n  prefill:\n    overhead_s: " + "9" * 41 + "\n"),
    sim("yaml seed 2**64", "seed", seed=2**64),
    sim("yaml max_num_seqs 2**80", "max_num_seqs", deployment__max_num_seqs=2**80),
    # JSON integers over ~309 digits and 100,000-deep JSON
    Case("trace mooncake 400-digit timestamp", ["simulate", "--trace", "{d}/t.jsonl", "--out", "{d}/o"], "timestamp",
         {"t.jsonl": _mooncake(timestamp=BIG)}),
    Case("trace mooncake 400-digit input", ["simulate", "--trace", "{d}/t.jsonl", "--out", "{d}/o"], "input_length",
         {"t.jsonl": _mooncake(input_length=BIG)}),
    Case("trace mooncake 5000-digit output", ["simulate", "--trace", "{d}/t.jsonl", "--out", "{d}/o"], "output_length",
         {"t.jsonl": _mooncake(output_length=HUGE)}),
    Case("trace mooncake 1e999", ["simulate", "--trace", "{d}/t.jsonl", "--out", "{d}/o"], "input_length",
         {"t.jsonl": _mooncake(input_length="1e999")}),
    Case("trace mooncake hash id 400 digits", ["simulate", "--trace", "{d}/t.jsonl", "--out", "{d}/o"], "hash_ids",
         {"t.jsonl": _mooncake(hash_ids=f"[{BIG}]")}),
    Case("trace mooncake deep line", ["simulate", "--trace", "{d}/t.jsonl", "--out", "{d}/o"], "t.jsonl",
         {"t.jsonl": '{"timestamp": 0, "x": ' + _deep_json() + "}\n"}),
    Case("trace multiturn deep", ["simulate", "--trace", "{d}/t.json", "--out", "{d}/o"], "t.json",
         {"t.json": "[" + _deep_json() + "]"}),
    Case("trace csv 400-digit timestamp", ["simulate", "--trace", "{d}/t.csv", "--out", "{d}/o"], "timestamp_s",
         {"t.csv": CSV_HEADER + f"a,{BIG},100,10\n"}),
    Case("trace csv 5000-digit tokens", ["simulate", "--trace", "{d}/t.csv", "--out", "{d}/o"], "input_tokens",
         {"t.csv": CSV_HEADER + f"a,0,{HUGE},10\n"}),
    Case("trace csv field over 131072 chars", ["simulate", "--trace", "{d}/t.csv", "--out", "{d}/o"], "t.csv",
         {"t.csv": CSV_HEADER + '"' + "s" * 200_000 + '",0,100,10\n'}),
    Case("workload show csv field over limit", ["workload", "show", "{d}/t.csv"], "t.csv",
         {"t.csv": CSV_HEADER + '"' + "s" * 200_000 + '",0,100,10\n'}),
    _calibrate({"b.json": _deep_json()}, "--bench", "b.json", "b.json", "calibrate bench 100000 deep"),
    _calibrate({"b.json": lambda _d: json.dumps({**json.loads(BENCH.read_text()), "model_id": "Qwen/Qwen3-32B"})
                .replace('"mean_ttft_ms": ', f'"mean_ttft_ms": {BIG}, "x": ')}, "--bench", "b.json", "b.json",
               "calibrate bench 400-digit number"),
    _calibrate({"b.json": '{"a": ' + HUGE + "}"}, "--bench", "b.json", "b.json", "calibrate bench 5000-digit int"),
    _calibrate({"m.json": _deep_json()}, "--multiturn", "m.json", "m.json", "calibrate multiturn 100000 deep"),
    _calibrate({"p.csv": POINTS_HEADER + "prefill," + "1" * 200_000 + ",0,5\n"}, "--points", "p.csv", "p.csv",
               "calibrate points field over 131072 chars"),
    _calibrate({"p.csv": POINTS_HEADER + f"prefill,{BIG},0,5\n"}, "--points", "p.csv", "tokens",
               "calibrate points 400-digit tokens"),
    _calibrate({"p.csv": POINTS_HEADER + f"prefill,1000,0,{HUGE}\n"}, "--points", "p.csv", "value_ms",
               "calibrate points 5000-digit value"),
    Case("profile 100000 deep", ["simulate", "{d}/s.yaml", "--out", "{d}/o"], "p.json",
         {"p.json": _deep_json(), "s.yaml": lambda d: scenario(profile=str(d / "p.json"))}),
    Case("profile 400-digit number", ["simulate", "{d}/s.yaml", "--out", "{d}/o"], "p.json",
         {"p.json": _profile_text(lambda t: t.replace('"overhead_s":', f'"overhead_s":{BIG},"x":', 1)),
          "s.yaml": lambda d: scenario(profile=str(d / "p.json"))}),
    Case("profile 1e999", ["simulate", "{d}/s.yaml", "--out", "{d}/o"], "p.json",
         {"p.json": _profile_text(lambda t: t.replace('"overhead_s":', '"overhead_s":1e999,"x":', 1)),
          "s.yaml": lambda d: scenario(profile=str(d / "p.json"))}),
    Case("cost profile 100000 deep", ["cost", "--profile", "{d}/p.json", "--tokens", "100"], "p.json",
         {"p.json": _deep_json()}),
    Case("compare recommendation 100000 deep", ["compare", "--workload", "chat", "--recommendation", "{d}/r.json"],
         "--recommendation", {"r.json": _deep_json()}),
    Case("compare recommendation 400-digit ttl", ["compare", "--workload", "chat", "--recommendation", "{d}/r.json"],
         "--recommendation", {"r.json": '{"ttl_s": ' + BIG + "}"}),
    Case("compare recommendation 5000-digit", ["compare", "--workload", "chat", "--recommendation", "{d}/r.json"],
         "--recommendation", {"r.json": '{"ttl_s": ' + HUGE + "}"}),
    # config.json of profile derive
    _derive("config.json 100000 deep", "config.json", _deep_json()),
    _derive("config.json 400-digit layers", "num_hidden_layers", _config(num_hidden_layers=BIG)),
    _derive("config.json 5000-digit hidden", "config.json", _config(hidden_size=HUGE)),
    _derive("config.json string heads", "num_attention_heads", _config(num_attention_heads='"64"')),
    _derive("config.json nan vocab", "vocab_size", _config(vocab_size="NaN")),
    _derive("config.json negative kv heads", "num_key_value_heads", _config(num_key_value_heads="-8")),
    _derive("config.json bool layers", "num_hidden_layers", _config(num_hidden_layers="true")),
    _derive("config.json huge context", "max_position_embeddings", _config(max_position_embeddings="1e300")),
    # only regular files are read
    sim("empirical /proc/self/pagemap", "/proc/self/pagemap",
        workload__user_tokens=dist("empirical", path="/proc/self/pagemap")),
    sim("empirical /proc/self/environ", "/proc/self/environ",
        workload__user_tokens=dist("empirical", path="/proc/self/environ")),
    sim("empirical /dev/zero", "/dev/zero", workload__user_tokens=dist("empirical", path="/dev/zero")),
    sim("empirical a directory", "empirical path", workload__user_tokens=dist("empirical", path="/tmp")),
    Case("empirical a FIFO", ["simulate", "{d}/s.yaml", "--out", "{d}/o"], "p.fifo",
         {"x.txt": _fifo("p.fifo"), "s.yaml": lambda d: scenario(workload__user_tokens=dist("empirical",
                                                                                        path=str(d / "p.fifo")))}),
    Case("empirical field over 131072 chars", ["simulate", "{d}/s.yaml", "--out", "{d}/o"], "v.csv",
         {"v.csv": "tokens\n" + '"' + "1" * 200_000 + '"\n',
          "s.yaml": lambda d: scenario(workload__user_tokens=dist("empirical", path=str(d / "v.csv")))}),
    Case("empirical 5000-digit value", ["simulate", "{d}/s.yaml", "--out", "{d}/o"], "v.csv",
         {"v.csv": "100\n" + HUGE + "\n",
          "s.yaml": lambda d: scenario(workload__user_tokens=dist("empirical", path=str(d / "v.csv")))}),
    Case("trace /dev/zero", ["simulate", "--trace", "/dev/zero", "--out", "{d}/o"], "/dev/zero"),
    Case("trace /proc/self/pagemap", ["simulate", "--trace", "/proc/self/pagemap", "--out", "{d}/o"],
         "/proc/self/pagemap"),
    Case("trace a FIFO", ["simulate", "--trace", "{d}/t.fifo", "--out", "{d}/o"], "t.fifo", {"x.txt": _fifo("t.fifo")}),
    Case("profile /dev/zero", ["cost", "--profile", "/dev/zero", "--tokens", "100"], "profile"),
    Case("calibrate bench /proc/self/pagemap", ["calibrate", "--bench", "/proc/self/pagemap", "--model", "qwen3-32b",
                                                "--hardware", "p5en", "--out", "{d}/p.json"], "/proc/self/pagemap"),
]

# --- 10: log lines that made the regexes backtrack (calibrate --log) -----------------------------------------------

_V = "INFO 05-11 23:40:01.123 [pull_scheduler.py:455] "
_P = "2025-05-11 23:40:01,123 [INFO] proxy: "
_K = 200 * 1024


def _log(line: str) -> dict[str, Any]:
    return {"v.log": _V + "Starting vLLM\n" + line + "\n"}


LOG_CASES: list[Case] = [
    _calibrate(_log(_V + "Declining expired remote read for r1 from engine a" + " " * _K + "x"), "--log", "v.log",
               "no observation", "log 200 KB decline line (the issue's 55 s)"),
    _calibrate(_log(_V + "Declining expired remote read for r1 from engine " + " " * _K + "x"), "--log", "v.log",
               "v.log", "log decline engine of spaces"),
    _calibrate(_log(_V + "Declining expired remote read for " + "x" * _K), "--log", "v.log", "v.log",
               "log decline without an engine"),
    _calibrate(_log(_P + "conv=" * (_K // 5) + " cache HIT"), "--log", "v.log", "v.log",
               "log 40000 conv= runs (the issue's 60 s)"),
    _calibrate(_log(_P + "conv=" + "a:" * (_K // 2) + " cache MISS"), "--log", "v.log", "v.log", "log conv= colons"),
    _calibrate(_log(_P + "[" * _K + " Prefill done in 5 ms"), "--log", "v.log", "v.log", "log 200 KB of ["),
    _calibrate(_log(_V + "KV Transfer metrics: a" + " " * _K + ", b=1"), "--log", "v.log", "v.log",
               "log KV pair of spaces"),
    _calibrate(_log(_V + "Releasing expired KV blocks for request " + "x" * _K), "--log", "v.log", "v.log",
               "log release long id"),
    _calibrate(_log(_V + "Engine 0: " * (_K // 10) + "Avg prompt throughput: 1 tokens/s"), "--log", "v.log", "v.log",
               "log stats engine runs"),
    _calibrate(_log("(" * _K + "INFO 05-11 23:40:01 [a.py:1] x"), "--log", "v.log", "v.log", "log prefix parens"),
]

# --- 11: work bounds inside the size caps ----------------------------------------------------------------------------

WORK_CASES: list[Case] = [
    Case("trace csv 12M one-token requests (the issue's 100 MB)", ["simulate", "--trace", "{d}/t.csv", "--out", "{d}/o"],
         "t.csv",
         {"t.csv": lambda _d: CSV_HEADER + "a,0,1,1\n" * 12_000_000}),
    Case("trace multiturn 10M objects", ["simulate", "--trace", "{d}/t.json", "--out", "{d}/o"], "t.json",
         {"t.json": lambda _d: "[" + "{}," * 10_000_002 + "{}]"}),
    Case("trace mooncake 10M lines", ["simulate", "--trace", "{d}/t.jsonl", "--out", "{d}/o"], "t.jsonl",
         {"t.jsonl": lambda _d: "{}\n" * 10_000_002}),
    Case("empirical over 1M values", ["simulate", "{d}/s.yaml", "--out", "{d}/o"], "values",
         {"v.txt": "5\n" * 1_000_001,
          "s.yaml": lambda d: scenario(workload__user_tokens=dist("empirical", path=str(d / "v.txt")))}),
    Case("empirical turns file over the turn bound", ["simulate", "{d}/s.yaml", "--out", "{d}/o"], "workload.turns",
         {"v.txt": "90000\n",
          "s.yaml": lambda d: scenario(workload__conversations=200,
                                       workload__turns=dist("empirical", path=str(d / "v.txt")))}),
]

# --- 14: inconsistent combinations, empty results, bools as numbers -----------------------------------------------


def _file_dist(name: str, values: str, field: str) -> Case:
    return Case(name, ["simulate", "{d}/s.yaml", "--out", "{d}/o"], f"workload.{field}",
                {"v.txt": values, "s.yaml": lambda d: scenario(**{f"workload__{field}": dist("empirical",
                                                                                          path=str(d / "v.txt"))})})


COMBO_CASES: list[Case] = [
    sim("aggregated with retention lease", "policy.retention", deployment__mode="aggregated",
        policy__retention={"kind": "lease"}),
    sim("aggregated with ttl_evictable", "policy.retention", deployment__mode="aggregated",
        policy__retention={"kind": "ttl_evictable"}),
    sim("aggregated with offload", "policy.offload", deployment__mode="aggregated", policy__offload={}),
    sim("aggregated with lease, no end", "policy.retention", deployment__mode="aggregated",
        policy__retention={"kind": "lease", "client_knows_end": False}),
    sim("every request over the context", "context", workload__prefix_tokens=dist("constant", value=50000)),
    sim("prefix + user over the context", "context", workload__prefix_tokens=dist("constant", value=40900),
        workload__user_tokens=dist("constant", value=100)),
    sim("llama 8b over its context", "context", model="llama-3.1-8b",
        workload__prefix_tokens=dist("constant", value=140000)),
    Case("trace every request over the context", ["simulate", "--trace", "{d}/t.csv", "--out", "{d}/o"], "context",
         {"t.csv": CSV_HEADER + "a,0,50000,10\na,5,51000,10\nb,6,60000,5\n"}),
    sim("output_tokens 0", "output_tokens", workload__output_tokens=dist("constant", value=0)),
    sim("output_tokens uniform below 0.5", "output_tokens", workload__output_tokens=dist("uniform", low=0, high=0.4)),
    sim("output_tokens empirical with 0", "output_tokens", workload__output_tokens=dist("empirical", values=[0, 5])),
    sim("turns constant 0", "turns", workload__turns=dist("constant", value=0)),
    sim("turns empirical 0", "turns", workload__turns=dist("empirical", values=[0])),
    sim("conversations true", "workload.conversations", workload__conversations=True),
    sim("conversations false", "workload.conversations", workload__conversations=False),
    sim("seed true", "seed", seed=True),
    sim("max_num_seqs true", "deployment.max_num_seqs", deployment__max_num_seqs=True),
    sim("rate_per_s yaml string", "workload.arrival.rate_per_s",
        workload__arrival={"kind": "poisson", "rate_per_s": "5e-4"}),
    sim("ttl as a string", "policy.decoder_kv_blocks_ttl_s", policy__decoder_kv_blocks_ttl_s="480"),
    sim("tp as a string", "deployment.tensor_parallel_size", deployment__tensor_parallel_size="8"),
    sim("constant value true", "value", workload__user_tokens=dist("constant", value=True)),
    _file_dist("empirical user file 1e12 tokens", "100\n1000000000000\n", "user_tokens"),
    _file_dist("empirical turns file 1e9", "3\n1000000000\n", "turns"),
    _file_dist("empirical gap file 1e12 s", "5\n1000000000000\n", "turn_gap_s"),
    _file_dist("empirical output file 0", "0\n10\n", "output_tokens"),
    _file_dist("empirical turns file 0", "0\n", "turns"),
    _file_dist("empirical prefix file 1e12", "1000000000000\n", "prefix_tokens"),
    Case("cost --batch 2**40", ["cost", "--profile", "p5en-qwen3-32b", "--tokens", "100", "--batch", str(2**40)],
         "--batch"),
    Case("cost --batch 100000", ["cost", "--profile", "p5en-qwen3-32b", "--tokens", "100", "--batch", "100000"],
         "--batch"),
    Case("cost --context 1e12", ["cost", "--profile", "p5en-qwen3-32b", "--tokens", "100", "--context",
                                 "1000000000000"], "--context"),
    Case("compare --workers 100000", ["compare", "--workload", "chat", "--workers", "100000"], "--workers"),
    Case("compare --workers 257", ["compare", "--workload", "chat", "--workers", "257"], "--workers"),
    # each run within its own bounds, together 10^10 turns and more (hours to days): refused before the first run
    Case("recommend 1e6 conversations x 1000 replications", ["recommend", "--workload", "chat", "--conversations",
                                                              "1000000", "--replications", "1000"], "simulated turns"),
    Case("compare 1e6 conversations x 1000 replications", ["compare", "--workload", "chat", "--conversations",
                                                            "1000000", "--replications", "1000"], "simulated turns"),
    Case("capacity 1e6 conversations x 30 replications", ["capacity", "--slo-ttft-p90-ms", "500", "--conversations",
                                                           "1000000", "--replications", "30"], "simulated turns"),
]

# --- 15: checks that came after the work -------------------------------------------------------------------------

_GRID = {"g.yaml": "base:\n  model: qwen3-32b\n"}


def _ray(cid: str, address: str, needle: str = "--ray-address", backend: str = "ray") -> Case:
    return Case(cid, ["sweep", "{d}/g.yaml", "--out", "{d}/r.parquet", "--backend", backend, "--ray-address", address],
                needle, dict(_GRID))


LATE_CASES: list[Case] = [
    _ray("sweep ray address 127.0.0.1:1 (the issue's hang)", "127.0.0.1:1"),
    _ray("sweep ray address 127.0.0.1:9", "127.0.0.1:9"),
    _ray("sweep ray:// address nothing listens", "ray://127.0.0.1:1"),
    _ray("sweep ray address not host:port", "bogus"),
    _ray("sweep ray address port 0", "127.0.0.1:0"),
    _ray("sweep ray address port 70000", "127.0.0.1:70000"),
    _ray("sweep ray address without --backend ray", "127.0.0.1:1", backend="local"),
    # item 4's flag, refused before Streamlit starts
    Case("dashboard --serve-dir missing", ["dashboard", "--serve-dir", "{d}/nope", "--port", "1"], "--serve-dir"),
    Case("dashboard --serve-dir a file", ["dashboard", "--serve-dir", "{d}/f.txt", "--port", "1"], "--serve-dir",
         {"f.txt": "x\n"}),
]

ROUND3 = COST_CASES + SPEC_CASES + NUMBER_CASES + LOG_CASES + WORK_CASES + COMBO_CASES + LATE_CASES


def test_table_sizes() -> None:
    assert len(ROUND3) >= 150
    assert len(CASES) + len(ROUND3) >= 360
    assert len({c.id for c in CASES + ROUND3}) == len(CASES) + len(ROUND3)


@pytest.mark.parametrize("case", ROUND3, ids=[c.id for c in ROUND3])
def test_round3_hostile_input_is_refused(case: Case, tmp_path: Path) -> None:
    d = tmp_path / "case"
    for name in case.files:  # nested inputs (m/config.json)
        (d / name).parent.mkdir(parents=True, exist_ok=True)
    check_refused(case, d)


def test_seed_is_recorded(tmp_path: Path) -> None:
    """Item 13: ``simulate --seed 7`` writes ``seed: 7`` to DIR/scenario.yaml, and that file reproduces the run."""
    from kvplan.app.cli import main

    s = tmp_path / "s.yaml"
    s.write_text(scenario(workload__conversations=5))
    assert main(["simulate", str(s), "--out", str(tmp_path / "a"), "--seed", "7"]) == 0
    recorded = yaml.safe_load((tmp_path / "a" / "scenario.yaml").read_text())
    assert recorded["seed"] == 7
    assert main(["simulate", str(tmp_path / "a" / "scenario.yaml"), "--out", str(tmp_path / "b")]) == 0
    for name in ("summary.json", "turns.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
