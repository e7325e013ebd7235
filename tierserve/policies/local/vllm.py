"""vLLM v1's scheduler: one token-budget loop over running then waiting requests (chunked prefill).

`vllm` is FCFS: running requests are served in admission order and the tail is preempted (recompute).
`vllm_priority` is v1's `--scheduling-policy priority` with priority = tier: the waiting queue is ordered
by (priority, arrival) and the victim is the worst (priority, arrival) running request — scheduled or not —
while running requests keep admission order (vLLM v1 `Scheduler.schedule`). `vllm_priority_sorted` also
serves running requests in priority order (a tierserve variant, not vLLM's behaviour).
"""
from __future__ import annotations

from operator import attrgetter
from typing import Sequence

from tierserve.core import BatchPlan, ConfigError, PreemptMode, RequestState
from tierserve.policies.local.base import LocalPolicy, ReplicaView, _hold_per_chunk, declares_steady_plans
from tierserve.policies.local.chunks import next_chunk

PREEMPT_MODES = {"recompute": PreemptMode.RECOMPUTE, "swap": PreemptMode.SWAP}


def parse_preempt_mode(value: str) -> PreemptMode:
    if value not in PREEMPT_MODES:
        raise ConfigError("preempt_mode", value, " | ".join(PREEMPT_MODES))
    return PREEMPT_MODES[value]


def is_decode_step(state: RequestState, num_tokens: int) -> bool:
    """True when the request runs exactly its next decode token (the only shape the executor may skip)."""
    return num_tokens == 1 and state.num_generated > 0 and state.num_tokens - state.num_computed_tokens == 1


