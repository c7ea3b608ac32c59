"""Retention policies of the decode node (``policy.retention``) and its CPU offload tier (``policy.offload``).

The decode node asks its :class:`RetentionPolicy` for a finished request's deadline, whether pins may be
evicted, and whether released blocks go to host memory. Three policies:

* ``ttl`` (vLLM, ``nixl/pull_scheduler.py`` ``request_finished``): deadline ``finish + decoder_kv_blocks_ttl``,
  never renewed; pins are neither evictable nor preemptable.
* ``lease`` (a **proposal**, not vLLM behaviour; the write-up's "extend the heartbeat-renewed lease to the
  decode side", modelled on P's own lease, ``kv_lease_duration`` with heartbeats, PR #41383). Assumptions:

  - the client of a conversation heartbeats every ``heartbeat_s`` through the router while it is idle
    between turns, and stops when the conversation ends (its last turn: the session is closed) or after
    ``idle_timeout_s`` without a new turn (a human who left). Knowing the end is what makes the lease
    cheap: an agent harness knows its task is done, a chat UI does not; ``client_knows_end: false`` makes
    the client heartbeat ``idle_timeout_s`` after every turn, its last included;
  - D frees the blocks ``lease_s`` after the last heartbeat (a finished response counts as one); the
    next turn's request reaching the router renews the lease (to ``arrival + lease_s``) if it is still
    alive, and P's read or notification then releases it as with the TTL;
  - heartbeats are never lost, cost nothing, and the router keeps a conversation's entry exactly as long
    as its lease (they pass through it): its own TTL does not apply, and a turn arriving after the lease
    lapsed is a router miss (``stale``), never a declined read;
  - P's expiry check (PR #47021: decline when ``now + 5 s >= deadline``) is unchanged.

  Since the deadline only matters when no turn renews it, it is set at the finish: ``finish + lease_s``
  after a conversation's last turn, else ``finish + heartbeat_s x floor(idle_timeout_s / heartbeat_s) +
  lease_s`` (no event per heartbeat).
* ``ttl_evictable`` (a proposal): the TTL deadline, but when D's admission or a running request's growth
  needs blocks and the prefix cache is exhausted, pins are evicted least recently pinned first (never one
  being read) before any running request is preempted. A later read of an evicted pin finds the blocks
  gone: P declines it and ``kv_load_failure_policy`` applies (``pull_scheduler`` failed-load path).

Offload tier (``policy.offload``; vLLM's CPU offloading connector stores KV in host DRAM and NIXL can read
registered host memory): blocks released by expiry or eviction are copied to D's host memory (the copy is
assumed instantaneous: a 12k-token Qwen3-32B context is 384 MiB over 8 GPUs' PCIe Gen5 links, ~1 ms),
kept per conversation in a capacity-bounded LRU (``host_capacity_gib`` per decode node). A turn whose pin
is gone from HBM but whose context is in D's host tier is pulled from there (decision ``host_pull``; the
recompute threshold applies as for a pull) at the host-to-NIC bandwidth shared by the node's ranks:
``per_byte_s = max(link per_byte_s, TP / host bandwidth)`` per rank byte (kept out of the NIC fabric: host
reads are assumed not to contend with HBM reads on D's NICs); the host copy is dropped once read (the new
turn's KV supersedes it).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

from kvplan.sim.node_config import RetentionConfig
from kvplan.sim.retention import Retention, pin_deadline_s
from kvplan.sim.router import KVParams


class HostTier:
    """D's host-memory KV tier: per-conversation contexts, LRU within ``capacity_tokens``."""

    __slots__ = ("capacity_tokens", "total", "_map", "peak")

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self.total = 0
        self.peak = 0
        self._map: OrderedDict[int, int] = OrderedDict()

    def put(self, conv: int, tokens: int) -> None:
        """Store the conversation's context (replacing an older copy), evicting LRU contexts to fit."""
        if tokens > self.capacity_tokens:
            return
        self.total -= self._map.pop(conv, 0)
        self._map[conv] = tokens
        self.total += tokens
        while self.total > self.capacity_tokens:
            _, t = self._map.popitem(last=False)
            self.total -= t
        self.peak = max(self.peak, self.total)

    def tokens(self, conv: int) -> int:
        """Tokens of the conversation held in host memory (0 if none)."""
        return self._map.get(conv, 0)

    def pop(self, conv: int) -> None:
        """Drop the conversation's copy (it was read)."""
        self.total -= self._map.pop(conv, 0)


class RetentionPolicy:
    """What a decode node's retention does at a finish, under pressure and at release.

    Given its slice of the policy (:class:`~kvplan.sim.node_config.RetentionConfig`, built once per run by
    ``sim/node_setup.py``, which also sizes the offload tier from the hardware preset), the node's pins and the
    plan's conversation offsets (a lease's client knows a conversation's last turn). The router asks the node
    to renew a lease (``DecodeNode.renew_lease``); its TTL for lease runs is set in its own config.
    """

    def __init__(self, cfg: RetentionConfig, retention: Retention, conv_offsets: Sequence[int]) -> None:
        self.cfg = cfg
        self.retention = retention
        self.offsets = conv_offsets
        self.lease = cfg.lease
        self.evictable = cfg.evictable
        self.ttl_s = cfg.ttl_s
        self.lease_s = cfg.lease_s
        self.client_knows_end = cfg.client_knows_end
        self._idle_hold_s = 0.0
        if self.lease:
            hb = cfg.heartbeat_s
            self._idle_hold_s = hb * math.floor(cfg.idle_timeout_s / hb)

    def expiry_at_finish(self, conv: int, index: int, now: float) -> float:
        """The deadline of a pin made when turn ``index`` (flat plan index) of ``conv`` finished at ``now``."""
        if not self.lease:
            return pin_deadline_s(now, self.ttl_s)
        ends = self.client_knows_end and index + 1 >= self.offsets[conv + 1]
        return now + (0.0 if ends else self._idle_hold_s) + self.lease_s

    def renew(self, entry: KVParams, now: float) -> bool:
        """The conversation's next request reached the router: renew its lease if it is still alive."""
        assert self.lease
        if not self.retention.alive(entry.pin_id, now):
            return False
        expiry = now + self.lease_s
        self.retention.renew(entry.pin_id, expiry)
        entry.expiry_s = expiry
        return True

    def host_tier(self) -> HostTier | None:
        """A fresh host tier for one decode node (None: no offload)."""
        cap = self.cfg.host_capacity_tokens
        return None if cap is None else HostTier(cap)
