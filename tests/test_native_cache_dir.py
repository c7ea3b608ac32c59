"""``kvplan native build`` with ``KVPLAN_NATIVE_DIR`` naming a file (or a place that cannot be created) is refused in
one line before the ~30 s compile, and the file is left as it was (the compile ran first, then the build failed on
the staging directory with an OSError)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.app.cli import main
from kvplan.sim import native


def test_a_file_as_the_build_cache_is_refused_before_compiling(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    def no_compile(*_a: object, **_k: object) -> None:
        raise AssertionError("the compile started")

    monkeypatch.setattr(native.tempfile, "TemporaryDirectory", no_compile)  # where the compile starts
    user = tmp_path / "notes.txt"
    user.write_text("precious")
    monkeypatch.setenv(native.ENV_DIR, str(user))
    assert main(["native", "build"]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"error: KVPLAN_NATIVE_DIR {user}: is not a directory; point KVPLAN_NATIVE_DIR at a "
                            "directory (or unset it)\n")
    assert "compiling" not in captured.out and user.read_text() == "precious"
    monkeypatch.setenv(native.ENV_DIR, str(user / "sub"))
    assert main(["native", "build"]) == 2
    assert "cannot be created" in capsys.readouterr().err
