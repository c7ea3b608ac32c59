"""Dashboard state: sidebar widgets -> frozen :class:`~kvplan.sim.scenario.Scenario` -> cached API calls.

The pages only lay out what this module returns. Pure functions (:func:`build_scenario`,
:func:`headline_metrics`, ...) take plain values and are tested without Streamlit;
the Streamlit functions (:func:`scenario_sidebar`, :func:`run_view`, ...) wrap them. Every cached call is
keyed on a hashable string, the scenario's canonical JSON (:func:`scenario_key`), never on a
``_``-prefixed argument (Streamlit does not hash those, so they would return stale results).

Every kvplan module used is imported explicitly (no lookup by string name, so the layer contract in
pyproject.toml sees every edge). The explorer's grid and the advice live in
:mod:`kvplan.app.dash_sweeps`, uploads and fits in :mod:`kvplan.app.dash_upload`, figures in
:mod:`kvplan.app.figures` (no Streamlit there).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import streamlit as st

from kvplan.app import dash_serve, dash_upload
from kvplan.app.dash_metrics import (  # noqa: F401 - re-exported
    DeltaColour,
    Metric,
    context_limit_lines,
    headline_metrics,
    no_effect_lines,
    rate_text,
    run_notes,
)
from kvplan.errors import KvplanInputError, input_error
from kvplan.models.arch import MODEL_PRESETS
from kvplan.models.hardware import HARDWARE_PRESETS
from kvplan.models.profile import shipped_profiles
from kvplan.sim import presets
from kvplan.sim.api import run
from kvplan.sim.defaults import PUBLISHED_BENCHMARK, published_benchmark, trace_replay_scenario
from kvplan.sim.scenario import MAX_SEED, Policy, Scenario, scenario_from_dict, with_overrides

# --- constants ---------------------------------------------------------------------------------------------

#: vLLM's defaults the what-if deltas are measured against (``Policy`` field defaults: 480 s, 64, 450 s).
VLLM_DEFAULTS: dict[str, Any] = {
    "policy.decoder_kv_blocks_ttl_s": Policy.model_fields["decoder_kv_blocks_ttl_s"].default,
    "policy.kv_recompute_threshold_tokens": Policy.model_fields["kv_recompute_threshold_tokens"].default,
    "policy.router_ttl_s": Policy.model_fields["router_ttl_s"].default,
}
#: The vLLM-defaults baseline of the what-if deltas: :data:`VLLM_DEFAULTS` with bidirectional transfer on and the rest
#: of vLLM's retention as the ``Policy`` defaults are (the fixed TTL, no host offload, failure policy fail), so that a
#: what-if of the lease, ttl_evictable or offload variant is measured against vLLM, not against itself at 480 s.
def vllm_defaults_overrides() -> dict[str, Any]:
    """Dotted overrides turning a P/D scenario into vLLM's defaults (the what-if's baseline)."""
    f = Policy.model_fields
    return {**VLLM_DEFAULTS, "policy.bidirectional": True,
            "policy.kv_load_failure_policy": f["kv_load_failure_policy"].default,
            "policy.retention": f["retention"].get_default(call_default_factory=True).model_dump(),
            "policy.offload": f["offload"].default}


#: Workload choice that is always available: the embedded published P5en benchmark (~50 turns, ~50 ms a run).
PUBLISHED = "published P5en benchmark"
CUSTOM = "custom distributions"
TRACE = "replay a trace file"
#: ``sim.presets``' name of the same published benchmark (listed once, as :data:`PUBLISHED`).
PRESET_PUBLISHED = "p5en-benchmark"
#: Profile choice meaning "the shipped profile of the model on the hardware, or its prior plus calibrated residuals".
AUTO_PROFILE = "auto (shipped, or prior + residuals)"
#: Session-state key of a profile JSON produced or uploaded on the Calibration page.
SESSION_PROFILE = "kvplan_session_profile_json"
#: The sidebar checkbox that allows an 'unreliable' profile (named after the CLI flag the refusal names).
ALLOW_UNRELIABLE_LABEL = "allow an unreliable profile (--allow-unreliable-profile)"
#: Largest number of conversations the interactive what-if accepts (the CLI has no such limit).
MAX_DASHBOARD_CONVERSATIONS = 5000
DIST_KINDS = ("constant", "exponential", "lognormal", "uniform")
DIST_PARAMS: dict[str, tuple[str, ...]] = {
    "constant": ("value",),
    "exponential": ("mean",),
    "lognormal": ("median", "sigma"),
    "uniform": ("low", "high"),
}


def defaults_text() -> str:
    """The vLLM defaults the deltas compare against, as text."""
    d = VLLM_DEFAULTS
    return (f"the vLLM defaults (TTL {d['policy.decoder_kv_blocks_ttl_s']:g} s, threshold "
            f"{d['policy.kv_recompute_threshold_tokens']} tokens, router TTL {d['policy.router_ttl_s']:g} s, "
            f"bidirectional on, failure policy {Policy.model_fields['kv_load_failure_policy'].default}, fixed TTL "
            "retention, no offload; on the sidebar's deployment)")


# --- widgets -> scenario (pure) --------------------------------------------------------------------------------


@dataclass(frozen=True)
class DistInput:
    """A distribution as chosen in the sidebar: ``kind`` and its parameters."""

    kind: str
    params: tuple[tuple[str, float], ...]

    def to_dict(self) -> dict[str, Any]:
        """The scenario's ``{dist: kind, ...}`` form (only the kind's own parameters)."""
        wanted = DIST_PARAMS[self.kind]
        return {"dist": self.kind, **{k: v for k, v in self.params if k in wanted}}


@dataclass(frozen=True)
class CustomWorkload:
    """The custom workload of the sidebar (distributions as in ``kvplan simulate --help``)."""

    conversations: int
    arrival_kind: str  # "closed_loop" or "poisson"
    clients: int
    max_active_conversations: int
    rate_per_s: float
    turns: DistInput
    prefix_tokens: DistInput
    user_tokens: DistInput
    output_tokens: DistInput
    turn_gap_s: DistInput

    def to_dict(self) -> dict[str, Any]:
        """The scenario's ``workload`` section."""
        arrival: dict[str, Any] = (
            {"kind": "closed_loop", "clients": self.clients, "max_active_conversations": self.max_active_conversations}
            if self.arrival_kind == "closed_loop"
            else {"kind": "poisson", "rate_per_s": self.rate_per_s}
        )
        return {
            "conversations": self.conversations,
            "arrival": arrival,
            "turns": self.turns.to_dict(),
            "prefix_tokens": self.prefix_tokens.to_dict(),
            "user_tokens": self.user_tokens.to_dict(),
            "output_tokens": self.output_tokens.to_dict(),
            "turn_gap_s": self.turn_gap_s.to_dict(),
        }


