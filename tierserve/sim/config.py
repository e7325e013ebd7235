"""Validated configuration of a simulated cluster (hardware, limits, policies). Defaults live here only."""
from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from tierserve.core import ConfigError
from tierserve.core import limits
from tierserve.core.limits import MAX_TIME_S, MAX_TOKENS, Float, Int


class ReplicaConfig(BaseModel):
    """One replica's hardware and engine limits."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field("Llama-3-8B", description="Model name or Hugging Face id (see `tierserve hardware`).")
    gpu: str = Field("A100-80GB", description="GPU name (A100-80GB, H100-80GB, H200).")
    tp: Int = Field(1, ge=1, le=1024, description="Tensor-parallel degree (GPUs per replica).")
    block_size: Int = Field(16, ge=1, le=1 << 20, description="KV block size in tokens.")
    gpu_memory_utilization: Float = Field(0.9, gt=0, le=1, description="Fraction of GPU memory the engine may use.")
    num_blocks: Int | None = Field(None, ge=1, le=1 << 40, description="Override the KV capacity (blocks) computed from memory.")
    token_budget: Int | None = Field(None, ge=1, le=MAX_TOKENS, description="Max tokens per iteration; None = the policy's "
                                        "default (vLLM v1 policies: vLLM's per-GPU default, 2,048 on A100, 8,192 on "
                                        "H100/H200; sarathi 512; vllm_v0 4,096).")
    max_num_seqs: Int | None = Field(None, ge=1, le=1 << 24, description="Max requests per batch; None = the policy's "
                                         "default (vLLM v1 policies: 256 on A100, 1,024 on H100/H200; sarathi, "
                                         "vllm_v0 and orca 128).")
    watermark_fraction: Float = Field(0.01, ge=0, le=0.5, description="KV blocks kept free on admission (Sarathi/vLLM v0: 1%; at most half: more leaves no room to batch).")
    max_model_len: Int | None = Field(None, ge=1, le=MAX_TOKENS, description="Longest prompt+output served; None = the model's.")
    swap_space_gib: Float = Field(4.0, ge=0, le=1 << 20, allow_inf_nan=False, description="Host memory per GPU for swapped-out KV (GiB; vLLM v0's "
                                  "--swap-space default 4). A swap that does not fit falls back to recompute.")
    pcie_efficiency: Float = Field(0.8, gt=0, le=1, description="Fraction of the GPU's PCIe bandwidth a KV swap achieves.")
    exec_model_file: str | None = Field(None, description="JSON from `tierserve calibrate --out`; None = shipped fit.")
    exec_mode: Literal["physical", "vidur_parity"] = Field(
        "physical", description="Execution-time model: 'physical' (HBM-bound KV writes, LM head, per-iteration "
                                "CPU overhead) or 'vidur_parity' (Vidur's profiled KV write, no LM head, no "
                                "overhead; for comparisons with Vidur).")
    iteration_overhead_ms: Float | None = Field(
        None, ge=0, le=1e6, allow_inf_nan=False, description="CPU/scheduling time added to every non-empty iteration, in ms; None = the "
                                "mode's default (physical: 0.29 ms, vidur_parity: 0) or the calibrated file's.")

    step_time_variability: bool = Field(
        False, strict=True, description="Multiply each iteration's modelled time by a factor drawn from the "
                                        "measured/predicted step-time ratios that `tierserve calibrate --iterations` "
                                        "records in exec_model_file (`step_time_ratios`, 64 equally likely values of "
                                        "mean Σmeasured/Σpredicted); the draw is a hash of (the run's seed, replica, "
                                        "iteration), so runs repeat exactly and skip-ahead stays exact. Needs an "
                                        "exec_model_file with that table; off: step times are the model's alone.")

    speed_trace: list[tuple[Float, Float]] = Field(
        default_factory=list, description="Piecewise-constant speed of every replica over simulated time: "
                                          "(from_s, factor) pairs, from_s strictly increasing from >= 0; an "
                                          "iteration that starts after from_s (and before the next pair) "
                                          "takes factor x its modelled time. Replays a machine's measured slow and "
                                          "fast periods (benchmarks/sim_to_real.py's speed replay) or models "
                                          "throttling. Not with live migration, which sets the same factor.")

    @field_validator("exec_model_file")
    @classmethod
    def _readable_model_file(cls, v: str | None) -> str | None:
        if v is not None:
            check_exec_model_file(v)
        return v

    @field_validator("step_time_variability")
    @classmethod
    def _ratios_recorded(cls, v: bool, info: ValidationInfo) -> bool:
        if v and "exec_model_file" in info.data:       # absent: the file's own error is reported
            path = info.data["exec_model_file"]
            if path is None:
                raise ValueError("false without an exec_model_file (the ratios come from a `tierserve calibrate "
                                 "--iterations` fit)")
            from tierserve.hardware.calibration import read_step_time_ratios
            read_step_time_ratios(path)
        return v

    @field_validator("speed_trace")
    @classmethod
    def _speed_trace_ordered(cls, v: list[tuple[float, float]]) -> list[tuple[float, float]]:
        for k, (from_s, factor) in enumerate(v):
            if not (math.isfinite(from_s) and from_s >= 0):
                raise ValueError(f"pair {k}: from_s {from_s!r} must be a finite time >= 0 (seconds)")
            if not (math.isfinite(factor) and limits.MIN_SPEED_FACTOR <= factor <= limits.MAX_SPEED_FACTOR):
                raise ValueError(f"pair {k}: factor {factor!r} must be a finite number > 0, in "
                                 f"[{limits.MIN_SPEED_FACTOR:g}, {limits.MAX_SPEED_FACTOR:g}] (a stated bound: "
                                 "slower or faster is not one machine)")
            if k and from_s <= v[k - 1][0]:
                raise ValueError(f"pair {k}: from_s {from_s!r} must come after the previous pair's {v[k - 1][0]!r}")
        return v

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

    num_replicas: Int = Field(4, ge=1, description="Number of replicas.")
    replica: ReplicaConfig = Field(default_factory=ReplicaConfig)
    local_policy: str = Field("vllm", description="Replica scheduler (see `tierserve policies`).")
    local_policy_params: dict[str, Any] = Field(default_factory=dict)
    cluster_policy: str = Field("round_robin", description="Global scheduler.")
    cluster_policy_params: dict[str, Any] = Field(default_factory=dict)
    migration_params: dict[str, Any] = Field(default_factory=dict, description="Live-migration costs and limits.")
    skip_ahead: bool = Field(True, strict=True, description="Run repeatable decode batches k iterations at once (exact).")
    time_limit_s: Float | None = Field(None, gt=0, le=MAX_TIME_S, allow_inf_nan=False,
                                       description="Stop at this simulated time; the rest is censored.")

    @field_validator("num_replicas")
    @classmethod
    def _few_replicas(cls, v: int) -> int:
        limits.REPLICAS.check("num_replicas", v)
        return v

    @field_validator("local_policy_params")
    @classmethod
    def _local_params(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "local_policy" in info.data:
            from tierserve.policies.local import LOCAL_POLICIES
            check_policy_params(LOCAL_POLICIES, info.data["local_policy"], v)
        return v

    @field_validator("cluster_policy_params")
    @classmethod
    def _cluster_params(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "cluster_policy" in info.data:
            from tierserve.policies.cluster import CLUSTER_POLICIES
            check_policy_params(CLUSTER_POLICIES, info.data["cluster_policy"], v)
        return v

    @field_validator("migration_params")
    @classmethod
    def _migration_params(cls, v: dict[str, Any]) -> dict[str, Any]:
        check_migration_params(v)
        return v

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


# ---- validation of what the fields above name (policy parameters, migration costs, the model file) ----------

def _param_types(cls: type) -> tuple[dict[str, Any], bool]:
    """(parameter name → annotation, complete) of a policy's constructor, following **kwargs up the class
    hierarchy; complete is False when some constructor's signature could not be read to the end."""
    import inspect
    import typing

    out: dict[str, Any] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        if klass is object:
            return out, False
        try:
            sig = inspect.signature(init)
            hints = typing.get_type_hints(init)
        except (TypeError, ValueError, NameError):
            return out, False
        for name, p in sig.parameters.items():
            if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
                out.setdefault(name, hints.get(name, Any))
        if not any(p.kind == p.VAR_KEYWORD for p in sig.parameters.values()):
            return out, True
    return out, False


