"""``kvplan profile derive``: a kernel-derived compute prior from aiconfigurator-core (optional extra ``kvplan[aic]``)."""

from __future__ import annotations

from pathlib import Path

import typer

DERIVE_HELP = """Query aiconfigurator-core (pip install 'kvplan[aic]') for --model on --gpu at --tp over a grid (prefill:
new x cached tokens x batch; decode: batch x context), fit kvplan's cost functions (bounded below by the GPU's
peak FLOP/s and HBM bandwidth) and write a prior profile with provenance and per-point fit errors to --out."""


def register(app: typer.Typer) -> None:
    """Add the ``profile`` command group to the CLI."""
    from kvplan.models.arch import MODEL_PRESETS
    from kvplan.models.hardware import GPU_PRESETS

    # the presets as the code has them (a hand-written list missed qwen3-8b and h800, whose priors ship)
    models = ", ".join(MODEL_PRESETS)
    gpus = ", ".join(k for k, g in GPU_PRESETS.items() if g.aic_system)
    group = typer.Typer(help="Cost profiles: derive kernel-based priors.", no_args_is_help=True)
    app.add_typer(group, name="profile")

    @group.command("derive", help=DERIVE_HELP, short_help="Kernel-based priors from aiconfigurator-core (kvplan[aic]).")
    def derive_cmd(
        model: str = typer.Option(
            ..., "--model", help=f"Model preset ({models}), or with --model-config"
            " a new name for a dense model whose architecture is read from config.json."
        ),
        gpu: str = typer.Option(..., "--gpu", help=f"GPU preset with aiconfigurator kernel data ({gpus})."),
        tp: int = typer.Option(..., "--tp", help="Tensor-parallel size."),
        out: str = typer.Option(..., "--out", help="Output profile JSON."),
        model_config: str | None = typer.Option(
            None, "--model-config", help="Directory with a Hugging Face config.json (for models aiconfigurator lacks)."
        ),
        overwrite: bool = typer.Option(
            False, "--overwrite", help="Replace an existing output file kvplan did not write (its own it replaces anyway)."
        ),
    ) -> None:
        from kvplan.atomic import check_output_file
        from kvplan.calibration.derive import arch_from_hf_config, check_model_config, check_tp, derive_prior, require_aic
        from kvplan.models.arch import MODEL_PRESETS, get_model
        from kvplan.models.hardware import get_gpu
        from kvplan.models.profile import save_profile

        inputs = [Path(model_config) / "config.json"] if model_config is not None else []
        check_output_file(out, "--out", inputs=inputs, overwrite=overwrite)  # before any work
        cfg = check_model_config(model_config) if model_config is not None else None
        if cfg is not None and model not in MODEL_PRESETS:
            arch = arch_from_hf_config(model, cfg)  # a model kvplan has no preset for: its architecture from config.json
        else:
            arch = get_model(model)
        g = get_gpu(gpu)
        check_tp(arch, tp)
        require_aic()
        d = derive_prior(arch, g, tp, model_path=model_config)
        save_profile(d.profile, out, overwrite=overwrite, inputs=inputs)
        fr = d.profile.fit_report
        typer.echo(f"wrote {out}: {d.profile.name}, {len(d.prefill)} prefill and {len(d.decode)} decode points, max "
                   f"|error| prefill {fr['prefill_max_abs_rel_error']:.1%}, decode {fr['decode_max_abs_rel_error']:.1%}")
