"""Benchmarks that simulate in-process import the engine before any hot module (sim/native.py's rule), so they
time the compiled build when it is current: a hot module imported first (``kvplan.app.dash_state`` imports
``kvplan.models.formulas``) silently means pure Python for the whole process. Checked without a build: the
engine records that cause before it looks for one."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# scripts that never simulate (pure Python is what they run anyway)
NO_SIMULATION = {"derive_priors.py": "derives kernel priors from aiconfigurator's data; no simulation"}

_CHILD = """
import ast, importlib, sys
path, name = sys.argv[1], sys.argv[2]
sys.path[:0] = ["benchmarks", "tests"]
mods = []
for n in ast.walk(ast.parse(open(path).read())):
    if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("kvplan"):
        mods += [(n.lineno, n.module + "." + a.name) for a in n.names]  # a submodule, or a name of the module
    elif isinstance(n, ast.Import):
        mods += [(n.lineno, a.name) for a in n.names if a.name.startswith("kvplan")]
importlib.import_module(name)  # the script's top level, then its kvplan imports (function-level too) in order
for _, m in sorted(mods):
    try:
        importlib.import_module(m)
    except ModuleNotFoundError:
        importlib.import_module(m.rsplit(".", 1)[0])
from kvplan.sim import native
print(native.status()["reason"])
"""


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if p.name not in NO_SIMULATION))
def test_benchmark_imports_the_engine_before_any_hot_module(script: str) -> None:
    res = subprocess.run([sys.executable, "-c", _CHILD, f"benchmarks/{script}", script[:-3]], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-1500:]
    reason = res.stdout.strip().splitlines()[-1]
    assert "before the engine" not in reason, (script, reason)


def test_the_exempt_scripts_do_not_simulate() -> None:
    for script in NO_SIMULATION:
        tree = ast.parse((ROOT / "benchmarks" / script).read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        assert not names & {"run", "simulate", "run_grid"}, script
