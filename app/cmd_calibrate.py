"""``kvplan calibrate``: fit a profile from real vLLM/NIXL files, or from the published P5en points.

Regenerate the shipped profiles (deterministic, ~10 s each; ``benchmarks/bench_calibrate.py`` times it)::

    kvplan calibrate --published calibration/data/p5en_published.csv --model qwen3-32b --hardware p5en \\
        --out models/profiles/p5en-qwen3-32b.json --overwrite
    kvplan calibrate --published calibration/data/p5en_published.csv --model glm-5-fp8 --hardware p5en \\
        --out models/profiles/p5en-glm-5-fp8.json --overwrite
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer

CALIBRATE_HELP = """Fit a profile (cost-model parameters, their standard errors, fit report, provenance) and write it
to --out (atomically). Files: --bench (vllm bench serve --save-result [--save-detailed] JSON), --multiturn
(benchmark_serving_multi_turn --stats-json-output), --log (vLLM engine log with 'KV Transfer metrics' and/or
the disagg proxy log), --prometheus (text exposition, one or more scrapes), --points (CSV
kind,tokens,cached_tokens,value_ms). Parameters the files cannot identify are held at the shipped profile of
the model and hardware and named in the report. --bench/--multiturn fits without --scenario are written with
status 'unreliable' (a serving TTFT is not an engine time).

With --scenario S.yaml (the measured deployment: model, hardware, TP, P/D or replicas, policy) the --bench or
--multiturn runs are simulated and prefill/decode GPU scales (and the proxy leg where identifiable) fitted to
their TTFT/TPOT statistics; a self-check simulates the result and writes 'unreliable' (refused by simulate
without --allow-unreliable-profile) when a mean misses by more than 15% or a scale leaves its limits:

\b
  kvplan calibrate --bench tests/data/llm-d-2p1d__benchmark_2025-05-11_23-39-15.json \\
      --scenario tests/data/llmd-2p1d-a100.scenario.yaml --out p4de-llama-3.1-8b.json

With --published CSV (model,series,prompt_tokens,value_ms,note, e.g. calibration/data/p5en_published.csv) the
profile is fitted by simulating the published P5en benchmark instead (how the shipped profiles are made):

\b
  kvplan calibrate --published calibration/data/p5en_published.csv --model qwen3-32b --hardware p5en \\
      --out models/profiles/p5en-qwen3-32b.json --overwrite
