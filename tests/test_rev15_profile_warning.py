"""rev15: recommend's 'profile not calibrated' warning looks at each role's own profile.

Under heterogeneous TP the roles are priced by their own TP's profile (sim/engine.py resolve_roles). On qwen3-32b /
p5en at tensor_parallel_size 8 the shipped p5en-qwen3-32b profile is calibrated, but P at TP4 runs on a profile
composed for TP4 (the TP4 kernel prior with p5en-qwen3-32b's corrections borrowed). The warning was gated on
tensor_parallel_size's profile alone, so recommend said nothing about P's composed profile."""

from __future__ import annotations

from typing import Any

from kvplan.plan.advice_report import run_warnings
from kvplan.sim.engine import resolve, resolve_roles
from kvplan.sim.scenario import scenario_from_dict

_BASE = {"model": "qwen3-32b", "hardware": "p5en",
         "workload": {"conversations": 10, "arrival": {"kind": "poisson", "rate_per_s": 0.5}}}


def _warning(deployment: dict[str, Any]) -> list[str]:
    rs = resolve(scenario_from_dict({**_BASE, "deployment": deployment}))
    return [w for w in run_warnings(rs, []) if w.startswith("profile not calibrated")]


def test_a_role_on_a_composed_profile_is_warned_about() -> None:
    dep = {"prefill_nodes": 2, "decode_nodes": 1, "tensor_parallel_size": 8, "prefill_tensor_parallel_size": 4}
    rs = resolve(scenario_from_dict({**_BASE, "deployment": dep}))
    rs_p, rs_d = resolve_roles(rs.scenario, rs)
    assert not rs.profile.extrapolated and not rs_d.profile.extrapolated  # TP8: the calibrated shipped profile
    assert rs_p.profile.extrapolated  # TP4: composed
    (line,) = _warning(dep)
    assert f"[prefill at TP4: profile {rs_p.profile.name}]" in line, line


def test_a_calibrated_deployment_gets_no_profile_warning() -> None:
    assert _warning({"prefill_nodes": 2, "decode_nodes": 1, "tensor_parallel_size": 8}) == []
