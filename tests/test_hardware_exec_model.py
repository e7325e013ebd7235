"""Execution-time model: physical bounds, the simulator's interface contract, speed-critical invariants."""
import numpy as np
import pytest

from tierserve.core.errors import ConfigError
from tierserve.hardware import build_execution_model, known_gpus, known_models, prefill_attention_pairs


def _configs():
    for m in known_models():
        for g in known_gpus():
            for tp in (1, 2, 4, 8):
                if m.num_q_heads % tp == 0 and m.num_kv_heads % tp == 0:
                    yield m, g, tp


@pytest.mark.parametrize("calibrated", [True, False])
def test_physical_bounds_every_config(calibrated):
    for m, g, tp in _configs():
        em = build_execution_model(m.name, g.name, tp, calibrated=calibrated)
        flops = 2.0 * m.num_layers * m.layer_params * 2048          # 2·params·tokens (LM head excluded)
        t = em.iteration_time(2048, prefill_attention_pairs(2048, 0), 0, 0)
        assert t >= flops / (g.peak_flops * tp), (m.name, g.name, tp)
        weight_read = m.num_layers * m.layer_params * m.dtype_bytes / tp / g.hbm_bytes_per_s
        for b in (1, 16, 64):
            assert em.decode_base_time(b) >= weight_read, (m.name, g.name, tp, b)
        full = build_execution_model(m.name, g.name, tp, calibrated=calibrated, include_lm_head=True, overhead_s=0.0)
        # every weight but the embedding table (a gather, not a full read) streams from HBM once per step
        all_weights = (m.param_bytes - m.embedding_params * m.dtype_bytes) / tp / g.hbm_bytes_per_s
        assert full.decode_base_time(1) >= all_weights, (m.name, g.name, tp)


def test_linear_in_decode_context_and_base_consistency():
    em = build_execution_model("llama-3-8b", "a100")
    for b in (1, 7, 64, 255, 20000):
        base = em.decode_base_time(b)
        assert em.iteration_time(0, 0, b, 0) == pytest.approx(base, rel=1e-12)
        for c in (0, 1000, 123_457, 10_000_000):
            assert em.iteration_time(0, 0, b, c) == pytest.approx(base + em.decode_context_coef_s * c, rel=1e-12)
    assert em.decode_context_coef_s > 0
    assert em.iteration_time(0, 0, 0, 0) == 0.0


def test_monotone_and_vectorised_agree():
    em = build_execution_model("Llama-2-70B", "h100", 4)
    p = np.array([0, 0, 128, 512, 2048, 20000, 512])
    pairs = np.array([prefill_attention_pairs(int(x), 1024) for x in p])
    b = np.array([1, 64, 0, 32, 8, 0, 30000])
    c = b * 1500
    got = em.predict_many(p, pairs, b, c)
    want = [em.iteration_time(int(p[i]), pairs[i], int(b[i]), int(c[i])) for i in range(len(p))]
    np.testing.assert_allclose(got, want, rtol=1e-9)
    ts = [em.iteration_time(n, prefill_attention_pairs(n, 0), 0, 0) for n in range(1, 20000, 97)]
    assert all(x <= y * 1.02 for x, y in zip(ts, ts[1:]))   # non-decreasing up to profile noise


def test_max_prefill_tokens_within():
    em = build_execution_model("llama-3-8b", "a100")
    b, c, ctx = 32, 32 * 1024, 256
    for slack in (0.02, 0.05, 0.2):
        p = em.max_prefill_tokens_within(slack, b, c, prefill_context=ctx)
        assert em.iteration_time(p, prefill_attention_pairs(p, ctx), b, c) <= slack
        assert em.iteration_time(p + 1, prefill_attention_pairs(p + 1, ctx), b, c) > slack
    assert em.max_prefill_tokens_within(1e-6, b, c) == 0
    assert em.max_prefill_tokens_within(100.0, b, c, hi=4096) == 4096


def test_tp_not_dividing_heads_and_unknown():
    with pytest.raises(ConfigError):
        build_execution_model("Llama-3-8B", "a100", 3)
    with pytest.raises(ConfigError):
        build_execution_model("nope", "a100", 1)


def test_lm_head_and_overhead_add_time():
    base = build_execution_model("llama-3-8b", "a100", include_lm_head=False, overhead_s=0.0)
    more = build_execution_model("llama-3-8b", "a100", include_lm_head=True, overhead_s=0.002)
    assert more.decode_base_time(8) > base.decode_base_time(8) + 0.002
    assert more.iteration_time(0, 0, 8, 800) - more.decode_base_time(8) == pytest.approx(
        more.decode_context_coef_s * 800)


def test_calibrated_and_roofline_same_ballpark():
    cal = build_execution_model("llama-3-8b", "a100")
    roof = build_execution_model("llama-3-8b", "a100", calibrated=False)
    for shape in ((2048, prefill_attention_pairs(2048, 0), 0, 0), (0, 0, 64, 64 * 1024)):
        assert 0.5 < roof.iteration_time(*shape) / cal.iteration_time(*shape) < 2.0
