"""Resolve a preset by name, or validate an inline spec, with one-line errors (shared by models and hardware)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from kvplan.errors import KvplanInputError, input_error

T = TypeVar("T", bound=BaseModel)

#: Largest magnitude of a number in an inline model or hardware spec (FLOP/s and bytes stay far below),
#: checked before pydantic converts it (a 4,000-digit integer or ``.inf`` never reaches the formulas).
MAX_SPEC_NUMBER = 1e21
#: Deepest nesting of an inline spec (a node holds a GPU and a link: two levels).
MAX_SPEC_DEPTH = 4


def check_spec_numbers(spec: Mapping[str, object], cls: type[BaseModel], where: str, depth: int = 0) -> None:
    """Refuse, before validation, a number field of ``cls`` given as a string (YAML 1.1 reads ``5e-4`` as
    one: write ``5.0e-4``) or a bool, any number that is not finite or beyond :data:`MAX_SPEC_NUMBER`, and a
    switch (``bool`` field, e.g. a node's ``gpudirect_rdma``) given as anything but true/false; nested specs (a
    node's ``gpu`` and ``link``) are checked with their own classes."""
    if depth > MAX_SPEC_DEPTH:
        raise input_error(where, "is nested too deeply")
    for key, value in spec.items():
        info = cls.model_fields.get(str(key))
        if info is None:
            continue  # pydantic names the unknown field
        ann: Any = info.annotation
        field = f"{where}.{key}"
        if isinstance(ann, type) and issubclass(ann, BaseModel) and isinstance(value, Mapping):
            check_spec_numbers(value, ann, field, depth + 1)
            continue
        if ann is bool or ann == bool | None:  # a switch: pydantic's lax mode would read 1, "yes", "on" as true
            if value is not None and not isinstance(value, bool):
                raise input_error(field, f"is {value!r:.60}, not true or false", "write true or false (unquoted)")
            continue
        numeric = ann in (int, float) or ann == float | None
        if not numeric:
            continue
        if isinstance(value, str | bool):
            raise input_error(field, f"is {value!r:.60}, not a number", "write a plain number (5.0e-4, not 5e-4)")
        if isinstance(value, int) and value.bit_length() > 72:
            raise input_error(field, f"is an integer of {value.bit_length()} bits, larger than {MAX_SPEC_NUMBER:g}")
        if isinstance(value, int | float) and not (math.isfinite(value) and abs(value) <= MAX_SPEC_NUMBER):
            raise input_error(field, f"is {value}, not a finite number of at most {MAX_SPEC_NUMBER:g}")


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
    if isinstance(name_or_spec, Mapping):
        check_spec_numbers(name_or_spec, cls, what)
    try:
        obj = cls.model_validate(name_or_spec)
    except ValidationError as exc:
        err = exc.errors()[0]
        inner = (err.get("ctx") or {}).get("error")
        if isinstance(inner, KvplanInputError):  # a model validator's own one-line error: as it was raised
            raise inner from None
        loc = ".".join(str(p) for p in err["loc"])
        fix = None
        if err["type"] == "missing":  # 'Field required' alone did not say what an inline spec must hold
            required = [n for n, f in cls.model_fields.items() if f.is_required()]
            fix = (f"add it; an inline {what} spec gives at least {', '.join(required)} (or use a preset: "
                   f"{', '.join(presets)})")
        raise input_error(f"{what}.{loc}" if loc else what, err["msg"], fix) from None
    name = getattr(obj, "name", None)
    if isinstance(name, str) and name in presets and obj != presets[name]:
        # profiles, priors and calibrations attach to a preset's name: an inline spec under it would get them
        raise input_error(f"{what}.name", f"'{name}' is the name of a preset, and this inline spec differs from it",
                          f"give your {what} its own name (or use the preset '{name}' as it is)")
    return obj
