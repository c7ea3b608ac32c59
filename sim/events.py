"""The append-only event log: the single source of truth of a run.

Every record is a plain tuple ``(t_s, kind, conv, turn, node, a, b)`` appended in simulation order
(except lazily expired retention, whose release is logged with its true expiry time when noticed).
Per-turn records, the summary and every time series are pure functions of this log (``results.py``).
The meaning of ``a`` and ``b`` per kind is in :data:`FIELDS`.
"""

from __future__ import annotations

from enum import IntEnum


class Ev(IntEnum):
    """Event kinds."""

    ARRIVE = 0  # turn reaches the router; a=prompt tokens, b=output tokens
    ROUTER = 1  # router lookup; a=RouterResult
    P_ENQUEUE = 2  # request reaches P's engine; node=P
    P_DECISION = 3  # connector decision when scheduled; a=Decision, b=local-hit tokens
    PULL_START = 4  # D->P read posted; node=D it reads from; a=tokens, b=bytes summed over ranks
    PULL_DONE = 5  # D->P read complete; a=xferDuration s (per rank), b=postDuration s
    P_COMPUTE = 6  # first prefill chunk of this request starts; a=tokens to compute
    P_DONE = 7  # P leg finished (its one token sampled); a=prefill compute wall time s, b=bytes P now holds for D
    D_ENQUEUE = 8  # request reaches D; node=D
    D_ADMIT = 9  # D allocated KV blocks; a=D local-hit tokens, b=blocks newly allocated
    P2D_START = 10  # P->D read posted; a=tokens, b=bytes summed over ranks
    P2D_DONE = 11  # P->D read complete; a=xferDuration s
    D_FIRST = 12  # first token (end of the first decode step including the request)
    D_FINISH = 13  # response complete; a=output tokens
    PIN = 14  # D retains blocks; node=D; a=tokens, b=expiry time s
    UNPIN = 15  # retention ends; node=D; a=tokens, b=Release
    ERROR = 16  # request failed; a=error reason (Decision.ERROR cause)
    SKIP = 17  # turn not sent (conversation ended by the context limit); a=prompt tokens
    D_PREEMPT = 30  # D preempted the running request (recompute); a=tokens sampled so far, b=KV tokens freed
    D_RECOMPUTE = 31  # preempted request readmitted on D, recomputing locally; a=tokens recomputed, b=D hit tokens
    P_UNHOLD = 33  # P frees the prompt's blocks it held from P_DONE for D's read; node=P; a=tokens, b=HoldRelease
    P2D_FAILED = 34  # D's read found P's lease lapsed: D recomputes locally; a=tokens recomputed, b=D hit tokens


class Decision(IntEnum):
    """What P did with a turn (``turns.csv`` column ``decision``)."""

    LOCAL = 0
    PULL = 1
    RECOMPUTE_BELOW_THRESHOLD = 2
    MISS = 3
    EXPIRED = 4
    ERROR = 5
    HOST_PULL = 6  # D's blocks were gone from HBM but P pulled them from D's host-memory offload tier


DECISION_NAMES = {
    Decision.LOCAL: "local",
    Decision.PULL: "pull",
    Decision.RECOMPUTE_BELOW_THRESHOLD: "recompute_below_threshold",
    Decision.MISS: "miss",
    Decision.EXPIRED: "expired",
    Decision.ERROR: "error",
    Decision.HOST_PULL: "host_pull",
}


class RouterResult(IntEnum):
    """Router lookup outcome."""

    HIT = 0
    NO_ENTRY = 1
    STALE = 2
    NO_CONVERSATION_ID = 3


class Release(IntEnum):
    """Why retained blocks were released."""

    READ = 0  # P read them (D->P pull done, NIXL notification)
    NOTIFIED = 1  # P decided local/recompute and notified D
    EXPIRED = 2  # TTL passed
    REUSED = 3  # the next turn landed on the same D and took the blocks as its prefix
    EVICTED = 4  # ttl_evictable: admission or growth on D needed the blocks (LRU among pins)


class HoldRelease(IntEnum):
    """Why P freed the blocks it held for D (``P_UNHOLD``)."""

    READ = 0  # D's read completed (NIXL notification)
    NOTIFIED = 1  # D recomputed the tail below the threshold and notified P
    LAPSED = 2  # the lease ran out before D's first heartbeat
    END = 3  # end of run


FIELDS: dict[Ev, tuple[str, str]] = {
    Ev.ARRIVE: ("prompt_tokens", "output_tokens"),
    Ev.ROUTER: ("router_result", ""),
    Ev.P_ENQUEUE: ("", ""),
    Ev.P_DECISION: ("decision", "local_hit_tokens"),
    Ev.PULL_START: ("tokens", "bytes"),
    Ev.PULL_DONE: ("xfer_s", "post_s"),
    Ev.P_COMPUTE: ("tokens", ""),
    Ev.P_DONE: ("prefill_s", "held_bytes"),
    Ev.D_ENQUEUE: ("", ""),
    Ev.D_ADMIT: ("d_hit_tokens", "blocks"),
    Ev.P2D_START: ("tokens", "bytes"),
    Ev.P2D_DONE: ("xfer_s", ""),
    Ev.D_FIRST: ("", ""),
    Ev.D_FINISH: ("output_tokens", ""),
    Ev.PIN: ("tokens", "expiry_s"),
    Ev.UNPIN: ("tokens", "release"),
    Ev.ERROR: ("reason", ""),
    Ev.SKIP: ("prompt_tokens", ""),
    Ev.D_PREEMPT: ("sampled_tokens", "kv_tokens"),
    Ev.D_RECOMPUTE: ("tokens", "d_hit_tokens"),
    Ev.P_UNHOLD: ("tokens", "hold_release"),
    Ev.P2D_FAILED: ("tokens", "d_hit_tokens"),
}

COLUMNS = ("t_s", "kind", "conv", "turn", "node", "a", "b")
