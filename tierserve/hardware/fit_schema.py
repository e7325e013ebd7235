"""What a fit file and the data a calibration fits must hold, checked before anything is built from them.

Fit files (`tierserve calibrate --out`, an `exec_model_file`) have one schema per kind — field names, types,
finite values, ranges in the file's units — and a file of an unknown kind is refused, never read as the
shipped model:
- `physical_iteration_fit` (its `kind` key): roofline efficiencies in (0, 1], overhead and decode costs in
  ms, decode knots increasing with one cost each, a known model and GPU, a TP the model can shard;
- `linear_iteration_fit` (no `kind`; its `c_ctx_s` key): DESIGN.md's coefficients in seconds, >= 0, not all 0;
- `coefficient_store` (no `kind`; `layers`/`attention`/`allreduce` keys): operator fits per GPU, model and
  TP (GEMM efficiencies in (0, 1], times in ms), attention fits of known models, all-reduce tables.

Calibration data (`check_iteration_log`, `check_distinct_rows`, `check_above_roofline`,
`check_profile_rows`) is refused with the row and the reason when it cannot be fitted: negative or fractional
counts, too few distinct rows (a log of identical rows fits anything with 0% error), a measured time faster
than the hardware's roofline at 100% efficiency (wrong model, GPU or units), a profile's TP degree or worker
count below 1 or above MAX_TP, zero token or batch counts, or another model's geometry.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tierserve.core.errors import ConfigError, config_error_from_validation
from tierserve.core.limits import MAX_INT, MAX_TP, Float, Int
from tierserve.hardware.fits import ProfileError

MAX_OP_MS = 60_000.0                 # one operator or iteration longer than a minute is a unit error
MAX_ITERATION_S = 60.0
MAX_PER_UNIT_S = 1.0                 # seconds per token, decode, attention pair or context token

Ms = Annotated[Float, Field(ge=0, le=MAX_OP_MS, allow_inf_nan=False)]
PerUnitS = Annotated[Float, Field(ge=0, le=MAX_PER_UNIT_S, allow_inf_nan=False)]
Efficiency = Annotated[Float, Field(gt=0, le=1, allow_inf_nan=False)]
Tp = Annotated[Int, Field(ge=1, le=MAX_TP)]
Count = Annotated[Int, Field(ge=1, le=MAX_INT)]
Ratio = Annotated[Float, Field(gt=0, le=1000, allow_inf_nan=False)]
Log2 = Annotated[Float, Field(ge=0, le=64, allow_inf_nan=False)]
Name = Annotated[str, Field(min_length=1, max_length=200)]


class _Schema(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _increasing(name: str, xs: list[float]) -> None:
    if any(b <= a for a, b in zip(xs, xs[1:])):
        raise ValueError(f"{name}: got {xs[:8]}…; allowed: strictly increasing values")


def _same_length(a_name: str, a: list, b_name: str, b: list) -> None:
    if len(a) != len(b):
        raise ValueError(f"{b_name}: got {len(b)} values; allowed: one per {a_name} entry ({len(a)})")


def _known_geometry(model: str, gpu: str | None, tp: int) -> None:
    from tierserve.hardware.specs import get_gpu, get_model
    m = get_model(model)
    if gpu is not None:
        get_gpu(gpu)
    m.check_tp(tp)


# ---- iteration fits -----------------------------------------------------------------------------------------

class LinearIterationFitFile(_Schema):
    """t = c0 + c1·P + c2·B + c3·pairs + c4·C, seconds (iteration_fit.IterationFit)."""

    kind: Literal["linear_iteration_fit"] | None = None
    c0_s: Annotated[Float, Field(ge=0, le=MAX_ITERATION_S, allow_inf_nan=False)]
    c_prefill_tok_s: PerUnitS
    c_decode_tok_s: PerUnitS
    c_pair_s: PerUnitS
    c_ctx_s: PerUnitS
    n_rows: Count
    mape_test: Annotated[Float, Field(ge=0, le=1e6, allow_inf_nan=False)]
    source: str = ""
    step_time_ratios: list[Ratio] = Field(default_factory=list, max_length=4096)

    @model_validator(mode="after")
    def _predicts_something(self) -> LinearIterationFitFile:
        if not any((self.c0_s, self.c_prefill_tok_s, self.c_decode_tok_s, self.c_pair_s, self.c_ctx_s)):
            raise ValueError("c0_s: got 0 with every other coefficient 0; allowed: a fit that predicts a positive "
                             "iteration time")
        return self


class PhysicalIterationFitFile(_Schema):
    """Roofline efficiencies plus measured costs (iteration_fit.PhysicalIterationFit); times in ms."""

    kind: Literal["physical_iteration_fit"]
    model: Name
    gpu: Name
    tp: Tp
    overhead_ms: Ms
    eff_gemm_flop: Efficiency
    eff_hbm: Efficiency
    eff_attn_flop: Efficiency
    per_seq_ms: Ms
    decode_batch_knots: list[Count] = Field(max_length=1 << 16)
    decode_cost_ms: list[Ms] = Field(max_length=1 << 16)
    n_rows: Count
    source: str = ""
    points: list[dict[str, Any]] = Field(default_factory=list)
    step_time_ratios: list[Ratio] = Field(default_factory=list, max_length=4096)

    @model_validator(mode="after")
    def _consistent(self) -> PhysicalIterationFitFile:
        _increasing("decode_batch_knots", self.decode_batch_knots)
        _same_length("decode_batch_knots", self.decode_batch_knots, "decode_cost_ms", self.decode_cost_ms)
        _known_geometry(self.model, self.gpu, self.tp)
        return self


# ---- the coefficient store ----------------------------------------------------------------------------------

class GemmFitEntry(_Schema):
    eff_flop: Efficiency
    eff_bw: Efficiency
    overhead_ms: Ms
    corr_log2t: list[Log2] = Field(default_factory=list, max_length=512)
    corr_factor: list[Ratio] = Field(default_factory=list, max_length=512)
    tile_tokens: Annotated[Int, Field(ge=1, le=1 << 20)] = 1
    waves: bool = Field(False, strict=True, description="compute in whole waves of output tiles (roofline.py)")

    @model_validator(mode="after")
    def _knots(self) -> GemmFitEntry:
        _increasing("corr_log2t", self.corr_log2t)
        _same_length("corr_log2t", self.corr_log2t, "corr_factor", self.corr_factor)
        return self


class LayerFitEntry(_Schema):
    gemm: dict[str, GemmFitEntry] = Field(default_factory=dict)
    elementwise: dict[str, tuple[Ms, Ms]] = Field(default_factory=dict,
                                                  description="op -> [ms per call, ms per token]")

    @model_validator(mode="after")
    def _known_ops(self) -> LayerFitEntry:
        from tierserve.hardware.roofline import ELEMENTWISE_OPS, GEMM_OPS
        for name, ops, known in (("gemm", self.gemm, GEMM_OPS), ("elementwise", self.elementwise, ELEMENTWISE_OPS)):
            unknown = sorted(set(ops) - set(known))
            if unknown:
                raise ValueError(f"{name}: got operator {unknown[0]!r}; allowed: {', '.join(known)}")
        return self


class AttentionFitEntry(_Schema):
    p0: Ms
    p_tok: Ms
    p_pair: Ms
    d0: Ms
    d_req: Ms
    d_ctx: Ms
    save_knots: list[Annotated[Float, Field(ge=0, le=MAX_INT, allow_inf_nan=False)]] = Field(default_factory=list)
    save_ms: list[Ms] = Field(default_factory=list)
    save_req: Ms = 0.0
    save_d0: Ms = 0.0
    pooled_save_tokens: list[Annotated[Float, Field(ge=0, le=MAX_INT, allow_inf_nan=False)]] = Field(
        default_factory=list)
    pooled_save_ms: list[Ms] = Field(default_factory=list)
    ref_model: Name
    ref_gpu: Name
    ref_tp: Tp = 1
    eff_attn_flop: Annotated[Float, Field(ge=0, le=1, allow_inf_nan=False)] = 0.0
    eff_attn_bw: Annotated[Float, Field(ge=0, le=1, allow_inf_nan=False)] = 0.0

    @model_validator(mode="after")
    def _consistent(self) -> AttentionFitEntry:
        _increasing("save_knots", self.save_knots)
        _same_length("save_knots", self.save_knots, "save_ms", self.save_ms)
        _increasing("pooled_save_tokens", self.pooled_save_tokens)
        _same_length("pooled_save_tokens", self.pooled_save_tokens, "pooled_save_ms", self.pooled_save_ms)
        _known_geometry(self.ref_model, self.ref_gpu, self.ref_tp)
        return self


class AllReduceFitEntry(_Schema):
    num_workers: Annotated[Int, Field(ge=1, le=4096)]
    log2_bytes: list[Log2] = Field(min_length=1, max_length=128)
    ms: list[Ms] = Field(min_length=1, max_length=128)

    @model_validator(mode="after")
    def _knots(self) -> AllReduceFitEntry:
        _increasing("log2_bytes", self.log2_bytes)
        _same_length("log2_bytes", self.log2_bytes, "ms", self.ms)
        return self


def _int_keys(name: str, keys, lo: int, hi: int) -> None:
    for k in keys:
        if not (isinstance(k, str) and k.isdigit() and lo <= int(k) <= hi):
            raise ValueError(f"{name}: got key {k!r}; allowed: a whole number in [{lo}, {hi}]")


class CoefficientStoreFile(_Schema):
    """data/exec_coefficients.json's form (coefficients.CoefficientStore.to_json)."""

    kind: Literal["coefficient_store"] | None = None
    meta: dict[str, Any] = Field(default_factory=dict)
    layers: dict[str, dict[str, dict[str, LayerFitEntry]]] = Field(default_factory=dict,
                                                                   description="GPU -> model -> TP -> fits")
    attention: list[AttentionFitEntry] = Field(default_factory=list)
    allreduce: dict[str, dict[str, AllReduceFitEntry]] = Field(default_factory=dict,
                                                               description="network -> workers -> table")

    @field_validator("layers")
    @classmethod
    def _layer_keys(cls, v: dict[str, dict[str, dict[str, LayerFitEntry]]]):
        from tierserve.hardware.specs import get_gpu, get_model
        for gpu, by_model in v.items():
            get_gpu(gpu)
            for model, by_tp in by_model.items():
                get_model(model)
                _int_keys(f"layers.{gpu}.{model}", by_tp, 1, MAX_TP)
        return v

    @field_validator("allreduce")
    @classmethod
    def _allreduce_keys(cls, v: dict[str, dict[str, AllReduceFitEntry]]):
        for net, by_workers in v.items():
            _int_keys(f"allreduce.{net}", by_workers, 1, 4096)
        return v

    @model_validator(mode="after")
    def _has_fits(self) -> CoefficientStoreFile:
        if not (self.layers or self.attention or self.allreduce):
            raise ValueError("layers: got no fits at all; allowed: a store with at least one fit (an empty one "
                             "would silently give roofline defaults)")
        return self


