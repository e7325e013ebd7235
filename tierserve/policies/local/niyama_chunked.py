"""`niyama_chunked`: Niyama (seed 003) on vLLM v1's per-chunk KV rule, so the seed's policy runs in the engine.

Everything `niyama` decides — deadline-sized chunks, hybrid priority, eager relegation, selective preemption —
is unchanged; what differs is the allocation: a request holds the blocks of the tokens it has computed plus
the chunk it runs (`AllocationRule.PER_CHUNK`, as vLLM v1 allocates), not its whole prompt from admission on.
Admission then needs only the first chunk's blocks (`NiyamaCore` takes the rule from `blocks_to_hold`), and a
partial prefill needs blocks for each further chunk, which whole-prompt allocation had reserved. The core
does not check those, so `plan` walks its batch once more in order (`fit_chunks`): a partial prefill whose chunk
does not fit runs what its blocks and the free ones cover (nothing, if none); an admission that does not fit
stops admission (Niyama's and Sarathi's rule); and when that leaves nothing to run while partial prefills hold
the cache, the one Niyama ranks last is evicted (recompute), as under a decode's KV shortfall. A decode-only plan is
repeatable only while no waiting request could be admitted (nothing waits, or the batch is at `max_num_seqs`):
under the per-chunk rule a waiting request's first chunk, and so its blocks, follows the deadline-sized budget,
which moves with time (whole-prompt allocation made admission independent of it).
In vLLM the batch's token total reaches the engine as the step's token budget and each running request's share
as its cap (`tierserve.engines.vllm.scheduler`); the predictor is the engine's own fit
(`EngineSettings.exec_model_file`).
"""
from __future__ import annotations

from collections.abc import Sequence

from tierserve.core import AllocationRule, BatchPlan, PreemptMode, RequestState, Status
from tierserve.policies.local.base import ReplicaView
from tierserve.policies.local.niyama import NiyamaPolicy
from tierserve.policies.local.niyama_core import oldest_first


class NiyamaChunkedPolicy(NiyamaPolicy):
    name = "niyama_chunked"
    allocation = AllocationRule.PER_CHUNK

    def plan(self, view: ReplicaView) -> BatchPlan:
        plan = self.fit_chunks(self.core.plan(view), view)
        if plan.repeatable and view.waiting and len(view.running) < view.max_num_seqs:
            # per chunk, a waiting request's first chunk — so its blocks — follows the deadline-sized budget,
            # which moves with time: one that does not fit now may fit later without an arrival or completion
            plan.repeatable = False
        return plan

    def decode_batch(self, running: Sequence[RequestState]) -> list[RequestState] | None:
        # decodes only, nothing waiting: the core's plan has no chunk for `fit_chunks` to touch
        if getattr(self.plan, "__func__", None) is not NiyamaChunkedPolicy.plan:
            return None
        return oldest_first(running)

    def fit_chunks(self, plan: BatchPlan, view: ReplicaView) -> BatchPlan:
        """`plan` with every chunk inside the free KV blocks under the per-chunk rule (module docstring)."""
        bs = view.block_size
        free = view.free_blocks + sum(v.num_blocks for v, _ in plan.preempt)
        watermark = view.watermark_blocks
        kept: list = []
        dropped_tokens = 0
        admitting = True
        for r, n in plan.scheduled:
            need = -(-(r.num_computed_tokens + n) // bs) - r.num_blocks
            if r.status == Status.RUNNING:
                if need > free:             # a partial prefill (decodes were fitted by the core)
                    fit = (r.num_blocks + free) * bs - r.num_computed_tokens
                    dropped_tokens += n - max(fit, 0)
                    if fit <= 0:
                        continue
                    n = fit
                    need = free
            elif not admitting or need > free - watermark:
                admitting = False
                dropped_tokens += n
                continue
            free -= max(need, 0)
            kept.append((r, n))
        if dropped_tokens:
            plan.scheduled[:] = kept
            plan.repeatable = False
            self.core.planned_prefill_tokens -= dropped_tokens
            if not kept and not plan.preempt:
                stuck = [r for r in view.running if r.num_blocks > 0]
                if stuck:                   # partial prefills hold the cache: free the one ranked last
                    worst = max(stuck, key=lambda s: (self.priority_value(s), s.arrival_s, s.id))
                    plan.preempt.append((worst, PreemptMode.RECOMPUTE))
        return plan