@dataclass(frozen=True)
class ScenarioInputs:
    """Every what-if widget value, as plain data (what :func:`build_scenario` turns into a Scenario)."""

    model: str = str(PUBLISHED_BENCHMARK["model"])
    hardware: str = str(PUBLISHED_BENCHMARK["hardware"])
    profile: str | None = None
    prefill_nodes: int = 1
    decode_nodes: int = 1
    tensor_parallel_size: int = 8
    prefill_tensor_parallel_size: int | None = None  # None: tensor_parallel_size (the YAML field's default)
    decode_tensor_parallel_size: int | None = None
    max_num_seqs: int | None = None  # None: the workload's scenario's own (the published benchmark's 8, ...)
    prefill_prefix_caching: bool = False
    bidirectional: bool = True
    ttl_s: float = float(VLLM_DEFAULTS["policy.decoder_kv_blocks_ttl_s"])
    threshold_tokens: int = int(VLLM_DEFAULTS["policy.kv_recompute_threshold_tokens"])
    router_ttl_s: float = float(VLLM_DEFAULTS["policy.router_ttl_s"])
    failure_policy: str = "fail"
    workload: str = PUBLISHED
    preset_rate_per_s: float | None = None
    preset_conversations: int | None = None
    custom: CustomWorkload | None = None
    trace_path: str | None = None
    seed: int = 0
    extra: tuple[tuple[str, Any], ...] = field(default=())


