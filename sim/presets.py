"""Built-in workload presets with their sources: ``preset_scenario(name, model, hardware, rate_per_s)``.

Every number below cites where it comes from (``../shared/WORKLOADS.md`` sections; "ASSUMPTION" marks
what no source pins down). The scenario's distributions are constant / exponential / lognormal / uniform /
empirical, so anything else (geometric turn counts, mixtures) is turned into an ``empirical`` sample of a
few thousand values built **deterministically** from stratified quantiles of the target distribution (no
random numbers: the same preset gives the same scenario on every machine).

Conversations that never return are modelled by the turn-count distribution: the final turn of every
conversation still pins its KV on D for the whole TTL (the simulator does this for every finished turn),
so a preset with P(follow-up) = 0.4 holds ~60% of its retained KV for conversations that never come back.

* ``chat``: human chat assistant. Gaps lognormal, median 130 s, p90 480 s (Mooncake/Kimi, computed in
  WORKLOADS.md 1 and 3.1: p50 126 s, p90 480 s); P(follow-up) 0.4 per turn (Mooncake >= 0.39, RAGPulse
  0.44), so turns ~ geometric, mean 1/(1-0.4) = 1.67, at most 40.
* ``coding-agent``: Claude Code sessions fitted from the AgentX / Weka sample (``external_traces/agentx_weka``):
  80% of gaps follow a tool call (p50 10 s, p90 102 s), 20% a user message (p50 129 s, p90 52 min); first
  prompts p50 19.6k tokens, ~75 requests per session, an 11.9k-token tool prefix shared by all sessions.
  Contexts grow past 100k tokens: use a long-context model (``glm-5-fp8``: 202,752) or ``max_model_len``.
* ``tool-agent``: headless function-calling agent (BFCL / SWE-bench runner): ~8 steps, ~1 s tool gaps.
* ``p5en-benchmark``: the published P5en write-up's closed-loop benchmark (``sim.defaults``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import special

from kvplan.errors import input_error
from kvplan.sim.defaults import published_benchmark
from kvplan.sim.scenario import Scenario, scenario_from_dict, with_overrides

Z90 = float(special.ndtri(0.90))  # 1.2816: standard-normal 90th percentile
SAMPLE_VALUES = 4000  # size of the empirical samples built from mixtures
GAP_CAP_S = 3600.0  # WORKLOADS.md 5 "cap": a gap beyond 1 h is a miss for every TTL <= 1 h - 5 s; capping
# it only shortens the simulated tail after the last arrival (stated, not silent)


def sigma_from_p50_p90(p50: float, p90: float) -> float:
    """Lognormal sigma (of ln) with the given median and 90th percentile: ``ln(p90 / p50) / z_0.9``."""
    return math.log(p90 / p50) / Z90


def lognormal_quantiles(median: float, sigma: float, n: int) -> np.ndarray:
    """``n`` mid-quantiles ``median x exp(sigma x Phi^-1((j + 0.5) / n))`` (stratified, deterministic)."""
    u = (np.arange(n) + 0.5) / n
    return median * np.exp(sigma * special.ndtri(u))


def mixture_sample(
    components: list[tuple[float, float, float]], n: int = SAMPLE_VALUES, cap: float | None = None, decimals: int = 3
) -> tuple[float, ...]:
    """Deterministic sample of a lognormal mixture ``[(weight, median, sigma), ...]``: ``round(weight x n)``
    stratified quantiles per component, optionally capped, rounded to ``decimals``, sorted."""
    parts = [lognormal_quantiles(med, sig, max(1, round(w * n))) for w, med, sig in components]
    v = np.sort(np.concatenate(parts))
    if cap is not None:
        v = np.minimum(v, cap)
    return tuple(float(x) for x in np.round(v, decimals))


def geometric_turns_sample(p_follow_up: float, max_turns: int, n: int = 1000) -> tuple[float, ...]:
    """Turns per conversation when each turn gets a follow-up with probability ``p_follow_up``.

    ``P(T = k) = (1 - p) p^(k-1)``, truncated at ``max_turns`` and renormalised; value ``k`` appears
    ``round(n x P(T = k))`` times (at least once for k = 1), so the sample's mean is within ~1/n of the
    geometric's ``1 / (1 - p)``.
    """
    k = np.arange(1, max_turns + 1)
    pmf = (1 - p_follow_up) * p_follow_up ** (k - 1)
    pmf /= pmf.sum()
    counts = np.rint(pmf * n).astype(int)
    counts[0] = max(counts[0], 1)
    return tuple(float(x) for x in np.repeat(k, counts))


@dataclass(frozen=True)
class PresetInfo:
    """What a preset models, its defaults and its sources."""

    name: str
    description: str
    default_rate_per_s: float | None
    conversations: int
    sources: tuple[str, ...]


def _lognormal(median: float, sigma: float) -> dict[str, Any]:
    return {"dist": "lognormal", "median": median, "sigma": sigma}


def _empirical(values: tuple[float, ...]) -> dict[str, Any]:
    return {"dist": "empirical", "values": list(values)}


# --- chat --------------------------------------------------------------------------------------------------
CHAT_GAP_P50_S = 130.0  # Mooncake conversation trace, arrival-to-arrival p50 126 s (WORKLOADS.md 1, 3.1)
CHAT_GAP_P90_S = 480.0  # Mooncake p90 480 s (WORKLOADS.md 1); -> sigma 1.02 (their fit: 0.98)
CHAT_P_FOLLOW_UP = 0.4  # Mooncake >= 0.39 (39-min window), RAGPulse 0.44 (WORKLOADS.md 1 item 2)
CHAT_MAX_TURNS = 40  # WORKLOADS.md 5 chat.max_turns
CHAT_FIRST_PROMPT = (1000.0, 1.0)  # Azure 2023 conversation input p50 1,020 (WORKLOADS.md 3.3, 5)
CHAT_USER_MIX = [(0.95, 60.0, 1.3), (0.05, 5000.0, 1.0)]  # short messages (LMSYS ~70, Mooncake p50 26) +
# occasional pasted documents (Mooncake p90 4.4k) (WORKLOADS.md 5 chat.user_tokens_per_turn)
CHAT_OUTPUT = (250.0, 0.8)  # Azure conv p50 129, Mooncake 350, LMSYS ~215 (WORKLOADS.md 5)
CHAT_RATE_PER_S = 1.0  # ASSUMPTION: new conversations/s on 1P1D; ~1.7 turns/s, P ~15% busy, pinned ~25% of D
CHAT_CONVERSATIONS = 4000  # ~4000 s of arrivals: steady state for TTLs up to ~30 min

# --- coding agent ------------------------------------------------------------------------------------------
# Fitted from the AgentX / Weka kv-cache-tester sample (../shared/external_traces/agentx_weka, SOURCE.md: 50
# real Claude Code sessions, 4,118 requests, 5 sub-agents; sessions are the 50 main agents and 5 sub-agents):
# kvplan.traces.weka_stats.coding_agent_fit, printed by benchmarks/derive_agentx_preset.py and re-derived by
# tests/test_weka.py. Lognormals are given by (p50, p90) of the sample.
CODING_TOOL_SHARE = 0.797  # 79.7% of follow-ups answer a tool result (input_types), the rest a user message
CODING_TOOL_P50_S, CODING_TOOL_P90_S = 10.0, 102.0  # think_time after a tool call: p50 10 s, p90 102 s
CODING_HUMAN_P50_S, CODING_HUMAN_P90_S = 129.0, 3106.0  # think_time before a user message: p50 129 s, p90 52 min
CODING_TURNS = (3, 4, 4, 4, 4, 4, 5, 6, 7, 7, 10, 12, 18, 18, 19, 19, 20, 21, 21, 24, 24, 28, 29, 34, 35, 36, 47, 57,
                62, 64, 67, 68, 68, 71, 71, 89, 95, 96, 99, 103, 123, 130, 136, 136, 144, 148, 152, 163, 189, 196,
                201, 210, 219, 226, 272)  # requests per session (the 55 sessions; mean 74.9)
CODING_FIRST_PROMPT = (19641.0, 161541.0)  # first request's input: p50 19.6k, p90 162k (resumed sessions)
CODING_APPEND = (280.0, 3019.0)  # new tokens per follow-up (in - previous in - previous out; compactions out)
CODING_OUTPUT = (218.0, 937.0)  # output tokens p50 218, p90 937 (SOURCE.md)
CODING_SHARED_PREFIX = 11899  # median tool_tokens: the tool definitions every session of the agent starts with
# (ASSUMPTION: equal across sessions of one agent version; the system prompt, median 2,765, carries
# per-session details); the sample's follow-ups repeat 97.6% of their prompt (hash prefixes) and 1.7% are
# compactions, so history stays verbatim
CODING_RATE_PER_S = 0.005  # ASSUMPTION (the traces are independent captures, no arrival process): new
# sessions/s, ~0.4 LLM calls/s at 74.9 requests per session; on 1P1D qwen3-32b (contexts cut at 40,960) D's
# pinned peak stays under 10% of the pool; GLM-5-FP8's 285k-token pool per p5en node holds ~2 such sessions
CODING_CONVERSATIONS = 100

# --- tool agent --------------------------------------------------------------------------------------------
TOOL_MEAN_STEPS = 8.0  # BFCL 6.3, SWE-bench/mini-swe-agent 10.9 turns per task (WORKLOADS.md 4.4, 5)
TOOL_MAX_STEPS = 60
TOOL_GAP = (1.0, 1.5)  # vLLM router RFC #285: 86% <= 1 s, 95% <= 10 s; Alibaba to-B 80% of reuse <= 10 s (4.5)
TOOL_HUMAN_SHARE = 0.2 / TOOL_MEAN_STEPS  # ASSUMPTION (WORKLOADS.md 5): 20% of tasks get a human follow-up
# with chat gaps, i.e. 2.5% of all gaps
TOOL_FIRST_PROMPT = (6000.0, 0.6)  # Mooncake tool&agent average input 8,596 with long shared system prompts
TOOL_APPEND = (300.0, 1.2)  # WORKLOADS.md 5 tool_agent.appended_tokens_per_step
TOOL_OUTPUT = (120.0, 0.8)  # Mooncake tool&agent average output 182
TOOL_RATE_PER_S = 0.25  # ASSUMPTION: new tasks/s on 1P1D (~2 LLM calls/s; at 0.5/s the 480 s default TTL fills D)
TOOL_CONVERSATIONS = 1000


def _chat(rate: float, conversations: int) -> dict[str, Any]:
    return {
        "conversations": conversations,
        "arrival": {"kind": "poisson", "rate_per_s": rate},
        "turns": _empirical(geometric_turns_sample(CHAT_P_FOLLOW_UP, CHAT_MAX_TURNS)),
        "prefix_tokens": _lognormal(*CHAT_FIRST_PROMPT),
        "user_tokens": _empirical(mixture_sample(CHAT_USER_MIX, decimals=0)),
        "output_tokens": _lognormal(*CHAT_OUTPUT),
        "turn_gap_s": _lognormal(CHAT_GAP_P50_S, sigma_from_p50_p90(CHAT_GAP_P50_S, CHAT_GAP_P90_S)),
    }


def _coding(rate: float, conversations: int) -> dict[str, Any]:
    gaps = mixture_sample(
        [
            (CODING_TOOL_SHARE, CODING_TOOL_P50_S, sigma_from_p50_p90(CODING_TOOL_P50_S, CODING_TOOL_P90_S)),
            (1 - CODING_TOOL_SHARE, CODING_HUMAN_P50_S, sigma_from_p50_p90(CODING_HUMAN_P50_S, CODING_HUMAN_P90_S)),
        ],
        cap=GAP_CAP_S,
    )
    return {
        "conversations": conversations,
        "arrival": {"kind": "poisson", "rate_per_s": rate},
        "turns": _empirical(tuple(float(t) for t in CODING_TURNS)),
        "prefix_tokens": _lognormal(CODING_FIRST_PROMPT[0], sigma_from_p50_p90(*CODING_FIRST_PROMPT)),
        "user_tokens": _lognormal(CODING_APPEND[0], sigma_from_p50_p90(*CODING_APPEND)),
        "output_tokens": _lognormal(CODING_OUTPUT[0], sigma_from_p50_p90(*CODING_OUTPUT)),
        "turn_gap_s": _empirical(gaps),
        "shared_prefix_tokens": CODING_SHARED_PREFIX,
    }


def _tool(rate: float, conversations: int) -> dict[str, Any]:
    gaps = mixture_sample(
        [
            (1 - TOOL_HUMAN_SHARE, *TOOL_GAP),
            (TOOL_HUMAN_SHARE, CHAT_GAP_P50_S, sigma_from_p50_p90(CHAT_GAP_P50_S, CHAT_GAP_P90_S)),
        ],
        cap=GAP_CAP_S,
    )
    return {
        "conversations": conversations,
        "arrival": {"kind": "poisson", "rate_per_s": rate},
        "turns": _empirical(geometric_turns_sample(1 - 1 / TOOL_MEAN_STEPS, TOOL_MAX_STEPS)),
        "prefix_tokens": _lognormal(*TOOL_FIRST_PROMPT),
        "user_tokens": _lognormal(*TOOL_APPEND),
        "output_tokens": _lognormal(*TOOL_OUTPUT),
        "turn_gap_s": _empirical(gaps),
    }


PRESETS: dict[str, PresetInfo] = {
    "chat": PresetInfo(
        "chat", "human chat assistant: minutes between turns, 40% of turns get a follow-up", CHAT_RATE_PER_S,
        CHAT_CONVERSATIONS, ("Mooncake FAST'25 conversation trace (computed)", "RAGPulse", "Azure LLM 2023", "LMSYS"),
    ),
    "coding-agent": PresetInfo(
        "coding-agent", "coding agent (AgentX sample): 80% tool gaps (p50 10 s), 20% user waits, contexts to 200k, "
        "a shared tool prefix", CODING_RATE_PER_S, CODING_CONVERSATIONS,
        ("AgentX / Weka kv-cache-tester traces (50 real Claude Code sessions, external_traces/agentx_weka)",),
    ),
    "tool-agent": PresetInfo(
        "tool-agent", "headless function-calling agent: ~8 steps with ~1 s tool gaps", TOOL_RATE_PER_S,
        TOOL_CONVERSATIONS, ("vLLM router RFC #285", "Alibaba ATC'25 to-B trace", "BFCL / SWE-bench", "Mooncake tool&agent"),
    ),
    "p5en-benchmark": PresetInfo(
        "p5en-benchmark", "the published P5en benchmark (closed loop, 2 clients, 10 conversations x 5 turns)",
        None, 10, ("vLLM blog 2026-09-21 (VLLM_BEHAVIOUR.md header)",),
    ),
}
_BUILDERS = {"chat": _chat, "coding-agent": _coding, "tool-agent": _tool}


def preset_names() -> list[str]:
    """Names of the built-in presets."""
    return list(PRESETS)


def preset_scenario(
    name: str,
    model: str = "qwen3-32b",
    hardware: str = "p5en",
    rate_per_s: float | None = None,
    conversations: int | None = None,
) -> Scenario:
    """The scenario of preset ``name`` on ``model`` / ``hardware`` (1P1D, TP8, vLLM's policy defaults).

    ``rate_per_s`` (new conversations per second) defaults to the preset's; ``conversations`` to enough for
    ~an hour of arrivals at the default rate. ``p5en-benchmark`` is closed-loop and takes no rate.
    """
    name = name.strip().lower().replace("_", "-")
    if name not in PRESETS:
        raise input_error("--workload", f"unknown preset '{name}'", f"use one of {', '.join(PRESETS)}")
    info = PRESETS[name]
    if name == "p5en-benchmark":
        if rate_per_s is not None:
            raise input_error("--rate", "p5en-benchmark is closed-loop (2 clients)", "omit --rate or pick another preset")
        sc = published_benchmark(model=model)
        ov: dict[str, Any] = {"hardware": hardware}
        if conversations is not None:
            ov["workload.conversations"] = conversations
        return with_overrides(sc, ov)
    rate = info.default_rate_per_s if rate_per_s is None else rate_per_s
    if rate is None or not (isinstance(rate, int | float) and math.isfinite(rate) and rate > 0):
        raise input_error("--rate", f"must be a positive number of conversations per second, got {rate_per_s!r}")
    n = conversations if conversations is not None else info.conversations
    data = {
        "model": model,
        "hardware": hardware,
        "deployment": {"prefill_nodes": 1, "decode_nodes": 1, "tensor_parallel_size": 8},
        "policy": {"bidirectional": True},
        "workload": _BUILDERS[name](float(rate), int(n)),
        "seed": 0,
    }
    return scenario_from_dict(data, where=f"preset {name}")
