"""Calibration profiles: cost-model parameters with their uncertainty, fit report and provenance.

A profile is a JSON file (never a pickle). Shipped calibrated profiles live in ``models/profiles/`` and
load by name (``p5en-qwen3-32b``); kernel-derived compute priors (``kvplan profile derive``) live in
``models/priors/`` (``qwen3-32b-h200-tp8``); any other path loads as a user profile. Every profile whose
model and hardware (an instance or a GPU preset) are known is checked against its physical bounds
(:mod:`kvplan.models.bounds`) when it loads. Which profile a deployment uses is decided by
:func:`kvplan.models.resolve.resolve_profile`.
"""

from __future__ import annotations

import copy
import json
import os
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from kvplan.atomic import atomic_write_bytes
from kvplan.errors import input_error
from kvplan.inputfile import decode_text, find_non_finite, is_kernel_file, json_loads
from kvplan.models.costs import CostModel

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
    status: Literal["calibrated", "prior", "composed", "proxy", "unreliable"] = Field(
        default="calibrated",
        description="calibrated | prior | composed | proxy | unreliable (a fit that failed its self-check; see fit_report)",
    )
    component_status: dict[str, str] = Field(
        default_factory=dict,
        description="Per component ('prefill.gpu', 'prefill.overhead_s', 'decode.gpu', 'transfer', 'overhead', ...):"
        " calibrated, kernel-derived or assumed, with where from.",
    )
    notes: list[str] = Field(default_factory=list, description="Assumptions a reader must know.")

    @field_validator("tensor_parallel_size", mode="before")
    @classmethod
    def _tp_is_an_integer(cls, v: Any) -> Any:
        """Lax mode would read ``true`` as TP 1 (then blame a cost parameter's physical bound) and ``"8"`` as 8."""
        if isinstance(v, bool | str):
            raise ValueError(f"is {v!r:.40}, not an integer; write the TP size as a plain integer")
        return v

    @property
    def extrapolated(self) -> bool:
        """True when this profile is not a calibration of this model and hardware (see ``component_status``)."""
        return self.status != "calibrated"

    def status_line(self) -> str:
        """One line: which parts are calibrated, kernel-derived or assumed."""
        if not self.component_status:
            return self.status
        return "; ".join(f"{k}: {v}" for k, v in sorted(self.component_status.items()))


def _profiles_dir() -> Path:
    return Path(str(resources.files("kvplan.models").joinpath("profiles")))


def _priors_dir() -> Path:
    return Path(str(resources.files("kvplan.models").joinpath("priors")))


def shipped_profiles() -> list[str]:
    """Names of the calibrated profiles shipped with kvplan."""
    return sorted(p.stem for p in _profiles_dir().glob("*.json"))


def shipped_priors() -> list[str]:
    """Names of the kernel-derived priors shipped with kvplan (``<model>-<gpu>-tp<N>``)."""
    return sorted(p.stem for p in _priors_dir().glob("*.json") if p.stem != "INDEX")


def prior_name(model: str, gpu: str, tp: int) -> str:
    """Name of a shipped prior: ``<model>-<gpu>-tp<N>``."""
    return f"{model}-{gpu}-tp{tp}"


def load_prior(model: str, gpu: str, tp: int) -> Profile | None:
    """The shipped kernel-derived prior of (model, GPU preset key, TP), or None when there is none."""
    path = _priors_dir() / f"{prior_name(model, gpu, tp)}.json"
    return load_profile(path) if path.is_file() else None


def check_profile_bounds(profile: Profile, where: str) -> None:
    """Raise a one-line error when a profile of a known model and hardware breaks a physical bound."""
    from kvplan.models.arch import MODEL_PRESETS
    from kvplan.models.bounds import check_bounds
    from kvplan.models.hardware import GPU_PRESETS, HARDWARE_PRESETS, Node

    arch = MODEL_PRESETS.get(profile.model)
    if arch is None:
        return
    node = HARDWARE_PRESETS.get(profile.hardware)
    if node is None and profile.hardware in GPU_PRESETS:
        node = Node.model_validate({"name": profile.hardware, "gpu": GPU_PRESETS[profile.hardware], "gpus_per_node": 8,
                                    "link": {"name": "none", "bandwidth_bytes_per_s_per_rank": 1e30}})
    if node is None:
        return
    check_bounds(profile.costs, arch, node, profile.tensor_parallel_size, where)


