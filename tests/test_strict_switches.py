"""Switches in scenario and grid YAML are ``true`` or ``false`` only: pydantic's lax mode would read ``1``,
``"yes"``, ``"on"`` or ``"t"`` as true, and PyYAML (YAML 1.1) reads an unquoted ``yes``/``no``/``on``/``off`` as a
boolean. Every ``bool`` field of every section refuses anything else with one line naming the field."""

from __future__ import annotations

import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from kvplan.errors import KvplanInputError
from kvplan.safe_yaml import load_yaml_text
from kvplan.sim.scenario import Scenario, load_scenario, scenario_from_dict

#: Every switch of a scenario: its dotted path and the mapping around it that makes it reachable.
SWITCHES: dict[str, dict[str, Any]] = {
    "deployment.prefill_prefix_caching": {},
    "deployment.decode_prefix_caching": {},
    "deployment.cudagraph_memory_profiling": {},
    "deployment.cross_layer_blocks": {},
    "deployment.kv_post_overlaps_forward": {},
    "deployment.async_scheduling": {},
    "deployment.handoff.serialised": {},
    "policy.bidirectional": {},
    "policy.threshold_applies_to_p2d": {},
    "policy.send_conversation_id": {},
    "policy.retention.client_knows_end": {"kind": "lease"},
    "workload.trace.shared_prefix": {"path": "trace.json", "format": "weka"},
    "workload.first_turn_user_tokens": {},
    "simulation.allow_unreliable_profile": {},
}


def _bool_fields(model: type[BaseModel], prefix: str = "") -> set[str]:
    """Dotted paths of every ``bool`` / ``bool | None`` field reachable from ``model``."""
    out: set[str] = set()
    for name, f in model.model_fields.items():
        ann = f.annotation
        if typing.get_origin(ann) is typing.Annotated:
            ann = typing.get_args(ann)[0]
        members = typing.get_args(ann) if isinstance(ann, types.UnionType) or typing.get_origin(
            ann) is typing.Union else (ann,)
        kinds = {m for m in members if m is not type(None)}
        if kinds == {bool}:
            out.add(prefix + name)
        for m in kinds:
            if isinstance(m, type) and issubclass(m, BaseModel):
                out |= _bool_fields(m, f"{prefix}{name}.")
    return out


def _nest(path: str, value: Any) -> dict[str, Any]:
    """A scenario mapping with ``value`` at ``path`` (and each switch's required neighbours)."""
    *sections, leaf = path.split(".")
    node: dict[str, Any] = {**SWITCHES[path], leaf: value}
    for sec in reversed(sections):
        node = {sec: node}
    return node


def test_the_list_names_every_switch() -> None:
    assert _bool_fields(Scenario) == set(SWITCHES)


@pytest.mark.parametrize("path", sorted(SWITCHES))
@pytest.mark.parametrize("value", [1, 0, "yes", "on", "true", "t", 1.0])
def test_a_switch_refuses_anything_but_true_or_false(path: str, value: Any) -> None:
    with pytest.raises(KvplanInputError) as err:
        scenario_from_dict(_nest(path, value))
    msg = str(err.value)
    assert f"field '{path}'" in msg and "write true or false" in msg and "\n" not in msg


@pytest.mark.parametrize("path", sorted(SWITCHES))
def test_a_switch_takes_true_and_false(path: str) -> None:
    for value in (True, False):
        assert scenario_from_dict(_nest(path, value)) is not None


@pytest.mark.parametrize("word", ["yes", "No", "ON", "off"])
def test_yaml_1_1_boolean_spellings_are_refused_with_their_line(word: str) -> None:
    want = f"s.yaml line 2 field 'policy.bidirectional': '{word}' is a YAML 1.1 boolean spelling; write true"
    with pytest.raises(KvplanInputError, match=want):
        load_yaml_text(f"policy:\n  bidirectional: {word}\n", "s.yaml")
    assert load_yaml_text(f"source: '{word}'\n", "s.yaml") == {"source": word}  # quoted: the string
    assert load_yaml_text("a: True\nb: false\n", "s.yaml") == {"a": True, "b": False}


def test_cli_refuses_an_int_switch_and_a_grid_axis_of_yes(tmp_path: Path) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text("policy: {bidirectional: 1}\nworkload: {conversations: 3}\n")
    with pytest.raises(KvplanInputError, match="field 'policy.bidirectional': is 1, not true or false"):
        load_scenario(sc)
    grid = tmp_path / "g.yaml"
    grid.write_text("base: {workload: {conversations: 3}}\naxes: {policy.bidirectional: [true, 'no']}\n")
    res = subprocess.run([sys.executable, "-m", "kvplan.app.cli", "sweep", str(grid), "--out", str(tmp_path / "r.parquet")],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "point 1" in res.stderr and "'policy.bidirectional': is 'no'" in res.stderr
    assert not (tmp_path / "r.parquet").exists()


@pytest.mark.parametrize("value", [1, "yes", "on"])
def test_an_inline_hardware_spec_switch_is_strict_too(value: Any) -> None:
    from kvplan.models.hardware import get_hardware

    spec = {**get_hardware("p5en").model_dump(), "name": "my-node"}
    assert get_hardware({**spec, "gpudirect_rdma": False}).gpudirect_rdma is False
    with pytest.raises(KvplanInputError, match=r"^hardware\.gpudirect_rdma: is .*, not true or false; write true"):
        get_hardware({**spec, "gpudirect_rdma": value})
    from kvplan.sim.engine import resolve

    sc = scenario_from_dict({"hardware": {**spec, "gpudirect_rdma": value}, "workload": {"conversations": 2}})
    with pytest.raises(KvplanInputError, match=r"hardware\.gpudirect_rdma: is"):
        resolve(sc)  # what a run, sweep point or recommend resolves first
