"""``kvplan recommend``: TTL, threshold and router TTL advice with the deployable config."""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from kvplan.units import human_s

if TYPE_CHECKING:  # the advisor (scipy, the executor's multiprocessing) loads only when a command uses it
    from kvplan.plan.advice import Recommendation


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""

    @app.command("recommend", short_help="TTL, threshold, router TTL and --kv-transfer-config.")
    def recommend_cmd(
        ctx: typer.Context,
        scenario: Path | None = typer.Argument(None, help="Scenario YAML (default: the --workload preset)."),
        model: str = typer.Option("qwen3-32b", "--model", help="Model preset (with --workload)."),
        hardware: str = typer.Option("p5en", "--hardware", help="Hardware preset (with --workload)."),
        workload: str | None = typer.Option(None, "--workload", help="chat | coding-agent | tool-agent | p5en-benchmark."),
        rate: float | None = typer.Option(None, "--rate", help="New conversations per second (target load)."),
        slo_ttft_p90_ms: float | None = typer.Option(None, "--slo-ttft-p90-ms", help="TTFT p90 SLO in ms."),
        budget: float | None = typer.Option(None, "--decode-hbm-budget-gib", help="Max pinned decode KV (GiB, all D)."),
        replications: int = typer.Option(3, "--replications", min=1, help="Seeded replications per configuration."),
        ttl_grid: str | None = typer.Option(None, "--ttl-grid", help="TTLs to try, e.g. '30,60,120,300,480,900'."),
        workers: int = typer.Option(0, "--workers", min=0, help="Parallel runs (0 = all CPUs)."),
        conversations: int | None = typer.Option(None, "--conversations", help="Conversations per run (preset default)."),
        trace: Path | None = typer.Option(None, "--trace", help="Replay a request trace instead of the synthetic workload."),
        json_out: bool = typer.Option(False, "--json", help="Print the recommendation as JSON."),
        policies: bool = typer.Option(True, "--policies/--no-policies",
                                      help="Also compare retention off, lease, evictable pins, offload and aggregated "
                                           "serving at the same load and name the best (kvplan compare)."),
        allow_unreliable: bool = typer.Option(
            False, "--allow-unreliable-profile",
            help="Use a profile of status 'unreliable' (a calibration that failed its self-check) anyway.",
        ),
    ) -> None:
        """Recommend decoder_kv_blocks_ttl, kv_recompute_threshold and the router TTL from simulated sweeps.

        Prints expected TTFT p50/p90/p99 and hit rate against vLLM's defaults (480 s, 64) and bidirectional
        off, pinned decode HBM and decode batch capacity, the binding constraint, 95% CIs, both rules with
        their assumptions, and the --kv-transfer-config JSON for the prefill and decode servers.
        """
        from kvplan.app.cmd_sweep import _progress_bar
        from kvplan.app.flags import common_run_flags, positive_finite, refuse_preset_flags, seconds_list
        from kvplan.app.output import console
        from kvplan.errors import input_error
        from kvplan.plan.advice import DEFAULT_TTL_GRID_S, recommend
        from kvplan.plan.compare import recommend_with_best_policy
        from kvplan.sim.presets import preset_scenario
        from kvplan.sim.scenario import ClosedLoopArrival, load_scenario, with_overrides

        common_run_flags(replications, workers, conversations)
        positive_finite("--rate", rate, upper=1e6)
        positive_finite("--slo-ttft-p90-ms", slo_ttft_p90_ms, upper=1e10)
        positive_finite("--decode-hbm-budget-gib", budget, upper=1e9)
        if scenario is not None and workload is not None:
            raise input_error("recommend", "give SCENARIO.yaml or --workload, not both")
        refuse_preset_flags(ctx, scenario)
        if scenario is not None:
            sc = load_scenario(scenario)
            if conversations is not None:
                sc = with_overrides(sc, {"workload.conversations": conversations})
            if rate is not None:
                if isinstance(sc.workload.arrival, ClosedLoopArrival):
                    raise input_error("--rate", "the scenario is closed-loop", "use a poisson arrival")
                sc = with_overrides(sc, {"workload.arrival.rate_per_s": rate})
        else:
            sc = preset_scenario(workload or "chat", model, hardware, rate_per_s=rate, conversations=conversations)
        if trace is not None:
            if sc.workload.trace is not None:
                raise input_error("--trace", f"the scenario already replays workload.trace '{sc.workload.trace.path}'",
                                  "remove one of them")
            if rate is not None or conversations is not None:
                raise input_error("--trace", "a trace brings its own arrivals and conversations",
                                  "drop --rate and --conversations (use the trace's time_scale/window_s in a scenario)")
            sc = with_overrides(sc, {"workload.trace": {"path": os.path.abspath(trace)}})
        if allow_unreliable:  # what the refusal of an 'unreliable' profile tells the user to pass
            sc = with_overrides(sc, {"simulation.allow_unreliable_profile": True})
        grid = DEFAULT_TTL_GRID_S
        if ttl_grid is not None:
            grid = seconds_list("--ttl-grid", ttl_grid)
        bar, cb = _progress_bar()
        with bar:
            advise = recommend_with_best_policy if policies else recommend
            rec = advise(sc, slo_ttft_p90_ms=slo_ttft_p90_ms, decode_hbm_budget_gib=budget, replications=replications,
                         ttl_grid=grid, progress=cb, workers=workers if workers > 0 else (os.cpu_count() or 1))
        if json_out:
            sys.stdout.write(rec.to_json() + "\n")
            return
        c = console()
        for line in render_text(rec):
            c.print(line, markup=False)


