"""Sweeps behind the explorer and the advice: the TTL x threshold grid (``plan.sweep.run_grid``) and the
recommendation (``plan.advice.recommend``), laid out as plain data for the pages.

Everything here is a plain function of scenarios and dicts (the pages add widgets and progress bars);
results are keyed on the scenario key of :mod:`kvplan.app.dash_state` plus the sweep's own inputs.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from kvplan.app.dash_state import VLLM_DEFAULTS, scenario_from_key, scenario_key, variant
from kvplan.errors import input_error
from kvplan.plan.advice import recommend
from kvplan.plan.advice_runs import RESOURCE_NAMES
from kvplan.plan.sweep import aggregate, grid_from_dict, run_grid, screen_report
from kvplan.sim.scenario import PoissonArrival, Policy, Scenario
from kvplan.units import human_s

#: Largest TTL x threshold grid the explorer runs.
MAX_GRID_POINTS = 400

# --- TTL x threshold grid -----------------------------------------------------------------------------------

#: Default explorer grid: TTLs around the benchmark's ~16 s turn gaps up to past vLLM's 480 s, and
#: thresholds from 0 to beyond its 24k-token pulls (where every pull turns into a recompute).
DEFAULT_GRID_TTLS = "0, 5, 10, 15, 20, 30, 60, 120, 480, 900"
DEFAULT_GRID_THRESHOLDS = "0, 64, 1024, 8192, 32768"
#: Replications of ``plan.advice.recommend`` the dashboard asks for (its default).
DEFAULT_REPLICATIONS = 3

#: TTFT statistics the explorer's heatmap can show: label -> summary key.
TTFT_STATS = {"p50": "ttft_p50_s", "p90": "ttft_p90_s", "p99": "ttft_p99_s", "mean": "ttft_mean_s"}
GRID_METRICS = (
    "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_mean_s", "hit_rate", "errors", "pinned_kv_gib_mean",
    "pinned_kv_gib_peak",
)


def parse_number_list(text: str, name: str, *, integer: bool = False, max_items: int = 30) -> list[float]:
    """Parse ``"1, 5, 30"`` into sorted unique non-negative numbers (one-line error naming ``name``)."""
    parts = [p for p in text.replace(";", ",").replace(" ", ",").split(",") if p.strip()]
    if not parts:
        raise input_error(name, "no values", "give comma-separated numbers, e.g. 30, 120, 480")
    values: set[float] = set()
    for p in parts:
        try:
            v = float(p)
        except ValueError:
            raise input_error(name, f"'{p.strip()}' is not a number", "give comma-separated numbers") from None
        if not math.isfinite(v) or v < 0:
            raise input_error(name, f"{p.strip()} must be a finite number >= 0")
        if integer and v != int(v):
            raise input_error(name, f"{p.strip()} must be a whole number of tokens")
        values.add(float(int(v)) if integer else v)
    if len(values) > max_items:
        raise input_error(name, f"{len(values)} values, more than {max_items}", "use fewer grid values")
    return sorted(values)


@dataclass(frozen=True)
class GridSpec:
    """A TTL x threshold explorer grid: the sidebar scenario, the axis values and the replications."""

    base_key: str
    ttls_s: tuple[float, ...]
    thresholds: tuple[int, ...]
    replications: int = 1

    @property
    def n_runs(self) -> int:
        """Simulations the grid takes (points x replications)."""
        return len(self.ttls_s) * len(self.thresholds) * self.replications

    @property
    def state_key(self) -> str:
        """Session-state key of the grid's results (a digest of everything that defines them)."""
        text = json.dumps([self.base_key, self.ttls_s, self.thresholds, self.replications])
        return f"kvplan_grid_{hashlib.sha256(text.encode()).hexdigest()[:24]}"


