"""Files kvplan ships hold no path of the machine that generated them: ``models/priors/INDEX.json`` records why a
prior was skipped in the words of aiconfigurator's exception, which named the file it read in the generating
machine's virtual environment (``/work/venv-aic/lib/python3.11/site-packages/...``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvplan.calibration.derive import portable_text, skip_reason

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted([*(ROOT / "models" / "priors").glob("*.json"), *(ROOT / "models" / "profiles").glob("*.json")])
#: An absolute path of a machine: under a home, a work or temporary directory, or inside an installed package.
MACHINE_PATH = re.compile(r"(?<![\w.<])/(?:work|home|Users|root|tmp|opt|usr|var|mnt)/|(?<!<)site-packages/")


def test_there_are_shipped_files_to_check() -> None:
    assert ROOT / "models" / "priors" / "INDEX.json" in SHIPPED and len(SHIPPED) > 20


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_file_names_no_path_of_the_generating_machine(path: Path) -> None:
    hit = MACHINE_PATH.search(path.read_text(encoding="utf-8"))
    assert hit is None, f"{path.relative_to(ROOT)}: {hit.group(0) if hit else ''}"


@pytest.mark.parametrize(("text", "expected"), [
    ("rows loaded from 1 source(s) (first: /work/venv-aic/lib/python3.11/site-packages/aiconfigurator/systems/x.csv)",
     "rows loaded from 1 source(s) (first: <site-packages>/aiconfigurator/systems/x.csv)"),
    ("no table in /usr/lib/python3/dist-packages/aic/db", "no table in <site-packages>/aic/db"),
    (f"cannot read {ROOT}/models/priors/a.json here", "cannot read models/priors/a.json here"),
    ("bad file '/home/u/data/f.csv'", "bad file '.../f.csv'"),
    ("ratio 1/2, N/A, a/b, ./rel/p and ~/x stay", "ratio 1/2, N/A, a/b, ./rel/p and ~/x stay"),
])
def test_portable_text(text: str, expected: str) -> None:
    assert portable_text(text, ROOT) == expected


def test_skip_reason_is_portable_before_it_is_cut() -> None:
    """The generator cuts the reason to 160 characters; the path is made portable first, so a cut path never
    leaves a machine prefix behind."""
    exc = RuntimeError("perf database error: no DSA module rows loaded from 1 source(s) (first: "
                       "/work/venv-aic/lib/python3.11/site-packages/aiconfigurator/systems/data/l40s/vllm/0.24.0/dsa.txt)")
    why = skip_reason(exc)
    assert why.startswith("RuntimeError: perf database error") and len(why) <= len("RuntimeError: ") + 160
    assert "<site-packages>/aiconfigurator/systems/data/l40s" in why and not MACHINE_PATH.search(why)