def gain_line(rec: Recommendation) -> list[str]:
    """How sure the TTL is, under the headline: the recommended TTL's mean-TTFT gain over bidirectional off in the TTL
    sweep, with its 95% CI over the paired replications (the figure the TTL rule judged; the table's per-column CIs
    overlap even when the paired difference is clear: 362.9 ±59.3 against 370.0 ±56.6 ms for a 7.1 ±4.2 ms gain)."""
    row = next((c for c in rec.ttl_curve if c.get("ttl_s") == rec.decoder_kv_blocks_ttl_s), None)
    if row is None or not math.isfinite(row.get("benefit_s", math.nan)):
        return []
    gain, ci = float(row["benefit_s"]), float(row.get("benefit_ci95", math.nan))
    reps = rec.inputs.get("replications") if isinstance(rec.inputs, dict) else None
    over = f" over {reps} paired replications" if reps else ""
    if not math.isfinite(ci):
        sure = f"no CI{over}"
    else:
        sure = f"95% CI ±{human_s(ci)}{over}: " + ("a real gain" if gain - ci > 0 else "it includes no gain")
    verb = "lower" if gain >= 0 else "higher"
    return [f"gain: mean TTFT {human_s(abs(gain))} {verb} than with bidirectional off at TTL "
            f"{rec.decoder_kv_blocks_ttl_s:g} s ({sure}; the TTL sweep's runs, common random numbers)"]


