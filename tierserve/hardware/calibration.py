"""Fit execution-time coefficients from Vidur-format operator profiles or from measured iteration logs.

Everything here is csv + numpy. Profiles are per-layer, per-TP-shard medians in ms (see the Vidur README in
shared/data/vidur). Each fit is checked on a held-out 20% of rows (fixed seed) and the error reported.
"""
from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable

import numpy as np

from tierserve.core.errors import ConfigError, TierserveError
from tierserve.hardware.roofline import (
    ELEMENTWISE_OPS,
    GEMM_OPS,
    GemmFit,
    LinearFit,
    attn_flops_per_pair,
    gemm_flops_bytes,
    kv_bytes_per_token_layer,
)
from tierserve.hardware.specs import GPUSpec, ModelSpec, get_gpu, get_model, known_gpus, known_models

HOLDOUT_FRACTION = 0.2
_SEED = 1234


class ProfileError(TierserveError, ValueError):
    """A profile or iteration log that cannot be fitted; names the file and the column."""

    def __init__(self, source: str | Path, column: str | None, problem: str) -> None:
        self.source, self.column = str(source), column
        where = f"{source}" + (f", column {column!r}" if column else "")
        super().__init__(f"{where}: {problem}")


# ---------------------------------------------------------------------------------------------- reading


def read_rows(path: str | Path, required: Iterable[str]) -> list[dict[str, str]]:
    """Rows of a CSV as dicts; error naming the file/column when it is missing, lacks a column or is empty."""
    from tierserve.core.files import read_csv_table  # the input layer: UTF-8, no duplicate columns or ragged rows
    p = Path(path)
    if not p.is_file():
        raise ProfileError(p, None, "file not found")
    table = read_csv_table(p, max_rows=None, allow_no_rows=True)
    for col in required:
        if col not in table.header:
            raise ProfileError(p, col, f"missing required column (header has {len(table.header)} columns)")
    if not table.rows:
        raise ProfileError(p, None, "no data rows")
    return [dict(zip(table.header, r)) for r in table.rows]


def column(rows: list[dict[str, str]], name: str, source: str | Path) -> np.ndarray:
    """A numeric column; blank cells become NaN, anything else unparsable is an error naming the column."""
    out = np.empty(len(rows))
    for i, r in enumerate(rows):
        v = r.get(name, "")
        if v is None or v == "":
            out[i] = math.nan
            continue
        try:
            if "_" in v:                  # float() reads 1_000; a profile cell must be a plain number
                raise ValueError(v)
            out[i] = float(v)
        except ValueError:
            raise ProfileError(source, name, f"row {i + 2}: {v!r} is not a number") from None
    return out


def holdout_mask(n: int) -> np.ndarray:
    """True for the held-out rows (fixed seed, so reports are reproducible)."""
    rng = np.random.default_rng(_SEED)
    return rng.random(n) < HOLDOUT_FRACTION


def mape(pred: np.ndarray, meas: np.ndarray) -> float:
    m = meas > 0
    return float(np.mean(np.abs(pred[m] - meas[m]) / meas[m]) * 100.0) if m.any() else math.nan


# ---------------------------------------------------------------------------------------------- fitting


def fit_gemm(model: ModelSpec, gpu: GPUSpec, tp: int, op: str, tokens: np.ndarray, ms: np.ndarray,
             correct: bool = True) -> GemmFit:
    """Grid-search the roofline's two efficiencies and launch overhead on log error, then knot corrections."""
    _, nbytes = gemm_flops_bytes(model, tp, op, tokens)
    effs = np.linspace(0.15, 1.0, 52)
    t_mem = nbytes[None, :] / (gpu.hbm_bytes_per_s * effs[:, None]) * 1e3
    best = (math.inf, 0.7, 0.8, 0.0, 1)
    logm = np.log(ms)
    for tile in (1, 64, 128):
        flops, _ = gemm_flops_bytes(model, tp, op, np.ceil(tokens / tile) * tile)
        t_flop = flops[None, :] / (gpu.peak_flops * effs[:, None]) * 1e3   # [eff, row]
        for oh in (0.0, 0.002, 0.004, 0.006, 0.01, 0.015):
            pred = np.maximum(t_flop[:, None, :], t_mem[None, :, :]) + oh         # [ef, eb, row]
            err = np.mean(np.abs(np.log(pred) - logm), axis=2)
            i, j = np.unravel_index(int(np.argmin(err)), err.shape)
            if err[i, j] < best[0]:
                best = (float(err[i, j]), float(effs[i]), float(effs[j]), oh, tile)
    fit = GemmFit(best[1], best[2], best[3], tile_tokens=best[4])
    if not correct:
        return fit
    ratio = ms / fit.raw_ms(model, gpu, tp, op, tokens)
    lt = np.log2(np.maximum(tokens, 1.0))
    knots = np.arange(0.0, math.ceil(lt.max()) + 1.0)
    factors = np.full(len(knots), np.nan)
    for i, k in enumerate(knots):
        near = np.abs(lt - k) <= 0.5
        if near.any():
            factors[i] = float(np.median(ratio[near]))
    have = np.isfinite(factors)   # knots without rows take their neighbours' interpolated factor
    factors = np.interp(knots, knots[have], factors[have])
    return GemmFit(fit.eff_flop, fit.eff_bw, fit.overhead_ms, tuple(knots.tolist()), tuple(factors.tolist()),
                   fit.tile_tokens)


