"""KV-cache sizing and KV movement times (swap over PCIe, migration between replicas)."""
from __future__ import annotations

from tierserve.core.errors import ConfigError
from tierserve.hardware.specs import GPUSpec, ModelSpec, get_gpu, get_model

# Fixed per-GPU reserve for CUDA context, cuBLAS/NCCL workspaces and CUDA graphs (vLLM sees ~1 GiB).
RUNTIME_RESERVE_BYTES = 1 << 30
# Peak activations are sized for this many tokens in one forward pass (vLLM's default profiling run).
ACTIVATION_PROFILE_TOKENS = 8192


def kv_bytes_per_token(model: str | ModelSpec, tp: int = 1) -> int:
    """K and V for every layer, one GPU's shard: 2·layers·(kv_heads/TP)·head_dim·dtype_bytes."""
    m = get_model(model)
    m.check_tp(tp)
    return 2 * m.num_layers * (m.num_kv_heads // tp) * m.head_dim * m.dtype_bytes


def weight_bytes_per_gpu(model: str | ModelSpec, tp: int = 1) -> int:
    """Weights are sharded evenly across the TP group (embeddings/LM head are vocab-parallel too)."""
    m = get_model(model)
    m.check_tp(tp)
    return m.param_bytes // tp


def activation_reserve_bytes(model: str | ModelSpec, tp: int = 1,
                             max_batch_tokens: int = ACTIVATION_PROFILE_TOKENS) -> int:
    """Peak transient memory of one forward pass plus the runtime reserve.

    Live at the MLP: residual + normed input (2·h), gate and up outputs (2·I/TP), and the logits of one
    token per sequence are small; so ≈ tokens·(4·h + 2·I/TP)·dtype, the buffers vLLM's profiling run finds.
    """
    m = get_model(model)
    per_token = (4 * m.hidden + 2 * m.intermediate // tp) * m.dtype_bytes
    return max_batch_tokens * per_token + RUNTIME_RESERVE_BYTES


def kv_capacity_blocks(model: str | ModelSpec, gpu: str | GPUSpec, tp: int = 1,
                       gpu_memory_utilization: float = 0.9, block_size: int = 16) -> int:
    """KV blocks one replica holds: (mem·util − weights/TP − activations) / block bytes, per GPU.

    Every GPU of the TP group stores its own head shard of the same blocks, so the per-GPU count is the
    replica's count.
    """
    m, g = get_model(model), get_gpu(gpu)
    if not 0.0 < gpu_memory_utilization <= 1.0:
        raise ConfigError("gpu_memory_utilization", gpu_memory_utilization, "a fraction in (0, 1]")
    if block_size < 1:
        raise ConfigError("block_size", block_size, "a positive integer")
    budget = g.memory_bytes * gpu_memory_utilization
    weights = weight_bytes_per_gpu(m, tp)
    acts = activation_reserve_bytes(m, tp)
    free = budget - weights - acts
    block_bytes = kv_bytes_per_token(m, tp) * block_size
    if free < block_bytes:
        raise ConfigError(
            "tp", tp,
            f"a TP degree at which {m.name} fits on {g.name}: {g.memory_gb:.0f} GiB x {gpu_memory_utilization} "
            f"= {budget / 2**30:.1f} GiB but weights/TP need {weights / 2**30:.1f} GiB and activations "
            f"{acts / 2**30:.1f} GiB, leaving no room for one KV block",
        )
    return int(free // block_bytes)


def kv_capacity_tokens(model: str | ModelSpec, gpu: str | GPUSpec, tp: int = 1,
                       gpu_memory_utilization: float = 0.9, block_size: int = 16) -> int:
    return kv_capacity_blocks(model, gpu, tp, gpu_memory_utilization, block_size) * block_size


def swap_time_s(num_blocks: int, model: str | ModelSpec, gpu: str | GPUSpec, tp: int = 1,
                block_size: int = 16, pcie_efficiency: float = 0.8) -> float:
    """Copy n blocks GPU↔host: each GPU moves its own shard over its own PCIe link in parallel."""
    if num_blocks <= 0:
        return 0.0
    g = get_gpu(gpu)
    nbytes = num_blocks * block_size * kv_bytes_per_token(model, tp)
    return nbytes / (g.pcie_gbytes_s * 1e9 * pcie_efficiency)


def kv_transfer_time_s(num_tokens: int, model: str | ModelSpec, tp: int = 1, bandwidth_gbytes_s: float = 100.0,
                       latency_s: float = 50e-6, *, nvlink: bool = False, gpu: str | GPUSpec | None = None) -> float:
    """Migrate a request's KV to another replica: latency + all shards' bytes / aggregate bandwidth.

    `bandwidth_gbytes_s` is GB/s (1e9 bytes/s) between the two replicas in total; the default 100 GB/s is an
    inter-node link of 8x100 Gb/s NICs. With `nvlink=True` (same node) each of the TP shards sends over its
    own GPU's NVLink, so the aggregate is tp x the GPU's NVLink GB/s; `gpu` is then required.
    """
    if num_tokens <= 0:
        return 0.0
    m = get_model(model)
    m.check_tp(tp)
    if nvlink:
        if gpu is None:
            raise ConfigError("gpu", None, "a GPU name when nvlink=True (its NVLink bandwidth is used)")
        bandwidth_gbytes_s = get_gpu(gpu).nvlink_gbytes_s * tp
    if bandwidth_gbytes_s <= 0:
        raise ConfigError("bandwidth_gbytes_s", bandwidth_gbytes_s, "a positive number of GB/s")
    nbytes = num_tokens * kv_bytes_per_token(m, 1)
    return latency_s + nbytes / (bandwidth_gbytes_s * 1e9)
