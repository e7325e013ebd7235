# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""Llumnix's load value: virtual usage, per-tier headroom and freeness (higher = freer, everywhere).

Freeness of an instance (Llumnix, OSDI'24, Algorithm 1; ALGORITHMS.md §5):
    F = (M − ΣV) / B
M = total KV blocks; B = running requests (+1 if any are waiting); V = virtual usage:
  running request → the blocks it holds; head of the waiting queue → its whole prompt demand in blocks
  (the rest of the queue 0: de-fragmentation on); headroom → one budget per tier present on the instance;
  a terminating instance → +∞ (so F = −∞). An instance with nothing on it has F = +∞.
Per-tier headroom (seed 000): H_p = M · h_max · e^{−λp}, h_max = 0.20, λ = ln 3; K = 1 has none
(the schedules live in `headroom`, re-exported here).

The simulator compiles this module (tierserve/_native.py): a dispatch reads every instance's load and
freeness, so `measure_all` and `freest` are the per-instance loops of a Llumnix dispatch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

from tierserve.core import ConfigError, RequestState
from tierserve.policies.cluster.headroom import (  # noqa: F401  (re-exported: the public names of this module)
    ARTIFACT_RESERVE_TOKENS, DEFAULT_DECAY, DEFAULT_H_MAX, ExponentialHeadroom, FlatHeadroom, HeadroomSchedule,
    ScaledHeadroom, check_num_tiers,
)


def freeness(total_blocks: int, used_blocks: float, hol_blocks: float, headroom_blocks: float,
             num_running: int, num_waiting: int, terminating: bool = False) -> float:
    """F = (M − used − HOL demand − headroom) / (running + [waiting > 0]); +∞ when empty, −∞ when terminating."""
    if terminating:
        return -math.inf
    b = num_running + (1 if num_waiting else 0)
    if b == 0:
        return math.inf
    return (total_blocks - used_blocks - hol_blocks - headroom_blocks) / b


@dataclass(slots=True, init=False)
class InstanceLoad:
    """One instance's freeness inputs, read once per decision (Llumnix: load as a value object).

    `__init__` is written out (the dataclass's own would be interpreted code: most of a compiled read)."""

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

    def __init__(self, index: int, total_blocks: int, block_size: int, used_blocks: int, hol_blocks: int,
                 num_running: int, num_waiting: int, tier_counts: dict[int, int] | None = None,
                 preempted_waiting: bool = False, migrating: bool = False, terminating: bool = False) -> None:
        self.index = index
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.used_blocks = used_blocks
        self.hol_blocks = hol_blocks
        self.num_running = num_running
        self.num_waiting = num_waiting
        self.tier_counts = {} if tier_counts is None else tier_counts
        self.preempted_waiting = preempted_waiting
        self.migrating = migrating
        self.terminating = terminating

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
    """`measure` of each view, in order (one call per dispatch). A view class with a `measure_each(views,
    num_tiers)` static method (the simulator's `InstanceHandle`) reads the whole list itself."""
    if not views:
        return []
    measure_each = getattr(type(views[0]), "measure_each", None)
    if measure_each is not None:
        return measure_each(views, num_tiers)
    return [measure(v, num_tiers) for v in views]


def measure_counters(view, num_tiers: int | None = None) -> InstanceLoad:
    """`measure` from the load counters alone, nothing kept (or by a walk for views without counters)."""
    if not hasattr(view, "waiting_demand_blocks"):
        return measure_by_walk(view, num_tiers)
    counts = dict(view.tier_counts)       # the load's own copy: never mutated (`freest` keys on it)
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


# How `freest` charges the dispatch headroom: the policy's own `dispatch_headroom` for every changed load,
# or one of the two built-in rules computed here (the same arithmetic as their `dispatch_headroom` methods).
CHARGE_BY_METHOD = 0
CHARGE_HIGH_PRESENT = 1      # llumnix: a normal request pays budgets[0] where tier 0 is present, tier 0 where absent
CHARGE_TIERS_ABOVE = 2       # llumnix_k: the budgets of the tiers present that outrank the request's tier


class KeptFreeness:
    """An instance's dispatch freeness for one tier and what it came from: the load object, the budgets,
    and the headroom charge with the tier-count dict it was computed from."""

    def __init__(self, load: InstanceLoad, budgets: Any, counts: dict[int, int], charge: float,
                 free: float) -> None:
        self.load = load
        self.budgets = budgets
        self.counts = counts
        self.charge = charge
        self.free = free


def freest(loads: list[InstanceLoad], tier: int, headroom: Any, busy: float, kept: dict[int, KeptFreeness],
           rule: int, charge: Any) -> tuple[int, int]:
    """(freest instance whose dispatch freeness is >= `busy`, freest instance), −1 for none; ties go to the
    lowest index. Dispatch freeness = `load.freeness(h)`, h = the headroom charge of a tier-`tier` request
    (`rule`; `charge(load, tier, budgets)` for CHARGE_BY_METHOD) with `headroom.budgets(M)`.

    `kept` (per tier, instance index -> KeptFreeness) carries the last answer: the freeness of the same load
    object with equal budgets is reused (the charge and `freeness` read nothing else); a built-in rule's
    charge is reused while the load's tier-count dict is the same object (a load's counts are never mutated,
    and a charge reads nothing else)."""
    any_i = free_i = -1
    any_f = free_f = 0.0
    last_m = -1
    budgets: Any = None
    budgets_of: dict[int, Any] = {}          # M -> budgets: read once per M per call
    for load in loads:
        m = load.total_blocks
        if m != last_m:
            budgets = budgets_of.get(m)
            if budgets is None:
                budgets = budgets_of[m] = headroom.budgets(m)
            last_m = m
        i = load.index
        entry = kept.get(i)
        if entry is not None and entry.load is load and (entry.budgets is budgets or entry.budgets == budgets):
            f = entry.free
        else:
            counts = load.tier_counts
            if (entry is not None and rule != CHARGE_BY_METHOD and entry.counts is counts
                    and (entry.budgets is budgets or entry.budgets == budgets)):
                h = entry.charge
            elif rule == CHARGE_TIERS_ABOVE:
                h = 0.0                                  # = load.headroom(budgets, below=tier), same order
                for p in counts:
                    if p < tier:
                        h += budgets[p] if p < len(budgets) else 0.0
            elif rule == CHARGE_HIGH_PRESENT:
                h = budgets[0] if (tier == 0) != (0 in counts) else 0.0
            else:
                h = charge(load, tier, budgets)
            f = load.freeness(h)
            if entry is None:
                kept[i] = KeptFreeness(load, budgets, counts, h, f)
            else:
                entry.load, entry.budgets, entry.counts, entry.charge, entry.free = load, budgets, counts, h, f
        if any_i < 0 or f > any_f or (f == any_f and i < any_i):
            any_f, any_i = f, i
        if f >= busy and (free_i < 0 or f > free_f or (f == free_f and i < free_i)):
            free_f, free_i = f, i
    return free_i, any_i


def migration_freeness_all(loads: list[InstanceLoad], headroom: Any) -> list[float]:
    """`load.freeness(load.headroom(headroom.budgets(M)))` of each load, in order (seed 000's migration
    freeness: every tier present charges its budget once)."""
    frees: list[float] = []
    last_m = -1
    budgets: Any = None
    for load in loads:
        m = load.total_blocks
        if m != last_m:
            budgets = headroom.budgets(m)
            last_m = m
        frees.append(load.freeness(load.headroom(budgets)))
    return frees


def pair_by_freeness(loads: list[InstanceLoad], frees: list[float],
                     threshold: float) -> list[tuple[InstanceLoad, InstanceLoad]]:
    """`migration_policy.pair_instances` with each load's freeness given (frees[k] of loads[k]; loads that
    are migrating are skipped)."""
    # (freeness, index, position): sorted as tuples, position last so equal keys keep the input order
    src: list[tuple[float, int, int]] = []
    dst: list[tuple[float, int, int]] = []
    for k in range(len(loads)):
        load = loads[k]
        if load.migrating:
            continue
        f = frees[k]
        if load.terminating or load.preempted_waiting or f < threshold:
            src.append((f, load.index, k))
        elif f >= threshold:
            dst.append((-f, load.index, k))
    src.sort()
    dst.sort()
    return [(loads[s[2]], loads[d[2]]) for s, d in zip(src, dst)]
