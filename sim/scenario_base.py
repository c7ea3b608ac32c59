"""The base of every scenario section: frozen, no unknown fields, finite numbers only."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class _Frozen(BaseModel):
    # finite numbers only: .inf/.nan in any float field is an error naming it (allow_inf_nan=False)
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)
