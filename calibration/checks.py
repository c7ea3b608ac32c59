"""Input checks of ``kvplan calibrate`` that read a measurement file (above ``sim`` in the layers)."""

from __future__ import annotations

from typing import Any

from kvplan.errors import input_error
from kvplan.models.arch import ModelArch


def _norm(name: str) -> str:
    return "".join(ch for ch in name.lower().rsplit("/", 1)[-1] if ch.isalnum())


def check_bench_model(path: Any, arch: ModelArch, allow: bool = False) -> str | None:
    """Refuse a ``vllm bench serve`` file whose ``model_id`` is another model than ``--model``.

    A profile is labelled with the model it was fitted for; fitting one model's measurements as another's
    would label foreign numbers as calibrated. A file without ``model_id`` is accepted (nothing to check).
    Returns the foreign ``model_id`` when ``allow`` (the caller labels the profile), else ``None``.
    """
    from kvplan.calibration.parse_bench import parse_bench_serve

    res = parse_bench_serve(path)
    mid = res.model_id
    if not mid or _norm(mid) in {_norm(arch.hf_id or arch.name), _norm(arch.name)}:
        return None
    if allow:
        return mid
    raise input_error(
        f"--bench {path}", f"its model_id is '{mid}', not --model {arch.name} ({arch.hf_id or arch.name})",
        "calibrate with the model the file measured, or pass --allow-model-mismatch for a profile labelled 'proxy'",
    )