def render_text(rec: Recommendation) -> list[str]:
    """Human-readable lines of a recommendation (the CLI prints them)."""
    from kvplan.app.cmd_compare import IDENTICAL_NOTE, identical_replications
    from kvplan.plan.advice import IF_KEPT_ON
    from kvplan.plan.advice_report import CONTEXT_CUT
    from kvplan.plan.advice_rules import TURN_GAPS

    e, b, o = rec.expected, rec.baseline, rec.bidirectional_off

    def ms(d: dict[str, float], k: str) -> str:
        ci = d.get(f"{k}_ci95", math.nan)
        return human_s(d[k]) + (f" ±{human_s(ci)}" if math.isfinite(ci) else "")

    knobs = (f"decoder_kv_blocks_ttl = {rec.decoder_kv_blocks_ttl_s} s, kv_recompute_threshold = "
             f"{rec.kv_recompute_threshold_tokens} tokens, router TTL = {rec.router_ttl_s} s")
    # retention off: the TTL, threshold and router TTL are not part of the advice, only a marked conditional line
    why_off = (f"INCONCLUSIVE: {rec.inconclusive}" if rec.inconclusive else
               "retention does not lower TTFT for this workload at this load"
               if rec.binding_constraint.startswith(TURN_GAPS) else f"retention held back by {rec.binding_constraint}")
    head = ([f"{knobs}, bidirectional_kv_xfer = true", *gain_line(rec)] if rec.bidirectional else
            [f"bidirectional_kv_xfer = false: {why_off} (see why:)", f"  {IF_KEPT_ON}{knobs}"])
    # a workload cut at the context limit: said under the headline, which describes the shorter workload simulated
    cut = [w for w in rec.warnings if CONTEXT_CUT in w]
    lines = [
        *head,
        *[f"warning: {w}" for w in cut],
        *([f"best policy: {rec.best_policy['policy']} (TTFT p90 {human_s(rec.best_policy['ttft_p90_s'])}"
           + (f" over {rec.best_policy['ttft_p90_judged_conversations']:,} conversations"
              if rec.best_policy.get("ttft_p90_judged_conversations") else "") + ", pinned KV "
           f"mean {rec.best_policy['pinned_kv_gib_mean']:.1f} GiB; `kvplan compare` for the whole table)"]
          if rec.best_policy else []),
        "",
        f"{'':24}{'recommended':>22}{'vLLM defaults':>22}{'bidirectional off':>22}",
    ]
    for k, name in (("ttft_p50_s", "TTFT p50"), ("ttft_p90_s", "TTFT p90"), ("ttft_p99_s", "TTFT p99"),
                    ("ttft_mean_s", "TTFT mean")):  # a column is 22 wide with at least one space before its value
        lines.append(f"{name:24}" + "".join(f" {ms(d, k):>21}" for d in (e, b, o)))
    lines.append(f"{'hit rate':24}{e['hit_rate']:>22.1%}{b['hit_rate']:>22.1%}{o['hit_rate']:>22.1%}")
    h = rec.decode_hbm

    def num(x: float, spec: str) -> str:  # '-' where the runs define no figure (no steady window), not 'nan'
        return format(x, spec) if math.isfinite(x) else "-"

    caps = (h["decode_batch_capacity_at_recommendation"], h["decode_batch_capacity_at_vllm_defaults"],
            h["decode_batch_capacity_without_retention"])
    identical = identical_replications((e, b, o))  # compare's test, on the same *_ci95 keys
    undefined = not all(math.isfinite(x) for x in (e["pinned_kv_gib_mean"], b["pinned_kv_gib_mean"], *caps))
    lines += [
        f"{'pinned KV mean/peak GiB':24}{num(e['pinned_kv_gib_mean'], '.1f'):>13}/{num(e['pinned_kv_gib_peak'], '.1f'):<8}"
        f"{num(b['pinned_kv_gib_mean'], '.1f'):>13}/{num(b['pinned_kv_gib_peak'], '.1f'):<8}{0.0:>13.1f}/{0.0:<8.1f}",
        f"{'decode batch capacity':24}" + "".join(f"{num(x, '.0f'):>22}" for x in caps),
        f"({'±: 95% CI over replications' if rec.inputs.get('replications', 2) > 1 else 'one replication: no CI'}"
        + (f" ({IDENTICAL_NOTE})" if rec.inputs.get("replications", 2) > 1 and identical else "") + "; "
        f"decode KV pool {h['decode_kv_capacity_gib']:.0f} GiB"
        + (f", budget {h['budget_gib']:g} GiB" if h["budget_gib"] else "")
        + ("; '-': the runs have no steady window (arrivals of new conversations do not span one), so no steady "
           "pinned KV mean nor the decode batch capacity derived from it)" if undefined else ")"),
        _saturated_line(rec.saturation or {}),
        *_verified_line(rec),
        "",
        f"binding constraint: {rec.binding_constraint}",
        *([_slo_line(rec.slo)] if rec.slo else []),
        *[f"why: {r}" for r in rec.rationale],
        *_run_notes(rec),
        *[f"rule: {r}" for r in rec.rules],
        *([f"rule: {rec.best_policy['rule']}"] if rec.best_policy else []),
        *([f"best policy: {rec.best_policy['why']}"] if rec.best_policy.get("why") else []),
        *[f"best policy: not compared: {n['policy']}: {n['why']}" for n in rec.best_policy.get("not_compared", [])],
        *[f"assumption: {a}" for a in rec.assumptions],
        *[f"warning: {w}" for w in rec.warnings if w not in cut],
        *[f"disagreement: {d}" for d in rec.disagreements],
        "",
        "prefill and decode servers (identical):",
        *([f"  (includes \"{rec.transfer['vllm_flag']}\":true, adopted by the cross-layer trial: keep it only where the "
           "attention backend supports cross-layer blocks)"] if rec.transfer.get("adopted") else []),
        f"  --kv-transfer-config '{json.dumps(rec.kv_transfer_config['prefill'], separators=(',', ':'))}'",
        f"router: {rec.router['how']}" if rec.bidirectional else f"router, {IF_KEPT_ON[0].lower()}{IF_KEPT_ON[1:]}"
                                                                  f"{rec.router['how']}",
    ]
    return lines


