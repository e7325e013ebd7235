"""Execution-model modes: physical by default (HBM-bound KV write, LM head, per-iteration overhead), Vidur parity
as stated, the factory's errors, and the chunk-size ordering the KV-write artefact used to reverse."""
import math

import pytest

from tierserve.core.errors import ConfigError
from tierserve.hardware.exec_model import (
    DEFAULT_ITERATION_OVERHEAD_MS, build_execution_model, make_execution_model, prefill_attention_pairs,
)
from tierserve.hardware.memory import kv_capacity_tokens
from tierserve.hardware.roofline import kv_bytes_per_token_layer
from tierserve.hardware.specs import engine_defaults, get_gpu, get_model, known_gpus, known_models


def _fitting_configs():
    """Every model/GPU at the smallest TP whose KV cache holds 16k tokens (as benchmarks/chunk_size_cost.py)."""
    for m in known_models():
        for g in known_gpus():
            for tp in (1, 2, 4, 8):
                if m.num_q_heads % tp or m.num_kv_heads % tp:
                    continue
                try:
                    if kv_capacity_tokens(m, g, tp) >= 16384:
                        yield m, g, tp
                        break
                except ConfigError:
                    continue


def _per_token(em, chunk, ctx=0):
    return em.iteration_time(chunk, prefill_attention_pairs(chunk, ctx), 0, 0) / chunk


def test_every_model_gpu_has_a_fitting_tp():
    assert len(list(_fitting_configs())) == len(known_models()) * len(known_gpus())


def test_kv_write_near_hbm_bound_in_physical_mode_and_profiled_in_parity():
    from tierserve.hardware.coefficients import load_store
    from tierserve.hardware.exec_model import _LayerCostBuilder
    for m, g, tp in _fitting_configs():
        bound = 2 * kv_bytes_per_token_layer(m, tp) / g.hbm_bytes_per_s * 1e3   # ms per token-layer, read + write
        a = _LayerCostBuilder(m, g, tp, load_store(), "physical").attn
        phys_tok = float(a.save_prefill_ms(2048.0) - a.save_prefill_ms(1024.0)) / 1024
        for per_tok in (phys_tok, a.save_req):
            assert bound <= per_tok < 2 * bound, (m.name, g.name, tp, per_tok / bound)
        assert not a.pooled_knots
        v = _LayerCostBuilder(m, g, tp, load_store(), "vidur_profile").attn
        afit, _ = load_store().attention_fit(m, g, tp)
        if not afit.save_knots:
            # Vidur's attention profile for this geometry (Llama-2-70B's legacy table) has no KV-write operator:
            # parity charges none, as Vidur's predictor does
            assert not v.pooled_knots and v.save_req == 0.0 and float(v.save_prefill_ms(2048.0)) == 0.0
            continue
        # vidur_parity: Vidur's pooled curve by total tokens (past 512 tokens only prefill rows are pooled)
        vid_tok = float(v.save_pooled_ms(2048.0) - v.save_pooled_ms(1024.0)) / 1024
        assert vid_tok > 25 * bound, (m.name, g.name, tp)
        # and the assembled models differ by exactly the write term (everything else is shared)
        phys = build_execution_model(m.name, g.name, tp, mode="physical", include_lm_head=False, overhead_s=0.0)
        vid = build_execution_model(m.name, g.name, tp, mode="vidur_parity")

        def write_and_prefill(em, n):
            br = em.breakdown(n, 0, 0, 0)
            return br["prefill_fixed"] + br["kv_write"]
        d = [write_and_prefill(em, 2048) - write_and_prefill(em, 1024) for em in (vid, phys)]
        want = (vid_tok - phys_tok) * 1024 * m.num_layers * 1e-3
        assert d[0] - d[1] == pytest.approx(want, rel=1e-6)


def test_physical_512_not_cheaper_than_2048_beyond_attention():
    """Context 0: the profiled KV write made 512-token chunks 10.7% cheaper per token than 2,048 (Llama-3-8B/A100).
    Physically only causal attention (4x the pairs per token at 2,048) can favour the small chunk; with the default
    overhead that leaves 512 at most 3% cheaper anywhere, and never cheaper than in the Vidur-parity mode."""
    worst = math.inf
    for m, g, tp in _fitting_configs():
        phys = make_execution_model(m.name, g.name, tp)
        vid = make_execution_model(m.name, g.name, tp, mode="vidur_parity")
        r_phys = _per_token(phys, 512) / _per_token(phys, 2048)
        r_vid = _per_token(vid, 512) / _per_token(vid, 2048)
        assert r_phys >= 0.97, (m.name, g.name, tp, r_phys)
        assert r_phys > r_vid - 1e-9, (m.name, g.name, tp, r_phys, r_vid)
        worst = min(worst, r_phys)
    # Llama-3-8B/A100 is 512-cheaper because its profile is: the GEMMs at exactly 512 tokens take 1.94 µs per
    # token-layer against 2.0-2.2 at 480-544 and 2,048 (a kernel cuBLAS keeps for that shape); the fit follows it
    l3 = make_execution_model("Llama-3-8B", "A100-80GB")
    no_attn = [l3.breakdown(n, 0, 0, 0)["token_linear"] / n for n in (496, 512, 528, 2048)]
    assert no_attn[1] < min(no_attn[0], no_attn[2], no_attn[3])
    assert worst < 1.0   # the attention effect is real somewhere; if this fails, re-read the docstring above


