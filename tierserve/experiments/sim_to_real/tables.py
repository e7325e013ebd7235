"""sim_to_real's comparison output: per-tier sim/real percentile tables with bootstrap intervals, the
per-request decomposition, the frontend delays and the real run's stability, as printed lines."""
from __future__ import annotations

import numpy as np

from tierserve.experiments.sim_to_real.workload import QUANTILES, TIER_MIX


def describe_delays(name: str, d: np.ndarray) -> str:
    cells = [f"{k} P50 {np.median(d[:, j]) * 1e3:.2f} / P90 {np.percentile(d[:, j], 90) * 1e3:.2f} ms"
             for j, k in enumerate(("in", "out first", "out last"))]
    return f"  frontend, {name} ({len(d)} requests): " + "; ".join(cells)


def decomposition(real: list[dict], eng: dict[int, dict]) -> list[str]:
    """Where each request's client-side time went (medians and P90 over the run, ms)."""
    parts = {"in: send -> vLLM arrival stamp (API server)": [],
             "stamp -> engine queue (IPC, step in progress)": [], "queue: engine queue -> first step": [],
             "prefill: first step -> first token (engine)": [], "out: first token engine -> client": [],
             "decode: first -> last token (engine)": [], "out: last token engine -> client": [],
             "= TTFT (client)": [], "= TTLT (client)": []}
    vals = list(parts.values())
    for r in real:
        e = eng.get(r["i"])
        if e is None:
            continue
        for v, x in zip(vals, (e["arrival_s"] - r["sent_s"], e["queued_s"] - e["arrival_s"],
                               e["first_scheduled_s"] - e["queued_s"], e["first_token_s"] - e["first_scheduled_s"],
                               r["first_s"] - e["first_token_s"], e["finish_s"] - e["first_token_s"],
                               r["last_s"] - e["finish_s"], r["ttft"], r["ttlt"])):
            v.append(x)
    return [f"    {k:46s} P50 {np.median(v) * 1e3:8.2f}   P90 {np.percentile(v, 90) * 1e3:8.2f}"
            for k, v in parts.items() if v]


BOOTSTRAP_RESAMPLES = 2000  # resamples of a run's requests per tier: the 2.5/97.5% ends settle to ~1% of the width
BOOTSTRAP_SEED = 20240601   # fixed: the same run gives the same intervals in every table


def bootstrap_quantile_ci(values, quantiles=QUANTILES, resamples: int = BOOTSTRAP_RESAMPLES,
                          seed: int | tuple = BOOTSTRAP_SEED, level: float = 0.95) -> np.ndarray:
    """Percentile-bootstrap interval of each quantile (percent) of `values`: resample the values with replacement
    `resamples` times (seeded), take the quantiles of each resample, and return the (1-level)/2 and (1+level)/2
    quantiles of those, one (low, high) row per quantile. Requests, not tokens, are the unit resampled."""
    v = np.asarray(values, dtype=float)
    if v.ndim != 1 or v.size == 0:
        raise ValueError(f"bootstrap_quantile_ci: values need one or more numbers, got shape {v.shape}")
    if resamples < 100:
        raise ValueError(f"bootstrap_quantile_ci: resamples {resamples}: at least 100")
    rng = np.random.default_rng(seed)
    draws = v[rng.integers(0, v.size, size=(resamples, v.size))]
    q = np.percentile(draws, list(quantiles), axis=1)                # (quantiles, resamples)
    tail = (1 - level) / 2 * 100
    return np.percentile(q, [tail, 100 - tail], axis=1).T


