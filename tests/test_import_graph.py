"""No import circle anywhere in kvplan, and the layer contract puts ``plan`` above ``sim`` (issue 23, acceptance 1).

The import graph is grimp's (the library ``lint-imports`` runs on), with ``TYPE_CHECKING`` imports and imports
inside functions included; its strongly connected components are scipy's. ``python3 dev.py test`` also runs
``lint-imports`` on the contracts themselves; here they are read from ``pyproject.toml`` and checked on the same
graph, once as it is and once with a planted upward import, so that the test fails if the contract loses its teeth.
"""

from __future__ import annotations

import copy
import tomllib
from pathlib import Path

import grimp
import numpy as np
import pytest
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import connected_components

ROOT = Path(__file__).resolve().parents[1]

@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    """kvplan's import graph, ``if TYPE_CHECKING:`` imports included (no cache: always the tree as it is)."""
    return grimp.build_graph("kvplan", exclude_type_checking_imports=False, cache_dir=None)


def circles(graph: grimp.ImportGraph) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (a module importing itself is not counted)."""
    mods = sorted(graph.modules)
    index = {m: i for i, m in enumerate(mods)}
    edges = [(index[a], index[b]) for a in mods for b in graph.find_modules_directly_imported_by(a)]
    rows, cols = (np.array(x, dtype=np.int64) for x in zip(*edges, strict=True))
    adj = csr_matrix((np.ones(len(edges)), (rows, cols)), shape=(len(mods), len(mods)))
    _, label = connected_components(adj, directed=True, connection="strong")
    groups: dict[int, set[str]] = {}
    for m, lab in zip(mods, label.tolist(), strict=True):
        groups.setdefault(lab, set()).add(m)
    return sorted((frozenset(g) for g in groups.values() if len(g) > 1), key=sorted)


def test_circle_finder_sees_type_checking_and_function_level_imports(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A circle hidden in an ``if TYPE_CHECKING:`` import one way and a function-level import the other is found;
    without TYPE_CHECKING imports it is not (so the graph of the real test is the one that sees them)."""
    pkg = tmp_path / "kvplan_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from kvplan_probe import b\n")
    (pkg / "b.py").write_text("def f():\n    from kvplan_probe import a\n    return a\n")
    (pkg / "c.py").write_text("from kvplan_probe import b\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    full = grimp.build_graph("kvplan_probe", exclude_type_checking_imports=False, cache_dir=None)
    assert circles(full) == [frozenset({"kvplan_probe.a", "kvplan_probe.b"})]
    plain = grimp.build_graph("kvplan_probe", exclude_type_checking_imports=True, cache_dir=None)
    assert circles(plain) == []


def test_circle_finder_finds_a_planted_circle(graph: grimp.ImportGraph) -> None:
    """On kvplan's own graph, one import back up (sim -> plan) makes a circle through what plan imports of sim."""
    g = copy.deepcopy(graph)
    g.add_import(importer="kvplan.sim.scenario", imported="kvplan.plan.screen")
    found = circles(g)
    assert any({"kvplan.sim.scenario", "kvplan.plan.screen"} <= c for c in found), found


def test_no_import_circle_anywhere(graph: grimp.ImportGraph) -> None:
    """No strongly connected component of more than one module in the whole package (TYPE_CHECKING and
    in-function imports included): every module sits strictly above what it imports."""
    found = circles(graph)
    assert not found, f"import circles: {[sorted(c) for c in found]}"


def _layers_contract() -> list[str]:
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    layered = [c for c in conf["contracts"] if c["type"] == "layers" and "kvplan.sim" in c["layers"]]
    assert len(layered) == 1, layered
    return list(layered[0]["layers"])


def _grimp_layers(layers: list[str]) -> list[grimp.Layer]:
    """import-linter's layer syntax: ``a | b`` independent siblings, ``a : b`` siblings that may import each other."""
    out = []
    for layer in layers:
        independent = ":" not in layer
        out.append(grimp.Layer(*(p.strip() for p in layer.replace(":", "|").split("|")), independent=independent))
    return out


def test_layer_contract_puts_plan_above_sim_and_below_app() -> None:
    """``pyproject.toml``'s package contract: app > plan (beside calibration) > sim > traces > models."""
    layers = _layers_contract()
    where = {p.strip(): i for i, layer in enumerate(layers) for p in layer.replace(":", "|").split("|")}
    assert where["kvplan.app"] < where["kvplan.plan"] < where["kvplan.sim"] < where["kvplan.traces"] < \
        where["kvplan.models"], layers
    assert where["kvplan.calibration"] < where["kvplan.sim"], layers


def test_layer_contract_holds_and_catches_sim_importing_plan(graph: grimp.ImportGraph) -> None:
    """The contract, checked by grimp as ``lint-imports`` checks it: kept by the tree, broken by sim -> plan and by
    plan -> calibration (independent siblings)."""
    layers = _grimp_layers(_layers_contract())
    assert graph.find_illegal_dependencies_for_layers(layers=layers) == set()
    for importer, imported in (("kvplan.sim.api", "kvplan.plan.advice"), ("kvplan.plan.sweep", "kvplan.calibration.fit")):
        g = copy.deepcopy(graph)
        g.add_import(importer=importer, imported=imported)
        bad = g.find_illegal_dependencies_for_layers(layers=layers)
        assert {(d.importer, d.imported) for d in bad} == {(importer.rsplit(".", 1)[0], imported.rsplit(".", 1)[0])}, bad
