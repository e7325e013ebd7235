"""Per-iteration execution time of one replica (model, GPU, TP), fast enough to call per simulated step.

t(P, pairs, B, C) = tok[P+B] + pre[P] + pair·pairs + dec[B] + ctx·C, where
  tok[T]  = layers·(GEMMs(T) + elementwise(T) + 2 all-reduces of T·hidden·dtype bytes) + overhead (+LM-head fixed part)
            (+ layers·KV write of T tokens in vidur_parity mode, see below)
  pre[P]  = layers·(prefill-attention launch + per-token Q/O traffic (+ KV writes of P tokens in physical mode))
  pair    = layers·seconds per causal (query, key) pair, pairs = Σ chunk·(context_before + chunk/2)
  dec[B]  = layers·(decode-attention launch + per-request cost (+ KV write of B tokens in physical mode))
  ctx     = layers·seconds per context token read by a decode (KV bytes / effective HBM bandwidth)
Tables hold every integer token count up to TABLE_TOKENS, so a scalar call is a few list lookups; past the
end they extrapolate linearly (compute-bound GEMMs are linear in tokens). t is exactly linear in C.

Two modes (`build_execution_model(mode=...)`):
  physical      KV-cache writes cost bytes / (HBM·eff) + a launch, the LM head is included and every non-empty
                iteration pays a per-iteration CPU/scheduling overhead (default DEFAULT_ITERATION_OVERHEAD_MS).
  vidur_parity  Vidur's predictor as profiled: the KV write is its `attn_kv_cache_save` model (FlashInfer's
                pre-Nov-2024 `append_paged_kv_cache`, fixed in its PRs #583/#588) as Vidur evaluates it: one
                random forest on num_tokens = max(prefill chunk, batch size) over decode and prefill rows
                together, queried with the batch's total tokens P + B. So the write is a function of P + B only
                (in tok[]): the mean profiled write at the nearest profiled count — about 1.7 ms at 512 tokens
                where prefill rows alone give 4.9 ms, decode-like ~0.1 ms at counts with no prefill row (e.g.
                500), prefill rows alone past 512 (0.5 µs per token-layer). No LM head, no overhead — for
                comparisons with Vidur only. Time is then not monotone in P everywhere (500 tokens can cost less
                than 480), as in Vidur.

The model builders: from the committed profile coefficients (coefficients.py), the pure roofline, or given
physical parameters or linear coefficients (what the calibrations fit). The loader is exec_model.py.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Sequence

import numpy as np

from tierserve.core.errors import ConfigError
from tierserve.hardware.coefficients import CoefficientStore, load_store
# The per-iteration part (compiled with the simulator's hot path), re-exported from here.
from tierserve.hardware.exec_runtime import ExecutionTimeModel, prefill_attention_pairs
from tierserve.hardware.fits import AllReduceFit, AttentionFit, LayerFit
from tierserve.hardware.roofline import (
    DEFAULT_EFF_BW,
    DEFAULT_EFF_FLOP,
    DEFAULT_LAUNCH_MS,
    ELEMENTWISE_OPS,
    GEMM_OPS,
    GemmFit,
    attn_flops_per_pair,
    default_elementwise,
    gemm_flops_bytes,
    kv_bytes_per_token_layer,
)
from tierserve.hardware.specs import GPUSpec, ModelSpec, get_gpu, get_model

TABLE_TOKENS = 16384
EXEC_MODES: tuple[str, ...] = ("physical", "vidur_parity")
# Per-iteration CPU/scheduling overhead of the physical mode. vLLM's V1 post (blog.vllm.ai, 2025-01-24) names
# scheduling, input preparation and detokenisation as the per-step CPU cost but publishes no per-step figure,
# and V0's 4-13 ms GPU bubbles per decode step (vllm-project/vllm#6854) are what V1's separate engine-core
# process removes; so the stated basis is the median `inter_batch_delay` (CPU gap between batches) over the
# 15 Sarathi-Serve Yi-34B/A100 measurements in shared/data/real_gpu (0.290 ms; range 0.05-0.68 ms).
DEFAULT_ITERATION_OVERHEAD_MS = 0.29
# A KV write reads the new K and V from the QKV output and stores them in the paged cache: 2x the KV bytes.
KV_WRITE_TRAFFIC = 2.0
# Roofline defaults for attention where no attention profile applies (FlashAttention-2 reaches ~50% of
# A100 peak in prefill; decode streams KV at ~75% of HBM bandwidth).
DEFAULT_EFF_ATTN_FLOP = 0.5
DEFAULT_EFF_ATTN_BW = 0.75
# A GEMM without a profile: the roofline at the default efficiencies, computed in whole waves of tiles.
ROOFLINE_GEMM = GemmFit(waves=True)


# ------------------------------------------------------------------------------------------------ builder


@dataclass(frozen=True, slots=True)
class AttentionTerms:
    """Per-layer attention costs (ms) for the target model/GPU/TP after rescaling."""

    p0: float
    p_tok: float
    p_pair: float
    d0: float
    d_req: float
    d_ctx: float
    save_knots: tuple[float, ...]
    save_ms: tuple[float, ...]
    save_req: float
    save_d0: float = 0.0                       # the decode write's fixed part, folded into d0
    pooled_knots: tuple[float, ...] = ()       # Vidur's pooled KV-write curve (vidur_parity; empty otherwise)
    pooled_ms: tuple[float, ...] = ()

    def save_prefill_ms(self, tokens: np.ndarray) -> np.ndarray:
        k, v = np.asarray(self.save_knots), np.asarray(self.save_ms)
        out = np.interp(tokens, k, v)
        slope = (v[-1] - v[-2]) / (k[-1] - k[-2])
        return np.where(tokens > k[-1], v[-1] + slope * (tokens - k[-1]), out)

    def save_pooled_ms(self, tokens: np.ndarray) -> np.ndarray:
        """Vidur's KV write of a batch of `tokens` total tokens: the pooled mean at the nearest profiled count
        (ties to the smaller, as a tree split `x <= midpoint` sends them), linear past the last count."""
        k, v = np.asarray(self.pooled_knots), np.asarray(self.pooled_ms)
        t = np.asarray(tokens, dtype=float)
        out = v[np.searchsorted((k[:-1] + k[1:]) * 0.5, t, side="left")]
        slope = (v[-1] - v[-2]) / (k[-1] - k[-2])
        return np.where(t > k[-1], v[-1] + slope * (t - k[-1]), out)


def roofline_attention(model: ModelSpec, gpu: GPUSpec, tp: int) -> AttentionTerms:
    """Attention from first principles: FLOPs/(peak·eff) per pair, bytes/(HBM·eff) per KV token."""
    kvb = kv_bytes_per_token_layer(model, tp)
    bw = gpu.hbm_bytes_per_s
    q_bytes = 2 * (model.num_q_heads // tp) * model.head_dim * model.dtype_bytes  # read Q, write O
    knots, save_ms, save_per_tok = physical_kv_write(model, gpu, tp)
    return AttentionTerms(
        p0=DEFAULT_LAUNCH_MS, p_tok=(q_bytes + kvb) / (bw * DEFAULT_EFF_ATTN_BW) * 1e3,
        p_pair=attn_flops_per_pair(model, tp) / (gpu.peak_flops * DEFAULT_EFF_ATTN_FLOP) * 1e3,
        d0=DEFAULT_LAUNCH_MS, d_req=q_bytes / (bw * DEFAULT_EFF_ATTN_BW) * 1e3,
        d_ctx=kvb / (bw * DEFAULT_EFF_ATTN_BW) * 1e3,
        save_knots=knots, save_ms=save_ms, save_req=save_per_tok,
    )


def physical_kv_write(model: ModelSpec, gpu: GPUSpec, tp: int, eff_bw: float = DEFAULT_EFF_BW,
                      launch_ms: float = DEFAULT_LAUNCH_MS) -> tuple[tuple[float, ...], tuple[float, ...], float]:
    """(knots, ms at knots, ms per decode token) of an HBM-bound KV write: launch + 2·KV bytes / (HBM·eff).

    Roofline (Williams et al. 2009) for a copy kernel; FlashInfer's fixed `append_paged_kv_cache` (PRs
    #583/#588, Nov 2024) runs near this bound, ~170x faster than the kernel Vidur profiled.
    """
    per_tok = KV_WRITE_TRAFFIC * kv_bytes_per_token_layer(model, tp) / (gpu.hbm_bytes_per_s * eff_bw) * 1e3
    return (0.0, float(TABLE_TOKENS)), (launch_ms, launch_ms + TABLE_TOKENS * per_tok), per_tok


def rescale_attention(a: AttentionFit, model: ModelSpec, gpu: GPUSpec, tp: int) -> AttentionTerms:
    """Carry a fitted attention profile to another geometry/GPU: keep launch costs and efficiencies,
    scale byte terms by KV/Q bytes and HBM bandwidth, FLOP terms by FLOPs per pair and peak."""
    ref_m, ref_g = get_model(a.ref_model), get_gpu(a.ref_gpu)
    bw_ratio = ref_g.hbm_bytes_per_s / gpu.hbm_bytes_per_s
    kv_ratio = kv_bytes_per_token_layer(model, tp) / kv_bytes_per_token_layer(ref_m, a.ref_tp) * bw_ratio
    q_ratio = (model.num_q_heads // tp) / (ref_m.num_q_heads // a.ref_tp) * bw_ratio
    exact = (kv_ratio == 1.0 and q_ratio == 1.0 and ref_g.name == gpu.name)
    p_pair = a.p_pair if exact else (
        attn_flops_per_pair(model, tp) / (gpu.peak_flops * a.eff_attn_flop) * 1e3 if a.eff_attn_flop
        else attn_flops_per_pair(model, tp) / (gpu.peak_flops * DEFAULT_EFF_ATTN_FLOP) * 1e3)
    if a.save_knots:
        # The profiled KV write moves ~4 KB per token-layer in ~0.5 µs (~8 GB/s, far below HBM bandwidth):
        # it is per-token overhead, not bytes, so it carries over per token, scaled by the GPU only.
        knots, save = a.save_knots, tuple(v * bw_ratio for v in a.save_ms)
        save_req = a.save_req * bw_ratio
        pooled_knots, pooled = a.pooled_save_tokens, tuple(v * bw_ratio for v in a.pooled_save_ms)
    else:
        rf = roofline_attention(model, gpu, tp)
        knots, save, save_req = rf.save_knots, rf.save_ms, rf.save_req
        pooled_knots, pooled = (), ()
    return AttentionTerms(a.p0, a.p_tok * q_ratio, p_pair, a.d0, a.d_req * q_ratio, a.d_ctx * kv_ratio,
                          knots, save, save_req, a.save_d0, pooled_knots, pooled)


def default_allreduce_ms(gpu: GPUSpec, tp: int, nbytes: np.ndarray) -> np.ndarray:
    """Ring all-reduce (Patarasuk & Yuan 2009): α + 2(n−1)/n · bytes / (NVLink·eff)."""
    return 0.02 + 2.0 * (tp - 1) / tp * nbytes / (gpu.nvlink_gbytes_s * 1e9 * 0.7) * 1e3


class _LayerCostBuilder:
    """Evaluates per-layer ms of each term over token counts 0…TABLE_TOKENS for one configuration."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int, store: CoefficientStore | None,
                 kv_write: str = "physical") -> None:
        self.m, self.g, self.tp = model, gpu, tp
        self.lm_eff_flop, self.lm_eff_bw = DEFAULT_EFF_FLOP, DEFAULT_EFF_BW
        self.notes: list[str] = []
        self.layer: LayerFit | None = None
        self.attn: AttentionTerms = roofline_attention(model, gpu, tp)
        self.ar: AllReduceFit | None = None
        if store is not None:
            self.layer, note = store.layer_fit(model, gpu, tp)
            self.notes.append(f"linear layers: {note}")
            afit, note = store.attention_fit(model, gpu, tp)
            if afit is not None:
                self.attn = rescale_attention(afit, model, gpu, tp)
                if kv_write != "physical" and not afit.save_knots:
                    # Vidur's profile for this geometry has no KV-write operator, so its predictor charges none
                    self.attn = replace(self.attn, save_knots=(0.0, float(TABLE_TOKENS)), save_ms=(0.0, 0.0),
                                        save_req=0.0, pooled_knots=(), pooled_ms=())
                    self.notes.append("KV write: none (the attention profile has no attn_kv_cache_save)")
            self.notes.append(f"attention: {note}")
            if tp > 1:
                self.ar, note = store.allreduce_fit(gpu, tp)
                self.notes.append(f"all-reduce: {note}")
        else:
            self.notes.append("roofline defaults (uncalibrated)")
        if kv_write == "physical":
            knots, save, per_tok = physical_kv_write(model, gpu, tp)
            self.attn = replace(self.attn, save_knots=knots, save_ms=save, save_req=per_tok,
                                pooled_knots=(), pooled_ms=())
            self.notes.append("KV write: HBM-bound (bytes / bandwidth + launch)")
        elif self.attn.pooled_knots:
            self.notes.append("KV write: Vidur's attn_kv_cache_save model (rows pooled by max(chunk, batch), "
                              "nearest profiled count of the batch's total tokens)")
        elif store is not None and self.attn.save_knots != roofline_attention(model, gpu, tp).save_knots:
            self.notes.append("KV write: prefill-row attn_kv_cache_save fit (coefficients without Vidur's pooled "
                              "curve; refit with scripts/fit_exec_model.py)")

    def linear_ms(self, tokens: np.ndarray) -> np.ndarray:
        out = np.zeros_like(tokens, dtype=float)
        for op in GEMM_OPS:
            fit = self.layer.gemm.get(op) if self.layer else None
            out += (fit or ROOFLINE_GEMM).ms(self.m, self.g, self.tp, op, tokens)
        for op in ELEMENTWISE_OPS:
            fit = self.layer.elementwise.get(op) if self.layer else None
            out += (fit or default_elementwise(self.m, self.g, self.tp, op)).ms(tokens)
        if self.tp > 1:
            nbytes = tokens * self.m.hidden * self.m.dtype_bytes
            one = self.ar.time_ms(nbytes) if self.ar else default_allreduce_ms(self.g, self.tp, nbytes)
            out += 2.0 * one   # after the O projection and after the MLP down projection
        return out

    def lm_head_ms(self) -> tuple[float, float]:
        """LM head over sampled tokens as (fixed, per token) ms: weight read, then FLOPs per token."""
        fl, by = gemm_flops_bytes(self.m, self.tp, "lm_head", np.array([0.0, 1.0]))
        fixed = by[0] / (self.g.hbm_bytes_per_s * self.lm_eff_bw) * 1e3 + DEFAULT_LAUNCH_MS
        per_tok = fl[1] / (self.g.peak_flops * self.lm_eff_flop) * 1e3
        return fixed, per_tok


