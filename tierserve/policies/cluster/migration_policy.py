"""Which instances pair up for migration and which request moves (Llumnix §1.6–1.7; ALGORITHMS.md §5).

Pairing (Llumnix `Balanced` filter): sources = freeness below the migrate-out threshold (3) or holding
preempted requests; destinations = the rest; the i-th least free source pairs with the i-th freest
destination; a pair is accepted only if it narrows the freeness gap without flipping it.
Candidate (seed 000): queued requests first (no KV to copy), then small low-tier running ones; tier 0
(every tier < `protected_tiers`) never moves. Llumnix's request policies are kept as options.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

from tierserve.core import ConfigError, RequestState, Status
from tierserve.policies.cluster.freeness import InstanceLoad, blocks_for, pair_by_freeness

REQUEST_POLICIES = ("tiered", "SR", "LR", "LCR", "FCW")


def check_request_policy(name: str) -> str:
    if name not in REQUEST_POLICIES:
        raise ConfigError("request_policy", name, " | ".join(REQUEST_POLICIES))
    return name


def _movable_running(running: Sequence[RequestState], protected_tiers: int) -> list[RequestState]:
    """Decoding requests that may move (Llumnix only migrates requests past prefill)."""
    return [s for s in running if s.status == Status.RUNNING and s.tier >= protected_tiers
            and s.num_generated > 0 and s.num_tokens - s.num_computed_tokens == 1]


def _movable_waiting(waiting: Sequence[RequestState], protected_tiers: int) -> list[RequestState]:
    return [s for s in waiting if s.status == Status.WAITING and s.tier >= protected_tiers
            and s.num_blocks == 0]


def pick_candidate(running: Sequence[RequestState], waiting: Sequence[RequestState], policy: str,
                   protected_tiers: int = 1,
                   waiting_key: Callable[[RequestState], tuple] | None = None) -> RequestState | None:
    """The request to migrate out of an instance, or None. Never a tier < `protected_tiers`."""
    key = waiting_key or (lambda s: (s.tier, s.arrival_s, s.id))
    if policy in ("tiered", "FCW"):
        queued = _movable_waiting(waiting, protected_tiers)
        if queued:
            return min(queued, key=key)          # the next one this queue would serve: moving it is free
        if policy == "FCW":
            return None
    movable = _movable_running(running, protected_tiers)
    if not movable:
        return None
    if policy == "tiered":                       # lowest tier first, then least KV to copy
        return min(movable, key=lambda s: (-s.tier, s.num_blocks, -s.arrival_s))
    if policy == "SR":
        return min(movable, key=lambda s: (s.num_tokens, s.id))
    if policy == "LR":
        return max(movable, key=lambda s: (s.num_tokens, -s.id))
    return movable[-1]                           # LCR: the last running


def move_cost_blocks(state: RequestState, block_size: int) -> tuple[int, int]:
    """(blocks leaving the source's running usage, blocks of HOL demand it removes) for the gap check."""
    if state.status == Status.WAITING:
        return 0, blocks_for(state.num_tokens, block_size)
    return state.num_blocks, 0


def narrows_gap(src_before: float, dst_before: float, src_after: float, dst_after: float) -> bool:
    """Llumnix `Balanced`: 0 < dst_after − src_after < dst_before − src_before (freeness; +∞ dst always OK)."""
    if math.isinf(dst_before) and dst_before > 0:
        return True
    gap_before = dst_before - src_before
    gap_after = dst_after - src_after
    return 0 < gap_after < gap_before


def pair_instances(loads: Sequence[InstanceLoad], free: Callable[[InstanceLoad], float],
                   threshold: float) -> list[tuple[InstanceLoad, InstanceLoad]]:
    """(source, destination) pairs: least free source with freest destination, and so on.

    Sources: not migrating, and terminating, holding preempted requests or freeness < threshold;
    destinations: the other loads not migrating with freeness >= threshold; ordered by (freeness, index)
    and (−freeness, index). `free` is read once per load not migrating."""
    ready = [ld for ld in loads if not ld.migrating]
    return pair_by_freeness(ready, [free(ld) for ld in ready], threshold)
