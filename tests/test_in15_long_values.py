"""A hostile value echoed back in an error (helper in15): a scenario whose model name is a 1,000,000-character string
printed a 1 MB 'error:' line (the same for --workload, a link name, ...). An error line keeps its head (where and
what) and tail (the fix) and says how much it left out, so every error stays a readable line."""

from __future__ import annotations

from pathlib import Path

from hostile import run_limited

from kvplan.errors import input_error

MAX_MESSAGE_CHARS = 2000  # kvplan.errors.MAX_MESSAGE_CHARS

SCENARIO = """model: {model}
hardware: p5en
workload:
  conversations: 5
  arrival: {{kind: poisson, rate_per_s: 1.0}}
  turns: {{dist: constant, value: 2}}
  prefix_tokens: {{dist: constant, value: 1000}}
  user_tokens: {{dist: constant, value: 100}}
  output_tokens: {{dist: constant, value: 20}}
  turn_gap_s: {{dist: exponential, mean: 5}}
"""


def test_megabyte_model_name_gives_a_short_error_line(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(SCENARIO.format(model="q" * 1_000_000))
    res = run_limited(["simulate", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o")], tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.code == 2 and len(lines) == 1, res.stderr[-500:]
    line = lines[0]
    assert len(line) <= MAX_MESSAGE_CHARS + 100
    assert line.startswith("error: model: unknown model 'qqq")
    assert "characters ...]" in line and line.endswith("or an inline spec")  # the fix is kept


def test_long_workload_argument(tmp_path: Path) -> None:
    res = run_limited(["recommend", "--workload", "w" * 100_000], tmp_path)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.code == 2 and len(lines) == 1 and len(lines[0]) <= MAX_MESSAGE_CHARS + 100, res.stderr[-300:]
    assert "use one of" in lines[0]


def test_short_messages_are_unchanged() -> None:
    msg = str(input_error("field 'x'", "is 'y' " + "z" * 1500, "use w"))
    assert msg == "field 'x': is 'y' " + "z" * 1500 + "; use w"


def test_long_unknown_command_and_option(tmp_path: Path) -> None:
    for argv in (["x" * 100_000], ["simulate", "--" + "y" * 100_000]):
        res = run_limited(argv, tmp_path)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert res.code == 2 and len(lines) == 1, res.stderr[-300:]
        assert len(lines[0]) <= MAX_MESSAGE_CHARS + 100 and lines[0].endswith("--help`"), lines[0][-200:]
