"""Calibration: bad inputs fail clearly; iteration-log fits recover coefficients; accuracy vs Vidur."""
import csv
from pathlib import Path

import numpy as np
import pytest

from tierserve.core.errors import ConfigError
from tierserve.core.paths import shared_data
from tierserve.hardware.calibration import (
    ProfileError, calibrate_from_iterations, fit_allreduce, fit_attention_profile, fit_mlp_profile,
)
from tierserve.hardware.coefficients import DEFAULT_COEFFICIENTS, load_store


def _write(path: Path, header: list[str], rows: list[list]) -> Path:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def test_profile_missing_column_names_file_and_column(tmp_path):
    p = _write(tmp_path / "mlp.csv", ["num_tokens", "num_tensor_parallel_workers", "n_embd"], [[1, 1, 4096]])
    with pytest.raises(ProfileError) as e:
        fit_mlp_profile(p, "llama-3-8b", "a100")
    assert "mlp.csv" in str(e.value) and "time_stats.attn_pre_proj.median" in str(e.value)


def test_profile_empty_and_absent(tmp_path):
    p = _write(tmp_path / "all_reduce.csv", ["time_stats.all_reduce.median", "num_workers", "size",
                                             "devices_per_node"], [])
    with pytest.raises(ProfileError, match="no data rows"):
        fit_allreduce(p)
    with pytest.raises(ProfileError, match="not found"):
        fit_attention_profile(tmp_path / "missing.csv", "llama-3-8b", "a100")


def test_profile_counts_written_as_floats_are_ints_and_fractions_are_refused(tmp_path):
    header = ["time_stats.all_reduce.median", "num_workers", "size", "devices_per_node"]
    rows = [[0.01 * (1 + k), "2.0", 2 ** (10 + k), "2.0"] for k in range(6)]
    fits, _ = fit_allreduce(_write(tmp_path / "all_reduce.csv", header, rows))
    assert list(fits) == [2]                                   # 2.0 read as the group size 2
    rows[3][1] = "2.5"
    with pytest.raises(ProfileError, match=r"all_reduce2\.csv, column 'num_workers'.*row 5.*'2\.5' is not an integer"):
        fit_allreduce(_write(tmp_path / "all_reduce2.csv", header, rows))
    it = ["prefill_tokens", "decode_count", "decode_context_sum", "measured_ms", "prefill_attn_pairs"]
    with pytest.raises(ProfileError, match=r"decode_count.*row 3.*'4\.5'"):
        calibrate_from_iterations(_write(tmp_path / "it.csv", it, [[0, 4, 40, 5.0, 0], [0, "4.5", 40, 5.0, 0]] * 3))


def test_iterations_bad_input(tmp_path):
    p = _write(tmp_path / "it.csv", ["prefill_tokens", "decode_count", "measured_ms"], [[1, 2, 3]])
    with pytest.raises(ProfileError, match="decode_context_sum"):
        calibrate_from_iterations(p)
    p = _write(tmp_path / "it2.csv", ["prefill_tokens", "decode_count", "decode_context_sum", "measured_ms"],
               [[1, 2, 3, 4]] * 6)
    with pytest.raises(ProfileError, match="prefill_attn_pairs"):
        calibrate_from_iterations(p)
    p = _write(tmp_path / "it3.csv", ["prefill_tokens", "decode_count", "decode_context_sum", "measured_ms",
                                      "prefill_context"], [])
    with pytest.raises(ProfileError, match="no data rows"):
        calibrate_from_iterations(p)


def test_iterations_fit_recovers_linear_model(tmp_path):
    rng = np.random.default_rng(0)
    true = (8e-3, 3e-5, 2e-5, 1e-9, 5e-8)
    rows = []
    for _ in range(200):
        pt, ctx, b = int(rng.integers(0, 2048)), int(rng.integers(0, 4096)), int(rng.integers(0, 128))
        c = b * int(rng.integers(100, 4000))
        pairs = pt * (ctx + pt / 2)
        t = true[0] + true[1] * pt + true[2] * b + true[3] * pairs + true[4] * c
        rows.append([pt, b, c, ctx, t * 1e3 * (1 + rng.normal(0, 0.005))])
    p = _write(tmp_path / "log.csv", ["prefill_tokens", "decode_count", "decode_context_sum", "prefill_context",
                                      "measured_ms"], rows)
    fit = calibrate_from_iterations(p)
    assert fit.mape_test < 2.0
    em = fit.to_model()
    assert em.iteration_time(1024, 1024 * 512, 16, 16000) == pytest.approx(
        true[0] + true[1] * 1024 + true[2] * 16 + true[3] * 1024 * 512 + true[4] * 16000, rel=0.03)


