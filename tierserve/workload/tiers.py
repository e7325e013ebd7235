"""Tier mixes (what share of requests each tier gets) and default per-tier SLOs.

Mixes over K tiers (index 0 = most important), after seed 000 §5 (uniform, Gaussian, enterprise):
* `uniform`: 1/K each.
* `gaussian`: middle-heavy, w_i ∝ exp(−(i − (K−1)/2)² / (2σ²)) with σ = K/4 by default.
* `enterprise`: ≈10% tier 0, 70% middle, 20% bottom for K = 3. Generalised: tier 0 gets 10%, tier K−1
  gets 20%, and the 70% middle share is split evenly over tiers 1..K−2. K = 2: 10% / 90% (no middle: the
  non-premium share is one tier); K = 1: 100%.
* `weights`: explicit, normalised to sum 1.

Default SLOs (`default_slos(K)`), chosen for Llama-3-8B-class replicas where an unloaded TTFT is ~0.1 s and a
decode step ~20–30 ms; tighter tiers first:
* interactive tiers 0..K−2: TTFT = 0.5 s · 3^i, TBT = 50 ms · 2^i (tier 0: 0.5 s / 50 ms; tier 1: 1.5 s / 100 ms;
  tier 2: 4.5 s / 200 ms …), attainment 0.99;
* the last tier (K ≥ 2) is non-interactive: TTLT 60 s only (a batch-like tier that a run of a few minutes can
  still violate), attainment 0.99. K = 1: the single tier is tier 0's interactive SLO.
Niyama preset (seed 003): Q1 interactive TTFT 6 s / TBT 50 ms, Q2 TTLT 600 s, Q3 TTLT 1800 s, 1/3 each.
"""
from __future__ import annotations

import math

import numpy as np

from tierserve.core.errors import ConfigError
from tierserve.core.slo import SLO, Tier, TierSet

TIER_MIXES = ("uniform", "gaussian", "enterprise", "weights")
ENTERPRISE_TOP, ENTERPRISE_MIDDLE, ENTERPRISE_BOTTOM = 0.10, 0.70, 0.20


def _check_k(k: int) -> None:
    if not isinstance(k, int) or k < 1:
        raise ConfigError("tiers.num_tiers", k, "an integer >= 1")


def uniform_mix(k: int) -> np.ndarray:
    _check_k(k)
    return np.full(k, 1.0 / k)


def gaussian_mix(k: int, sigma: float | None = None) -> np.ndarray:
    """Middle-heavy weights; sigma in tier units (default K/4)."""
    _check_k(k)
    s = k / 4 if sigma is None else sigma
    if not (math.isfinite(s) and s > 0):
        raise ConfigError("tiers.sigma", sigma, "a positive number of tiers")
    i = np.arange(k)
    d2 = (i - (k - 1) / 2) ** 2
    with np.errstate(divide="ignore", invalid="ignore", under="ignore"):
        w = np.exp(-d2 / (2 * s * s))
    if not (np.isfinite(w).all() and w.sum() > 0):   # σ so small every weight underflows: its limit,
        w = (d2 == d2.min()).astype(float)           # all mass on the middle tier(s)
    return w / w.sum()


def enterprise_mix(k: int) -> np.ndarray:
    """10% top, 70% spread over the middle tiers, 20% bottom (see module docstring for K < 3)."""
    _check_k(k)
    if k == 1:
        return np.ones(1)
    if k == 2:
        return np.array([ENTERPRISE_TOP, 1 - ENTERPRISE_TOP])
    w = np.full(k, ENTERPRISE_MIDDLE / (k - 2))
    w[0], w[-1] = ENTERPRISE_TOP, ENTERPRISE_BOTTOM
    return w


def explicit_mix(weights: list[float] | tuple[float, ...], k: int | None = None) -> np.ndarray:
    w = np.asarray(weights, float)
    if w.ndim != 1 or len(w) == 0:
        raise ConfigError("tiers.weights", weights, "a non-empty list of weights, one per tier")
    if k is not None and len(w) != k:
        raise ConfigError("tiers.weights", list(weights), f"exactly num_tiers = {k} weights")
    if not np.all(np.isfinite(w)) or np.any(w < 0) or w.sum() <= 0:
        raise ConfigError("tiers.weights", list(weights), "finite weights >= 0 with a positive sum")
    return w / w.sum()


def tier_mix(kind: str, k: int, weights: list[float] | None = None, sigma: float | None = None) -> np.ndarray:
    """Weights of mix `kind` over K tiers."""
    if kind == "uniform":
        return uniform_mix(k)
    if kind == "gaussian":
        return gaussian_mix(k, sigma)
    if kind == "enterprise":
        return enterprise_mix(k)
    if kind == "weights":
        if weights is None:
            raise ConfigError("tiers.weights", None, "a list of K weights when mix = 'weights'")
        return explicit_mix(weights, k)
    raise ConfigError("tiers.mix", kind, " | ".join(TIER_MIXES))


def assign_tiers(n: int, weights: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Independent tier draw per request."""
    return rng.choice(len(weights), size=n, p=weights)


def default_slos(k: int) -> list[SLO]:
    """Default per-tier SLOs (module docstring)."""
    _check_k(k)
    if k == 1:
        return [SLO(ttft_s=0.5, tbt_s=0.05)]
    slos = [SLO(ttft_s=0.5 * 3 ** i, tbt_s=0.05 * 2 ** i) for i in range(k - 1)]
    return slos + [SLO(ttlt_s=60.0)]


def default_tier_set(k: int) -> TierSet:
    return TierSet.default(k, default_slos(k))


NIYAMA_SLOS = (SLO(ttft_s=6.0, tbt_s=0.05), SLO(ttlt_s=600.0), SLO(ttlt_s=1800.0))
NIYAMA_MIX = (1 / 3, 1 / 3, 1 / 3)


def niyama_tier_set() -> TierSet:
    """Niyama's QoS classes as three tiers Q1 (interactive), Q2, Q3 (non-interactive)."""
    return TierSet([Tier(i, f"Q{i + 1}", s) for i, s in enumerate(NIYAMA_SLOS)])
