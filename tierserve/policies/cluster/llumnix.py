"""Llumnix's global scheduler (OSDI'24): dispatch to the freest instance, migrate from the least free.

`llumnix` is the paper's two-level form: tier 0 is the single high-priority level with the artifact's flat
headroom (M − 100 blocks, `FlatHeadroom`), every other tier is "normal". Dispatch follows the artifact
(`compute_instance_load_dispatch`): a normal request is charged the headroom where tier 0 is present, a
tier-0 request where it is absent (so priority traffic gathers and normal traffic avoids it). Busy
instances (freeness < 10) are skipped while others exist; if all are busy, the freest is used.
Rebalance every 50 ms: pair sources and destinations (`migration_policy`), one move per pair.
"""
from __future__ import annotations

import math
from typing import Sequence

from tierserve.core import ConfigError, RequestState, Status
from tierserve.policies.cluster.base import ClusterPolicy, InstanceView, Move
from tierserve.policies.cluster.freeness import (
    CHARGE_BY_METHOD, CHARGE_HIGH_PRESENT, FlatHeadroom, HeadroomSchedule, InstanceLoad, KeptFreeness,
    check_num_tiers, freeness, freest, measure_all, migration_freeness_all,
)
from tierserve.policies.cluster.migration_policy import (
    check_request_policy, move_cost_blocks, narrows_gap, pair_instances, pick_candidate,
)

MIGRATE_OUT_THRESHOLD = 3.0     # freeness (decode steps) below which an instance migrates out (artifact)
BUSY_THRESHOLD = 10.0           # Llumnix HEAD REMAININGSTEPS_BUSY_THRESHOLD
REBALANCE_PERIOD_S = 0.05       # Llumnix HEAD polling interval


