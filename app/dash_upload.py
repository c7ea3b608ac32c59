"""Uploads of the Calibration page: bounded, format-detected, parsed by the calibration parsers, never evaluated.

An upload is checked against :data:`MAX_UPLOAD_BYTES` before it touches the disk, written under a
content-addressed temporary directory with a sanitised name (the parsers read paths, and their one-line
errors then name the file the user uploaded), sniffed with ``detect_format`` and parsed with
``parse_any``. JSON is read with :mod:`json`, nothing is unpickled or evaluated. Profiles (JSON) are
validated by ``models.profile.load_profile`` and written content-addressed, so a scenario that names
one keeps a stable cache key.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from kvplan.atomic import atomic_write_bytes
from kvplan.calibration.calibrate import calibrate
from kvplan.calibration.parsers import (
    BenchServeResult,
    MultiTurnStats,
    PrometheusScrape,
    VllmLog,
    detect_format,
    parse_any,
)
from kvplan.errors import KvplanInputError, input_error
from kvplan.models.profile import Profile, load_profile, save_profile

#: Largest upload the dashboard accepts, checked on the bytes before anything is written (64 MiB).
MAX_UPLOAD_BYTES = 64 * 1024**2
#: The same limit in the MB unit of ``st.file_uploader(max_upload_size=...)`` and ``server.maxUploadSize``.
MAX_UPLOAD_MB = MAX_UPLOAD_BYTES // 1024**2
#: Trace formats ``kvplan calibrate`` takes (flag name = ``detect_format`` name), and the published CSV.
CALIBRATE_FORMATS = ("bench", "multiturn", "log", "prometheus", "points")

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]+")


def _root() -> Path:
    return Path(tempfile.gettempdir()) / "kvplan-dashboard"


def safe_name(name: str) -> str:
    """The upload's base name with anything but letters, digits, ``._-`` replaced (never a path)."""
    base = os.path.basename(name.replace("\\", "/")) or "upload"
    cleaned = _SAFE_NAME.sub("_", base).lstrip(".") or "upload"
    return cleaned[:120]


def store_upload(name: str, data: bytes, max_bytes: int = MAX_UPLOAD_BYTES) -> Path:
    """Write ``data`` to ``<tmp>/kvplan-dashboard/uploads/<sha256>/<safe name>`` after the size check."""
    label = safe_name(name)
    if len(data) > max_bytes:
        raise input_error(
            label, f"upload is {len(data) / 1024**2:.1f} MiB, larger than the {max_bytes / 1024**2:.0f} MiB limit",
            "split or filter the trace",
        )
    if not data:
        raise input_error(label, "upload is empty", "pick the complete file (an empty file holds no data)")
    digest = hashlib.sha256(data).hexdigest()[:32]
    folder = _root() / "uploads" / digest
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / label
    if not path.is_file() or path.stat().st_size != len(data):
        atomic_write_bytes(path, data, flag="upload")
    return path


def _relabel(exc: KvplanInputError, path: Path) -> KvplanInputError:
    """The parser's message with the temporary directory removed (it names the uploaded file only)."""
    return KvplanInputError(str(exc).replace(str(path.parent) + os.sep, ""))


@dataclass(frozen=True)
class ParsedTrace:
    """One parsed upload: the stored path, its detected format, the parse result and a short summary."""

    name: str
    path: str
    fmt: str
    result: Any
    summary: str


def describe(result: Any) -> str:
    """One line saying what a parse result holds (counts of requests, lines, samples, points)."""
    if isinstance(result, BenchServeResult):
        n = 0 if result.requests is None else len(result.requests)
        return f"vllm bench serve: {result.completed} completed requests, {n} with per-request data"
    if isinstance(result, MultiTurnStats):
        return f"multi-turn stats: {result.n_requests} requests in {result.n_conversations} conversations"
    if isinstance(result, VllmLog):
        parts = []
        if result.engine is not None:
            parts.append(f"{len(result.engine.kv_transfer)} KV transfer metric lines, "
                         f"{result.engine.n_expired_releases} expired releases")
        if result.proxy is not None:
            parts.append(f"{len(result.proxy.prefill)} proxy prefill lines, {len(result.proxy.cache_events)} cache events")
        return "vLLM log: " + ("; ".join(parts) or "no lines of interest")
    if isinstance(result, PrometheusScrape):
        return (f"Prometheus: {len(result.scrape_times_s)} scrapes, {len(result.counters)} counter and "
                f"{len(result.gauges)} gauge samples, {len(result.histograms)} histograms")
    if isinstance(result, pd.DataFrame):
        return f"CSV: {len(result)} rows"
    return type(result).__name__


