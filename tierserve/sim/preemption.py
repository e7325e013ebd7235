# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""Preemption and swap, and relegation: a plan's evictions and relegations applied to a replica.

Owns: moving a victim out of running (its blocks freed, to swapped with its KV in host memory or to waiting
to recompute), the PCIe seconds an iteration is charged for swaps out and in, the host blocks a swapped
request holds, and marking relegations. May not touch: the iteration itself (iteration.py charges the
seconds returned here), runs, or migration.
"""
from __future__ import annotations

from tierserve.core import BatchPlan, PreemptMode, Status
from tierserve.policies.local.base import PolicyError
from tierserve.sim.replica_state import ReplicaState


def apply_relegations(rep: ReplicaState, plan: BatchPlan, now: float) -> None:
    for state, reason in plan.relegate:
        if state.replica != rep.index or state.status in (Status.FINISHED, Status.REJECTED):
            raise PolicyError(f"{rep.policy.name}: cannot relegate request {state.id} (status {state.status.name})")
        if state.relegated_s < 0:
            state.relegated_s = now
            state.relegation_reason = reason
            rep.policy.on_relegate(state, rep.view)
            for listener in rep._queue_listeners:
                listener.relegated(state)


def apply_preemptions(rep: ReplicaState, plan: BatchPlan) -> float:
    """Evict the plan's victims; returns the PCIe seconds of swaps out (and in, for swapped requests
    the plan resumes), which the iteration is charged."""
    swap_s = 0.0
    for victim, mode in plan.preempt:
        if victim.status != Status.RUNNING or victim.replica != rep.index:
            raise PolicyError(f"{rep.policy.name}: cannot preempt request {victim.id} (status {victim.status.name})")
        rep._leave_running(victim)
        rep.free_blocks += victim.num_blocks
        victim.num_preemptions += 1
        rep.preemptions += 1
        if mode == PreemptMode.SWAP and victim.num_blocks > rep.free_swap_blocks:
            mode = PreemptMode.RECOMPUTE          # host swap space full: vLLM v0 would fail; recompute
            rep.swap_fallbacks += 1
        if mode == PreemptMode.SWAP:
            swap_s += victim.num_blocks * rep.swap_time_per_block_s
            rep.swap_blocks_out += victim.num_blocks
            rep.free_swap_blocks -= victim.num_blocks
            rep._host_blocks[victim.id] = victim.num_blocks
            victim.num_blocks = 0
            victim.num_swaps += 1
            rep.swap_outs += 1
            victim.status = Status.SWAPPED
            rep._join_swapped(victim)
        else:
            victim.num_blocks = 0
            victim.num_computed_tokens = 0        # KV dropped: prompt + generated are recomputed
            victim.status = Status.WAITING
            rep._join_waiting(victim, True)
        rep.policy.on_preempt(victim, mode, rep.view)
        for listener in rep._queue_listeners:
            listener.queued(victim)
    for r, _ in plan.scheduled:
        if r.status == Status.SWAPPED:
            held = rep._host_blocks.get(r.id)
            if held is None:      # swapped elsewhere and moved here while queued: its KV crosses PCIe once
                held = rep.policy.blocks_to_hold(r, 0, rep.block_size)
            swap_s += held * rep.swap_time_per_block_s
            rep.swap_blocks_in += held
    rep.swap_pcie_s += swap_s
    return swap_s