def default_custom_workload() -> CustomWorkload:
    """The custom workload's starting point: the published benchmark's workload."""
    wl: dict[str, Any] = dict(PUBLISHED_BENCHMARK["workload"])

    def const(name: str) -> DistInput:
        return DistInput("constant", (("value", float(wl[name]["value"])),))

    return CustomWorkload(
        conversations=int(wl["conversations"]),
        arrival_kind="closed_loop",
        clients=int(wl["arrival"]["clients"]),
        max_active_conversations=int(wl["arrival"]["max_active_conversations"]),
        rate_per_s=0.1,
        turns=const("turns"),
        prefix_tokens=const("prefix_tokens"),
        user_tokens=const("user_tokens"),
        output_tokens=const("output_tokens"),
        turn_gap_s=const("turn_gap_s"),
    )


def preset_names() -> list[str]:
    """Workload choices: the published benchmark, the presets of ``sim.presets`` when present, custom."""
    names = [PUBLISHED]
    names.extend(str(n) for n in presets.preset_names() if str(n) not in names and str(n) != PRESET_PUBLISHED)
    names.extend([CUSTOM, TRACE])
    return names


def cli_prefix_caching_default(workload: str) -> bool:
    """P prefix caching as the CLI sets it for this workload choice: the published benchmark's (off) for it, the
    scenario that ``kvplan simulate --trace F`` replays a trace on for a trace (``trace_replay_scenario``: the field
    defaults, on), the preset's for a preset, vLLM's default (on, the ``Deployment`` field default) for a custom
    workload."""
    from kvplan.sim.scenario import Deployment

    if workload == PUBLISHED:
        return bool(PUBLISHED_BENCHMARK["deployment"]["prefill_prefix_caching"])
    if workload == TRACE:  # the path is not read: any placeholder gives the deployment the CLI replays on
        return bool(trace_replay_scenario("trace").deployment.prefill_prefix_caching)
    if workload == CUSTOM:
        return bool(Deployment.model_fields["prefill_prefix_caching"].default)
    return bool(presets.preset_scenario(workload).deployment.prefill_prefix_caching)


#: The longest seed text the sidebar takes: MAX_SEED's 19 digits with room for spaces, a sign and underscores.
SEED_MAX_CHARS = 40


def parse_seed(text: str) -> int:
    """The sidebar's seed text as the CLI's ``--seed`` reads it (click's integer type: Python's ``int`` of the text,
    surrounding spaces, a sign and digit-group underscores allowed), in ``0..MAX_SEED`` as the option and the
    scenario's ``seed`` field require; a one-line :class:`KvplanInputError` naming the field otherwise."""
    fix = f"enter a whole number from 0 to {MAX_SEED} (2**63 - 1)"
    try:
        value = int(text)
    except ValueError:
        raise input_error("seed", f"'{text.strip()[:SEED_MAX_CHARS]}' is not a whole number", fix) from None
    if not 0 <= value <= MAX_SEED:
        raise input_error("seed", f"{value} is out of range", fix)
    return value