def fit_linear(x: np.ndarray, ms: np.ndarray) -> LinearFit:
    """Least squares on relative error (weights 1/t), intercept and slope clipped at 0."""
    w = 1.0 / np.maximum(ms, 1e-6)
    a_mat = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    coef, *_ = np.linalg.lstsq(a_mat, ms * w, rcond=None)
    return LinearFit(max(float(coef[0]), 0.0), max(float(coef[1]), 0.0))


def fit_nonneg(features: np.ndarray, ms: np.ndarray, relative: bool = True) -> np.ndarray:
    """Least squares — on relative error, or plain (`relative=False`: unbiased on the mean, which a simulator
    summing iteration times needs when times are skewed) — with columns whose coefficient goes negative
    dropped (tiny NNLS)."""
    w = 1.0 / np.maximum(ms, 1e-6) if relative else np.ones_like(ms)
    active = list(range(features.shape[1]))
    coef = np.zeros(features.shape[1])
    while active:
        sol, *_ = np.linalg.lstsq(features[:, active] * w[:, None], ms * w, rcond=None)
        if (sol >= 0).all():
            coef[active] = sol
            break
        active.pop(int(np.argmin(sol)))
    return coef


@dataclass(slots=True)
class FitReport:
    """Held-out error of one operator fit."""

    source: str
    op: str
    key: str          # e.g. "Llama-3-8B/A100-80GB/tp1"
    n_train: int
    n_test: int
    mape_test: float
    mape_train: float


@dataclass(slots=True)
class LayerFit:
    """All non-attention operator fits of one (model, GPU, TP)."""

    gemm: dict[str, GemmFit] = field(default_factory=dict)
    elementwise: dict[str, LinearFit] = field(default_factory=dict)


def fit_mlp_profile(path: str | Path, model: ModelSpec | str | None = None,
                    gpu: GPUSpec | str | None = None) -> tuple[dict[int, LayerFit], list[FitReport]]:
    """Fit every GEMM and elementwise op of a Vidur `mlp.csv`, per TP degree, with held-out errors."""
    p = Path(path)
    ops = GEMM_OPS + ELEMENTWISE_OPS
    rows = read_rows(p, ["num_tokens", "num_tensor_parallel_workers", "n_embd"]
                     + [f"time_stats.{o}.median" for o in ops])
    m = get_model(model) if model is not None else _model_from_profile(rows, p)
    g = get_gpu(gpu) if gpu is not None else _gpu_from_path(p)
    tokens_all = column(rows, "num_tokens", p)
    tp_all = column(rows, "num_tensor_parallel_workers", p).astype(int)
    fits: dict[int, LayerFit] = {}
    reports: list[FitReport] = []
    for tp in sorted(set(tp_all.tolist())):
        if m.num_q_heads % tp or m.num_kv_heads % tp:
            continue
        sel = tp_all == tp
        tokens = tokens_all[sel]
        test = holdout_mask(len(tokens))
        lf = LayerFit()
        key = f"{m.name}/{g.name}/tp{tp}"
        for op in ops:
            ms = column(rows, f"time_stats.{op}.median", p)[sel]
            ok = np.isfinite(ms) & (ms > 0)
            tr, te = ok & ~test, ok & test
            if tr.sum() < 3:
                raise ProfileError(p, f"time_stats.{op}.median", f"fewer than 3 usable rows for tp={tp}")
            if op in GEMM_OPS:
                fit = fit_gemm(m, g, tp, op, tokens[tr], ms[tr])
                lf.gemm[op] = fit
                pred = fit.ms(m, g, tp, op, tokens)
            else:
                lfit = fit_linear(tokens[tr], ms[tr])
                lf.elementwise[op] = lfit
                pred = lfit.ms(tokens)
            reports.append(FitReport(str(p), op, key, int(tr.sum()), int(te.sum()),
                                     mape(pred[te], ms[te]), mape(pred[tr], ms[tr])))
        fits[tp] = lf
    return fits, reports


def _model_from_profile(rows: list[dict[str, str]], p: Path) -> ModelSpec:
    """Match the profile's geometry, or its folder name, to a known model."""
    for m in known_models():
        if m.profile_dir and str(p.parent).endswith(m.profile_dir):
            return m
    r = rows[0]
    for m in known_models():
        if (str(m.hidden), str(m.num_q_heads), str(m.num_kv_heads), str(m.intermediate)) == (
                r.get("n_embd"), r.get("n_head"), r.get("n_kv_head"), r.get("n_expanded_embd")):
            return m
    raise ProfileError(p, "n_embd", "geometry matches no known model; pass model= explicitly")


def _gpu_from_path(p: Path) -> GPUSpec:
    parts = [s.lower() for s in p.parts]
    for g in known_gpus():
        if g.profile_dir and g.profile_dir in parts:
            return g
    raise ProfileError(p, None, "cannot tell the GPU from the path; pass gpu= explicitly")


# --------------------------------------------------------------------------------------------- attention


@dataclass(slots=True)
class AttentionFit:
    """Per-layer attention costs of one geometry (ms), from an attention profile.

    prefill = p0 + p_tok·chunk + p_pair·pairs; decode = d0 + d_req·B + d_ctx·Σctx;
    KV write = piecewise-linear in prefill tokens (knots) + save_req·B for decodes, with the decode write's fixed
    part (save_d0) folded into d0. Vidur's own KV-write predictor is kept as well: `pooled_save_tokens/_ms`, the
    mean of `attn_kv_cache_save` over all rows (decode and prefill) at each num_tokens = max(chunk, batch size),
    which is what its random forest on that one feature predicts (see `pooled_kv_save`).
    """

    p0: float
    p_tok: float
    p_pair: float
    d0: float
    d_req: float
    d_ctx: float
    save_knots: tuple[float, ...] = ()
    save_ms: tuple[float, ...] = ()
    save_req: float = 0.0
    save_d0: float = 0.0
    pooled_save_tokens: tuple[float, ...] = ()
    pooled_save_ms: tuple[float, ...] = ()
    # reference geometry + GPU, so the terms can be rescaled to other models/GPUs
    ref_model: str = ""
    ref_gpu: str = ""
    ref_tp: int = 1
    eff_attn_flop: float = 0.0
    eff_attn_bw: float = 0.0


