"""Bad output paths and bad numeric flags: one-line error, exit 2, nothing lost or half-written."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvplan.app.cli import main

DATA = Path(__file__).parent / "data"
TRACE = DATA / "traces" / "sessions_small.csv"
BENCH = DATA / "llm-d-2p1d__benchmark_2025-05-11_23-39-15.json"


def _err(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().err.strip()


def test_simulate_out_is_an_existing_file_is_kept(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "keep.txt"
    f.write_text("precious")
    assert main(["simulate", "--out", str(f)]) == 2
    assert "not a directory" in _err(capsys)
    assert f.read_text() == "precious"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--out", "/dev/null/x"],
        ["simulate", "--out", "{tmp}/o", "--seed", "-1"],
        ["workload", "fit", str(TRACE), "--out", "{tmp}"],
        ["workload", "fit", str(TRACE), "--out", "/dev/null/w.yaml"],
        ["workload", "show", str(TRACE), "--html", "/dev/null/x.html"],
        ["workload", "show", str(TRACE), "--threshold", "-1"],
        ["calibrate", "--bench", str(BENCH), "--model", "qwen3-32b", "--hardware", "p5en", "--out", "{tmp}"],
        ["capacity", "--rate", "1", "--slo-ttft-p90-ms", "500", "--replications", "0"],
        ["recommend", "--workload", "chat", "--workers", "-3"],
    ],
)
def test_bad_paths_and_flags_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(args) == 2
    assert "Traceback" not in _err(capsys)
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not any(p.name.endswith(".tmp") for p in tmp_path.parent.iterdir())


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--trace", str(TRACE), "--out", ""],
        ["simulate", "--trace", str(TRACE), "--out="],
        ["simulate", "", "--out", "o"],
        ["sweep", "g.yaml", "--out", ""],
        ["sweep", "g.yaml", "--out", "r.parquet", "--csv", ""],
        ["compare", "--policies", "off,ttl", "--html", ""],
        ["reproduce", "--html", ""],
        ["workload", "show", str(TRACE), "--html", ""],
        ["workload", "fit", str(TRACE), "--out", ""],
        ["workload", "show", ""],
        ["calibrate", "--bench", str(BENCH), "--bench", "", "--out", "p.json"],
    ],
)
def test_an_empty_path_is_refused_not_read_as_the_current_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, argv: list[str]
) -> None:
    # typer reads "" as Path("") == Path("."): simulate --out "" wrote its results into the current directory
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = _err(capsys)
    assert err.startswith("error: ") and "\n" not in err and "is empty" in err, err
    assert list(tmp_path.iterdir()) == []


def test_an_empty_model_config_is_refused_not_read_from_the_current_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "config.json").write_text('{"architectures": ["X"]}')  # a config.json in the current directory
    monkeypatch.chdir(tmp_path)
    argv = ["profile", "derive", "--model", "qwen3-32b", "--gpu", "h100", "--tp", "1", "--out", "p.json"]
    assert main([*argv, "--model-config", ""]) == 2
    assert _err(capsys) == ("error: --model-config: is empty; give the directory of a Hugging Face model's "
                            "config.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]


@pytest.mark.parametrize("args", [["workload", "fit", "{trace}", "--out", "."], ["workload", "fit", "{trace}", "--out", "/"],
                                  ["sweep", "{grid}", "--out", "."]])
def test_an_output_path_naming_a_directory_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                       args: list[str]) -> None:
    """`workload fit --out .` / `--out /` and `sweep --out .` ended in a traceback (a path without a file name)."""
    trace = tmp_path / "t.csv"
    trace.write_text("session_id,timestamp_s,input_tokens,output_tokens\na,0,100,5\na,3,150,5\n")
    grid = tmp_path / "g.yaml"
    grid.write_text("base: {}\naxes: {}\n")
    argv = [a.format(trace=trace, grid=grid) for a in args]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out") and err.count("\n") == 1 and "Traceback" not in err, err


@pytest.mark.parametrize(
    "args",
    [
        ["sweep", "{grid}", "--out", "{tmp}/r.parquet", "--workers", "1", "--csv", "/proc/kvplan-qa.csv"],
        ["sweep", "{grid}", "--out", "/proc/kvplan-qa/r.parquet", "--workers", "1"],
        ["compare", "--workload", "chat", "--conversations", "5", "--replications", "1", "--policies", "off",
         "--html", "/proc/kvplan-qa.html"],
        ["workload", "show", str(TRACE), "--html", "/proc/kvplan-qa.html"],
        ["workload", "fit", str(TRACE), "--out", "/proc/kvplan-qa.yaml"],
        ["reproduce", "--html", "/proc/kvplan-qa.html"],
    ],
)
def test_an_output_in_an_unwritable_directory_is_refused_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str]
) -> None:
    """`sweep --csv` / `compare --html` into a directory nobody can create files in (/proc: not even root) ran every
    simulation, printed the results and only then failed to write: the directory is checked before any work."""
    grid = tmp_path / "g.yaml"
    grid.write_text("base: {workload: {conversations: 3}}\naxes: {policy.decoder_kv_blocks_ttl_s: [30, 60]}\n")
    argv = [a.format(grid=grid, tmp=tmp_path) for a in args]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: --") and err.count("\n") == 1 and "cannot write in" in err, (out, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.yaml"]


@pytest.mark.parametrize(
    "argv",
    [
        ["capacity", "--slo-ttft-p90-ms", "500", "--model", "gpt-9"],
        ["recommend", "--workload", "chat", "--model", "gpt-9"],
        ["recommend", "--workload", "chat", "--hardware", "gpt-9"],
        ["recommend", "--trace", "/nonexistent/t.csv"],
        ["compare", "--workload", "chat", "--slo-ttft-p90-ms", "nan"],
    ],
)
def test_an_input_error_found_inside_the_planner_is_exactly_one_line(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """These are found after the progress bar was entered, before any run: stopping the never-shown bar printed a
    blank line to stderr ahead of the error."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, repr(err)


