"""`fcfs`: Sarathi's order on the shared priority loop — running decodes first, oldest first, then prefill
chunks by arrival (ALGORITHMS.md §2, Sarathi-FCFS; seed 001's "Sarathi" baseline). Never evicts for priority:
only a decode that lacks a KV block evicts, youngest prefills first, then the youngest decodes."""
from __future__ import annotations

from tierserve.core import RequestState
from tierserve.policies.local.base import declares_steady_plans
from tierserve.policies.local.priority import PriorityLoopPolicy


@declares_steady_plans
class FCFSPolicy(PriorityLoopPolicy):
    name = "fcfs"

    def key(self, s: RequestState) -> tuple:
        return (0 if s.num_generated > 0 and s.num_tokens - s.num_computed_tokens == 1 else 1,)

    def evictable(self, victim: RequestState, by: RequestState) -> bool:
        return False
