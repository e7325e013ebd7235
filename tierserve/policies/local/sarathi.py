"""Sarathi-Serve (stall-free batching): decodes first, then partial prefills, then new prefills FCFS,
all within one token budget (the chunk size, default 512). Admission reserves the whole prompt's
blocks plus a 1% watermark; preemption restarts the youngest running request (recompute)."""
from __future__ import annotations

from typing import Sequence

from tierserve.core import AllocationRule, BatchPlan, PreemptMode, RequestState
from tierserve.policies.local.base import LocalPolicy, ReplicaView, evict_from_tail, holds_computed_plus_next
from tierserve.policies.local.chunks import next_chunk
from tierserve.policies.local.decode_steps import decode_while_blocks_fit
from tierserve.policies.local.vllm_v0 import arrival_key


class SarathiPolicy(LocalPolicy):
    name = "sarathi"
    default_token_budget = 512
    default_max_num_seqs = 128

    allocation = AllocationRule.WHOLE_PROMPT    # the whole prompt (or recompute prefix) at admission

    def prefill_order(self, partial: list[RequestState]) -> list[RequestState]:
        """Order of partial prefills (Sarathi-FCFS: arrival); Sarathi-EDF/SRPF override this."""
        return partial

    def decode_batch(self, running: Sequence[RequestState]) -> list[RequestState] | None:
        # Decodes are served oldest first (within the budget and cap, which the simulator checks).
        if getattr(self.plan, "__func__", None) is not SarathiPolicy.plan:
            return None
        return sorted(running, key=arrival_key)

    def repeats_prefill_chunk(self) -> bool:
        # Decodes (oldest first), then partial prefills, then waiting ones get what budget the partials leave.
        return getattr(self.plan, "__func__", None) is SarathiPolicy.plan

    def admits_waiting(self) -> int | None:
        # Decodes first (the fast loop: neither cap nor budget binds), then waiting requests FCFS, each while
        # its whole prompt's blocks fit above the watermark; no per-request chunk cap but the budget.
        return 0 if getattr(self.plan, "__func__", None) is SarathiPolicy.plan else None

    def plan(self, view: ReplicaView) -> BatchPlan:
        bs = view.block_size
        free = view.free_blocks
        budget = view.token_budget
        cap = view.max_num_seqs
        plan = BatchPlan()
        scheduled = plan.scheduled
        running = sorted(view.running, key=arrival_key)
        inline_hold = holds_computed_plus_next(self)      # a decode's blocks computed inline (hot loop)
        hold = self.blocks_to_hold
        partial: list[RequestState] = []
        end = len(running)
        i = 0
        n_scheduled = 0                 # len(scheduled), kept as it grows (hot loop)
        if end <= cap and end <= budget:
            # Neither the batch cap nor the budget can stop the loop below: the same steps without their
            # checks, until a request's blocks do not fit (the loop below takes over there, evicting).
            # (A decode has at most one token left, so max(computed + 1, known) is computed + 1 there.)
            i, free = decode_while_blocks_fit(running, scheduled, free, bs, None if inline_hold else hold, partial)
            n_scheduled = len(scheduled)
            budget -= n_scheduled
        while i < end:
            if n_scheduled >= cap:
                break
            r = running[i]
            c = r.num_computed_tokens
            if r.num_tokens - c > 1 or r.num_generated == 0:
                partial.append(r)
                i += 1
                continue
            if budget <= 0:
                i += 1
                continue
            need = (-(-(c + 1) // bs) if inline_hold else hold(r, 1, bs)) - r.num_blocks
            if need > free:
                end, free = evict_from_tail(running, i, end, need, free, plan.preempt, PreemptMode.RECOMPUTE)
            if end <= i:
                break
            scheduled.append((r, 1))
            n_scheduled += 1
            if need > 0:
                free -= need
            budget -= 1
            i += 1
        if plan.preempt:
            victims = {id(v) for v, _ in plan.preempt}
            partial = [p for p in partial if id(p) not in victims]
        decode_only = True
        for r in self.prefill_order(partial):
            if len(scheduled) >= cap or budget <= 0:
                break
            n = next_chunk(r, 0, budget)
            scheduled.append((r, n))      # blocks were reserved for the whole prompt at admission
            budget -= n
            decode_only = False
        # New prefills are admitted in the same step even after a preemption (Sarathi-Serve has no gate);
        # the victims themselves wait: they re-enter the queue once this batch is built.
        num_seqs = len(view.running) - len(plan.preempt)
        for w in self.order_waiting(view.waiting):
            if num_seqs >= cap or len(scheduled) >= cap or budget <= 0:
                break
            n = next_chunk(w, 0, budget)
            need = self.blocks_to_hold(w, n, bs) - w.num_blocks
            if need > free - view.watermark_blocks:
                break
            scheduled.append((w, n))
            free -= need
            budget -= n
            num_seqs += 1
            decode_only = False
        plan.repeatable = decode_only and not plan.preempt
        return plan
