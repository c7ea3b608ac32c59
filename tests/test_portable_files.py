"""Files kvplan ships or writes hold no path of the machine that generated them: ``models/priors/INDEX.json`` records
why a prior was skipped in the words of aiconfigurator's exception, which named the file it read in the generating
machine's virtual environment (``/work/venv-aic/lib/python3.11/site-packages/...``); benchmark results record the
compiled build by its digest and its cache directory by rule; a calibrated profile records its input files relative
to itself."""

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


# --- files a command or a benchmark writes --------------------------------------------------------------------

RESULTS = sorted((ROOT / "benchmarks" / "results").glob("*.json"))


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_a_benchmark_result_names_no_path_of_the_generating_machine(path: Path) -> None:
    """bench_sim, bench_capacity and bench_sweep recorded the compiled build's cache directory as this machine's
    path (``/work/main/.venv/kvplan-native``); they record it by its rule now, beside the build's digest."""
    hit = MACHINE_PATH.search(path.read_text(encoding="utf-8"))
    assert hit is None, f"{path.relative_to(ROOT)}: {hit.group(0) if hit else ''}"


def test_native_status_for_a_results_file_is_portable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import json

    from kvplan.sim import native

    monkeypatch.setenv(native.ENV_DIR, str(tmp_path / "builds"))
    st = native.status(portable=True)
    assert st["cache_dir"] == "$KVPLAN_NATIVE_DIR" and st["digest"] == native.source_digest()  # same keys
    assert not MACHINE_PATH.search(json.dumps(st)), st
    assert native.status()["cache_dir"] == str(tmp_path / "builds")  # `kvplan native status` still prints the path
    monkeypatch.delenv(native.ENV_DIR)
    assert native.status(portable=True)["cache_dir"] in ("<venv>/kvplan-native", "~/.cache/kvplan/native")


@pytest.mark.parametrize("mode", ["direct", "scenario"])
def test_a_calibrated_profile_records_its_inputs_relative_to_itself(tmp_path: Path, mode: str) -> None:
    """``kvplan calibrate --bench /abs/path`` wrote that absolute path into the profile (``provenance.sources[].file``
    and, fitted by simulation, ``fit_report.runs[].file``); it records the path from the profile's directory now."""
    import contextlib
    import io
    import json
    import shutil

    from kvplan.app.cli import main

    bench = tmp_path / "data" / "run.json"
    bench.parent.mkdir()
    shutil.copyfile(ROOT / "tests" / "data" / "llm-d-2p1d__benchmark_2025-05-11_23-39-15.json", bench)
    out = tmp_path / "profiles" / "p.json"
    out.parent.mkdir()
    args = ["calibrate", "--bench", str(bench.resolve()), "--out", str(out), "--allow-model-mismatch"]
    args += (["--model", "llama-3.3-70b", "--hardware", "p5"] if mode == "direct"
             else ["--scenario", str(ROOT / "tests" / "data" / "llmd-2p1d-a100.scenario.yaml")])
    with contextlib.redirect_stdout(io.StringIO()):
        assert main(args) == 0
    text = out.read_text(encoding="utf-8")
    assert str(tmp_path) not in text and not MACHINE_PATH.search(text)
    data = json.loads(text)
    files = [s["file"] for s in data["provenance"]["sources"]]
    files += [r["file"] for r in data["fit_report"].get("runs", [])]
    assert files and len(files) == (1 if mode == "direct" else 2)
    for f in files:
        assert f == "../data/run.json" and (out.parent / f).resolve() == bench.resolve()
