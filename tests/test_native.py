"""The compiled build (sim/native.py) is the same program as the pure-Python modules it is compiled from.

Each scenario of a matrix that exercises every hot path (open loop, closed loop with decode preemption in
both decode modes, trace replay, 2P2D with per-NIC sharing and heterogeneous TP, lease/offload retention,
aggregated replicas) runs twice through ``kvplan simulate``: in a child with the compiled build and in a
child with ``KVPLAN_NATIVE=0``; every output file must be byte-identical. Without a current build the
comparison skips, unless ``KVPLAN_REQUIRE_NATIVE=1`` (set by ``dev.py test`` after a successful build).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import small

from kvplan.sim import native

ROOT = Path(__file__).resolve().parents[1]
TRACES = Path(__file__).resolve().parent / "data" / "traces"
REQUIRE = os.environ.get("KVPLAN_REQUIRE_NATIVE") == "1"


def _pressure() -> dict[str, Any]:
    wl = {
        "conversations": 40, "arrival": {"kind": "closed_loop", "clients": 40, "max_active_conversations": 40},
        "turns": {"dist": "constant", "value": 1}, "prefix_tokens": {"dist": "constant", "value": 1024},
        "user_tokens": {"dist": "constant", "value": 0}, "output_tokens": {"dist": "constant", "value": 4096},
    }
    dep = {"decode_kv_capacity_tokens": 10 * 1024, "max_num_seqs": 64, "prefill_prefix_caching": False,
           "max_num_batched_tokens": 65536}
    return small(workload=wl, deployment=dep, policy={"bidirectional": False})


def _scenarios() -> dict[str, dict[str, Any]]:
    two = {"prefill_nodes": 2, "decode_nodes": 2, "max_num_seqs": 64, "prefill_prefix_caching": True}
    return {
        "open_loop": small(),
        "preemption_fast": _pressure(),
        "preemption_exact": {**_pressure(), "simulation": {"decode_mode": "exact"}},
        "trace_replay": {"workload": {"trace": {"path": str(TRACES / "mooncake_small.jsonl")}}},
        "2p2d_hetero_tp_lease": small(
            deployment={**two, "tensor_parallel_size": 8, "decode_tensor_parallel_size": 4},
            policy={"bidirectional": True, "retention": {"kind": "lease"}},
        ),
        "2p2d_offload_prefix_aware": small(
            deployment={**two, "routing": "prefix_aware"}, policy={"bidirectional": True, "decoder_kv_blocks_ttl_s": 5,
                                                               "offload": {}},
        ),
        "aggregated": small(deployment={"mode": "aggregated", "replicas": 2, "max_num_seqs": 64,
                                        "prefill_prefix_caching": True}),
        # issue 21: hash-prefix reuse, sub-agents and shared prefixes of a weka trace; history and shared prefix
        "weka_shared_prefix": {"policy": {"bidirectional": True},
                               "workload": {"trace": {"path": str(TRACES / "weka_small.json"), "shared_prefix": True}}},
        "history_shared_prefix": small(
            deployment={**two, "max_num_seqs": 64},
            workload={**small()["workload"], "history": "prompt_only", "shared_prefix_tokens": 1500,
                      "shared_prefix_groups": 3},
        ),
    }


def _simulate(scenario: Path, out: Path, pure: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != native.ENV_SWITCH}
    if pure:
        env[native.ENV_SWITCH] = "0"
    code = (
        "import sys; from kvplan.sim import native; from kvplan.app.cli import main; "
        f"st = native.status(); assert st['active'] is {not pure}, st; sys.exit(main(sys.argv[1:]))"
    )
    return subprocess.run(
        [sys.executable, "-c", code, "simulate", str(scenario), "--out", str(out), "--format", "both"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )


@pytest.fixture(scope="module")
def compiled() -> None:
    if native.current_build() is None:
        msg = "no compiled build for the current sources (run `kvplan native build`)"
        if REQUIRE:
            pytest.fail(f"{msg} and KVPLAN_REQUIRE_NATIVE=1")
        pytest.skip(msg)


@pytest.mark.parametrize("name", sorted(_scenarios()))
def test_compiled_build_gives_byte_identical_results(compiled: None, name: str, tmp_path: Path) -> None:
    sc = _scenarios()[name]
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(sc, sort_keys=True))
    outs = {}
    for pure in (False, True):
        out = tmp_path / ("pure" if pure else "compiled")
        res = _simulate(path, out, pure)
        assert res.returncode == 0, res.stderr[-2000:]
        outs[pure] = out
    files = sorted(p.name for p in outs[False].iterdir())
    assert files == sorted(p.name for p in outs[True].iterdir())
    assert {"turns.parquet", "turns.csv", "summary.json"} <= set(files)
    for f in files:
        assert (outs[False] / f).read_bytes() == (outs[True] / f).read_bytes(), f"{name}: {f} differs"


def _tree(tmp: Path) -> Path:
    root = tmp / "kvplan"
    for d in native._PKG_DIRS:
        (root / d).mkdir(parents=True, exist_ok=True)
        for p in (native.package_root() / d).glob("*.py"):
            shutil.copy2(p, root / d / p.name)
    return root


def test_any_source_edit_makes_the_build_stale(tmp_path: Path) -> None:
    """The digest covers every source of the package the hot path can import, not only the compiled ones."""
    root = _tree(tmp_path)
    base = native.source_digest(root)
    assert native.source_digest(root) == base
    for rel in ("sim/decode.py", "models/costs.py", "sim/scenario.py", "errors.py"):
        p = root / rel
        old = p.read_bytes()
        p.write_bytes(old + b"\n# edited\n")
        assert native.source_digest(root) != base, rel
        p.write_bytes(old)
    assert native.source_digest(root) == base


def test_no_build_means_pure_python(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With an empty build directory (or a manifest that lists the wrong modules) nothing compiled is served."""
    monkeypatch.setenv(native.ENV_DIR, str(tmp_path))
    assert native.current_build() is None
    d = tmp_path / native.source_digest()
    d.mkdir()
    (d / native.MANIFEST).write_text('{"files": {"kvplan.sim.decode": "decode.so"}}')
    assert native.current_build() is None  # incomplete: refused
    env = {**os.environ, native.ENV_DIR: str(tmp_path)}
    env.pop(native.ENV_SWITCH, None)
    res = subprocess.run([sys.executable, "-c", "from kvplan.sim import native; print(native.status()['active'])"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() == "False", res.stderr


def test_inlined_step_equals_simpy_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """sim/clock.py's ``SimEnv.run_until`` (its typed copy of SimPy's ``Environment.step``) gives the same run as
    stepping with SimPy's own ``Environment.step``: every event, in the same order, at the same times."""
    from kvplan.sim import clock, engine
    from kvplan.sim.api import run

    env = clock.SimEnv(initial_time=5.0)
    assert env._now == env.now == 5.0 and isinstance(env.now, float)  # the one accessor reads SimPy's clock
    clock.call_later(env, 2.5, lambda _e: None)
    env.run_until(10.0)
    assert env.now == 7.5 and env.peek() == float("inf")

    sc = {**_pressure(), "workload": {**_pressure()["workload"], "conversations": 20}}
    for name, scenario in (("open_loop", small()), ("preemption", sc)):
        monkeypatch.setattr(engine, "USE_QUEUE_LOOP", True)
        fast = run(scenario)
        monkeypatch.setattr(engine, "USE_QUEUE_LOOP", False)
        slow = run(scenario)
        assert fast.events.equals(slow.events), name
        assert json.dumps(fast.summary, sort_keys=True) == json.dumps(slow.summary, sort_keys=True), name


def test_native_cli_status_and_build_report(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    """``kvplan native status`` names the mode and the reason; ``build`` without mypyc fails with exit 1, one line."""
    from kvplan.app.cli import main

    assert main(["native", "status"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(("compiled:", "pure Python:")) and native.source_digest() in out
    monkeypatch.setenv(native.ENV_DIR, str(tmp_path))  # an empty cache: nothing current
    monkeypatch.setattr(native, "build", lambda quiet=True: (_ for _ in ()).throw(RuntimeError("mypyc is not installed")))
    assert main(["native", "build"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: mypyc is not installed"]


def _child(code: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != native.ENV_SWITCH}
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


_REPORT = ("import json, sys; from kvplan.sim import native; [__import__(m) for m in native.HOT_MODULES]; "
           "print(json.dumps([native.status()['active'], native.status()['reason'], "
           "[m for m in native.HOT_MODULES if sys.modules[m].__file__.endswith('.py')]]))")


def test_import_kvplan_installs_nothing() -> None:
    """``import kvplan`` imports no module of the package and hashes nothing: the engine installs the build."""
    code = ("import sys, kvplan; print(sorted(m for m in sys.modules if m.startswith('kvplan.')), "
            "any(type(f).__name__ == '_Finder' for f in sys.meta_path))")
    res = _child(code)
    assert res.returncode == 0 and res.stdout.split() == ["[]", "False"], (res.stdout, res.stderr[-500:])


@pytest.mark.parametrize("entry", ["kvplan.sim.engine", "kvplan.app.cli", "kvplan.sim.api", "kvplan.plan.executor"])
def test_the_engine_installs_the_build_for_every_hot_module(compiled: None, entry: str) -> None:
    """The rule: the engine installs the build at its import, before any hot module. Every entry point that
    simulates imports the engine first, so afterwards every hot module is compiled, also one imported
    through another path (the cost formulas through kvplan.models.costs, as `kvplan cost` does)."""
    res = _child(f"import {entry}, kvplan.models.costs; " + _REPORT)
    assert res.returncode == 0, res.stderr[-2000:]
    active, reason, pure = json.loads(res.stdout.strip().splitlines()[-1])
    assert active is True and pure == [], (entry, reason, pure)


def test_a_hot_module_before_the_engine_means_pure_python_throughout(compiled: None) -> None:
    """Mixing is impossible: a hot module imported before the engine (here the cost formulas) means the engine
    serves no compiled module at all; every hot module is the pure one and the status names the cause."""
    res = _child("import kvplan.models.costs, kvplan.sim.engine; " + _REPORT)
    assert res.returncode == 0, res.stderr[-2000:]
    active, reason, pure = json.loads(res.stdout.strip().splitlines()[-1])
    assert active is False and pure == list(native.HOT_MODULES)
    assert "kvplan.models.formulas" in reason and "before the engine" in reason


def test_compiled_simenv_keeps_simpy_semantics(compiled: None) -> None:
    """tests/test_clock.py (SimEnv against simpy.Environment: stops, failures, ordering) with the compiled clock, and
    tests/test_fifo.py (the engines' queue against deque) with the compiled Fifo, and the compiled ITL tree (in-place
    updates between snapshots included) against the list tree."""
    code = ("import sys, kvplan.sim.engine, kvplan.sim.clock as c, kvplan.sim.fifo as f, pytest; "
            "from kvplan.sim import native; "
            "assert native.status()['active'] and not c.__file__.endswith('.py'), c.__file__; "
            "assert not f.__file__.endswith('.py'), f.__file__; "
            "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'tests/test_clock.py', 'tests/test_fifo.py', "
            "'tests/test_itl.py::test_native_tree_answers_as_the_list_tree']))")
    res = _child(code)
    assert res.returncode == 0 and " passed" in res.stdout, (res.stdout[-2000:], res.stderr[-1000:])


def test_truncated_artefact_is_never_loaded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 22 item 12: a build whose manifest lists every module is used only while each artefact has the
    SHA-256 the manifest recorded; a truncated library (which would SIGBUS when mapped) means pure Python."""
    import json

    monkeypatch.setenv(native.ENV_DIR, str(tmp_path))
    d = tmp_path / native.source_digest()
    d.mkdir()
    names = (*native.HOT_MODULES, f"{native.GROUP}__mypyc")
    files = {n: f"{n}.so" for n in names}
    for f in files.values():
        (d / f).write_bytes(b"\x7fELF" + b"\0" * 4096)
    sha = {n: native.file_sha256(d / f) for n, f in files.items()}
    (d / native.MANIFEST).write_text(json.dumps({"files": files, "sha256": sha}))
    assert native.current_build() == d  # intact (fake) artefacts pass the check
    (d / native.MANIFEST).write_text(json.dumps({"files": files}))
    assert native.current_build() is None  # no digests recorded: not trusted
    (d / native.MANIFEST).write_text(json.dumps({"files": files, "sha256": sha}))
    victim = d / files["kvplan.sim.decode"]
    victim.write_bytes(victim.read_bytes()[:100])  # truncated
    assert native.current_build() is None
    env = {**os.environ, native.ENV_DIR: str(tmp_path)}
    env.pop(native.ENV_SWITCH, None)
    res = subprocess.run([sys.executable, "-c", "from kvplan.sim import native; print(native.status()['active'])"],
                         env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "False", (res.returncode, res.stderr[-500:])


def test_unknown_switch_value_is_said_not_ignored(monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """KVPLAN_NATIVE=garbage: a warning naming the variable and its two values, then the default."""
    from kvplan.sim import native

    monkeypatch.setattr(native, "_STATE", {"active": False, "reason": "not checked"})
    monkeypatch.setenv(native.ENV_SWITCH, "garbage")
    with caplog.at_level("WARNING", logger="kvplan.sim.native"):
        native.install()
    assert "KVPLAN_NATIVE='garbage' is neither 0" in caplog.text
    assert native._STATE["reason"] != f"{native.ENV_SWITCH}=0"
