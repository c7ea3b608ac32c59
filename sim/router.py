"""The KV-cache-aware router (vLLM's ``disagg_proxy_multiturn.py``).

Keeps ``conversation_id -> D's kv_transfer_params`` from the last SSE chunk of each D response. The
lookup is **single-use** (the entry is popped) and an entry older than the router TTL (hard-coded
450 s in the reference proxy, "must stay below the 480 s timeout") is stale and gives a miss. P and D
instances are chosen by independent round-robin iterators (the reference proxy) or sticky per
conversation. The entry's age is measured from when the proxy cached it (end of the D response).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.sim.events import RouterResult


@dataclass(slots=True)
class KVParams:
    """What D returns in ``kv_transfer_params`` (pull_scheduler.request_finished)."""

    decode_node: int
    remote_num_tokens: int  # prompt + generated - 1: the last sampled token never gets KV
    expiry_s: float  # D's remote_blocks_expiry_time on D's clock (finish + decoder_kv_blocks_ttl)
    cached_at_s: float
    pin_id: int


class Router:
    """Conversation map plus instance choice."""

    __slots__ = ("ttl_s", "routing", "n_p", "n_d", "_map", "_rr_p", "_rr_d")

    def __init__(self, ttl_s: float, routing: str, n_prefill: int, n_decode: int) -> None:
        self.ttl_s = ttl_s
        self.routing = routing
        self.n_p = n_prefill
        self.n_d = n_decode
        self._map: dict[int, KVParams] = {}
        self._rr_p = 0
        self._rr_d = 0

    def lookup(self, conv: int, now: float, has_conversation_id: bool) -> tuple[RouterResult, KVParams | None]:
        """Pop the conversation's entry (single use); stale entries are discarded as misses."""
        if not has_conversation_id:
            return RouterResult.NO_CONVERSATION_ID, None
        entry = self._map.pop(conv, None)
        if entry is None:
            return RouterResult.NO_ENTRY, None
        if now - entry.cached_at_s > self.ttl_s:
            return RouterResult.STALE, None
        return RouterResult.HIT, entry

    def store(self, conv: int, params: KVParams) -> None:
        """Cache D's params for the conversation's next turn (overwrites any older entry)."""
        self._map[conv] = params

    def pick_prefill(self, conv: int) -> int:
        """P instance for this request."""
        if self.routing == "sticky":
            return conv % self.n_p
        i = self._rr_p
        self._rr_p = (i + 1) % self.n_p
        return i

    def pick_decode(self, conv: int) -> int:
        """D instance for this request."""
        if self.routing == "sticky":
            return conv % self.n_d
        i = self._rr_d
        self._rr_d = (i + 1) % self.n_d
        return i

    def entries(self) -> int:
        """Entries currently held (a stale entry stays until its conversation's next lookup)."""
        return len(self._map)