def grid_spec(base: Scenario, ttls_s: Sequence[float], thresholds: Sequence[float], replications: int = 1) -> GridSpec:
    """Validate the explorer's axes (at most :data:`MAX_GRID_POINTS` points) into a :class:`GridSpec`."""
    if len(ttls_s) * len(thresholds) > MAX_GRID_POINTS:
        raise input_error("grid", f"{len(ttls_s) * len(thresholds)} points, more than {MAX_GRID_POINTS}",
                          "use fewer TTL or threshold values")
    if replications < 1:
        raise input_error("replications", f"must be >= 1, got {replications}")
    return GridSpec(scenario_key(base), tuple(float(t) for t in ttls_s), tuple(int(t) for t in thresholds), replications)


#: Seconds the explorer leaves between the router's entry expiry and D's, on top of P's safety margin and
#: clock skew, for the arrival -> P decision delay (the advisor's minimum allowance, ``plan.advice`` router rule).
ROUTER_DECISION_ALLOWANCE_S = 1.0


def router_ttl_for(policy: Policy, ttl_s: float) -> float:
    """Router TTL that keeps a router hit from being declined by P at decode TTL ``ttl_s``:
    ``min(router TTL, max(floor(TTL - safety margin - clock skew - allowance), 0))``."""
    margin = policy.expiry_safety_margin_s + max(policy.clock_skew_s, 0.0) + ROUTER_DECISION_ALLOWANCE_S
    return float(min(policy.router_ttl_s, max(math.floor(ttl_s - margin), 0)))


def ttl_base(base: Scenario, ttl_s: float) -> Scenario:
    """The base of one TTL row of the grid: bidirectional on, that TTL, and the router TTL of
    :func:`router_ttl_for` (the proxy's entry must expire before D's blocks, as the advisor sets it)."""
    return variant(base, {
        "policy.bidirectional": True,
        "policy.decoder_kv_blocks_ttl_s": float(ttl_s),
        "policy.router_ttl_s": router_ttl_for(base.policy, float(ttl_s)),
    })


def grid_frame(spec: GridSpec, progress: Callable[[float, str], object] | None = None, workers: int = 1) -> pd.DataFrame:
    """Simulate the grid with ``plan.sweep.run_grid`` (one threshold sweep per TTL, whose base carries the
    TTL and its router TTL, :func:`ttl_base`) and return one row per point: ``ttl_s``, ``threshold_tokens``, the mean
    of each of :data:`GRID_METRICS` over the replications and its 95% half-width (``<metric>_ci95``)."""
    base = scenario_from_key(spec.base_key)
    axis = "policy.kv_recompute_threshold_tokens"
    per_ttl = len(spec.thresholds) * spec.replications
    frames = []
    for i, ttl in enumerate(spec.ttls_s):
        grid = grid_from_dict({
            "base": ttl_base(base, ttl).model_dump(mode="json"),
            "axes": {axis: list(spec.thresholds)},
            "replications": spec.replications,
        }, where="explorer grid")

        def report(done: int, total: int, i: int = i, ttl: float = ttl) -> None:
            if progress is not None:
                frac = (i * per_ttl + done) / (len(spec.ttls_s) * per_ttl)
                progress(min(frac, 1.0), f"TTL {ttl:g} s: {done}/{total} runs")

        agg = aggregate(run_grid(grid, workers=workers, progress=report), grid)
        frame = pd.DataFrame({"ttl_s": ttl, "threshold_tokens": agg[axis].astype(float)})
        for m in GRID_METRICS:
            frame[m] = agg[f"{m}_mean"].to_numpy()
            frame[f"{m}_ci95"] = agg[f"{m}_ci95"].to_numpy()
        # `kvplan sweep`'s screen table: the points whose steady window starts in the ramp-up (too short a run)
        rep = screen_report(grid, agg).set_index("point")["not_steady"]
        frame["not_steady"] = [str(rep.get(int(p), "")) for p in agg["point"]]
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def not_steady_warning(grid: pd.DataFrame) -> str | None:
    """What ``kvplan sweep`` prints when points' runs are too short for steady state (``not_steady`` of its screen
    table), said for the explorer's grid, or ``None``."""
    flags = grid["not_steady"].fillna("") if "not_steady" in grid.columns else pd.Series(dtype=str)
    n = int((flags != "").sum())
    if not n:
        return None
    return (f"{n} of {len(grid)} points ran too short for steady state (listed as not_steady): their steady window "
            "starts in the ramp-up (before TTL + p90 conversation span for pinned KV, one p90 span for P's load), so "
            "their pinned KV and hit rate are not steady figures; raise the conversations (the preset's "
            "'conversations' in the sidebar, or a custom workload's)")


