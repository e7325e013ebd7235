"""vidur_parity's KV write is Vidur's `attn_kv_cache_save` model: rows pooled by num_tokens = max(chunk, batch),
looked up at the nearest profiled count of the batch's total tokens; physical mode is untouched by it."""
import csv
import json

import numpy as np
import pytest

from tierserve.core.paths import shared_data
from tierserve.hardware.calibration import fit_attention_profile, pooled_kv_save
from tierserve.hardware.exec_model import AttentionTerms, build_execution_model, make_execution_model
from tierserve.hardware.exec_model import prefill_attention_pairs as pairs
from tierserve.hardware.coefficients import DEFAULT_COEFFICIENTS
from tierserve.hardware.specs import get_gpu

L3 = ("Llama-3-8B", "A100-80GB")
PREDICTIONS = shared_data("vidur", "vidur_predictions_llama3_8b_a100.csv")
PROFILE = shared_data("vidur", "profiling", "compute", "a100", "meta-llama", "Meta-Llama-3-8B",
                      "attention_PARTIAL_extract.csv")


def _vidur():
    return make_execution_model(*L3, mode="vidur_parity")


def _kv_write_ms(em, p, b):
    return em.breakdown(p, pairs(p, 0), b, 0)["kv_write"] * 1e3


@pytest.mark.skipif(PREDICTIONS is None, reason="../shared/data/vidur absent: Vidur's prediction table skipped")
def test_prefill_512_within_2pct_of_vidur():
    with open(PREDICTIONS, newline="") as f:
        row = next(r for r in csv.DictReader(f) if r["batch_description"] == "prefill_512")
    want = float(row["predicted_ms"])                    # 38.22 ms
    got = _vidur().iteration_time(512, pairs(512, 0), 0, 0) * 1e3
    assert got == pytest.approx(want, rel=0.02), (got, want)
    # the KV write itself: Vidur 1.74 ms, the prefill rows alone 4.9 ms
    assert _kv_write_ms(_vidur(), 512, 0) == pytest.approx(float(row["attn_kv_cache_save_ms"]), rel=0.05)


def test_500_token_batch_writes_like_decodes():
    """No prefill row has 500 (or 496/504) tokens, so the nearest profiled count holds decode rows only:
    ~0.004 ms/layer, i.e. ~0.13 ms for 32 layers, against ~1.7 ms at 512."""
    em = _vidur()
    at500 = _kv_write_ms(em, 500, 0)
    assert at500 == pytest.approx(32 * 0.004, rel=0.25)
    assert at500 < _kv_write_ms(em, 512, 0) / 10
    # keyed on the batch's total tokens: 500 prefill tokens, 500 decodes or any split write the same
    assert _kv_write_ms(em, 0, 500) == at500 == _kv_write_ms(em, 468, 32)
    # and 480 prefill tokens + 32 decodes pay 512's write
    assert _kv_write_ms(em, 480, 32) == _kv_write_ms(em, 512, 0)


def test_pooled_lookup_is_nearest_count_and_linear_past_the_end():
    a = AttentionTerms(0, 0, 0, 0, 0, 0, (0.0, 1.0), (0.0, 1.0), 0.0,
                       pooled_knots=(1.0, 10.0, 20.0), pooled_ms=(1.0, 2.0, 4.0))
    x = np.array([1, 5, 5.5, 6, 15, 16, 20, 30])
    assert a.save_pooled_ms(x).tolist() == [1.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, 6.0]   # ties go to the smaller
    tokens = np.array([64, 64, 512, 512, 512, 1024])
    ms = np.array([0.02, 0.03, 0.152, 0.004, 0.004, 0.53])
    k, v = pooled_kv_save(tokens, ms)
    assert k == (64.0, 512.0, 1024.0) and v == pytest.approx((0.025, 0.16 / 3, 0.53))


@pytest.mark.skipif(PROFILE is None, reason="../shared/data/vidur profiles absent: pooled-curve refit skipped")
def test_committed_curve_is_the_profile_pooled():
    fit, _ = fit_attention_profile(PROFILE, "Llama-3-8B", "a100")
    committed = json.loads(DEFAULT_COEFFICIENTS.read_text())["attention"][0]
    assert tuple(committed["pooled_save_tokens"]) == fit.pooled_save_tokens
    assert tuple(committed["pooled_save_ms"]) == fit.pooled_save_ms
    by_count = dict(zip(fit.pooled_save_tokens, fit.pooled_save_ms))
    assert by_count[512.0] == pytest.approx((0.152 + 0.004 + 0.004) / 3)     # one prefill row, two decode rows
    assert by_count[128.0] == pytest.approx(0.003)                          # decode rows only


