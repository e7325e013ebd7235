"""Fit execution-time coefficients from Vidur-format operator profiles (GEMMs, elementwise ops, attention,
KV-cache writes, all-reduce) into a `CoefficientStore`.

Profiles are per-layer, per-TP-shard medians in ms (see the Vidur README in shared/data/vidur). Each fit is
checked on a held-out 20% of rows (fixed seed) and the error reported.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from tierserve.hardware.coefficients import CoefficientStore
from tierserve.hardware.fit_schema import check_profile_rows
from tierserve.hardware.fit_tools import (
    HOLDOUT_FRACTION, column, fit_nonneg, holdout_mask, int_column, mape, read_rows,
)
from tierserve.hardware.fits import AllReduceFit, AttentionFit, FitReport, LayerFit, ProfileError
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
    # The correction passes through the median measured/roofline ratio at every profiled token count (tile and
    # wave steps sit between powers of two: 128 tokens is one tile, 136 two), thinned to the knots that keep
    # every count within CORRECTION_TOLERANCE.
    ratio = ms / fit.raw_ms(model, gpu, tp, op, tokens)
    lt = np.log2(np.maximum(tokens, 1.0))
    knots, inv = np.unique(lt, return_inverse=True)
    factors = np.array([float(np.median(ratio[inv == i])) for i in range(len(knots))])
    keep = _thin_knots(knots, factors, CORRECTION_TOLERANCE)
    return GemmFit(fit.eff_flop, fit.eff_bw, fit.overhead_ms, tuple(knots[keep].tolist()),
                   tuple(factors[keep].tolist()), fit.tile_tokens)


CORRECTION_TOLERANCE = 0.015


def _thin_knots(x: np.ndarray, y: np.ndarray, tol: float) -> list[int]:
    """Indices of knots whose piecewise-linear interpolation stays within `tol` (relative) of every y."""
    keep, i = [0], 0
    while i < len(x) - 1:
        j = i + 1
        while j + 1 < len(x):
            mid = slice(i + 1, j + 1)
            line = y[i] + (y[j + 1] - y[i]) * (x[mid] - x[i]) / (x[j + 1] - x[i])
            if not np.all(np.abs(line / y[mid] - 1.0) <= tol):
                break
            j += 1
        keep.append(j)
        i = j
    return keep


def fit_linear(x: np.ndarray, ms: np.ndarray) -> LinearFit:
    """Least squares on relative error (weights 1/t), intercept and slope clipped at 0."""
    w = 1.0 / np.maximum(ms, 1e-6)
    a_mat = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    coef, *_ = np.linalg.lstsq(a_mat, ms * w, rcond=None)
    return LinearFit(max(float(coef[0]), 0.0), max(float(coef[1]), 0.0))


def fit_mlp_profile(path: str | Path, model: ModelSpec | str | None = None,
                    gpu: GPUSpec | str | None = None) -> tuple[dict[int, LayerFit], list[FitReport]]:
    """Fit every GEMM and elementwise op of a Vidur `mlp.csv`, per TP degree, with held-out errors (of a fit to
    80% of the rows; the fits returned use every row, so they pass within CORRECTION_TOLERANCE of each profiled
    token count)."""
    p = Path(path)
    ops = GEMM_OPS + ELEMENTWISE_OPS
    rows = read_rows(p, ["num_tokens", "num_tensor_parallel_workers", "n_embd"]
                     + [f"time_stats.{o}.median" for o in ops])
    m = get_model(model) if model is not None else _model_from_profile(rows, p)
    g = get_gpu(gpu) if gpu is not None else _gpu_from_path(p)
    check_profile_rows(p, rows, m)
    tokens_all = column(rows, "num_tokens", p)
    tp_all = int_column(rows, "num_tensor_parallel_workers", p)
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
            # held-out error of a fit to the other 80%; the fit kept is then refitted on every row
            if op in GEMM_OPS:
                pred = fit_gemm(m, g, tp, op, tokens[tr], ms[tr]).ms(m, g, tp, op, tokens)
                lf.gemm[op] = fit_gemm(m, g, tp, op, tokens[ok], ms[ok])
            else:
                pred = fit_linear(tokens[tr], ms[tr]).ms(tokens)
                lf.elementwise[op] = fit_linear(tokens[ok], ms[ok])
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
    check_profile_rows(p, rows, m)
    tps = set(int_column(rows, "num_tensor_parallel_workers", p).tolist())
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


def fit_allreduce(path: str | Path) -> tuple[dict[int, AllReduceFit], list[FitReport]]:
    """Per group size (intra-node rows), the median latency at each power-of-two size bucket."""
    p = Path(path)
    rows = read_rows(p, ["time_stats.all_reduce.median", "num_workers", "size", "devices_per_node"])
    check_profile_rows(p, rows, None)
    t = column(rows, "time_stats.all_reduce.median", p)
    n = int_column(rows, "num_workers", p)
    dpn = int_column(rows, "devices_per_node", p)
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


def fit_profile_tree(root: str | Path) -> tuple[CoefficientStore, list[FitReport]]:
    """Fit everything a Vidur-format `profiling/` folder holds: compute/<gpu>/<org>/<model>/mlp.csv for every
    known model/GPU, the attention extracts, and network/<node>/all_reduce.csv."""
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


def format_fit_summary(summary: dict) -> str:
    """The held-out fit errors (`CoefficientStore.meta['fit_error_pct']`) as printable lines."""
    lines = ["held-out fit error (MAPE %, 20% of profile rows held out) per operator:"]
    lines += [f"  {k:34s} {v:6.2f}" for k, v in summary["per_operator"].items()]
    lines.append("per model/GPU (mean over operators):")
    lines += [f"  {k:34s} {v:6.2f}" for k, v in summary["per_model_gpu"].items()]
    return "\n".join(lines)