SAVE_KNOTS = (0.0, 256.0, 512.0, 768.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0)


def _hat_basis(x: np.ndarray, knots: tuple[float, ...]) -> np.ndarray:
    """Piecewise-linear interpolation basis (one column per knot), linear extrapolation past the last."""
    k = np.asarray(knots)
    out = np.zeros((len(x), len(k)))
    for j in range(len(k)):
        e = np.zeros(len(k))
        e[j] = 1.0
        out[:, j] = np.interp(x, k, e)
    last = x > k[-1]
    if last.any():
        slope = (x[last] - k[-1]) / (k[-1] - k[-2])
        out[last, -1] = 1.0 + slope
        out[last, -2] = -slope
    return out


def pooled_kv_save(tokens: np.ndarray, ms: np.ndarray) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(token counts, mean ms) of KV-write rows pooled by token count, as Vidur's `attn_kv_cache_save` model sees
    them: one random forest on num_tokens = max(prefill_chunk_size, batch_size) over decode and prefill rows
    together. A forest of deep trees on one feature predicts the mean of the rows at a profiled count, and the
    nearest profiled count's mean elsewhere (its splits sit midway between counts), so the rows are averaged per
    count and nothing is fitted. Up to 512 tokens decode rows (~0.004 ms) and prefill rows (0.152 ms at 512) share
    counts, which pulls the mean far below the prefill rows'; past 512 only prefill rows exist."""
    ok = np.isfinite(tokens) & np.isfinite(ms) & (tokens > 0)
    counts, inv = np.unique(tokens[ok], return_inverse=True)
    means = np.bincount(inv, weights=ms[ok]) / np.bincount(inv)
    return tuple(float(c) for c in counts), tuple(round(float(v), 9) for v in means)


def fit_attention_profile(path: str | Path, model: ModelSpec | str, gpu: GPUSpec | str
                          ) -> tuple[AttentionFit, list[FitReport]]:
    """Fit prefill/decode attention and KV-cache writes from a Vidur-schema attention CSV (one TP degree)."""
    p = Path(path)
    m, g = get_model(model), get_gpu(gpu)
    need = ["batch_size", "prefill_chunk_size", "kv_cache_size", "is_prefill", "num_tensor_parallel_workers",
            "time_stats.attn_prefill.median", "time_stats.attn_decode.median"]
    rows = read_rows(p, need)
    tps = {int(float(r["num_tensor_parallel_workers"])) for r in rows}
    if len(tps) != 1:
        raise ProfileError(p, "num_tensor_parallel_workers", f"expected one TP degree, found {sorted(tps)}")
    tp = tps.pop()
    is_pre = np.array([r["is_prefill"].strip().lower() == "true" for r in rows])
    bs = column(rows, "batch_size", p)
    chunk = column(rows, "prefill_chunk_size", p)
    kv = column(rows, "kv_cache_size", p)
    t_pre = column(rows, "time_stats.attn_prefill.median", p)
    t_dec = column(rows, "time_stats.attn_decode.median", p)
    has_save = "time_stats.attn_kv_cache_save.median" in rows[0]
    t_save = column(rows, "time_stats.attn_kv_cache_save.median", p) if has_save else None
    test = holdout_mask(len(rows))
    key = f"{m.name}/{g.name}/tp{tp}"
    reports: list[FitReport] = []

    # prefill: chunk·(kv + chunk/2) query-key pairs; linear in chunk for Q/O traffic; constant launch
    pm = is_pre & np.isfinite(t_pre) & (t_pre > 0)
    pairs = chunk * (kv + chunk / 2.0)
    xp = np.stack([np.ones_like(chunk), chunk, pairs], axis=1)
    cp = fit_nonneg(xp[pm & ~test], t_pre[pm & ~test])
    pred = xp @ cp
    reports.append(FitReport(str(p), "attn_prefill", key, int((pm & ~test).sum()), int((pm & test).sum()),
                             mape(pred[pm & test], t_pre[pm & test]), mape(pred[pm & ~test], t_pre[pm & ~test])))

    # decode: each request reads its whole KV (Σ context), plus per-request and per-call costs
    dm = ~is_pre & np.isfinite(t_dec) & (t_dec > 0)
    ctx_sum = bs * kv
    xd = np.stack([np.ones_like(bs), bs, ctx_sum], axis=1)
    cd = fit_nonneg(xd[dm & ~test], t_dec[dm & ~test])
    pred = xd @ cd
    reports.append(FitReport(str(p), "attn_decode", key, int((dm & ~test).sum()), int((dm & test).sum()),
                             mape(pred[dm & test], t_dec[dm & test]), mape(pred[dm & ~test], t_dec[dm & ~test])))

    fit = AttentionFit(float(cp[0]), float(cp[1]), float(cp[2]), float(cd[0]), float(cd[1]), float(cd[2]),
                       ref_model=m.name, ref_gpu=g.name, ref_tp=tp)
    fit.eff_attn_flop = attn_flops_per_pair(m, tp) / (g.peak_flops * fit.p_pair * 1e-3) if fit.p_pair else 0.0
    fit.eff_attn_bw = kv_bytes_per_token_layer(m, tp) / (g.hbm_bytes_per_s * fit.d_ctx * 1e-3) if fit.d_ctx else 0.0

    if t_save is not None:
        # KV writes: prefill rows by chunk tokens (piecewise-linear), decode rows one token per request
        sp = is_pre & np.isfinite(t_save) & (t_save > 0)
        basis = _hat_basis(chunk, SAVE_KNOTS)
        coef = fit_nonneg(basis[sp & ~test], t_save[sp & ~test])
        pred = basis @ coef
        reports.append(FitReport(str(p), "attn_kv_cache_save(prefill)", key, int((sp & ~test).sum()),
                                 int((sp & test).sum()), mape(pred[sp & test], t_save[sp & test]),
                                 mape(pred[sp & ~test], t_save[sp & ~test])))
        sd = ~is_pre & np.isfinite(t_save) & (t_save > 0)
        sfit = fit_linear(bs[sd & ~test], t_save[sd & ~test])
        pred = sfit.ms(bs)
        reports.append(FitReport(str(p), "attn_kv_cache_save(decode)", key, int((sd & ~test).sum()),
                                 int((sd & test).sum()), mape(pred[sd & test], t_save[sd & test]),
                                 mape(pred[sd & ~test], t_save[sd & ~test])))
        fit.save_knots, fit.save_ms = SAVE_KNOTS, tuple(float(c) for c in coef)
        # the decode write's fixed part is one kernel shared with the decode-attention call
        fit.save_req = sfit.b_ms
        fit.d0 += sfit.a_ms
        fit.save_d0 = sfit.a_ms
        fit.pooled_save_tokens, fit.pooled_save_ms = pooled_kv_save(np.maximum(chunk, bs), t_save)
    return fit, reports


