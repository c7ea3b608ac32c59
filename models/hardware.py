"""GPUs, nodes and links as data, each number with its source (pure).

GPU figures are NVIDIA datasheet values (dense tensor peaks, i.e. without 2:4 sparsity); instance
figures are AWS's instance-type pages (``aws.amazon.com/ec2/instance-types/<family>``) and the sources in
``../shared/VLLM_BEHAVIOUR.md`` section 4. ``aic_system`` names the aiconfigurator-core perf database of
the GPU (``systems/data/<aic_system>``), so kernel-derived priors can be looked up by GPU.

A node's link is what one TP rank sees: the instance's EFA line rate divided over its GPUs (NIXL's
LIBFABRIC backend maps each GPU to its nearest NICs and every rank reads from its peer rank in
parallel). Every instance has a ``<name>-tcp`` twin whose link is the UCX/TCP fallback (~0.3 GB/s per
rank, vllm #41814, nixl #909), for comparison.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from kvplan.errors import KvplanInputError, input_error
from kvplan.models.presets import resolve_preset

GB = 1e9
GIB = 1024**3
GBIT_BYTES = 1e9 / 8
TFLOPS = 1e12


class GPU(BaseModel):
    """One accelerator: memory, bandwidths and dense tensor peaks."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="GPU name.")
    hbm_bytes: float = Field(gt=0, description="HBM capacity in bytes (datasheet).")
    torch_total_memory_bytes: float = Field(
        default=0.0, ge=0, description="Device memory torch/the driver reports (vLLM's total_memory; 0 = hbm_bytes)."
    )
    torch_total_memory_source: str = Field(default="", description="Where torch_total_memory_bytes comes from.")
    hbm_bandwidth_bytes_per_s: float = Field(gt=0, description="HBM bandwidth.")
    bf16_dense_flops: float = Field(gt=0, description="Dense BF16 tensor peak, FLOP/s.")
    fp8_dense_flops: float = Field(default=0.0, ge=0, description="Dense FP8 tensor peak, FLOP/s (0: no FP8 cores).")
    nvlink_bytes_per_s: float = Field(
        default=0.0, ge=0, description="NVLink bandwidth per GPU, both directions (0: PCIe only)."
    )
    aic_system: str = Field(default="", description="aiconfigurator-core system name of this GPU ('' = none).")
    source: str = Field(default="", description="Where the numbers come from.")

    def peak_flops(self, dtype: str) -> float:
        """Dense tensor peak for GEMM dtype ``bf16`` or ``fp8`` (FP8 falls back to BF16 on GPUs without FP8)."""
        if dtype == "fp8" and self.fp8_dense_flops > 0:
            return self.fp8_dense_flops
        return self.bf16_dense_flops


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
    efa_generation: str = Field(default="", description="EFA generation (v1, v2, v3, v4; '' = none or unknown).")
    nics: int = Field(default=0, ge=0, description="Network devices per node.")
    nic_gbps: float = Field(default=0.0, ge=0, description="Line rate of one network device, Gb/s.")
    gpudirect_rdma: bool = Field(default=False, description="NIC reads/writes GPU memory directly (GPUDirect RDMA).")
    usd_per_hour: float | None = Field(default=None, ge=0, description="On-demand price per node-hour (None: unknown).")
    source: str = Field(default="", description="Where the numbers come from.")
    host_memory_gib: float = Field(default=0.0, ge=0, description="Host DRAM of the instance (GiB).")
    host_kv_gib: float = Field(default=0.0, ge=0, description="Host DRAM an offload tier may use for KV (GiB).")
    host_to_nic_gbps: float = Field(
        default=0.0, ge=0, description="Host DRAM -> network bandwidth of the instance for KV reads (Gb/s)."
    )


# --- GPUs ----------------------------------------------------------------------------------------------------

