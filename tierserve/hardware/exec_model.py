"""Per-iteration execution time of one replica (model, GPU, TP), fast enough to call per simulated step.

t(P, pairs, B, C) = tok[P+B] + pre[P] + pair·pairs + dec[B] + ctx·C, where
  tok[T]  = layers·(GEMMs(T) + elementwise(T) + 2 all-reduces of T·hidden·dtype bytes) + overhead (+LM-head fixed part)
  pre[P]  = layers·(prefill-attention launch + per-token Q/O traffic + KV writes of P tokens)
  pair    = layers·seconds per causal (query, key) pair, pairs = Σ chunk·(context_before + chunk/2)
  dec[B]  = layers·(decode-attention launch + per-request cost + KV write of B tokens)
  ctx     = layers·seconds per context token read by a decode (KV bytes / effective HBM bandwidth)
Tables hold every integer token count up to TABLE_TOKENS, so a scalar call is a few list lookups; past the
end they extrapolate linearly (compute-bound GEMMs are linear in tokens). t is exactly linear in C.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Sequence

import numpy as np

from tierserve.core.errors import ConfigError
from tierserve.hardware.calibration import AllReduceFit, AttentionFit, GemmFit, LayerFit
from tierserve.hardware.coefficients import CoefficientStore, load_store
from tierserve.hardware.roofline import (
    DEFAULT_EFF_BW,
    DEFAULT_EFF_FLOP,
    DEFAULT_LAUNCH_MS,
    ELEMENTWISE_OPS,
    GEMM_OPS,
    attn_flops_per_pair,
    default_elementwise,
    gemm_flops_bytes,
    kv_bytes_per_token_layer,
)
from tierserve.hardware.specs import GPUSpec, ModelSpec, get_gpu, get_model

TABLE_TOKENS = 16384
# Roofline defaults for attention where no attention profile applies (FlashAttention-2 reaches ~50% of
# A100 peak in prefill; decode streams KV at ~75% of HBM bandwidth).
DEFAULT_EFF_ATTN_FLOP = 0.5
DEFAULT_EFF_ATTN_BW = 0.75


def prefill_attention_pairs(chunk: int, context_before: int) -> float:
    """Causal (query, key) pairs of a prefill chunk after `context_before` cached tokens: chunk·(ctx + chunk/2)."""
    return chunk * (context_before + chunk * 0.5)


class _Table:
    """f(n) for integer n ≥ 0: a list up to its end, linear extrapolation beyond; f(0) = 0."""

    __slots__ = ("values", "array", "last", "end", "slope")

    def __init__(self, values: np.ndarray) -> None:
        self.array = np.asarray(values, dtype=float)
        self.values: list[float] = self.array.tolist()
        self.end = len(self.values) - 1
        self.last = self.values[-1]
        self.slope = (self.values[-1] - self.values[-65]) / 64.0   # average over the last 64 steps

    def __call__(self, n: int) -> float:
        if n <= self.end:
            return self.values[n]
        return self.last + self.slope * (n - self.end)

    def many(self, n: np.ndarray) -> np.ndarray:
        c = np.minimum(n, self.end)
        return self.array[c] + self.slope * (n - c)


class ExecutionTimeModel:
    """Iteration time in seconds of the whole model (all layers) for one batch shape."""

    def __init__(self, name: str, token_s: np.ndarray, prefill_s: np.ndarray, decode_s: np.ndarray,
                 pair_coef_s: float, decode_context_coef_s: float, notes: Sequence[str] = ()) -> None:
        for label, arr in (("token_s", token_s), ("prefill_s", prefill_s), ("decode_s", decode_s)):
            if len(arr) < 66 or arr[0] != 0.0:
                raise ConfigError(label, len(arr), "a table of ≥ 66 entries starting at 0.0")
        self.name = name
        self.notes = tuple(notes)
        self._tok = _Table(token_s)
        self._pre = _Table(prefill_s)
        self._dec = _Table(decode_s)
        self.pair_coef_s = float(pair_coef_s)
        self.decode_context_coef_s = float(decode_context_coef_s)
        n = min(self._tok.end, self._dec.end)
        self._base = (self._tok.array[: n + 1] + self._dec.array[: n + 1]).tolist()

    def __repr__(self) -> str:
        return f"ExecutionTimeModel({self.name!r})"

    def decode_base_time(self, decode_count: int) -> float:
        """Seconds for B decodes with zero context: iteration_time(0, 0, B, 0)."""
        if decode_count < len(self._base):
            return self._base[decode_count]
        return self._tok(decode_count) + self._dec(decode_count)

    def iteration_time(self, prefill_tokens: int, prefill_attn_pairs: float, decode_count: int,
                       decode_context_sum: int) -> float:
        if not prefill_tokens:
            b = self._base
            base = b[decode_count] if decode_count < len(b) else self._tok(decode_count) + self._dec(decode_count)
            return base + self.decode_context_coef_s * decode_context_sum
        t = self._tok(prefill_tokens + decode_count) + self._pre(prefill_tokens) + self.pair_coef_s * prefill_attn_pairs
        if decode_count:
            t += self._dec(decode_count) + self.decode_context_coef_s * decode_context_sum
        return t

    def predict_many(self, prefill_tokens, prefill_attn_pairs, decode_count, decode_context_sum) -> np.ndarray:
        p = np.asarray(prefill_tokens, dtype=np.int64)
        b = np.asarray(decode_count, dtype=np.int64)
        return (self._tok.many(p + b) + self._pre.many(p) + self._dec.many(b)
                + self.pair_coef_s * np.asarray(prefill_attn_pairs, dtype=float)
                + self.decode_context_coef_s * np.asarray(decode_context_sum, dtype=float))

    def max_prefill_tokens_within(self, slack_s: float, decode_count: int, decode_context_sum: int,
                                  prefill_context: int = 0, lo: int = 0, hi: int = 8192) -> int:
        """Largest prefill chunk p in [lo, hi] whose iteration fits in `slack_s` (time is monotone in p).

        Returns `lo` when even `lo` does not fit (0 = run no prefill this iteration).
        """
        def fits(p: int) -> bool:
            return self.iteration_time(p, p * (prefill_context + p * 0.5), decode_count, decode_context_sum) <= slack_s

        if hi <= lo or not fits(lo + 1):
            return lo
        if fits(hi):
            return hi
        good, bad = lo + 1, hi
        while bad - good > 1:
            mid = (good + bad) >> 1
            if fits(mid):
                good = mid
            else:
                bad = mid
        return good

    def breakdown(self, prefill_tokens: int, prefill_attn_pairs: float, decode_count: int,
                  decode_context_sum: int) -> dict[str, float]:
        """Seconds by term, for reports (same sum as iteration_time)."""
        p, b = prefill_tokens, decode_count
        return {
            "token_linear": self._tok(p + b) if p + b else 0.0,
            "prefill_fixed": self._pre(p) if p else 0.0,
            "prefill_pairs": self.pair_coef_s * prefill_attn_pairs if p else 0.0,
            "decode_fixed": self._dec(b) if b else 0.0,
            "decode_context": self.decode_context_coef_s * decode_context_sum,
        }


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

    def save_prefill_ms(self, tokens: np.ndarray) -> np.ndarray:
        k, v = np.asarray(self.save_knots), np.asarray(self.save_ms)
        out = np.interp(tokens, k, v)
        slope = (v[-1] - v[-2]) / (k[-1] - k[-2])
        return np.where(tokens > k[-1], v[-1] + slope * (tokens - k[-1]), out)


def roofline_attention(model: ModelSpec, gpu: GPUSpec, tp: int) -> AttentionTerms:
    """Attention from first principles: FLOPs/(peak·eff) per pair, bytes/(HBM·eff) per KV token."""
    kvb = kv_bytes_per_token_layer(model, tp)
    bw = gpu.hbm_bytes_per_s
    q_bytes = 2 * (model.num_q_heads // tp) * model.head_dim * model.dtype_bytes  # read Q, write O
    save_per_tok = kvb / (bw * 0.5) * 1e3
    return AttentionTerms(
        p0=DEFAULT_LAUNCH_MS, p_tok=(q_bytes + kvb) / (bw * DEFAULT_EFF_ATTN_BW) * 1e3,
        p_pair=attn_flops_per_pair(model, tp) / (gpu.peak_flops * DEFAULT_EFF_ATTN_FLOP) * 1e3,
        d0=DEFAULT_LAUNCH_MS, d_req=q_bytes / (bw * DEFAULT_EFF_ATTN_BW) * 1e3,
        d_ctx=kvb / (bw * DEFAULT_EFF_ATTN_BW) * 1e3,
        save_knots=(0.0, 16384.0), save_ms=(DEFAULT_LAUNCH_MS, DEFAULT_LAUNCH_MS + 16384 * save_per_tok),
        save_req=save_per_tok,
    )


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
    else:
        rf = roofline_attention(model, gpu, tp)
        knots, save, save_req = rf.save_knots, rf.save_ms, rf.save_req
    return AttentionTerms(a.p0, a.p_tok * q_ratio, p_pair, a.d0, a.d_req * q_ratio, a.d_ctx * kv_ratio,
                          knots, save, save_req)


def default_allreduce_ms(gpu: GPUSpec, tp: int, nbytes: np.ndarray) -> np.ndarray:
    """Ring all-reduce (Patarasuk & Yuan 2009): α + 2(n−1)/n · bytes / (NVLink·eff)."""
    return 0.02 + 2.0 * (tp - 1) / tp * nbytes / (gpu.nvlink_gbytes_s * 1e9 * 0.7) * 1e3


class _LayerCostBuilder:
    """Evaluates per-layer ms of each term over token counts 0…TABLE_TOKENS for one configuration."""

    def __init__(self, model: ModelSpec, gpu: GPUSpec, tp: int, store: CoefficientStore | None) -> None:
        self.m, self.g, self.tp = model, gpu, tp
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
                ref = store.reference_attention()
                if ref is not None and not afit.save_knots and ref.save_knots:
                    # exact-geometry profile without KV-write timings: take those from the reference fit
                    self.attn = _with_save(self.attn, rescale_attention(ref, model, gpu, tp))
            self.notes.append(f"attention: {note}")
            if tp > 1:
                self.ar, note = store.allreduce_fit(gpu, tp)
                self.notes.append(f"all-reduce: {note}")
        else:
            self.notes.append("roofline defaults (uncalibrated)")

    def linear_ms(self, tokens: np.ndarray) -> np.ndarray:
        out = np.zeros_like(tokens, dtype=float)
        for op in GEMM_OPS:
            fit = self.layer.gemm.get(op) if self.layer else None
            out += (fit or GemmFit()).ms(self.m, self.g, self.tp, op, tokens)
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
        fixed = by[0] / (self.g.hbm_bytes_per_s * DEFAULT_EFF_BW) * 1e3 + DEFAULT_LAUNCH_MS
        per_tok = fl[1] / (self.g.peak_flops * DEFAULT_EFF_FLOP) * 1e3
        return fixed, per_tok


def _with_save(a: AttentionTerms, ref: AttentionTerms) -> AttentionTerms:
    return AttentionTerms(a.p0, a.p_tok, a.p_pair, a.d0, a.d_req, a.d_ctx, ref.save_knots, ref.save_ms, ref.save_req)


def _assemble(name: str, b: _LayerCostBuilder, include_lm_head: bool, overhead_s: float) -> ExecutionTimeModel:
    n = np.arange(TABLE_TOKENS + 1, dtype=float)
    layers = b.m.num_layers
    a = b.attn
    nz = n > 0
    tok = np.where(nz, b.linear_ms(n) * layers * 1e-3 + overhead_s, 0.0)
    pre = np.where(nz, (a.p0 + a.p_tok * n + a.save_prefill_ms(n)) * layers * 1e-3, 0.0)
    dec = np.where(nz, (a.d0 + (a.d_req + a.save_req) * n) * layers * 1e-3, 0.0)
    notes = list(b.notes)
    if include_lm_head:
        fixed, per_tok = b.lm_head_ms()
        tok = tok + np.where(nz, fixed * 1e-3, 0.0)
        pre = pre + np.where(nz, per_tok * 1e-3, 0.0)      # one sampled token per prefill (chunk end)
        dec = dec + per_tok * 1e-3 * n
        notes.append("LM head included (roofline)")
    return ExecutionTimeModel(name, tok, pre, dec, a.p_pair * layers * 1e-3, a.d_ctx * layers * 1e-3, notes)


@lru_cache(maxsize=64)
def _build_cached(model_name: str, gpu_name: str, tp: int, calibrated: bool, include_lm_head: bool,
                  overhead_s: float, coefficients: str | None) -> ExecutionTimeModel:
    m, g = get_model(model_name), get_gpu(gpu_name)
    m.check_tp(tp)
    store = load_store(coefficients) if calibrated else None
    builder = _LayerCostBuilder(m, g, tp, store)
    tag = "calibrated" if calibrated else "roofline"
    return _assemble(f"{m.name}/{g.name}/tp{tp}/{tag}", builder, include_lm_head, overhead_s)


def build_execution_model(model: str, gpu: str, tp: int = 1, *, calibrated: bool = True,
                          include_lm_head: bool = False, overhead_s: float = 0.0,
                          coefficients: str | None = None) -> ExecutionTimeModel:
    """The execution-time model of one replica; cached per configuration.

    calibrated=True uses the committed fitted coefficients (roofline defaults where none apply);
    calibrated=False is the pure roofline. Like Vidur's predictions, the default excludes the LM head,
    sampling and CPU overheads; `include_lm_head` and `overhead_s` (per non-empty iteration) add them.
    """
    m, g = get_model(model), get_gpu(gpu)
    return _build_cached(m.name, g.name, int(tp), bool(calibrated), bool(include_lm_head), float(overhead_s),
                         str(coefficients) if coefficients else None)


def load_execution_model(path: str, model: str, gpu: str, tp: int = 1) -> ExecutionTimeModel:
    """The model `tierserve calibrate --out FILE` wrote: a coefficient store (from profiles) or a linear
    fit of measured iterations, told apart by their keys."""
    import json
    from pathlib import Path

    from tierserve.core.files import read_mapping
    data = read_mapping(path, "exec_model_file", json.loads, (ValueError,), "JSON")
    if "c_ctx_s" in data:
        from tierserve.hardware.calibration import IterationFit
        fields = IterationFit.__dataclass_fields__
        return IterationFit(**{k: v for k, v in data.items() if k in fields}).to_model(Path(path).stem)
    return build_execution_model(model, gpu, tp, coefficients=str(path))


def model_from_linear_coefficients(name: str, c0_s: float, c_prefill_tok_s: float, c_decode_tok_s: float,
                                   c_pair_s: float, c_ctx_s: float) -> ExecutionTimeModel:
    """An ExecutionTimeModel of DESIGN.md's linear form t = c0 + c1·P + c2·B + c3·pairs + c4·C."""
    n = np.arange(TABLE_TOKENS + 1, dtype=float)
    nz = n > 0
    tok = np.where(nz, c0_s, 0.0)
    return ExecutionTimeModel(name, tok, c_prefill_tok_s * n, c_decode_tok_s * n, c_pair_s, c_ctx_s,
                              ["fitted from measured iterations"])


__all__ = [
    "ExecutionTimeModel", "build_execution_model", "load_execution_model", "prefill_attention_pairs",
    "model_from_linear_coefficients",
    "TABLE_TOKENS",
]
