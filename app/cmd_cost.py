"""``kvplan cost``: what a profile's cost model says for one request size (prefill, KV transfer, decode step)."""

from __future__ import annotations

import json

import typer

COST_HELP = """Print the modelled prefill time of --tokens N new tokens on top of --cached-tokens C cached ones (chunked at
--chunk-tokens, alone on the engine), the KV transfer time of N tokens (one NIXL READ per TP rank on an idle
link: post + xferDuration + poll, no handshake, for the profile's model and TP) and one decode step (batch 1,
context C + N). --json prints exactly the keys prefill_s, kv_transfer_s, decode_step_s."""


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""

    @app.command("cost", help=COST_HELP)
    def cost_cmd(
        profile: str = typer.Option(..., "--profile", help="Profile name (e.g. p5en-qwen3-32b) or JSON path."),
        tokens: int = typer.Option(..., "--tokens", min=1, help="New tokens N."),
        cached_tokens: int = typer.Option(0, "--cached-tokens", min=0, help="Tokens already in KV (C)."),
        chunk_tokens: int = typer.Option(8192, "--chunk-tokens", min=1, help="max_num_batched_tokens."),
        model: str | None = typer.Option(
            None, "--model", help="Another model preset: derive an EXTRAPOLATED profile from --profile (same hardware)."
        ),
        tp: int | None = typer.Option(None, "--tp", min=1, help="With --model: its TP size (default: the profile's)."),
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        from kvplan.errors import input_error
        from kvplan.models.arch import (
            MODEL_PRESETS,
            descriptors_per_transfer,
            get_model,
            kv_bytes_per_token_per_rank,
        )
        from kvplan.models.costs import (
            decode_step_time_s,
            post_time_s,
            prefill_time_s,
            transfer_time_s,
            xfer_time_s,
        )
        from kvplan.models.profile import extrapolate_profile, load_profile
        from kvplan.sim.validity import check_cost_request, check_tensor_parallel

        check_cost_request(tokens, cached_tokens, chunk_tokens, model, tp)
        prof = load_profile(profile)
        arch = MODEL_PRESETS.get(prof.model)
        if arch is None:
            raise input_error(
                f"profile {profile}", f"model '{prof.model}' is not a preset", f"use one of {', '.join(MODEL_PRESETS)}"
            )
        if model is not None and (model != prof.model or (tp is not None and tp != prof.tensor_parallel_size)):
            target = get_model(model)
            check_tensor_parallel(target, tp or prof.tensor_parallel_size)
            prof = extrapolate_profile(prof, arch, target, tp or prof.tensor_parallel_size)
            arch = target
        tp = prof.tensor_parallel_size
        c = prof.costs
        nbytes = tokens * kv_bytes_per_token_per_rank(arch, tp)
        desc = descriptors_per_transfer(arch, tokens)
        out = {
            "prefill_s": prefill_time_s(c.prefill, tokens, cached_tokens, chunk_tokens),
            "kv_transfer_s": transfer_time_s(c.transfer, nbytes, desc),
            "decode_step_s": decode_step_time_s(c.decode, 1, cached_tokens + tokens),
        }
        if prof.extrapolated:
            typer.echo(f"warning: profile {prof.name} is EXTRAPOLATED from another model's calibration", err=True)
        if json_out:
            typer.echo(json.dumps(out, indent=2))
            return
        from kvplan.app.output import console

        con = console()
        con.print(f"profile {prof.name} ({prof.status}): {prof.model} on {prof.hardware}, TP{tp}")
        con.print(f"prefill of {tokens} tokens on {cached_tokens} cached: {out['prefill_s'] * 1e3:.2f} ms "
                  f"(chunks of {chunk_tokens})")
        con.print(f"KV transfer of {tokens} tokens: {out['kv_transfer_s'] * 1e3:.2f} ms per rank on an idle link "
                  f"({nbytes / 2**20:.1f} MiB, {desc} descriptors per rank; xferDuration "
                  f"{xfer_time_s(c.transfer, nbytes, desc) * 1e3:.2f} ms, "
                  f"post {post_time_s(c.transfer, desc) * 1e3:.2f} ms, "
                  f"poll {c.transfer.poll_s * 1e3:.2f} ms)")
        con.print(f"decode step (batch 1, context {cached_tokens + tokens}): {out['decode_step_s'] * 1e3:.2f} ms")
        if prof.extrapolated:
            con.print("[bold]EXTRAPOLATED profile[/bold]: costs scaled from another model's calibration")