# -------------------------------------------------------------------------------------------- all-reduce


@dataclass(slots=True)
class AllReduceFit:
    """NCCL all-reduce latency vs message size for one group size: knots of (log2 bytes, ms)."""

    num_workers: int
    log2_bytes: tuple[float, ...]
    ms: tuple[float, ...]

    def time_ms(self, nbytes: np.ndarray) -> np.ndarray:
        x = np.log2(np.maximum(np.asarray(nbytes, dtype=float), 1.0))
        base = np.interp(x, self.log2_bytes, self.ms)
        # past the largest knot the ring is bandwidth-bound: time grows ∝ bytes
        over = x > self.log2_bytes[-1]
        return np.where(over, self.ms[-1] * np.exp2(x - self.log2_bytes[-1]), base)


def fit_allreduce(path: str | Path) -> tuple[dict[int, AllReduceFit], list[FitReport]]:
    """Per group size (intra-node rows), the median latency at each power-of-two size bucket."""
    p = Path(path)
    rows = read_rows(p, ["time_stats.all_reduce.median", "num_workers", "size", "devices_per_node"])
    t = column(rows, "time_stats.all_reduce.median", p)
    n = column(rows, "num_workers", p).astype(int)
    dpn = column(rows, "devices_per_node", p).astype(int)
    size = column(rows, "size", p)
    test = holdout_mask(len(rows))
    fits: dict[int, AllReduceFit] = {}
    reports: list[FitReport] = []
    for w in sorted(set(n.tolist())):
        sel = (n == w) & (dpn == w) & np.isfinite(t) & (t > 0)   # one node: the NVLink path TP uses
        if sel.sum() < 4:
            continue
        x = np.log2(size)
        knots = np.arange(math.floor(x[sel].min()), math.ceil(x[sel].max()) + 1.0)
        tr = sel & ~test
        vals = []
        for k in knots:
            near = tr & (np.abs(x - k) <= 0.5)
            vals.append(float(np.median(t[near])) if near.any() else math.nan)
        v = np.array(vals)
        good = np.isfinite(v)
        v = np.interp(knots, knots[good], v[good])
        v = np.maximum.accumulate(v)   # latency never falls with size
        fit = AllReduceFit(w, tuple(knots.tolist()), tuple(v.tolist()))
        fits[w] = fit
        pred = fit.time_ms(size)
        te = sel & test
        reports.append(FitReport(str(p), f"all_reduce(n={w})", p.parent.name, int(tr.sum()), int(te.sum()),
                                 mape(pred[te], t[te]), mape(pred[tr], t[tr])))
    if not fits:
        raise ProfileError(p, "num_workers", "no intra-node group (devices_per_node == num_workers) with data")
    return fits, reports


# --------------------------------------------------------------------------------------- serialisation


def gemm_to_json(f: GemmFit) -> dict[str, Any]:
    return {"eff_flop": round(f.eff_flop, 5), "eff_bw": round(f.eff_bw, 5), "overhead_ms": f.overhead_ms,
            "corr_log2t": list(f.corr_log2t), "corr_factor": [round(c, 5) for c in f.corr_factor],
            "tile_tokens": f.tile_tokens}


def gemm_from_json(d: dict[str, Any]) -> GemmFit:
    return GemmFit(float(d["eff_flop"]), float(d["eff_bw"]), float(d["overhead_ms"]),
                   tuple(d.get("corr_log2t", ())), tuple(d.get("corr_factor", ())), int(d.get("tile_tokens", 1)))


def layerfit_to_json(lf: LayerFit) -> dict[str, Any]:
    return {"gemm": {k: gemm_to_json(v) for k, v in lf.gemm.items()},
            "elementwise": {k: [round(v.a_ms, 7), round(v.b_ms, 10)] for k, v in lf.elementwise.items()}}


