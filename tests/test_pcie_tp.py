"""Prefill across TP sizes in the shipped kernel priors (issue g6e12): NVLink GPUs never get slower with more GPUs;
a PCIe-only GPU (L40S, the g6e preset) does, by aiconfigurator's measured all-reduce, and the costs say so."""

from __future__ import annotations

import json

import pytest

from kvplan.models.arch import MODEL_PRESETS, get_model
from kvplan.models.costs import causal_pairs, prefill_gpu_step_s
from kvplan.models.hardware import GPU_PRESETS, get_hardware, gpu_key
from kvplan.models.profile import load_prior
from kvplan.models.resolve import resolve_profile

TPS = (1, 2, 4, 8)
DENSE = ("qwen3-32b", "llama-3.3-70b", "llama-3.1-8b", "qwen3-8b")


def _step_s(model: str, gpu: str, tp: int, tokens: int) -> float | None:
    p = load_prior(model, gpu, tp)
    return None if p is None else prefill_gpu_step_s(p.costs.prefill, tokens, causal_pairs(tokens, 0))


@pytest.mark.parametrize("gpu", sorted({gpu_key(g) for g in GPU_PRESETS.values() if g.nvlink_bytes_per_s > 0}))
@pytest.mark.parametrize("tokens", (3000, 8192, 32768))
def test_nvlink_dense_prefill_does_not_grow_with_tp(gpu: str, tokens: int) -> None:
    for model in DENSE:
        times = [(tp, t) for tp in TPS if (t := _step_s(model, gpu, tp, tokens)) is not None]
        for (a, ta), (b, tb) in zip(times, times[1:], strict=False):
            assert tb <= ta, f"{model} on {gpu}: {tokens}-token prefill {ta:.3f} s at TP{a} < {tb:.3f} s at TP{b}"


def test_l40s_tp_growth_is_the_measured_all_reduce() -> None:
    """The L40S growth is bounded by aiconfigurator's all-reduce table (vLLM custom_allreduce_perf, vllm_graph rows,
    systems/data/l40s/comm/vllm/0.22.0 = 0.14.0): Qwen3-32B's 3000-token prefill does 64 layers x 2 + 1 all-reduces of
    3000 x 5120 bf16 elements, 1.63 / 12.43 / 27.65 ms each at TP2/4/8 (~19 / 3.7 / 1.9 GB/s bus bandwidth).
    The prior minus that all-reduce time must be no slower than TP1's GEMMs split over TP (the rest scales)."""
    ar_ms = {2: 1.63, 4: 12.43, 8: 27.65}
    one = _step_s("qwen3-32b", "l40s", 1, 3000)
    assert one is not None
    for tp, ms in ar_ms.items():
        t = _step_s("qwen3-32b", "l40s", tp, 3000)
        assert t is not None
        rest = t - 129 * ms / 1e3
        assert 0 < rest <= one / tp * 1.6, (tp, t, rest, one)  # GEMM efficiency drops as TP shrinks the shapes
    tp2, tp8 = _step_s("qwen3-32b", "l40s", 2, 3000), _step_s("qwen3-32b", "l40s", 8, 3000)
    assert tp2 is not None and tp8 is not None and tp8 > 5 * tp2  # as reported: 0.68 s at TP2, 3.73 s at TP8


def test_pcie_prefill_growth_is_stated_where_costs_are_shown() -> None:
    arch = get_model("qwen3-32b")
    for tp, expect in ((1, False), (2, False), (4, True), (8, True)):
        prof, notes = resolve_profile(arch, get_hardware("g6e"), tp, None)
        status = prof.component_status["prefill.gpu"]
        assert ("PCIe only" in status) is expect, status
        assert any("PCIe only" in n for n in notes) is expect
        assert "PCIe only" not in prof.component_status["decode.gpu"]
    status = resolve_profile(arch, get_hardware("g6e"), 8, None)[0].component_status["prefill.gpu"]
    assert "10.16 s at TP8 vs 2.13 s at TP2" in status
    for hw in ("p5en", "p5"):  # NVLink: never
        prof, notes = resolve_profile(MODEL_PRESETS["llama-3.3-70b"], get_hardware(hw), 4, None)
        assert "PCIe only" not in json.dumps(prof.component_status) and not any("PCIe only" in n for n in notes)