def test_mean_objective_is_right_on_the_mean_of_skewed_steps(tmp_path):
    # steps with a right-skewed multiplicative noise (shared-CPU engine): the relative fit sits below the mean
    rng = np.random.default_rng(1)
    rows, true_sum = [], 0.0
    for _ in range(400):
        pt, b = int(rng.integers(0, 256)), int(rng.integers(1, 8))
        c = b * int(rng.integers(16, 300))
        t = 2e-3 + 5e-6 * pt + 4e-4 * b + 1e-8 * c
        rows.append([pt, b, c, 0, t * 1e3 * rng.lognormal(0.0, 0.6)])
    p = _write(tmp_path / "log.csv", ["prefill_tokens", "decode_count", "decode_context_sum", "prefill_context",
                                      "measured_ms"], rows)
    measured_total = sum(r[4] for r in rows) * 1e-3
    def predicted_total(fit):
        em = fit.to_model()
        return sum(em.iteration_time(r[0], r[0] * r[0] / 2, r[1], r[2]) for r in rows)
    mean_fit, rel_fit = calibrate_from_iterations(p, objective="mean"), calibrate_from_iterations(p)
    assert predicted_total(mean_fit) == pytest.approx(measured_total, rel=0.05)
    assert predicted_total(rel_fit) < 0.85 * measured_total
    with pytest.raises(ConfigError, match="objective"):
        calibrate_from_iterations(p, objective="median")


def test_committed_coefficients_round_trip(tmp_path):
    assert DEFAULT_COEFFICIENTS.is_file()
    store = load_store()
    assert "A100-80GB" in store.layers and store.attention and store.allreduce
    out = tmp_path / "c.json"
    store.save(out)
    again = load_store(str(out))
    assert again.layers["A100-80GB"]["Llama-3-8B"][1] == store.layers["A100-80GB"]["Llama-3-8B"][1]


@pytest.mark.skipif(shared_data("vidur", "vidur_predictions_llama3_8b_a100.csv") is None,
                    reason="shared/data/vidur absent: Vidur comparison skipped")
def test_accuracy_vs_vidur_predictions():
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "validate_exec_model", Path(__file__).resolve().parents[1] / "benchmarks" / "validate_exec_model.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.compare()
    assert len(rows) == 20
    mape = sum(abs(r["err_pct"]) for r in rows) / len(rows)
    assert mape <= 5.0
    assert max(abs(r["err_pct"]) for r in rows) < 25.0


@pytest.mark.skipif(shared_data("vidur", "profiling", "compute", "a100", "meta-llama", "Meta-Llama-3-8B") is None,
                    reason="shared/data/vidur profiles absent")
def test_refit_from_real_profile_matches_heldout():
    d = shared_data("vidur", "profiling", "compute", "a100", "meta-llama", "Meta-Llama-3-8B")
    fits, reports = fit_mlp_profile(d / "mlp.csv")
    assert set(fits) == {1, 2, 4, 8}
    gemm = [r.mape_test for r in reports if r.op.endswith("_proj")]
    assert np.mean(gemm) < 8.0


def test_llama2_70b_tp2_linear_layers_within_3pct_of_the_profile_at_every_count():
    """The committed fit passes through every profiled token count (128, every parity scenario's batch cap,
    was 16% low when corrections sat at powers of two only)."""
    import csv as _csv

    from tierserve.hardware.roofline import ELEMENTWISE_OPS, GEMM_OPS
    from tierserve.hardware.specs import get_gpu, get_model
    d = shared_data("vidur", "profiling", "compute", "a100", "meta-llama", "Llama-2-70b-hf")
    if d is None:
        pytest.skip("../shared/data/vidur/profiling absent")
    lf = load_store().layers["A100-80GB"]["Llama-2-70B"][2]
    m, g = get_model("Llama-2-70B"), get_gpu("A100-80GB")
    with open(d / "mlp.csv", newline="") as f:
        rows = [r for r in _csv.DictReader(f) if r["num_tensor_parallel_workers"] == "2"]
    t = np.array([float(r["num_tokens"]) for r in rows])
    prof = sum(np.array([float(r[f"time_stats.{o}.median"]) for r in rows]) for o in GEMM_OPS + ELEMENTWISE_OPS)
    fit = (sum(lf.gemm[o].ms(m, g, 2, o, t) for o in GEMM_OPS)
           + sum(lf.elementwise[o].ms(t) for o in ELEMENTWISE_OPS))
    err = np.abs(fit / prof - 1)
    assert len(t) > 250 and 128 in t
    assert err.max() <= 0.03, (t[np.argmax(err)], err.max())
