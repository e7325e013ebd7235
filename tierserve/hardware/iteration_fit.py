"""Fits of measured iterations as `tierserve calibrate --iterations --out` writes them, and how each becomes an
execution-time model; also the step-time ratio table such a file records. The fitting itself is in
iteration_calibration.py (above this module); the loader (exec_model.py) reads these files."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tierserve.core.errors import ConfigError
from tierserve.hardware.exec_builder import (
    ExecutionTimeModel, model_from_linear_coefficients, model_from_physical_parameters,
)

PHYSICAL_FIT_KIND = "physical_iteration_fit"
STEP_RATIO_TABLE_SIZE = 64
STEP_RATIOS_KEY = "step_time_ratios"


@dataclass(slots=True)
class IterationFit:
    """DESIGN.md's linear model t = c0 + c1·P + c2·B + c3·pairs + c4·C (seconds), fitted on measurements."""

    c0_s: float
    c_prefill_tok_s: float
    c_decode_tok_s: float
    c_pair_s: float
    c_ctx_s: float
    n_rows: int
    mape_test: float
    source: str = ""
    # measured/predicted step time over the fitted rows, as `step_time_ratio_table` compacts it
    step_time_ratios: list[float] = field(default_factory=list)

    def to_model(self, name: str = "iteration-fit") -> ExecutionTimeModel:
        return model_from_linear_coefficients(name, self.c0_s, self.c_prefill_tok_s, self.c_decode_tok_s,
                                              self.c_pair_s, self.c_ctx_s)


@dataclass(slots=True)
class PhysicalIterationFit:
    """Roofline efficiencies, a per-iteration overhead and a per-decode cost fitted to measured iterations; the
    cost of B decode sequences is then taken as measured at each logged batch size (`decode_batch_knots`,
    `decode_cost_ms`). `points` reports every log row: measured, physical-only, fitted, leave-one-out errors."""

    model: str
    gpu: str
    tp: int
    overhead_ms: float
    eff_gemm_flop: float
    eff_hbm: float
    eff_attn_flop: float
    per_seq_ms: float
    decode_batch_knots: list[int]
    decode_cost_ms: list[float]
    n_rows: int
    source: str = ""
    points: list[dict[str, Any]] = field(default_factory=list)
    kind: str = PHYSICAL_FIT_KIND
    step_time_ratios: list[float] = field(default_factory=list)   # as in IterationFit

    def to_model(self, name: str = "iteration-fit", overhead_s: float | None = None,
                 measured_decode: bool = True) -> ExecutionTimeModel:
        return model_from_physical_parameters(
            name, self.model, self.gpu, self.tp, eff_gemm_flop=self.eff_gemm_flop, eff_hbm=self.eff_hbm,
            eff_attn_flop=self.eff_attn_flop,
            overhead_s=self.overhead_ms * 1e-3 if overhead_s is None else overhead_s,
            per_seq_s=self.per_seq_ms * 1e-3,
            decode_knots=self.decode_batch_knots if measured_decode else (),
            decode_cost_s=[v * 1e-3 for v in self.decode_cost_ms] if measured_decode else ())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "PhysicalIterationFit":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def max_abs_err_pct(self) -> float:
        return max(abs(p["err_pct"]) for p in self.points if not p["exclude"])


def read_step_time_ratios(path: str | Path, field_name: str = "step_time_variability") -> list[float]:
    """The step-time ratio table a fit file records (`tierserve calibrate --iterations --out`); a clear
    ConfigError naming `field_name` when the file has none or a bad one."""
    from tierserve.core.files import read_mapping
    import json
    data = read_mapping(str(path), "exec_model_file", json.loads, (ValueError,), "JSON")
    table = data.get(STEP_RATIOS_KEY)
    if not table:
        raise ConfigError(field_name, True, f"an exec_model_file that records {STEP_RATIOS_KEY} (a fit written by "
                                            f"`tierserve calibrate --iterations` from at least "
                                            f"{STEP_RATIO_TABLE_SIZE} rows); {path} has none")
    if (not isinstance(table, list) or len(table) > 4096
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                       for v in table)):
        raise ConfigError(field_name, True, f"{path}: {STEP_RATIOS_KEY} must be a list of at most 4096 positive "
                                            f"finite numbers")
    return [float(v) for v in table]