def layerfit_from_json(d: dict[str, Any]) -> LayerFit:
    return LayerFit({k: gemm_from_json(v) for k, v in d["gemm"].items()},
                    {k: LinearFit(float(v[0]), float(v[1])) for k, v in d["elementwise"].items()})


def attention_to_json(a: AttentionFit) -> dict[str, Any]:
    return asdict(a)


def attention_from_json(d: dict[str, Any]) -> AttentionFit:
    d = dict(d)
    d["save_knots"] = tuple(d.get("save_knots", ()))
    d["save_ms"] = tuple(d.get("save_ms", ()))
    d["pooled_save_tokens"] = tuple(d.get("pooled_save_tokens", ()))
    d["pooled_save_ms"] = tuple(d.get("pooled_save_ms", ()))
    return AttentionFit(**d)


def allreduce_to_json(a: AllReduceFit) -> dict[str, Any]:
    return {"num_workers": a.num_workers, "log2_bytes": list(a.log2_bytes), "ms": [round(v, 5) for v in a.ms]}


def allreduce_from_json(d: dict[str, Any]) -> AllReduceFit:
    return AllReduceFit(int(d["num_workers"]), tuple(d["log2_bytes"]), tuple(d["ms"]))


# ------------------------------------------------------------------------------------------ whole sets


def fit_profile_tree(root: str | Path) -> tuple["CoefficientStore", list[FitReport]]:
    """Fit everything a Vidur-format `profiling/` folder holds: compute/<gpu>/<org>/<model>/mlp.csv for every
    known model/GPU, the attention extracts, and network/<node>/all_reduce.csv."""
    from tierserve.hardware.coefficients import CoefficientStore

    base = Path(root)
    if not base.is_dir():
        raise ProfileError(base, None, "profile folder not found")
    store = CoefficientStore(meta={"source": str(base.name), "holdout_fraction": HOLDOUT_FRACTION,
                                   "units": "per-layer milliseconds, one TP shard"})
    reports: list[FitReport] = []
    for g in known_gpus():
        for m in known_models():
            if not (g.profile_dir and m.profile_dir):
                continue
            p = base / "compute" / g.profile_dir / m.profile_dir / "mlp.csv"
            if p.is_file():
                fits, reps = fit_mlp_profile(p, m, g)
                store.layers.setdefault(g.name, {})[m.name] = fits
                reports += reps
    # the reference attention fit (index 0) is the current Vidur FlashInfer profile; others are exact-geometry
    attn_sources = [
        (base / "compute/a100/meta-llama/Meta-Llama-3-8B/attention_PARTIAL_extract.csv", "Llama-3-8B", "a100"),
        (base / "legacy_a100_acb95f6/attention.csv", "Llama-2-70B", "a100"),
    ]
    for p, mname, gname in attn_sources:
        if p.is_file():
            fit, reps = fit_attention_profile(p, mname, gname)
            store.attention.append(fit)
            reports += reps
    for g in known_gpus():
        if g.network_dir:
            p = base / "network" / g.network_dir / "all_reduce.csv"
            if p.is_file():
                store.allreduce[g.network_dir], reps = fit_allreduce(p)
                reports += reps
    if not (store.layers or store.attention or store.allreduce):
        raise ProfileError(base, None, "no Vidur-format profiles (compute/*/*/*/mlp.csv, network/*/all_reduce.csv)")
    store.meta["fit_error_pct"] = summarise_reports(reports)
    return store, reports


def summarise_reports(reports: list[FitReport]) -> dict[str, dict[str, float]]:
    """Held-out MAPE per operator (over all configs) and per model/GPU (over all operators)."""
    by_op: dict[str, list[float]] = {}
    by_key: dict[str, list[float]] = {}
    for r in reports:
        if math.isnan(r.mape_test):
            continue
        op = r.op.split("(n=")[0]
        by_op.setdefault(op, []).append(r.mape_test)
        k = "/".join(r.key.split("/")[:2])
        by_key.setdefault(k, []).append(r.mape_test)
    return {"per_operator": {k: round(float(np.mean(v)), 2) for k, v in sorted(by_op.items())},
            "per_model_gpu": {k: round(float(np.mean(v)), 2) for k, v in sorted(by_key.items())}}


# ------------------------------------------------------------------------------------- iteration logs

ITERATION_COLUMNS = ("prefill_tokens", "decode_count", "decode_context_sum", "measured_ms")
PHYSICAL_FIT_KIND = "physical_iteration_fit"
# Optional iteration-log columns: model/gpu/tp select the physically parametrised fit; a non-empty `exclude`
# (the reason) keeps a row out of the fit but in the report.
GEOMETRY_COLUMNS = ("model", "gpu", "tp")
EXCLUDE_COLUMN = "exclude"


@dataclass(slots=True)
class IterationFit:
    """DESIGN.md's linear model t = c0 + c1·P + c2·B + c3·pairs + c4·C (seconds), fitted on measurements."""

    c0_s: float
    c_prefill_tok_s: float
    c_decode_tok_s: float
    c_pair_s: float
    c_ctx_s: float
    n_rows: int
    mape_test: float
    source: str = ""
    # measured/predicted step time over the fitted rows, as `step_time_ratio_table` compacts it
    step_time_ratios: list[float] = field(default_factory=list)

    def to_model(self, name: str = "iteration-fit"):
        from tierserve.hardware.exec_model import model_from_linear_coefficients
        return model_from_linear_coefficients(name, self.c0_s, self.c_prefill_tok_s, self.c_decode_tok_s,
                                              self.c_pair_s, self.c_ctx_s)