def table(name: str, real: list[dict], sim: list[dict], sim_tbt: list[np.ndarray]) -> tuple[list[str], dict]:
    """Per tier, P50/P90/P99 of TTFT, TBT and TTLT, simulated / real, with the real value's 95% bootstrap
    interval over the run's requests (TTFT and TTLT; `bootstrap_quantile_ci`) and '*' where the simulated value
    lies inside it. The summary keeps each cell's signed error, whether it is inside the interval, and the
    per-tier TTFT/TTLT samples (for pooling runs in `--aggregate`)."""
    lines = [f"\n{name}", f"{'tier':>4} {'metric':>6} " + " ".join(
        f"{'P' + str(q) + ' sim/real (ms) [real 95% CI]':>44} {'err':>7}" for q in QUANTILES)]
    errs, inside = [], {}
    samples: dict[str, dict] = {"real": {}, "sim": {}}
    for tier in range(len(TIER_MIX)):
        for mi, metric in enumerate(("ttft", "tbt", "ttlt")):
            if metric == "tbt":
                rv = np.concatenate([r["tbt"] for r in real if r["tier"] == tier] or [np.zeros(0)])
                sv = sim_tbt[tier]
            else:
                rv = np.array([r[metric] for r in real if r["tier"] == tier])
                sv = np.array([s[metric] for s in sim if s["tier"] == tier])
            if len(rv) == 0 or len(sv) == 0:
                continue
            ci = (bootstrap_quantile_ci(rv, seed=(BOOTSTRAP_SEED, tier, mi)) if metric != "tbt"
                  else np.full((len(QUANTILES), 2), np.nan))
            if metric != "tbt":
                samples["real"].setdefault(str(tier), {})[metric] = [float(x) for x in rv]
                samples["sim"].setdefault(str(tier), {})[metric] = [float(x) for x in sv]
            cells = []
            for qi, q in enumerate(QUANTILES):
                a, b = float(np.percentile(sv, q)), float(np.percentile(rv, q))
                e = (a - b) / b * 100 if b > 0 else float("nan")
                errs.append((tier, metric, q, e))
                lo, hi = ci[qi]
                if metric == "tbt":
                    cells.append(f"{a * 1e3:11.1f} /{b * 1e3:10.1f} {'':21s} {e:+6.1f}%")
                else:
                    inside[f"tier {tier} {metric} P{q}"] = bool(lo <= a <= hi)
                    mark = "*" if lo <= a <= hi else " "
                    cells.append(f"{a * 1e3:11.1f} /{b * 1e3:10.1f} [{lo * 1e3:8.1f}..{hi * 1e3:8.1f}]{mark} "
                                 f"{e:+6.1f}%")
            lines.append(f"{tier:>4} {metric:>6} " + " ".join(cells))
    target_keys = [f"tier {t} {m} P{q}" for t, m, q, _ in errs if m in ("ttft", "ttlt") and q in (50, 90)]
    target = [abs(e) for _, m, q, e in errs if m in ("ttft", "ttlt") and q in (50, 90)]
    p99 = [abs(e) for _, m, q, e in errs if m in ("ttft", "ttlt") and q == 99]
    tbt = {q: [e for _, m, qq, e in errs if m == "tbt" and qq == q] for q in QUANTILES}
    summary = {"max": max(target), "mean": float(np.mean(target)), "within_10": sum(e <= 10 for e in target),
               "cells": len(target), "p99_max": max(p99), "p99_mean": float(np.mean(p99)),
               "inside_ci": sum(inside[k] for k in target_keys),
               "inside_ci_p99": sum(v for k, v in inside.items() if k.endswith("P99")),
               "within_10_or_inside_ci": sum(abs(e) <= 10 or inside[f"tier {t} {m} P{q}"] for t, m, q, e in errs
                                             if m in ("ttft", "ttlt") and q in (50, 90)),
               **{f"tbt_p{q}_err": float(np.mean(v)) for q, v in tbt.items() if v},    # signed, mean over tiers
               "signed": {f"tier {tier} {m} P{q}": e for tier, m, q, e in errs},     # every cell, signed %
               "inside": inside, "samples": samples}
    missed = [k for k in target_keys if not inside[k] and abs(summary["signed"][k]) > 10]
    unresolved = [k for k in target_keys if inside[k] and abs(summary["signed"][k]) > 10]
    lines.append(f"  |error| at P50/P90 of TTFT and TTLT: max {summary['max']:.1f}%, mean {summary['mean']:.1f}%, "
                 f"{summary['within_10']}/{summary['cells']} cells <= 10%, {summary['inside_ci']}/{summary['cells']} "
                 f"inside the real value's 95% interval (*); at P99 (TTFT, TTLT): max "
                 f"{summary['p99_max']:.1f}%, mean {summary['p99_mean']:.1f}%, {summary['inside_ci_p99']}/{len(p99)} "
                 f"inside; TBT error P50/P90/P99 (mean over "
                 f"tiers) " + "/".join(f"{summary[f'tbt_p{q}_err']:+.1f}%" for q in QUANTILES
                                       if f"tbt_p{q}_err" in summary))
    lines.append(f"  misses (> 10%) the run cannot resolve (inside the interval): {', '.join(unresolved) or 'none'}; "
                 f"outside it: {', '.join(missed) or 'none'}")
    return lines, summary


def stability(real: list[dict]) -> str:
    from tierserve.metrics.stability import stability_verdict
    v = stability_verdict([r["sent_s"] for r in real], [r["ttft"] for r in real])
    return f"{v.verdict} (window TTFT ratio last/first {v.ratio:.2f}, p {v.p_value:.3f})"
