"""Validated configuration of a simulated cluster (hardware, limits, policies). Defaults live here only."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tierserve.core import ConfigError


class ReplicaConfig(BaseModel):
    """One replica's hardware and engine limits."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("Llama-3-8B", description="Model name or Hugging Face id (see `tierserve hardware`).")
    gpu: str = Field("A100-80GB", description="GPU name (A100-80GB, H100-80GB, H200).")
    tp: int = Field(1, ge=1, description="Tensor-parallel degree (GPUs per replica).")
    block_size: int = Field(16, ge=1, description="KV block size in tokens.")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="Fraction of GPU memory the engine may use.")
    num_blocks: int | None = Field(None, ge=1, description="Override the KV capacity (blocks) computed from memory.")
    token_budget: int | None = Field(None, ge=1, description="Max tokens per iteration; None = the policy's "
                                        "default (vLLM v1 policies: vLLM's per-GPU default, 2,048 on A100, 8,192 on "
                                        "H100/H200; sarathi 512; vllm_v0 4,096).")
    max_num_seqs: int | None = Field(None, ge=1, description="Max requests per batch; None = the policy's "
                                         "default (vLLM v1 policies: 256 on A100, 1,024 on H100/H200; sarathi, "
                                         "vllm_v0 and orca 128).")
    watermark_fraction: float = Field(0.01, ge=0, lt=1, description="KV blocks kept free on admission (Sarathi/vLLM v0: 1%).")
    max_model_len: int | None = Field(None, ge=1, description="Longest prompt+output served; None = the model's.")
    swap_space_gib: float = Field(4.0, ge=0, description="Host memory per GPU for swapped-out KV (GiB; vLLM v0's "
                                  "--swap-space default 4). A swap that does not fit falls back to recompute.")
    pcie_efficiency: float = Field(0.8, gt=0, le=1, description="Fraction of the GPU's PCIe bandwidth a KV swap achieves.")
    exec_model_file: str | None = Field(None, description="JSON from `tierserve calibrate --out`; None = shipped fit.")
    exec_mode: Literal["physical", "vidur_parity"] = Field(
        "physical", description="Execution-time model: 'physical' (HBM-bound KV writes, LM head, per-iteration "
                                "CPU overhead) or 'vidur_parity' (Vidur's profiled KV write, no LM head, no "
                                "overhead; for comparisons with Vidur).")
    iteration_overhead_ms: float | None = Field(
        None, ge=0, description="CPU/scheduling time added to every non-empty iteration, in ms; None = the "
                                "mode's default (physical: 0.29 ms, vidur_parity: 0) or the calibrated file's.")

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str) -> str:
        from tierserve.hardware.specs import get_model
        try:
            return get_model(v).name
        except ConfigError as e:
            raise ValueError(f"one of {e.allowed}") from None

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str) -> str:
        from tierserve.hardware.specs import get_gpu
        try:
            return get_gpu(v).name
        except ConfigError as e:
            raise ValueError(f"one of {e.allowed}") from None


class ClusterConfig(BaseModel):
    """A cluster of identical replicas and the policies that drive it."""

    model_config = ConfigDict(extra="forbid")

    num_replicas: int = Field(4, ge=1, description="Number of replicas.")
    replica: ReplicaConfig = Field(default_factory=ReplicaConfig)
    local_policy: str = Field("vllm", description="Replica scheduler (see `tierserve policies`).")
    local_policy_params: dict[str, Any] = Field(default_factory=dict)
    cluster_policy: str = Field("round_robin", description="Global scheduler.")
    cluster_policy_params: dict[str, Any] = Field(default_factory=dict)
    migration_params: dict[str, Any] = Field(default_factory=dict, description="Live-migration costs and limits.")
    skip_ahead: bool = Field(True, description="Run repeatable decode batches k iterations at once (exact).")
    time_limit_s: float | None = Field(None, gt=0, description="Stop at this simulated time; the rest is censored.")

    @field_validator("local_policy")
    @classmethod
    def _known_local(cls, v: str) -> str:
        from tierserve.policies.local import LOCAL_POLICIES
        if v not in LOCAL_POLICIES.table:
            raise ValueError(f"one of {', '.join(LOCAL_POLICIES.names)}")
        return v

    @field_validator("cluster_policy")
    @classmethod
    def _known_cluster(cls, v: str) -> str:
        from tierserve.policies.cluster import CLUSTER_POLICIES
        if v not in CLUSTER_POLICIES.table:
            raise ValueError(f"one of {', '.join(CLUSTER_POLICIES.names)}")
        return v
