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
    ns = range(1, 20000, 97)
    ts = [em.iteration_time(n, prefill_attention_pairs(n, 0), 0, 0) for n in ns]
    roof = build_execution_model("Llama-2-70B", "h100", 4, calibrated=False)
    tr = [roof.iteration_time(n, prefill_attention_pairs(n, 0), 0, 0) for n in ns]
    assert all(x <= y for x, y in zip(tr, tr[1:]))          # the roofline never gets cheaper with more tokens
    # the profile fit follows the profile at every count, so it dips where the profile does (cuBLAS picks
    # another kernel: Llama-2-70B/H100/TP4 GEMMs take 0.40 ms at 392-416 tokens, 0.33 ms at 424-512), no deeper
    drops = [x / y for x, y in zip(ts, ts[1:])]
    assert max(drops) <= _largest_profile_drop("h100", "meta-llama/Llama-2-70b-hf", 4) * 1.02


def _largest_profile_drop(gpu_dir: str, model_dir: str, tp: int) -> float:
    """max over token counts a < b of GEMM time(a) / time(b) in the Vidur profile (1.0 when it is absent)."""
    import csv

    from tierserve.core.paths import shared_data
    from tierserve.hardware.roofline import GEMM_OPS
    d = shared_data("vidur", "profiling", "compute", gpu_dir, *model_dir.split("/"))
    if d is None:
        return 1.0 + 1e9     # without the profile only the roofline's order is checked
    with open(d / "mlp.csv", newline="") as f:
        rows = sorted((float(r["num_tokens"]), sum(float(r[f"time_stats.{o}.median"]) for o in GEMM_OPS))
                      for r in csv.DictReader(f) if int(float(r["num_tensor_parallel_workers"])) == tp)
    best, top = 1.0, 0.0
    for _, t in rows:
        top = max(top, t)
        best = max(best, top / t)
    return best


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


def test_roofline_gemms_run_in_whole_waves_of_tiles():
    """Tile and wave quantisation: Yi-34B's O projection at 512 tokens is 224 tiles of 128x128 on 108 SMs, three
    waves with 69% of the SMs busy; at 2,048 tokens 896 tiles in nine waves, 92%."""
    from tierserve.hardware.roofline import gemm_flops_bytes, wave_flops
    from tierserve.hardware.specs import get_gpu, get_model
    m, g = get_model("Yi-34B"), get_gpu("A100-80GB")
    busy = [gemm_flops_bytes(m, 1, "attn_post_proj", np.array([n]))[0][0]
            / wave_flops(m, g, 1, "attn_post_proj", np.array([n]))[0] for n in (512, 2048)]
    assert busy == pytest.approx([224 / 324, 896 / 972])
    em = build_execution_model("Yi-34B", "A100-80GB", 2)     # no profile: the roofline
    per_tok = [em.iteration_time(n, prefill_attention_pairs(n, 0), 0, 0) / n for n in (512, 2048)]
    assert per_tok[0] > per_tok[1]
