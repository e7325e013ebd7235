"""Llumnix's load value: virtual usage, per-tier headroom and freeness (higher = freer, everywhere).

Freeness of an instance (Llumnix, OSDI'24, Algorithm 1; ALGORITHMS.md §5):
    F = (M − ΣV) / B
M = total KV blocks; B = running requests (+1 if any are waiting); V = virtual usage:
  running request → the blocks it holds; head of the waiting queue → its whole prompt demand in blocks
  (the rest of the queue 0: de-fragmentation on); headroom → one budget per tier present on the instance;
  a terminating instance → +∞ (so F = −∞). An instance with nothing on it has F = +∞.
Per-tier headroom (seed 000): H_p = M · h_max · e^{−λp}, h_max = 0.20, λ = ln 3; K = 1 has none.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from tierserve.core import ConfigError, RequestState

DEFAULT_H_MAX = 0.20
DEFAULT_DECAY = math.log(3.0)       # each tier reserves ≈ 1/3 of the one above (seed 000)
ARTIFACT_RESERVE_TOKENS = 1600      # Llumnix artifact: high priority sees only M − (M − 1600/16) blocks


def freeness(total_blocks: int, used_blocks: float, hol_blocks: float, headroom_blocks: float,
             num_running: int, num_waiting: int, terminating: bool = False) -> float:
    """F = (M − used − HOL demand − headroom) / (running + [waiting > 0]); +∞ when empty, −∞ when terminating."""
    if terminating:
        return -math.inf
    b = num_running + (1 if num_waiting else 0)
    if b == 0:
        return math.inf
    return (total_blocks - used_blocks - hol_blocks - headroom_blocks) / b


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


@dataclass(slots=True)
class InstanceLoad:
    """One instance's freeness inputs, read once per decision (Llumnix: load as a value object)."""

    index: int
    total_blocks: int
    block_size: int
    used_blocks: int
    hol_blocks: int
    num_running: int
    num_waiting: int
    tier_counts: dict[int, int] = field(default_factory=dict)   # running + waiting + swapped, per tier
    preempted_waiting: bool = False
    migrating: bool = False
    terminating: bool = False

    def freeness(self, headroom_blocks: float = 0.0) -> float:
        return freeness(self.total_blocks, self.used_blocks, self.hol_blocks, headroom_blocks,
                        self.num_running, self.num_waiting, self.terminating)

    def headroom(self, budgets: Sequence[float], below: int | None = None) -> float:
        """Σ H_p over tiers present; with `below`, only tiers p < below (those that outrank a tier-`below` request)."""
        total = 0.0
        for p in self.tier_counts:
            if below is None or p < below:
                total += budgets[p] if p < len(budgets) else 0.0
        return total


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def queue_head(waiting: Sequence[RequestState]) -> RequestState | None:
    """Head of a llumlet queue: tier first, then arrival (seed 000)."""
    if not waiting:
        return None
    return min(waiting, key=lambda s: (s.tier, s.arrival_s, s.id))


def check_tier_counts(counts: dict[int, int], num_tiers: int | None) -> None:
    if num_tiers is not None:
        for t in counts:
            if not 0 <= t < num_tiers:
                raise ConfigError("request.tier", t, f"an integer in 0..{num_tiers - 1} (K = {num_tiers})")


def measure(view, num_tiers: int | None = None) -> InstanceLoad:
    """Read an InstanceView once. The running term is `used_blocks` (held + reserved for incoming migration +
    paused in a final migration stage): all of it is committed memory. Raises ConfigError for a tier ≥ K.

    Constant time from the view's load counters (`LoadCounters`) when it has them; otherwise a walk over
    its queues (`measure_by_walk`, the definition the counters must reproduce exactly). A view that keeps
    its last load (`InstanceHandle.measure_load`) answers from it; the result is then shared: read-only."""
    measure_load = getattr(view, "measure_load", None)
    if measure_load is not None:
        return measure_load(num_tiers)
    return measure_counters(view, num_tiers)


def measure_all(views: Sequence, num_tiers: int | None = None) -> list[InstanceLoad]:
    """`measure` of each view, in order (one call per dispatch: the per-view wrapper is most of a kept read)."""
    loads = []
    for v in views:
        measure_load = getattr(v, "measure_load", None)
        loads.append(measure_load(num_tiers) if measure_load is not None else measure_counters(v, num_tiers))
    return loads


def measure_counters(view, num_tiers: int | None = None) -> InstanceLoad:
    """`measure` from the load counters alone, nothing kept (or by a walk for views without counters)."""
    if not hasattr(view, "waiting_demand_blocks"):
        return measure_by_walk(view, num_tiers)
    counts = view.tier_counts
    check_tier_counts(counts, num_tiers)
    bs = view.block_size
    head = view.waiting_head
    hol = blocks_for(head.num_tokens, bs) if head is not None else 0
    hol += view.swapped_demand_blocks
    queued = view.num_queued
    preempted = view.num_preempted_waiting > 0 or bool(view.swapped)
    return InstanceLoad(view.index, view.total_blocks, bs, view.used_blocks, hol, view.num_running,
                        queued, counts, preempted, bool(view.migrating), view.terminating)


def measure_by_walk(view, num_tiers: int | None = None) -> InstanceLoad:
    """`measure` by walking every request on the instance (for views without load counters)."""
    bs = view.block_size
    running = view.running
    waiting = view.waiting
    swapped = view.swapped
    counts: dict[int, int] = {}
    for group in (running, waiting, swapped):
        for s in group:
            t = s.tier
            counts[t] = counts.get(t, 0) + 1
    check_tier_counts(counts, num_tiers)
    head = queue_head(waiting)
    hol = blocks_for(head.num_tokens, bs) if head is not None else 0
    hol += sum(blocks_for(s.num_tokens, bs) for s in swapped)   # swapped KV must come back before they run
    preempted = any(s.num_preemptions > 0 for s in waiting) or bool(swapped)
    return InstanceLoad(view.index, view.total_blocks, bs, view.used_blocks, hol, len(running),
                        len(waiting) + len(swapped), counts, preempted, bool(view.migrating),
                        view.terminating)