def build_scenario(inputs: ScenarioInputs) -> Scenario:
    """The validated scenario the widgets describe (raises a one-line :class:`KvplanInputError`).

    The workload comes from the chosen source (published benchmark, a ``sim.presets`` preset or the
    custom distributions); model, hardware, profile, deployment, policy and seed from the widgets.
    """
    if inputs.workload == CUSTOM:
        if inputs.custom is None:
            raise input_error("workload", "custom workload chosen but no distributions given")
        if inputs.custom.conversations > MAX_DASHBOARD_CONVERSATIONS:
            raise input_error(
                "workload.conversations", f"more than {MAX_DASHBOARD_CONVERSATIONS} in the dashboard",
                "use `kvplan simulate` for large runs",
            )
        data = {k: (dict(v) if isinstance(v, dict) else v) for k, v in PUBLISHED_BENCHMARK.items()}
        data["workload"] = inputs.custom.to_dict()
        base = scenario_from_dict(data, where="custom workload")
    elif inputs.workload == TRACE:
        if not inputs.trace_path:
            raise input_error("trace file", "none given", "upload a trace file (or type a path under the directory "
                              "the dashboard serves, with `kvplan dashboard --serve-dir DIR`)")
        base = trace_replay_scenario(inputs.trace_path)  # the same as `kvplan simulate --trace` without a scenario
    elif inputs.workload == PUBLISHED:
        base = published_benchmark(model=inputs.model)
    else:
        kw: dict[str, Any] = {"rate_per_s": inputs.preset_rate_per_s}
        if inputs.preset_conversations is not None:
            kw["conversations"] = inputs.preset_conversations
        base = presets.preset_scenario(inputs.workload, inputs.model, inputs.hardware, **kw)
    overrides: dict[str, Any] = {
        "model": inputs.model,
        "hardware": inputs.hardware,
        "profile": inputs.profile,
        "deployment.prefill_nodes": inputs.prefill_nodes,
        "deployment.decode_nodes": inputs.decode_nodes,
        "deployment.tensor_parallel_size": inputs.tensor_parallel_size,
        # validated as the YAML fields are (the Scenario model: 1..64 per role, max_num_seqs 1..65,536 and at most
        # max_num_batched_tokens), so a bad value is the same one-line error as in a scenario file
        "deployment.prefill_tensor_parallel_size": inputs.prefill_tensor_parallel_size,
        "deployment.decode_tensor_parallel_size": inputs.decode_tensor_parallel_size,
        **({"deployment.max_num_seqs": inputs.max_num_seqs} if inputs.max_num_seqs is not None else {}),
        "deployment.prefill_prefix_caching": inputs.prefill_prefix_caching,
        "policy.bidirectional": inputs.bidirectional,
        "policy.decoder_kv_blocks_ttl_s": inputs.ttl_s,
        "policy.kv_recompute_threshold_tokens": inputs.threshold_tokens,
        "policy.router_ttl_s": inputs.router_ttl_s,
        "policy.kv_load_failure_policy": inputs.failure_policy,
        "seed": inputs.seed,
        **dict(inputs.extra),
    }
    return with_overrides(base, overrides)


def tp_text(scenario: Scenario) -> str:
    """The deployment's TP and ``max_num_seqs`` as the What-if page's caption says them (``TP8``, or ``P TP4 / D TP8``
    with per-role TP)."""
    dep = scenario.deployment
    p = dep.prefill_tensor_parallel_size or dep.tensor_parallel_size
    d = dep.decode_tensor_parallel_size or dep.tensor_parallel_size
    # an aggregated replica runs one TP (sim/node_setup.py aggregated_config refuses per-role TP)
    tp = f"TP{dep.tensor_parallel_size}" if dep.mode == "aggregated" else f"TP{p}" if p == d else f"P TP{p} / D TP{d}"
    return f"{tp}, max_num_seqs {dep.max_num_seqs:,}"


def scenario_key(scenario: Scenario) -> str:
    """The hashable cache key of a scenario: its canonical JSON (every field, fixed order)."""
    return scenario.model_dump_json()


def scenario_from_key(key: str) -> Scenario:
    """The scenario a :func:`scenario_key` string describes (validated again)."""
    return scenario_from_dict(json.loads(key), where="dashboard scenario")


def variant(scenario: Scenario, overrides: Mapping[str, Any]) -> Scenario:
    """``scenario`` with dotted-path ``overrides`` (validated)."""
    return with_overrides(scenario, dict(overrides))


# --- cached runs ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RunView:
    """What the pages need from one ``run``: summary, per-turn frame, pinned series, notes, wall time."""

    summary: dict[str, Any]
    turns: pd.DataFrame
    pinned: pd.DataFrame
    notes: tuple[str, ...]
    wall_s: float


def run_view_uncached(key: str) -> RunView:
    """Run the scenario of ``key`` with the public API (``sim.api.run``) and keep what the pages show."""
    t0 = time.perf_counter()
    result = run(scenario_from_key(key))
    return RunView(result.summary, result.turns, result.pinned_series(), tuple(result.notes), time.perf_counter() - t0)


