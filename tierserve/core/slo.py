"""Service-level objectives and the tiers that carry them."""
from __future__ import annotations

import math
from dataclasses import dataclass

from tierserve.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class SLO:
    """Per-request latency targets in seconds; None means the target does not apply.

    `attainment` is the fraction of requests that must meet every target (e.g. 0.99).
    """

    ttft_s: float | None = None
    tbt_s: float | None = None
    ttlt_s: float | None = None
    attainment: float = 0.99

    def __post_init__(self) -> None:
        for name in ("ttft_s", "tbt_s", "ttlt_s"):
            v = getattr(self, name)
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise ConfigError(f"slo.{name}", v, "a positive finite number of seconds, or null")
        if not 0.0 < self.attainment <= 1.0:
            raise ConfigError("slo.attainment", self.attainment, "a fraction in (0, 1]")

    @property
    def interactive(self) -> bool:
        """Interactive requests are judged on TTFT/TBT; non-interactive ones on TTLT (Niyama's QoS classes)."""
        return self.ttft_s is not None or self.tbt_s is not None


NO_SLO = SLO()


@dataclass(frozen=True, slots=True)
class Tier:
    """An SLA tier. Index 0 is the most important; larger index = lower tier."""

    index: int
    name: str
    slo: SLO = NO_SLO


class TierSet:
    """An ordered set of K tiers (index 0 … K-1)."""

    __slots__ = ("tiers",)

    def __init__(self, tiers: list[Tier] | tuple[Tier, ...]) -> None:
        if len(tiers) < 1:
            raise ConfigError("tiers", len(tiers), "at least one tier (K >= 1)")
        for i, t in enumerate(tiers):
            if t.index != i:
                raise ConfigError(f"tiers[{i}].index", t.index, f"{i} (tiers are numbered 0..K-1 in order)")
        self.tiers = tuple(tiers)

    @classmethod
    def default(cls, k: int, slos: list[SLO] | None = None) -> TierSet:
        if not isinstance(k, int) or k < 1:
            raise ConfigError("num_tiers", k, "an integer >= 1")
        if slos is not None and len(slos) != k:
            raise ConfigError("tier_slos", len(slos), f"exactly {k} SLOs, one per tier")
        return cls([Tier(i, f"tier{i}", slos[i] if slos else NO_SLO) for i in range(k)])

    def __len__(self) -> int:
        return len(self.tiers)

    def __getitem__(self, i: int) -> Tier:
        return self.tiers[i]

    def __iter__(self):
        return iter(self.tiers)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tiers]

    def check_tier(self, tier: int, where: str = "tier") -> None:
        if not 0 <= tier < len(self.tiers):
            raise ConfigError(where, tier, f"an integer in 0..{len(self.tiers) - 1} (K = {len(self.tiers)})")