def _run_notes(rec: Recommendation) -> list[str]:
    """What was simulated: the TTLs the screen kept and pruned, and lengthened runs."""
    out = []
    scr, ss = rec.screen or {}, rec.steady_state or {}
    if scr.get("pruned_ttls_s"):
        out.append(f"screen: simulated TTLs {', '.join(f'{t:g}' for t in scr['simulated_ttls_s'])} s; pruned "
                   f"{', '.join(f'{t:g}' for t in scr['pruned_ttls_s'])} s ({scr['rule']})")
    if scr.get("retried_ttls_s"):
        out.append(f"screen: also simulated {', '.join(f'{t:g}' for t in scr['retried_ttls_s'])} s: "
                   f"{scr['retried_why']}")
    if ss.get("lengthened"):
        out.append(f"steady state: runs lengthened from {ss['conversations_asked']:,} to "
                   f"{ss['conversations_simulated']:,} conversations (arrival span >= 2 x (TTL + p90 conversation span))")
    return out


def _saturated_line(sat: dict[str, Any]) -> str:
    """What each configuration saturates (health section of its runs)."""
    from kvplan.plan.advice_runs import RESOURCE_NAMES

    counts, reps = sat.get("saturated_replications") or {}, sat.get("replications") or {}

    def name(key: str, r: str) -> str:
        k, n = (counts.get(key) or {}).get(r, 0), reps.get(key, 0)
        return RESOURCE_NAMES[r] + (f" ({k} of {n} replications)" if 0 < k < n else "")

    def names(key: str) -> str:
        return ", ".join(name(key, r) for r in sat.get(key, [])) or "nothing"

    return (f"saturated: recommended {names('recommended')}; vLLM defaults {names('vllm_defaults')}; "
            f"bidirectional off {names('bidirectional_off')}")


def _slo_line(slo: dict[str, Any]) -> str:
    """The SLO verdict and the run that judged it (longer than the scenario's when the first run met it)."""
    line = (f"SLO TTFT p90 {slo['ttft_p90_ms']:g} ms: {'met' if slo['met'] else 'NOT met'} "
            f"({slo['expected_ttft_p90_ms']:.0f} ms expected")
    n, first = slo.get("judged_conversations"), slo.get("first_run_conversations")
    if n is not None and first is not None and n > first:
        line += (f" over {n:,} conversations at the scenario's rate; {slo['first_run_ttft_p90_ms']:.0f} ms over "
                 f"its {first:,}")
    elif "judged_conversations" in slo and n is None:
        line += ", over the trace as it runs"
    return line + ")"


def _verified_line(rec: Any) -> list[str]:
    """Where the recommended column comes from (the JSON's ``verification``): the deployment itself, simulated."""
    v = getattr(rec, "verification", None) or {}
    if not v:
        return []
    seeds = v.get("seeds") or []
    n = v.get("conversations")
    length = f"{n} conversations" if n is not None else "the trace's own sessions"
    return [f"recommended column: the recommended deployment itself simulated ({len(seeds)} seed(s) "
            f"{', '.join(str(x) for x in seeds)}, {length}): simulating `verification.overrides` on these seeds "
            "reproduces it (the whole scenario, the load and conversations simulated included: "
            "`verification.scenario` in --json; pinned KV mean over each seed's steady window of pinned.parquet, P busy "
            "from summary.json's prefill_utilization_steady_max: `verification.figures`)"]

