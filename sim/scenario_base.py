"""The base of every scenario section: frozen, no unknown fields, finite numbers only.

Fields added to a section after scenarios were first fingerprinted are named in the section's
``OMIT_AT_DEFAULT`` and left out of every dump (``model_dump``, ``model_dump_json``) while they hold their
default, so that a scenario that does not use them dumps, and hashes, exactly as before they existed:
``recommend``'s ``scenario_sha256`` and a sweep's fingerprint (``--resume``) stay those of the same scenario
written before the field was added. A scenario that sets such a field dumps it as usual.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, SerializerFunctionWrapHandler, model_serializer


class _Frozen(BaseModel):
    # finite numbers only: .inf/.nan in any float field is an error naming it (allow_inf_nan=False)
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
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
