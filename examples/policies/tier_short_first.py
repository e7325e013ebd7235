"""`tier_short_first`: a replica policy written from scratch, the worked example of docs/writing-a-policy.md.

Each iteration, on vLLM v1's batch shape (chunked prefill, KV blocks per chunk, recompute preemption):
running requests go first, in admission order — a decode runs one token, a prefill its next chunk of the
budget left; then waiting requests are admitted by tier, then shortest prompt, each a chunk of the budget left,
until one does not fit. When a running request's next blocks do not fit, the running request not yet served
this iteration with the worst (tier, prompt) is evicted (recompute), possibly that request itself.
"""
from __future__ import annotations

from collections.abc import Sequence

from tierserve.core import AllocationRule, BatchPlan, PreemptMode, RequestState
from tierserve.policies.local.base import LocalPolicy, ReplicaView, blocks_for


def tier_then_prompt(state: RequestState) -> tuple[int, int, float, int]:
    """Smaller first: tier, prompt tokens, arrival (s), id (unique, so the order is total)."""
    return (state.tier, state.prompt_tokens, state.arrival_s, state.id)


class TierShortFirstPolicy(LocalPolicy):
    name = "tier_short_first"
    allocation = AllocationRule.PER_CHUNK        # blocks for the computed tokens + this chunk, as vLLM v1
    preempt_modes = (PreemptMode.RECOMPUTE,)     # vLLM v1 has no swap
    uses_watermark = False                       # v1 admits while blocks are free

    def order_waiting(self, waiting: Sequence[RequestState]) -> list[RequestState]:
        return sorted(waiting, key=tier_then_prompt)

    def plan(self, view: ReplicaView) -> BatchPlan:
        plan = BatchPlan()
        budget, free, bs = view.token_budget, view.free_blocks, view.block_size
        running = list(view.running)
        decode_only = True
        i = 0
        while i < len(running) and budget > 0:
            r = running[i]
            n = min(r.num_tokens - r.num_computed_tokens, budget)
            need = blocks_for(r.num_computed_tokens + n, bs) - r.num_blocks
            evicted_self = False
            while need > free:                   # evict among those not yet served, worst first
                victim = max(running[i:], key=tier_then_prompt)
                running.remove(victim)
                plan.preempt.append((victim, PreemptMode.RECOMPUTE))
                free += victim.num_blocks
                if victim is r:
                    evicted_self = True
                    break
            if evicted_self:
                continue                         # running[i] is now the next request
            free -= max(need, 0)
            budget -= n
            plan.scheduled.append((r, n))
            decode_only = decode_only and n == 1 and r.num_generated > 0
            i += 1
        if not plan.preempt:                     # as v1: nothing is admitted in a step that preempted
            num_seqs = len(running)
            for w in self.order_waiting(view.waiting):
                if num_seqs >= view.max_num_seqs or budget <= 0:
                    break
                n = min(w.num_tokens - w.num_computed_tokens, budget)
                need = blocks_for(w.num_computed_tokens + n, bs)
                if need > free:
                    break                        # the first that does not fit stops admission
                plan.scheduled.append((w, n))
                free -= need
                budget -= n
                num_seqs += 1
                decode_only = False
        # The promise skip-ahead relies on: a decode-only batch that admitted and evicted nothing is planned
        # again, unchanged, until an arrival, a completion or a KV shortfall (nothing here moves with time).
        plan.repeatable = decode_only and not plan.preempt and bool(plan.scheduled)
        return plan