def parse_upload(name: str, data: bytes, max_bytes: int = MAX_UPLOAD_BYTES) -> ParsedTrace:
    """Store, sniff and parse one uploaded trace (one-line :class:`KvplanInputError` naming the file)."""
    path = store_upload(name, data, max_bytes)
    try:
        fmt = detect_format(path)
        result = parse_any(path, max_bytes=max_bytes)
    except KvplanInputError as exc:
        raise _relabel(exc, path) from None
    return ParsedTrace(safe_name(name), str(path), fmt, result, describe(result))


def parse_uploads(files: list[tuple[str, bytes]], cache: dict[str, ParsedTrace] | None = None,
                  max_bytes: int = MAX_UPLOAD_BYTES) -> tuple[list[ParsedTrace], list[str]]:
    """Parse every ``(name, bytes)`` upload; good ones are returned, bad ones become one-line messages.

    ``cache`` (e.g. a session-state dict) maps the upload's digest to its parse, so a rerun does not
    parse the same bytes again.
    """
    parsed: list[ParsedTrace] = []
    errors: list[str] = []
    for name, data in files:
        key = f"{safe_name(name)}:{hashlib.sha256(data).hexdigest()}"
        try:
            trace = cache[key] if cache is not None and key in cache else parse_upload(name, data, max_bytes)
        except KvplanInputError as exc:
            errors.append(" ".join(str(exc).split()))
            continue
        if cache is not None:
            cache[key] = trace
        parsed.append(trace)
    return parsed, errors


def trace_points(trace: ParsedTrace) -> tuple[pd.DataFrame, str, str, str | None, str, str] | None:
    """Points worth plotting from a parsed trace: ``(frame, x, y, colour, x_title, y_title)`` or ``None``."""
    r = trace.result
    if isinstance(r, BenchServeResult) and r.requests is not None and {"input_len_tokens", "ttft_s"} <= set(r.requests):
        f = r.requests.assign(ttft_ms=r.requests["ttft_s"] * 1000.0)
        return f, "input_len_tokens", "ttft_ms", None, "input tokens", "TTFT (ms)"
    if isinstance(r, MultiTurnStats):
        f = r.requests.assign(ttft_ms=r.requests["ttft_s"] * 1000.0)
        return f, "input_num_tokens", "ttft_ms", "user_turn", "input tokens (content)", "TTFT (ms)"
    if isinstance(r, pd.DataFrame) and {"kind", "tokens", "value_ms"} <= set(r.columns):
        return r, "tokens", "value_ms", "kind", "tokens", "measured (ms)"
    if isinstance(r, pd.DataFrame) and {"series", "prompt_tokens", "value_ms"} <= set(r.columns):
        return r, "prompt_tokens", "value_ms", "series", "prefix size (tokens)", "published (ms)"
    return None


# --- profiles ---------------------------------------------------------------------------------------------------


def profile_from_json(text: str) -> Profile:
    """Validate profile JSON text (bounded, JSON only) into a :class:`Profile`."""
    path = store_upload("profile.json", text.encode("utf-8"), max_bytes=8 * 1024**2)
    try:
        return load_profile(path)
    except KvplanInputError as exc:
        raise _relabel(exc, path) from None


