"""The scenario fields added with vLLM's memory accounting and the agentic workloads, as a hostile user writes
them: bad values are one-line errors naming the field; combinations that make no sense are refused (or noted);
a scenario that does not use the new fields keeps the fingerprint it had before they existed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from kvplan.errors import KvplanInputError
from kvplan.sim.api import run
from kvplan.sim.scenario import scenario_from_dict, with_overrides

DATA = Path(__file__).resolve().parent / "data" / "traces"
WEKA = str(DATA / "weka_small.json")
CSV = str(DATA / "sessions_small.csv")
SMALL_WL = {"conversations": 4, "turns": {"dist": "constant", "value": 2}}


def _sc(dep: dict[str, Any] | None = None, wl: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    return {"model": "qwen3-32b", "hardware": "p5en", "deployment": dep or {}, "workload": {**SMALL_WL, **(wl or {})},
            **top}


BAD_FIELDS: list[tuple[str, dict[str, Any], str]] = [
    ("gmu negative", _sc({"gpu_memory_utilization": -0.1}), "deployment.gpu_memory_utilization"),
    ("gmu > 1", _sc({"gpu_memory_utilization": 1.5}), "deployment.gpu_memory_utilization"),
    ("gmu string", _sc({"gpu_memory_utilization": "0.5"}), "deployment.gpu_memory_utilization"),
    ("gmu bool", _sc({"gpu_memory_utilization": True}), "deployment.gpu_memory_utilization"),
    ("gmu inf", _sc({"gpu_memory_utilization": float("inf")}), "deployment.gpu_memory_utilization"),
    ("kv dtype unknown", _sc({"kv_cache_dtype": "bogus"}), "deployment.kv_cache_dtype"),
    ("kv dtype int", _sc({"kv_cache_dtype": 1}), "deployment.kv_cache_dtype"),
    ("cudagraph 'yes'", _sc({"cudagraph_memory_profiling": "yes"}), "deployment.cudagraph_memory_profiling"),
    ("cudagraph 1", _sc({"cudagraph_memory_profiling": 1}), "deployment.cudagraph_memory_profiling"),
    ("max_model_len bool", _sc({"max_model_len": True}), "deployment.max_model_len"),
    ("max_model_len string", _sc({"max_model_len": "3000"}), "deployment.max_model_len"),
    ("max_model_len fraction", _sc({"max_model_len": 1.5}), "deployment.max_model_len"),
    ("max_model_len negative", _sc({"max_model_len": -1}), "deployment.max_model_len"),
    ("history unknown", _sc(wl={"history": "bogus"}), "workload.history"),
    ("partial without share", _sc(wl={"history": "partial"}), "history_kept_share"),
    ("share without partial", _sc(wl={"history_kept_share": 0.5}), "history_kept_share"),
    ("share > 1", _sc(wl={"history": "partial", "history_kept_share": 1.5}), "workload.history_kept_share"),
    ("share negative", _sc(wl={"history": "partial", "history_kept_share": -0.1}), "workload.history_kept_share"),
    ("share bool", _sc(wl={"history": "partial", "history_kept_share": True}), "workload.history_kept_share"),
    ("share nan", _sc(wl={"history": "partial", "history_kept_share": float("nan")}), "workload.history_kept_share"),
    ("shared tokens negative", _sc(wl={"shared_prefix_tokens": -1}), "workload.shared_prefix_tokens"),
    ("shared tokens bool", _sc(wl={"shared_prefix_tokens": True}), "workload.shared_prefix_tokens"),
    ("shared tokens string", _sc(wl={"shared_prefix_tokens": "100"}), "workload.shared_prefix_tokens"),
    ("shared tokens > prefix", _sc(wl={"shared_prefix_tokens": 5000}), "shared_prefix_tokens (5000) exceeds"),
    ("groups 0", _sc(wl={"shared_prefix_tokens": 100, "shared_prefix_groups": 0}), "workload.shared_prefix_groups"),
    ("groups bool", _sc(wl={"shared_prefix_tokens": 100, "shared_prefix_groups": True}),
     "workload.shared_prefix_groups"),
    ("groups alone", _sc(wl={"shared_prefix_groups": 2}), "shared_prefix_groups needs"),
    ("format unknown", _sc(wl={"trace": {"path": WEKA, "format": "bogus"}}), "workload.trace.format"),
    ("timing unknown", _sc(wl={"trace": {"path": WEKA, "timing": "bogus"}}), "workload.trace.timing"),
    ("trace shared_prefix string", _sc(wl={"trace": {"path": WEKA, "shared_prefix": "maybe"}}),
     "workload.trace.shared_prefix"),
    ("both shared prefixes", _sc(wl={"trace": {"path": WEKA, "shared_prefix": True}, "shared_prefix_tokens": 500}),
     "both set the shared prefix"),
]


@pytest.mark.parametrize(("name", "sc", "needle"), BAD_FIELDS, ids=[b[0] for b in BAD_FIELDS])
def test_bad_value_one_line_naming_the_field(name: str, sc: dict[str, Any], needle: str) -> None:
    with pytest.raises(KvplanInputError) as exc:
        scenario_from_dict(sc)
    assert needle in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


@pytest.mark.parametrize(("sc", "needle"), [
    (_sc({"max_model_len": 100}), "no request would run"),  # every first turn beyond the limit: no empty result
    (_sc({"max_model_len": 100000}), "max_model_len"),  # beyond the model's 40,960
    (_sc({"max_model_len": 100}, wl={"trace": {"path": WEKA}}), "no request left"),
    (_sc(wl={"trace": {"path": CSV, "shared_prefix": True}}), "weka only"),
    (_sc(wl={"trace": {"path": CSV, "timing": "think"}}), "weka only"),
    (_sc(wl={"trace": {"path": CSV, "format": "weka"}}), "not valid JSON"),
    (_sc({"kv_cache_dtype": "fp8_ds_mla"}), "only for MLA"),
    (_sc({"gpu_memory_utilization": 0.01}), "weights do not fit"),
])
def test_combinations_that_make_no_sense_are_refused(sc: dict[str, Any], needle: str) -> None:
    with pytest.raises(KvplanInputError) as exc:
        run(sc)
    assert needle in str(exc.value) and "\n" not in str(exc.value), str(exc.value)


def test_aggregated_mode_notes_that_shared_prefixes_are_ignored() -> None:
    res = run(_sc({"mode": "aggregated"}, wl={"shared_prefix_tokens": 100}))
    assert any("aggregated mode does not share prefixes" in n for n in res.notes)
    res = run(_sc({"mode": "aggregated"}))
    assert not any("share prefixes" in n for n in res.notes)


def test_history_on_a_trace_is_noted() -> None:
    res = run(_sc(wl={"trace": {"path": CSV}, "history": "prompt_only"}))
    assert any("records sizes, not tokens" in n for n in res.notes)
    res = run(_sc(wl={"trace": {"path": WEKA}, "history": "prompt_only"}))
    assert any("hash prefixes decide" in n and "caps it further" in n for n in res.notes)
    assert not any("workload.history" in n for n in run(_sc(wl={"trace": {"path": CSV}})).notes)


# sha256 of model_dump_json() of these scenarios on main before the memory and agentic merges (93455bd^1)
PRE_MERGE_SHA256 = {
    "default": ({}, "51e6ef4ea26ae646850ef0778e917de37e6ab9cd1c23e38f72409732ec6d334c"),
    "trace": ({"workload": {"trace": {"path": "x.jsonl"}}},
              "cb6abc5c4614b013a8133667cd784943dce23b0f524a649076d7bc567d396d84"),
    "aggregated": ({"deployment": {"mode": "aggregated", "replicas": 2, "max_num_seqs": 64},
                    "policy": {"decoder_kv_blocks_ttl_s": 100}},
                   "617dd8f15462a111d7e9c8d8ba1d74deb6c2e0cbc40a3e00e6b7c7199450f0b7"),
}


@pytest.mark.parametrize("name", list(PRE_MERGE_SHA256))
def test_fingerprint_of_an_existing_scenario_is_unchanged(name: str) -> None:
    data, sha = PRE_MERGE_SHA256[name]
    sc = scenario_from_dict(data)
    assert hashlib.sha256(sc.model_dump_json().encode()).hexdigest() == sha  # recommend's scenario_sha256
    dumped = json.dumps(sc.model_dump(mode="json"))  # the sweep grid's base
    for new in ("kv_cache_dtype", "cudagraph_memory_profiling", "max_model_len", "history", "shared_prefix_tokens",
                "async_scheduling", "allow_unreliable_profile"):
        assert f'"{new}"' not in dumped


def test_a_set_new_field_is_dumped_and_round_trips() -> None:
    sc = scenario_from_dict(_sc({"max_model_len": 3000, "kv_cache_dtype": "fp8"},
                                wl={"history": "partial", "history_kept_share": 0.5, "shared_prefix_tokens": 100}))
    d = sc.model_dump(mode="json")
    assert d["deployment"]["max_model_len"] == 3000 and d["deployment"]["kv_cache_dtype"] == "fp8"
    assert d["workload"]["history_kept_share"] == 0.5 and d["workload"]["shared_prefix_tokens"] == 100
    assert scenario_from_dict(d) == sc
    assert with_overrides(scenario_from_dict({}), {"deployment.max_model_len": 4096}).deployment.max_model_len == 4096
    base = scenario_from_dict({})
    assert hashlib.sha256(base.model_dump_json().encode()).hexdigest() != hashlib.sha256(
        with_overrides(base, {"workload.history": "prompt_only"}).model_dump_json().encode()).hexdigest()
