"""K-tier Llumnix (seed 000) and its adaptive-headroom variant (the seed's next steps).

`llumnix_k`: one headroom budget per tier, H_p = M·h_max·e^{−λp} (h_max 0.20, λ = ln 3), charged once
per tier present on an instance. A tier-p request is dispatched on freeness charged with the budgets of the
tiers present that outrank it (q < p): headroom is reserved *for* a tier, so that tier may use it, and a
single critical request steers all lower traffic away. Global queue in strict tier order, FCFS within a
tier; a request is held there while every instance is busy (freeness < 10 for it). Migration freeness
charges every tier present (the seed's imbalance check). K = 1: no headroom, FCFS + migration only.

`llumnix_k_adaptive`: per-tier budget multipliers s_p (H_p·s_p) follow observed TTFT misses: every
`adapt_period_s` each dispatched request is judged once (first token in time, or already late); a tier whose
windowed miss rate exceeds 1 − its attainment goal grows its budget by `gain`, others shrink it by gain/2,
within [s_min, h_cap/H_p]. Requests age upward one tier per `promote_after_s` waited before their first
token (global queue order, dispatch charge and migration choice), so no tier starves, but never above
`promote_floor` (default tier 1), so aged traffic does not erode tier 0's isolation.
"""
from __future__ import annotations

from typing import Sequence

from tierserve.core import ConfigError, RequestState
from tierserve.policies.cluster.base import InstanceView, Move
from tierserve.policies.cluster.freeness import (
    CHARGE_TIERS_ABOVE, DEFAULT_DECAY, DEFAULT_H_MAX, ExponentialHeadroom, HeadroomSchedule, InstanceLoad,
    ScaledHeadroom,
)
from tierserve.policies.cluster.llumnix import (
    BUSY_THRESHOLD, MIGRATE_OUT_THRESHOLD, REBALANCE_PERIOD_S, LlumnixPolicy, _positive,
)


class LlumnixK(LlumnixPolicy):
    """Seed 000's K-tier Llumnix: exponential per-tier headroom, strict tier-order dispatch, migration."""

    name = "llumnix_k"

    def __init__(self, num_tiers: int = 4, h_max: float = DEFAULT_H_MAX, decay: float = DEFAULT_DECAY,
                 migrate_threshold: float = MIGRATE_OUT_THRESHOLD, busy_threshold: float = BUSY_THRESHOLD,
                 rebalance_period_s: float = REBALANCE_PERIOD_S, request_policy: str = "tiered",
                 protected_tiers: int = 1, hold_when_busy: bool = True, migration: bool = True) -> None:
        self._h_max, self._decay = h_max, decay
        super().__init__(num_tiers, migrate_threshold, busy_threshold, rebalance_period_s, request_policy,
                         # K = 1 has no priority tier to protect: its single tier is "normal" and migrates
                         min(protected_tiers, num_tiers - 1) if isinstance(num_tiers, int) and num_tiers >= 1
                         else protected_tiers,
                         None, hold_when_busy, migration)
        if type(self).dispatch_headroom is LlumnixK.dispatch_headroom:
            self._charge_rule = CHARGE_TIERS_ABOVE

    def make_headroom(self, headroom_blocks: int | None) -> HeadroomSchedule:
        return ExponentialHeadroom(self.num_tiers, self._h_max, self._decay)

    def dispatch_headroom(self, load: InstanceLoad, tier: int, budgets: list[float]) -> float:
        return load.headroom(budgets, below=tier)