def test_physical_512_dearer_with_an_engine_overhead():
    """With a per-iteration overhead of 2 ms (above the largest break-even chunk_size_cost.py reports, 1.7 ms), the
    ordering the real A100 data show holds for every model and GPU."""
    for m, g, tp in _fitting_configs():
        em = make_execution_model(m.name, g.name, tp, iteration_overhead_ms=2.0)
        assert _per_token(em, 512) >= _per_token(em, 2048), (m.name, g.name, tp)


def test_lm_head_included_by_default_and_not_in_parity():
    m = get_model("Llama-3-8B")
    phys = make_execution_model("Llama-3-8B", "A100-80GB", iteration_overhead_ms=0)
    no_head = build_execution_model("Llama-3-8B", "A100-80GB", include_lm_head=False, overhead_s=0.0)
    head_read = m.vocab * m.hidden * m.dtype_bytes / get_gpu("A100-80GB").hbm_bytes_per_s
    diff = phys.decode_base_time(8) - no_head.decode_base_time(8)
    assert head_read <= diff < 2 * head_read
    vid = make_execution_model("Llama-3-8B", "A100-80GB", mode="vidur_parity")
    vid_ref = build_execution_model("Llama-3-8B", "A100-80GB", mode="vidur_parity", include_lm_head=False,
                                    overhead_s=0.0)
    assert vid.decode_base_time(8) == vid_ref.decode_base_time(8)
    assert vid.decode_base_time(8) < phys.decode_base_time(8) - head_read


def test_overhead_in_decode_base_and_iteration_time():
    a = make_execution_model("Llama-3-8B", "H100-80GB", iteration_overhead_ms=0.0)
    b = make_execution_model("Llama-3-8B", "H100-80GB", iteration_overhead_ms=3.0)
    d = make_execution_model("Llama-3-8B", "H100-80GB")
    for n in (1, 32, 300):
        assert b.decode_base_time(n) - a.decode_base_time(n) == pytest.approx(3e-3, rel=1e-9)
        assert d.decode_base_time(n) - a.decode_base_time(n) == pytest.approx(DEFAULT_ITERATION_OVERHEAD_MS * 1e-3)
    shape = (512, prefill_attention_pairs(512, 1024), 16, 16 * 900)
    assert b.iteration_time(*shape) - a.iteration_time(*shape) == pytest.approx(3e-3, rel=1e-9)
    assert b.iteration_time(0, 0, 0, 0) == 0.0
    for c in (0, 1234, 10 ** 6):   # still exactly linear in decode context
        assert b.iteration_time(0, 0, 16, c) == pytest.approx(b.decode_base_time(16) + b.decode_context_coef_s * c,
                                                              rel=1e-12)


@pytest.mark.parametrize("kwargs,field", [
    ({"mode": "fast"}, "exec_mode"),
    ({"iteration_overhead_ms": -1.0}, "iteration_overhead_ms"),
    ({"iteration_overhead_ms": float("nan")}, "iteration_overhead_ms"),
    ({"iteration_overhead_ms": "2"}, "iteration_overhead_ms"),
])
def test_bad_mode_or_overhead_names_field_and_value(kwargs, field):
    with pytest.raises(ConfigError) as e:
        make_execution_model("Llama-3-8B", "A100-80GB", **kwargs)
    assert e.value.field == field and repr(next(iter(kwargs.values())))[:3] in str(e.value)


def test_engine_defaults_follow_vllm():
    assert engine_defaults("A100-80GB") == (2048, 256)
    assert engine_defaults("A100-80GB-PCIe") == (2048, 256)
    assert engine_defaults("H100-80GB") == (8192, 1024)
    assert engine_defaults("H200") == (8192, 1024)


def test_new_specs():
    yi = get_model("01-ai/Yi-34B")
    assert (yi.num_layers, yi.hidden, yi.num_q_heads, yi.num_kv_heads, yi.intermediate, yi.vocab) == (
        60, 7168, 56, 8, 20480, 64000)
    assert 33e9 < yi.param_count < 35.5e9
    pcie = get_gpu("a100-pcie")
    assert (pcie.hbm_gbytes_s, pcie.peak_tflops, pcie.network_dir) == (1935.0, 312.0, "a100_pairwise_nvlink")
