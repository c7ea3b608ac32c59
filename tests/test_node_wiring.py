"""Nodes get typed slices and talk through sim/ports.py (issue 23 items 1 and 3); the TTL expiry rule is one rule.

* no node module reads ``scenario`` or looks up a preset (their constants come from ``sim/node_config.py``);
* the node modules, the driver and the run state are in no import circle (TYPE_CHECKING imports included), and
  no node imports another node, the run state or the engine;
* lease retention reaches the router through its config (TTL off, lookups renew) and not by rewriting it;
* the expiry rule's boundaries: held strictly before the deadline, a read declined at exactly the margin.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest
from conftest import small

from kvplan.sim.api import run
from kvplan.sim.engine import simulate
from kvplan.sim.node_setup import router_config
from kvplan.sim.retention import is_due, is_held, pin_deadline_s, read_declined, read_margin_s
from kvplan.sim.scenario import scenario_from_dict

SIM = Path(__file__).resolve().parent.parent / "sim"
NODES = ("prefill", "decode", "aggregated", "driver", "retention_policy", "batch", "xfer", "router", "retention")
PRESET_LOOKUPS = {"get_hardware", "get_model", "HARDWARE_PRESETS", "LINK_PRESETS", "MODEL_PRESETS"}


def _reads(module: str) -> set[str]:
    tree = ast.parse((SIM / f"{module}.py").read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "scenario":
            out.add(f"{module}: .scenario at line {node.lineno}")
        if isinstance(node, ast.Name) and node.id in PRESET_LOOKUPS:
            out.add(f"{module}: {node.id} at line {node.lineno}")
        if isinstance(node, ast.ImportFrom) and any(a.name in PRESET_LOOKUPS for a in node.names):
            out.add(f"{module}: imports a preset lookup at line {node.lineno}")
    return out


def test_no_node_reads_the_scenario_or_a_preset() -> None:
    found = set().union(*(_reads(m) for m in NODES))
    assert not found, sorted(found)


def _strong_components(graph: grimp.ImportGraph) -> list[set[str]]:
    """Tarjan's strongly connected components of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.find_modules_directly_imported_by(v):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(comp)

    for m in sorted(graph.modules):
        if m not in index:
            visit(m)
    return out


def test_nodes_context_and_engine_are_in_no_import_circle() -> None:
    graph = grimp.build_graph("kvplan", exclude_type_checking_imports=False)
    wired = {f"kvplan.sim.{m}" for m in (*NODES, "context", "engine", "ports", "node_config", "node_setup")}
    circles = [sorted(c) for c in _strong_components(graph) if c & wired]
    assert not circles, circles
    banned = {"kvplan.sim.context", "kvplan.sim.engine", "kvplan.sim.node_setup"}
    node_modules = {f"kvplan.sim.{m}" for m in ("prefill", "decode", "aggregated")}
    for m in sorted(node_modules | {"kvplan.sim.driver", "kvplan.sim.retention_policy"}):
        imported = graph.find_modules_directly_imported_by(m)
        assert not imported & banned, (m, sorted(imported & banned))
        assert not imported & (node_modules - {m}), (m, sorted(imported & node_modules))


def test_lease_retention_configures_the_router_instead_of_rewriting_it() -> None:
    lease = scenario_from_dict(small(policy={"bidirectional": True, "retention": {"kind": "lease"}}))
    ttl = scenario_from_dict(small(policy={"bidirectional": True, "router_ttl_s": 123.0}))
    cfg = router_config(lease, 1, 1)
    assert cfg.ttl_s == float("inf") and cfg.renews_leases
    cfg = router_config(ttl, 1, 1)
    assert cfg.ttl_s == 123.0 and not cfg.renews_leases
    _, _, ctx = simulate(lease, keep=False)
    assert ctx.router.ttl_s == float("inf") and ctx.router.renews
    assert not hasattr(ctx.router, "renew")  # no hook planted on the router from outside


def test_a_lapsed_lease_is_a_router_miss_never_a_declined_read() -> None:
    """The router renews through D at lookup (``DecodeNode.renew_lease``): a turn after its lease lapsed is stale."""
    wl = small()["workload"] | {"turn_gap_s": {"dist": "exponential", "mean": 60}}
    lease = {"kind": "lease", "lease_s": 30.0, "heartbeat_s": 5.0, "idle_timeout_s": 0.0}
    turns = run(scenario_from_dict(small(workload=wl, policy={"bidirectional": True, "retention": lease}))).turns
    later = turns[turns["turn"] > 1]
    assert (later["router"] == "stale").sum() > 0 and (later["router"] == "hit").sum() > 0
    assert (later["decision"] == "expired").sum() == 0 and (later["decision"] == "error").sum() == 0


@pytest.mark.parametrize("now", [99.0, 100.0, 101.0])
def test_expiry_rule_boundaries(now: float) -> None:
    deadline = pin_deadline_s(70.0, 30.0)
    assert deadline == 100.0
    assert is_held(now, deadline) == (now < 100.0)
    assert is_due(now, deadline) == (now >= 100.0)
    margin = read_margin_s(5.0, -1.0)
    assert margin == 4.0
    assert read_declined(now - 4.0, deadline, margin) == (now >= 100.0)  # exactly at the margin: declined