def test_vidur_parity_stays_linear_in_decode_context():
    em = _vidur()
    for p, b in ((0, 16), (0, 200), (512, 32), (100, 7)):
        base = em.iteration_time(p, pairs(p, 300), b, 0)
        for c in (1, 1234, 10 ** 6):
            assert em.iteration_time(p, pairs(p, 300), b, c) == pytest.approx(
                base + em.decode_context_coef_s * c, rel=1e-12)
    assert em.iteration_time(0, 0, 64, 0) == em.decode_base_time(64)
    br = em.breakdown(480, pairs(480, 700), 32, 32 * 900)
    assert sum(br.values()) == pytest.approx(em.iteration_time(480, pairs(480, 700), 32, 32 * 900), rel=1e-12)
    many = em.predict_many([480, 0, 500], [pairs(480, 700), 0.0, pairs(500, 0)], [32, 64, 0], [32 * 900, 640, 0])
    assert many.tolist() == pytest.approx([em.iteration_time(480, pairs(480, 700), 32, 32 * 900),
                                           em.iteration_time(0, 0, 64, 640), em.iteration_time(500, pairs(500, 0), 0, 0)],
                                          rel=1e-12)


def test_curve_carried_to_other_gpus_by_bandwidth():
    a100, h100 = get_gpu("A100-80GB"), get_gpu("H100-80GB")
    h = make_execution_model("Llama-3-8B", "H100-80GB", mode="vidur_parity")
    for n in (128, 500, 512, 2048):
        assert _kv_write_ms(h, n, 0) == pytest.approx(
            _kv_write_ms(_vidur(), n, 0) * a100.hbm_bytes_per_s / h100.hbm_bytes_per_s, rel=1e-9)


def test_coefficients_without_pooled_curve_keep_the_prefill_row_fit(tmp_path):
    d = json.loads(DEFAULT_COEFFICIENTS.read_text())
    for a in d["attention"]:
        a.pop("pooled_save_tokens", None), a.pop("pooled_save_ms", None)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(d))
    em = build_execution_model(*L3, mode="vidur_parity", coefficients=str(path))
    assert any("prefill-row" in n for n in em.notes)
    assert em.breakdown(512, 0, 0, 0)["kv_write"] == 0.0
    assert em.iteration_time(512, pairs(512, 0), 0, 0) > _vidur().iteration_time(512, pairs(512, 0), 0, 0) + 2e-3


# Physical mode pinned (iteration_time in seconds, default overhead and LM head); last changed when the profile
# fits came to pass through every profiled token count (issue 27). Any change here is a change to physical mode.
PHYSICAL_PINNED = {
    ("Llama-3-8B", "A100-80GB", 1): [0.037624169828137446, 0.0502261408968809, 0.010657276165350185,
                                     0.03729407611245271, 0.15432382997535923, 0.037260679149566905],
    ("Llama-3-8B", "H100-80GB", 1): [0.014726823488184168, 0.021539673084974488, 0.006810983803180204,
                                     0.02165794492763446, 0.047405493819109884, 0.01497346009222835],
    ("Llama-2-70B", "A100-80GB", 4): [0.11507448912990281, 0.13351316732586474, 0.03489110170064495,
                                      0.058612638553647636, 0.3975445489169785, 0.11640464752597791],
}
SHAPES = [(512, pairs(512, 0), 0, 0), (512, pairs(512, 1536), 32, 32 * 1024), (0, 0.0, 1, 512),
          (0, 0.0, 128, 128 * 2048), (2048, pairs(2048, 0), 0, 0), (500, pairs(500, 0), 0, 0)]


@pytest.mark.parametrize("config", sorted(PHYSICAL_PINNED))
def test_physical_mode_unchanged(config):
    em = make_execution_model(*config)
    got = [em.iteration_time(*s) for s in SHAPES]
    assert got == pytest.approx(PHYSICAL_PINNED[config], rel=1e-9)
    assert em.breakdown(512, pairs(512, 0), 32, 0)["kv_write"] == 0.0