A100_40 = GPU(
    name="A100-SXM4-40GB", torch_total_memory_bytes=39.50 * GIB,
    torch_total_memory_source=(
        "torch OOM message 'GPU 0 has a total capacity of 39.50 GiB' on an A100 40 GB "
        "(TianheWu/CoSeR issue #10)"
    ),
    hbm_bytes=40 * GB, hbm_bandwidth_bytes_per_s=1.555e12, bf16_dense_flops=312 * TFLOPS,
    fp8_dense_flops=0.0, nvlink_bytes_per_s=600 * GB, aic_system="a100_sxm",
    source="NVIDIA A100 datasheet: 40 GB HBM2 1,555 GB/s, BF16 312 TFLOP/s dense, no FP8, NVLink3 600 GB/s",
)
A100_80 = GPU(
    name="A100-SXM4-80GB", torch_total_memory_bytes=79.25 * GIB,
    torch_total_memory_source=(
        "torch '79.25 GiB total capacity' on an A100 80 GB (levihsu/OOTDiffusion issue #235); "
        "79.28 +- 0.04 GiB solved from two vLLM 0.10.1.1 A100-80GB logs at gpu_memory_utilization"
        " 0.25 and 0.5 (dennislee22/vLLM-benchmarking log/vllm-7B-1gpuA10080GB-0.25GRAM.log, "
        "-0.5GRAM.log)"
    ),
    hbm_bytes=80 * GB, hbm_bandwidth_bytes_per_s=2.039e12, bf16_dense_flops=312 * TFLOPS,
    fp8_dense_flops=0.0, nvlink_bytes_per_s=600 * GB, aic_system="a100_sxm",
    source="NVIDIA A100 datasheet: 80 GB HBM2e 2,039 GB/s, BF16 312 TFLOP/s dense, no FP8, NVLink3 600 GB/s",
)
H100 = GPU(
    name="H100-SXM-80GB", torch_total_memory_bytes=79.18 * GIB,
    torch_total_memory_source=(
        "vLLM 'Free memory on device: 78.57/79.18 GiB' on H100 80 GB (llm-d/llm-d-benchmark "
        "config_explorer/empirical-vllm-memory-results.md)"
    ),
    hbm_bytes=80 * GB, hbm_bandwidth_bytes_per_s=3.35e12, bf16_dense_flops=989.4 * TFLOPS,
    fp8_dense_flops=1978.9 * TFLOPS, nvlink_bytes_per_s=900 * GB, aic_system="h100_sxm",
    source="NVIDIA H100 datasheet (SXM5): 80 GB HBM3 3.35 TB/s, BF16 989.4 / FP8 1,978.9 TFLOP/s dense, NVLink4 900 GB/s",
)
H200 = GPU(
    name="H200-SXM-141GB", torch_total_memory_bytes=139.81 * GIB,
    torch_total_memory_source=(
        "vLLM 'Free memory on device (139.21/139.81 GiB) on startup' in public H200 start-up logs"
        " (an H200 TP2 Qwen3-Next engine, vLLM 0.10.2)"
    ),
    hbm_bytes=141 * GB, hbm_bandwidth_bytes_per_s=4.8e12, bf16_dense_flops=989.4 * TFLOPS,
    fp8_dense_flops=1978.9 * TFLOPS, nvlink_bytes_per_s=900 * GB, aic_system="h200_sxm",
    source="NVIDIA H200 datasheet: 141 GB HBM3e 4.8 TB/s, GH100 tensor peaks as H100, NVLink4 900 GB/s (VLLM_BEHAVIOUR 4)",
)
B200 = GPU(
    name="B200-SXM-180GB", torch_total_memory_bytes=178.5 * GIB,
    torch_total_memory_source=(
        "[derived] nvidia-smi 183,359 MiB less the ~0.47 GiB the driver keeps on H100 (81,559 MiB"
        " -> 79.18 GiB); not seen in a log"
    ),
    hbm_bytes=180 * GB, hbm_bandwidth_bytes_per_s=7.7e12, bf16_dense_flops=2250 * TFLOPS,
    fp8_dense_flops=4500 * TFLOPS, nvlink_bytes_per_s=1800 * GB, aic_system="b200_sxm",
    source="NVIDIA HGX B200 datasheet: 1,440 GB HBM3e over 8 GPUs (AWS p6-b200: 179 GB usable each), ~7.7 TB/s per GPU,"
    " BF16 2.25 / FP8 4.5 PFLOP/s dense per GPU (half the sparse figures), NVLink5 1.8 TB/s",
)
L40S = GPU(
    name="L40S-48GB", torch_total_memory_bytes=44.40 * GIB,
    torch_total_memory_source=(
        "torch 'GPU 0 has a total capacity of 44.40 GiB' on an L40 (QwenLM/Qwen3-VL issue #2097),"
        " the same 48 GB GDDR6 board (46,068 MiB in nvidia-smi) as the L40S"
    ),
    hbm_bytes=48 * GB, hbm_bandwidth_bytes_per_s=864 * GB, bf16_dense_flops=362.05 * TFLOPS,
    fp8_dense_flops=733 * TFLOPS, nvlink_bytes_per_s=0.0, aic_system="l40s",
    source="NVIDIA L40S datasheet: 48 GB GDDR6 864 GB/s, BF16 362 / FP8 733 TFLOP/s dense, no NVLink (PCIe Gen4 x16)",
)

