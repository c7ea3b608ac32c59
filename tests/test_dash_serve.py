"""Issue 22 item 4: the dashboard reads typed server paths only under ``--serve-dir`` and never shows a file's
content (AppTest; the same in a real browser is in test_browser.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from kvplan.app import dash_serve
from kvplan.app.cmd_dashboard import DASHBOARD_SCRIPT, check_serve_dir, serve_env
from kvplan.errors import KvplanInputError

TRACES = Path(__file__).parent / "data" / "traces"
SECRET = "KVPLAN-SECRET-7f3a9c"


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "served"
    root.mkdir()
    (root / "good.csv").write_bytes((TRACES / "sessions_small.csv").read_bytes())
    (root / "secret.txt").write_text(f"root:{SECRET}:19000:0:99999:7:::\n")
    (root / "secret.json").write_text('{"' + SECRET + '": [1, 2]}\n')
    (root / "sub").mkdir()
    (tmp_path / "outside.csv").write_text(f"{SECRET},1,2\n")
    os.symlink(tmp_path / "outside.csv", root / "link.csv")
    monkeypatch.setenv(dash_serve.SERVE_DIR_ENV, str(root))
    yield root


def _whatif(typed: str | None = None) -> AppTest:
    at = AppTest.from_file(str(DASHBOARD_SCRIPT), default_timeout=120)
    at.run()
    at.selectbox(key="sc_workload").select("replay a trace file").run()
    if typed is not None:
        at.text_input(key="sc_trace_path").input(typed).run()
    return at


def _page_text(at: AppTest) -> str:
    parts = [e.value for e in at.error] + [c.value for c in at.caption] + [m.value for m in at.markdown]
    return "\n".join(str(p) for p in parts)


def test_no_serve_dir_means_no_path_input(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(dash_serve.SERVE_DIR_ENV, raising=False)
    at = _whatif()
    assert not at.exception
    assert not [t for t in at.text_input if t.key == "sc_trace_path"]  # nothing to type a server path into
    assert any("--serve-dir" in c.value for c in at.caption)
    with pytest.raises(KvplanInputError, match="reads no server path"):
        dash_serve.served_path("/etc/passwd")


@pytest.mark.parametrize("typed", ["/etc/shadow", "/etc/passwd", "../outside.csv", "link.csv", "/proc/self/environ",
                                   "sub", "/dev/zero", "missing.csv", "~/.bashrc", "secret.txt\x00.csv"])
def test_paths_outside_or_not_files_are_refused_alike(served: Path, typed: str) -> None:
    at = _whatif(typed)
    assert not at.exception
    assert len(at.error) == 1 and len(at.error[0].value.splitlines()) == 1
    msg = at.error[0].value
    assert "is not a regular file under the directory this dashboard serves" in msg, msg
    assert SECRET not in _page_text(at) and "root:" not in msg
    assert not at.metric  # nothing ran


@pytest.mark.parametrize("name", ["secret.txt", "secret.json"])
def test_served_file_that_is_not_a_trace_shows_no_content(served: Path, name: str) -> None:
    at = _whatif(name)
    assert not at.exception and len(at.error) == 1, [e.value for e in at.error]
    msg = at.error[0].value
    assert len(msg.splitlines()) == 1 and name in msg
    assert SECRET not in _page_text(at) and str(served) not in msg, msg


def test_served_trace_replays(served: Path) -> None:
    at = _whatif("good.csv")
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert at.metric


def test_redact_removes_excerpts_of_the_file(tmp_path: Path) -> None:
    f = tmp_path / "t.txt"
    f.write_text("root:*:19000:0:99999:7:::\nx\ty\n")
    msg = f"{f}: cannot tell the trace format from the first record 'root:*:19000:0:99999:7:::' (field 'session_id')"
    out = dash_serve.redact(msg, str(f))
    assert "root" not in out and "19000" not in out and str(tmp_path) not in out
    assert "'session_id'" in out  # a field name the file does not hold stays


def test_uploaded_trace_error_is_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(dash_serve.SERVE_DIR_ENV, raising=False)
    at = _whatif()
    at.file_uploader(key="sc_trace_upload").set_value(("t.csv", b"a,b\n1,2\n", "text/csv")).run()
    assert not at.exception and len(at.error) == 1 and len(at.error[0].value.splitlines()) == 1
    assert "t.csv" in at.error[0].value and "kvplan-dashboard" not in at.error[0].value


def test_serve_env_and_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(dash_serve.SERVE_DIR_ENV, "/")
    assert dash_serve.SERVE_DIR_ENV not in serve_env(None)  # an inherited value is never passed on
    assert serve_env(tmp_path)[dash_serve.SERVE_DIR_ENV] == os.path.realpath(tmp_path)
    with pytest.raises(KvplanInputError, match="--serve-dir"):
        check_serve_dir(tmp_path / "nope")


def test_a_weka_directory_under_the_root_is_served_and_one_reaching_outside_is_not(served: Path,
                                                                                  tmp_path: Path) -> None:
    """The README's `a directory is weka` holds in the dashboard: a folder of kv-cache-tester JSON files under the
    served directory replays; one holding a symlink to a JSON file outside it is refused like any outside path."""
    good = served / "agent"
    good.mkdir()
    (good / "a.json").write_bytes((TRACES / "weka_small.json").read_bytes())
    assert dash_serve.served_path("agent") == os.path.realpath(good)
    bad = served / "agent_bad"
    bad.mkdir()
    (tmp_path / "outside.json").write_bytes((TRACES / "weka_small.json").read_bytes())
    os.symlink(tmp_path / "outside.json", bad / "b.json")
    with pytest.raises(KvplanInputError):
        dash_serve.served_path("agent_bad")
    at = _whatif("agent")
    assert not at.exception and not at.error, _page_text(at)