@declares_steady_plans
class VLLMPolicy(LocalPolicy):
    """vLLM v1 FCFS. Parameters are the engine's: `long_prefill_threshold` caps one request's chunk."""

    name = "vllm"
    default_token_budget = 2048
    default_max_num_seqs = 256
    preempt_modes = (PreemptMode.RECOMPUTE, PreemptMode.SWAP)
    uses_watermark = False           # v1's KV manager admits while blocks are free
    follows_engine_defaults = True   # budget and batch cap as vLLM picks them for the GPU

    def __init__(self, preempt_mode: str = "recompute", long_prefill_threshold: int = 0) -> None:
        self._mode = parse_preempt_mode(preempt_mode)
        if not (isinstance(long_prefill_threshold, int) and long_prefill_threshold >= 0):
            raise ConfigError("long_prefill_threshold", long_prefill_threshold, "an integer >= 0 (0 = no cap)")
        self.long_prefill_threshold = long_prefill_threshold

    steady_plans_of: type[VLLMPolicy]      # set by `declares_steady_plans`

    def preempt_mode(self, state: RequestState) -> PreemptMode:
        return self._mode

    def promises_hold(self) -> bool:
        """True when this instance plans with the `plan`, `running_order` and `resumable` of the class that
        declared its steady plans (`declares_steady_plans`): a subclass or an instance that replaces one of
        them gets no promise from `decode_batch` or `admits_waiting`."""
        owner = self.steady_plans_of
        return (getattr(self.plan, "__func__", None) is owner.plan
                and type(self).running_order is owner.running_order and type(self).resumable is owner.resumable)

    def decode_batch(self, running: Sequence[RequestState]) -> list[RequestState] | None:
        # Running requests are served in `running_order`; with nothing waiting or swapped `resumable` is
        # empty whatever `order_waiting` does, and with every block fitting nothing is evicted.
        if not self.promises_hold():
            return None
        return list(self.running_order(running))

    def admits_waiting(self) -> int | None:
        # The budget loop over decodes (none evicted when their blocks fit), then `resumable` (swapped first:
        # none) in `order_waiting` order, each capped by long_prefill_threshold; the first that does not fit
        # stops admission.
        if not self.promises_hold():
            return None
        return self.long_prefill_threshold

    def running_order(self, running: Sequence[RequestState]) -> Sequence[RequestState]:
        """Order of service among running requests (v1: admission order)."""
        return running

    def victim_index(self, running: list[RequestState], i: int) -> int:
        """Which running request to preempt when running[i] lacks blocks (FCFS: the tail)."""
        return len(running) - 1

    def plan(self, view: ReplicaView) -> BatchPlan:
        bs = view.block_size
        budget = view.token_budget
        free = view.free_blocks
        cap = self.long_prefill_threshold
        plan = BatchPlan()
        scheduled, preempt = plan.scheduled, plan.preempt
        running = list(self.running_order(view.running))
        max_seqs = view.max_num_seqs
        per_chunk = type(self).blocks_to_hold is _hold_per_chunk     # then computed inline (hot loop)
        hold = self.blocks_to_hold
        all_decode = True
        i = 0
        n_running = len(running)        # len(running) and len(scheduled), kept as they change (hot loop)
        n_scheduled = 0
        while i < n_running and budget > 0 and n_scheduled < max_seqs:
            r = running[i]
            c = r.num_computed_tokens
            to_run = r.num_tokens - c
            n = next_chunk(r, cap, budget)
            need = (-(-(c + n) // bs) if per_chunk else hold(r, n, bs)) - r.num_blocks
            evicted_self = False
            while need > free:
                j = self.victim_index(running, i)
                victim = running.pop(j)
                n_running -= 1
                preempt.append((victim, self._mode))
                free += victim.num_blocks
                if j < i:                      # v1 may pick an already scheduled request: undo its grant
                    k = next(k for k, (s, _) in enumerate(scheduled) if s is victim)
                    granted = scheduled.pop(k)[1]
                    n_scheduled -= 1
                    budget += granted
                    free += max(self.blocks_to_hold(victim, granted, bs) - victim.num_blocks, 0)
                if victim is r:
                    evicted_self = True
                    break
                if j < i:
                    i -= 1
            if evicted_self:
                break
            if need > 0:
                free -= need
            scheduled.append((r, n))
            n_scheduled += 1
            budget -= n
            if all_decode and (n != 1 or to_run != 1 or r.num_generated == 0):    # is_decode_step, inline
                all_decode = False
            i += 1
        if all_decode and preempt:           # an undone grant may have been the only non-decode
            all_decode = all(is_decode_step(r, n) for r, n in scheduled)
        if not preempt:                     # v1 admits nothing in a step that preempted
            num_seqs = len(running)
            for w in self.resumable(view):
                if num_seqs >= max_seqs or budget <= 0:
                    break
                n = next_chunk(w, cap, budget)
                need = self.blocks_to_hold(w, n, bs) - w.num_blocks
                if need > free - view.watermark_blocks:
                    break                           # FCFS: the first that does not fit stops admission
                scheduled.append((w, n))
                free -= need
                budget -= n
                num_seqs += 1
                all_decode = False
        # A decode-only batch with nothing admissible repeats until an arrival, completion or KV shortfall.
        plan.repeatable = all_decode and not preempt
        return plan

    def resumable(self, view: ReplicaView) -> list[RequestState]:
        """Swapped requests first (they already hold progress), then waiting in policy order."""
        return list(view.swapped) + list(self.order_waiting(view.waiting))


def priority_key(state: RequestState) -> tuple[int, float, int]:
    return (state.tier, state.arrival_s, state.id)


# The same key as `priority_key`, built in C (sorting whole queues at every plan is a hot path).
priority_key_fast = attrgetter("tier", "arrival_s", "id")


@declares_steady_plans
class VLLMPriorityPolicy(VLLMPolicy):
    """vLLM v1 with `scheduling_policy=priority`: priority = tier (0 is served first)."""

    name = "vllm_priority"
    waiting_order_key = priority_key_fast       # an attrgetter: not bound as a method

    def victim_index(self, running: list[RequestState], i: int) -> int:
        worst = 0
        for k in range(1, len(running)):
            if priority_key_fast(running[k]) > priority_key_fast(running[worst]):
                worst = k
        return worst

    def order_waiting(self, waiting: Sequence[RequestState]) -> list[RequestState]:
        return sorted(waiting, key=priority_key_fast)


@declares_steady_plans
class VLLMPrioritySortedPolicy(VLLMPriorityPolicy):
    """`vllm_priority` that also serves running requests in (tier, arrival) order and evicts the tail of
    that order (tierserve's earlier reading of priority scheduling; kept for comparison)."""

    name = "vllm_priority_sorted"

    def running_order(self, running: Sequence[RequestState]) -> list[RequestState]:
        return sorted(running, key=priority_key_fast)

    def victim_index(self, running: list[RequestState], i: int) -> int:
        return len(running) - 1
