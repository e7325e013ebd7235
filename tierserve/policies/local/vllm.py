"""vLLM v1's scheduler: one token-budget loop over running then waiting requests (chunked prefill).

`vllm` is FCFS with recompute preemption of the last running request; `vllm_priority` orders by
(priority, arrival) and evicts the worst (vLLM's `--scheduling-policy priority`, priority = tier).
"""
from __future__ import annotations

from tierserve.core import BatchPlan, PreemptMode, RequestState
from tierserve.policies.local.base import LocalPolicy, ReplicaView, evict_from_tail


def is_decode_step(state: RequestState, num_tokens: int) -> bool:
    """True when the request runs exactly its next decode token (the only shape the executor may skip)."""
    return num_tokens == 1 and state.num_generated > 0 and state.num_tokens - state.num_computed_tokens == 1


class VLLMPolicy(LocalPolicy):
    """vLLM v1 FCFS. Parameters are the engine's: `long_prefill_threshold` caps one request's chunk."""

    name = "vllm"
    default_token_budget = 2048
    default_max_num_seqs = 256

    def __init__(self, preempt_mode: str = "recompute", long_prefill_threshold: int = 0) -> None:
        self._mode = PreemptMode.SWAP if preempt_mode == "swap" else PreemptMode.RECOMPUTE
        self.long_prefill_threshold = long_prefill_threshold

    def preempt_mode(self, state: RequestState) -> PreemptMode:
        return self._mode

    def running_order(self, running: list[RequestState]) -> list[RequestState]:
        """Order of service; the tail is preempted first."""
        return running

    def plan(self, view: ReplicaView) -> BatchPlan:
        bs = view.block_size
        budget = view.token_budget
        free = view.free_blocks
        cap = self.long_prefill_threshold
        plan = BatchPlan()
        scheduled, preempt = plan.scheduled, plan.preempt
        running = self.running_order(view.running)
        end = len(running)
        all_decode = True
        i = 0
        while i < end and budget > 0 and len(scheduled) < view.max_num_seqs:
            r = running[i]
            n = r.num_tokens - r.num_computed_tokens
            if cap and n > cap:
                n = cap
            if n > budget:
                n = budget
            need = self.blocks_to_hold(r, n, bs) - r.num_blocks
            if need > free:
                end, free = evict_from_tail(running, i, end, need, free, preempt, self._mode)
            if end <= i:
                break
            scheduled.append((r, n))
            if need > 0:
                free -= need
            budget -= n
            if all_decode and not is_decode_step(r, n):
                all_decode = False
            i += 1
        if not preempt:
            num_seqs = end
            for w in self.resumable(view):
                if num_seqs >= view.max_num_seqs or budget <= 0:
                    break
                n = w.num_tokens - w.num_computed_tokens
                if cap and n > cap:
                    n = cap
                if n > budget:
                    n = budget
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
        if view.swapped:
            return list(view.swapped) + self.order_waiting(view.waiting)
        return self.order_waiting(view.waiting)


def priority_key(state: RequestState) -> tuple[int, float, int]:
    return (state.request.tier, state.request.arrival_s, state.request.id)


class VLLMPriorityPolicy(VLLMPolicy):
    """vLLM v1 with `scheduling_policy=priority`: priority = tier (0 is served first)."""

    name = "vllm_priority"

    def running_order(self, running: list[RequestState]) -> list[RequestState]:
        return sorted(running, key=priority_key)

    def order_waiting(self, waiting: list[RequestState]) -> list[RequestState]:
        return sorted(waiting, key=priority_key)