@st.cache_data(max_entries=128, show_spinner=False)
def run_view(key: str) -> RunView:
    """:func:`run_view_uncached`, cached on the scenario key (a JSON string)."""
    return run_view_uncached(key)


@dataclass(frozen=True)
class WhatIf:
    """The runs of one what-if: the scenario, bidirectional ON and OFF, and the vLLM defaults.

    ``elapsed_s`` is what getting them took this time (runs already in the cache cost next to nothing).
    """

    current: RunView
    on: RunView
    off: RunView
    defaults: RunView
    bidirectional: bool
    elapsed_s: float


def whatif(scenario: Scenario, baseline: Scenario | None = None) -> WhatIf:
    """Run (cached) the scenario, its ON and OFF variants and the vLLM-defaults variant of ``baseline`` (the
    sidebar's scenario before the page's policy variant; default ``scenario``): :func:`vllm_defaults_overrides`."""
    t0 = time.perf_counter()
    keys = {
        "current": scenario_key(scenario),
        "on": scenario_key(variant(scenario, {"policy.bidirectional": True})),
        "off": scenario_key(variant(scenario, {"policy.bidirectional": False})),
        "defaults": scenario_key(variant(scenario if baseline is None else baseline, vllm_defaults_overrides())),
    }
    views = {name: run_view(key) for name, key in keys.items()}
    return WhatIf(views["current"], views["on"], views["off"], views["defaults"], scenario.policy.bidirectional,
                  time.perf_counter() - t0)


# --- sidebar (Streamlit) ---------------------------------------------------------------------------------------


def _w(fn: Callable[..., Any], label: str, key: str, **kw: Any) -> Any:
    """A sidebar widget whose value survives page switches (``persist_state='session'``)."""
    return fn(label, key=f"sc_{key}", persist_state="session", **kw)


def _dist_widget(name: str, label: str, default: DistInput, integer: bool) -> DistInput:
    sb = st.sidebar
    kind = _w(sb.selectbox, f"{label}: distribution", f"{name}_kind", options=DIST_KINDS,
              index=DIST_KINDS.index(default.kind))
    base = dict(default.params).get("value", 1.0)
    starts = {"value": base, "mean": base or 1.0, "median": base or 1.0, "sigma": 1.0,
              "low": base * 0.5, "high": base * 1.5 or 1.0}
    params = []
    for p in DIST_PARAMS[kind]:
        step = 1.0 if integer and p != "sigma" else 0.1
        params.append((p, float(_w(sb.number_input, f"{label}: {p}", f"{name}_{p}", min_value=0.0,
                                   value=float(starts[p]), step=step))))
    return DistInput(kind, tuple(params))


def _custom_workload_widgets() -> CustomWorkload:
    d = default_custom_workload()
    sb = st.sidebar
    conversations = _w(sb.number_input, "conversations", "conversations", min_value=1,
                       max_value=MAX_DASHBOARD_CONVERSATIONS, value=d.conversations, step=1)
    arrival = _w(sb.radio, "arrival", "arrival", options=("closed_loop", "poisson"), horizontal=True)
    clients, active, rate = d.clients, d.max_active_conversations, d.rate_per_s
    if arrival == "closed_loop":
        clients = _w(sb.number_input, "clients", "clients", min_value=1, value=d.clients, step=1)
        active = _w(sb.number_input, "max active conversations", "active", min_value=1,
                    value=d.max_active_conversations, step=1)
    else:
        rate = _w(sb.number_input, "new conversations per s", "rate", min_value=0.001, value=d.rate_per_s,
                  step=0.05, format="%.3f")
    return CustomWorkload(
        conversations=int(conversations), arrival_kind=str(arrival), clients=int(clients),
        max_active_conversations=int(active), rate_per_s=float(rate),
        turns=_dist_widget("turns", "user turns per conversation", d.turns, True),
        prefix_tokens=_dist_widget("prefix", "prefix tokens (turn 1)", d.prefix_tokens, True),
        user_tokens=_dist_widget("user", "new user tokens per turn", d.user_tokens, True),
        output_tokens=_dist_widget("output", "output tokens", d.output_tokens, True),
        turn_gap_s=_dist_widget("gap", "turn gap (s)", d.turn_gap_s, False),
    )


