"""vLLM v0 as Vidur models it (`vllm` there): prefill-only batches first, no chunking, FCFS, recompute.

Admission needs the whole prompt's blocks plus the watermark; a prefill batch is bounded by
len(batch)·max(prompt) ≤ token budget (Vidur's padded `max_tokens_in_batch`) and the batch cap.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Sequence

from tierserve.core import AllocationRule, BatchPlan, PreemptMode, RequestState
from tierserve.policies.local.base import LocalPolicy, ReplicaView, _hold_whole_prompt, evict_from_tail
from tierserve.policies.local.decode_steps import decode_while_blocks_fit


# (arrival_s, id) of a RequestState, built in C: running queues are sorted at every plan.
arrival_key = attrgetter("arrival_s", "id")


class VLLMv0Policy(LocalPolicy):
    name = "vllm_v0"
    default_token_budget = 4096
    default_max_num_seqs = 128
    allocation = AllocationRule.WHOLE_PROMPT    # no chunking: the prompt's blocks at admission

    def max_prompt_tokens(self, token_budget: int) -> int | None:
        return token_budget   # no chunking: a whole prompt must fit one batch

    def decode_batch(self, running: Sequence[RequestState]) -> list[RequestState] | None:
        # Running requests are decoded oldest first.
        if getattr(self.plan, "__func__", None) is not VLLMv0Policy.plan:
            return None
        return sorted(running, key=arrival_key)

    def plan(self, view: ReplicaView) -> BatchPlan:
        bs = view.block_size
        free = view.free_blocks
        plan = BatchPlan()
        scheduled = plan.scheduled
        longest = 0
        num_seqs = len(view.running)
        for w in self.order_waiting(view.waiting):
            n = w.num_tokens - w.num_computed_tokens
            need = self.blocks_to_hold(w, n, bs) - w.num_blocks
            if need > free - view.watermark_blocks:
                break
            longest_next = n if n > longest else longest
            if (len(scheduled) + 1) * longest_next > view.token_budget or num_seqs >= view.max_num_seqs:
                break
            scheduled.append((w, n))
            free -= need
            longest = longest_next
            num_seqs += 1
        if scheduled:
            return plan
        # Decode every running request, oldest first; on a block shortage restart the youngest.
        running = sorted(view.running, key=arrival_key)
        end = len(running)
        whole_prompt = type(self).blocks_to_hold is _hold_whole_prompt     # then computed inline (hot loop)
        hold = self.blocks_to_hold
        max_seqs = view.max_num_seqs
        i = 0
        if end <= max_seqs and whole_prompt:
            # The batch cap cannot stop the loop below: the same steps without its checks, until a request's
            # blocks do not fit (the loop below takes over there, evicting).
            i, free = decode_while_blocks_fit(running, scheduled, free, bs)
        while i < end and len(scheduled) < max_seqs:
            r = running[i]
            if whole_prompt:
                tokens = r.num_computed_tokens + 1
                known = r.num_tokens
                need = -(-(tokens if tokens > known else known) // bs) - r.num_blocks
            else:
                need = hold(r, 1, bs) - r.num_blocks
            if need > free:
                end, free = evict_from_tail(running, i, end, need, free, plan.preempt, PreemptMode.RECOMPUTE)
            if end <= i:
                break
            scheduled.append((r, 1))
            if need > 0:
                free -= need
            i += 1
        plan.repeatable = not plan.preempt
        return plan