H800 = GPU(
    name="H800-SXM-80GB", torch_total_memory_bytes=79.18 * GIB,
    torch_total_memory_source=(
        "[assumption] the H100 SXM5's: the same 80 GB HBM3 part (Mooncake's H800 runs report '81GB', "
        "nvidia-smi's 81,559 MiB as on H100)"
    ),
    hbm_bytes=80 * GB, hbm_bandwidth_bytes_per_s=3.35e12, bf16_dense_flops=989.4 * TFLOPS,
    fp8_dense_flops=1978.9 * TFLOPS, nvlink_bytes_per_s=400 * GB, aic_system="h100_sxm",
    source="NVIDIA H800 SXM5 datasheet: the H100 SXM5's GH100 (80 GB HBM3 3.35 TB/s, BF16 989.4 / FP8 1,978.9 TFLOP/s"
    " dense) with NVLink cut to 400 GB/s. aiconfigurator has no H800 system: its kernel priors use the h100_sxm"
    " tables, whose TP all-reduces run at H100's 900 GB/s NVLink (under-estimated here, more so at TP8 and long prompts)",
)

GPU_PRESETS: dict[str, GPU] = {
    "a100-sxm-40gb": A100_40,
    "a100-sxm-80gb": A100_80,
    "h100-sxm": H100,
    "h200": H200,
    "b200": B200,
    "l40s": L40S,
    "h800": H800,
}

#: Other spellings accepted for a GPU preset (aiconfigurator system names included).
GPU_ALIASES: dict[str, str] = {
    "h100": "h100-sxm", "h100_sxm": "h100-sxm", "h200_sxm": "h200", "h200-sxm": "h200", "b200_sxm": "b200",
    "a100": "a100-sxm-80gb", "a100_sxm": "a100-sxm-80gb", "a100-80": "a100-sxm-80gb", "a100-40": "a100-sxm-40gb",
}

# --- links and nodes -------------------------------------------------------------------------------------------

TCP_FALLBACK = Link(
    name="tcp",
    # UCX on EFA silently falling back to TCP moves about 0.3 GB/s (vllm #41814, nixl #909).
    bandwidth_bytes_per_s_per_rank=0.3 * GB,
    description="plain TCP / UCX fallback, ~0.3 GB/s per rank, for comparison",
)

# Host tier of the offload policy (sim/retention_policy.py):
# - host memory: the instance's RAM (AWS instance-type pages: p4d/p4de.24xlarge 1,152 GiB, p5/p5e/p5en.48xlarge
#   and p6-b200.48xlarge 2,048 GiB, g6e.48xlarge 1,536 GiB; p5en also dstack PR #4110: mem=2048 GB).
# - KV share: ASSUMPTION, half of it (the rest for the OS, the engine processes, model loading and pinned
#   staging buffers); error: the usable share is deployment-specific, plausibly 25-75%.
# - host -> NIC: ASSUMPTION, half the node's EFA line rate (p5en: 1,600 Gb/s of 3,200), because NIC reads of
#   host DRAM cross the CPU root complexes instead of the GPU-adjacent PCIe switches (GPUDirect RDMA path);
#   bounded above by the line rate and by DRAM bandwidth (2 sockets x 8 DDR5-4800 channels ~614 GB/s on p5en);
#   not measured, plausible range 100-400 GB/s on p5en.
HOST_KV_SHARE = 0.5
HOST_TO_NIC_SHARE = 0.5
HOST_MEMORY_GIB = {"p4d": 1152.0, "p4de": 1152.0, "p5": 2048.0, "p5e": 2048.0, "p5en": 2048.0, "p6-b200": 2048.0,
                   "g6e": 1536.0}