def _assemble(name: str, b: _LayerCostBuilder, include_lm_head: bool, overhead_s: float,
              per_seq: np.ndarray | None = None) -> ExecutionTimeModel:
    n = np.arange(TABLE_TOKENS + 1, dtype=float)
    layers = b.m.num_layers
    a = b.attn
    nz = n > 0
    tok = np.where(nz, b.linear_ms(n) * layers * 1e-3 + overhead_s, 0.0)
    kvw = None
    if a.pooled_knots:
        # Vidur's KV write: by the batch's total tokens (in tok[P+B]), none in the prefill or per-decode terms
        kvw = np.where(nz, a.save_pooled_ms(n) * layers * 1e-3, 0.0)
        pre = np.where(nz, (a.p0 + a.p_tok * n) * layers * 1e-3, 0.0)
        dec = np.where(nz, (a.d0 - a.save_d0 + a.d_req * n) * layers * 1e-3, 0.0)
    else:
        pre = np.where(nz, (a.p0 + a.p_tok * n + a.save_prefill_ms(n)) * layers * 1e-3, 0.0)
        dec = np.where(nz, (a.d0 + (a.d_req + a.save_req) * n) * layers * 1e-3, 0.0)
    if per_seq is not None:   # the engine's own cost of n decode sequences (fitted), on top of the roofline
        dec = dec + per_seq
    notes = list(b.notes)
    if overhead_s:
        notes.append(f"per-iteration overhead {overhead_s * 1e3:.3f} ms")
    if include_lm_head:
        fixed, per_tok = b.lm_head_ms()
        tok = tok + np.where(nz, fixed * 1e-3, 0.0)
        pre = pre + np.where(nz, per_tok * 1e-3, 0.0)      # one sampled token per prefill (chunk end)
        dec = dec + per_tok * 1e-3 * n
        notes.append("LM head included (roofline)")
    return ExecutionTimeModel(name, tok, pre, dec, a.p_pair * layers * 1e-3, a.d_ctx * layers * 1e-3, notes,
                              kv_write_s=kvw)