@dataclass(slots=True)
class PhysicalIterationFit:
    """Roofline efficiencies, a per-iteration overhead and a per-decode cost fitted to measured iterations; the
    cost of B decode sequences is then taken as measured at each logged batch size (`decode_batch_knots`,
    `decode_cost_ms`). `points` reports every log row: measured, physical-only, fitted, leave-one-out errors."""

    model: str
    gpu: str
    tp: int
    overhead_ms: float
    eff_gemm_flop: float
    eff_hbm: float
    eff_attn_flop: float
    per_seq_ms: float
    decode_batch_knots: list[int]
    decode_cost_ms: list[float]
    n_rows: int
    source: str = ""
    points: list[dict[str, Any]] = field(default_factory=list)
    kind: str = PHYSICAL_FIT_KIND
    step_time_ratios: list[float] = field(default_factory=list)   # as in IterationFit

    def to_model(self, name: str = "iteration-fit", overhead_s: float | None = None, measured_decode: bool = True):
        from tierserve.hardware.exec_model import model_from_physical_parameters
        return model_from_physical_parameters(
            name, self.model, self.gpu, self.tp, eff_gemm_flop=self.eff_gemm_flop, eff_hbm=self.eff_hbm,
            eff_attn_flop=self.eff_attn_flop,
            overhead_s=self.overhead_ms * 1e-3 if overhead_s is None else overhead_s,
            per_seq_s=self.per_seq_ms * 1e-3,
            decode_knots=self.decode_batch_knots if measured_decode else (),
            decode_cost_s=[v * 1e-3 for v in self.decode_cost_ms] if measured_decode else ())

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "PhysicalIterationFit":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def max_abs_err_pct(self) -> float:
        return max(abs(p["err_pct"]) for p in self.points if not p["exclude"])


def _read_iteration_log(p: Path) -> tuple[dict[str, np.ndarray], np.ndarray, list[str], list[dict[str, str]]]:
    rows = read_rows(p, ITERATION_COLUMNS)
    if "prefill_attn_pairs" in rows[0]:
        pairs = column(rows, "prefill_attn_pairs", p)
    elif "prefill_context" in rows[0]:
        ctx = column(rows, "prefill_context", p)
        pt = column(rows, "prefill_tokens", p)
        pairs = pt * (ctx + pt / 2.0)
    else:
        raise ProfileError(p, "prefill_attn_pairs", "missing required column (or give prefill_context)")
    cols = {c: column(rows, c, p) for c in ITERATION_COLUMNS}
    for c, v in cols.items():
        bad = ~np.isfinite(v)
        if bad.any():
            raise ProfileError(p, c, f"row {int(np.argmax(bad)) + 2}: empty or non-numeric value")
    if not np.isfinite(pairs).all():
        raise ProfileError(p, "prefill_attn_pairs", "empty or non-numeric value")
    if (cols["measured_ms"] <= 0).any():
        raise ProfileError(p, "measured_ms", "values must be positive")
    exclude = [(r.get(EXCLUDE_COLUMN) or "").strip() for r in rows]
    return cols, pairs, exclude, rows


def _log_geometry(rows: list[dict[str, str]], p: Path) -> tuple[str, str, int] | None:
    """The (model, GPU, TP) the log names in its model/gpu/tp columns, if it has them (one value each)."""
    if not all(c in rows[0] for c in GEOMETRY_COLUMNS):
        return None
    vals = []
    for c in GEOMETRY_COLUMNS:
        seen = {(r.get(c) or "").strip() for r in rows}
        if len(seen) != 1 or "" in seen:
            raise ProfileError(p, c, f"one value expected in every row, found {sorted(seen)}")
        vals.append(seen.pop())
    try:
        return vals[0], vals[1], int(vals[2])
    except ValueError:
        raise ProfileError(p, "tp", f"{vals[2]!r} is not an integer") from None


ITERATION_OBJECTIVES = ("relative", "mean")


def calibrate_from_iterations(csv_path: str | Path, model: str | None = None, gpu: str | None = None,
                              tp: int | None = None, objective: str = "relative"
                              ) -> "IterationFit | PhysicalIterationFit":
    """Fit an execution-time model from a log of measured iterations.

    Columns: prefill_tokens, decode_count, decode_context_sum, measured_ms, and either prefill_attn_pairs or
    prefill_context (tokens cached before the chunk; pairs = P·(ctx + P/2), one chunk per row); optionally
    model, gpu, tp and exclude. With a (model, GPU, TP) — from the arguments or the log's columns — the fit
    is physically parametrised (`fit_physical_iterations`); without one it is DESIGN.md's bare linear model,
    fitted on relative error (`objective="relative"`, the best per-step MAPE) or plain least squares
    (`"mean"`: right on the mean step time — measured steps on a shared CPU are right-skewed, and a relative fit
    then sits below their mean, so a simulation summing steps runs fast).
    """
    if objective not in ITERATION_OBJECTIVES:
        raise ConfigError("objective", objective, " | ".join(ITERATION_OBJECTIVES))
    p = Path(csv_path)
    cols, pairs, exclude, rows = _read_iteration_log(p)
    geom = _log_geometry(rows, p)
    if model is not None or gpu is not None or tp is not None:
        if geom is None and (model is None or gpu is None):
            raise ProfileError(p, "model", "a physical fit needs both a model and a GPU (options or log columns)")
        geom = (model or geom[0], gpu or geom[1], int(tp) if tp is not None else (geom[2] if geom else 1))
    if geom is not None:
        if objective != "relative":
            raise ConfigError("objective", objective, "relative (the physical fit of a model/GPU log)")
        return fit_physical_iterations(p, cols, pairs, exclude, *geom)
    y = cols["measured_ms"] * 1e-3
    x = np.stack([np.ones_like(y), cols["prefill_tokens"], cols["decode_count"], pairs,
                  cols["decode_context_sum"]], axis=1)
    use = np.array([not e for e in exclude])
    if use.sum() < 5:
        raise ProfileError(p, None, f"need at least 5 rows to fit 5 coefficients, got {int(use.sum())}")
    x, y = x[use], y[use]
    test = holdout_mask(len(y)) if len(y) >= 20 else np.zeros(len(y), bool)
    coef = fit_nonneg(x[~test], y[~test], relative=objective == "relative")
    err = mape(x[test] @ coef, y[test]) if test.any() else mape(x @ coef, y)
    c0, c_prefill, c_decode, c_pair, c_ctx = (float(c) for c in coef)
    return IterationFit(c0, c_prefill, c_decode, c_pair, c_ctx, n_rows=len(y), mape_test=err, source=str(p),
                        step_time_ratios=step_time_ratio_table(y, x @ coef))


