"""GPUs, nodes and links as data (pure; sources in ``../shared/VLLM_BEHAVIOUR.md`` section 4)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kvplan.models.presets import resolve_preset

GB = 1e9
GIB = 1024**3
GBIT_BYTES = 1e9 / 8


class GPU(BaseModel):
    """One accelerator: memory and dense tensor peak."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="GPU name.")
    hbm_bytes: float = Field(gt=0, description="HBM capacity in bytes.")
    hbm_bandwidth_bytes_per_s: float = Field(gt=0, description="HBM bandwidth.")
    bf16_dense_flops: float = Field(gt=0, description="Dense BF16 tensor peak, FLOP/s.")
    fp8_dense_flops: float = Field(gt=0, description="Dense FP8 tensor peak, FLOP/s.")


class Link(BaseModel):
    """A P<->D network path as seen by one TP rank (each rank reads from its peer rank in parallel)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Link name.")
    bandwidth_bytes_per_s_per_rank: float = Field(gt=0, description="Line rate available to one GPU.")
    description: str = Field(default="", description="Where the number comes from.")


class Node(BaseModel):
    """A server: GPUs plus its network to other nodes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Instance type name.")
    gpu: GPU = Field(description="The GPU model.")
    gpus_per_node: int = Field(gt=0, description="GPUs in one node.")
    link: Link = Field(description="Inter-node KV-transfer path per GPU.")
    usd_per_hour: float = Field(default=0.0, ge=0, description="On-demand price, for cost per turn.")
    activation_reserve_bytes_per_gpu: float = Field(
        default=4 * GIB, ge=0, description="HBM kept for activations, CUDA graphs and NCCL buffers."
    )
    host_memory_gib: float = Field(default=0.0, ge=0, description="Host DRAM of the instance (GiB).")
    host_kv_gib: float = Field(default=0.0, ge=0, description="Host DRAM an offload tier may use for KV (GiB).")
    host_to_nic_gbps: float = Field(
        default=0.0, ge=0, description="Host DRAM -> network bandwidth of the instance for KV reads (Gb/s)."
    )


H200 = GPU(
    name="H200-SXM-141GB",
    hbm_bytes=141 * GB,
    hbm_bandwidth_bytes_per_s=4.8e12,
    bf16_dense_flops=989.4e12,
    fp8_dense_flops=1978.9e12,
)
H100 = GPU(
    name="H100-SXM-80GB",
    hbm_bytes=80 * GB,
    hbm_bandwidth_bytes_per_s=3.35e12,
    bf16_dense_flops=989.4e12,
    fp8_dense_flops=1978.9e12,
)

EFA_P5EN = Link(
    name="efa-v3-p5en",
    # 16 x 200 Gb/s EFAv3 per node = 2 NICs = 400 Gb/s = 50 GB/s per GPU (torchx PR #995; AWS).
    bandwidth_bytes_per_s_per_rank=16 * 200 * GBIT_BYTES / 8,
    description="p5en: 16x200 Gb/s EFAv3, ~50 GB/s per GPU, LIBFABRIC backend",
)
EFA_P5 = Link(
    name="efa-p5",
    # 32 x 100 Gb/s EFA per node = 4 NICs per GPU = 50 GB/s per GPU.
    bandwidth_bytes_per_s_per_rank=32 * 100 * GBIT_BYTES / 8,
    description="p5: 32x100 Gb/s EFA, ~50 GB/s per GPU",
)
TCP_FALLBACK = Link(
    name="tcp",
    # UCX on EFA silently falling back to TCP moves about 0.3 GB/s (vllm #41814, nixl #909).
    bandwidth_bytes_per_s_per_rank=0.3 * GB,
    description="plain TCP / UCX fallback, ~0.3 GB/s per rank, for comparison",
)

# Host tier of the offload policy (sim/retention_policy.py):
# - host memory: p5en.48xlarge and p5.48xlarge have 2 TiB of RAM (dstack PR #4110: mem=2048 GB;
#   VLLM_BEHAVIOUR.md 4; AWS instance pages list 2 TiB for both).
# - KV share: ASSUMPTION, half of it (the rest for the OS, the engine processes, model loading and pinned
#   staging buffers); error: the usable share is deployment-specific, plausibly 25-75%.
# - host -> NIC: ASSUMPTION, 1,600 Gb/s (200 GB/s, 25 GB/s per GPU), half the 3,200 Gb/s EFA line rate,
#   because NIC reads of host DRAM cross the CPU root complexes instead of the GPU-adjacent PCIe switches
#   (GPUDirect RDMA path); bounded above by the line rate and by 2 sockets x 8 DDR5-4800 channels
#   (~614 GB/s peak); not measured, plausible range 100-400 GB/s.
HOST_MEMORY_GIB = 2048.0
HOST_KV_GIB = HOST_MEMORY_GIB / 2
HOST_TO_NIC_GBPS = 1600.0

P5EN = Node(name="p5en", gpu=H200, gpus_per_node=8, link=EFA_P5EN, usd_per_hour=63.30, host_memory_gib=HOST_MEMORY_GIB,
            host_kv_gib=HOST_KV_GIB, host_to_nic_gbps=HOST_TO_NIC_GBPS)
P5 = Node(name="p5", gpu=H100, gpus_per_node=8, link=EFA_P5, usd_per_hour=55.04, host_memory_gib=HOST_MEMORY_GIB,
          host_kv_gib=HOST_KV_GIB, host_to_nic_gbps=HOST_TO_NIC_GBPS)
P5EN_TCP = Node(name="p5en-tcp", gpu=H200, gpus_per_node=8, link=TCP_FALLBACK, usd_per_hour=63.30,
                host_memory_gib=HOST_MEMORY_GIB, host_kv_gib=HOST_KV_GIB, host_to_nic_gbps=HOST_TO_NIC_GBPS)

HARDWARE_PRESETS: dict[str, Node] = {n.name: n for n in (P5EN, P5, P5EN_TCP)}
LINK_PRESETS: dict[str, Link] = {lk.name: lk for lk in (EFA_P5EN, EFA_P5, TCP_FALLBACK)}


def get_hardware(name_or_spec: str | dict[str, object] | Node) -> Node:
    """Resolve a hardware preset name (``p5en``, ``p5``, ``p5en-tcp``) or validate an inline node."""
    return resolve_preset(name_or_spec, HARDWARE_PRESETS, Node, "hardware")
