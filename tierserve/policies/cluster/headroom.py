"""Per-tier KV headroom schedules for Llumnix-style freeness (seed 000; ALGORITHMS.md §5).

Kept apart from `freeness` (which the simulator compiles): a policy may subclass `HeadroomSchedule`, and
compiled classes cannot be subclassed from interpreted code. `freeness` re-exports every name here.
Per-tier headroom (seed 000): H_p = M · h_max · e^{−λp}, h_max = 0.20, λ = ln 3; K = 1 has none.
"""
from __future__ import annotations

import math

from tierserve.core import ConfigError

DEFAULT_H_MAX = 0.20
DEFAULT_DECAY = math.log(3.0)       # each tier reserves ≈ 1/3 of the one above (seed 000)
ARTIFACT_RESERVE_TOKENS = 1600      # Llumnix artifact: high priority sees only M − (M − 1600/16) blocks


def check_num_tiers(num_tiers: int) -> int:
    if isinstance(num_tiers, bool) or not isinstance(num_tiers, int) or num_tiers < 1:
        raise ConfigError("num_tiers", num_tiers, "an integer >= 1")
    return num_tiers


class HeadroomSchedule:
    """Blocks reserved per tier present on an instance of M blocks: `budgets(M)[p]` for p in 0..K−1."""

    num_tiers: int

    def budgets(self, total_blocks: int) -> list[float]:
        raise NotImplementedError


class ExponentialHeadroom(HeadroomSchedule):
    """Seed 000: H_p = M · h_max · e^{−λp} for K ≥ 2; K = 1 reserves nothing (no tier to isolate from)."""

    def __init__(self, num_tiers: int, h_max: float = DEFAULT_H_MAX, decay: float = DEFAULT_DECAY) -> None:
        self.num_tiers = check_num_tiers(num_tiers)
        if not (isinstance(h_max, (int, float)) and 0.0 <= h_max < 1.0):
            raise ConfigError("h_max", h_max, "a fraction in [0, 1)")
        if not (isinstance(decay, (int, float)) and math.isfinite(decay) and decay >= 0.0):
            raise ConfigError("decay", decay, "a finite rate >= 0 (λ; ln 3 ≈ 1.0986 by default)")
        self.h_max = float(h_max)
        self.decay = float(decay)
        self._budgets: dict[int, list[float]] = {}

    def fractions(self) -> list[float]:
        if self.num_tiers == 1:
            return [0.0]
        return [self.h_max * math.exp(-self.decay * p) for p in range(self.num_tiers)]

    def budgets(self, total_blocks: int) -> list[float]:
        """Read on every dispatch for every instance: computed once per M (treat the list as read-only)."""
        b = self._budgets.get(total_blocks)
        if b is None:
            b = self._budgets[total_blocks] = [total_blocks * f for f in self.fractions()]
        return b


class ScaledHeadroom(HeadroomSchedule):
    """A base schedule with a per-tier multiplier (what adaptive headroom tunes online)."""

    def __init__(self, base: HeadroomSchedule, scales: list[float]) -> None:
        self.num_tiers = base.num_tiers
        self.base = base
        self.scales = scales

    def budgets(self, total_blocks: int) -> list[float]:
        return [h * s for h, s in zip(self.base.budgets(total_blocks), self.scales)]


class FlatHeadroom(HeadroomSchedule):
    """Llumnix's artifact: one high level (tier 0) reserves a flat budget, default M − 1600/block_size blocks."""

    def __init__(self, num_tiers: int, headroom_blocks: int | None = None, block_size: int = 16) -> None:
        self.num_tiers = check_num_tiers(num_tiers)
        if headroom_blocks is not None and (not isinstance(headroom_blocks, int) or headroom_blocks < 0):
            raise ConfigError("headroom_blocks", headroom_blocks, "an integer >= 0, or null for M − 100 blocks")
        self.headroom_blocks = headroom_blocks
        self.block_size = block_size

    def budgets(self, total_blocks: int) -> list[float]:
        h0 = (self.headroom_blocks if self.headroom_blocks is not None
              else max(total_blocks - ARTIFACT_RESERVE_TOKENS // self.block_size, 0))
        return [float(h0)] + [0.0] * (self.num_tiers - 1)
