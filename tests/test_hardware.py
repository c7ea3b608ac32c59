"""Hardware as data: every GPU and AWS instance preset, the -tcp twins, and their units."""

from __future__ import annotations

import pytest

from kvplan.errors import KvplanInputError
from kvplan.models.hardware import GPU_PRESETS, HARDWARE_PRESETS, get_gpu, get_hardware

INSTANCES = ("p4d", "p4de", "p5", "p5e", "p5en", "p6-b200", "g6e")


def test_every_instance_has_a_tcp_twin_and_a_per_rank_line_rate() -> None:
    for name in INSTANCES:
        node = get_hardware(name)
        twin = get_hardware(f"{name}-tcp")
        assert twin.gpu == node.gpu and twin.link.bandwidth_bytes_per_s_per_rank == pytest.approx(0.3e9)
        assert node.link.bandwidth_bytes_per_s_per_rank == pytest.approx(
            node.nics * node.nic_gbps * 1e9 / 8 / node.gpus_per_node
        )
        assert node.source and node.gpu.source
    assert get_hardware("p5en").link.bandwidth_bytes_per_s_per_rank == pytest.approx(50e9)
    assert get_hardware("p4d").link.bandwidth_bytes_per_s_per_rank == pytest.approx(6.25e9)
    assert not get_hardware("g6e").gpudirect_rdma and get_hardware("p5en").gpudirect_rdma
    assert set(HARDWARE_PRESETS) >= set(INSTANCES) | {"p5en-tcp"}


def test_gpu_table_and_aliases() -> None:
    assert {"a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm", "h200", "b200", "l40s"} <= set(GPU_PRESETS)
    assert get_gpu("h100").name == get_gpu("h100_sxm").name == "H100-SXM-80GB"
    assert get_gpu("a100-sxm-40gb").peak_flops("fp8") == get_gpu("a100-sxm-40gb").bf16_dense_flops  # no FP8 cores
    assert get_gpu("h200").peak_flops("fp8") == pytest.approx(2 * get_gpu("h200").peak_flops("bf16"), rel=1e-3)
    for g in GPU_PRESETS.values():
        # dense BF16 peaks per datasheet lie between 300 TFLOP/s (A100) and 2.5 PFLOP/s (B200)
        assert 3e14 < g.bf16_dense_flops < 2.5e15 and g.hbm_bandwidth_bytes_per_s > 8e11


def test_unknown_hardware_and_gpu_name_the_field() -> None:
    with pytest.raises(KvplanInputError, match="unknown hardware 'p9'"):
        get_hardware("p9")
    with pytest.raises(KvplanInputError, match="unknown gpu 'tpu-v5'"):
        get_gpu("tpu-v5")
