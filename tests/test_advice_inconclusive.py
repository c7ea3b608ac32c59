"""recommend says INCONCLUSIVE, and how many replications would resolve it, when retention's TTFT gain is material on
average but its 95% CI still includes no gain; it no longer reports such a gain as absent."""

from __future__ import annotations

import math
from typing import Any

import pytest

from kvplan.plan.advice_rules import (
    Evidence,
    choose_ttl,
    material_unresolved,
    replications_to_resolve,
    significant_gain,
)
from kvplan.plan.executor import t_quantile_975

REC: dict[str, Any] = {
    "model": "qwen3-32b", "hardware": "p5en",
    "deployment": {"prefill_nodes": 1, "decode_nodes": 1, "tensor_parallel_size": 8, "prefill_prefix_caching": False},
    "policy": {"bidirectional": True},
    "workload": {"conversations": 150, "arrival": {"kind": "poisson", "rate_per_s": 1.5},
                 "turns": {"dist": "constant", "value": 5},
                 "prefix_tokens": {"dist": "lognormal", "median": 4000, "sigma": 0.5},
                 "user_tokens": {"dist": "uniform", "low": 100, "high": 300},
                 "output_tokens": {"dist": "uniform", "low": 50, "high": 200},
                 "turn_gap_s": {"dist": "exponential", "mean": 20}},
    "seed": 3,
}


def test_material_but_unresolved_is_its_own_case() -> None:
    assert material_unresolved((0.25, 0.30), 0.45) and not significant_gain((0.25, 0.30), 0.45)
    assert not material_unresolved((0.25, 0.10), 0.45) and significant_gain((0.25, 0.10), 0.45)
    assert not material_unresolved((0.001, 0.30), 0.45)  # not material: no gain to resolve
    assert not material_unresolved((0.25, math.nan), 0.45)


def test_replications_to_resolve_put_the_ci_below_the_mean() -> None:
    n, mean, ci = 2, 0.25, 0.60
    m = replications_to_resolve((mean, ci), n)
    sd = ci * math.sqrt(n) / t_quantile_975(n)
    assert t_quantile_975(m) * sd / math.sqrt(m) < mean and m >= 2 * n
    if m > 2 * n:  # the smallest that resolves it
        assert t_quantile_975(m - 1) * sd / math.sqrt(m - 1) >= mean
    wide = replications_to_resolve((0.05, 0.60), 2)  # a small gain in a wide spread needs many more
    assert wide > 2 * 2 and t_quantile_975(wide - 1) * sd / math.sqrt(wide - 1) >= 0.05
    assert replications_to_resolve((0.25, 0.30), 3) >= 6  # at least twice


def test_choose_ttl_says_inconclusive() -> None:
    ev = Evidence([], 0.4577, (0.2563, 0.607), 1.0, None, "turn gaps", 0, replications=2)
    choice = choose_ttl(ev)
    assert choice.retention_off and choice.chosen is None
    assert choice.inconclusive.startswith("retention's TTFT gain is not resolved by 2 replications")
    assert choice.rationale[0].startswith("INCONCLUSIVE:") and "--replications" in choice.rationale[0]
    absent = choose_ttl(Evidence([], 0.4577, (0.001, 0.002), 1.0, None, "turn gaps", 0, replications=2))
    assert absent.inconclusive == "" and "does not lower mean TTFT materially" in absent.rationale[0]


def test_recommend_headline_matches_the_reason(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from kvplan.app.cli import main

    path = tmp_path / "rec.yaml"
    path.write_text(yaml.safe_dump(REC))
    assert main(["recommend", str(path), "--replications", "2", "--ttl-grid", "15,30,60,120", "--no-policies"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("bidirectional_kv_xfer = false: INCONCLUSIVE: retention's TTFT gain is not resolved")
    assert "does not lower TTFT" not in out[0]
    row = next(line for line in out if line.startswith("TTFT p99"))
    assert "s ±" in row and all(len(cell) > 0 for cell in row[24:].split("  ") if cell)
    assert " s6" not in row and " s1" not in row  # no two cells run together


def test_the_deployable_config_names_the_deployments_nixl_backend() -> None:
    from kvplan.models.hardware import get_hardware, nixl_backend
    from kvplan.plan.advice import kv_transfer_config

    assert nixl_backend(get_hardware("p5en").link) == "LIBFABRIC"
    assert nixl_backend(get_hardware("p5en").link, "tcp") == "UCX"  # kv_transport: tcp
    assert nixl_backend(get_hardware("p5en-tcp").link) == "UCX"
    assert nixl_backend(get_hardware("h800").link) == "UCX"  # RoCE
    cfg = kv_transfer_config(True, 60, 64, "recompute", backend="UCX")
    assert cfg["kv_connector_extra_config"]["backends"] == ["UCX"]


def test_recommend_refuses_an_aggregated_scenario(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import yaml

    from kvplan.app.cli import main

    path = tmp_path / "agg.yaml"
    path.write_text(yaml.safe_dump({**REC, "deployment": {"mode": "aggregated", "replicas": 2,
                                                          "tensor_parallel_size": 8}}))
    assert main(["recommend", str(path), "--replications", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: deployment.mode: recommend tunes bidirectional")
