"""A scenario or grid path on procfs (helper in15): `kvplan simulate /proc/kmsg` (readable by root) blocked in the
read forever, and /proc/self/status was parsed as a scenario ('field Name: unknown field'). Like every other input
file, a kernel file that says 0 bytes is refused from stat, unread, in one line."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hostile import run_limited


@pytest.mark.parametrize("cmd", [["simulate", "{p}", "--out", "{d}/o"], ["sweep", "{p}", "--out", "{d}/r.parquet"]])
def test_proc_status_is_refused_unread(tmp_path: Path, cmd: list[str]) -> None:
    if not os.path.ismount("/proc"):
        pytest.skip("no procfs")
    res = run_limited([a.replace("{p}", "/proc/self/status").replace("{d}", str(tmp_path)) for a in cmd], tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.code == 2 and len(lines) == 1, res.stderr[-500:]
    assert "/proc/self/status: is a special file of the kernel" in lines[0] and "copy its content" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.skipif(not os.access("/proc/kmsg", os.R_OK), reason="/proc/kmsg is readable by root only")
def test_proc_kmsg_does_not_hang(tmp_path: Path) -> None:
    res = run_limited(["simulate", "/proc/kmsg", "--out", str(tmp_path / "o")], tmp_path, time_limit_s=10)
    assert res.code == 2, (res.code, res.stderr[-300:])  # None: killed at the time limit (the read blocked)
    assert "special file of the kernel" in res.stderr
