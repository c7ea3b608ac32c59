"""Kernel-derived compute priors: query aiconfigurator-core on a grid, fit kvplan's own cost functions.

``kvplan profile derive --model M --gpu G --tp N [--model-config DIR] --out P.json`` (optional extra
``kvplan[aic]`` = ``aiconfigurator-core==0.12.0``, NVIDIA, Apache-2.0). aiconfigurator sums per-operation
latencies of vLLM's own kernels (GEMM, attention, all-reduce, ...) measured on each GPU (vLLM 0.24 on
Hopper/Blackwell/L40S, 0.14 on A100), through its low-level API: ``perf_database.get_database(system,
"vllm", version)``, ``models.get_model(path, ModelConfig(tp_size=N), "vllm")``,
``backends.factory.get_backend("vllm").run_static_latency_only(model, db, RuntimeConfig(...), mode)``
with ``mode="static_ctx"`` (one prefill pass of ``batch`` sequences of ``isl`` tokens, ``prefix`` of
them cached) and ``mode="static_gen"`` with ``osl=2`` (one decode step of ``batch`` sequences at
context ``isl``).

Grid: prefill over batch {1, 2, 4} x prompt {128 .. 32k} x cached share {0, 50 %, 75 %}; decode over
batch {1 .. 128} x context {512 .. 32k}, each capped at the model's context limit (the fitted range:
longer steps extrapolate with the last knot's per-token slope). The fit (``scipy.optimize.lsq_linear``,
relative residuals, every parameter bounded below by :mod:`kvplan.models.bounds`) targets the knotted forms
of :func:`kvplan.models.costs.prefill_gpu_step_s` (linear-layer time at :data:`PREFILL_KNOTS` step sizes,
causal and cached attention per pair) and of the GPU part of :func:`kvplan.models.costs.decode_step_time_s`
(context-free step time and KV read time per context token, each at :data:`DECODE_KNOTS` batch sizes); linear
interpolation between knots is exactly what the cost functions evaluate, so the fit is linear. The
engine's CPU overhead is not in kernel data and stays 0 in a prior (calibrated as a residual on real
measurements). MoE models are queried with the experts sharded by TP (``moe_tp_size = tp``,
``moe_ep_size = 1``: vLLM without ``--enable-expert-parallel``), an assumption recorded in ``mode``.

Nothing here runs at simulation time or in CI: only this module imports aiconfigurator, lazily.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError
from scipy.optimize import lsq_linear

from kvplan.errors import input_error
from kvplan.inputfile import is_kernel_file, json_loads
from kvplan.models.arch import ModelArch
from kvplan.models.bounds import physical_bounds
from kvplan.models.costs import CostModel, DecodeCost, PrefillCost, causal_pairs
from kvplan.models.hardware import GPU, Node
from kvplan.models.profile import Profile, prior_name

AIC_PACKAGE = "aiconfigurator-core"
AIC_VERSION = "0.12.0"
#: kvplan model preset -> the aiconfigurator bundled model path whose architecture it is.
AIC_MODEL_PATHS = {
    "qwen3-32b": "Qwen/Qwen3-32B",
    "llama-3.3-70b": "meta-llama/Meta-Llama-3.1-70B",  # same architecture as Llama-3.3-70B
    "llama-3.1-8b": "meta-llama/Meta-Llama-3.1-8B",
    "qwen3-8b": "Qwen/Qwen3-8B",
    "glm-5-fp8": "zai-org/GLM-5-FP8",
}
#: aiconfigurator's vLLM perf-database version per system (the newest with GEMM and attention tables).
AIC_VLLM_VERSION = {"h100_sxm": "0.24.0", "h200_sxm": "0.24.0", "b200_sxm": "0.24.0", "l40s": "0.24.0",
                    "a100_sxm": "0.14.0"}
PREFILL_BATCHES = (1, 2, 4)
PREFILL_PROMPTS = (128, 512, 1024, 2048, 4096, 8192, 12288, 16384, 24576, 32768)
CACHED_SHARES = (0.0, 0.5, 0.75)
#: Batch sizes of the decode grid (and the knots of the fit): powers of two with their midpoints from 8 on, where
#: the step's KV read dominates and aiconfigurator's attention slope changes most between table rows.
DECODE_BATCHES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
DECODE_CONTEXTS = (512, 2048, 4096, 8192, 16384, 32768)
#: Largest tokens one prefill pass of the grid may hold (vLLM's step budget is at most this in practice).
MAX_STEP_TOKENS = 32768
MAX_CONFIG_BYTES = 1024**2


#: An absolute POSIX path in an error text: a ``/`` not inside a word, number or relative path, then its parts.
_ABS_PATH = re.compile(r"(?<![\w.~/])/[^\s'\"(),;:]+")
_PACKAGE_DIRS = ("site-packages/", "dist-packages/")


def portable_text(text: str, root: Path | None = None) -> str:
    """``text`` with its absolute paths made machine-independent, for files kvplan ships (``models/priors/INDEX.json``
    records why a prior was skipped in the words of aiconfigurator's exception, which names the file it read from
    the generating machine's virtual environment): a path inside an installed package becomes
    ``<site-packages>/<package path>``, one inside ``root`` (the repository) relative to it, any other its last
    part after ``.../``."""
    base = Path(__file__).resolve().parents[1] if root is None else root

    def portable(m: re.Match[str]) -> str:
        path = m.group(0)
        for marker in _PACKAGE_DIRS:
            if marker in path:
                return "<site-packages>/" + path.split(marker, 1)[1]
        rel = os.path.relpath(path, base)
        if not rel.startswith(".."):
            return rel
        return ".../" + (Path(path).name or path.strip("/"))

    return _ABS_PATH.sub(portable, text)


def skip_reason(exc: BaseException, max_chars: int = 160) -> str:
    """Why a prior was skipped, as ``models/priors/INDEX.json`` records it: the exception's type and its message,
    made portable (:func:`portable_text`) before it is cut to ``max_chars``."""
    return f"{type(exc).__name__}: {portable_text(str(exc))[:max_chars]}"


def aic_version() -> str | None:
    """The installed aiconfigurator-core version, or None when the extra is not installed."""
    from importlib import metadata

    try:
        return metadata.version(AIC_PACKAGE)
    except metadata.PackageNotFoundError:
        return None


def require_aic() -> str:
    """The installed version, or a one-line input error saying how to install the extra."""
    v = aic_version()
    if v is None:
        raise input_error("profile derive", f"needs the optional extra {AIC_PACKAGE}=={AIC_VERSION}, not installed",
                          f"pip install 'kvplan[aic]' (or pip install {AIC_PACKAGE}=={AIC_VERSION})")
    return v


def check_model_config(path: str | Path) -> dict[str, Any]:
    """Validate a local Hugging Face model directory (``config.json``) before aiconfigurator reads it."""
    if not str(path).strip():  # Path("") is the current directory: never read a config.json found there
        raise input_error("--model-config", "is empty", "give the directory of a Hugging Face model's config.json")
    d = Path(path)
    cfg = d / "config.json"
    if not d.is_dir() or not cfg.is_file():
        raise input_error("--model-config", f"'{d}' is not a directory with a config.json",
                          "give the directory of a Hugging Face model's config.json")
    st = cfg.stat()
    if st.st_size == 0 and is_kernel_file(st):  # a config.json linked to /proc/kmsg: the read would block forever
        raise input_error("--model-config", f"{cfg} is a special file of the kernel (/proc, /sys), so it was not read",
                          "give the directory of a Hugging Face model's config.json")
    if st.st_size > MAX_CONFIG_BYTES:
        raise input_error("--model-config", f"{cfg} is larger than 1 MiB", "is this a model config.json?")
    try:
        data, _ = json_loads(cfg.read_text(encoding="utf-8"), f"--model-config: {cfg}", unique_keys=True)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise input_error("--model-config", f"{cfg} is not valid JSON ({exc.__class__.__name__})",
                          "fix or re-download config.json") from None
    if not isinstance(data, dict):
        raise input_error("--model-config", f"{cfg} is not a JSON object", "fix or re-download config.json")
    for key in ("architectures", "num_hidden_layers", "hidden_size", "num_attention_heads"):
        if key not in data:
            raise input_error(f"--model-config: field '{key}'", f"missing from {cfg}", "give a complete config.json")
    for key in ("num_hidden_layers", "hidden_size", "num_attention_heads"):
        _cfg_int(data, key)
    for key in ("num_key_value_heads", "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings"):
        if key in data:  # optional, but a value given must be a sane size (checked before aiconfigurator runs)
            _cfg_int(data, key, 1)
    return data


#: Config keys of mixture-of-experts or latent-attention models (their kvplan architecture needs a preset).
_NOT_DENSE_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "kv_lora_rank", "q_lora_rank")


#: Largest size a config.json field may hold (hidden sizes, vocabularies and layer counts stay far below).
MAX_CONFIG_INT = 1_000_000_000


def _cfg_int(data: dict[str, Any], key: str, default: int | None = None) -> int:
    """``data[key]`` as a positive integer of at most :data:`MAX_CONFIG_INT` (``default`` when absent or
    null), else a one-line error naming the field."""
    value = data.get(key)
    if value is None or (value == 0 and default is not None and not isinstance(value, bool)):
        if default is None:
            raise input_error(f"--model-config: field '{key}'", "missing from config.json", "give a complete config.json")
        return default
    if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_CONFIG_INT:
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_CONFIG_INT:
        shown = f"an integer of {value.bit_length()} bits" if isinstance(value, int) else repr(value)[:40]
        raise input_error(f"--model-config: field '{key}'", f"must be a positive integer of at most "
                          f"{MAX_CONFIG_INT:,}, got {shown}", "fix or re-download config.json")
    return value


def arch_from_hf_config(name: str, data: dict[str, Any]) -> ModelArch:
    """A dense GQA :class:`ModelArch` from a Hugging Face ``config.json`` (bf16 weights, untied LM head unless
    ``tie_word_embeddings``); context limit = ``max_position_embeddings`` (vLLM's default)."""
    for key in _NOT_DENSE_KEYS:
        if data.get(key):
            raise input_error(f"--model-config: field '{key}'", "MoE / latent-attention configs are not derived from "
                              "config.json alone", "use a kvplan model preset (--model) with --model-config")
    layers, hidden, heads = (_cfg_int(data, k) for k in ("num_hidden_layers", "hidden_size", "num_attention_heads"))
    kv = _cfg_int(data, "num_key_value_heads", heads)
    hd = _cfg_int(data, "head_dim", hidden // heads)
    inter = _cfg_int(data, "intermediate_size")
    vocab = _cfg_int(data, "vocab_size")
    attn = hidden * heads * hd + 2 * hidden * kv * hd + heads * hd * hidden
    active = layers * (attn + 3 * hidden * inter)
    total = active + vocab * hidden * (1 if data.get("tie_word_embeddings") else 2)
    try:
        return ModelArch(
            name=name, hf_id=str(data.get("_name_or_path", ""))[:200], attention="gqa", num_layers=layers,
            hidden_size=hidden, num_q_heads=heads, num_kv_heads=kv, head_dim=hd, intermediate_size=inter,
            vocab_size=vocab, params_total=float(total), params_active=float(active), weight_bytes_total=2.0 * total,
            max_model_len=_cfg_int(data, "max_position_embeddings", 32768),
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise input_error(f"--model-config: field '{field}'", str(err["msg"]), "fix or re-download config.json") from None


def check_tp(arch: ModelArch, tp: int, node_gpus: int | None = None) -> None:
    """TP must divide the query heads and fit in one node."""
    if tp <= 0:
        raise input_error("--tp", f"must be a positive integer, got {tp}")
    if arch.num_q_heads % tp:
        raise input_error("--tp", f"{tp} does not divide the {arch.num_q_heads} attention heads of {arch.name}",
                          "use a TP size that divides the head count (1, 2, 4, 8 for most models)")
    if node_gpus is not None and tp > node_gpus:
        raise input_error("--tp", f"{tp} exceeds the {node_gpus} GPUs of one node", f"use --tp <= {node_gpus}")


# --- the grid -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefillPoint:
    """One aiconfigurator prefill query and its answer (ms)."""

    batch: int
    prompt: int
    cached: int
    ms: float

    @property
    def new_tokens(self) -> int:
        """New tokens of the whole pass."""
        return self.batch * (self.prompt - self.cached)

    @property
    def pairs(self) -> float:
        """Causal attention pairs of the whole pass."""
        return self.batch * causal_pairs(self.prompt - self.cached, self.cached)


@dataclass(frozen=True)
class DecodePoint:
    """One aiconfigurator decode-step query and its answer (ms)."""

    batch: int
    context: int
    ms: float


def prefill_grid(max_len: int) -> list[tuple[int, int, int]]:
    """``(batch, prompt, cached)`` of the prefill grid for a model with context limit ``max_len``."""
    out = []
    for b in PREFILL_BATCHES:
        for prompt in PREFILL_PROMPTS:
            if prompt > max_len:
                continue
            for share in CACHED_SHARES:
                cached = int(round(prompt * share))
                if b * (prompt - cached) <= MAX_STEP_TOKENS:
                    out.append((b, prompt, cached))
    return out


def decode_grid(max_len: int) -> list[tuple[int, int]]:
    """``(batch, context)`` of the decode grid."""
    return [(b, x) for b in DECODE_BATCHES for x in DECODE_CONTEXTS if x <= max_len]


class AicSession:
    """One loaded aiconfigurator database and model (about 2 s to load, ~0.1 ms a query)."""

    def __init__(self, system: str, model_path: str, tp: int, moe: bool) -> None:
        logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
        from aiconfigurator_core.sdk import config, models, perf_database
        from aiconfigurator_core.sdk.backends.factory import get_backend

        self.system = system
        self.version = AIC_VLLM_VERSION.get(system, "")
        if not self.version:
            raise input_error("--gpu", f"aiconfigurator has no vLLM kernel data for '{system}'",
                              f"use one of {', '.join(sorted(AIC_VLLM_VERSION))}")
        self._config = config
        self.db: Any = perf_database.get_database(system, "vllm", self.version)
        if self.db is None:
            raise input_error("--gpu", f"aiconfigurator could not load vLLM {self.version} data for '{system}'")
        kw: dict[str, Any] = {"tp_size": tp}
        if moe:
            kw.update(moe_tp_size=tp, moe_ep_size=1)  # vLLM TP without --enable-expert-parallel shards experts
        self.mode = "SILICON (default perf-database mode), moe_tp=tp, moe_ep=1" if moe else "SILICON (default)"
        self.model: Any = models.get_model(model_path, config.ModelConfig(**kw), "vllm")
        self.backend: Any = get_backend("vllm")

    def prefill_ms(self, batch: int, prompt: int, cached: int) -> float:
        """One prefill pass (static_ctx): ``batch`` sequences of ``prompt`` tokens, ``cached`` of them cached."""
        rc = self._config.RuntimeConfig(batch_size=batch, isl=prompt, osl=1, prefix=cached)
        return float(self.backend.run_static_latency_only(self.model, self.db, rc, "static_ctx"))

    def decode_ms(self, batch: int, context: int) -> float:
        """One decode step (static_gen with osl=2) of ``batch`` sequences at ``context`` tokens each."""
        rc = self._config.RuntimeConfig(batch_size=batch, isl=context, osl=2, prefix=0)
        return float(self.backend.run_static_latency_only(self.model, self.db, rc, "static_gen"))

    def silicon_share(self) -> float:
        """Share of an 8k-token prefill's latency that comes from measured ('silicon') kernel rows."""
        rc = self._config.RuntimeConfig(batch_size=1, isl=8192, osl=1, prefix=0)
        s = self.backend.run_static(self.model, self.db, rc, "static_ctx")
        lat, src = s.get_context_latency_dict(), s.get_context_source_dict()
        tot = sum(lat.values())
        return float(sum(v for k, v in lat.items() if src.get(k) == "silicon") / tot) if tot > 0 else 0.0


# --- the fit ---------------------------------------------------------------------------------------------------------


PREFILL_KNOTS = (32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 12288, 16384, 24576, 32768)
DECODE_KNOTS = DECODE_BATCHES


def _bounds(arch: ModelArch, gpu: GPU, tp: int) -> dict[str, float]:
    node = Node.model_validate({"name": "prior", "gpu": gpu, "gpus_per_node": max(tp, 1),
                                "link": {"name": "none", "bandwidth_bytes_per_s_per_rank": 1.0}})
    return {b.param: b.lower for b in physical_bounds(arch, node, tp)}


def interpolation_matrix(knots: tuple[int, ...], x: np.ndarray) -> np.ndarray:
    """Rows of linear-interpolation weights of each ``x`` over ``knots`` (flat outside), as the cost functions use."""
    k = np.asarray(knots, dtype=float)
    m = np.zeros((len(x), len(k)))
    for i, v in enumerate(x):
        j = int(np.searchsorted(k, v))
        if j == 0:
            m[i, 0] = 1.0
        elif j >= len(k):
            m[i, -1] = 1.0
        else:
            t = (v - k[j - 1]) / (k[j] - k[j - 1])
            m[i, j - 1], m[i, j] = 1.0 - t, t
    return m


def fit_prefill(points: list[PrefillPoint], arch: ModelArch, gpu: GPU, tp: int) -> PrefillCost:
    """Fit the knotted :class:`PrefillCost` (linear-layer time at :data:`PREFILL_KNOTS`, causal and context
    attention per pair) to the points: relative residuals, linear least squares bounded below by physics."""
    lb = _bounds(arch, gpu, tp)
    n = np.array([p.new_tokens for p in points], dtype=float)
    if n.max() > PREFILL_KNOTS[-1]:
        raise ValueError("prefill grid beyond the last knot")
    ctx = np.array([p.batch * (p.prompt - p.cached) * p.cached for p in points], dtype=float)
    causal = np.array([p.pairs for p in points], dtype=float) - ctx
    y = np.array([p.ms for p in points]) / 1e3
    a = np.column_stack([interpolation_matrix(PREFILL_KNOTS, n), causal, ctx]) / y[:, None]
    knots = np.array(PREFILL_KNOTS, dtype=float)
    lower = np.concatenate([np.maximum(lb["prefill.weight_read_s"], knots * lb["prefill.per_token_s"]),
                            [lb["prefill.attention_s"], lb["prefill.context_attention_s"]]])
    sol = lsq_linear(a, np.ones(len(y)), bounds=(lower, np.full(len(lower), np.inf)), method="bvls")
    x = [float(v) for v in sol.x]
    t = x[: len(knots)]
    slope = max((t[-1] - t[-2]) / (knots[-1] - knots[-2]), lb["prefill.per_token_s"])
    return PrefillCost(per_token_s=slope, attention_s=x[-2], context_attention_s=x[-1],
                       linear_knots_tokens=PREFILL_KNOTS, linear_knots_s=tuple(t))


def _fit_decode_columns(points: list[DecodePoint], arch: ModelArch, gpu: GPU, tp: int,
                        per_knot_context: bool) -> tuple[list[float], list[float]]:
    """``(batch knots' step times, context slopes)`` of the bounded relative least-squares fit: one context slope
    per batch knot (interpolated like the step times) or one for every batch."""
    lb = _bounds(arch, gpu, tp)
    b = np.array([p.batch for p in points], dtype=float)
    s = b * np.array([p.context for p in points], dtype=float)
    y = np.array([p.ms for p in points]) / 1e3
    w = interpolation_matrix(DECODE_KNOTS, b)
    ctx = w * s[:, None] if per_knot_context else s[:, None]
    a = np.column_stack([w, ctx]) / y[:, None]
    knots = np.array(DECODE_KNOTS, dtype=float)
    lower = np.concatenate([np.maximum(lb["decode.batch_s(1)"], knots * lb["decode.per_seq_s"]),
                            np.full(ctx.shape[1], lb["decode.per_context_token_s"])])
    sol = lsq_linear(a, np.ones(len(y)), bounds=(lower, np.full(len(lower), np.inf)), method="bvls")
    x = [float(v) for v in sol.x]
    return x[: len(knots)], x[len(knots):]


def fit_decode(points: list[DecodePoint], arch: ModelArch, gpu: GPU, tp: int) -> DecodeCost:
    """Fit the knotted :class:`DecodeCost` to the points, like :func:`fit_prefill`: the context-free step time
    and the time per context token, each at the :data:`DECODE_KNOTS` batch sizes.

    The context slope is per batch knot because aiconfigurator's decode attention (its ``generation_attention``
    table, vLLM's flash-attention decode kernel measured per batch size) reads KV at an efficiency that depends
    on the batch; one slope for every batch, fitted over the whole grid, was up to 9 % off aiconfigurator's own
    step time for Llama-3.1-8B on A100 at batch 16-24 and 8-16k contexts (+5.3 % at batch 18 x 10k tokens).
    ``per_context_token_s`` keeps the one-slope fit's value: the simple form's slope, read only where the knots
    are dropped (a calibration that fits ``decode.fixed_s`` or ``decode.per_seq_s`` on traces)."""
    lb = _bounds(arch, gpu, tp)
    t, ctx = _fit_decode_columns(points, arch, gpu, tp, per_knot_context=True)
    _, one = _fit_decode_columns(points, arch, gpu, tp, per_knot_context=False)
    knots = DECODE_KNOTS
    slope = max((t[-1] - t[-2]) / (knots[-1] - knots[-2]), lb["decode.per_seq_s"])
    return DecodeCost(per_seq_s=slope, per_context_token_s=one[0], batch_knots=knots, batch_knots_s=tuple(t),
                      context_knots_s=tuple(ctx))


def _hbm_shares(dc: DecodeCost, arch: ModelArch, gpu: GPU, tp: int) -> dict[str, float]:
    """The HBM bandwidth each fitted context slope implies (KV bytes per token per rank / slope / bandwidth): a
    physically possible fit stays at or below 1 (:mod:`kvplan.models.bounds` enforces it)."""
    from kvplan.models.bounds import context_bytes_per_token_per_rank

    kv = context_bytes_per_token_per_rank(arch, tp) / gpu.hbm_bandwidth_bytes_per_s
    out = {f"batch {b}": round(kv / c, 4) for b, c in zip(dc.batch_knots, dc.context_knots_s, strict=True)}
    return out | {"one slope": round(kv / dc.per_context_token_s, 4)}


def _errors(pred: Iterable[float], obs: Iterable[float]) -> list[float]:
    return [round(p / o - 1.0, 5) for p, o in zip(pred, obs, strict=True)]


@dataclass(frozen=True)
class Derived:
    """A derived prior and its grid."""

    profile: Profile
    prefill: list[PrefillPoint]
    decode: list[DecodePoint]


def derive_prior(arch: ModelArch, gpu: GPU, tp: int, model_path: str | None = None) -> Derived:
    """Query aiconfigurator for ``arch`` on ``gpu`` at TP ``tp`` and fit the prior profile (needs the extra)."""
    from kvplan.models.costs import decode_step_time_s, prefill_gpu_step_s
    from kvplan.models.hardware import gpu_key

    version = require_aic()
    check_tp(arch, tp)
    path = model_path or AIC_MODEL_PATHS.get(arch.name)
    if path is None:
        raise input_error("--model", f"no aiconfigurator model is known for '{arch.name}'",
                          f"give --model-config DIR (a Hugging Face config.json) or one of {', '.join(AIC_MODEL_PATHS)}")
    if not gpu.aic_system:
        raise input_error("--gpu", f"no aiconfigurator kernel data for {gpu.name}",
                          f"use one of {', '.join(sorted(AIC_VLLM_VERSION))}")
    sess = AicSession(gpu.aic_system, path, tp, moe=arch.params_active < 0.5 * arch.params_total)
    pre = [PrefillPoint(b, p, c, sess.prefill_ms(b, p, c)) for b, p, c in prefill_grid(arch.max_model_len)]
    dec = [DecodePoint(b, x, sess.decode_ms(b, x)) for b, x in decode_grid(arch.max_model_len)]
    pc = fit_prefill(pre, arch, gpu, tp)
    dc = fit_decode(dec, arch, gpu, tp)
    pe = _errors([prefill_gpu_step_s(pc, p.new_tokens, p.pairs, p.batch * (p.prompt - p.cached) * p.cached) * 1e3
                  for p in pre], [p.ms for p in pre])
    de = _errors([decode_step_time_s(dc, p.batch, p.batch * p.context, gpu_only=True) * 1e3 for p in dec],
                 [p.ms for p in dec])
    key = gpu_key(gpu)
    fit_report = {
        "method": "scipy.optimize.lsq_linear (bvls), relative residuals, lower bounds = physical bounds (models/bounds.py)",
        "prefill_max_abs_rel_error": round(max(abs(e) for e in pe), 5),
        "prefill_rms_rel_error": round(math.sqrt(float(np.mean(np.square(pe)))), 5),
        "decode_max_abs_rel_error": round(max(abs(e) for e in de), 5),
        "decode_rms_rel_error": round(math.sqrt(float(np.mean(np.square(de)))), 5),
        "decode_context_hbm_share": _hbm_shares(dc, arch, gpu, tp),
        "prefill_points": [{"batch": p.batch, "prompt": p.prompt, "cached": p.cached, "aic_ms": round(p.ms, 5),
                            "rel_error": e} for p, e in zip(pre, pe, strict=True)],
        "decode_points": [{"batch": p.batch, "context": p.context, "aic_ms": round(p.ms, 5), "rel_error": e}
                          for p, e in zip(dec, de, strict=True)],
    }
    provenance = {
        "kind": "kernel-derived prior",
        "package": f"{AIC_PACKAGE}=={version}",
        "database": {"system": gpu.aic_system, "framework": "vllm", "version": sess.version},
        "mode": sess.mode,
        "model_path": path if model_path is None else "local --model-config directory",
        "silicon_share_8k_prefill": round(sess.silicon_share(), 4),
        "queries": "static_ctx (batch, isl=prompt, prefix=cached, osl=1); static_gen (batch, isl=context, osl=2)",
    }
    from kvplan.models.arch import MODEL_PRESETS

    if arch.name not in MODEL_PRESETS:  # an architecture read from --model-config: keep it with the prior
        provenance["architecture"] = arch.model_dump(mode="json")
    prof = Profile(
        name=prior_name(arch.name, key, tp),
        model=arch.name,
        hardware=key,
        tensor_parallel_size=tp,
        costs=CostModel(prefill=pc, decode=dc),
        fit_report=fit_report,
        provenance=provenance,
        status="prior",
        component_status={
            "prefill.gpu": f"kernel-derived (aiconfigurator vLLM {sess.version} {gpu.aic_system} TP{tp})",
            "decode.gpu": f"kernel-derived (aiconfigurator vLLM {sess.version} {gpu.aic_system} TP{tp})",
            "prefill.overhead_s": "assumed 0 (engine CPU overhead is not in kernel data)",
            "decode.overhead_s": "assumed 0 (engine CPU overhead is not in kernel data)",
            "transfer": "not part of a compute prior",
            "overhead": "not part of a compute prior",
        },
        notes=[f"KERNEL-DERIVED prior: {arch.name} on {gpu.name} TP{tp} from aiconfigurator-core {version} "
               f"(vLLM {sess.version} kernels); GPU time only"],
    )
    return Derived(prof, pre, dec)


def priors_dir() -> Path:
    """Where the shipped priors live (package data ``kvplan/models/priors``)."""
    return Path(str(resources.files("kvplan.models").joinpath("priors")))
