"""The type checker and the layer contract actually check (issue 14, acceptance 1 and 2).

Each test copies the working tree into a temporary directory whose name is not a Python identifier (as CI's
``mktemp`` clones are), plants one deliberate mistake and runs the same tool ``python3 dev.py test`` runs,
with the same configuration: the tool must fail and name the mistake. The copy reuses the tree's mypy cache
(copied with its timestamps) so that only the planted module and its dependents are re-checked.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IGNORE = shutil.ignore_patterns(
    ".venv", ".git", ".typecheck", "out", "build", "__pycache__", ".pytest_cache", ".ruff_cache", "*.egg-info", "results"
)


def _copy(tmp_path: Path) -> Path:
    dst = tmp_path / "tmp.x3N2-clone"
    shutil.copytree(ROOT, dst, ignore=IGNORE, symlinks=True)
    shim = dst / ".typecheck"
    shim.mkdir()
    (shim / "kvplan").symlink_to("..", target_is_directory=True)  # what dev.py's ensure_typecheck_shim does
    return dst


def _mypy(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "mypy"], cwd=cwd, capture_output=True, text=True, timeout=600)


def test_mypy_rejects_a_cross_module_type_error(tmp_path: Path) -> None:
    """A ``str`` passed where ``kvplan.sim.engine.simulate`` takes a ``Scenario`` fails the type check."""
    dst = _copy(tmp_path)
    (dst / "sim" / "_canary.py").write_text(
        '"""Deliberately wrong."""\n\nfrom kvplan.sim.engine import simulate\n\n\n'
        'def wrong() -> None:\n    """Pass a path where a Scenario is expected."""\n    simulate("scenario.yaml")\n'
    )
    proc = _mypy(dst)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "_canary.py:8: error: Argument 1 to \"simulate\" has incompatible type \"str\"; expected \"Scenario\"" in out
    assert "Found 1 error in 1 file" in out, out  # nothing else: the tree itself is clean


def test_mypy_checks_tests_against_the_package(tmp_path: Path) -> None:
    """Tests are type-checked too, with kvplan's real types (not ``Any``)."""
    dst = _copy(tmp_path)
    (dst / "tests" / "test_canary.py").write_text(
        "from kvplan.sim.scenario import scenario_from_dict\n\n\n"
        "def test_wrong() -> None:\n    scenario_from_dict({}).no_such_field\n"
    )
    proc = _mypy(dst)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert 'test_canary.py:5: error: "Scenario" has no attribute "no_such_field"' in out, out
