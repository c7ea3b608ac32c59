"""``kvplan simulate --help`` names the vLLM knob and unit behind each policy field an operator copies into vLLM
(helper new15: 'Pull only if >= this many.' named neither kv_recompute_threshold nor tokens, and the TTL's line named
no vLLM knob)."""

from __future__ import annotations

import pytest

from kvplan.app.cli import main


def test_policy_fields_name_their_vllm_knob_and_unit(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", "--help"]) == 0
    lines = {ln.split(" = ")[0].strip(): ln for ln in capsys.readouterr().out.splitlines() if " = " in ln}
    assert "vLLM's decoder_kv_blocks_ttl, s:" in lines["policy.decoder_kv_blocks_ttl_s"]
    assert "vLLM's kv_recompute_threshold, tokens:" in lines["policy.kv_recompute_threshold_tokens"]
    assert "hard-codes 450 s" in lines["policy.router_ttl_s"]
    assert "vLLM's kv_load_failure_policy" in lines["policy.kv_load_failure_policy"]


def test_model_and_hardware_list_their_presets(capsys: pytest.CaptureFixture[str]) -> None:
    """'Model preset name or inline spec.' named no preset: a newcomer found them only by a failing run."""
    from kvplan.models.arch import MODEL_PRESETS

    assert main(["simulate", "--help"]) == 0
    lines = {ln.split(" = ")[0].strip(): ln for ln in capsys.readouterr().out.splitlines() if " = " in ln}
    assert all(name in lines["model"] for name in MODEL_PRESETS)
    assert "p5: 8x H100-SXM-80GB" in lines["hardware"] and "p5en: 8x H200-SXM-141GB" in lines["hardware"]
