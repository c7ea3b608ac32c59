"""``kvplan calibrate --scenario``: the CLI side of calibration through the simulator (``calibration/sim_fit.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer


def _pair_scenarios(scenarios: list[Path], n_files: int) -> list[Path]:
    from kvplan.errors import input_error

    if len(scenarios) == 1:
        return scenarios * n_files
    if len(scenarios) != n_files:
        raise input_error("--scenario", f"{len(scenarios)} scenarios for {n_files} file(s)",
                          "give one --scenario for every file, or one per file in order (--bench files first)")
    return scenarios


def calibrate_by_simulation(scenarios: list[Path], traces: dict[str, list[Path] | None], model: str | None,
                            hardware: str | None, tp: int | None, out: Path, json_out: bool,
                            allow_model_mismatch: bool, *, overwrite: bool = False,
                            inputs: list[Path | str | None] | None = None) -> None:
    """Parse the files, check them against the scenarios, fit by simulation, write the profile, report."""
    from kvplan.app.output import warn_unreliable
    from kvplan.calibration.calibrate import sha256_of
    from kvplan.calibration.checks import check_bench_model
    from kvplan.calibration.parsers import parse_bench_serve, parse_multiturn_stats
    from kvplan.calibration.sim_fit import bench_run, fit_scenario, multiturn_run
    from kvplan.errors import input_error
    from kvplan.models.arch import get_model
    from kvplan.models.profile import save_profile, with_recorded_inputs
    from kvplan.sim.results import json_safe
    from kvplan.sim.scenario import load_scenario

    other = [k for k in ("log", "prometheus", "points") if traces.get(k)]
    if other:
        raise input_error(f"--{other[0]}", "cannot be combined with --scenario (a simulation fits serving statistics)",
                          "run a second calibration for engine logs, Prometheus scrapes or points")
    bench, multi = list(traces.get("bench") or []), list(traces.get("multiturn") or [])
    if not bench and not multi:
        raise input_error("--scenario", "needs the measured run: give --bench F or --multiturn F")
    paths = _pair_scenarios(scenarios, len(bench) + len(multi))
    scen = [load_scenario(p) for p in paths]
    first = scen[0]
    arch = get_model(first.model)
    for flag, given, have in (("--model", model, arch.name), ("--hardware", hardware, first.hardware),
                              ("--tp", tp, first.deployment.tensor_parallel_size)):
        if given is not None and given != have:
            raise input_error(flag, f"{given} differs from the scenario's {have}", f"drop {flag} or fix the scenario")
    for p, sc in zip(paths, scen, strict=True):
        if "deployment" not in sc.model_fields_set:  # the defaults (TP8 1P1D) are not the run that was measured
            raise input_error(f"--scenario {p}", "has no 'deployment:': the fit simulates the measured deployment",
                              "give deployment: {tensor_parallel_size: N, prefill_nodes: X, decode_nodes: Y} "
                              "(or mode: aggregated, replicas: R)")
    foreign = [m for m in (check_bench_model(b, arch, allow=allow_model_mismatch) for b in bench) if m]
    runs = [bench_run(parse_bench_serve(b)) for b in bench] + [multiturn_run(parse_multiturn_stats(m)) for m in multi]
    sources = [{"file": str(f), "format": kind, "sha256": sha256_of(f)} for kind, fs in (("bench", bench),
                                                                                        ("multiturn", multi)) for f in fs]
    fit = fit_scenario(first, runs, scen, sources)
    prof = fit.profile
    if foreign:
        note = (f"PROXY: fitted to measurements of {', '.join(sorted(set(foreign)))}, not {arch.name} "
                "(--allow-model-mismatch); not a calibration of this model")
        prof = prof.model_copy(update={"status": "proxy" if prof.status == "calibrated" else prof.status,
                                       "notes": [*prof.notes, note]})
    # the input files as paths from the profile's directory, not this machine's absolute paths
    save_profile(with_recorded_inputs(prof, out), out, overwrite=overwrite, inputs=inputs)
    if prof.status == "unreliable":
        warn_unreliable(fit.report["unreliable_reasons"], out)
    if json_out:
        typer.echo(json.dumps(json_safe({**fit.report, "status": prof.status}), indent=2, sort_keys=True))
        return
    _print(fit.report, prof.status, prof.name, out)


def _print(report: dict[str, Any], status: str, name: str, out: Path) -> None:
    from rich.table import Table

    from kvplan.app.output import console

    c = console()
    t = Table(title=f"kvplan calibrate --scenario: parameters of {name}")
    for col in ("parameter", "value", "prior", "floor", "status", "why"):
        t.add_column(col)
    for p in report["params"]:
        t.add_row(p["name"], f"{p['value']:.4g}", f"{p['prior']:.4g}", f"{p['lower']:.4g}", p["status"], p["why"])
    c.print(t)
    fitted = sorted(set(report.get("fitted_seeds") or []))
    on_seed = f" with the fitted seed{'s' if len(fitted) > 1 else ''} {', '.join(map(str, fitted))}" if fitted else ""
    s = Table(title=f"self-check: the fitted profile simulated on the measured run(s){on_seed} (means within "
                    f"{report['self_check_tolerance']:.0%} gate the status)")
    for col in ("run", "metric", "measured ms", "simulated ms", "rel. error", "gates", "within"):
        s.add_column(col)
    for r in report["self_check"]:
        s.add_row(r["run"], r["metric"], f"{r['measured_ms']:.2f}", f"{r['simulated_ms']:.2f}", f"{r['rel_error']:+.1%}",
                  "yes" if r["gated"] else "no", "yes" if r["within"] else "NO")
    c.print(s)
    held_out = report.get("held_out_check") or []
    if held_out:
        h = Table(title="held-out seeds: the fitted profile simulated with seeds the fit did not use (their mean gates "
                        "the status too)")
        for col in ("run", "metric", "seeds", "measured ms", "simulated ms (mean)", "per seed", "rel. error", "gates",
                    "within"):
            h.add_column(col)
        for r in held_out:
            h.add_row(r["run"], r["metric"], str(len(r["seeds"])), f"{r['measured_ms']:.2f}", f"{r['simulated_ms']:.2f}",
                      ", ".join(f"{v:.1f}" for v in r["simulated_ms_per_seed"]), f"{r['rel_error']:+.1%}",
                      "yes" if r["gated"] else "no", "yes" if r["within"] else "NO")
        c.print(h)
    for h in report["held"]:
        c.print(f"held: {h}")
    for n in report["notes"]:
        c.print(f"note: {n}")
    c.print(f"status: {status} ({report['simulations']} simulations)")
    c.print(f"wrote {out}")