def _efa_link(name: str, nics: int, gbps: float, gpus: int, gdr: bool) -> Link:
    """The per-rank share of ``nics x gbps`` over ``gpus`` GPUs."""
    per_rank = nics * gbps * GBIT_BYTES / gpus
    how = "GPUDirect RDMA" if gdr else "no GPUDirect RDMA: staged through host memory"
    return Link(
        name=f"efa-{name}",
        bandwidth_bytes_per_s_per_rank=per_rank,
        description=f"{name}: {nics}x{gbps:g} Gb/s EFA, ~{per_rank / GB:.1f} GB/s per GPU, LIBFABRIC backend, {how}",
    )


def _node(
    name: str, gpu: GPU, gpus: int, efa: str, nics: int, gbps: float, gdr: bool, usd: float | None, source: str
) -> Node:
    host = HOST_MEMORY_GIB.get(name, 0.0)
    return Node(
        name=name, gpu=gpu, gpus_per_node=gpus, link=_efa_link(name, nics, gbps, gpus, gdr), efa_generation=efa,
        nics=nics, nic_gbps=gbps, gpudirect_rdma=gdr, usd_per_hour=usd, source=source,
        host_memory_gib=host, host_kv_gib=host * HOST_KV_SHARE, host_to_nic_gbps=nics * gbps * HOST_TO_NIC_SHARE,
    )


_AWS = "AWS EC2 instance-type page"
P4D = _node("p4d", A100_40, 8, "v1", 4, 100, True, None,
            f"{_AWS} (P4): 8x A100 40 GB, 400 Gb/s EFA (4x100), GPUDirect RDMA")
P4DE = _node("p4de", A100_80, 8, "v1", 4, 100, True, None,
             f"{_AWS} (P4): 8x A100 80 GB, 400 Gb/s EFA (4x100), GPUDirect RDMA")
P5 = _node("p5", H100, 8, "v2", 32, 100, True, 55.04,
           f"{_AWS} (P5): 8x H100 80 GB, 3,200 Gb/s EFAv2 (32x100, 4 per GPU), GPUDirect RDMA; VLLM_BEHAVIOUR 4")
P5E = _node("p5e", H200, 8, "v2", 32, 100, True, None,
            f"{_AWS} (P5e): 8x H200 141 GB, 3,200 Gb/s EFAv2 (32x100), GPUDirect RDMA; torchx PR #1098")
P5EN = _node("p5en", H200, 8, "v3", 16, 200, True, 63.30,
             f"{_AWS} (P5en): 8x H200 141 GB, 3,200 Gb/s EFAv3 (16x200, 2 per GPU), GPUDirect RDMA; torchx PR #995;"
             " price dstack PR #4110")
P6_B200 = _node("p6-b200", B200, 8, "v4", 8, 400, True, None,
                f"{_AWS} (P6): 8x B200 (1,440 GB HBM3e), 3,200 Gb/s EFAv4 (8x400), GPUDirect RDMA")
G6E = _node("g6e", L40S, 8, "v1", 4, 100, False, None,
            f"{_AWS} (G6e.48xlarge): 8x L40S 48 GB, 400 Gb/s network with EFA, no GPUDirect RDMA")

#: Mooncake's H800 nodes (kvcache-ai/Mooncake docs/source/performance/vllm/vllm-v1-pd-performance.md): 8x H800 81GB,
#: 8x ConnectX-7 RoCE per node. ConnectX-7 is 400 Gb/s per port (NVIDIA ConnectX-7 datasheet); GPUDirect RDMA.
H800_NODE = Node(
    name="h800", gpu=H800, gpus_per_node=8,
    link=Link(name="roce-h800", bandwidth_bytes_per_s_per_rank=8 * 400 * GBIT_BYTES / 8,
              description="h800: 8x400 Gb/s ConnectX-7 RoCE, ~50.0 GB/s per GPU, GPUDirect RDMA"),
    nics=8, nic_gbps=400, gpudirect_rdma=True,
    source="Mooncake vLLM PD benchmark setup: 8x H800 81GB and 8x ConnectX-7 RoCE per node, GPUDirect RDMA;"
    " host memory not stated (no offload tier)",
)

_EFA_NODES = (P4D, P4DE, P5, P5E, P5EN, P6_B200, G6E, H800_NODE)


def _tcp_twin(node: Node) -> Node:
    return node.model_copy(update={"name": f"{node.name}-tcp", "link": TCP_FALLBACK,
                                   "source": node.source + "; link replaced by the UCX/TCP fallback"})