def _trace_widgets() -> str | None:
    """The replayed trace: an upload, or a path typed under the served directory (``--serve-dir``) when
    the dashboard serves one (:mod:`kvplan.app.dash_serve`); raises a one-line error for a refused one."""
    sb = st.sidebar
    helptext = ("Mooncake JSONL, multi-turn stats JSON, RAGPulse JSONL, Azure or generic CSV "
                "(`kvplan simulate --help`); replayed on its own clock.")
    upload = sb.file_uploader("trace file (upload)", key="sc_trace_upload", max_upload_size=dash_upload.MAX_UPLOAD_MB,
                              help=helptext)
    if upload is not None:
        return str(dash_upload.store_upload(upload.name, upload.getvalue()))
    if dash_serve.serve_dir() is None:
        sb.caption("Server paths are off: start with `kvplan dashboard --serve-dir DIR` to replay traces under DIR.")
        return None
    typed = str(_w(sb.text_input, dash_serve.PATH_LABEL, "trace_path", value="",
                   help=helptext + " Relative to the directory the dashboard serves.")).strip()
    return dash_serve.served_path(typed) if typed else None


def session_profile_choice() -> str | None:
    """The sidebar label of the profile calibrated or uploaded in this session, if any."""
    text = st.session_state.get(SESSION_PROFILE)
    if not text:
        return None
    return f"session: {dash_upload.profile_from_json(text).name}"