class LlumnixKAdaptive(LlumnixK):
    """`llumnix_k` with SLO-driven per-tier budgets and promotion of long-waiting requests."""

    name = "llumnix_k_adaptive"

    def __init__(self, num_tiers: int = 4, h_max: float = DEFAULT_H_MAX, decay: float = DEFAULT_DECAY,
                 adapt_period_s: float = 1.0, gain: float = 0.25, smoothing: float = 0.3, s_min: float = 0.25,
                 h_cap: float = 0.5, promote_after_s: float = 5.0, promote_floor: int = 1, **kwargs) -> None:
        super().__init__(num_tiers, h_max, decay, **kwargs)
        self.adapt_period_s = _positive("adapt_period_s", adapt_period_s)
        self.promote_after_s = _positive("promote_after_s", promote_after_s)
        if not (isinstance(promote_floor, int) and promote_floor >= 0):
            raise ConfigError("promote_floor", promote_floor, "an integer tier >= 0")
        self.promote_floor = promote_floor    # aged requests never rise above it (default: not into tier 0)
        self.gain = _positive("gain", gain)
        if not 0.0 < smoothing <= 1.0:
            raise ConfigError("smoothing", smoothing, "a weight in (0, 1]")
        if not 0.0 < s_min <= 1.0:
            raise ConfigError("s_min", s_min, "a multiplier in (0, 1]")
        if not h_max <= h_cap < 1.0:
            raise ConfigError("h_cap", h_cap, f"a fraction in [h_max = {h_max}, 1)")
        self.smoothing, self.s_min, self.h_cap = smoothing, s_min, h_cap
        base = self.headroom
        self.headroom = ScaledHeadroom(base, [1.0] * self.num_tiers)
        fr = base.fractions()
        self._s_max = [h_cap / f if f > 0 else 1.0 for f in fr]
        self.miss_rate = [0.0] * self.num_tiers
        self.miss_goal = [0.01] * self.num_tiers          # 1 − attainment, read from judged requests
        self._pending: list[RequestState] = []
        self._next_adapt = self.adapt_period_s
        self.history: list[tuple[float, list[float]]] = []   # (time, multipliers) after each adaptation

    @property
    def scales(self) -> list[float]:
        return self.headroom.scales

    def effective_tier(self, state: RequestState, now: float) -> int:
        t = state.tier
        if t <= self.promote_floor or state.first_token_s >= 0:
            return t
        return max(self.promote_floor, t - int((now - state.arrival_s) / self.promote_after_s))

    def dispatch(self, state: RequestState, instances: Sequence[InstanceView], now: float) -> int | None:
        target = super().dispatch(state, instances, now)
        if target is not None and state.slo.ttft_s is not None:
            self._pending.append(state)
        return target

    def rebalance(self, instances: Sequence[InstanceView], now: float) -> list[Move]:
        if now >= self._next_adapt:
            self._next_adapt = now + self.adapt_period_s
            self.adapt(now)
        return super().rebalance(instances, now)

    def adapt(self, now: float) -> None:
        """Judge each dispatched request once on TTFT, then nudge every tier's budget multiplier."""
        k = self.num_tiers
        seen, missed = [0] * k, [0] * k
        keep = []
        for s in self._pending:
            target = s.slo.ttft_s
            t = s.tier
            self.miss_goal[t] = 1.0 - s.slo.attainment
            if s.first_token_s >= 0:
                seen[t] += 1
                missed[t] += s.first_token_s - s.arrival_s > target
            elif now - s.arrival_s > target:
                seen[t] += 1
                missed[t] += 1
            else:
                keep.append(s)
        self._pending = keep
        scales = self.headroom.scales
        b = self.smoothing
        for t in range(k):
            if seen[t]:
                self.miss_rate[t] = (1 - b) * self.miss_rate[t] + b * missed[t] / seen[t]
            up = self.miss_rate[t] > self.miss_goal[t]
            s = scales[t] * (1 + self.gain) if up else scales[t] * (1 - self.gain / 2)
            scales[t] = min(max(s, self.s_min), self._s_max[t])
        self.history.append((now, list(scales)))


def headroom_fractions(num_tiers: int, h_max: float = DEFAULT_H_MAX, decay: float = DEFAULT_DECAY) -> list[float]:
    """H_p / M for each tier (for reports)."""
    return ExponentialHeadroom(num_tiers, h_max, decay).fractions()