@lru_cache(maxsize=64)
def _build_cached(model_name: str, gpu_name: str, tp: int, calibrated: bool, include_lm_head: bool,
                  overhead_s: float, coefficients: str | None, kv_write: str) -> ExecutionTimeModel:
    m, g = get_model(model_name), get_gpu(gpu_name)
    m.check_tp(tp)
    store = load_store(coefficients) if calibrated else None
    builder = _LayerCostBuilder(m, g, tp, store, kv_write)
    tag = "calibrated" if calibrated else "roofline"
    return _assemble(f"{m.name}/{g.name}/tp{tp}/{tag}/{kv_write}", builder, include_lm_head, overhead_s)


def check_mode(mode: str) -> str:
    if mode not in EXEC_MODES:
        raise ConfigError("exec_mode", mode, " or ".join(EXEC_MODES))
    return mode


def mode_defaults(mode: str) -> tuple[bool, float]:
    """(LM head included, per-iteration overhead in seconds) of a mode."""
    return (True, DEFAULT_ITERATION_OVERHEAD_MS * 1e-3) if check_mode(mode) == "physical" else (False, 0.0)


def build_execution_model(model: str, gpu: str, tp: int = 1, *, calibrated: bool = True, mode: str = "physical",
                          include_lm_head: bool | None = None, overhead_s: float | None = None,
                          coefficients: str | None = None) -> ExecutionTimeModel:
    """The execution-time model of one replica from profile coefficients; cached per configuration.

    calibrated=True uses the committed fitted coefficients (roofline defaults where none apply);
    calibrated=False is the pure roofline. `mode` sets the KV write and the defaults of `include_lm_head`
    and `overhead_s` (seconds per non-empty iteration); explicit values override them.
    """
    lm_default, oh_default = mode_defaults(mode)
    m, g = get_model(model), get_gpu(gpu)
    kv_write = "physical" if mode == "physical" else "vidur_profile"
    return _build_cached(m.name, g.name, int(tp), bool(calibrated),
                         lm_default if include_lm_head is None else bool(include_lm_head),
                         oh_default if overhead_s is None else float(overhead_s),
                         str(coefficients) if coefficients else None, kv_write)


