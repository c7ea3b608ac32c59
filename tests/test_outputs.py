"""The output rule for every single-file output (issue 22, items 1-3): a regular file or nothing, never an input of
the command, an existing file kvplan did not write only with ``--overwrite``, derived sibling paths checked
before any work. Each hostile case runs in a forked child under a time and memory limit (tests/hostile.py) and
must exit 2 with one line naming the flag, no traceback, and leave every node on disk as it was (FIFOs, sockets,
device nodes, symlinks, directories and user files alike).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from hostile import TIME_LIMIT_S, run_limited

from kvplan.atomic import LEDGER, atomic_write_bytes, written_by_kvplan
from kvplan.errors import KvplanInputError

DATA = Path(__file__).parent / "data"
TRACE = DATA / "traces" / "sessions_small.csv"
BENCH = DATA / "llm-d-2p1d__benchmark_2025-05-11_23-39-15.json"

SCENARIO = {
    "model": "qwen3-32b", "hardware": "p5en",
    "workload": {"conversations": 6, "arrival": {"kind": "poisson", "rate_per_s": 1.0},
                 "turns": {"dist": "constant", "value": 2}, "prefix_tokens": {"dist": "constant", "value": 1000},
                 "turn_gap_s": {"dist": "exponential", "mean": 5}},
    "seed": 1,
}
GRID = {"base": "base.yaml", "axes": {"policy.decoder_kv_blocks_ttl_s": [60, 120]}}


def _inputs(d: Path) -> None:
    """The input files every case directory starts with."""
    shutil.copy(TRACE, d / "t.csv")
    shutil.copy(BENCH, d / "b.json")
    (d / "s.yaml").write_text(yaml.safe_dump(SCENARIO))
    (d / "base.yaml").write_text(yaml.safe_dump(SCENARIO))
    (d / "g.yaml").write_text(yaml.safe_dump(GRID))


P = "{p}"
#: command -> (argv with {p} at the output, the name of the node the case plants, the flag the error names)
COMMANDS: dict[str, tuple[list[str], str, str]] = {
    "reproduce-html": (["reproduce", "--model", "qwen3-32b", "--html", P], "x.html", "--html"),
    "compare-html": (["compare", "s.yaml", "--html", P], "x.html", "--html"),
    "workload-show-html": (["workload", "show", "t.csv", "--html", P], "x.html", "--html"),
    "workload-fit-out": (["workload", "fit", "t.csv", "--out", P], "w.yaml", "--out"),
    "workload-fit-report": (["workload", "fit", "t.csv", "--out", "w.yaml"], "w.fit.json", "--out (report)"),
    "calibrate-out": (["calibrate", "--bench", "b.json", "--model", "qwen3-32b", "--hardware", "p5en", "--out", P],
                      "p.json", "--out"),
    "calibrate-published-out": (["calibrate", "--published", "t.csv", "--model", "qwen3-32b", "--hardware", "p5en",
                                 "--out", P], "p.json", "--out"),
    "profile-derive-out": (["profile", "derive", "--model", "qwen3-32b", "--gpu", "h100-sxm", "--tp", "8", "--out", P],
                           "p.json", "--out"),
    "sweep-out": (["sweep", "g.yaml", "--out", P, "--workers", "1"], "r.parquet", "--out"),
    "sweep-summary": (["sweep", "g.yaml", "--out", "r.parquet", "--workers", "1"], "r.summary.parquet",
                      "--out (summary)"),
    "sweep-screen": (["sweep", "g.yaml", "--out", "r.parquet", "--workers", "1"], "r.screen.parquet", "--out (screen)"),
    "sweep-csv": (["sweep", "g.yaml", "--out", "r.parquet", "--csv", P, "--workers", "1"], "c.csv", "--csv"),
}


def _fifo(n: Path) -> None:
    os.mkfifo(n)


def _socket(n: Path) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(str(n))
    finally:
        s.close()


def _device(n: Path) -> None:
    """A character device node in the case directory (a copy of /dev/null's numbers; the real one is never used)."""
    try:
        os.mknod(n, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    except (PermissionError, OSError):
        pytest.skip("cannot create device nodes here (not root, or no CAP_MKNOD)")


def _link_to(make: Callable[[Path], None]) -> Callable[[Path], None]:
    def plant(n: Path) -> None:
        target = n.with_name("target-" + n.name)
        make(target)
        n.symlink_to(target.name)
    return plant


def _dangling(n: Path) -> None:
    n.symlink_to("no-such-target")


def _directory(n: Path) -> None:
    n.mkdir()
    (n / "inside.txt").write_text("keep")


def _user_file(n: Path) -> None:
    n.write_bytes(b"the user's own bytes\n")


def _forged_ledger(n: Path) -> None:
    n.write_bytes(b"the user's own bytes\n")
    # forged down to the writer tag (a ledger without it is the user's file altogether: tests/test_in15_foreign_records)
    (n.parent / LEDGER).write_text(json.dumps({"writer": "kvplan",
                                               "files": {n.name: [{"size": 21, "sha256": "0" * 64}]}}))


def _edited_kvplan_file(n: Path) -> None:
    atomic_write_bytes(n, b"written by kvplan\n")
    with open(n, "ab") as fh:
        fh.write(b"then edited by the user\n")


#: node kind -> (how to plant it, pass --overwrite too)
KINDS: dict[str, tuple[Callable[[Path], None], bool]] = {
    "fifo": (_fifo, False),
    "fifo-overwrite": (_fifo, True),
    "socket": (_socket, True),
    "device": (_device, True),
    "symlink-to-fifo": (_link_to(_fifo), True),
    "symlink-to-device": (_link_to(_device), True),
    "dangling-symlink": (_dangling, False),
    "directory": (_directory, True),
    "user-file": (_user_file, False),
    "forged-ledger": (_forged_ledger, False),
    "edited-kvplan-file": (_edited_kvplan_file, False),
}


def _snapshot(d: Path) -> dict[str, tuple[int, str]]:
    """Every node under ``d``: its type bits and, for regular files, a digest of the bytes (symlinks: the target)."""
    out: dict[str, tuple[int, str]] = {}
    for root, dirs, files in os.walk(d):
        for name in [*dirs, *files]:
            p = Path(root) / name
            if name.startswith(".hostile."):
                continue
            st = os.lstat(p)
            kind = stat.S_IFMT(st.st_mode)
            if stat.S_ISREG(st.st_mode):
                extra = hashlib.sha256(p.read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                extra = os.readlink(p)
            elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
                extra = str(st.st_rdev)
            else:
                extra = ""
            out[str(p.relative_to(d))] = (kind, extra)
    return out


def _assert_refused(d: Path, argv: list[str], needle: str) -> str:
    before = _snapshot(d)
    res = run_limited(argv, d)
    err = res.stderr.strip()
    assert res.code == 2, f"exit {res.code}: {err[-600:]}"
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert needle in err and "Traceback" not in err, err
    assert res.wall_s <= TIME_LIMIT_S
    assert _snapshot(d) == before, "something changed on disk"
    return err


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_output_flag_refuses_what_it_must_not_replace(tmp_path: Path, command: str, kind: str) -> None:
    argv, node, flag = COMMANDS[command]
    plant, overwrite = KINDS[kind]
    _inputs(tmp_path)
    plant(tmp_path / node)
    args = [a.replace(P, node) for a in argv] + (["--overwrite"] if overwrite else [])
    _assert_refused(tmp_path, args, flag)


@dataclass(frozen=True)
class Clash:
    """An output that is (or whose derived sibling is) an input of the same command."""

    id: str
    argv: list[str]
    needle: str
    setup: Callable[[Path], None] = field(default=lambda d: None)


def _hardlink(src: str, dst: str) -> Callable[[Path], None]:
    return lambda d: os.link(d / src, d / dst)


def _empirical(d: Path) -> None:
    (d / "e.csv").write_text("value\n100\n200\n")
    sc = json.loads(json.dumps(SCENARIO))
    sc["workload"]["prefix_tokens"] = {"dist": "empirical", "path": "e.csv"}
    (d / "s.yaml").write_text(yaml.safe_dump(sc))


def _own_result(d: Path) -> None:
    out = d / "D"
    out.mkdir()
    (out / "scenario.yaml").write_text(yaml.safe_dump(SCENARIO))


def _model_config(d: Path) -> None:
    (d / "cfg").mkdir()
    (d / "cfg" / "config.json").write_text("{}")


def _trace_named_like_a_report(d: Path) -> None:
    shutil.copy(d / "t.csv", d / "w.fit.json")


CLASHES = [
    Clash("workload-fit-out-is-the-trace", ["workload", "fit", "t.csv", "--out", "t.csv"], "same file as the input"),
    Clash("workload-fit-out-is-the-trace-overwrite", ["workload", "fit", "t.csv", "--out", "t.csv", "--overwrite"],
          "same file as the input"),
    Clash("workload-fit-out-hardlink-of-trace", ["workload", "fit", "t.csv", "--out", "t2.csv", "--overwrite"],
          "same file as the input", _hardlink("t.csv", "t2.csv")),
    Clash("workload-fit-report-is-the-trace", ["workload", "fit", "w.fit.json", "--out", "w.yaml", "--overwrite"],
          "--out (report)", _trace_named_like_a_report),
    Clash("workload-fit-out-is-the-scenario", ["workload", "fit", "t.csv", "--scenario", "s.yaml", "--out", "s.yaml",
                                               "--overwrite"], "same file as the input"),
    Clash("workload-show-html-is-the-trace", ["workload", "show", "t.csv", "--html", "t.csv", "--overwrite"],
          "same file as the input"),
    Clash("calibrate-out-is-the-bench", ["calibrate", "--bench", "b.json", "--model", "qwen3-32b", "--hardware", "p5en",
                                         "--out", "b.json"], "same file as the input"),
    Clash("calibrate-out-is-the-bench-overwrite", ["calibrate", "--bench", "b.json", "--model", "qwen3-32b",
                                                   "--hardware", "p5en", "--out", "b.json", "--overwrite"],
          "same file as the input"),
    Clash("calibrate-out-is-the-points", ["calibrate", "--points", "t.csv", "--model", "qwen3-32b", "--hardware", "p5en",
                                          "--out", "t.csv", "--overwrite"], "same file as the input"),
    Clash("calibrate-out-is-the-published", ["calibrate", "--published", "t.csv", "--model", "qwen3-32b", "--hardware",
                                             "p5en", "--out", "t.csv", "--overwrite"], "same file as the input"),
    Clash("calibrate-out-hardlink-of-log", ["calibrate", "--log", "t.csv", "--model", "qwen3-32b", "--hardware", "p5en",
                                            "--out", "l.json", "--overwrite"], "same file as the input",
          _hardlink("t.csv", "l.json")),
    Clash("compare-html-is-the-scenario", ["compare", "s.yaml", "--html", "s.yaml"], "same file as the input"),
    Clash("compare-html-is-the-scenario-overwrite", ["compare", "s.yaml", "--html", "s.yaml", "--overwrite"],
          "same file as the input"),
    Clash("compare-html-is-the-trace", ["compare", "s.yaml", "--trace", "t.csv", "--html", "t.csv", "--overwrite"],
          "same file as the input"),
    Clash("compare-html-is-an-empirical-file", ["compare", "s.yaml", "--html", "e.csv", "--overwrite"],
          "same file as the input", _empirical),
    Clash("sweep-csv-is-the-grid", ["sweep", "g.yaml", "--out", "r.parquet", "--csv", "g.yaml"], "same file as the input"),
    Clash("sweep-csv-is-the-base", ["sweep", "g.yaml", "--out", "r.parquet", "--csv", "base.yaml", "--overwrite"],
          "same file as the input"),
    Clash("sweep-csv-is-the-summary", ["sweep", "g.yaml", "--out", "r.parquet", "--csv", "r.summary.parquet"],
          "is also the path of"),
    Clash("sweep-out-hardlink-of-grid", ["sweep", "g.yaml", "--out", "h.parquet", "--overwrite"],
          "same file as the input", _hardlink("g.yaml", "h.parquet")),
    Clash("simulate-scenario-in-its-own-out", ["simulate", "D/scenario.yaml", "--out", "D", "--overwrite"],
          "is the input", _own_result),
    Clash("simulate-trace-in-its-own-out", ["simulate", "s.yaml", "--trace", "D/scenario.yaml", "--out", "D",
                                            "--overwrite"], "is the input", _own_result),
    Clash("reproduce-html-is-the-profile", ["reproduce", "--model", "qwen3-32b", "--profile", "b.json", "--html",
                                            "b.json", "--overwrite"], "same file as the input"),
    Clash("profile-derive-out-is-the-config", ["profile", "derive", "--model", "qwen3-32b", "--gpu", "h100-sxm", "--tp",
                                               "8", "--model-config", "cfg", "--out", "cfg/config.json", "--overwrite"],
          "--out", _model_config),
]


@pytest.mark.parametrize("case", CLASHES, ids=[c.id for c in CLASHES])
def test_an_output_never_replaces_an_input(tmp_path: Path, case: Clash) -> None:
    _inputs(tmp_path)
    case.setup(tmp_path)
    _assert_refused(tmp_path, case.argv, case.needle)


def _parts_user_file(d: Path) -> None:
    (d / "r.parts").mkdir()
    (d / "r.parts" / "mine.txt").write_text("keep")


def _parts_user_file_in_shard(d: Path) -> None:
    from kvplan.plan.grid import load_grid

    fp = load_grid(d / "g.yaml").fingerprint()
    (d / "r.parts" / "000000").mkdir(parents=True)
    (d / "r.parts" / "manifest.json").write_text(json.dumps({"fingerprint": fp}))
    (d / "r.parts" / "000000" / "notes.md").write_text("keep")


def _parts_user_json_part(d: Path) -> None:
    (d / "r.parts" / "000000").mkdir(parents=True)
    (d / "r.parts" / "manifest.json").write_text(json.dumps({"fingerprint": "x"}))
    (d / "r.parts" / "000000" / "0-0.json").write_text('["not a part"]')


def _parts_wrong_shard(d: Path) -> None:
    (d / "r.parts" / "000007").mkdir(parents=True)
    (d / "r.parts" / "manifest.json").write_text(json.dumps({"fingerprint": "x"}))
    (d / "r.parts" / "000007" / "0-0.json").write_text('{"error": null}')


def _parts_trash_user_file(d: Path) -> None:
    (d / ".r.parts.done").mkdir()
    (d / ".r.parts.done" / "mine.txt").write_text("keep")


def _parts_is_a_symlink(d: Path) -> None:
    (d / "elsewhere").mkdir()
    (d / "elsewhere" / "mine.txt").write_text("keep")
    (d / "r.parts").symlink_to("elsewhere")


PARTS = {"user-file": _parts_user_file, "user-file-in-shard": _parts_user_file_in_shard,
         "user-json-part": _parts_user_json_part, "part-in-wrong-shard": _parts_wrong_shard,
         "trash-user-file": _parts_trash_user_file, "symlink": _parts_is_a_symlink}


@pytest.mark.parametrize("resume", [False, True])
@pytest.mark.parametrize("kind", list(PARTS))
def test_sweep_never_removes_a_parts_directory_holding_a_user_file(tmp_path: Path, kind: str, resume: bool) -> None:
    _inputs(tmp_path)
    PARTS[kind](tmp_path)
    argv = ["sweep", "g.yaml", "--out", "r.parquet", "--workers", "1"] + (["--resume"] if resume else [])
    _assert_refused(tmp_path, argv, "r.parts")


def test_parts_gaining_a_user_file_during_a_sweep_are_kept(tmp_path: Path) -> None:
    from kvplan.plan.grid import load_grid
    from kvplan.plan.sweep import PartStore

    _inputs(tmp_path)
    store = PartStore(tmp_path / "r.parquet", load_grid(tmp_path / "g.yaml"))
    store.open(resume=False)
    store.commit(0, 0, {"error": None, "x": 1})
    (store.dir / "000000" / "notes.md").write_text("keep")
    store.remove()
    assert (store.dir / "000000" / "notes.md").read_text() == "keep"
    store.dir.joinpath("000000", "notes.md").unlink()
    store.remove()
    assert not store.dir.exists() and not (tmp_path / ".r.parts.done").exists()


# --- kvplan's own files: replaced without --overwrite; user files with it ---------------------------------------


def test_kvplan_replaces_its_own_file_and_only_with_overwrite_a_user_file(tmp_path: Path) -> None:
    from kvplan.app.cli import main

    _inputs(tmp_path)
    html = tmp_path / "x.html"
    args = ["workload", "show", str(tmp_path / "t.csv"), "--html", str(html)]
    assert main(args) == 0 and written_by_kvplan(html)
    assert main(args) == 0 and written_by_kvplan(html)  # its own: no --overwrite needed
    html.write_text("mine now")
    assert main(args) == 2 and html.read_text() == "mine now"
    assert main([*args, "--overwrite"]) == 0 and html.read_text() != "mine now" and written_by_kvplan(html)
    ledger = json.loads((tmp_path / LEDGER).read_text())
    assert list(ledger["files"]) == ["x.html"]
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == [LEDGER]  # no temp, no lock


def test_workload_fit_writes_both_files_as_its_own(tmp_path: Path) -> None:
    from kvplan.app.cli import main

    _inputs(tmp_path)
    out = tmp_path / "w.yaml"
    args = ["workload", "fit", str(tmp_path / "t.csv"), "--out", str(out)]
    assert main(args) == 0
    assert written_by_kvplan(out) and written_by_kvplan(tmp_path / "w.fit.json")
    assert main(args) == 0  # a re-fit replaces both without --overwrite


@pytest.mark.parametrize("kind", ["fifo", "directory", "dangling-symlink"])
def test_the_writer_itself_refuses_a_node_that_appeared_after_the_check(tmp_path: Path, kind: str) -> None:
    p = tmp_path / "x.html"
    KINDS[kind][0](p)
    before = _snapshot(tmp_path)
    with pytest.raises(KvplanInputError, match="--html"):
        atomic_write_bytes(p, b"data", "--html", overwrite=True)
    assert _snapshot(tmp_path) == before


def test_a_corrupt_or_hostile_ledger_makes_no_file_kvplans(tmp_path: Path) -> None:
    p = tmp_path / "x.html"
    p.write_bytes(b"mine")
    for text in ["{", "[]", json.dumps({"files": {"x.html": "yes"}}), "[" * 100_000, json.dumps({"files": []})]:
        (tmp_path / LEDGER).write_text(text)
        assert not written_by_kvplan(p)
        with pytest.raises(KvplanInputError, match="not written by kvplan"):
            atomic_write_bytes(p, b"data", "--html")
        assert p.read_bytes() == b"mine"
    with pytest.raises(KvplanInputError, match="not a file name"):
        atomic_write_bytes(tmp_path / LEDGER, b"{}", "--out", overwrite=True)


def _interrupting_ledger_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: int) -> Any:
    """Raise in the ``at``-th rename of a single-file write (ledger, file, ledger)."""
    import kvplan.atomic as atomic

    real = atomic._rename
    calls = [0]

    def rename(src: Any, dst: Any) -> None:
        calls[0] += 1
        if calls[0] == at:
            raise KeyboardInterrupt
        real(src, dst)

    monkeypatch.setattr(atomic, "_rename", rename)
    return calls


@pytest.mark.parametrize("at", [1, 2, 3])
def test_an_interrupted_single_file_write_leaves_old_or_new_and_kvplans(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                        at: int) -> None:
    p = tmp_path / "x.html"
    atomic_write_bytes(p, b"old")
    _interrupting_ledger_write(tmp_path, monkeypatch, at)
    with pytest.raises(KeyboardInterrupt):
        atomic_write_bytes(p, b"new")
    assert p.read_bytes() in (b"old", b"new") and written_by_kvplan(p)
    assert sorted(x.name for x in tmp_path.iterdir()) == [LEDGER, "x.html"]  # no temporary file left
