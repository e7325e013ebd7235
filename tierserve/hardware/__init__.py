"""Hardware models: model/GPU specs, KV-cache memory, and the calibrated per-iteration execution time."""
from tierserve.hardware.exec_model import (
    ExecutionTimeModel, build_execution_model, make_execution_model, prefill_attention_pairs,
)
from tierserve.hardware.memory import (
    kv_bytes_per_token,
    kv_capacity_blocks,
    kv_capacity_tokens,
    kv_transfer_time_s,
    swap_time_s,
)
from tierserve.hardware.specs import GPUSpec, ModelSpec, engine_defaults, get_gpu, get_model, known_gpus, known_models

__all__ = [
    "ExecutionTimeModel", "build_execution_model", "make_execution_model", "prefill_attention_pairs",
    "kv_bytes_per_token", "kv_capacity_blocks", "kv_capacity_tokens", "kv_transfer_time_s", "swap_time_s",
    "GPUSpec", "ModelSpec", "engine_defaults", "get_gpu", "get_model", "known_gpus", "known_models",
]
