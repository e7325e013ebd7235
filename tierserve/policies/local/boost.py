"""Boost functions of the γ-Boost family (seed 001, UniBoost; ALGORITHMS.md §3), free of any policy.

* `known_size_boost(s, γ)` — γ-Boost's boost for a job of known size s (Yu & Scully, POMACS 2024):
  b_γ(s) = (1/γ)·log(1/(1 − e^{−γs})), computed as −log(−expm1(−γs))/γ. It is decreasing in s, b(0+) = ∞,
  and it is its own inverse (b(b(s)) = s). Serving by min(arrival − boost) is FCFS as γ → ∞ and SJF as γ → 0.
* `attained_boost(sizes, age, γ)` — the unknown-size boost from attained service (Harlev, Yu & Scully,
  POMACS 2025): b_γ(a) = (1/γ)·log(J_γ(a)/γ), J_γ(a) = sup_Δ E[e^{γR}·1{R ≤ Δ}] / E[(e^{γ·min(R, Δ)} − 1)/γ]
  with R = S − a given S > a, for the empirical distribution of `sizes`; the sup runs over Δ at its atoms.
  With a single atom it is `known_size_boost` of the remaining size.
* `fcfs_tail_decay_rate(λ, mgf)` — γ-Ada's anchor: the decay rate of the M/G/1 FCFS waiting-time tail, the
  positive root of λ(E[e^{γS}] − 1) = γ (M/M/1: μ − λ); `empirical_mgf(sizes)` gives E[e^{γS}] of samples;
  `general_tail_decay_rate(sizes, gaps)` solves E[e^{γ(S − A)}] = 1 for general arrivals.
Units are the caller's: sizes and ages in seconds of service, γ in 1/s.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from tierserve.core import ConfigError


def check_gamma(gamma: float, name: str = "gamma") -> float:
    if not (isinstance(gamma, (int, float)) and math.isfinite(gamma) and gamma > 0):
        raise ConfigError(name, gamma, "a finite number > 0 (1/s)")
    return float(gamma)


def known_size_boost(size: float, gamma: float) -> float:
    """b_γ(s) = −log(−expm1(−γs))/γ; +∞ at s ≤ 0 (a job with no work left is boosted past everyone)."""
    if size <= 0:
        return math.inf
    return -math.log(-math.expm1(-gamma * size)) / gamma


def attained_boost(sorted_sizes: Sequence[float] | np.ndarray, age: float, gamma: float) -> float:
    """Unknown-size boost at attained service `age` for the empirical distribution of `sorted_sizes`
    (ascending). Jobs never seen to run longer than `age` give 0 (no information: plain FCFS order)."""
    s = np.asarray(sorted_sizes, dtype=np.float64)
    r = s[np.searchsorted(s, age, side="right"):] - age       # remaining sizes R = S − a given S > a
    m = r.size
    if m == 0:
        return 0.0
    # In units of e^{γ·r_max}, so nothing overflows; the ratio J is unchanged by the common factor.
    shift = gamma * r[-1]
    e = np.exp(gamma * r - shift)
    e0 = math.exp(-shift)
    num = np.cumsum(e)                                         # Σ_{j≤k} e^{γ r_j}  (equal weights cancel)
    below = np.cumsum(e - e0) / gamma                          # Σ_{j≤k} (e^{γ r_j} − 1)/γ
    tail = (m - np.arange(1, m + 1)) * (e - e0) / gamma        # (#{j > k}) · (e^{γ r_k} − 1)/γ
    den = below + tail
    ok = den > 0
    if not ok.any():
        return math.inf                                        # every remaining size is 0: done
    j = float(np.max(num[ok] / den[ok]))
    return math.log(j / gamma) / gamma


def empirical_mgf(sizes: Sequence[float] | np.ndarray) -> Callable[[float], float]:
    """E[e^{γS}] over the samples (+∞ where it overflows)."""
    s = np.asarray(sizes, dtype=np.float64)

    def mgf(gamma: float) -> float:
        with np.errstate(over="ignore"):
            return float(np.mean(np.exp(gamma * s)))
    return mgf


def _positive_root(f: Callable[[float], float], scale: float, rel_tol: float = 1e-12) -> float:
    """The positive root of a convex f with f(0) = 0 and f'(0) < 0, by doubling then bisection."""
    lo, hi = 0.0, scale
    for _ in range(200):
        if not f(hi) < 0:
            break
        lo, hi = hi, hi * 2.0
    else:
        return math.nan
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if f(mid) < 0:
            lo = mid
        else:
            hi = mid
        if hi - lo <= rel_tol * hi:
            break
    return 0.5 * (lo + hi)


def fcfs_tail_decay_rate(arrival_rate: float, mgf: Callable[[float], float], mean_size: float) -> float:
    """γ* > 0 with λ(E[e^{γ*S}] − 1) = γ* (Poisson arrivals); 0 when λ·E[S] ≥ 1 (no decay: overload)."""
    if arrival_rate <= 0 or mean_size <= 0:
        return math.nan
    if arrival_rate * mean_size >= 1.0:
        return 0.0
    return _positive_root(lambda g: arrival_rate * (mgf(g) - 1.0) - g, 0.1 / mean_size)


def general_tail_decay_rate(sizes: Sequence[float], gaps: Sequence[float]) -> float:
    """γ* > 0 with E[e^{γ*S}]·E[e^{−γ*A}] = 1 (S, A independent: GI/G/1); 0 when E[S] ≥ E[A]."""
    s = np.asarray(sizes, dtype=np.float64)
    a = np.asarray(gaps, dtype=np.float64)
    if s.size == 0 or a.size == 0 or s.mean() <= 0:
        return math.nan
    if s.mean() >= a.mean():
        return 0.0

    def f(g: float) -> float:
        with np.errstate(over="ignore"):
            return math.log(np.mean(np.exp(g * s))) + math.log(np.mean(np.exp(-g * a)))
    return _positive_root(f, 0.1 / s.mean())


__all__ = ["attained_boost", "check_gamma", "empirical_mgf", "fcfs_tail_decay_rate", "general_tail_decay_rate",
           "known_size_boost"]
