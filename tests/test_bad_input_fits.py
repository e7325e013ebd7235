"""Fit files validated by a schema per kind (unknown kinds refused, never read as the shipped model), and
calibrations that refuse data they cannot fit, saying why."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tierserve.core.errors import ConfigError
from tierserve.hardware.calibration import ProfileError, calibrate_from_iterations, fit_mlp_profile
from tierserve.hardware.exec_model import make_execution_model
from tierserve.hardware.roofline import ELEMENTWISE_OPS, GEMM_OPS

from test_hardware_calibration import _write as _write_csv     # one CSV-writing helper for the fit tests

LINEAR = {"c0_s": 0.005, "c_prefill_tok_s": 2e-5, "c_decode_tok_s": 5e-5, "c_pair_s": 1e-9, "c_ctx_s": 1e-7,
          "n_rows": 30, "mape_test": 1.5, "source": "log.csv", "step_time_ratios": []}
ITERATION_COLUMNS = ["prefill_tokens", "decode_count", "decode_context_sum", "prefill_attn_pairs", "measured_ms"]


def _load(tmp_path: Path, doc) -> object:
    p = tmp_path / "fit.json"
    p.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return make_execution_model("Llama-3-8B", "A100-80GB", 1, exec_model_file=str(p))


@pytest.mark.parametrize("doc, needle", [
    ({"kind": "bogus"}, "kind: got 'bogus'; allowed: physical_iteration_fit | linear_iteration_fit"),
    ({"hello": 1}, "a fit file written by `tierserve calibrate --out`"),
    ({**LINEAR, "c_pair_s": None}, "c_pair_s"),
    ('{"c0_s": NaN, "c_prefill_tok_s": 0, "c_decode_tok_s": 0, "c_pair_s": 0, "c_ctx_s": 0, "n_rows": 3, '
     '"mape_test": 1}', "c0_s"),
    ({**LINEAR, "c0_s": 1e304}, "c0_s: got 1e+304"),
    ({**LINEAR, "c_ctx_s": -1e-7}, "c_ctx_s: got -1e-07"),
    ({**LINEAR, "c_decode_tok_s": "5e-5"}, "not the text"),
    ({k: v for k, v in LINEAR.items() if k != "n_rows"}, "n_rows: got 'nothing (the field is missing)'"),
    ({**LINEAR, "c0_s": 0, "c_prefill_tok_s": 0, "c_decode_tok_s": 0, "c_pair_s": 0, "c_ctx_s": 0},
     "predicts a positive iteration time"),
    ({**LINEAR, "extra_field": 1}, "extra_field"),
    ({"kind": "physical_iteration_fit", "model": "Llama-3-8B", "gpu": "A100-80GB", "tp": 1, "overhead_ms": 1.0,
      "eff_gemm_flop": 1.7, "eff_hbm": 0.8, "eff_attn_flop": 0.5, "per_seq_ms": 0.01, "decode_batch_knots": [1, 8],
      "decode_cost_ms": [0.1, 0.2], "n_rows": 9}, "eff_gemm_flop: got 1.7"),
    ({"kind": "physical_iteration_fit", "model": "Llama-3-8B", "gpu": "A100-80GB", "tp": 1, "overhead_ms": 1.0,
      "eff_gemm_flop": 0.7, "eff_hbm": 0.8, "eff_attn_flop": 0.5, "per_seq_ms": 0.01, "decode_batch_knots": [8, 1],
      "decode_cost_ms": [0.1], "n_rows": 9}, "strictly increasing"),
    ({"layers": {"A100-80GB": {"Llama-3-8B": {"0": {}}}}}, "allowed: a whole number in [1, 64]"),
    ({"layers": {}, "attention": [], "allreduce": {}}, "an empty one would silently give roofline defaults"),
    ({"allreduce": {"a100_dgx": {"2": {"num_workers": 2, "log2_bytes": [11, 12], "ms": [0.01, math.inf]}}}},
     "ms"),
])
def test_a_fit_file_is_checked_against_its_kinds_schema(tmp_path, doc, needle):
    with pytest.raises(ConfigError) as e:
        _load(tmp_path, doc)
    assert needle in str(e.value) and "fit.json" in str(e.value)


def test_valid_fit_files_of_every_kind_still_load(tmp_path):
    from tierserve.hardware.coefficients import DEFAULT_COEFFICIENTS
    assert _load(tmp_path, LINEAR).iteration_time(100, 100 * 50.0, 4, 400) > 0
    shipped = json.loads(DEFAULT_COEFFICIENTS.read_text())
    assert _load(tmp_path, shipped).iteration_time(100, 100 * 50.0, 4, 400) > 0


def _iterations(tmp_path: Path, rows: list[list], name: str = "log.csv") -> Path:
    return _write_csv(tmp_path / name, ITERATION_COLUMNS, rows)


def _good_rows() -> list[list]:
    rows = []
    for i in range(30):
        p, b = 64 * (i % 5), 8 * (i % 7)
        rows.append([p, b, b * 500, p * p / 2, 5 + 0.02 * p + 0.05 * b + 1e-4 * b * 500])
    return rows


@pytest.mark.parametrize("column, value, needle", [
    (0, -64, "is negative"),
    (1, -8, "is negative"),
    (2, -1, "is negative"),
    (1, 2.5, "not an integer"),
])
def test_calibration_refuses_negative_and_fractional_counts(tmp_path, column, value, needle):
    rows = _good_rows()
    rows[3][column] = value
    with pytest.raises(ProfileError, match=f"row 5.*{needle}|{needle}"):
        calibrate_from_iterations(_iterations(tmp_path, rows))


def test_calibration_refuses_a_log_of_identical_rows(tmp_path):
    with pytest.raises(ProfileError, match="only 1 distinct iteration"):
        calibrate_from_iterations(_iterations(tmp_path, [[128, 8, 4000, 8192, 12.5]] * 40))
    with pytest.raises(ProfileError, match="only 1 distinct iteration"):
        calibrate_from_iterations(_iterations(tmp_path, [[128, 8, 4000, 8192, 12.5]] * 40, "b.csv"),
                                  "Llama-3-8B", "A100-80GB", 1)


def test_calibration_refuses_a_log_faster_than_the_roofline(tmp_path):
    rows = [[p, b, b * 1000, p * p / 2, 1e-4 * (1 + p + b)] for p in (0, 512, 2048) for b in (0, 8, 32)]
    rows = [r for r in rows if r[0] or r[1]]
    with pytest.raises(ProfileError, match="faster than Llama-3-8B on A100-80GB at TP 1 can run"):
        calibrate_from_iterations(_iterations(tmp_path, rows), "Llama-3-8B", "A100-80GB", 1)


def _mlp_profile(tmp_path: Path, tp=1, tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048),
                 n_embd=4096) -> Path:
    header = (["num_tokens", "num_tensor_parallel_workers", "n_embd", "n_head", "n_kv_head", "n_expanded_embd"]
              + [f"time_stats.{o}.median" for o in GEMM_OPS + ELEMENTWISE_OPS])
    rows = [[t, tp, n_embd, 32, 8, 14336] + [0.01 + 1e-4 * t] * (len(GEMM_OPS) + len(ELEMENTWISE_OPS))
            for t in tokens]
    return _write_csv(tmp_path / "mlp.csv", header, rows)


@pytest.mark.parametrize("kw, needle", [
    ({"tp": 0}, "num_tensor_parallel_workers.*0 \\(allowed: a degree >= 1\\)"),
    ({"tp": -1}, "num_tensor_parallel_workers.*-1 \\(allowed: a degree >= 1\\)"),
    ({"tokens": (0, 1, 2, 4, 8, 16)}, "num_tokens.*row 2: 0 \\(allowed: a count >= 1\\)"),
    ({"n_embd": 8192}, "n_embd.*another geometry than Llama-3-8B"),
])
def test_a_broken_profile_folder_is_refused_with_the_reason(tmp_path, kw, needle):
    with pytest.raises(ProfileError, match=needle):
        fit_mlp_profile(_mlp_profile(tmp_path, **kw), "Llama-3-8B", "A100-80GB")


def test_calibrate_command_reports_a_broken_profile_folder_without_a_traceback(tmp_path):
    from typer.testing import CliRunner

    from tierserve.cli import app
    from tierserve.hardware.specs import get_gpu, get_model
    folder = tmp_path / "profiling" / "compute" / get_gpu("A100-80GB").profile_dir / get_model("Llama-3-8B").profile_dir
    folder.mkdir(parents=True)
    _mlp_profile(folder, tp=0)
    r = CliRunner().invoke(app, ["calibrate", "--profiles", str(tmp_path / "profiling"), "--out",
                                 str(tmp_path / "fit.json")])
    assert r.exit_code == 2 and "num_tensor_parallel_workers" in r.output
    assert not isinstance(r.exception, ZeroDivisionError) and not (tmp_path / "fit.json").exists()