FIT_KINDS: dict[str, type[_Schema]] = {
    "physical_iteration_fit": PhysicalIterationFitFile,
    "linear_iteration_fit": LinearIterationFitFile,
    "coefficient_store": CoefficientStoreFile,
}


def fit_kind(data: dict[str, Any], source: str, field: str = "exec_model_file") -> str:
    """The kind of a fit file: its `kind` key (which must be known), else told by its keys."""
    if "kind" in data:
        kind = data["kind"]
        if not isinstance(kind, str) or kind not in FIT_KINDS:
            raise ConfigError(f"{field} {source}: kind", kind, " | ".join(FIT_KINDS))
        return kind
    if "c_ctx_s" in data:
        return "linear_iteration_fit"
    if {"layers", "attention", "allreduce"} & set(data):
        return "coefficient_store"
    raise ConfigError(field, source, "a fit file written by `tierserve calibrate --out` (a `kind` key, or the keys "
                                     f"of a linear iteration fit or a coefficient store); this one has keys "
                                     f"{sorted(map(str, data))[:8]}")


def validate_fit(data: dict[str, Any], source: str | Path, field: str = "exec_model_file") -> str:
    """Check a fit file's contents against its kind's schema; returns the kind. A ConfigError names the file,
    the field, the value and what is allowed."""
    src = str(source)
    kind = fit_kind(data, src, field)
    try:
        FIT_KINDS[kind].model_validate(data)
    except ValidationError as e:
        err = config_error_from_validation(e, kind)
        value, allowed = err.value, err.allowed
        if e.errors()[0]["type"] == "missing":
            value, allowed = "nothing (the field is missing)", f"a value: every {kind} file has this field"
        raise ConfigError(f"{field} {src} ({kind}): {err.field}", value, allowed) from None
    return kind


