"""Scenario sections ``policy.retention`` (vLLM's ``ttl`` and the proposals ``lease``, ``ttl_evictable``) and
``policy.offload`` (the CPU offload tier); their behaviour lives in ``sim/retention_policy.py``."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from kvplan.sim.scenario_base import _Frozen


class TtlRetention(_Frozen):
    """vLLM: every finished request pins its blocks until ``decoder_kv_blocks_ttl_s`` after it finished (not renewed)."""

    kind: Literal["ttl"] = "ttl"


class LeaseRetention(_Frozen):
    """Proposal (not vLLM): a heartbeat-renewed decode lease; see ``sim/retention_policy.py`` for the assumptions."""

    kind: Literal["lease"]
    lease_s: float = Field(default=30.0, gt=0, le=86_400, description="D frees blocks this long after the last heartbeat.")
    heartbeat_s: float = Field(default=5.0, gt=0, le=86_400, description="Client heartbeat period while idle.")
    idle_timeout_s: float = Field(
        default=480.0, ge=0, le=10**7, description="The client stops heartbeating after this long idle (user left)."
    )
    client_knows_end: bool = Field(
        default=True, description="The client stops heartbeating after a conversation's last turn (else: idle timeout)."
    )

    @model_validator(mode="after")
    def _renewed_in_time(self) -> LeaseRetention:
        if self.heartbeat_s >= self.lease_s:
            raise ValueError("heartbeat_s must be < lease_s (else the lease lapses between heartbeats)")
        return self


class TtlEvictableRetention(_Frozen):
    """Pins keep the TTL but are LRU-evictable when admission needs blocks (an evicted pin's read is declined)."""

    kind: Literal["ttl_evictable"]


Retention = Annotated[TtlRetention | LeaseRetention | TtlEvictableRetention, Field(discriminator="kind")]


class Offload(_Frozen):
    """CPU offload tier on D: expired/evicted blocks move to host DRAM, P pulls them at host-to-NIC bandwidth."""

    host_capacity_gib: float | None = Field(
        default=None, gt=0, le=1e6, description="Host memory for KV per decode node (default: the hardware's)."
    )
    host_bandwidth_gbps: float | None = Field(
        default=None, gt=0, le=1e6, description="Host DRAM -> NIC bandwidth per node, Gb/s (default: the hardware's)."
    )