HUGE = "100000000000000000000"  # 1e20 as an integer: typer parses it, only a bound refuses it


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["workload", "show", str(TRACE), "--threshold", HUGE], "--threshold"),
        (["workload", "show", str(TRACE), "--threshold", str(2**31)], "--threshold"),
        (["cost", "--tokens", "1000", "--chunk-tokens", HUGE], "--chunk-tokens"),
        (["calibrate", "--bench", str(BENCH), "--model", "qwen3-32b", "--hardware", "p5en", "--out", "{tmp}/p.json",
          "--chunk-tokens", HUGE], "--chunk-tokens"),
    ],
)
def test_absurd_token_flags_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
                                        flag: str) -> None:
    """A token count far beyond any context (or the scenario field's own bound) is one line naming the flag."""
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"error: {flag}: ") and captured.err.count("\n") == 1, captured.err
    assert captured.out == ""
    assert list(tmp_path.iterdir()) == []


def test_an_os_error_on_a_path_with_a_newline_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A path the OS refuses (here: a name longer than NAME_MAX) is reported from its OSError, whose file name
    may hold a newline; the message stays one line like every other error."""
    name = tmp_path / ("a\nb" + "x" * 300)
    assert main(["simulate", str(name), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot access") and "File name too long" in err and err.count("\n") == 1, err


@pytest.mark.parametrize("target", ["scenario", "profile"])
def test_calibrate_scenario_out_is_never_one_of_its_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str], target: str) -> None:
    """``calibrate --bench F --scenario S.yaml --out X --overwrite``: X the scenario itself, or the profile JSON the
    scenario reads, is refused before any work (the fit ran for seconds, then the write was refused for the
    scenario, and a profile the scenario read was replaced)."""
    import kvplan.calibration.sim_fit as sim_fit

    def no_fit(*_a: object, **_k: object) -> None:
        raise AssertionError("the fit started")

    monkeypatch.setattr(sim_fit, "fit_scenario", no_fit)
    prof = tmp_path / "start.json"
    prof.write_text((Path(__file__).parents[1] / "models" / "profiles" / "p5en-qwen3-32b.json").read_text())
    sc = tmp_path / "s.yaml"
    sc.write_text((DATA / "llmd-2p1d-a100.scenario.yaml").read_text() + f"profile: {prof}\n")
    out = sc if target == "scenario" else prof
    before = out.read_bytes()
    assert main(["calibrate", "--bench", str(BENCH), "--scenario", str(sc), "--out", str(out), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: --out {out}: is the same file as the input") and err.count("\n") == 1, err
    assert out.read_bytes() == before


@pytest.mark.parametrize(("profile_name", "out_name"), [("start.json", "start.json"), ("w.fit.json", "w.yaml")])
def test_workload_fit_never_replaces_a_file_its_scenario_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              profile_name: str, out_name: str) -> None:
    """``workload fit T --scenario S.yaml --out X --overwrite`` with X (or its report X.fit.json) the profile JSON that
    S.yaml names: the profile was replaced by the fitted YAML or the report (only T and S.yaml counted as inputs)."""
    prof = tmp_path / profile_name
    prof.write_text((Path(__file__).parents[1] / "models" / "profiles" / "p5en-qwen3-32b.json").read_text())
    before = prof.read_bytes()
    sc = tmp_path / "s.yaml"
    sc.write_text(f"profile: {prof}\n")
    assert main(["workload", "fit", str(TRACE), "--scenario", str(sc), "--out", str(tmp_path / out_name),
                 "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "is the same file as the input" in err and err.count("\n") == 1, err
    assert prof.read_bytes() == before and not (tmp_path / "w.yaml").exists()


@pytest.mark.parametrize(("flags", "message"), [
    (["--conversations", "0"], "error: --conversations: is 0; give an integer in 1..1,000,000\n"),
    (["--conversations", "100000000"], "error: --conversations: is 100,000,000; give an integer in 1..1,000,000\n"),
    (["--replications", "1001"], "error: --replications: is 1,001; give an integer in 1..1,000\n"),
    (["--slo-ttft-p90-ms", "nan"], "error: --slo-ttft-p90-ms: is nan; give a finite number > 0 and at most 1e+10\n"),
    (["--usd-per-node-hour", "inf"], "error: --usd-per-node-hour: is inf; give a finite number >= 0 and at most 1e+06\n"),
])
def test_compare_checks_its_flags_like_recommend(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                flags: list[str], message: str) -> None:
    """``compare S.yaml --conversations 0`` said "scenario with overrides: field 'workload.conversations': Input should
    be greater than 0" (a scenario field, not the flag); its run flags now go through the checks recommend and
    capacity share (app/flags.py), before any work."""
    sc = tmp_path / "s.yaml"
    sc.write_text("workload: {conversations: 3}\n")
    assert main(["compare", str(sc), *flags]) == 2
    assert capsys.readouterr().err == message