"""


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""

    @app.command("calibrate", help=CALIBRATE_HELP, short_help="Fit a cost profile from real vLLM/NIXL output.")
    def calibrate_cmd(
        bench: list[Path] | None = typer.Option(None, "--bench", help="vllm bench serve result JSON (repeatable)."),
        multiturn: list[Path] | None = typer.Option(None, "--multiturn", help="Multi-turn stats JSON (repeatable)."),
        log: list[Path] | None = typer.Option(None, "--log", help="vLLM engine or disagg proxy log (repeatable)."),
        prometheus: list[Path] | None = typer.Option(None, "--prometheus", help="Prometheus text (repeatable)."),
        points: list[Path] | None = typer.Option(None, "--points", help="Points CSV (repeatable)."),
        published: Path | None = typer.Option(None, "--published", help="Published-points CSV: simulation-based fit."),
        scenario: list[Path] | None = typer.Option(
            None, "--scenario",
            help="Scenario YAML of the measured deployment (model, hardware, TP, P/D or replicas, policy): fit by "
            "simulating the run of each --bench/--multiturn file. One for every file, or one per file in order.",
        ),
        model: str | None = typer.Option(None, "--model", help="Model preset (qwen3-32b, ...; with --scenario: its)."),
        hardware: str | None = typer.Option(None, "--hardware", help="Hardware preset (p5en, ...; with --scenario: its)."),
        out: Path = typer.Option(..., "--out", help="Profile JSON to write."),
        tp: int | None = typer.Option(
            None, "--tp", min=1, help="TP of the measured deployment (default 8; with --scenario: its)."
        ),
        chunk_tokens: int = typer.Option(8192, "--chunk-tokens", min=1, help="max_num_batched_tokens of the runs."),
        vllm_version: str | None = typer.Option(None, "--vllm-version", help="vLLM version, for provenance."),
        include_first_turn: bool = typer.Option(
            False, "--include-first-turn", help="--published: average every turn (default: turns 2..5, warm-up off)."
        ),
        json_out: bool = typer.Option(False, "--json", help="Print the fit report as JSON."),
        overwrite: bool = typer.Option(
            False, "--overwrite", help="Replace an existing output file kvplan did not write (its own it replaces anyway)."
        ),
        allow_model_mismatch: bool = typer.Option(
            False, "--allow-model-mismatch",
            help="Fit --bench files of another model_id anyway; the profile is labelled status 'proxy', not calibrated.",
        ),
    ) -> None:
        from kvplan.app.flags import int_range
        from kvplan.atomic import check_output_file
        from kvplan.errors import input_error
        from kvplan.models.arch import get_model
        from kvplan.models.hardware import get_hardware
        from kvplan.models.profile import save_profile, with_recorded_inputs
        from kvplan.sim.scenario import MAX_TOKENS

        int_range("--chunk-tokens", chunk_tokens, 1, MAX_TOKENS)  # deployment.max_num_batched_tokens' range
        if not out.parent.is_dir():
            raise input_error(f"--out {out}", "the directory does not exist", "create it first")
        traces = {"bench": bench, "multiturn": multiturn, "log": log, "prometheus": prometheus, "points": points}
        inputs: list[Path | str | None] = [published, *(f for files in traces.values() for f in files or [])]
        if scenario:  # the scenarios and every file they read (a profile JSON, a trace) are inputs too
            from kvplan.plan.grid import scenario_input_files
            from kvplan.sim.scenario import load_scenario

            inputs += [*scenario, *(f for p in scenario for f in scenario_input_files(load_scenario(p)))]
        check_output_file(out, "--out", inputs=inputs, overwrite=overwrite)  # before any work
        if scenario:
            from kvplan.app.calibrate_sim import calibrate_by_simulation

            calibrate_by_simulation(scenario, traces, model, hardware, tp, out, json_out, allow_model_mismatch,
                                    overwrite=overwrite, inputs=inputs)
            return
        if model is None or hardware is None:
            raise input_error("--model" if model is None else "--hardware", "missing", "give --model and --hardware, "
                              "or --scenario S.yaml (which names them)")
        tp = 8 if tp is None else tp
        arch = get_model(model)
        node = get_hardware(hardware)
        if published is not None:
            if any(traces.values()):
                raise input_error("--published", "cannot be combined with trace files", "run two calibrations")
            _published(published, arch.name, node.name, tp, out, include_first_turn, json_out, overwrite)
            return
        from kvplan.app.output import warn_unreliable
        from kvplan.calibration.calibrate import calibrate
        from kvplan.calibration.checks import check_bench_model
        from kvplan.sim.results import json_safe
        from kvplan.sim.validity import check_tensor_parallel

        check_tensor_parallel(arch, tp, "--tp")
        foreign = [m for m in (check_bench_model(b, arch, allow=allow_model_mismatch) for b in bench or []) if m]
        result = calibrate(
            arch.name,
            node.name,
            bench=bench or [],
            multiturn=multiturn or [],
            log=log or [],
            prometheus=prometheus or [],
            points=points or [],
            tp=tp,
            chunk_tokens=chunk_tokens,
            vllm_version=vllm_version,
        )
        if foreign:
            note = (f"PROXY: fitted to measurements of {', '.join(sorted(set(foreign)))}, not {arch.name} "
                    "(--allow-model-mismatch); not a calibration of this model")
            status = "proxy" if result.profile.status == "calibrated" else result.profile.status
            prof = result.profile.model_copy(update={"status": status, "notes": [*result.profile.notes, note]})
            result = dataclasses.replace(result, profile=prof)
            result.report.setdefault("notes", []).append(note)
        # the input files as paths from the profile's directory, not this machine's absolute paths
        save_profile(with_recorded_inputs(result.profile, out), out, overwrite=overwrite, inputs=inputs)
        if result.profile.status == "unreliable":
            warn_unreliable(result.report.get("unreliable_reasons", []), out)
        if json_out:
            typer.echo(json.dumps(json_safe(result.report), indent=2, sort_keys=True))
            return
        _print_trace_report(result, out)


def _published(path: Path, model: str, hardware: str, tp: int, out: Path, include_first: bool, json_out: bool,
               overwrite: bool = False) -> None:
    from kvplan.app.output import console
    from kvplan.calibration.calibrate import sha256_of
    from kvplan.calibration.published import Aggregation, fit_published, published_points
    from kvplan.models.profile import save_profile
    from kvplan.sim.results import json_safe

    points = published_points(str(path))
    fit = fit_published(
        model,
        points,
        hardware=hardware,
        tp=tp,
        aggregation=Aggregation(skip_first_turn=not include_first),
        source_sha256=sha256_of(path),
        source_name=path.name,
        progress=None if json_out else (lambda msg: console().print(msg)),
    )
    save_profile(fit.profile, out, overwrite=overwrite, inputs=[path])
    if fit.profile.status == "unreliable":
        from kvplan.app.output import warn_unreliable

        warn_unreliable(fit.report.get("unreliable_reasons", []), out)
    if json_out:
        typer.echo(json.dumps(json_safe(fit.report), indent=2, sort_keys=True))
        return
    from rich.table import Table

    c = console()
    t = Table(title=f"kvplan calibrate --published: {model} on {hardware} (TP{tp})")
    for col in ("series", "prompt_tokens", "published_ms", "simulated_ms", "rel_error", "tolerance", "within"):
        t.add_column(col, justify="right" if col != "series" else "left")
    for r in fit.report["points"]:
        t.add_row(r["series"], str(r["prompt_tokens"]), f"{r['published_ms']:.0f}", f"{r['simulated_ms']:.1f}",
                  f"{r['rel_error']:+.1%}", f"{r['tolerance']:.0%}", "yes" if r["within"] else "NO")
    c.print(t)
    ratio = fit.report["ttft_ratio_at_longest_prompt"]
    if ratio:
        c.print(f"TTFT ON/OFF at {ratio['prompt_tokens']}: published {ratio['published']:.3f}, simulated "
                f"{ratio['simulated']:.3f} ({ratio['rel_error']:+.1%}, tolerance 10%)")
    p = Table(title="parameters (posterior sd / prior sd < 0.5: identified by the data)")
    for col in ("parameter", "value", "std error", "prior", "post/prior sd", "identified"):
        p.add_column(col)
    for row in fit.report["params"]:
        se = row["stderr"]
        p.add_row(row["name"], f"{row['value']:.4g}", f"{se:.2g}" if se is not None else "-", f"{row['prior']:.3g}",
                  f"{row['posterior_over_prior_sd']:.2f}" if row["posterior_over_prior_sd"] is not None else "-",
                  "yes" if row["identified_by_data"] else "no (prior)")
    for row in fit.report["fixed"]:
        p.add_row(row["name"], f"{row['value']:.4g}", "-", "fixed", "-", "no (fixed)")
    c.print(p)
    for note in fit.profile.notes:
        c.print(f"note: {note}")
    c.print(f"wrote {out}")


def _print_trace_report(result: object, out: Path) -> None:
    from rich.table import Table

    from kvplan.app.output import console
    from kvplan.calibration.calibrate import CalibrationResult, report_lines

    assert isinstance(result, CalibrationResult)
    c = console()
    prof = result.profile
    t = Table(title=f"kvplan calibrate: {prof.model} on {prof.hardware} (TP{prof.tensor_parallel_size})")
    for col in ("parameter", "value", "std error", "rel. error", "status"):
        t.add_column(col)
    for row in report_lines(result):
        t.add_row(*row)
    c.print(t)
    for key, mape in result.report["mape_pct"].items():
        c.print(f"MAPE {key}: {mape:.2f}%")
    for key, desc in result.report.get("descriptive", {}).items():
        c.print(f"{key}: {desc}")
    for note in result.report["notes"]:
        c.print(f"note: {note}")
    held = result.report.get("held_from_base") or []
    if held:
        c.print(f"held at the base profile ({result.report['base_profile']}): {', '.join(held)}")
    c.print(f"wrote {out}")