def profile_json(profile: Profile) -> str:
    """A profile as the JSON text ``save_profile`` writes (sorted keys, stable bytes)."""
    return json.dumps(profile.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"


def load_uploaded_profile(name: str, data: bytes) -> Profile:
    """Validate an uploaded profile JSON file (one-line error naming the upload)."""
    path = store_upload(name, data, max_bytes=8 * 1024**2)
    try:
        return load_profile(path)
    except KvplanInputError as exc:
        raise _relabel(exc, path) from None


def session_profile_path(text: str) -> str:
    """A stable path holding the session's profile JSON (content-addressed, so cache keys stay valid)."""
    profile = profile_from_json(text)
    digest = hashlib.sha256(text.encode("utf-8")).hexdigest()[:32]
    folder = _root() / "profiles"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{safe_name(profile.name)}-{digest}.json"
    if not path.is_file():
        save_profile(profile, path)
    return str(path)


# --- fits (calibration, issue 3) ----------------------------------------------------------------------------------

#: Tensor-parallel sizes a measured deployment may have had.
TP_CHOICES = (1, 2, 4, 8)


def strip_upload_dirs(message: str) -> str:
    """A message with the dashboard's temporary upload directories removed (it names the uploads only)."""
    return re.sub(re.escape(str(_root() / "uploads")) + r"/[0-9a-f]+/", "", message)


def fit_profile(traces: list[ParsedTrace], model: str, hardware: str, tp: int = 8) -> Profile:
    """Fit a profile to the uploaded traces with ``calibration.calibrate.calibrate``.

    Traces are passed by path, grouped by format exactly as ``kvplan calibrate --bench/--multiturn/--log/
    --prometheus/--points`` takes them, with the dashboard's upload limit as ``max_bytes``.
    """
    by_kind: dict[str, list[str]] = {k: [] for k in CALIBRATE_FORMATS}
    for t in traces:
        if t.fmt in by_kind:
            by_kind[t.fmt].append(t.path)
    if not any(by_kind.values()):
        raise input_error("calibration", "no uploaded trace in a format the fit takes",
                          f"upload one of: {', '.join(CALIBRATE_FORMATS)}")
    try:
        result = calibrate(model, hardware, tp=tp, max_bytes=MAX_UPLOAD_BYTES, bench=by_kind["bench"],
                           multiturn=by_kind["multiturn"], log=by_kind["log"], prometheus=by_kind["prometheus"],
                           points=by_kind["points"])
    except KvplanInputError as exc:
        raise KvplanInputError(strip_upload_dirs(str(exc))) from None
    profile = getattr(result, "profile", result)
    if not isinstance(profile, Profile):
        raise input_error("calibration", f"calibrate() returned {type(result).__name__}, expected a Profile")
    return profile


def parameter_table(profile: Profile) -> pd.DataFrame:
    """Every cost parameter with its value, standard error and status.

    From the fit report of ``kvplan calibrate`` (``fits[].params``: fitted, at_bound, poorly_determined
    or held) when there is one; otherwise from the profile's costs and ``uncertainty``.
    """
    rows = []
    sim_params = profile.fit_report.get("params")
    if profile.fit_report.get("self_check") is not None and isinstance(sim_params, list):  # calibrate --scenario
        for p in sim_params:
            rows.append({"parameter": p.get("name"), "value": p.get("value"), "std_error": None, "relative_error": None,
                         "status": p.get("status"), "note": f"prior {p.get('prior')}, physical floor "
                         f"{p.get('lower')}; {p.get('why', '')}"})
        return pd.DataFrame(rows)
    for fit in profile.fit_report.get("fits", []) if isinstance(profile.fit_report.get("fits"), list) else []:
        for p in fit.get("params", []):
            value, se = p.get("value"), p.get("stderr")
            rel = abs(se / value) if isinstance(se, int | float) and isinstance(value, int | float) and value else None
            rows.append({"parameter": p.get("name"), "value": value, "std_error": se, "relative_error": rel,
                         "status": p.get("status"), "note": p.get("note", "")})
    if rows:
        return pd.DataFrame(rows)
    for comp, params in profile.costs.model_dump(mode="json").items():
        for name, value in params.items():
            se = profile.uncertainty.get(f"{comp}.{name}")
            rel = abs(se / value) if se is not None and isinstance(value, int | float) and value else None
            rows.append({"parameter": f"{comp}.{name}", "value": value, "std_error": se, "relative_error": rel,
                         "status": profile.status, "note": ""})
    return _one_type_values(pd.DataFrame(rows))


def _value_text(v: Any) -> str:
    """A parameter value as text at six significant digits, a knot list as its values in brackets."""
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value_text(x) for x in v) + "]"
    if isinstance(v, int | float) and not isinstance(v, bool):
        return format(float(v), ".6g")
    return "" if v is None else str(v)