STEP_RATIO_TABLE_SIZE = 64
STEP_RATIOS_KEY = "step_time_ratios"


def step_time_ratio_table(measured_s: np.ndarray, predicted_s: np.ndarray,
                          size: int = STEP_RATIO_TABLE_SIZE) -> list[float]:
    """The distribution of measured/predicted step time, compacted to `size` equally likely values for the
    simulator's step-time variability (`ReplicaConfig.step_time_variability`).

    Value k is the mean of the k-th of `size` equal-count slices of the sorted ratios (slices split rows
    fractionally), so the table keeps the tail's weight, which point quantiles would drop. The table is then
    scaled to mean Σmeasured / Σpredicted: a factor drawn independently of the step's shape multiplies the
    mean predicted time by the table's mean, and this makes it the measured mean step time (for a plain
    least-squares fit with an intercept the scale is 1; a relative-error fit sits below the mean, and the
    table then carries the difference). An empty list when fewer than `size` rows or a prediction <= 0."""
    y = np.asarray(measured_s, dtype=float)
    pred = np.asarray(predicted_s, dtype=float)
    if len(y) < size or not (pred > 0).all():
        return []
    ratios = np.sort(y / pred)
    cum = np.concatenate([[0.0], np.cumsum(ratios)])
    edges = np.linspace(0.0, len(ratios), size + 1)
    at_edges = np.interp(edges, np.arange(len(cum), dtype=float), cum)     # Σ of the first `edge` ratios
    values = np.diff(at_edges) / (len(ratios) / size)
    values *= (y.sum() / pred.sum()) / values.mean()
    return [round(float(v), 6) for v in values]


def read_step_time_ratios(path: str | Path, field_name: str = "step_time_variability") -> list[float]:
    """The step-time ratio table a fit file records (`tierserve calibrate --iterations --out`); a clear
    ConfigError naming `field_name` when the file has none or a bad one."""
    from tierserve.core.files import read_mapping
    import json
    data = read_mapping(str(path), "exec_model_file", json.loads, (ValueError,), "JSON")
    table = data.get(STEP_RATIOS_KEY)
    if not table:
        raise ConfigError(field_name, True, f"an exec_model_file that records {STEP_RATIOS_KEY} (a fit written by "
                                            f"`tierserve calibrate --iterations` from at least "
                                            f"{STEP_RATIO_TABLE_SIZE} rows); {path} has none")
    if (not isinstance(table, list) or len(table) > 4096
            or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0
                       for v in table)):
        raise ConfigError(field_name, True, f"{path}: {STEP_RATIOS_KEY} must be a list of at most 4096 positive "
                                            f"finite numbers")
    return [float(v) for v in table]


# HBM efficiency is held at the roofline default: with every decode batch at one context length, weight
# streaming costs the same in every small batch, exactly like the per-iteration overhead, so the two cannot be
# told apart by these logs. The A100 GEMM profile fits put memory-bound efficiencies around it (0.55-1.0).
FIT_EFF_HBM = 0.80
_EFF_GRID = np.round(np.arange(0.30, 1.0001, 0.01), 2)


def _solve_overhead_perseq_attn(resid: np.ndarray, b: np.ndarray, attn: np.ndarray, y: np.ndarray
                                ) -> tuple[float, float, float]:
    """Relative-error least squares for resid = o + q·B + k·attn with o, q ≥ 0 and k = 1/eff_attn ≥ 1."""
    w = 1.0 / y
    cols = [np.ones_like(y), b, attn]
    fixed_k = None
    active = [0, 1, 2]
    for _ in range(4):
        target = resid - (fixed_k * attn if fixed_k is not None else 0.0)
        a = np.stack([cols[i] for i in active], axis=1) * w[:, None]
        sol = np.linalg.lstsq(a, target * w, rcond=None)[0] if active else np.zeros(0)
        coef = dict(zip(active, sol))
        if 2 in coef and coef[2] < 1.0:
            fixed_k, active = 1.0, [i for i in active if i != 2]
            continue
        neg = [i for i in (0, 1) if i in coef and coef[i] < 0]
        if neg:
            active = [i for i in active if i not in neg]
            continue
        break
    o, q = coef.get(0, 0.0), coef.get(1, 0.0)
    k = coef.get(2, fixed_k if fixed_k is not None else 1.0)
    return max(float(o), 0.0), max(float(q), 0.0), max(float(k), 1.0)


