"""Calibration profiles: cost-model parameters with their uncertainty, fit report and provenance.

A profile is a JSON file (never a pickle). Shipped profiles live in ``models/profiles/`` and load by
name (``p5en-qwen3-32b``); any other path loads as a user profile. For a model without a calibrated
profile on a hardware, :func:`resolve_profile` derives one from a calibrated profile of the same
hardware by scaling compute with FLOPs per token and decode with bytes read per step, and marks it
``extrapolated`` (every output built from it must say so).
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from kvplan.atomic import atomic_write_bytes
from kvplan.errors import input_error
from kvplan.models.arch import (
    ModelArch,
    attention_flops_per_pair,
    kv_bytes_per_token_per_rank,
    linear_flops_per_token,
    weights_bytes_per_gpu,
)
from kvplan.models.costs import CostModel, DecodeCost, PrefillCost

MAX_PROFILE_BYTES = 8 * 1024**2


class Profile(BaseModel):
    """Cost-model parameters for one (model, hardware, tensor-parallel size)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Profile name.")
    model: str = Field(description="Model preset name the profile was measured on.")
    hardware: str = Field(description="Hardware preset name.")
    tensor_parallel_size: int = Field(gt=0, description="TP size of the measured deployment.")
    costs: CostModel = Field(description="Cost-model parameters.")
    uncertainty: dict[str, float] = Field(
        default_factory=dict, description="Standard error of each parameter, keyed 'component.param'."
    )
    fit_report: dict[str, Any] = Field(default_factory=dict, description="Residuals, MAPE per metric, ...")
    provenance: dict[str, Any] = Field(default_factory=dict, description="Sources, sha256, vLLM version.")
    status: str = Field(default="calibrated", description="calibrated | prior | extrapolated")
    notes: list[str] = Field(default_factory=list, description="Assumptions a reader must know.")

    @property
    def extrapolated(self) -> bool:
        """True when this profile was derived from another model's calibration."""
        return self.status == "extrapolated"


def _profiles_dir() -> Path:
    return Path(str(resources.files("kvplan.models").joinpath("profiles")))


def shipped_profiles() -> list[str]:
    """Names of the profiles shipped with kvplan."""
    return sorted(p.stem for p in _profiles_dir().glob("*.json"))


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a shipped profile by name, or a profile JSON file by path (bounded size, validated)."""
    text_path = Path(name_or_path)
    shipped = _profiles_dir() / f"{name_or_path}.json"
    if shipped.is_file() and not text_path.suffix:
        path = shipped
    elif text_path.is_file():
        path = text_path
    else:
        raise input_error(
            "profile", f"no profile named or at '{name_or_path}'", f"use a path or one of {', '.join(shipped_profiles())}"
        )
    if path.stat().st_size > MAX_PROFILE_BYTES:
        raise input_error(str(path), "profile file larger than 8 MiB", "is this really a kvplan profile?")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise input_error(str(path), f"not valid JSON ({exc})", "re-create it with kvplan calibrate") from None
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise input_error(f"{path}: field '{loc}'", err["msg"]) from None


def save_profile(profile: Profile, path: str | Path) -> None:
    """Write a profile as JSON atomically (temp file + rename)."""
    text = json.dumps(profile.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))


def default_profile_name(model: str, hardware: str) -> str:
    """The shipped profile name for a (model, hardware) pair: ``<hardware>-<model>``."""
    return f"{hardware}-{model}"


def extrapolate_profile(base: Profile, base_arch: ModelArch, arch: ModelArch, tp: int) -> Profile:
    """Derive a profile for ``arch`` at TP ``tp`` from a calibrated ``base`` on the same hardware.

    Prefill per-token cost scales with linear FLOPs per token per rank, attention with attention FLOPs
    per pair per rank; decode fixed cost with weight bytes per GPU (decode reads all weights each step),
    per-context-token with KV bytes per token per rank. Transfer parameters carry over: bytes and
    descriptors already come from the architecture. Step fixed costs and overheads carry over unchanged.
    """
    c = base.costs
    tp0 = base.tensor_parallel_size
    lin = (linear_flops_per_token(arch) / tp) / (linear_flops_per_token(base_arch) / tp0)
    att = (attention_flops_per_pair(arch) / tp) / (attention_flops_per_pair(base_arch) / tp0)
    wts = weights_bytes_per_gpu(arch, tp) / weights_bytes_per_gpu(base_arch, tp0)
    kvb = kv_bytes_per_token_per_rank(arch, tp) / kv_bytes_per_token_per_rank(base_arch, tp0)
    costs = CostModel(
        prefill=PrefillCost(
            fixed_s=c.prefill.fixed_s, per_token_s=c.prefill.per_token_s * lin, attention_s=c.prefill.attention_s * att
        ),
        transfer=c.transfer,
        decode=DecodeCost(
            fixed_s=c.decode.fixed_s * wts,
            per_seq_s=c.decode.per_seq_s,
            per_context_token_s=c.decode.per_context_token_s * kvb,
        ),
        overhead=c.overhead,
    )
    return Profile(
        name=f"{base.name}->{arch.name}-tp{tp}",
        model=arch.name,
        hardware=base.hardware,
        tensor_parallel_size=tp,
        costs=costs,
        status="extrapolated",
        provenance={"derived_from": base.name, "scales": {"linear": lin, "attention": att, "weights": wts, "kv": kvb}},
        notes=[
            f"EXTRAPOLATED from {base.name} ({base.model} TP{tp0}) by FLOPs per token and bytes per step;"
            " not calibrated on this model"
        ]
        + list(base.notes),
    )