def grid_display(grid: pd.DataFrame) -> pd.DataFrame:
    """The grid table without the 95% columns that are empty (a single replication has no interval)."""
    empty = [c for c in grid.columns if c.endswith("_ci95") and grid[c].isna().all()]
    return grid.drop(columns=empty)


def grid_marks(scenario: Scenario, recommendation: Mapping[str, Any] | None) -> dict[str, tuple[float, float]]:
    """Points to mark on the heatmaps: the recommendation (when computed), the vLLM defaults, the sidebar's."""
    marks: dict[str, tuple[float, float]] = {}
    if recommendation and "decoder_kv_blocks_ttl_s" in recommendation:
        marks["recommended"] = (float(recommendation["decoder_kv_blocks_ttl_s"]),
                                float(recommendation["kv_recompute_threshold_tokens"]))
    marks["vLLM defaults"] = (float(VLLM_DEFAULTS["policy.decoder_kv_blocks_ttl_s"]),
                              float(VLLM_DEFAULTS["policy.kv_recompute_threshold_tokens"]))
    current = (scenario.policy.decoder_kv_blocks_ttl_s, float(scenario.policy.kv_recompute_threshold_tokens))
    if current not in marks.values():
        marks["sidebar"] = current
    return marks


# --- advice (plan.advice, issue 4) ------------------------------------------------------------------------------


def recommendation_dict(scenario: Scenario, slo_ttft_p90_ms: float | None, decode_hbm_budget_gib: float | None,
                        replications: int, progress: Callable[..., Any] | None = None,
                        workers: int = 1) -> dict[str, Any]:
    """Run ``plan.advice.recommend`` (the same call as ``kvplan recommend --no-policies``) and return its
    ``to_json()`` as a dict."""
    rec = recommend(scenario, slo_ttft_p90_ms=slo_ttft_p90_ms, decode_hbm_budget_gib=decode_hbm_budget_gib,
                    replications=replications, progress=progress, workers=workers)
    out = rec.to_json() if hasattr(rec, "to_json") else rec
    if isinstance(out, str | bytes):
        out = json.loads(out)
    if not isinstance(out, dict):
        raise input_error("advice", f"recommend() returned {type(out).__name__}, expected a JSON object")
    return out


def advice_caption(scenario: Scenario) -> str:
    """What the advice is for, from the scenario itself: deployment, model, hardware and load."""
    dep, wl = scenario.deployment, scenario.workload
    if dep.mode == "aggregated":
        shape = f"{dep.replicas} aggregated replica(s)"
    else:
        shape = f"{dep.prefill_nodes}P{dep.decode_nodes}D"
    where = f"{shape} TP{dep.tensor_parallel_size}, {scenario.model} on {scenario.hardware}"
    if wl.trace is not None:
        load = f"replay of {wl.trace.path} (time scale {wl.trace.time_scale:g})"
    elif isinstance(wl.arrival, PoissonArrival):
        load = f"{wl.arrival.rate_per_s:g} new conversations/s, {wl.conversations:,} conversations"
    else:
        load = f"closed loop, {wl.arrival.clients} clients, {wl.conversations:,} conversations"
    return f"Advice for {where}; {load}; P prefix caching {'on' if dep.prefill_prefix_caching else 'off'}."


def advice_key(scenario: Scenario, slo: float | None, budget: float | None, replications: int) -> str:
    """Session-state key of a recommendation (the scenario key plus the advice inputs)."""
    return json.dumps([scenario_key(scenario), slo, budget, replications])