def _positive(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise ConfigError(name, value, "a positive finite number")
    return float(value)


class LlumnixPolicy(ClusterPolicy):
    """Freeness dispatch + periodic live migration; subclasses choose the headroom and dispatch charge."""

    name = "llumnix"
    migrates = True

    def __init__(self, num_tiers: int = 2, migrate_threshold: float = MIGRATE_OUT_THRESHOLD,
                 busy_threshold: float = BUSY_THRESHOLD, rebalance_period_s: float = REBALANCE_PERIOD_S,
                 request_policy: str = "tiered", protected_tiers: int = 1, headroom_blocks: int | None = None,
                 hold_when_busy: bool = False, migration: bool = True) -> None:
        self.num_tiers = check_num_tiers(num_tiers)
        if not (isinstance(migrate_threshold, (int, float)) and math.isfinite(migrate_threshold)):
            raise ConfigError("migrate_threshold", migrate_threshold, "a finite freeness value (paper: 3)")
        if not (isinstance(busy_threshold, (int, float)) and math.isfinite(busy_threshold)):
            raise ConfigError("busy_threshold", busy_threshold, "a finite freeness value (Llumnix: 10)")
        if not isinstance(protected_tiers, int) or not 0 <= protected_tiers <= self.num_tiers:
            raise ConfigError("protected_tiers", protected_tiers, f"an integer in 0..{self.num_tiers}")
        self.migrate_threshold = float(migrate_threshold)
        self.busy_threshold = float(busy_threshold)
        self.rebalance_period_s = _positive("rebalance_period_s", rebalance_period_s)
        self.request_policy = check_request_policy(request_policy)
        self.protected_tiers = protected_tiers
        self.hold_when_busy = bool(hold_when_busy)
        self.migration_enabled = bool(migration)
        self.headroom = self.make_headroom(headroom_blocks)
        # tier -> instance -> its dispatch freeness and what it came from, as the last dispatch computed it
        self._kept_freeness: dict[int, dict[int, KeptFreeness]] = {}
        # `freest` computes the built-in charge itself; a subclass's own `dispatch_headroom` is called instead
        self._charge_rule = (CHARGE_HIGH_PRESENT if type(self).dispatch_headroom is LlumnixPolicy.dispatch_headroom
                             else CHARGE_BY_METHOD)

    # ----- what subclasses vary -----
    def make_headroom(self, headroom_blocks: int | None) -> HeadroomSchedule:
        return FlatHeadroom(self.num_tiers, headroom_blocks)

    def dispatch_headroom(self, load: InstanceLoad, tier: int, budgets: list[float]) -> float:
        """Artifact rule: normal pays where tier 0 is present; tier 0 pays where it is absent."""
        has_high = 0 in load.tier_counts
        return budgets[0] if (tier == 0) != has_high else 0.0

    def effective_tier(self, state: RequestState, now: float) -> int:
        """The tier used for ordering and headroom (the adaptive variant promotes long waits)."""
        return state.tier

    # ----- helpers -----
    def check_tier(self, state: RequestState) -> int:
        t = state.tier
        if not 0 <= t < self.num_tiers:
            raise ConfigError("request.tier", t, f"an integer in 0..{self.num_tiers - 1} (K = {self.num_tiers})")
        return t

    def loads(self, instances: Sequence[InstanceView]) -> list[InstanceLoad]:
        return measure_all(instances, self.num_tiers)

    def migration_freeness(self, load: InstanceLoad) -> float:
        """Seed 000: every tier present on the instance charges its budget once."""
        return load.freeness(load.headroom(self.headroom.budgets(load.total_blocks)))

    # ----- dispatch -----
    def queue_key(self, state: RequestState, now: float) -> tuple:
        """Strict tier order, FCFS within a tier (the effective tier only rises with waiting time)."""
        return (self.effective_tier(state, now), state.arrival_s, state.id)

    def queue_lane(self, state: RequestState) -> int:
        return state.tier

    def dispatch_order(self, queued: list[RequestState], now: float) -> list[RequestState]:
        return sorted(queued, key=lambda s: self.queue_key(s, now))

    def dispatch(self, state: RequestState, instances: Sequence[InstanceView], now: float) -> int | None:
        self.check_tier(state)
        tier = self.effective_tier(state, now)
        kept = self._kept_freeness.get(tier)
        if kept is None:
            kept = self._kept_freeness[tier] = {}
        loads = self.loads(instances)
        # The freest instance not busy, else the freest (ties to the lowest index), by dispatch freeness.
        free_i, any_i = freest(loads if type(loads) is list else list(loads), tier, self.headroom,
                               self.busy_threshold, kept, self._charge_rule, self.dispatch_headroom)
        if free_i >= 0:
            return free_i
        return None if self.hold_when_busy or any_i < 0 else any_i

    # ----- migration -----
    def rebalance(self, instances: Sequence[InstanceView], now: float) -> list[Move]:
        if not self.migration_enabled:
            return []
        loads = self.loads(instances)
        if type(self).migration_freeness is LlumnixPolicy.migration_freeness:
            frees = migration_freeness_all(loads if type(loads) is list else list(loads), self.headroom)
        else:
            frees = [self.migration_freeness(ld) for ld in loads]
        free = {ld.index: f for ld, f in zip(loads, frees)}
        moves = []
        for src, dst in pair_instances(loads, lambda ld: free[ld.index], self.migrate_threshold):
            view = instances[src.index]
            cand = pick_candidate(view.running, view.waiting, self.request_policy, self.protected_tiers,
                                  waiting_key=lambda s: (self.effective_tier(s, now), s.arrival_s, s.id))
            if cand is None:
                continue
            if self.accept(src, dst, cand, free[src.index], free[dst.index]):
                moves.append(Move(cand, src.index, dst.index))
        return moves

    def accept(self, src: InstanceLoad, dst: InstanceLoad, cand: RequestState, f_src: float, f_dst: float) -> bool:
        """The move keeps the destination a destination and, for running requests, narrows the gap."""
        run_b, hol_b = move_cost_blocks(cand, src.block_size)
        queued = cand.status == Status.WAITING
        budgets = self.headroom.budgets(dst.total_blocks)
        t = cand.tier
        extra = budgets[t] if t not in dst.tier_counts else 0.0
        dst_after = freeness(dst.total_blocks, dst.used_blocks + run_b,
                             dst.hol_blocks + (hol_b if queued and not dst.num_waiting else 0),
                             dst.headroom(budgets) + extra, dst.num_running + (0 if queued else 1),
                             dst.num_waiting + (1 if queued else 0))
        if dst_after < self.migrate_threshold:
            return False
        if queued:
            return True                          # no KV to copy: relieving the source is enough
        src_after = freeness(src.total_blocks, src.used_blocks - run_b, src.hol_blocks,
                             src.headroom(self.headroom.budgets(src.total_blocks)), src.num_running - 1,
                             src.num_waiting)
        return narrows_gap(f_src, f_dst, src_after, dst_after)

