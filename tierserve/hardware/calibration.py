"""Calibration, the top of tierserve/hardware: fit the execution-time model from Vidur-format operator profiles
(profile_fit.py) or from logs of measured iterations (iteration_calibration.py). This module is the one import
point for both; nothing in hardware/ imports it.

Layers, bottom to top (an import only goes down):
  specs, roofline, memory, exec_runtime   shapes, datasheets, operator rooflines, the compiled per-iteration part
  fits, fit_tools                         fitted coefficients' types and JSON; shared CSV / error / solver helpers
  coefficients                            the committed coefficient store and its lookup rules
  exec_builder                            the model builders (profile coefficients, roofline, fitted parameters)
  iteration_fit                           fits of measured iterations, as files, and their models
  exec_model                              the loader the simulator calls (make_execution_model)
  profile_fit, iteration_calibration      the calibrations
  calibration                             this re-export
"""
from tierserve.hardware.fit_tools import HOLDOUT_FRACTION, column, fit_nonneg, holdout_mask, mape, read_rows
from tierserve.hardware.fits import (
    AllReduceFit,
    AttentionFit,
    FitReport,
    LayerFit,
    ProfileError,
    allreduce_from_json,
    allreduce_to_json,
    attention_from_json,
    attention_to_json,
    gemm_from_json,
    gemm_to_json,
    layerfit_from_json,
    layerfit_to_json,
)
from tierserve.hardware.iteration_calibration import (
    EXCLUDE_COLUMN,
    FIT_EFF_HBM,
    GEOMETRY_COLUMNS,
    ITERATION_COLUMNS,
    ITERATION_OBJECTIVES,
    calibrate_from_iterations,
    fit_physical_iterations,
    step_time_ratio_table,
)
from tierserve.hardware.iteration_fit import (
    PHYSICAL_FIT_KIND,
    STEP_RATIO_TABLE_SIZE,
    STEP_RATIOS_KEY,
    IterationFit,
    PhysicalIterationFit,
    read_step_time_ratios,
)
from tierserve.hardware.profile_fit import (
    SAVE_KNOTS,
    fit_allreduce,
    fit_attention_profile,
    fit_gemm,
    fit_linear,
    fit_mlp_profile,
    fit_profile_tree,
    format_fit_summary,
    pooled_kv_save,
    summarise_reports,
)
from tierserve.hardware.roofline import GemmFit, LinearFit

__all__ = [
    "HOLDOUT_FRACTION", "column", "fit_nonneg", "holdout_mask", "mape", "read_rows",
    "AllReduceFit", "AttentionFit", "FitReport", "LayerFit", "ProfileError", "GemmFit", "LinearFit",
    "allreduce_from_json", "allreduce_to_json", "attention_from_json", "attention_to_json", "gemm_from_json",
    "gemm_to_json", "layerfit_from_json", "layerfit_to_json",
    "EXCLUDE_COLUMN", "FIT_EFF_HBM", "GEOMETRY_COLUMNS", "ITERATION_COLUMNS", "ITERATION_OBJECTIVES",
    "calibrate_from_iterations", "fit_physical_iterations", "step_time_ratio_table",
    "PHYSICAL_FIT_KIND", "STEP_RATIO_TABLE_SIZE", "STEP_RATIOS_KEY", "IterationFit", "PhysicalIterationFit",
    "read_step_time_ratios",
    "SAVE_KNOTS", "fit_allreduce", "fit_attention_profile", "fit_gemm", "fit_linear", "fit_mlp_profile",
    "fit_profile_tree", "format_fit_summary", "pooled_kv_save", "summarise_reports",
]
