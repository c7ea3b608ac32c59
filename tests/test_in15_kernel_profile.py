"""A profile JSON (--profile, a scenario's profile:) or a --model-config config.json on procfs (helper in15): read
without a look at what it is, so /proc/kmsg (readable by root) blocked `kvplan cost`, `simulate`, `reproduce` and
`profile derive` forever. Refused from stat, unread, in one line, as every other input file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hostile import run_limited

KMSG_READABLE = os.access("/proc/kmsg", os.R_OK)


def _refused(tmp_path: Path, argv: list[str], needle: str) -> None:
    res = run_limited(argv, tmp_path, time_limit_s=10)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.code == 2, (res.code, res.stderr[-300:])  # None: killed at the time limit (the read blocked)
    assert len(lines) == 1 and needle in lines[0], lines


@pytest.mark.parametrize("path", ["/proc/self/status", "/proc/kmsg"])
def test_profile_on_procfs(tmp_path: Path, path: str) -> None:
    if path == "/proc/kmsg" and not KMSG_READABLE:
        pytest.skip("/proc/kmsg is readable by root only")
    _refused(tmp_path, ["cost", "--profile", path, "--tokens", "10"], f"{path}: is a special file of the kernel")


@pytest.mark.parametrize("path", ["/proc/self/status", "/proc/kmsg"])
def test_model_config_on_procfs(tmp_path: Path, path: str) -> None:
    if path == "/proc/kmsg" and not KMSG_READABLE:
        pytest.skip("/proc/kmsg is readable by root only")
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").symlink_to(path)
    _refused(tmp_path, ["profile", "derive", "--model", "mine", "--gpu", "h200", "--tp", "8", "--out",
                        str(tmp_path / "o.json"), "--model-config", str(tmp_path / "cfg")],
             "is a special file of the kernel")