def load_profile(name_or_path: str | Path) -> Profile:
    """Load a shipped profile or prior by name, or a profile JSON file by path (bounded size, validated,
    physically bounded)."""
    text_path = Path(name_or_path)
    shipped = _profiles_dir() / f"{name_or_path}.json"
    prior = _priors_dir() / f"{name_or_path}.json"
    bare = isinstance(name_or_path, str) and "/" not in name_or_path and not name_or_path.endswith(".json")
    if shipped.is_file() and bare:
        path = shipped
    elif prior.is_file() and bare and name_or_path in shipped_priors():  # not INDEX.json, the priors' index
        path = prior
    elif text_path.is_file():
        path = text_path
    else:
        raise input_error(
            "profile", f"no profile named or at '{name_or_path}'", f"use a path or one of {', '.join(shipped_profiles())}"
        )
    st = path.stat()
    if st.st_size == 0 and is_kernel_file(st):  # /proc/kmsg: the read would block forever
        raise input_error(str(path), "is a special file of the kernel (/proc, /sys), not a profile, so it was not read",
                          "pass a profile written by kvplan calibrate or kvplan profile derive")
    if st.st_size > MAX_PROFILE_BYTES:
        raise input_error(str(path), "profile file larger than 8 MiB", "is this really a kvplan profile?")
    raw = path.read_bytes()
    if not raw.strip():  # 'not valid JSON (Expecting value: line 1 column 1)' said nothing of an empty file
        raise input_error(str(path), "profile file is empty", "re-create it with kvplan calibrate")
    # compressed, UTF-16/32, binary or not UTF-8: named as such (and the line), not as a JSON or codec error
    text = decode_text(raw, str(path))
    try:
        data, non_finite = json_loads(text, str(path), unique_keys=True)  # hand-edited: a key twice is an error
    except json.JSONDecodeError as exc:
        raise input_error(str(path), f"not valid JSON ({exc})", "re-create it with kvplan calibrate") from None
    if not isinstance(data, dict):  # pydantic would say "field '': Input should be a valid dictionary"
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(data), "a number")
        raise input_error(str(path), f"is {kind}, not a profile (a JSON object)",
                          "pass a profile written by kvplan calibrate or kvplan profile derive")
    bad = find_non_finite(data, "profile") if non_finite else None
    if bad is not None:
        raise input_error(f"{path}: field '{bad}'", "is NaN, Infinity or out of the float range",
                          "re-create it with kvplan calibrate")
    try:
        profile = Profile.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        msg = str(err["msg"]).removeprefix("Value error, ")
        if msg.startswith("[[") and "]]" in msg:  # a cost parameter's own check names it (models/costs.py)
            key, msg = msg[2:].split("]]", 1)
            loc, msg = (f"{loc}.{key}" if loc else key), msg.strip()
        raise input_error(f"{path}: field '{loc}'", msg,
                          "re-create the profile with kvplan calibrate or kvplan profile derive") from None
    _check_complete(data, path)
    check_profile_bounds(profile, f"profile {path.name}")
    return profile


#: The cost components every profile file gives in full (a missing one would load as all-zero costs: free compute
#: or free transfers, labelled with the profile's status). A scenario's inline ``costs:`` may be partial (it
#: overrides a resolved profile); a profile is the whole cost model.
PROFILE_COMPONENTS = ("prefill", "decode", "transfer", "overhead")


def _check_complete(data: Any, path: Path) -> None:
    """One-line error naming the first cost component a profile file leaves out or gives empty."""
    costs = data.get("costs") if isinstance(data, dict) else None
    for comp in PROFILE_COMPONENTS:
        if not isinstance(costs, dict) or not costs.get(comp):
            raise input_error(f"{path}: field 'costs.{comp}'", "is missing or empty (it would load as zero costs)",
                              "re-create the profile with kvplan calibrate or kvplan profile derive")


def recorded_input(file: str | os.PathLike[str], profile_path: str | os.PathLike[str]) -> str:
    """What a profile written to ``profile_path`` records of an input file it was fitted on: the file's path relative
    to the profile's directory (``../data/run.json``), never this machine's absolute path; its basename when no
    relative path exists (another drive)."""
    base = os.path.dirname(os.path.abspath(profile_path))
    try:
        return os.path.relpath(os.path.abspath(file), base)
    except ValueError:
        return os.path.basename(os.fspath(file))


def with_recorded_inputs(profile: Profile, profile_path: str | os.PathLike[str]) -> Profile:
    """``profile`` with the input files its fit records (``provenance.sources[].file``, ``fit_report.runs[].file``
    and a replayed run's ``workload.trace.path``) given relative to ``profile_path``'s directory
    (:func:`recorded_input`), for ``kvplan calibrate`` to write: the same keys, a portable value. The files were
    given relative to the working directory or absolute."""
    provenance = copy.deepcopy(profile.provenance)
    report = copy.deepcopy(profile.fit_report)
    for src in provenance.get("sources") or []:
        if isinstance(src, dict) and isinstance(src.get("file"), str):
            src["file"] = recorded_input(src["file"], profile_path)
    for run in report.get("runs") or []:
        if not isinstance(run, dict):
            continue
        if isinstance(run.get("file"), str):
            run["file"] = recorded_input(run["file"], profile_path)
        trace = (run.get("workload") or {}).get("trace")
        if isinstance(trace, dict) and isinstance(trace.get("path"), str):
            trace["path"] = recorded_input(trace["path"], profile_path)
    return profile.model_copy(update={"provenance": provenance, "fit_report": report})


def save_profile(profile: Profile, path: str | Path, *, overwrite: bool = False, inputs: Any = ()) -> None:
    """Write a profile as JSON atomically (temp file + rename) under kvplan's output rule
    (:func:`kvplan.atomic.check_output_file`: ``overwrite`` replaces a file kvplan did not write; never an input)."""
    text = json.dumps(profile.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"), overwrite=overwrite, inputs=inputs)


def default_profile_name(model: str, hardware: str) -> str:
    """The shipped profile name for a (model, hardware) pair: ``<hardware>-<model>``."""
    return f"{hardware}-{model}"