def check_policy_params(registry, policy: str, params: dict[str, Any]) -> None:
    """Each parameter has its constructor's type (strictly: `true` is not a count, "abc" not a number), then the
    policy is built once, so its own range checks run now rather than in the middle of a run."""
    from pydantic import TypeAdapter, ValidationError

    cls = registry.get_class(policy)
    types, complete = _param_types(cls)
    for name, value in params.items():
        if complete and name not in types:
            raise ConfigError(name, value, f"a parameter of {policy}: {', '.join(sorted(types)) or 'none'}")
        hint = types.get(name)
        if hint is None or hint is Any:
            continue
        try:
            TypeAdapter(hint).validate_python(value, strict=True)
        except ValidationError as e:
            raise ConfigError(name, value, f"{_type_name(hint)} ({e.errors()[0]['msg']})") from None
        except Exception:   # an annotation pydantic cannot check: the constructor decides
            continue
        if isinstance(value, float) and not math.isfinite(value):
            raise ConfigError(name, value, "a finite number")
        limits.check_param_magnitude(name, value)
    try:
        registry.create(policy, **params)
    except ConfigError as e:
        field = e.field.removeprefix(f"{registry.kind}_policy_params[{policy}]") or policy
        raise ConfigError(field, e.value, e.allowed) from None
    except (TypeError, ValueError, ArithmeticError) as e:
        raise ConfigError(policy, params, f"parameters {policy} accepts ({e})") from None


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def check_migration_params(params: dict[str, Any]) -> None:
    """Migration costs: known names, numbers of the right kind (no text, no booleans), then their ranges."""
    from dataclasses import fields

    from tierserve.sim.migration import MigrationParams
    kinds = {f.name: f.type for f in fields(MigrationParams)}
    for name, value in params.items():
        if name not in kinds:
            raise ConfigError(name, value, f"one of {', '.join(sorted(kinds))}")
        want_int = kinds[name] in (int, "int")
        if isinstance(value, bool) or not isinstance(value, int if want_int else (int, float)):
            raise ConfigError(name, value, "an integer" if want_int else "a number")
        if not math.isfinite(value):
            raise ConfigError(name, value, "a finite number")
    MigrationParams.from_dict(dict(params))


def check_exec_model_file(path: str) -> None:
    """The file `tierserve calibrate --out` wrote: readable UTF-8 JSON, one of its three kinds, not empty (an
    empty store would silently fall back to the uncalibrated roofline)."""
    from tierserve.core.files import read_mapping
    data = read_mapping(path, "exec_model_file", "json", kind="JSON")
    if data.get("kind") is not None or "c_ctx_s" in data:
        return                                           # a fit of measured iterations (physical or linear)
    store_keys = {"layers", "attention", "allreduce", "meta"}
    unknown = sorted(set(data) - store_keys)
    if unknown:
        raise ConfigError("exec_model_file", path, f"a file from `tierserve calibrate --out` (unknown keys {unknown})")
    if not any(data.get(k) for k in ("layers", "attention", "allreduce")):
        raise ConfigError("exec_model_file", path, "a file from `tierserve calibrate --out` with fitted coefficients "
                                                   "(this one has none: it would silently mean the uncalibrated "
                                                   "roofline)")
