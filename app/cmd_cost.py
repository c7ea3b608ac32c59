"""``kvplan cost``: what the cost model says for one request size (prefill, KV transfer, decode step).

The profile is resolved exactly as a simulation of the same model, hardware and TP resolves it
(:func:`kvplan.models.resolve.resolve_profile`, called by ``sim/engine.py::resolve``).
"""

from __future__ import annotations

import json
from typing import Any

import typer

COST_HELP = """Print the modelled prefill time of --tokens N new tokens on top of --cached-tokens C cached ones (chunked at
--chunk-tokens, alone on the engine), the KV transfer time of N tokens (one NIXL READ per TP rank on an idle
link: request creation before the post (outside NIXL's timer) + NIXL xferDuration, which contains the post,
+ the engine step that notices completion (poll), no handshake) and one decode step (--batch B sequences of
--context X tokens each, default C + N). The profile is the one a simulation of --model on --hardware at --tp
would use (or --profile P). --json prints prefill_s, kv_transfer_s (visible pull), kv_xfer_s (what NIXL
reports as xferDuration, and the engine log as Avg xfer time), kv_pull_visible_s (= kv_transfer_s),
descriptors_per_rank (regions x blocks, NIXL posts one per descriptor), the same pull with cross-layer blocks
(vLLM's enable_cross_layers_blocks: one region per rank): descriptors_per_rank_cross_layer,
kv_transfer_cross_layer_s, kv_xfer_cross_layer_s, and kv_line_rate_s (bytes at the link's line rate, what
no descriptor count can beat), read_thread_s (the reader's engine-thread time per read), decode_step_s,
kv_cache_tokens (the KV pool of one instance under vLLM's memory accounting at the scenario defaults,
gpu_memory_utilization 0.9 and max_num_seqs 1024; null when the weights leave no room) and what the profile
is made of. --cross-layer-blocks makes the cross-layer pull the headline kv_transfer_s."""


def _pool_tokens(arch: Any, gpu: Any, tp: int, chunk_tokens: int) -> int | None:
    """The KV pool a simulation of this deployment gets at the scenario defaults (None: no room for KV)."""
    from kvplan.errors import KvplanInputError
    from kvplan.models.memory import plan_memory

    try:
        return plan_memory(arch, gpu, tp, 0.9, chunk_tokens, 1024).kv_cache_tokens
    except KvplanInputError:
        return None


