"""A prefix shared by many conversations (the same system prompt and tool definitions): held once per node.

vLLM's prefix cache keys a full block by the hash of its tokens and of the blocks before it
(``vllm/v1/core/kv_cache_utils.py`` ``hash_block_tokens``; ``block_pool.py`` ``get_cached_block``), so every
request whose prompt starts with the same tokens maps those blocks to the same physical blocks, reference
counted (``KVCacheBlock.ref_cnt``): computed once per engine, stored once, and never transferred to an engine
that has them. Conversations are grouped (``ConversationPlan.shared_group``); group ``g`` shares its first
tokens; conversation ``c`` shares its first ``shared_tokens[c]`` of them (less when its own prefix is
shorter), counted in the model's full blocks.

Per node this keeps which groups' prefixes the node has seen (after one request of the group was computed
or admitted there; a block every conversation of the group hits stays at the hot end of the LRU, so it is
taken as resident from then on) and, on D, the pins that refer to each group: the group's blocks are pinned
once while at least one pin of the group holds them, and each pin counts only its own blocks
(``vllm/v1/core/block_pool.py`` frees a block when its last reference goes).

What this does not model (stated): P's evictable cache and D's running requests still count a
conversation's whole context (shared blocks included), an overstatement of evictable cache and of running
requests' blocks, never of pinned KV; the shared prefix on a node is never evicted; aggregated mode
(``sim/aggregated.py``) does not share prefixes across conversations.
"""

from __future__ import annotations

from collections.abc import Sequence


class SharedPrefixes:
    """Shared-prefix state of one node (compiled hot path)."""

    __slots__ = ("group", "tokens", "bs", "seen", "refs", "pinned_tokens")

    def __init__(self, group: Sequence[int], tokens: Sequence[int], block_size: int) -> None:
        self.group = group  # per conversation: its group, -1 for none
        self.tokens = tokens  # per conversation: its tokens of the group's shared prefix
        self.bs = block_size
        self.seen: set[int] = set()
        self.refs: dict[int, int] = {}  # group -> pins referring to its blocks (D)
        self.pinned_tokens: dict[int, int] = {}  # group -> tokens pinned once for those pins (D)

    def full_tokens(self, conv: int, tokens: int) -> int:
        """The conversation's shared tokens in full blocks, within its first ``tokens`` tokens."""
        if self.group[conv] < 0:
            return 0
        s = self.tokens[conv]
        if s > tokens:
            s = tokens
        return (s // self.bs) * self.bs

    def hit(self, conv: int, cap: int) -> int:
        """Tokens of the shared prefix this node already holds for the conversation (0 if not seen), <= cap."""
        g = self.group[conv]
        if g < 0 or g not in self.seen:
            return 0
        return self.full_tokens(conv, cap)

    def see(self, conv: int) -> None:
        """A request of the conversation's group was computed or admitted here: its prefix is resident."""
        g = self.group[conv]
        if g >= 0:
            self.seen.add(g)

    def pin(self, conv: int, kv_tokens: int) -> tuple[int, int]:
        """A finished request of the conversation pins ``kv_tokens``: (shared tokens it leaves to the group,
        tokens the group pins now: its prefix when no other pin of the group holds it, else 0)."""
        g = self.group[conv]
        if g < 0:
            return 0, 0
        s = self.full_tokens(conv, kv_tokens)
        if s <= 0:
            return 0, 0
        n = self.refs.get(g, 0)
        self.refs[g] = n + 1
        self.seen.add(g)
        if n == 0:
            self.pinned_tokens[g] = s
            return s, s
        held = self.pinned_tokens[g]
        return (s if s < held else held), 0

    def unpin(self, conv: int) -> int:
        """A pin of the conversation's group is released: the tokens the group unpins (its prefix when this
        was the last pin holding it, else 0)."""
        g = self.group[conv]
        n = self.refs.get(g, 0) - 1
        if n > 0:
            self.refs[g] = n
            return 0
        self.refs.pop(g, None)
        return self.pinned_tokens.pop(g, 0)