def scenario_sidebar() -> Scenario | None:
    """Render the scenario widgets in the sidebar; the validated scenario, or ``None`` after an error."""
    sb = st.sidebar
    d = ScenarioInputs()
    sb.header("Scenario")
    model = _w(sb.selectbox, "model", "model", options=list(MODEL_PRESETS), index=list(MODEL_PRESETS).index(d.model))
    hardware = _w(sb.selectbox, "hardware", "hardware", options=list(HARDWARE_PRESETS),
                  index=list(HARDWARE_PRESETS).index(d.hardware))
    session_choice = session_profile_choice()
    profiles = [AUTO_PROFILE, *shipped_profiles(), *([session_choice] if session_choice else [])]
    profile_label = _w(sb.selectbox, "profile", "profile", options=profiles,
                       help="Cost-model profile; calibrate or upload one on the Calibration page.")
    if profile_label == AUTO_PROFILE:
        profile = None
    elif session_choice and profile_label == session_choice:
        profile = dash_upload.session_profile_path(st.session_state[SESSION_PROFILE])
    else:
        profile = str(profile_label)
    # what `--allow-unreliable-profile` is to the CLI: the refusal of an 'unreliable' profile names that flag
    allow_unreliable = _w(sb.checkbox, ALLOW_UNRELIABLE_LABEL, "allow_unreliable", value=False,
                          help="Simulate with a profile of status 'unreliable' (a calibration that failed its "
                               "self-check) anyway: simulation.allow_unreliable_profile, as the CLI's "
                               "--allow-unreliable-profile. The page then warns that its figures rest on it.")
    sb.subheader("Deployment")
    c1, c2 = sb.columns(2)
    p_nodes = _w(c1.number_input, "prefill nodes (xP)", "p_nodes", min_value=1, max_value=64, value=d.prefill_nodes)
    d_nodes = _w(c2.number_input, "decode nodes (yD)", "d_nodes", min_value=1, max_value=64, value=d.decode_nodes)
    tp = _w(sb.selectbox, "tensor parallel size", "tp", options=(1, 2, 4, 8), index=3)
    c1, c2 = sb.columns(2)
    # 0 = not set: the YAML fields' default (tensor_parallel_size); no upper bound here, the scenario's validation
    # refuses what a scenario file could not hold, with the same one-line error
    p_tp = _w(c1.number_input, "prefill TP (0 = as above)", "p_tp", min_value=0, value=0, step=1,
              help="deployment.prefill_tensor_parallel_size: the TP of the prefill instances (1 to 64).")
    d_tp = _w(c2.number_input, "decode TP (0 = as above)", "d_tp", min_value=0, value=0, step=1,
              help="deployment.decode_tensor_parallel_size: the TP of the decode instances (1 to 64).")
    seqs = _w(sb.number_input, "max_num_seqs (0 = the workload's)", "max_num_seqs", min_value=0, value=0, step=1,
              help="deployment.max_num_seqs, vLLM --max-num-seqs on P and D (1 to 65,536, at most "
                   "max_num_batched_tokens); 0 keeps the workload's scenario's (the published benchmark: 8; a trace "
                   "or preset: 1,024).")
    wl_now = str(st.session_state.get("sc_workload", preset_names()[0]))
    if st.session_state.get("sc_p_cache_for") != wl_now:  # a new workload choice: its CLI default again
        st.session_state["sc_p_cache"] = cli_prefix_caching_default(wl_now)
        st.session_state["sc_p_cache_for"] = wl_now
    p_cache = _w(sb.checkbox, "prefix caching on P", "p_cache",
                 help="Default as the CLI: off for the published benchmark (it emulates a P node that evicted the "
                      "conversation), on for `simulate --trace` (the scenario defaults), the presets and a custom "
                      "workload (vLLM's default).")
    sb.subheader("Policy")
    bidir = _w(sb.toggle, "bidirectional KV transfer", "bidir", value=d.bidirectional)
    ttl = _w(sb.number_input, "decoder_kv_blocks_ttl (s)", "ttl", min_value=0.0, value=d.ttl_s, step=10.0,
             help="D retains a finished request's KV blocks this long (fixed from finish, not renewed).")
    threshold = _w(sb.number_input, "kv_recompute_threshold (tokens)", "threshold", min_value=0,
                   value=d.threshold_tokens, step=16, help="P pulls from D only when at least this many tokens.")
    router_ttl = _w(sb.number_input, "router TTL (s)", "router_ttl", min_value=0.0, value=d.router_ttl_s, step=10.0,
                    help="Proxy's conversation_id entry lifetime; keep it below the decode TTL.")
    failure = _w(sb.selectbox, "kv_load_failure_policy", "failure", options=("fail", "recompute"))
    sb.subheader("Workload")
    names = preset_names()
    workload = _w(sb.selectbox, "workload", "workload", options=names, index=0)
    rate: float | None = None
    conversations: int | None = None
    custom = None
    trace_path: str | None = None
    if workload == CUSTOM:
        custom = _custom_workload_widgets()
    elif workload == TRACE:
        try:
            trace_path = _trace_widgets()
        except KvplanInputError as exc:
            st.session_state[TRACE_KEY] = None
            sb.error(error_text(exc))
            return None
    elif workload != PUBLISHED:
        r = _w(sb.number_input, "new conversations per s (0 = preset's)", "preset_rate", min_value=0.0, value=0.0,
               step=0.05)
        n = _w(sb.number_input, "conversations (0 = preset's)", "preset_conversations", min_value=0,
               max_value=MAX_DASHBOARD_CONVERSATIONS, value=0, step=100,
               help="Presets simulate about an hour of arrivals (0.5-1 s a run); fewer conversations re-render faster.")
        rate = float(r) or None
        conversations = int(n) or None
    # a text field, not a number input: Streamlit's number input holds a JavaScript number, exact only up to 2**53,
    # while the CLI's --seed and the scenario's seed take any integer up to MAX_SEED (2**63 - 1)
    seed_text = _w(sb.text_input, "seed", "seed_text", value="0", max_chars=SEED_MAX_CHARS,
                   help=f"Root seed of every random stream: a whole number from 0 to {MAX_SEED:,} (2**63 - 1), as "
                        "`kvplan simulate --seed`.")
    try:
        seed = parse_seed(str(seed_text))
    except KvplanInputError as exc:
        sb.error(error_text(exc))
        return None
    inputs = ScenarioInputs(
        model=str(model), hardware=str(hardware), profile=profile, prefill_nodes=int(p_nodes),
        decode_nodes=int(d_nodes), tensor_parallel_size=int(tp), prefill_tensor_parallel_size=int(p_tp) or None,
        decode_tensor_parallel_size=int(d_tp) or None, max_num_seqs=int(seqs) or None,
        prefill_prefix_caching=bool(p_cache),
        bidirectional=bool(bidir), ttl_s=float(ttl), threshold_tokens=int(threshold), router_ttl_s=float(router_ttl),
        failure_policy=str(failure), workload=str(workload), preset_rate_per_s=rate,
        preset_conversations=conversations, custom=custom, trace_path=trace_path, seed=int(seed),
        extra=((("simulation.allow_unreliable_profile", True),) if allow_unreliable else ()),
    )
    st.session_state[TRACE_KEY] = trace_path
    try:
        return build_scenario(inputs)
    except KvplanInputError as exc:
        sb.error(error_text(exc))
        return None


