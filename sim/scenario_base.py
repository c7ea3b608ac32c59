"""The base of every scenario section: frozen, no unknown fields, finite numbers only, numbers as numbers,
switches as ``true``/``false``.

Fields added to a section after scenarios were first fingerprinted are named in the section's
``OMIT_AT_DEFAULT`` and left out of every dump (``model_dump``, ``model_dump_json``) while they hold their
default, so that a scenario that does not use them dumps, and hashes, exactly as before they existed:
``recommend``'s ``scenario_sha256`` and a sweep's fingerprint (``--resume``) stay those of the same scenario
written before the field was added. A scenario that sets such a field dumps it as usual.
"""

from __future__ import annotations

import math
import types
import typing
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer, model_validator

#: Largest integer any scenario field may be given (checked before pydantic converts it; the largest bound
#: of a field, the seed, is 2**63 - 1).
MAX_INT_BITS = 64


def _numeric(annotation: Any) -> tuple[bool, bool]:
    """``(is a number field, is an int-only field)`` of a field annotation (``int``, ``float``, ``X | None``)."""
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) or typing.get_origin(
        annotation) is typing.Union else (annotation,)
    kinds = {a for a in args if a is not type(None)}
    if kinds and kinds <= {int, float}:
        return True, kinds == {int}
    return False, False


def _number_tuple(annotation: Any) -> bool:
    """Whether a field annotation is a tuple of numbers (``tuple[float, ...]``, ``tuple[float, float]``, ``| None``)."""
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) or typing.get_origin(
        annotation) is typing.Union else (annotation,)
    tuples = [a for a in args if typing.get_origin(a) is tuple]
    return bool(tuples) and all({x for x in typing.get_args(t) if x is not Ellipsis} <= {int, float} for t in tuples)


def _switch(annotation: Any) -> bool:
    """Whether a field annotation is a switch (``bool`` or ``bool | None``)."""
    args = typing.get_args(annotation) if isinstance(annotation, types.UnionType) or typing.get_origin(
        annotation) is typing.Union else (annotation,)
    kinds = {a for a in args if a is not type(None)}
    return kinds == {bool}


def number_string_hint(value: str) -> str:
    """Why a number field's YAML string is refused, and how to write it: YAML 1.1 (PyYAML) reads a float only
    with a dot in the mantissa and a sign in the exponent, so ``5e-4`` and ``1.0e30`` are strings; the hint gives
    the form it reads (``5.0e-4``, ``1.0e+30``)."""
    try:
        v = float(value)
    except ValueError:
        return f"is the string '{value[:40]}', not a number"
    if not math.isfinite(v):
        return f"is the string '{value[:40]}', not a finite number"
    if _yaml_reads_a_number(value):  # "8", '0.5': a number YAML reads as one, quoted
        return f"is the string '{value[:40]}', not a number (it is quoted): write {value.strip()} without quotes"
    mant, exp = f"{v:e}".split("e")
    mant = mant.rstrip("0")
    mant += "0" if mant.endswith(".") else ""
    return (f"is the string '{value[:40]}', not a number (YAML 1.1 reads a float only with a dot and a signed "
            f"exponent: write {mant}e{exp[0]}{int(exp[1:])})")

def _yaml_reads_a_number(value: str) -> bool:
    """Whether YAML (1.1, PyYAML) reads ``value`` unquoted as a finite int or float (``8``, ``0.5``, ``5.0e-4``; not
    ``5e-4``, which it reads as a string)."""
    import yaml

    if len(value) > 64:
        return False
    try:
        read = yaml.safe_load(value)
    except yaml.YAMLError:
        return False
    return isinstance(read, int | float) and not isinstance(read, bool) and math.isfinite(read)


class _Frozen(BaseModel):
    # finite numbers only: .inf/.nan in any float field is an error naming it (allow_inf_nan=False)
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _numbers_are_numbers(cls, data: Any) -> Any:
        """Refuse ``true``/``false`` and strings in number fields (pydantic would read ``true`` as 1 and the
        YAML 1.1 string ``5e-4`` as 0.0005 silently), integers beyond 64 bits before any conversion, and
        anything but ``true``/``false`` in a switch (pydantic's lax mode reads 1, ``"yes"``, ``"on"``, ``"t"`` as
        true: every ``bool`` field of every section is strict here, in one place). The message starts with
        ``[[field]]`` so the scenario's error formatter names the full field path."""
        if not isinstance(data, dict):
            return data
        for key, value in data.items():
            field = cls.model_fields.get(str(key))
            if field is None or value is None:
                continue
            if _switch(field.annotation):
                if not isinstance(value, bool):
                    shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
                    raise ValueError(f"[[{key}]] is {shown}, not true or false; write true or false (unquoted)")
                continue
            if _number_tuple(field.annotation) and isinstance(value, list | tuple):
                for i, item in enumerate(value):  # the same rule for every item of a list of numbers
                    if isinstance(item, bool):
                        raise ValueError(f"[[{key}]] item {i} is {str(item).lower()}, not a number")
                    if isinstance(item, str):
                        raise ValueError(f"[[{key}]] item {i} {number_string_hint(item)}")
                continue
            if not _numeric(field.annotation)[0]:
                continue
            if isinstance(value, bool):
                raise ValueError(f"[[{key}]] is {str(value).lower()}, not a number (a bool is not a count)")
            if isinstance(value, str):
                raise ValueError(f"[[{key}]] {number_string_hint(value)}")
            if isinstance(value, int) and value.bit_length() > MAX_INT_BITS:
                raise ValueError(f"[[{key}]] is an integer of {value.bit_length()} bits, beyond any bound of this field")
        return data

    #: Fields dumped only when they differ from their default (module docstring).
    OMIT_AT_DEFAULT: ClassVar[frozenset[str]] = frozenset()

    @model_serializer(mode="wrap")
    def _omit_new_defaults(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if self.OMIT_AT_DEFAULT and isinstance(data, dict):
            fields = type(self).model_fields
            for name in self.OMIT_AT_DEFAULT:
                if name in data and getattr(self, name) == fields[name].default:
                    del data[name]
        return data
