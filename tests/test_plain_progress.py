"""With stderr not a terminal (a log file, a CI job) the long commands print a plain progress line now and then: rich
draws nothing there until the end, so a 694 s capacity run said nothing at all while it ran (helper in15)."""

from __future__ import annotations

import io

from kvplan.app.cmd_sweep import _plain_progress


def test_plain_progress_lines_are_spaced_and_end_with_the_last_run() -> None:
    t = [0.0]
    out = io.StringIO()
    cb = _plain_progress(out, every_s=30.0, clock=lambda: t[0])
    for done, at in ((1, 5.0), (2, 31.0), (3, 40.0), (4, 75.0), (5, 76.0)):
        t[0] = at
        cb(done, 5)
    assert out.getvalue().splitlines() == ["simulating: 2/5 runs, 0m31s elapsed", "simulating: 4/5 runs, 1m15s elapsed",
                                           "simulating: 5/5 runs, 1m16s elapsed"]


def test_the_sweep_progress_is_plain_when_stderr_is_not_a_terminal(capsys: object) -> None:
    from kvplan.app.cmd_sweep import _progress_bar

    shown, cb = _progress_bar()  # pytest captures stderr: not a terminal
    with shown:
        cb(3, 3)
    assert "simulating: 3/3 runs" in capsys.readouterr().err  # type: ignore[attr-defined]
