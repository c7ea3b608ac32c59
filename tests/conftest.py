"""Shared fixtures: small scenarios and the ../shared location.

Tests that read ``../shared`` (relative to the repository root) are marked ``shared_data`` (automatically
when they use the ``shared_dir`` fixture) and get their files through :func:`need_shared`, which skips
when a file is absent: a user's clone has no shared material. They never skip silently: the terminal
summary lists every shared-data test with its outcome, and ``KVPLAN_REQUIRE_SHARED=1`` turns a missing
file into a failure (for CI machines that have ../shared).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

import kvplan.sim.engine  # noqa: F401 - first, as the entry points: in-process tests run the compiled build if current

# ../shared relative to the repository root; KVPLAN_SHARED points elsewhere (e.g. from a git worktree)
SHARED = Path(os.environ.get("KVPLAN_SHARED") or Path(__file__).resolve().parents[2] / "shared")
REQUIRE_SHARED = os.environ.get("KVPLAN_REQUIRE_SHARED") == "1"
_SHARED_OUTCOMES: dict[str, str] = {}


def need_shared(rel: str = "") -> Path:
    """``../shared/<rel>``; skips the test when it is absent (fails instead with KVPLAN_REQUIRE_SHARED=1)."""
    path = SHARED / rel
    if not path.exists():
        msg = f"../shared/{rel} is absent ({SHARED})"
        if REQUIRE_SHARED:
            pytest.fail(f"{msg} and KVPLAN_REQUIRE_SHARED=1")
        pytest.skip(msg)
    return path


@pytest.fixture
def shared_dir() -> Path:
    return need_shared()


def rerun_pure(request: pytest.FixtureRequest) -> bool:
    """For tests that monkeypatch the hot modules (compiled classes cannot be patched): when this process runs
    the compiled build (sim/native.py), run the test in a pure-Python child (``KVPLAN_NATIVE=0``), require it
    to pass, and return True (the caller returns); False when already pure (the caller runs the test body)."""
    import subprocess
    import sys

    from kvplan.sim import native

    if not native.status()["active"]:
        return False
    env = {**os.environ, "KVPLAN_NATIVE": "0"}
    root = Path(__file__).resolve().parents[1]
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", request.node.nodeid],
                         cwd=root, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"the pure-Python run of {request.node.nodeid} failed:\n{res.stdout[-3000:]}"
    assert "1 passed" in res.stdout, res.stdout[-1000:]
    return True


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "shared_data: the test reads ../shared (listed in the terminal summary)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "shared_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.shared_data)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if "shared_data" not in report.keywords:
        return
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        _SHARED_OUTCOMES[report.nodeid] = report.outcome


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line per shared-data test and a count, so CI shows which ran and which skipped."""
    if not _SHARED_OUTCOMES:
        return
    ran = sum(1 for o in _SHARED_OUTCOMES.values() if o != "skipped")
    skipped = len(_SHARED_OUTCOMES) - ran
    where = "present" if SHARED.is_dir() else "absent"
    terminalreporter.write_sep("-", f"shared-data tests: {ran} ran, {skipped} skipped (../shared {where}: {SHARED})")
    for nodeid, outcome in sorted(_SHARED_OUTCOMES.items()):
        terminalreporter.write_line(f"{outcome.upper():8s} {nodeid}")


def small(**over: Any) -> dict[str, Any]:
    """A small open-loop scenario dict; keyword args replace whole sections."""
    data: dict[str, Any] = {
        "model": "qwen3-32b",
        "hardware": "p5en",
        "deployment": {"max_num_seqs": 64, "prefill_prefix_caching": False},
        "policy": {"bidirectional": True},
        "workload": {
            "conversations": 60,
            "arrival": {"kind": "poisson", "rate_per_s": 0.5},
            "turns": {"dist": "uniform", "low": 1, "high": 6},
            "prefix_tokens": {"dist": "lognormal", "median": 3000, "sigma": 0.5},
            "user_tokens": {"dist": "uniform", "low": 20, "high": 400},
            "output_tokens": {"dist": "uniform", "low": 10, "high": 400},
            "turn_gap_s": {"dist": "exponential", "mean": 20},
        },
        "seed": 3,
    }
    data.update(over)
    return data


def full_costs(**components: dict) -> dict:
    """An inline ``costs:`` block replacing whole components: every parameter not given is 0 (no knots).

    Inline costs override only the parameters they name, so a test that wants a bare formula names them all.
    """
    from kvplan.models.costs import DecodeCost, OverheadCost, PrefillCost, TransferCost

    classes = {"prefill": PrefillCost, "transfer": TransferCost, "decode": DecodeCost, "overhead": OverheadCost}
    out = {}
    for comp, given in components.items():
        blank = classes[comp]().model_dump(mode="python")
        blank = {k: (() if isinstance(v, tuple) else (None if v is None else 0.0)) for k, v in blank.items()}
        out[comp] = {**blank, **given}
    return out


def lone_decode_owner(on_finish: Any, fit: Any = None) -> Any:
    """The owner a lone ``sim.batch.DecodeBatch`` talks to in unit tests: an unbounded block pool,
    ``on_finish(request)`` at each finish, ``fit(step) -> preempted`` (never, by default)."""
    from kvplan.sim.batch import LoneOwner
    from kvplan.sim.blocks import BlockPool

    return LoneOwner(BlockPool(10**6, 16, True), on_finish, None if fit is None else (lambda step: bool(fit(step))))
