"""The KV-cache-aware router (vLLM's ``disagg_proxy_multiturn.py``).

Keeps ``conversation_id -> D's kv_transfer_params`` from the last SSE chunk of each D response. The
lookup is **single-use** (the entry is popped) and an entry older than the router TTL (hard-coded
450 s in the reference proxy, "must stay below the 480 s timeout") is stale and gives a miss. P and D
instances are chosen by independent round-robin iterators (the reference proxy) or sticky per
conversation. The entry's age is measured from when the proxy cached it (end of the D response).

``random``: every request picks an instance uniformly at random, independently of the previous ones. It is
what a Kubernetes ClusterIP Service does in front of replicas: kube-proxy's iptables mode "chooses a backend
at random" per new connection (kubernetes.io/docs/reference/networking/virtual-ips/, ``iptables`` proxy mode:
one ``-m statistic --mode random --probability 1/k`` rule per remaining endpoint), so a client that opens a
connection per request (vLLM ``benchmark_serving``'s one ``aiohttp.ClientSession`` per request) gets an
independent uniform draw per request (OVN-Kubernetes Services, OpenShift's default, choose per new connection
by a hash of the 5-tuple: also independent per request; uniform is the stated assumption). Dynamo's
``RouterMode::Random`` is the same choice. The draws come from their own stream of the run's seed
(:func:`router_seed`), so a run stays reproducible and its workload draws are untouched.

KV-aware choices (not in the reference proxy; the scorers of llm-d's inference scheduler and vLLM's
production-stack router work this way): ``session_affinity`` pins a conversation to one instance
(``conversation mod n``, the same map as ``sticky``), so its next turn meets its own prefix cache on P and
its retained blocks on D; ``prefix_aware`` sends each request to the instance holding the longest cached
(or, on D, retained) prefix of the conversation, ties to the least loaded (requests queued + running),
then to the lowest index. The router reads the instances' state directly (an idealised, always-fresh
KV-event feed: stated assumption).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Final, Protocol

import numpy as np

from kvplan.sim.evlog import RR_HIT, RR_NO_CONVERSATION_ID, RR_NO_ENTRY, RR_STALE
from kvplan.sim.node_config import RouterConfig

ROUTER_STREAM: Final = 0x524F5554  # "ROUT": the router's own SeedSequence stream of the run's seed


class KVParams:
    """What D returns in ``kv_transfer_params`` (pull_scheduler.request_finished).

    A plain class with its ``__init__`` written out, not a ``@dataclass``: compiled (sim/native.py), a
    dataclass's constructor runs the ``__init__`` the decorator generates in Python (about 1,100 instructions per
    construction); this one is native."""

    __slots__ = ("decode_node", "remote_num_tokens", "expiry_s", "cached_at_s", "pin_id")

    def __init__(self, decode_node: int, remote_num_tokens: int, expiry_s: float, cached_at_s: float, pin_id: int) -> None:
        self.decode_node = decode_node
        self.remote_num_tokens = remote_num_tokens  # prompt + generated - 1: the last sampled token never gets KV
        self.expiry_s = expiry_s  # D's remote_blocks_expiry_time on D's clock (finish + decoder_kv_blocks_ttl)
        self.cached_at_s = cached_at_s
        self.pin_id = pin_id


class Instance(Protocol):
    """What a KV-aware router asks an instance."""

    def cached_tokens(self, conv: int) -> int:
        """Tokens of the conversation's context this instance holds (cache or retention), without touching LRU."""
        ...

    def load(self) -> int:
        """Requests queued or running on the instance."""
        ...


class LeaseHolder(Instance, Protocol):
    """A decode instance whose retained blocks a lookup can renew (lease retention, ``sim/retention_policy.py``)."""

    def renew_lease(self, entry: KVParams, now: float) -> bool:
        """Renew the entry's lease to ``now + lease_s`` if it is still alive; False when it lapsed."""
        ...


