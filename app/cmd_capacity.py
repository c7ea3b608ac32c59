"""``kvplan capacity``: the smallest deployment meeting a TTFT p90 SLO (P/D with and without bidirectional
transfer, aggregated replicas) for a scenario, a preset or a trace."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import typer

CAPACITY_HELP = """Find the smallest deployment meeting --slo-ttft-p90-ms for SCENARIO.yaml (its model, hardware, TP,
workload and policy), a --workload preset, or a --trace replay: P/D with bidirectional KV transfer on (the TTL
searched at each size, router TTL = TTL - margin - skew - that run's p99 arrival-to-decision), off, and
aggregated replicas of the same TP. One P fewer and one D fewer are simulated and must miss the SLO. Prints
the maximum sustainable load of each and the cost per million turns on the steady-state basis (node-hours of
the steady state, not the drain, as compare)."""


def _scenario(scenario: Path | None, workload: str | None, model: str, hardware: str, rate: float | None,
              conversations: int | None, trace: Path | None) -> Any:
    import math

    from kvplan.app.flags import refuse_conversations_with_trace
    from kvplan.errors import input_error
    from kvplan.plan.capacity import MAX_CONVERSATIONS
    from kvplan.sim.presets import preset_scenario
    from kvplan.sim.scenario import load_scenario, with_overrides

    if scenario is not None and workload is not None:
        raise input_error("capacity", "give SCENARIO.yaml or --workload PRESET, not both")
    if scenario is not None:
        sc = load_scenario(scenario)
        if conversations is not None:
            sc = with_overrides(sc, {"workload.conversations": conversations})
    else:
        name = workload or "chat"
        sc = preset_scenario(name, model, hardware, rate_per_s=rate, conversations=conversations)
        if conversations is None and rate is not None and sc.workload.trace is None:
            # the default run must outlast retention (2 x TTL of arrivals), or decode pressure is underestimated
            need = math.ceil(rate * 2 * sc.policy.decoder_kv_blocks_ttl_s)
            if sc.workload.conversations < need:
                sc = with_overrides(sc, {"workload.conversations": min(need, MAX_CONVERSATIONS)})
    refuse_conversations_with_trace(conversations, trace is not None or sc.workload.trace is not None)
    if trace is not None:
        if not trace.exists():  # a file, or a directory of weka traces (as compare and simulate)
            raise input_error(f"--trace {trace}", "no such file")
        sc = with_overrides(sc, {"workload.trace": {"path": os.path.abspath(trace)}})
    return sc


def _ttl_grid(text: str | None) -> tuple[float, ...]:
    from kvplan.errors import input_error
    from kvplan.plan.capacity import DEFAULT_TTL_GRID_S

    if text is None:
        return DEFAULT_TTL_GRID_S
    try:
        vals = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise input_error("--ttl-grid", f"not a comma-separated list of seconds: {text!r}", "e.g. 60,120,240") from None
    if not vals or len(vals) > 12:
        raise input_error("--ttl-grid", "give 1 to 12 TTLs in seconds", "e.g. 60,120,240")
    return vals


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""

    @app.command("capacity", help=CAPACITY_HELP, short_help="Smallest deployment meeting a TTFT p90 SLO.")
    def capacity_cmd(
        ctx: typer.Context,
        scenario: Path | None = typer.Argument(None, help="Scenario YAML (a P/D deployment; or --workload)."),
        slo_ttft_p90_ms: float = typer.Option(..., "--slo-ttft-p90-ms", help="TTFT p90 SLO in ms."),
        rate: float | None = typer.Option(None, "--rate", help="New conversations per second (default: the scenario's)."),
        workload: str | None = typer.Option(None, "--workload", help="chat | coding-agent | tool-agent (default chat)."),
        model: str = typer.Option("qwen3-32b", "--model", help="Model preset (with --workload)."),
        hardware: str = typer.Option("p5en", "--hardware", help="Hardware preset (with --workload)."),
        trace: Path | None = typer.Option(None, "--trace", help="Replay this trace instead of the synthetic workload."),
        usd: float | None = typer.Option(None, "--usd-per-node-hour", help="Node price (default: hardware's, p5en 63.3)."),
        max_nodes: int = typer.Option(16, "--max-nodes", help="Largest xPyD (x + y) and replica count to consider."),
        conversations: int | None = typer.Option(
            None, "--conversations", help="Conversations per run at the rate (default: the scenario's; scaled with it)."
        ),
        replications: int = typer.Option(2, "--replications", min=1, help="Seeded replications per configuration."),
        ttl_grid: str | None = typer.Option(
            None, "--ttl-grid", help="TTLs (s) searched with bidirectional on (60,120,240,480)."
        ),
        aggregated_routing: str | None = typer.Option(
            None, "--aggregated-routing", help="round_robin | session_affinity | prefix_aware (default: the scenario's)."),
        max_rate: bool = typer.Option(True, "--max-rate/--no-max-rate", help="Search each answer's maximum load."),
        workers: int = typer.Option(0, "--workers", min=0, help="Parallel runs (0 = all CPUs)."),
        json_out: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
        yes: bool = typer.Option(
            False, "--yes", help="Run a search that may take more than 100,000 simulations or 10^9 simulated turns."),
        allow_unreliable: bool = typer.Option(
            False, "--allow-unreliable-profile",
            help="Use a profile of status 'unreliable' (a calibration that failed its self-check) anyway.",
        ),
    ) -> None:
        from kvplan.app.cmd_sweep import _progress_bar
        from kvplan.app.flags import common_run_flags, int_range, positive_finite
        from kvplan.errors import input_error
        from kvplan.plan.capacity import check_inputs, max_simulations, plan_capacity
        from kvplan.plan.compare import ROUTINGS
        from kvplan.plan.grid import MAX_RUNS, check_planned_work
        from kvplan.sim.scenario import with_overrides

        common_run_flags(replications, workers, conversations)
        positive_finite("--rate", rate, upper=1e6)
        positive_finite("--slo-ttft-p90-ms", slo_ttft_p90_ms, upper=1e10)
        positive_finite("--usd-per-node-hour", usd, upper=1e6, allow_zero=True)
        int_range("--max-nodes", max_nodes, 2, 64)
        if aggregated_routing is not None and aggregated_routing not in ROUTINGS[:3]:
            raise input_error("--aggregated-routing", f"unknown routing '{aggregated_routing}'",
                              f"use one of {', '.join(ROUTINGS[:3])}")
        grid = _ttl_grid(ttl_grid)
        from kvplan.app.flags import refuse_preset_flags

        if scenario is not None:
            refuse_preset_flags(ctx, scenario)
        sc = _scenario(scenario, workload, model, hardware, rate, conversations, trace)
        if allow_unreliable:  # what the refusal of an 'unreliable' profile tells the user to pass
            sc = with_overrides(sc, {"simulation.allow_unreliable_profile": True})
        check_inputs(sc, rate, slo_ttft_p90_ms, usd, max_nodes, grid)  # one-line errors before the progress bar
        bound = max_simulations(max_nodes, len(grid), replications, max_rate)
        if bound > MAX_RUNS and not yes:
            raise input_error("capacity", f"--max-nodes {max_nodes} x {len(grid)} TTLs x --replications {replications} "
                              f"may take up to {bound:,} simulations (more than {MAX_RUNS:,})",
                              "lower them, or pass --yes to run it anyway")
        if not yes:
            check_planned_work(bound, sc, "capacity", "lower --conversations, --max-nodes or --replications, or pass "
                               "--yes to run it anyway")
        bar, cb = _progress_bar()
        with bar:
            plan = plan_capacity(sc, rate, slo_ttft_p90_ms, usd_per_node_hour=usd, max_nodes=max_nodes,
                                 replications=replications, workers=workers if workers > 0 else (os.cpu_count() or 1),
                                 progress=cb, ttl_grid=grid, aggregated_routing=aggregated_routing, max_rate=max_rate)
        if json_out:
            sys.stdout.write(plan.to_json() + "\n")
            return
        from kvplan.app.output import console

        c = console()
        for line in render_text(plan, str(scenario or trace or workload or "chat")):
            c.print(line, markup=False)


def _human(ms: float | None) -> str:
    from kvplan.app.output import human_s

    return "-" if ms is None else human_s(ms / 1000)


def _p90_or_why(ms: float | None) -> str:
    """A neighbour's p90, or why it has none (no TTL of the grid could run there, or its runs failed)."""
    if ms is None or not math.isfinite(ms):
        return "not simulated: every TTL skipped or its runs failed"
    return _human(ms)


def _overrides_text(ov: dict[str, Any]) -> str:
    """``path=value`` pairs of an answer's overrides, values as YAML/JSON reads them."""
    return " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={json.dumps(v, separators=(',', ':'))}"
                    for k, v in ov.items())


