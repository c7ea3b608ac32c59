"""Files under the names of kvplan's own records (helper in15): a user's '.kvplan-outputs.json' (the per-directory
ledger of the files kvplan wrote) was written over by any single-file output into that directory, --overwrite or
not, and a user's '.kvplan-result.json' (a result directory's manifest) was replaced by `simulate --overwrite`. A
record kvplan writes is a JSON object with "writer": "kvplan"; anything else under those names is the user's: the
command is refused before any work, in one line, and the file is kept byte for byte."""

from __future__ import annotations

from pathlib import Path

import pytest
from hostile import SMALL_SCENARIO, run_limited

TRACE = Path(__file__).parent / "data" / "traces" / "sessions_small.csv"
SCENARIO = SMALL_SCENARIO
MINE = [b"my notes\n", b'{"files": {}}\n', b'{"writer": "me", "files": {}}\n', b"[1, 2]\n"]


def _refused(tmp_path: Path, argv: list[str], needle: str) -> None:
    res = run_limited(argv, tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.code == 2 and "Traceback" not in res.stderr, res.stderr[-800:]
    assert len(lines) == 1 and needle in lines[0], lines


@pytest.mark.parametrize("overwrite", [False, True])
@pytest.mark.parametrize("content", MINE, ids=["text", "files-only", "other-writer", "array"])
def test_a_users_ledger_name_is_never_written_over(tmp_path: Path, content: bytes, overwrite: bool) -> None:
    (tmp_path / ".kvplan-outputs.json").write_bytes(content)
    argv = ["workload", "show", str(TRACE), "--html", str(tmp_path / "x.html"), *(["--overwrite"] * overwrite)]
    _refused(tmp_path, argv, "its directory holds '.kvplan-outputs.json', which was not written by kvplan")
    assert (tmp_path / ".kvplan-outputs.json").read_bytes() == content
    assert not (tmp_path / "x.html").exists()


@pytest.mark.parametrize("name", [".kvplan-result.json", ".kvplan-commit.json"])
def test_a_users_manifest_name_in_a_result_dir_is_kept(tmp_path: Path, name: str) -> None:
    (tmp_path / "s.yaml").write_text(SCENARIO)
    out = tmp_path / "o"
    out.mkdir()
    (out / name).write_bytes(b"mine\n")
    _refused(tmp_path, ["simulate", str(tmp_path / "s.yaml"), "--out", str(out), "--overwrite"],
             f"holds '{name}', which kvplan did not write there")
    assert sorted(p.name for p in out.iterdir()) == [name]
    assert (out / name).read_bytes() == b"mine\n"


def test_kvplans_own_records_still_let_it_replace_its_files(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(SCENARIO)
    html = tmp_path / "x.html"
    for _ in range(2):  # the second run replaces its own file (its ledger is kvplan's)
        assert run_limited(["workload", "show", str(TRACE), "--html", str(html)], tmp_path).code == 0
    out = tmp_path / "o"
    for extra in ([], ["--overwrite"]):
        res = run_limited(["simulate", str(tmp_path / "s.yaml"), "--out", str(out), *extra], tmp_path)
        assert res.code == 0, res.stderr[-500:]
    assert (out / ".kvplan-result.json").exists() and (tmp_path / ".kvplan-outputs.json").exists()