def pick_prefix_aware(conv: int, nodes: Sequence[Instance]) -> int:
    """Index of the instance with the longest cached prefix of ``conv``; ties to the least loaded, then the lowest."""
    best, best_key = 0, (1, 0)
    for i, n in enumerate(nodes):
        key = (-n.cached_tokens(conv), n.load())
        if i == 0 or key < best_key:
            best, best_key = i, key
    return best


def router_seed(seed: int) -> int:
    """The seed of the ``random`` router's draws: a stream of ``SeedSequence([seed, ROUTER_STREAM])``, independent
    of the workload's draws (which use ``seed`` itself)."""
    return int(np.random.SeedSequence([seed, ROUTER_STREAM]).generate_state(1)[0])


STICKY: Final = ("sticky", "session_affinity")
KV_AWARE_ROUTING: Final = ("sticky", "session_affinity", "prefix_aware")  # the next turn tends to meet its own cache


class Router:
    """Conversation map plus instance choice."""

    __slots__ = ("ttl_s", "routing", "n_p", "n_d", "_map", "_rr_p", "_rr_d", "p_nodes", "d_nodes", "renews", "_rng")

    def __init__(self, cfg: RouterConfig) -> None:
        self.ttl_s = cfg.ttl_s
        self.routing = cfg.routing
        self.n_p = cfg.n_prefill
        self.n_d = cfg.n_decode
        self.renews = cfg.renews_leases
        self._map: dict[int, KVParams] = {}
        self._rr_p = 0
        self._rr_d = 0
        self.p_nodes: Sequence[Instance] = ()
        self.d_nodes: Sequence[LeaseHolder] = ()
        # ``random`` routing's draws (the other routings never touch it)
        self._rng = random.Random(router_seed(cfg.seed)) if cfg.routing == "random" else None

    def bind(self, p_nodes: Sequence[Instance], d_nodes: Sequence[LeaseHolder]) -> None:
        """Give the router the instances whose state ``prefix_aware`` reads (and, on D, whose leases it renews)."""
        self.p_nodes, self.d_nodes = p_nodes, d_nodes

    def lookup(self, conv: int, now: float, has_conversation_id: bool) -> tuple[int, KVParams | None]:
        """Pop the conversation's entry (single use); stale entries are discarded as misses."""
        if not has_conversation_id:
            return RR_NO_CONVERSATION_ID, None
        key: Any = conv  # boxed once for both calls (compiled: an int key is boxed at every dictionary call)
        entry = self._map.get(key)  # get and del: native dictionary operations compiled (pop with a default is not)
        if entry is None:
            return RR_NO_ENTRY, None
        del self._map[key]
        if now - entry.cached_at_s > self.ttl_s:
            return RR_STALE, None
        if self.renews and not self.d_nodes[entry.decode_node].renew_lease(entry, now):
            return RR_STALE, None  # the lease lapsed: the router saw the heartbeats stop
        return RR_HIT, entry

    def store(self, conv: int, params: KVParams) -> None:
        """Cache D's params for the conversation's next turn (overwrites any older entry)."""
        self._map[conv] = params

    def pick_prefill(self, conv: int) -> int:
        """P instance for this request."""
        if self.routing in STICKY:
            return conv % self.n_p
        if self.routing == "prefix_aware" and self.p_nodes:
            return pick_prefix_aware(conv, self.p_nodes)
        if self._rng is not None:
            return self._rng.randrange(self.n_p)
        i = self._rr_p
        self._rr_p = (i + 1) % self.n_p
        return i

    def pick_decode(self, conv: int) -> int:
        """D instance for this request."""
        if self.routing in STICKY:
            return conv % self.n_d
        if self.routing == "prefix_aware" and self.d_nodes:
            return pick_prefix_aware(conv, self.d_nodes)
        if self._rng is not None:
            return self._rng.randrange(self.n_d)
        i = self._rr_d
        self._rr_d = (i + 1) % self.n_d
        return i

    def entries(self) -> int:
        """Entries currently held (a stale entry stays until its conversation's next lookup)."""
        return len(self._map)
