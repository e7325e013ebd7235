"""Orca: iteration-level batching of whole prefills and decodes; each admitted request reserves
`max_model_len` tokens of KV up front, so it never needs preemption (and admits few requests)."""
from __future__ import annotations

from tierserve.core import AllocationRule, BatchPlan, RequestState
from tierserve.policies.local.base import LocalPolicy, ReplicaView
from tierserve.policies.local.vllm_v0 import arrival_key


class OrcaPolicy(LocalPolicy):
    name = "orca"
    default_token_budget = 1 << 20      # Orca batches whole prompts; only the batch cap bounds it
    default_max_num_seqs = 128
    allocation = AllocationRule.MAX_LENGTH      # max_model_len reserved at admission: no preemption ever

    def __init__(self, max_model_len: int = 4096) -> None:
        self.max_model_len = max_model_len

    def max_request_tokens(self) -> int | None:
        return self.max_model_len

    def plan(self, view: ReplicaView) -> BatchPlan:
        bs = view.block_size
        free = view.free_blocks
        plan = BatchPlan()
        scheduled = plan.scheduled
        decode_only = True
        for r in sorted(view.running, key=arrival_key):
            if len(scheduled) >= view.max_num_seqs:
                break
            n = r.num_tokens - r.num_computed_tokens
            need = self.blocks_to_hold(r, n, bs) - r.num_blocks
            if need > free:
                continue                 # only past max_model_len; the executor rejects such requests
            scheduled.append((r, n))
            free -= max(need, 0)
            if n != 1 or r.num_generated == 0:
                decode_only = False
        num_seqs = len(view.running)
        for w in self.order_waiting(view.waiting):
            if num_seqs >= view.max_num_seqs or len(scheduled) >= view.max_num_seqs:
                break
            n = w.num_tokens - w.num_computed_tokens
            need = self.blocks_to_hold(w, n, bs) - w.num_blocks
            if need > free:
                break
            scheduled.append((w, n))
            free -= need
            num_seqs += 1
            decode_only = False
        plan.repeatable = decode_only
        return plan