def _one_type_values(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` with its ``value`` column as text when it mixes numbers and lists (measured knots): a table column
    holds one type (Arrow could not convert the mix; Streamlit logged a traceback and showed its own str())."""
    if "value" in frame.columns and any(isinstance(v, list | tuple | dict) for v in frame["value"]):
        frame = frame.assign(value=[_value_text(v) for v in frame["value"]])
    return frame


def self_check_table(profile: Profile) -> pd.DataFrame | None:
    """The self-check of a fit through the simulator (``fit_report['self_check']``): measured and simulated per
    run and metric, the relative error and whether it gates the status, or ``None`` when the fit had none."""
    raw = profile.fit_report.get("self_check")
    if not isinstance(raw, list) or not raw or not all(isinstance(r, dict) for r in raw):
        return None
    return pd.DataFrame([{"run": r.get("run"), "metric": r.get("metric"), "measured (ms)": r.get("measured_ms"),
                          "simulated (ms)": r.get("simulated_ms"), "relative error": r.get("rel_error"),
                          "gates the status": bool(r.get("gated")), "within tolerance": bool(r.get("within"))}
                         for r in raw])


def held_out_table(profile: Profile) -> pd.DataFrame | None:
    """The held-out-seed check of a fit through the simulator (``fit_report['held_out_check']``: the fitted profile
    simulated with seeds the fit did not use; their mean gates the status too), or ``None`` when the fit had none."""
    raw = profile.fit_report.get("held_out_check")
    if not isinstance(raw, list) or not raw or not all(isinstance(r, dict) for r in raw):
        return None
    return pd.DataFrame([{"run": r.get("run"), "metric": r.get("metric"), "seeds": len(r.get("seeds") or []),
                          "measured (ms)": r.get("measured_ms"), "simulated mean (ms)": r.get("simulated_ms"),
                          "per seed (ms)": ", ".join(f"{float(v):.6g}" for v in r.get("simulated_ms_per_seed") or []),
                          "relative error": r.get("rel_error"), "gates the status": bool(r.get("gated")),
                          "within tolerance": bool(r.get("within"))} for r in raw])


#: Display format of every float in the Calibration page's tables: six significant digits (a grid's default
#: rounding would show 2.5e-05 s as 0).
FLOAT_FORMAT = "%.6g"


def float_columns(frame: pd.DataFrame) -> list[str]:
    """The columns of ``frame`` holding floats (shown at :data:`FLOAT_FORMAT`, not rounded to a few decimals)."""
    return [str(c) for c in frame.columns if pd.api.types.is_float_dtype(frame[c])]


def mape_table(profile: Profile) -> pd.DataFrame | None:
    """Mean absolute percentage error per fitted metric (``fit_report['mape_pct']``), or ``None``."""
    mape = profile.fit_report.get("mape_pct")
    if not isinstance(mape, dict) or not mape:
        return None
    return pd.DataFrame({"metric": list(mape), "MAPE (%)": [float(v) for v in mape.values()]})


def report_notes(profile: Profile) -> list[str]:
    """The fit report's notes (held parameters and caveats of the data), then the profile's notes."""
    notes = profile.fit_report.get("notes")
    fit_notes = [str(n) for n in notes] if isinstance(notes, list) else []
    return fit_notes + [n for n in profile.notes if n not in fit_notes]


def residual_frame(profile: Profile) -> pd.DataFrame | None:
    """Residual points of the profile's fit report as ``metric, x, observed, predicted``, or ``None``."""
    raw = profile.fit_report.get("residuals")
    if not isinstance(raw, list) or not raw or not all(isinstance(r, dict) for r in raw):
        return None
    frame = pd.DataFrame(raw)
    if not {"metric", "x", "observed", "predicted"} <= set(frame.columns):
        return None
    return frame
