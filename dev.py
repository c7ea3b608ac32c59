#!/usr/bin/env python3
"""One-command setup and run for kvplan, needing only ``python3`` (3.11+).

    python3 dev.py run     # create .venv, install kvplan, compile its hot path, run the main job on the P5en default
    python3 dev.py test    # the same with the test extras, then ruff, mypy, lint-imports, pytest

The virtual environment is created in ``.venv`` next to this file and reused on later calls; the
install step is skipped when ``pyproject.toml`` has not changed since the last install.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"


def sh(*args: str | Path, check: bool = True, env: dict[str, str] | None = None) -> int:
    """Run a command, echoing it; exit with its status on failure when ``check``."""
    print("+", " ".join(str(a) for a in args), flush=True)
    code = subprocess.call([str(a) for a in args], cwd=ROOT, env=env)
    if check and code != 0:
        sys.exit(code)
    return code


def ensure_env(extras: str) -> None:
    """Create the venv and install kvplan (editable) with ``extras`` unless already up to date."""
    if sys.version_info < (3, 11):  # noqa: UP036 - dev.py may be run by an older python3
        sys.exit(f"kvplan needs Python >= 3.11, this is {sys.version.split()[0]}")
    if not PY.exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    stamp = VENV / f".kvplan-installed-{extras or 'base'}"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == digest:
        return
    sh(PY, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    target = f".[{extras}]" if extras else "."
    sh(PY, "-m", "pip", "install", "--quiet", "-e", target)
    stamp.write_text(digest)


def ensure_typecheck_shim(root: Path = ROOT) -> Path:
    """Create the gitignored ``.typecheck/kvplan -> ..`` symlink through which mypy resolves the package.

    The repository root is the package ``kvplan`` (``package-dir`` in pyproject.toml), so a clone has no
    directory called ``kvplan``; mypy's ``mypy_path`` points at ``.typecheck`` and finds it there.
    """
    shim = root / ".typecheck"
    link = shim / "kvplan"
    shim.mkdir(exist_ok=True)
    if not link.is_symlink():
        link.symlink_to("..", target_is_directory=True)
    return link


def build_native() -> bool:
    """Compile the simulator's hot path for the current sources (``kvplan native build``; see sim/native.py).

    A failed build is not fatal: kvplan then runs the same model in pure Python (about 6x slower on the reference run:
    README, "Performance").
    """
    code = sh(BIN / "kvplan", "native", "build", check=False)
    if code != 0:
        print("warning: the compiled build failed; kvplan runs in pure Python (slower)", flush=True)
    return code == 0


def run_main() -> None:
    """The main job: reproduce the published P5en points and simulate the embedded default scenario."""
    ensure_env("native")
    build_native()
    kv = BIN / "kvplan"
    if (ROOT / "app" / "cmd_reproduce.py").exists():
        sh(kv, "reproduce")
    sh(kv, "simulate", "--out", "out/default", "--overwrite")


def run_tests(extra_args: list[str]) -> None:
    """Lint, type-check, check the import layers and run the whole test suite."""
    ensure_env("dev,ray,native")
    # with a compiled build, tests/test_native.py must compare it with pure Python (never skip)
    env = {**os.environ, "KVPLAN_REQUIRE_NATIVE": "1"} if build_native() else dict(os.environ)
    sh(BIN / "ruff", "check", ".")
    shim = ensure_typecheck_shim()
    sh(BIN / "mypy")  # the files and packages to check are in pyproject.toml [tool.mypy]
    # the contracts are in pyproject.toml [tool.importlinter]; kvplan is imported from this tree through the shim
    sh(BIN / "lint-imports", env={**os.environ, "PYTHONPATH": str(shim.parent)})
    sh(PY, "-m", "pytest", "-q", *extra_args, env=env)


def main() -> None:
    """Dispatch ``run`` or ``test``."""
    if len(sys.argv) < 2 or sys.argv[1] not in ("run", "test"):
        sys.exit(__doc__)
    if sys.argv[1] == "run":
        run_main()
    else:
        run_tests(sys.argv[2:])


if __name__ == "__main__":
    main()
