"""Per-layer roofline costs of a decoder layer's operators, for one TP shard.

Every GEMM is y[T×N] = x[T×K] · W[K×N]: FLOPs = 2·T·K·N, bytes = (K·N + T·K + T·N)·dtype (weights read
once, activations in and out). Time = max(FLOPs / (peak·eff_flop), bytes / (HBM·eff_bw)) + launch
overhead (Williams et al., "Roofline", CACM 2009). Attention: causal prefill over pairs p = Σ chunk·(ctx +
chunk/2) does 4·d·p FLOPs per query head (QKᵀ and PV, 2 FLOPs per MAC); a decode reads its whole KV,
2·kv_heads·head_dim·dtype bytes per context token per layer.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tierserve.hardware.specs import GPUSpec, ModelSpec

GEMM_OPS: tuple[str, ...] = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
ELEMENTWISE_OPS: tuple[str, ...] = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")

# Roofline defaults, used where no profile exists: typical cuBLAS/FlashAttention fractions of peak on
# A100/H100 (the fitted values in data/*.json land near these), and a ~5 µs kernel launch.
DEFAULT_EFF_FLOP = 0.70
DEFAULT_EFF_BW = 0.80
DEFAULT_LAUNCH_MS = 0.005


def gemm_shape(model: ModelSpec, tp: int, op: str) -> tuple[int, int]:
    """(K, N) of one TP shard's weight for a GEMM op (column-parallel QKV/up, row-parallel O/down)."""
    h = model.hidden
    if op == "attn_pre_proj":
        return h, (model.q_dim + 2 * model.kv_dim) // tp
    if op == "attn_post_proj":
        return model.q_dim // tp, h
    if op == "mlp_up_proj":
        return h, (2 if model.gated_mlp else 1) * model.intermediate // tp
    if op == "mlp_down_proj":
        return model.intermediate // tp, h
    if op == "lm_head":
        return h, model.vocab // tp
    raise KeyError(op)


def gemm_flops_bytes(model: ModelSpec, tp: int, op: str, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    k, n = gemm_shape(model, tp, op)
    t = np.asarray(tokens, dtype=float)
    return 2.0 * t * k * n, (k * n + t * (k + n)) * model.dtype_bytes


# Output tile edge of cuBLAS/CUTLASS fp16 tensor-core GEMMs (128x128), for every token count: on Sarathi-Serve's
# Yi-34B A100 iterations, tiles as short as the input (16 or 64 rows below 128 tokens) fit worse held out
# (leave-shapes-out MAPE 8.75% / 8.60% against 7.16%), the one choice this data set made (docs/fidelity.md).
WAVE_TILE = 128


def wave_flops(model: ModelSpec, gpu: GPUSpec, tp: int, op: str, tokens: np.ndarray) -> np.ndarray:
    """FLOPs the GPU spends on a GEMM when every SM computes whole WAVE_TILE² output tiles in waves: a wave
    that is not full still takes a full wave's time. At 512 tokens Yi-34B's O projection (N = 7,168) has
    4 x 56 = 224 tiles on 108 SMs: 3 waves, 69% busy; at 2,048 tokens 896 tiles, 9 waves, 92%."""
    k, n = gemm_shape(model, tp, op)
    t = np.asarray(tokens, dtype=float)
    tiles = np.ceil(t / WAVE_TILE) * math.ceil(n / WAVE_TILE)
    waves = np.ceil(tiles / gpu.num_sms)
    return waves * gpu.num_sms * 2.0 * WAVE_TILE * WAVE_TILE * k


@dataclass(frozen=True, slots=True)
class GemmFit:
    """Fitted roofline of one GEMM: efficiencies, launch overhead, and a smooth residual correction.

    `corr_log2t`/`corr_factor` are knots of a multiplicative correction over log2(tokens) that absorbs
    tile/wave quantisation the two-line roofline cannot express; empty means none.
    """

    eff_flop: float = DEFAULT_EFF_FLOP
    eff_bw: float = DEFAULT_EFF_BW
    overhead_ms: float = DEFAULT_LAUNCH_MS
    corr_log2t: tuple[float, ...] = ()
    corr_factor: tuple[float, ...] = ()
    tile_tokens: int = 1   # wave quantisation: compute runs on whole tiles of this many tokens
    # Roofline without a profile: compute runs in whole waves of WAVE_TILE x WAVE_TILE output tiles, one per SM
    # (tile and wave quantisation, NVIDIA's "Matrix Multiplication Background" guide). A profile fit leaves it
    # off: its measured times, and so its correction knots, already hold the GPU's own quantisation.
    waves: bool = False

    def raw_ms(self, model: ModelSpec, gpu: GPUSpec, tp: int, op: str, tokens: np.ndarray) -> np.ndarray:
        t = np.asarray(tokens, dtype=float)
        if self.waves:
            flops = wave_flops(model, gpu, tp, op, t)
        else:
            flops, _ = gemm_flops_bytes(model, tp, op, np.ceil(t / self.tile_tokens) * self.tile_tokens)
        _, nbytes = gemm_flops_bytes(model, tp, op, t)
        t_flop = flops / (gpu.peak_flops * self.eff_flop) * 1e3
        t_mem = nbytes / (gpu.hbm_bytes_per_s * self.eff_bw) * 1e3
        return np.maximum(t_flop, t_mem) + self.overhead_ms

    def ms(self, model: ModelSpec, gpu: GPUSpec, tp: int, op: str, tokens: np.ndarray) -> np.ndarray:
        out = self.raw_ms(model, gpu, tp, op, tokens)
        if self.corr_log2t:
            lt = np.log2(np.maximum(np.asarray(tokens, dtype=float), 1.0))
            out = out * np.interp(lt, self.corr_log2t, self.corr_factor)
        return out


@dataclass(frozen=True, slots=True)
class LinearFit:
    """t = a + b·x (ms); used for memory-bound elementwise ops, attention terms and KV writes."""

    a_ms: float
    b_ms: float

    def ms(self, x: np.ndarray) -> np.ndarray:
        return self.a_ms + self.b_ms * np.asarray(x, dtype=float)


def elementwise_bytes_per_token(model: ModelSpec, tp: int, op: str) -> float:
    """HBM bytes each elementwise op moves per token (reads + writes)."""
    h, d = model.hidden, model.dtype_bytes
    if op in ("input_layernorm", "post_attention_layernorm"):
        return 2 * h * d
    if op == "attn_rope":
        return 2 * (model.q_dim + model.kv_dim) // tp * d
    if op == "mlp_act":
        return 3 * model.intermediate // tp * d
    if op == "add":
        return 3 * h * d
    raise KeyError(op)


def default_elementwise(model: ModelSpec, gpu: GPUSpec, tp: int, op: str, eff_bw: float = 0.5) -> LinearFit:
    """Roofline default for a memory-bound elementwise op: launch + bytes / (HBM·eff)."""
    per_tok = elementwise_bytes_per_token(model, tp, op) / (gpu.hbm_bytes_per_s * eff_bw) * 1e3
    return LinearFit(DEFAULT_LAUNCH_MS, per_tok)


def attn_flops_per_pair(model: ModelSpec, tp: int) -> float:
    """QKᵀ and PV for one (query, key) pair over this shard's query heads: 2 GEMMs × 2 FLOPs × d."""
    return 4.0 * (model.num_q_heads // tp) * model.head_dim


def kv_bytes_per_token_layer(model: ModelSpec, tp: int) -> float:
    return 2.0 * (model.num_kv_heads // tp) * model.head_dim * model.dtype_bytes