def fit_physical_iterations(p: Path, cols: dict[str, np.ndarray], pairs: np.ndarray, exclude: list[str],
                            model: str, gpu: str, tp: int) -> PhysicalIterationFit:
    """Fit overhead, per-decode cost and GEMM/attention efficiencies; then take decode costs as measured.

    1. "Physical": for each GEMM FLOP efficiency on a grid, the roofline of every operator (HBM at FIT_EFF_HBM)
       leaves a residual linear in (overhead, per-decode cost, 1/attention efficiency), solved by relative-error
       least squares; the grid point with the smallest relative RMS error wins.
    2. "Fitted": decode-only rows set the engine's cost of B decode sequences at each logged B (what the
       physical part leaves), kept non-decreasing in B and interpolated linearly between logged sizes, continuing
       at the fitted per-decode cost beyond. Prefill rows keep the physical prediction. Leave-one-out errors
       drop each decode size's own knot.
    """
    from tierserve.hardware.exec_model import model_from_physical_parameters
    from tierserve.hardware.roofline import attn_flops_per_pair

    m, g = get_model(model), get_gpu(gpu)
    m.check_tp(tp)
    P, B = cols["prefill_tokens"].astype(int), cols["decode_count"].astype(int)
    C = cols["decode_context_sum"]
    y_all = cols["measured_ms"] * 1e-3
    use = np.array([not e for e in exclude])
    if use.sum() < 4:
        raise ProfileError(p, None, f"need at least 4 usable rows for a physical fit, got {int(use.sum())}")
    attn_col = pairs * attn_flops_per_pair(m, tp) * m.num_layers / g.peak_flops   # seconds at 100% of peak

    def predict(em) -> np.ndarray:
        return np.array([em.iteration_time(int(P[i]), float(pairs[i]), int(B[i]), int(C[i]))
                         for i in range(len(P))])

    y = y_all[use]
    best = None
    for ef in _EFF_GRID:
        em = model_from_physical_parameters("grid", m.name, g.name, tp, eff_gemm_flop=float(ef),
                                            eff_hbm=FIT_EFF_HBM, eff_attn_flop=1e12, overhead_s=0.0, per_seq_s=0.0)
        base = predict(em)[use]
        o, q, k = _solve_overhead_perseq_attn(y - base, B[use].astype(float), attn_col[use], y)
        pred = base + o + q * B[use] + k * attn_col[use]
        rms = float(np.sqrt(np.mean(((pred - y) / y) ** 2)))
        if best is None or rms < best[0]:
            best = (rms, float(ef), o, q, 1.0 / k)
    _, ef, o, q, ea = best

    def build(knots=(), cost=()):
        return model_from_physical_parameters("fit", m.name, g.name, tp, eff_gemm_flop=ef, eff_hbm=FIT_EFF_HBM,
                                              eff_attn_flop=ea, overhead_s=o, per_seq_s=q, decode_knots=knots,
                                              decode_cost_s=cost)

    physical = predict(build())
    # decode-only rows: what the physical part leaves once its own q·B is taken out is the cost of B sequences
    dec_rows = [i for i in np.flatnonzero(use) if P[i] == 0 and B[i] > 0]
    by_b: dict[int, list[float]] = {}
    for i in dec_rows:
        by_b.setdefault(int(B[i]), []).append(float(y_all[i] - (physical[i] - q * B[i])))
    knots = sorted(by_b)
    cost = np.maximum.accumulate(np.maximum([float(np.mean(by_b[k])) for k in knots], 0.0)).tolist() if knots else []
    fitted = predict(build(knots, cost))
    loo = np.full(len(P), np.nan)
    for j, k in enumerate(knots):
        kk, cc = knots[:j] + knots[j + 1:], cost[:j] + cost[j + 1:]
        pred = predict(build(kk, cc))
        for i in dec_rows:
            if B[i] == k:
                loo[i] = pred[i]
    points = []
    for i in range(len(P)):
        points.append({
            "prefill_tokens": int(P[i]), "decode_count": int(B[i]), "decode_context_sum": float(C[i]),
            "prefill_attn_pairs": float(pairs[i]), "measured_ms": float(y_all[i] * 1e3),
            "physical_ms": round(float(physical[i] * 1e3), 4), "fitted_ms": round(float(fitted[i] * 1e3), 4),
            "physical_err_pct": round(float((physical[i] / y_all[i] - 1) * 100), 2),
            "err_pct": round(float((fitted[i] / y_all[i] - 1) * 100), 2),
            "loo_err_pct": None if np.isnan(loo[i]) else round(float((loo[i] / y_all[i] - 1) * 100), 2),
            "exclude": exclude[i]})
    return PhysicalIterationFit(m.name, g.name, int(tp), overhead_ms=o * 1e3, eff_gemm_flop=ef, eff_hbm=FIT_EFF_HBM,
                                eff_attn_flop=ea, per_seq_ms=q * 1e3, decode_batch_knots=knots,
                                decode_cost_ms=[round(c * 1e3, 5) for c in cost], n_rows=int(use.sum()),
                                source=str(p), points=points,
                                step_time_ratios=step_time_ratio_table(y_all[use], fitted[use]))


def format_fit_summary(summary: dict) -> str:
    """The held-out fit errors (`CoefficientStore.meta['fit_error_pct']`) as printable lines."""
    lines = ["held-out fit error (MAPE %, 20% of profile rows held out) per operator:"]
    lines += [f"  {k:34s} {v:6.2f}" for k, v in summary["per_operator"].items()]
    lines.append("per model/GPU (mean over operators):")
    lines += [f"  {k:34s} {v:6.2f}" for k, v in summary["per_model_gpu"].items()]
    return "\n".join(lines)