@dataclass(frozen=True)
class AdviceView:
    """A recommendation laid out for the page: settings, metrics table, rationale, caveats, config snippets."""

    settings: tuple[tuple[str, str], ...]
    comparison: pd.DataFrame
    rationale: tuple[str, ...]
    caveats: tuple[str, ...]
    method: tuple[str, ...]
    router_how: str
    configs: tuple[tuple[str, str], ...]


#: Comparison columns of the advice table: ``to_json()`` key -> column title.
ADVICE_COLUMNS = {
    "expected": "recommended",
    "baseline": "vLLM defaults (480 s, 64)",
    "bidirectional_off": "bidirectional off",
}


def _lines(value: Any) -> list[str]:
    if value is None or isinstance(value, str | bytes) and not value:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [f"{k}: {v}" for k, v in value.items()]
    if isinstance(value, Sequence):
        return [str(v) for v in value if v not in (None, "")]
    return [str(value)]


METRIC_LABELS = {
    "ttft_p50_s": "TTFT p50", "ttft_p90_s": "TTFT p90", "ttft_p99_s": "TTFT p99", "ttft_mean_s": "TTFT mean",
    "hit_rate": "hit rate", "errors": "failed turns", "pinned_kv_gib_mean": "pinned decode KV mean",
    "pinned_kv_gib_peak": "pinned decode KV peak", "prefill_utilization": "prefill utilisation (whole run)",
    "prefill_utilization_steady": "prefill utilisation (steady window; a closed loop: its active span)",
    "decode_batch_capacity": "decode batch capacity",
}


def format_metric(name: str, value: Any, ci95: Any = None) -> str:
    """A metric as text with its unit from its name (``_s`` -> ms, s, min or h as the size asks, rates -> %,
    ``gib`` -> GiB) and 95% CI: every finite one, 0 included, as ``kvplan recommend`` prints them (a CI of 0 is the
    replications agreeing, not a missing CI; one replication has none: NaN)."""
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "n/a"
    if not isinstance(value, int | float):
        return str(value)
    ci = float(ci95) if isinstance(ci95, int | float) and math.isfinite(float(ci95)) else None
    if name.endswith("_s"):
        return human_s(value) + (f" +/- {human_s(ci)}" if ci is not None else "")
    if name in ("hit_rate", "pull_rate", "prefill_utilization", "prefill_utilization_steady") or name.endswith("_fraction"):
        scale, unit, fmt = 100.0, " %", ".1f"
    elif "gib" in name:
        scale, unit, fmt = 1.0, " GiB", ",.1f"
    else:
        scale, unit, fmt = 1.0, "", ",.4g"
    text = f"{value * scale:{fmt}}{unit}"
    return f"{text} +/- {ci * scale:{fmt}}" if ci is not None else text


def kv_transfer_config_snippets(config: Any) -> list[tuple[str, str]]:
    """Copyable ``--kv-transfer-config`` lines: one per server role when the config has roles, else one."""
    if isinstance(config, str):
        try:
            config = json.loads(config)
        except json.JSONDecodeError:
            return [("--kv-transfer-config", config)]
    roles = {k: v for k, v in config.items() if isinstance(v, Mapping)} if isinstance(config, Mapping) else {}
    order = ("prefill", "producer", "decode", "consumer")
    known = sorted((k for k in roles if k.lower() in order), key=lambda k: order.index(k.lower()))
    items = [(f"{k} server", roles[k]) for k in known] if known else [("prefill and decode servers", config)]
    return [(title, f"--kv-transfer-config '{json.dumps(cfg, separators=(',', ':'), sort_keys=True)}'")
            for title, cfg in items]


