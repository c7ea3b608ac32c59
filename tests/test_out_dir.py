"""``kvplan simulate --out DIR`` never loses a file it did not write (issue 13, data loss)."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from kvplan.app.cli import main
from kvplan.atomic import RESULT_MANIFEST

OWN = {"turns.parquet", "summary.json", "pinned.parquet", "scenario.yaml", RESULT_MANIFEST}


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err.strip()


def _foreign(d: Path) -> dict[str, bytes]:
    (d / "sub").mkdir(parents=True)
    files = {"notes.txt": b"precious", "sub/deep.bin": b"\x00\x01keep"}
    for name, data in files.items():
        (d / name).write_bytes(data)
    return files


def _intact(d: Path, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        assert (d / name).read_bytes() == data, name


def test_non_empty_out_is_refused_and_left_intact(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "results"
    files = _foreign(d)
    before = sorted(str(p.relative_to(d)) for p in d.rglob("*"))
    assert main(["simulate", "--out", str(d)]) == 2
    err = _err(capsys)
    assert len(err.splitlines()) == 1 and "not empty" in err and "--overwrite" in err
    _intact(d, files)
    assert sorted(str(p.relative_to(d)) for p in d.rglob("*")) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results"]  # no temporary sibling left


def test_overwrite_keeps_foreign_files(tmp_path: Path) -> None:
    d = tmp_path / "results"
    files = _foreign(d)
    assert main(["simulate", "--out", str(d), "--overwrite"]) == 0
    _intact(d, files)
    assert OWN <= {p.name for p in d.iterdir()}
    manifest = json.loads((d / RESULT_MANIFEST).read_text())
    assert set(manifest["files"]) == OWN - {RESULT_MANIFEST}
    # a second overwrite replaces kvplan's own files and still keeps the others
    assert main(["simulate", "--out", str(d), "--overwrite", "--seed", "3"]) == 0
    _intact(d, files)
    assert json.loads((d / "summary.json").read_text())["seed"] == 3
    assert not [p for p in d.iterdir() if p.name.endswith(".tmp")]


def test_overwrite_refuses_a_foreign_file_with_a_result_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "results"
    d.mkdir()
    (d / "summary.json").write_text('{"mine": true}')
    assert main(["simulate", "--out", str(d), "--overwrite"]) == 2
    assert "did not write" in _err(capsys)
    assert (d / "summary.json").read_text() == '{"mine": true}'
    assert [p.name for p in d.iterdir()] == ["summary.json"]


def test_empty_existing_dir_and_new_dir_are_written(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["simulate", "--out", str(empty)]) == 0
    assert OWN == {p.name for p in empty.iterdir()}
    new = tmp_path / "a" / "b"
    assert main(["simulate", "--out", str(new)]) == 0
    assert OWN == {p.name for p in new.iterdir()}
    # a new directory gets ordinary permissions (not mkdtemp's 0700)
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(new.stat().st_mode) == 0o777 & ~umask
    # rerunning into kvplan's own result without --overwrite is refused too (the directory is not empty)
    assert main(["simulate", "--out", str(new)]) == 2


@pytest.mark.parametrize("out", ["", "  "])
def test_empty_out_name_is_refused(out: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("x")
    assert main(["simulate", "--out", out]) == 2
    assert "--out" in _err(capsys)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_out_dot_is_refused_without_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keep.txt").write_text("x")
    assert main(["simulate", "--out", "."]) == 2
    assert "not empty" in _err(capsys)
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def test_sweep_never_deletes_a_foreign_parts_directory(tmp_path: Path) -> None:
    from kvplan.errors import KvplanInputError
    from kvplan.plan.grid import load_grid
    from kvplan.plan.sweep import PartStore

    grid_file = tmp_path / "g.yaml"
    grid_file.write_text("base: {}\naxes:\n  policy.decoder_kv_blocks_ttl_s: [60, 120]\n")
    out = tmp_path / "r.parquet"
    parts = tmp_path / "r.parts"
    parts.mkdir()
    (parts / "mine.txt").write_text("keep")
    with pytest.raises(KvplanInputError, match="not written by kvplan"):
        PartStore(out, load_grid(grid_file)).open(resume=False)
    assert (parts / "mine.txt").read_text() == "keep"
