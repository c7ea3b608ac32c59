"""Corrections stay where they were measured (issue 19, item 2): a calibration's prefill GPU corrections apply
only to its own model, GPU and TP; elsewhere kvplan's costs keep the kernel priors' H100/H200 and TP1/TP8 ratios."""

from __future__ import annotations

import json

import pytest

from kvplan.app.cli import main
from kvplan.models.arch import MODEL_PRESETS
from kvplan.models.costs import decode_step_time_s, prefill_time_s
from kvplan.models.hardware import HARDWARE_PRESETS, gpu_key
from kvplan.models.profile import load_prior, load_profile, shipped_profiles
from kvplan.models.resolve import resolve_profile, scaled_prefill

RATIO_TOL = 0.10
PREFILL_TOKENS = (2000, 8000, 16000)
DECODE_POINTS = ((1, 2000), (32, 4000), (128, 8000))
HW = {"h100": "p5", "h200": "p5en"}
#: (model, GPU preset key) of every shipped calibration: where measured prefill corrections live
CALIBRATED = {(load_profile(n).model, gpu_key(HARDWARE_PRESETS[load_profile(n).hardware].gpu)) for n in shipped_profiles()}


def _costs(model: str, hw: str, tp: int) -> tuple[list[float], list[float], list[float], list[float]]:
    """kvplan's and the kernel prior's prefill and decode times at the test points."""
    node = HARDWARE_PRESETS[hw]
    prof, _ = resolve_profile(MODEL_PRESETS[model], node, tp, None)
    prior = load_prior(model, gpu_key(node.gpu), tp)
    assert prior is not None, f"no kernel prior for {model} on {hw} TP{tp}"
    kp = [prefill_time_s(prof.costs.prefill, n, 0, 8192) for n in PREFILL_TOKENS]
    pp = [prefill_time_s(prior.costs.prefill, n, 0, 8192) for n in PREFILL_TOKENS]
    kd = [decode_step_time_s(prof.costs.decode, b, b * c) for b, c in DECODE_POINTS]
    pd_ = [decode_step_time_s(prior.costs.decode, b, b * c) for b, c in DECODE_POINTS]
    return kp, pp, kd, pd_


def _pairs() -> list[tuple[str, tuple[str, int], tuple[str, int]]]:
    out = []
    for m in MODEL_PRESETS:
        if load_prior(m, "h100-sxm", 1) is None:
            continue
        for tp in (1, 8):
            out.append((m, ("p5", tp), ("p5en", tp)))  # H100 vs H200
        for hw in HW.values():
            out.append((m, (hw, 1), (hw, 8)))  # TP1 vs TP8
    return out


def _measured_here(model: str, a: tuple[str, int], b: tuple[str, int]) -> bool:
    """True when a calibration's own GPU is one side of a cross-GPU pair (its measured correction moves the ratio)."""
    gpus = {gpu_key(HARDWARE_PRESETS[x[0]].gpu) for x in (a, b)}
    return len(gpus) == 2 and any((model, g) in CALIBRATED for g in gpus)


@pytest.mark.parametrize(("model", "a", "b"), _pairs(), ids=lambda v: str(v))
def test_ratios_follow_the_kernel_priors(model: str, a: tuple[str, int], b: tuple[str, int]) -> None:
    ka, pa, kda, pda = _costs(model, *a)
    kb, pb, kdb, pdb = _costs(model, *b)
    if not _measured_here(model, a, b):  # TP pairs always; GPU pairs unless one side carries a measured correction
        for i, n in enumerate(PREFILL_TOKENS):
            kr, pr = ka[i] / kb[i], pa[i] / pb[i]
            assert kr == pytest.approx(pr, rel=RATIO_TOL), f"prefill {n}: {a}/{b} {kr:.3f} vs kernels {pr:.3f}"
    for i in range(len(DECODE_POINTS)):  # decode: no shipped calibration corrects it, every pair follows the kernels
        kr, pr = kda[i] / kdb[i], pda[i] / pdb[i]
        assert kr == pytest.approx(pr, rel=RATIO_TOL), f"decode {DECODE_POINTS[i]}: {a}/{b} {kr:.3f} vs {pr:.3f}"