def advice_view(rec: Mapping[str, Any]) -> AdviceView:
    """Lay out ``Recommendation.to_json()`` of ``plan.advice`` (settings, expected vs baselines with CIs,
    rationale and binding constraint, warnings and disagreements, rules and assumptions, the config)."""
    # retention off: the knobs apply only if bidirectional is kept on against the advice, and say so
    off = bool(rec.get("retention_off"))
    cond = " (only if kept on)" if off else ""
    settings = [
        *([("bidirectional_kv_xfer", "false (retention off)")] if off else []),
        (f"decoder_kv_blocks_ttl{cond}", f"{float(rec['decoder_kv_blocks_ttl_s']):g} s"),
        (f"kv_recompute_threshold{cond}", f"{int(rec['kv_recompute_threshold_tokens'])} tokens"),
        (f"router TTL{cond}", f"{float(rec['router_ttl_s']):g} s"),
    ]
    if rec.get("kv_load_failure_policy"):
        settings.append(("kv_load_failure_policy", str(rec["kv_load_failure_policy"])))
    table: dict[str, dict[str, str]] = {}
    for key, title in ADVICE_COLUMNS.items():
        metrics = rec.get(key)
        if isinstance(metrics, Mapping):
            # rows named for people (the values carry their units: ms, %, GiB), not by summary keys
            table[title] = {METRIC_LABELS.get(str(m), str(m)): format_metric(m, v, metrics.get(f"{m}_ci95"))
                            for m, v in metrics.items() if not m.endswith("_ci95")}
    sat = rec.get("saturation")
    if isinstance(sat, Mapping) and table:
        names = {**RESOURCE_NAMES, "link": "P<->D links"}  # the advice's names, the link as the table says it
        keys = {"expected": "recommended", "baseline": "vllm_defaults", "bidirectional_off": "bidirectional_off"}
        for key, title in ADVICE_COLUMNS.items():
            if title in table:
                table[title]["saturated"] = ", ".join(names.get(r, r) for r in sat.get(keys[key], [])) or "-"
    rationale = _lines(rec.get("rationale"))
    if rec.get("binding_constraint"):
        rationale.append(f"Binding constraint: {rec['binding_constraint']}.")
    router = rec.get("router")
    how = str(router.get("how", "")) if isinstance(router, Mapping) else ""
    if off and how:
        how = f"only if you keep bidirectional_kv_xfer on (not recommended): {how}"
    return AdviceView(
        settings=tuple(settings),
        comparison=pd.DataFrame(table),
        rationale=tuple(rationale),
        caveats=tuple(_lines(rec.get("warnings")) + _lines(rec.get("disagreements")) + _run_notes(rec)),
        method=tuple(_lines(rec.get("rules")) + _lines(rec.get("assumptions"))),
        router_how=how,
        configs=tuple(kv_transfer_config_snippets(rec.get("kv_transfer_config", {}))),
    )


def progress_adapter(bar: Any, label: str) -> Callable[..., None]:
    """A progress callback for APIs that report ``(done, total)``, ``(fraction,)`` or ``(done, total, text)``."""

    def cb(*args: Any, **_kw: Any) -> None:
        frac = 0.0
        text = label
        nums = [a for a in args if isinstance(a, int | float) and not isinstance(a, bool)]
        if len(nums) >= 2 and nums[1]:
            frac = nums[0] / nums[1]
            text = f"{label}: {nums[0]:g}/{nums[1]:g}"
        elif len(nums) == 1:
            frac = nums[0]
        strs = [a for a in args if isinstance(a, str)]
        if strs:
            text = f"{label}: {strs[0]}"
        bar.progress(min(max(float(frac), 0.0), 1.0), text=text)

    return cb


def _run_notes(rec: Mapping[str, Any]) -> list[str]:
    """What was simulated (the screen's pruning, lengthened runs), as the CLI prints it."""
    out = []
    scr, ss = rec.get("screen") or {}, rec.get("steady_state") or {}
    if isinstance(scr, Mapping) and scr.get("pruned_ttls_s"):
        out.append("screen: simulated TTLs " + ", ".join(f"{float(t):g}" for t in scr.get("simulated_ttls_s", []))
                   + " s; pruned " + ", ".join(f"{float(t):g}" for t in scr["pruned_ttls_s"]) + " s")
    if isinstance(ss, Mapping) and ss.get("lengthened"):
        out.append(f"runs lengthened from {ss['conversations_asked']:,} to {ss['conversations_simulated']:,} "
                   "conversations for steady state")
    return out
