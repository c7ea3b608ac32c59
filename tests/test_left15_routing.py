"""Round-robin D routing loses a follow-up's KV on D: the health section, recommend and compare say so and name the
setting that fixes it (``deployment.routing: session_affinity``).

The published benchmark (closed loop, 2 clients, 10 conversations of 5 turns, 24k prefix) on 1P8D: the reference
proxy's round-robin D iterator sends each follow-up's decode leg to another D than the one that served its
conversation, so that D reads the whole prompt from P (``disagg_proxy_multiturn.py``, VLLM_BEHAVIOUR.md 1.2 and 1.7).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from kvplan.sim.api import run
from kvplan.sim.defaults import published_benchmark
from kvplan.sim.health import ROUTING_FIX, compute_health, health_lines
from kvplan.sim.scenario import Scenario, with_overrides


def _bench(decode_nodes: int, routing: str) -> Scenario:
    return with_overrides(published_benchmark(), {"deployment.decode_nodes": decode_nodes,
                                                  "deployment.routing": routing})


def _routing_warnings(summary: dict[str, Any]) -> list[str]:
    return [w for w in summary["health"]["warnings"] if w.startswith("routing ")]


def test_round_robin_over_8_d_is_warned_with_its_fix() -> None:
    rr = run(_bench(8, "round_robin"))
    sticky = run(_bench(8, "session_affinity"))
    # the cost the warning is about: measured on the same workload and seed
    assert sticky.summary["ttft_p50_s"] < 0.7 * rr.summary["ttft_p50_s"]
    (w,) = _routing_warnings(rr.summary)
    assert w.startswith("routing round_robin over 8 D: 75% of follow-up turns (30 of 40) found less than half")
    assert ROUTING_FIX in w and "disagg_proxy_multiturn.py" in w
    assert rr.summary["health"]["status"] == "warning"
    assert any(line == f"warning: {w}" for line in health_lines(rr.summary["health"]))
    assert _routing_warnings(sticky.summary) == []  # the fix removes it
    # the turns frame gives the same finding as the streamed aggregates the run used
    again = compute_health(rr.summary, rr.turns, rr.scenario, 1e-9)
    assert [x for x in again["warnings"] if x.startswith("routing ")] == [w]


def test_no_warning_where_routing_keeps_the_conversation_on_its_d() -> None:
    # 1P2D round-robin with 2 clients lands every follow-up on its own D: nothing to say; one D: nothing to route
    assert _routing_warnings(run(_bench(2, "round_robin")).summary) == []
    assert _routing_warnings(run(_bench(1, "round_robin")).summary) == []
    assert _routing_warnings(run(_bench(8, "prefix_aware")).summary) == []
    # random draws over 8 D miss too
    (w,) = _routing_warnings(run(_bench(8, "random")).summary)
    assert "a D drawn at random" in w and ROUTING_FIX in w


def test_no_warning_without_decode_prefix_caching() -> None:
    # with D's prefix caching off no D keeps a conversation's prefix: routing cannot be the cause
    sc = with_overrides(_bench(8, "round_robin"), {"deployment.decode_prefix_caching": False})
    assert _routing_warnings(run(sc).summary) == []


def test_compare_and_recommend_say_it(tmp_path: Path) -> None:
    from kvplan.plan.advice import recommend
    from kvplan.plan.compare import compare

    sc = _bench(8, "round_robin")
    rows = compare(sc, ["off", "ttl"], replications=1, workers=1)
    for r in rows:
        if r["policy"] in ("off", "ttl"):
            assert any(n.startswith("routing round_robin over 8 D: 75% of follow-up turns (one run)") and ROUTING_FIX in n
                       for n in r["notes"]), r["notes"]
    rec = recommend(sc, replications=1, workers=1)
    assert any(w.startswith("routing round_robin over 8 D") and ROUTING_FIX in w for w in rec.warnings)
    fixed = recommend(_bench(8, "session_affinity"), replications=1, workers=1)
    assert not any(w.startswith("routing ") for w in fixed.warnings)


def test_cli_compare_prints_the_hint(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from kvplan.app.cli import app

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_bench(8, "round_robin").model_dump(mode="json", exclude_none=True)))
    res = CliRunner().invoke(app, ["compare", str(path), "--policies", "off", "--replications", "1"])
    assert res.exit_code == 0, res.output
    assert "routing round_robin over 8 D" in res.output and ROUTING_FIX in res.output