def page_guard() -> None:
    """Make sure the page runs inside ``app/dashboard.py``'s ``st.navigation``, not Streamlit's legacy mode.

    Streamlit treats a ``pages/`` folder next to the entry script as the old multipage layout until
    ``st.navigation`` is first called in the server process, so a first visit straight to a page URL
    (``/explorer``) would run the page alone (file names as the menu, no page config). The guard switches
    that legacy mode off exactly as ``st.navigation`` does and reruns, so the entry script routes the same
    URL to its page. Under ``AppTest`` (which re-detects the folder on every run) the page just renders,
    since a rerun there would drop the widget event being tested.
    """
    from streamlit import config
    from streamlit.runtime.pages_manager import PagesManager

    if PagesManager.uses_pages_directory:
        PagesManager.uses_pages_directory = False
        if not config.get_option("global.appTest"):
            st.rerun()


def health_warnings(summary: Mapping[str, Any]) -> tuple[list[str], list[str]]:
    """The run's health findings for the page: (warnings to show as ``st.warning``, plain notes)."""
    from kvplan.sim.health import health_lines
    from kvplan.units import human_s

    lines = health_lines(dict(summary.get("health") or {}), human_s)
    warn = [ln for ln in lines if not ln.startswith("health: ")]
    return warn, [ln for ln in lines if ln.startswith("health: ")]


def on_off_text(on: Mapping[str, Any], off: Mapping[str, Any]) -> str:
    """The what-if's answer in one line: bidirectional transfer ON against OFF for the same scenario."""
    from kvplan.units import human_s

    def pct(a: float, b: float) -> str:
        return f" ({(a - b) / b:+.0%})" if b and math.isfinite(a) and math.isfinite(b) else ""

    parts = [f"{name} {human_s(on[k])} vs {human_s(off[k])}{pct(float(on[k]), float(off[k]))}"
             for k, name in (("ttft_p50_s", "TTFT p50"), ("ttft_p90_s", "TTFT p90"))]
    return (f"Bidirectional KV transfer ON vs OFF (same scenario and seed): {', '.join(parts)}; hit rate "
            f"{rate_text(on, 'hit_rate')} vs {rate_text(off, 'hit_rate')}.")


#: Session key of the trace file the sidebar's scenario replays (for :func:`error_text`).
TRACE_KEY = "kvplan_trace_path"


def unreliable_profile_warning(summary: Mapping[str, Any]) -> str | None:
    """The warning a run on an allowed 'unreliable' profile carries (its figures rest on a failed calibration)."""
    if summary.get("profile_status") != "unreliable":
        return None
    return (f"Profile {summary.get('profile')} is unreliable (its calibration failed its self-check; allowed in the "
            "sidebar): these figures rest on it.")


def error_text(exc: BaseException) -> str:
    """The one-line page text of a user error: whitespace collapsed, and when the scenario replays a trace
    file, that file's path shortened and every excerpt of its content removed (:func:`dash_serve.redact`)."""
    return " ".join(dash_serve.redact(str(exc), st.session_state.get(TRACE_KEY)).split())


def show_error(exc: BaseException) -> None:
    """One-line ``st.error`` for a user error (never a traceback, never a server file's content)."""
    st.error(error_text(exc))