def answer_line(plan: Any) -> str:
    """The deployment to choose, first: of the three answers meeting the SLO, the cheapest per million turns at the
    planned load (without a price: the fewest nodes; ties in the printed order), with how close its TTFT p90 is to the
    SLO and over how many replications. A newcomer got three answers and no word on which one to deploy."""
    met = [(name, m) for name, m in (("bidirectional on", plan.with_bidirectional),
                                     ("bidirectional off", plan.without_bidirectional), ("aggregated", plan.aggregated))
           if m.get("meets_slo")]
    if not met:
        return ("answer: no deployment considered meets the SLO (each line below says how close it came): raise "
                "--max-nodes, relax --slo-ttft-p90-ms or lower --rate")

    def key(item: tuple[str, dict[str, Any]]) -> tuple[float, float]:
        m = item[1]
        usd = m.get("usd_per_million_turns_at_rate")
        return (float(usd) if usd is not None else math.inf, float(m.get("billed_nodes") or math.inf))

    name, m = min(met, key=key)
    usd = m.get("usd_per_million_turns_at_rate")
    by = f"${usd:,.0f} per million turns" if usd is not None else f"{m['billed_nodes']:g} node(s), no price known"
    seeds = len((m.get("verification") or {}).get("seeds") or ())
    sure = (f"TTFT p90 {_human(m['ttft_p90_ms'])} = {m['ttft_p90_ms'] / plan.slo_ttft_p90_ms:.0%} of the SLO"
            + (f", the mean of {seeds} replication(s)" if seeds else "")
            + ("; one instance fewer misses it" if m.get("neighbour_checks") and not any(
                c["meets_slo"] for c in m["neighbour_checks"]) else ""))

    def cost(o: dict[str, Any]) -> str:
        u = o.get("usd_per_million_turns_at_rate")
        return f" (${u:,.0f})" if u is not None else f" ({o['billed_nodes']:g} node(s))"

    def label(n: str, o: dict[str, Any]) -> str:
        return f"{o['xpyd']} replica(s)" if n == "aggregated" else f"{o['xpyd']} with {n}"

    others = [f"{label(n, o)}{cost(o)}" for n, o in met if n != name]
    return (f"answer: {label(name, m)} ({by}; {sure})"
            + (f"; also meeting it: {', '.join(others)}" if others else ""))


