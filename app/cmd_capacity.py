"""``kvplan capacity``: smallest xPyD meeting a TTFT p90 SLO, with and without bidirectional transfer."""

from __future__ import annotations

import os
import sys

import typer


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""

    @app.command("capacity")
    def capacity_cmd(
        rate: float = typer.Option(..., "--rate", help="New conversations per second."),
        slo_ttft_p90_ms: float = typer.Option(..., "--slo-ttft-p90-ms", help="TTFT p90 SLO in ms."),
        workload: str = typer.Option("chat", "--workload", help="chat | coding-agent | tool-agent."),
        model: str = typer.Option("qwen3-32b", "--model", help="Model preset."),
        hardware: str = typer.Option("p5en", "--hardware", help="Hardware preset."),
        usd: float | None = typer.Option(None, "--usd-per-node-hour", help="Node price (default: hardware's, p5en 63.3)."),
        max_nodes: int = typer.Option(16, "--max-nodes", help="Largest xPyD (x + y) to consider."),
        conversations: int | None = typer.Option(
            None, "--conversations", help="Conversations per run at --rate (default: the preset's; scaled with the rate)."
        ),
        replications: int = typer.Option(2, "--replications", min=1, help="Seeded replications per configuration."),
        workers: int = typer.Option(0, "--workers", min=0, help="Parallel runs (0 = all CPUs)."),
        json_out: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
    ) -> None:
        """Find the smallest xPyD meeting the SLO at the load, with and without bidirectional KV transfer;
        the maximum sustainable load of each and the cost per million turns."""
        from kvplan.app.cmd_sweep import _progress_bar
        from kvplan.app.flags import common_run_flags, int_range, positive_finite
        from kvplan.app.output import console
        from kvplan.sim.capacity import plan_capacity
        from kvplan.sim.presets import preset_scenario

        common_run_flags(replications, workers, conversations)
        positive_finite("--rate", rate, upper=1e6)
        positive_finite("--slo-ttft-p90-ms", slo_ttft_p90_ms, upper=1e10)
        positive_finite("--usd-per-node-hour", usd, upper=1e6, allow_zero=True)
        int_range("--max-nodes", max_nodes, 2, 64)
        sc = preset_scenario(workload, model, hardware, rate_per_s=rate, conversations=conversations)
        if conversations is None:
            # the default run must outlast retention (2 x TTL of arrivals), or decode pressure is underestimated
            import math

            from kvplan.sim.capacity import MAX_CONVERSATIONS
            from kvplan.sim.scenario import with_overrides

            need = math.ceil(rate * 2 * sc.policy.decoder_kv_blocks_ttl_s)
            if sc.workload.conversations < need:
                sc = with_overrides(sc, {"workload.conversations": min(need, MAX_CONVERSATIONS)})
        bar, cb = _progress_bar()
        with bar:
            plan = plan_capacity(sc, rate, slo_ttft_p90_ms, usd_per_node_hour=usd, max_nodes=max_nodes,
                                 replications=replications, workers=workers if workers > 0 else (os.cpu_count() or 1),
                                 progress=cb)
        if json_out:
            sys.stdout.write(plan.to_json() + "\n")
            return
        c = console()
        c.print(f"{workload} at {rate:g} conversations/s, TTFT p90 SLO {slo_ttft_p90_ms:g} ms, "
                f"${plan.usd_per_node_hour:g}/node-hour"
                + (f", {plan.turns_per_conversation:.2f} turns/conversation" if plan.turns_per_conversation > 0 else ""))
        for name, m in (("bidirectional on", plan.with_bidirectional), ("bidirectional off", plan.without_bidirectional)):
            if not m.get("meets_slo"):
                c.print(f"{name}: {m.get('note')}")
                continue
            c.print(f"{name}: {m['xpyd']} ({m['nodes']} nodes, ${m['usd_per_hour']:.1f}/h): TTFT p90 "
                    f"{m['ttft_p90_ms']:.0f} ms, hit rate {m['hit_rate']:.1%}; max load "
                    f"{'>= ' if m['max_rate_capped'] else ''}{m['max_sustainable_rate_per_s']:.3g}/s; "
                    f"${m['usd_per_million_turns_at_rate']:.0f} per million turns at {rate:g}/s, "
                    f"${m['usd_per_million_turns_at_max_rate']:.0f} at max load")
        for n in plan.notes:
            c.print(f"note: {n}", markup=False)
        for d in plan.disagreements:
            c.print(f"disagreement (the simulator wins): {d}", markup=False)