#: The three original presets first (UI defaults), then the rest, then their -tcp twins.
HARDWARE_PRESETS: dict[str, Node] = {"p5en": P5EN, "p5": P5, "p5en-tcp": _tcp_twin(P5EN)} | {
    n.name: n for n in _EFA_NODES} | {f"{n.name}-tcp": _tcp_twin(n) for n in _EFA_NODES}
P5EN_TCP = HARDWARE_PRESETS["p5en-tcp"]
EFA_P5EN = P5EN.link
EFA_P5 = P5.link
LINK_PRESETS: dict[str, Link] = {n.link.name: n.link for n in _EFA_NODES} | {
    "efa-v3-p5en": EFA_P5EN,  # the name before the hardware table
    TCP_FALLBACK.name: TCP_FALLBACK,
}


def gpu_named(name: str) -> GPU | None:
    """The GPU preset ``name`` names (a preset key, an alias such as ``h100``, or a GPU's own name), else None."""
    key = name.strip().lower()
    key = GPU_ALIASES.get(key, key)
    if key in GPU_PRESETS:
        return GPU_PRESETS[key]
    return next((g for g in GPU_PRESETS.values() if g.name.lower() == key), None)


def _one_of(items: list[str]) -> str:
    """``a``, ``a or b``, ``one of a, b or c``."""
    if len(items) < 3:
        return " or ".join(items)
    return f"one of {', '.join(items[:-1])} or {items[-1]}"


def _instance_label(node: Node) -> str:
    """``p5 (8x H100-SXM-80GB, 3,200 Gb/s EFA)``: what a hardware preset is, for an error naming the choices."""
    net = "UCX/TCP fallback" if node.link.name == TCP_FALLBACK.name else (
        f"{node.nics * node.nic_gbps:,.0f} Gb/s {'EFA' if node.efa_generation else 'RDMA'}" if node.nics else "")
    return f"{node.name} ({node.gpus_per_node}x {node.gpu.name}{', ' + net if net else ''})"


def unknown_hardware_error(name: str) -> KvplanInputError:
    """The error for a hardware name that is no preset: it names each preset's GPUs, and when ``name`` is a GPU
    (``h100``, ``H200``: what a newcomer types for "two H100 nodes") the instances built on it."""
    gpu = gpu_named(name)
    if gpu is not None:
        nodes = [n for n in HARDWARE_PRESETS.values() if n.gpu.name == gpu.name]
        return input_error(
            "hardware", f"'{name}' is a GPU ({gpu.name}), and hardware names an instance (its GPUs per node and the "
            "network P and D transfer KV over)",
            f"use {_one_of([_instance_label(n) for n in nodes])}, or an inline spec")
    return input_error("hardware", f"unknown hardware '{name}'",
                       f"use {_one_of([_instance_label(n) for n in HARDWARE_PRESETS.values()])} or an inline spec")


def get_hardware(name_or_spec: str | dict[str, object] | Node) -> Node:
    """Resolve a hardware preset name (``p5en``, ``p5``, ``p5en-tcp``, ...) or validate an inline node."""
    if isinstance(name_or_spec, str) and name_or_spec not in HARDWARE_PRESETS:
        raise unknown_hardware_error(name_or_spec)
    return resolve_preset(name_or_spec, HARDWARE_PRESETS, Node, "hardware")


def get_gpu(name_or_spec: str | dict[str, object] | GPU) -> GPU:
    """Resolve a GPU preset name (``h100-sxm``, ``h200``, ...) or validate an inline GPU."""
    if isinstance(name_or_spec, str):
        name_or_spec = GPU_ALIASES.get(name_or_spec.lower(), name_or_spec)
    return resolve_preset(name_or_spec, GPU_PRESETS, GPU, "gpu")


def gpu_key(gpu: GPU) -> str:
    """The preset key of ``gpu`` (by name), or its name when it is not a preset."""
    for key, g in GPU_PRESETS.items():
        if g.name == gpu.name:
            return key
    return gpu.name


def nixl_backend(link: Link, kv_transport: str = "rdma") -> str:
    """The NIXL backend a NixlConnector deployment on ``link`` names in ``kv_connector_extra_config.backends``:
    ``LIBFABRIC`` over EFA (AWS's libfabric EFA provider), else ``UCX`` (NIXL's default: RoCE/InfiniBand, and the TCP
    transport a ``kv_transport: tcp`` deployment or a ``-tcp`` preset models)."""
    return "LIBFABRIC" if kv_transport == "rdma" and link.name.startswith("efa-") else "UCX"