def register(app: typer.Typer) -> None:
    """Add the command to the CLI."""

    @app.command("cost", help=COST_HELP, short_help="Modelled prefill, KV pull and decode step times.")
    def cost_cmd(
        profile: str | None = typer.Option(None, "--profile", help="Profile name (e.g. p5en-qwen3-32b) or JSON path."),
        model: str | None = typer.Option(None, "--model", help="Model preset (default: the profile's, else qwen3-32b)."),
        hardware: str | None = typer.Option(None, "--hardware", help="Instance preset (default: the profile's, else p5en)."),
        tp: int | None = typer.Option(None, "--tp", help="TP size (default: the profile's, else 8)."),
        tokens: int = typer.Option(..., "--tokens", min=1, help="New tokens N."),
        cached_tokens: int = typer.Option(0, "--cached-tokens", min=0, help="Tokens already in KV (C)."),
        batch: int = typer.Option(1, "--batch", min=1, help="Decode batch size B."),
        context: int | None = typer.Option(None, "--context", min=1, help="Decode context per sequence (default C + N)."),
        chunk_tokens: int = typer.Option(8192, "--chunk-tokens", min=1, help="max_num_batched_tokens."),
        cross_layer: bool = typer.Option(False, "--cross-layer-blocks",
                                         help="Price the headline pull with cross-layer blocks (both are printed)."),
        kv_transport: str = typer.Option(
            "rdma", "--kv-transport",
            help="deployment.kv_transport: rdma (the NIC moves the bytes) or tcp (UCX's TCP transport: the reader's "
                 "engine thread posts at the measured TCP rate and moves the bytes; shown in read_thread_s).",
        ),
        json_out: bool = typer.Option(False, "--json", help="Print JSON."),
        allow_unreliable: bool = typer.Option(
            False, "--allow-unreliable-profile", help="Use a profile of status 'unreliable' anyway."
        ),
    ) -> None:
        from kvplan.calibration.derive import check_tp
        from kvplan.models.arch import get_model, kv_regions_per_rank
        from kvplan.models.costs import (
            decode_step_time_s,
            post_time_s,
            prefill_time_s,
            prep_time_s,
            read_thread_time_s,
            with_transport,
        )
        from kvplan.models.hardware import get_hardware
        from kvplan.models.profile import load_profile
        from kvplan.models.resolve import resolve_profile
        from kvplan.sim.tp import rank_plan
        from kvplan.sim.validity import check_cost_fits, check_cost_request
        from kvplan.sim.xfer import read_phases, read_time_s

        check_cost_request(tokens, cached_tokens, chunk_tokens, batch, context)
        if kv_transport not in ("rdma", "tcp"):
            from kvplan.errors import input_error

            raise input_error("--kv-transport", f"unknown transport '{kv_transport}'", "use rdma or tcp")
        base = load_profile(profile) if profile is not None else None
        spec = base.provenance.get("architecture") if base is not None and model is None else None
        arch = get_model(spec if isinstance(spec, dict) else model or (base.model if base is not None else "qwen3-32b"))
        if hardware is None and base is not None and base.status == "prior":
            from kvplan.errors import input_error

            raise input_error("--hardware", f"profile {base.name} is a compute prior for a GPU ({base.hardware}), "
                              "not an instance", "give --hardware (e.g. p5en for H200, p5 for H100)")
        hw = hardware or (base.hardware if base is not None else "p5en")
        node = get_hardware(hw)
        n_tp = tp if tp is not None else (base.tensor_parallel_size if base is not None else 8)
        check_tp(arch, n_tp, node.gpus_per_node)
        prof, notes = resolve_profile(arch, node, n_tp, profile, allow_unreliable)
        c = with_transport(prof.costs, kv_transport, prof.costs.transfer.per_byte_s, set(), notes)
        tc, plan = c.transfer, rank_plan(arch, n_tp, n_tp)  # the simulator's composition of a read (sim/xfer.py)
        reads: dict[bool, tuple[int, float, float, float]] = {}
        for x in (False, True):
            regions = kv_regions_per_rank(arch, x)
            d, nbytes, _, lat_x, _ = read_phases(tc, plan, regions, arch.block_size_tokens, tokens)
            # descriptors, xferDuration (post inside), visible pull (request creation + xferDuration + poll), bytes
            reads[x] = (d, lat_x + nbytes * tc.per_byte_s,
                        read_time_s(tc, tc.per_byte_s, plan, regions, arch.block_size_tokens, tokens), nbytes)
        desc_plain, desc_cross = reads[False][0], reads[True][0]
        desc = reads[cross_layer][0]
        ctx = context if context is not None else cached_tokens + tokens
        pool = _pool_tokens(arch, node.gpu, n_tp, chunk_tokens)
        check_cost_fits(arch, tokens, cached_tokens, batch, ctx, context is not None, pool)
        out: dict[str, Any] = {
            "prefill_s": prefill_time_s(c.prefill, tokens, cached_tokens, chunk_tokens),
            "kv_transfer_s": reads[cross_layer][2],
            "kv_xfer_s": reads[cross_layer][1],
            "kv_pull_visible_s": reads[cross_layer][2],
            "read_thread_s": read_thread_time_s(c.transfer, desc, reads[cross_layer][3]),
            "kv_transport": kv_transport,
            "thread_per_descriptor_s": c.transfer.thread_per_descriptor_s,
            "thread_per_byte_s": c.transfer.thread_per_byte_s,
            "cross_layer_blocks": cross_layer,
            "descriptors_per_rank": desc_plain,
            "descriptors_per_rank_cross_layer": desc_cross,
            "kv_transfer_plain_s": reads[False][2],
            "kv_transfer_cross_layer_s": reads[True][2],
            "kv_xfer_cross_layer_s": reads[True][1],
            "kv_line_rate_s": nbytes * c.transfer.per_byte_s,
            "decode_step_s": decode_step_time_s(c.decode, batch, batch * ctx),
            # what pulling the tokens saves: recompute them with the next token vs that token alone after them (the
            # break-even's recompute with a one-token tail, plan/breakeven.py)
            "recompute_marginal_s": (prefill_time_s(c.prefill, tokens + 1, cached_tokens, chunk_tokens)
                                     - prefill_time_s(c.prefill, 1, cached_tokens + tokens, chunk_tokens)),
            "model": arch.name,
            "hardware": node.name,
            "tensor_parallel_size": n_tp,
            "profile": prof.name,
            "profile_status": prof.status,
            "components": prof.component_status,
            "kv_cache_tokens": pool,
        }
        if json_out:
            typer.echo(json.dumps(out, indent=2))
            return
        from kvplan.app.output import console

        con = console()
        con.print(f"profile {prof.name} ({prof.status}): {arch.name} on {node.name}, TP{n_tp}", markup=False)
        con.print(f"prefill of {tokens} tokens on {cached_tokens} cached: {out['prefill_s'] * 1e3:.2f} ms "
                  f"(chunks of {chunk_tokens})")
        con.print(f"KV transfer of {tokens} tokens: {out['kv_transfer_s'] * 1e3:.2f} ms per rank on an idle link "
                  f"({nbytes / 2**20:.1f} MiB, {desc} descriptors per rank; NIXL xferDuration "
                  f"{out['kv_xfer_s'] * 1e3:.2f} ms, of which post {post_time_s(c.transfer, desc) * 1e3:.2f} ms; "
                  f"+ request creation {prep_time_s(c.transfer, desc) * 1e3:.2f} ms "
                  f"+ poll {c.transfer.poll_s * 1e3:.2f} ms)")
        con.print(f"reader's engine thread per read (post + thread_per_descriptor_s x descriptors + thread_per_byte_s x "
                  f"bytes, overlapped with the step's forward, vLLM PR #53333; kv_transport {kv_transport}: "
                  f"{c.transfer.thread_per_descriptor_s * 1e6:.2f} us/descriptor, "
                  f"{c.transfer.thread_per_byte_s * 1e9:.3f} s/GB): {out['read_thread_s'] * 1e3:.3f} ms")
        con.print(f"descriptors per rank: {desc_plain:,} (regions x blocks) -> pull "
                  f"{out['kv_transfer_plain_s'] * 1e3:.2f} ms; "
                  f"with cross-layer blocks (enable_cross_layers_blocks) {desc_cross:,} -> pull "
                  f"{out['kv_transfer_cross_layer_s'] * 1e3:.2f} ms; line rate alone {out['kv_line_rate_s'] * 1e3:.2f} ms")
        rec_s, pull_s = out["recompute_marginal_s"], out["kv_transfer_s"]
        faster = "pulling is faster" if pull_s <= rec_s else "recomputing is faster"
        con.print(f"pull or recompute these {tokens} tokens (on {cached_tokens} cached; the next token is computed "
                  f"either way): pull {pull_s * 1e3:.2f} ms on an idle link, recompute {rec_s * 1e3:.2f} ms: {faster} "
                  "(kv_recompute_threshold is the size where this flips; `kvplan recommend` finds it for a workload, "
                  "whose new tokens are computed anyway beside the recomputed ones, under P's queue and link sharing)")
        con.print(f"decode step (batch {batch}, context {ctx} each): {out['decode_step_s'] * 1e3:.2f} ms")
        con.print(f"KV pool per instance: {pool:,} tokens (vLLM's accounting at gpu_memory_utilization 0.9, "
                  f"max_num_batched_tokens {chunk_tokens}, max_num_seqs 1024; kvplan memory for the terms)"
                  if pool is not None else "KV pool per instance: none (the weights leave no memory for KV)")
        for k, v in sorted(prof.component_status.items()):
            con.print(f"  {k}: {v}", markup=False)  # a calibration's status quotes its base in [brackets]