# ---- data a calibration is asked to fit ---------------------------------------------------------------------

def _first(bad: np.ndarray) -> int:
    return int(np.argmax(bad)) + 2           # CSV row number: the header is row 1


def check_iteration_log(p: Path, cols: dict[str, np.ndarray], pairs: np.ndarray) -> None:
    """Counts in an iteration log are whole numbers >= 0 (an empty iteration is allowed: it measures the
    fixed cost)."""
    for c in ("prefill_tokens", "decode_count", "decode_context_sum"):
        v = cols[c]
        if (v < 0).any():
            raise ProfileError(p, c, f"row {_first(v < 0)}: {v[v < 0][0]:g} is negative (a count of tokens or "
                                     "requests)")
        if c != "decode_context_sum" and (v != np.round(v)).any():
            bad = v != np.round(v)
            raise ProfileError(p, c, f"row {_first(bad)}: {v[bad][0]:g} is not a whole number (a count)")
    if (pairs < 0).any():
        raise ProfileError(p, "prefill_attn_pairs", f"row {_first(pairs < 0)}: negative")


def check_distinct_rows(p: Path, features: np.ndarray, coefficients: int) -> None:
    """At least `coefficients` different iterations: a log of copies of a few rows fits anything exactly."""
    distinct = len(np.unique(np.round(features, 9), axis=0)) if len(features) else 0
    if distinct < coefficients:
        raise ProfileError(p, None, f"only {distinct} distinct iteration(s) (prefill tokens, decodes, contexts); "
                                    f"fitting {coefficients} coefficients needs at least {coefficients} that "
                                    "differ, or the fit's error says nothing")


