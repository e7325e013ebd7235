"""Distribution statistics used by every summary: plain and weighted quantiles, and `LatencyStats`.

Plain samples use `numpy.percentile` (default linear interpolation). Weighted samples (token-level TBT,
where one value stands for `weight` tokens) use the inverted CDF, the only definition that is exact for
integer weights: the result equals `numpy.percentile(np.repeat(values, weights), p, method="inverted_cdf")`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields

import numpy as np
from numpy.typing import ArrayLike, NDArray

PERCENTILES: tuple[int, ...] = (50, 90, 95, 99)


def weighted_quantile(values: ArrayLike, weights: ArrayLike, q: ArrayLike) -> NDArray[np.float64] | float:
    """Inverted-CDF quantile(s) of `values` weighted by `weights`; `q` in [0, 1] (scalar or array).

    Returns the smallest value whose cumulative weight reaches `q * total`. NaN when the total weight is 0.
    Zero- or negative-weight entries are ignored.
    """
    v = np.asarray(values, dtype=np.float64).ravel()
    w = np.asarray(weights, dtype=np.float64).ravel()
    if v.shape != w.shape:
        raise ValueError(f"values and weights differ in length: {v.size} != {w.size}")
    qa = np.asarray(q, dtype=np.float64)
    if np.any((qa < 0) | (qa > 1)):
        raise ValueError(f"quantile q must lie in [0, 1]; got {q!r}")
    keep = w > 0
    v, w = v[keep], w[keep]
    if v.size == 0:
        out = np.full(qa.shape, np.nan)
        return float(out) if out.ndim == 0 else out
    order = np.argsort(v, kind="stable")
    v, cum = v[order], np.cumsum(w[order])
    # q * total computed exactly as numpy does (n * q) so integer weights match numpy's inverted_cdf bit for bit
    idx = np.searchsorted(cum, qa * cum[-1], side="left")
    out = v[np.minimum(idx, v.size - 1)]
    return float(out) if out.ndim == 0 else out


def weighted_mean(values: ArrayLike, weights: ArrayLike) -> float:
    """Weighted mean; NaN when the total weight is 0."""
    v = np.asarray(values, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    total = float(w.sum())
    return float(np.dot(v, w) / total) if total > 0 else math.nan


@dataclass(frozen=True, slots=True)
class LatencyStats:
    """Summary of one latency distribution, in seconds. `n` is the sample size (tokens for weighted TBT).

    Every field but `n` is NaN when the sample is empty.
    """

    n: int = 0
    mean: float = math.nan
    p50: float = math.nan
    p90: float = math.nan
    p95: float = math.nan
    p99: float = math.nan
    max: float = math.nan

    def to_dict(self) -> dict[str, float | int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, d: dict) -> LatencyStats:
        """Inverse of `to_dict`; None (JSON null) reads back as NaN."""
        kw = {f.name: (math.nan if d.get(f.name) is None else d[f.name]) for f in fields(cls)}
        kw["n"] = int(d.get("n") or 0)
        return cls(**kw)


def latency_stats(values: ArrayLike) -> LatencyStats:
    """Stats of a plain sample; NaNs are dropped (a request without that latency is not a sample)."""
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[~np.isnan(v)]
    if v.size == 0:
        return LatencyStats()
    p = np.percentile(v, PERCENTILES)
    return LatencyStats(int(v.size), float(v.mean()), *(float(x) for x in p), float(v.max()))


def weighted_latency_stats(values: ArrayLike, weights: ArrayLike) -> LatencyStats:
    """Stats of a weighted sample (inverted-CDF quantiles); `n` is the total weight."""
    v = np.asarray(values, dtype=np.float64).ravel()
    w = np.asarray(weights, dtype=np.float64).ravel()
    keep = (w > 0) & ~np.isnan(v)
    v, w = v[keep], w[keep]
    if v.size == 0:
        return LatencyStats()
    p = weighted_quantile(v, w, np.asarray(PERCENTILES, dtype=np.float64) / 100.0)
    return LatencyStats(int(round(w.sum())), weighted_mean(v, w), *(float(x) for x in p), float(v.max()))
