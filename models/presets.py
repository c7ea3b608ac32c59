"""Resolve a preset by name, or validate an inline spec, with one-line errors (shared by models and hardware)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from kvplan.errors import input_error

T = TypeVar("T", bound=BaseModel)


def resolve_preset(name_or_spec: str | Mapping[str, object] | T, presets: Mapping[str, T], cls: type[T], what: str) -> T:
    """``presets[name]``, an inline mapping validated as ``cls``, or the object itself."""
    if isinstance(name_or_spec, cls):
        return name_or_spec
    if isinstance(name_or_spec, str):
        try:
            return presets[name_or_spec]
        except KeyError:
            raise input_error(
                what, f"unknown {what} '{name_or_spec}'", f"use one of {', '.join(presets)} or an inline spec"
            ) from None
    try:
        return cls.model_validate(name_or_spec)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise input_error(f"{what}.{loc}" if loc else what, err["msg"]) from None