def check_above_roofline(p: Path, model: str, gpu: str, tp: int, prefill: np.ndarray, pairs: np.ndarray,
                         decodes: np.ndarray, context: np.ndarray, measured_s: np.ndarray, use: np.ndarray,
                         floor: Any) -> None:
    """No used row is faster than `floor` (the caller's roofline at 100% efficiency with no overhead: built
    above this module, which the store imports): that is physically impossible on that GPU, so the log is
    of another model, GPU or TP, or in other units."""
    for i in np.flatnonzero(use):
        bound = floor.iteration_time(int(prefill[i]), float(pairs[i]), int(decodes[i]), int(context[i]))
        if measured_s[i] < bound:
            raise ProfileError(p, "measured_ms", f"row {i + 2}: {measured_s[i] * 1e3:.4g} ms is faster than "
                                                 f"{model} on {gpu} at TP {tp} can run at 100% of peak "
                                                 f"({bound * 1e3:.4g} ms): the log is of another model, GPU or "
                                                 "TP, or not in milliseconds")


PROFILE_GEOMETRY = {"n_embd": "hidden", "n_head": "num_q_heads", "n_kv_head": "num_kv_heads",
                    "n_expanded_embd": "intermediate"}


def check_profile_rows(p: Path, rows: list[dict[str, str]], model) -> None:
    """A Vidur profile's rows: TP degrees and worker counts in [1, MAX_TP], token and batch counts >= 1, and
    the geometry columns it has equal to `model`'s (a ModelSpec; None: not checked)."""
    from tierserve.hardware.fit_tools import int_column
    for col in ("num_tensor_parallel_workers", "num_workers"):
        if col in rows[0]:
            tps = int_column(rows, col, p)
            bad = tps < 1
            if bad.any():
                raise ProfileError(p, col, f"row {_first(bad)}: {int(tps[bad][0])} (allowed: a degree >= 1)")
            if (tps > MAX_TP).any():       # (a degree the model's heads do not divide is skipped by the fit)
                raise ProfileError(p, col, f"row {_first(tps > MAX_TP)}: {int(tps[tps > MAX_TP][0])} (allowed: a "
                                           f"degree <= {MAX_TP})")
    for col in ("num_tokens", "batch_size"):
        if col in rows[0]:
            n = int_column(rows, col, p)
            if (n < 1).any():
                raise ProfileError(p, col, f"row {_first(n < 1)}: {int(n[n < 1][0])} (allowed: a count >= 1)")
    for col, attr in PROFILE_GEOMETRY.items():
        if model is not None and col in rows[0]:
            values = {(r.get(col) or "").strip() for r in rows}
            want = str(getattr(model, attr))
            other = sorted(v for v in values if not _same_number(v, want))
            if other:
                raise ProfileError(p, col, f"{other[0]!r}: this profile is of another geometry than {model.name}'s "
                                           f"({attr} = {want}); pass its own model")


def _same_number(text: str, want: str) -> bool:
    try:
        return math.isclose(float(text), float(want))
    except ValueError:
        return False


def validated_store(path: Path) -> dict[str, Any]:
    """A coefficient-store file's JSON, checked against its schema (coefficients.load_store reads through here)."""
    from tierserve.core.files import read_mapping
    data = read_mapping(path, "coefficients", "json", kind="JSON")
    if validate_fit(data, path, "coefficients") != "coefficient_store":
        raise ConfigError("coefficients", str(path), "a coefficient store (this is an iteration fit: give it as "
                                                     "exec_model_file)")
    return data
