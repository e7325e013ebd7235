"""The execution-time model the simulator asks for (`make_execution_model`): built from the committed profile
coefficients, or loaded from what `tierserve calibrate --out` wrote. The formula and the two modes are in
exec_builder.py; its names are re-exported here, where the rest of tierserve imports them from."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tierserve.core.errors import ConfigError
from tierserve.core.files import read_mapping
from tierserve.hardware.exec_builder import (
    DEFAULT_ITERATION_OVERHEAD_MS,
    EXEC_MODES,
    TABLE_TOKENS,
    AttentionTerms,
    ExecutionTimeModel,
    _LayerCostBuilder,
    build_execution_model,
    check_mode,
    model_from_linear_coefficients,
    model_from_physical_parameters,
    prefill_attention_pairs,
)
from tierserve.hardware.fit_schema import validate_fit
from tierserve.hardware.iteration_fit import PHYSICAL_FIT_KIND, IterationFit, PhysicalIterationFit
from tierserve.hardware.specs import get_gpu, get_model


def check_overhead_ms(value: float | None) -> float | None:
    """None (the mode's default) or a finite number of milliseconds ≥ 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value) or value < 0:
        raise ConfigError("iteration_overhead_ms", value, "None (the mode's default) or a number of ms >= 0")
    return float(value)


def make_execution_model(model: str, gpu: str, tp: int = 1, *, mode: str = "physical",
                         iteration_overhead_ms: float | None = None,
                         exec_model_file: str | None = None) -> ExecutionTimeModel:
    """The simulator's execution-time model of one replica (model, GPU, TP).

    mode: "physical" (default) or "vidur_parity" (see exec_builder.py's docstring). iteration_overhead_ms: CPU/
    scheduling cost per non-empty iteration, None = the mode's (or the calibrated file's) own value.
    exec_model_file: what `tierserve calibrate --out` wrote (profile coefficients or a fit of measured
    iterations); None = the committed profile coefficients.
    """
    check_mode(mode)
    oh = check_overhead_ms(iteration_overhead_ms)
    overhead_s = None if oh is None else oh * 1e-3
    if exec_model_file:
        return load_execution_model(exec_model_file, model, gpu, tp, mode=mode, overhead_s=overhead_s)
    return build_execution_model(model, gpu, tp, mode=mode, overhead_s=overhead_s)


def load_execution_model(path: str, model: str, gpu: str, tp: int = 1, *, mode: str = "physical",
                         overhead_s: float | None = None) -> ExecutionTimeModel:
    """The model `tierserve calibrate --out FILE` wrote: a coefficient store (from profiles), a physically
    parametrised fit of measured iterations, or a bare linear fit, told apart by their keys."""
    check_mode(mode)
    data = read_mapping(path, "exec_model_file", json.loads, (ValueError,), "JSON")
    validate_fit(data, path)          # a schema per kind (fit_schema.py): unknown kinds and bad values refused
    measured = data.get("kind") == PHYSICAL_FIT_KIND or "c_ctx_s" in data
    if measured and mode != "physical":
        raise ConfigError("exec_mode", mode, f"physical: {path} is a fit of measured iterations, which has no "
                                             "Vidur-profile KV write to reproduce")
    if data.get("kind") == PHYSICAL_FIT_KIND:
        fit = PhysicalIterationFit.from_json(data)
        m, g = get_model(model), get_gpu(gpu)
        if (fit.model, fit.gpu, fit.tp) != (m.name, g.name, int(tp)):
            raise ConfigError("exec_model_file", str(path), f"a fit for the replica's {m.name}/{g.name}/tp{tp}; "
                                                            f"this one is for {fit.model}/{fit.gpu}/tp{fit.tp}")
        return fit.to_model(Path(path).stem, overhead_s=overhead_s)
    if "c_ctx_s" in data:
        if overhead_s is not None:
            raise ConfigError("iteration_overhead_ms", overhead_s * 1e3,
                              f"None: {path} is a linear fit whose fixed cost c0_s already holds the overhead")
        fields = IterationFit.__dataclass_fields__
        return IterationFit(**{k: v for k, v in data.items() if k in fields}).to_model(Path(path).stem)
    return build_execution_model(model, gpu, tp, coefficients=str(path), mode=mode, overhead_s=overhead_s)


__all__ = [
    "ExecutionTimeModel", "build_execution_model", "load_execution_model", "make_execution_model",
    "prefill_attention_pairs", "model_from_linear_coefficients", "model_from_physical_parameters",
    "EXEC_MODES", "DEFAULT_ITERATION_OVERHEAD_MS", "TABLE_TOKENS", "AttentionTerms", "_LayerCostBuilder",
]
