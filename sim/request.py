"""The request record of one turn in flight, and the transfer directions (compiled hot path)."""

from __future__ import annotations

from typing import Final

from kvplan.sim.itl import Root, Span
from kvplan.sim.router import KVParams

D2P: Final = 0  # bidirectional read-back: P reads D's retained blocks
P2D: Final = 1  # the ordinary direction: D reads P's freshly computed blocks
HOST2P: Final = 2  # offload tier: P reads D's host-memory copy (host-to-NIC bandwidth)
#: ``Request.reuse`` when the prompt repeats the conversation's whole previous context (verbatim history)
REUSE_ALL: Final = 1 << 62


class Request:
    """One turn in flight: the P leg then the D leg. Plain slots object (hot path)."""

    __slots__ = (
        "conv",
        "turn",
        "prompt",
        "output",
        "params",
        "index",
        "error",
        "p_node",
        "d_node",
        "p_remaining",
        "p_ctx",
        "p_decided",
        "p_compute_start",
        "local_hit",
        "d_blocks",
        "d_p",
        "d_j",
        "d_g0",
        "d_rem",
        "d_seq",
        "d_first_done",
        "d_generated",
        "d_resume",
        "d_preemptions",
        "d_state",
        "d_hit",
        "d_epoch",
        "p_blocks",
        "p_hold",
        "p_lease_expiry",
        "p_tracked",
        "p_lapsed",
        "reuse",
        "itl_old",
        "itl_skip",
        "itl_in",
        "itl_spans",
        "itl_extra",
        "last_tok_t",
        "d_tail",
        "d_tail_ctx",
        "wait_t",
        "last",
    )

    def __init__(
        self, conv: int, turn: int, index: int, prompt: int, output: int, params: KVParams | None
    ) -> None:
        self.conv = conv
        self.turn = turn
        self.index = index  # flat turn index in the ConversationPlan
        self.prompt = prompt
        self.output = output
        self.params = params
        self.error = False
        self.p_node = -1
        self.d_node = -1
        self.p_remaining = 0
        self.p_ctx = 0
        self.p_decided = False
        self.p_compute_start = -1.0
        self.local_hit = 0
        self.d_blocks = 0  # KV blocks this request holds in D's pool outside the batch (admitted, not joined)
        # in D's batch: virtual prompt (tokens its next step attends), join step, tokens sampled at join,
        # steps left at join, finish-heap sequence number (-1 once it left)
        self.d_p = prompt
        self.d_j = 0
        self.d_g0 = 0
        self.d_rem = output
        self.d_seq = -1
        self.d_first_done = False
        self.d_generated = 0  # tokens sampled when last preempted
        self.d_resume = False  # preempted: recompute locally on D when readmitted
        self.d_preemptions = 0
        self.d_state = 0  # 0 waiting/in batch, 1 recomputing on D, 2 recomputed and waiting to join
        self.d_hit = 0  # D prefix-hit tokens at its last (re)admission
        self.d_epoch = 0  # bumped when a recompute in progress is preempted (its completion is then ignored)
        self.p_blocks = 0  # KV blocks this request holds in P's pool (computing, pulling or held for D)
        self.p_hold = False  # P holds its prompt's blocks under a lease until D has read them
        self.p_lease_expiry = 0.0  # P's initial lease deadline
        self.p_tracked = False  # D heartbeats P's lease (it reached D before the lease ran out)
        self.p_lapsed = False  # the lease ran out: P freed the blocks and D's read will fail
        # tokens of the conversation's previous context (prompt + output) this prompt repeats token for token
        # (sim/history.py: workload.history, or a weka trace's hash prefix); REUSE_ALL = all of it
        self.reuse = REUSE_ALL
        # inter-token gaps (sim/itl.py): the engine's step histogram at the start of this stay in its batch and
        # the bucket of the stay's first step (not a gap), earlier stays, gaps around preemptions, last token time
        self.itl_old: Root | None = None
        self.itl_skip = 0
        self.itl_in = False
        self.itl_spans: list[Span] | None = None
        self.itl_extra: list[int] | None = None
        self.last_tok_t = 0.0
        # no later request of this conversation reaches the router (sim/driver.py): D keeps no router entry
        self.last = False
        self.d_tail = 0  # prompt tokens D computes in the request's first step (PR #55801 short tail), on d_tail_ctx
        self.d_tail_ctx = 0
        self.wait_t = 0.0  # when it last became schedulable (async scheduling: it joins the step after the next)
