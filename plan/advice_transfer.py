"""The transfer knob of the advice: ``cross_layer_blocks`` (vLLM's ``enable_cross_layers_blocks``).

NIXL posts one descriptor per (registered region x block) (VLLM_BEHAVIOUR.md 1.11: ``num_descs = num_regions
x num_blocks``); with cross-layer blocks a logical block is contiguous over the layers, so one region per rank
(:func:`kvplan.models.arch.kv_regions_per_rank`). When pulls are a large part of TTFT (the mean pull at least
:data:`PULL_SHARE_TRIAL` of the TTFT p50: the median, so that queueing tails do not hide it)
:mod:`kvplan.plan.advice` simulates its recommendation again with
``deployment.cross_layer_blocks: true`` (same seeds) and reports what the descriptor count costs
(:func:`descriptor_cost`): the pull of the mean pulled size on an idle link with and without cross-layer
blocks, against the line rate (bytes x per_byte_s).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan.sim.engine import Resolved
from kvplan.sim.pull import read_path
from kvplan.sim.request import D2P, P2D

#: The cross-layer trial runs when the mean pull is at least this share of the TTFT p50 (or the D leg's P->D reads,
#: per turn: the flag makes those reads cheaper too, with retention on or off).
PULL_SHARE_TRIAL = 0.25
#: ... or when the flag's break-even is at most this share of the chosen threshold: the descriptors set the threshold,
#: which then recomputes the pulls the flag would make cheap, so the pulls left cannot show what the flag is worth
#: (aud15: Qwen3-8B on h800 TP8, chat at 2/s: threshold 26,066 tokens, a 221.7 ms pull with 117,000 descriptors per
#: rank, 22.1 ms with cross-layer blocks; pulls 0.2% of TTFT p50, no trial, and the flag with its own break-even was
#: 9% lower on TTFT mean and 18% on p90).
BREAK_EVEN_SHARE_TRIAL = 0.5
#: vLLM's switch (kv_connector_extra_config, nixl_connector_usage.md) behind deployment.cross_layer_blocks.
VLLM_FLAG = "enable_cross_layers_blocks"


@dataclass(frozen=True)
class DescriptorCost:
    """One pull of ``tokens`` per rank: descriptors and idle-link visible pull time with and without cross-layer."""

    tokens: int
    descriptors: int
    descriptors_cross_layer: int
    pull_s: float
    pull_cross_layer_s: float
    line_rate_s: float

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return {"tokens": self.tokens, "descriptors_per_rank": self.descriptors,
                "descriptors_per_rank_cross_layer": self.descriptors_cross_layer, "pull_s": self.pull_s,
                "pull_cross_layer_s": self.pull_cross_layer_s, "line_rate_s": self.line_rate_s}


def descriptor_cost(rs: Resolved, tokens: int, p2d: bool = False) -> DescriptorCost:
    """What a ``tokens``-token D->P pull (``p2d``: the D leg's P->D read) costs per reader rank as the simulator
    composes it (sim/pull.py: the reader's costs, the heterogeneous-TP rank plan, the link), without and with
    cross-layer blocks."""
    direction = P2D if p2d else D2P
    plain, cross = (read_path(rs.scenario, rs, direction, cross_layer=x) for x in (False, True))
    d0, nbytes = plain.phases(tokens)[:2]
    return DescriptorCost(tokens, d0, cross.phases(tokens)[0], plain.time_s(tokens), cross.time_s(tokens),
                          nbytes * plain.per_byte_s)


def p2d_text(dc: DescriptorCost, m_off: dict[str, float], m_on: dict[str, float], gain: tuple[float, float],
             adopted: bool, fmt: Any) -> str:
    """The rationale sentence of the cross-layer trial run because the D leg's P->D reads are a large part of TTFT
    (``dc`` at their mean size)."""
    verdict = (f"enable it ({VLLM_FLAG}: true in kv_connector_extra_config on P and D, where the attention backend "
               "supports it)" if adopted else "no significant gain here")
    return (f"Transfer: the D leg's P->D reads take {fmt(m_off['p2d_transfer_mean_s'])} per turn of a "
            f"{fmt(m_off['ttft_p50_s'])} TTFT p50; a {dc.tokens:,}-token read posts {dc.descriptors:,} descriptors per "
            f"rank (regions x blocks), {fmt(dc.pull_s)} on an idle link against {fmt(dc.line_rate_s)} at line rate; "
            f"with cross_layer_blocks {dc.descriptors_cross_layer:,} descriptors, {fmt(dc.pull_cross_layer_s)}. "
            f"Simulated with the same seeds: TTFT p50 {fmt(m_off['ttft_p50_s'])} -> {fmt(m_on['ttft_p50_s'])}, p90 "
            f"{fmt(m_off['ttft_p90_s'])} -> {fmt(m_on['ttft_p90_s'])} (mean {fmt(gain[0])} lower): {verdict}.")


def mean_p2d_tokens(row: dict[str, Any]) -> int:
    """Mean tokens per P->D read of one run row (0 without reads)."""
    reads = float(row.get("p2d_reads") or 0)
    return int(round(float(row.get("p2d_tokens_total") or 0) / reads)) if reads else 0


def mean_pulled_tokens(row: dict[str, Any]) -> int:
    """Mean tokens per pull of one run row (0 without pulls)."""
    pulls = int(row.get("decisions.pull") or 0)
    return int(round(float(row.get("pulled_tokens") or 0) / pulls)) if pulls else 0


def trial_text(dc: DescriptorCost, m_off: dict[str, float], m_on: dict[str, float], gain: tuple[float, float],
               adopted: bool, fmt: Any) -> str:
    """The rationale sentence of the cross-layer trial (``fmt`` renders seconds)."""
    verdict = (f"enable it ({VLLM_FLAG}: true in kv_connector_extra_config on P and D, where the attention backend "
               "supports it)" if adopted else "no significant gain here")
    return (f"Transfer: pulls take {fmt(m_off['kv_pull_mean_s'])} of a {fmt(m_off['ttft_p50_s'])} TTFT p50; a "
            f"{dc.tokens:,}-token pull posts {dc.descriptors:,} descriptors per rank (regions x blocks), "
            f"{fmt(dc.pull_s)} on an idle link against {fmt(dc.line_rate_s)} at line rate; with cross_layer_blocks "
            f"{dc.descriptors_cross_layer:,} descriptors, {fmt(dc.pull_cross_layer_s)}. Simulated with the same seeds: "
            f"TTFT p50 {fmt(m_off['ttft_p50_s'])} -> {fmt(m_on['ttft_p50_s'])}, p90 {fmt(m_off['ttft_p90_s'])} -> "
            f"{fmt(m_on['ttft_p90_s'])} (mean {fmt(gain[0])} lower): {verdict}.")


def threshold_trial_text(dc: DescriptorCost, break_even_cross_layer: int, m_off: dict[str, float],
                         m_on: dict[str, float], gain: tuple[float, float], adopted: bool, fmt: Any) -> str:
    """The rationale sentence of the cross-layer trial run because the descriptors set the threshold (``dc`` at the
    chosen threshold; the trial's runs with the flag at ``break_even_cross_layer``)."""
    verdict = (f"enable it ({VLLM_FLAG}: true in kv_connector_extra_config on P and D, where the attention backend "
               "supports it)" if adopted else "no significant gain here")
    return (f"Transfer: the threshold {dc.tokens:,} tokens is where a pull stops beating recompute because a "
            f"{dc.tokens:,}-token pull posts {dc.descriptors:,} descriptors per rank (regions x blocks), "
            f"{fmt(dc.pull_s)} on an idle link against {fmt(dc.line_rate_s)} at line rate; with cross_layer_blocks "
            f"{dc.descriptors_cross_layer:,} descriptors, {fmt(dc.pull_cross_layer_s)}, and the break-even falls to "
            f"{break_even_cross_layer:,} tokens. Simulated with the same seeds, the flag at that threshold: TTFT p50 "
            f"{fmt(m_off['ttft_p50_s'])} -> {fmt(m_on['ttft_p50_s'])}, p90 {fmt(m_off['ttft_p90_s'])} -> "
            f"{fmt(m_on['ttft_p90_s'])} (mean {fmt(gain[0])} lower): {verdict}.")
