"""Fit an execution-time model from a log of measured iterations: DESIGN.md's bare linear model, or (with a
model/GPU/TP) the physically parametrised fit, with held-out / leave-one-out errors per row."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core.errors import ConfigError
from tierserve.hardware.exec_builder import model_from_physical_parameters
from tierserve.hardware.fit_tools import column, fit_nonneg, holdout_mask, int_column, mape, read_rows
from tierserve.hardware.fit_schema import check_above_roofline, check_distinct_rows, check_iteration_log
from tierserve.hardware.fits import ProfileError
from tierserve.hardware.iteration_fit import (
    STEP_RATIO_TABLE_SIZE, IterationFit, PhysicalIterationFit,
)
from tierserve.hardware.roofline import attn_flops_per_pair
from tierserve.hardware.specs import get_gpu, get_model

ITERATION_COLUMNS = ("prefill_tokens", "decode_count", "decode_context_sum", "measured_ms")
# Optional iteration-log columns: model/gpu/tp select the physically parametrised fit; a non-empty `exclude`
# (the reason) keeps a row out of the fit but in the report.
GEOMETRY_COLUMNS = ("model", "gpu", "tp")
EXCLUDE_COLUMN = "exclude"


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
    for c in ("prefill_tokens", "decode_count"):
        cols[c] = int_column(rows, c, p).astype(float)     # counts: 12 or 12.0, never 12.5
    if (cols["measured_ms"] <= 0).any():
        raise ProfileError(p, "measured_ms", "values must be positive")
    check_iteration_log(p, cols, pairs)
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
                              ) -> IterationFit | PhysicalIterationFit:
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
    check_distinct_rows(p, x[:, 1:], 5)
    test = holdout_mask(len(y)) if len(y) >= 20 else np.zeros(len(y), bool)
    coef = fit_nonneg(x[~test], y[~test], relative=objective == "relative")
    err = mape(x[test] @ coef, y[test]) if test.any() else mape(x @ coef, y)
    c0, c_prefill, c_decode, c_pair, c_ctx = (float(c) for c in coef)
    return IterationFit(c0, c_prefill, c_decode, c_pair, c_ctx, n_rows=len(y), mape_test=err, source=str(p),
                        step_time_ratios=step_time_ratio_table(y, x @ coef))


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
        if not active:                  # every term dropped: no overhead, no per-decode cost
            coef = {}
            break
        a = np.stack([cols[i] for i in active], axis=1) * w[:, None]
        sol = np.linalg.lstsq(a, target * w, rcond=None)[0]
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
    m, g = get_model(model), get_gpu(gpu)
    m.check_tp(tp)
    P, B = cols["prefill_tokens"].astype(int), cols["decode_count"].astype(int)
    C = cols["decode_context_sum"]
    y_all = cols["measured_ms"] * 1e-3
    use = np.array([not e for e in exclude])
    if use.sum() < 4:
        raise ProfileError(p, None, f"need at least 4 usable rows for a physical fit, got {int(use.sum())}")
    check_distinct_rows(p, np.stack([P, B, C, pairs], axis=1)[use], 4)
    check_above_roofline(p, m.name, g.name, tp, P, pairs, B, C, y_all, use, model_from_physical_parameters(
        "roofline", m.name, g.name, tp, eff_gemm_flop=1.0, eff_hbm=1.0, eff_attn_flop=1.0, overhead_s=0.0,
        per_seq_s=0.0))
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


HELD_OUT_KEY = "held out (leave-shapes-out)"


def leave_shapes_out(csv_path: str | Path, model: str, gpu: str, tp: int) -> list[dict[str, Any]]:
    """Held-out error of the physical fit: for each shape of the log (its prefill tokens and decode count), the
    whole fit is redone without every row of that shape and then predicts them. Rows the log excludes stay out.
    One dict per held-out row: prefill_tokens, decode_count, measured_ms, predicted_ms, err_pct."""
    p = Path(csv_path)
    cols, pairs, exclude, _ = _read_iteration_log(p)
    P, B = cols["prefill_tokens"].astype(int), cols["decode_count"].astype(int)
    out = []
    for shape in sorted({(int(P[i]), int(B[i])) for i in range(len(P)) if not exclude[i]}):
        rows = [i for i in range(len(P)) if (int(P[i]), int(B[i])) == shape and not exclude[i]]
        held = [HELD_OUT_KEY if i in rows else e for i, e in enumerate(exclude)]
        fit = fit_physical_iterations(p, cols, pairs, held, model, gpu, tp)
        for i in rows:
            pt = fit.points[i]
            out.append({"prefill_tokens": shape[0], "decode_count": shape[1], "measured_ms": pt["measured_ms"],
                        "predicted_ms": pt["fitted_ms"], "err_pct": pt["err_pct"]})
    return out