def model_from_physical_parameters(name: str, model: str, gpu: str, tp: int, *, eff_gemm_flop: float,
                                   eff_hbm: float, eff_attn_flop: float, overhead_s: float, per_seq_s: float,
                                   decode_knots: Sequence[float] = (), decode_cost_s: Sequence[float] = ()
                                   ) -> ExecutionTimeModel:
    """Roofline of every operator with the given efficiencies, plus a per-iteration and a per-decode cost.

    GEMMs: max(FLOPs / (peak·eff_gemm_flop), bytes / (HBM·eff_hbm)); elementwise ops, KV reads/writes and the
    LM head's weight read at eff_hbm; prefill attention FLOPs at eff_attn_flop; all-reduce from the network
    profile. The engine's cost of B decode sequences is per_seq_s·B, or, given measured knots, piecewise
    linear through (decode_knots, decode_cost_s) from (0, 0), continuing at per_seq_s past the last knot.
    Used by `calibrate_from_iterations`.
    """
    m, g = get_model(model), get_gpu(gpu)
    m.check_tp(tp)
    store = load_store()
    b = _LayerCostBuilder(m, g, tp, None, "physical")
    b.notes = []
    if tp > 1:
        b.ar, note = store.allreduce_fit(g, tp)
        b.notes.append(f"all-reduce: {note}")
    b.lm_eff_flop, b.lm_eff_bw = eff_gemm_flop, eff_hbm
    b.layer = LayerFit({op: GemmFit(eff_gemm_flop, eff_hbm, DEFAULT_LAUNCH_MS, waves=True) for op in GEMM_OPS},
                       {op: default_elementwise(m, g, tp, op, eff_bw=eff_hbm) for op in ELEMENTWISE_OPS})
    kvb = kv_bytes_per_token_layer(m, tp)
    q_bytes = 2 * (m.num_q_heads // tp) * m.head_dim * m.dtype_bytes
    bw = g.hbm_bytes_per_s * eff_hbm
    knots, save, per_tok = physical_kv_write(m, g, tp, eff_hbm)
    b.attn = AttentionTerms(
        p0=DEFAULT_LAUNCH_MS, p_tok=(q_bytes + kvb) / bw * 1e3,
        p_pair=attn_flops_per_pair(m, tp) / (g.peak_flops * eff_attn_flop) * 1e3,
        d0=DEFAULT_LAUNCH_MS, d_req=q_bytes / bw * 1e3, d_ctx=kvb / bw * 1e3,
        save_knots=knots, save_ms=save, save_req=per_tok)
    n = np.arange(TABLE_TOKENS + 1, dtype=float)
    if len(decode_knots):
        k = np.concatenate([[0.0], np.asarray(decode_knots, dtype=float)])
        v = np.concatenate([[0.0], np.asarray(decode_cost_s, dtype=float)])
        seq = np.where(n <= k[-1], np.interp(n, k, v), v[-1] + per_seq_s * (n - k[-1]))
    else:
        seq = per_seq_s * n
    b.notes.append(f"fitted from measured iterations: GEMM {eff_gemm_flop:.3f} of peak, HBM {eff_hbm:.3f}, "
                   f"attention {eff_attn_flop:.3f}, overhead {overhead_s * 1e3:.3f} ms, "
                   f"{per_seq_s * 1e3:.3f} ms per decode" + (" (measured per batch size)" if len(decode_knots) else ""))
    return _assemble(name, b, True, overhead_s, per_seq=seq)


def model_from_linear_coefficients(name: str, c0_s: float, c_prefill_tok_s: float, c_decode_tok_s: float,
                                   c_pair_s: float, c_ctx_s: float) -> ExecutionTimeModel:
    """An ExecutionTimeModel of DESIGN.md's linear form t = c0 + c1·P + c2·B + c3·pairs + c4·C."""
    n = np.arange(TABLE_TOKENS + 1, dtype=float)
    nz = n > 0
    tok = np.where(nz, c0_s, 0.0)
    return ExecutionTimeModel(name, tok, c_prefill_tok_s * n, c_decode_tok_s * n, c_pair_s, c_ctx_s,
                              ["fitted from measured iterations"])



__all__ = [
    "ExecutionTimeModel", "build_execution_model", "prefill_attention_pairs", "model_from_linear_coefficients",
    "model_from_physical_parameters", "EXEC_MODES", "DEFAULT_ITERATION_OVERHEAD_MS", "TABLE_TOKENS",
]
