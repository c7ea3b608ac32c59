"""The type checker and the layer contract actually check (issue 14, acceptance 1 and 2).

Each test copies the working tree into a temporary directory whose name is not a Python identifier (as CI's
``mktemp`` clones are), plants one deliberate mistake and runs the same tool ``python3 dev.py test`` runs,
with the same configuration: the tool must fail and name the mistake. The copy reuses the tree's mypy cache
(copied with its timestamps) so that only the planted module and its dependents are re-checked.
"""

from __future__ import annotations

import os
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


def _lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd / ".typecheck")}  # as dev.py runs it: kvplan is this tree
    lint = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(lint)], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_layer_contract_holds_and_rejects_sim_importing_calibration(tmp_path: Path) -> None:
    """``lint-imports`` passes on the tree and fails once ``sim`` imports ``calibration`` (even lazily)."""
    dst = _copy(tmp_path)
    ok = _lint_imports(dst)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "Contracts: 2 kept, 0 broken." in ok.stdout, ok.stdout
    api = dst / "sim" / "api.py"
    planted = "\n\ndef _planted() -> None:\n    from kvplan.calibration import published  # noqa: F401\n"
    api.write_text(api.read_text() + planted)
    bad = _lint_imports(dst)
    out = bad.stdout + bad.stderr
    assert bad.returncode == 1, out
    assert "kvplan.sim.api -> kvplan.calibration.published" in out, out


def test_dashboard_modules_have_no_cycle(tmp_path: Path) -> None:
    """The upload helpers may not import the scenario state again (the old dash_state <-> dash_upload cycle)."""
    dst = _copy(tmp_path)
    up = dst / "app" / "dash_upload.py"
    up.write_text(up.read_text() + "\n\ndef _planted() -> None:\n    from kvplan.app import dash_state  # noqa: F401\n")
    bad = _lint_imports(dst)
    assert bad.returncode == 1 and "kvplan.app.dash_upload -> kvplan.app.dash_state" in bad.stdout, bad.stdout