def render_text(plan: Any, what: str) -> list[str]:
    """The plan as lines (the CLI prints them)."""
    load = f"{plan.rate_per_s:g} conversations/s" if plan.rate_per_s is not None else "the trace's clock"
    price = (f"${plan.usd_per_node_hour:g}/node-hour" if plan.usd_per_node_hour is not None else
             "no price known for this hardware (--usd-per-node-hour gives one)")
    out = [f"{what} at {load}, TTFT p90 SLO {_human(plan.slo_ttft_p90_ms)}, {price}"
           + (f", {plan.turns_per_conversation:.2f} turns/conversation" if plan.turns_per_conversation > 0 else "")]
    out.append(answer_line(plan))
    for name, m in (("bidirectional on", plan.with_bidirectional), ("bidirectional off", plan.without_bidirectional),
                    ("aggregated", plan.aggregated)):
        if not m.get("meets_slo"):
            out.append(f"{name}: {m.get('note')}")
            continue
        pol = ""
        if m.get("decoder_kv_blocks_ttl_s") is not None:
            pol = (f" TTL {m['decoder_kv_blocks_ttl_s']:g} s, router TTL {m['router_ttl_s']:g} s, threshold "
                   f"{m['kv_recompute_threshold_tokens']};")
        if name == "aggregated":  # replicas of which TP (the rule is in tensor_parallel_rule)
            tp = m.get("tensor_parallel_size")
            pol = (f" TP{tp} replicas," if tp is not None else "") + f" routing {m['routing']};"
        checks = ", ".join(f"{c.get('xpyd') or str(c['replicas']) + ' replicas'} "
                           f"{'meets' if c['meets_slo'] else 'misses'} ({_p90_or_why(c['ttft_p90_ms'])})"
                           for c in m["neighbour_checks"])
        mx = m.get("max_sustainable_rate_per_s")
        at_max = m.get("usd_per_million_turns_at_max_rate")
        usd_rate = m.get("usd_per_million_turns_at_rate")
        billed = f"{m['billed_nodes']:g} node{'' if m['billed_nodes'] == 1 else 's'}"
        judged = m.get("judged_conversations")
        over = (f" over {judged:,.0f} conversations (first run of {m['first_run_conversations']:,.0f}: "
                f"{_human(m['first_run_ttft_p90_ms'])})" if judged and m.get("first_run_ttft_p90_ms") is not None else "")
        out.append(
            f"{name}: {m['xpyd']} ({m['gpus']} GPUs = {billed}"
            + (f", ${m['usd_per_hour']:.1f}/h" if m.get("usd_per_hour") is not None else "") + f"):{pol} "
            f"TTFT p90 "
            f"{_human(m['ttft_p90_ms'])}{over}, hit rate {m['hit_rate']:.1%}"
            + (f"; max load {'>= ' if m['max_rate_capped'] else ''}{mx:.3g}/s" if mx is not None else "")
            + (f"; ${usd_rate:,.0f} per million turns" if usd_rate is not None else "")
            + (f", ${at_max:,.0f} at max load" if at_max is not None else "")
            + (f"; one fewer: {checks}" if checks else ""))
        ver = m.get("verification") or {}
        if ver:
            out.append(f"{name}: verify by simulating the scenario with {_overrides_text(ver['overrides'])} on seeds "
                       f"{', '.join(str(x) for x in ver['seeds'])} (TTFT p90 = the mean of their ttft_p90_s; the whole "
                       "scenario: verification.scenario in --json)")
        if m.get("smallest_verified") is False:
            met = ", ".join(str(c.get("xpyd") or f"{c['replicas']} replicas") for c in m["neighbour_checks"]
                            if c["meets_slo"])
            out.append(f"{name}: {m['xpyd']} is not verified as the smallest: one fewer ({met}) also met the SLO "
                       "in its simulation (the search is not monotonic here); consider it, or raise --replications")
    if plan.with_bidirectional.get("ttl_rule"):
        out.append(f"bidirectional on: TTL chosen by {plan.with_bidirectional['ttl_rule']}")
    out.append(plan.cost_basis)
    out.append(f"{plan.simulations} simulations")
    out.extend(f"note: {n}" for n in plan.notes)
    out.extend(f"disagreement (the simulator wins): {d}" for d in plan.disagreements)
    return out