@pytest.mark.parametrize("name", shipped_profiles())
def test_a_calibration_keeps_its_own_corrections(name: str) -> None:
    cal = load_profile(name)
    sc = cal.provenance["prefill_gpu_scales"]
    status = cal.component_status["prefill.gpu"]
    assert f"linear x {sc['linear']:.3f}" in status and f"attention x {sc['attention']:.3f}" in status
    arch, node = MODEL_PRESETS[cal.model], HARDWARE_PRESETS[cal.hardware]
    # another TP on its GPU: the kernel prior of that TP with the same corrections, said so
    tp1, _ = resolve_profile(arch, node, 1, None)
    prior1 = load_prior(cal.model, gpu_key(node.gpu), 1)
    assert prior1 is not None
    want = scaled_prefill(prior1.costs.prefill, sc["linear"], sc["attention"], arch, node, 1).model_copy(
        update={"overhead_s": cal.costs.prefill.overhead_s})  # the engine CPU overhead is borrowed as a residual
    for n in PREFILL_TOKENS:
        assert prefill_time_s(tp1.costs.prefill, n, 0, 8192) == pytest.approx(prefill_time_s(want, n, 0, 8192))
    assert f"borrowed from {name}" in tp1.component_status["prefill.gpu"] and "TP8 -> TP1" in tp1.component_status[
        "prefill.gpu"]
    # another GPU, same model and TP: the kernel prior alone, and the status names whose correction was not taken
    other = HARDWARE_PRESETS["p5" if cal.hardware != "p5" else "p5en"]
    h100, _ = resolve_profile(arch, other, cal.tensor_parallel_size, None)
    prior = load_prior(cal.model, gpu_key(other.gpu), cal.tensor_parallel_size)
    assert prior is not None
    for n in PREFILL_TOKENS:
        assert prefill_time_s(h100.costs.prefill, n, 0, 8192) == pytest.approx(
            prefill_time_s(prior.costs.prefill, n, 0, 8192), rel=0.02)
    assert "no calibration correction" in h100.component_status["prefill.gpu"]
    assert name in h100.component_status["prefill.gpu"]


def _cost_json(capsys: pytest.CaptureFixture[str], hw: str) -> dict[str, object]:
    assert main(["cost", "--model", "llama-3.1-8b", "--hardware", hw, "--tp", "1", "--tokens", "8000", "--json"]) == 0
    out: dict[str, object] = json.loads(capsys.readouterr().out)
    return out


def test_cost_llama_8b_p5en_tp1_is_the_kernel_prior(capsys: pytest.CaptureFixture[str]) -> None:
    prior = load_prior("llama-3.1-8b", "h200", 1)
    assert prior is not None
    out = _cost_json(capsys, "p5en")
    want = prefill_time_s(prior.costs.prefill, 8000, 0, 8192)
    assert float(out["prefill_s"]) == pytest.approx(want, rel=RATIO_TOL)  # type: ignore[arg-type]
    comps = out["components"]
    assert isinstance(comps, dict) and "no calibration correction" in comps["prefill.gpu"]
    assert "not model compute" in comps["overhead"]  # what is borrowed, and that it is not compute
    p5 = _cost_json(capsys, "p5")
    h100 = load_prior("llama-3.1-8b", "h100-sxm", 1)
    assert h100 is not None
    kernel = prefill_time_s(h100.costs.prefill, 8000, 0, 8192) / want
    assert float(p5["prefill_s"]) / float(out["prefill_s"]) == pytest.approx(kernel, rel=RATIO_TOL)  # type: ignore[arg-type]
