"""INFaaS-style cost-based dispatch (the seed's primary baseline; Llumnix's "INFaaS++"): no migration.

Each request goes to the least-loaded instance among those that can fit its prompt now, load measured as
committed KV blocks: held blocks + the prompt demand of every queued request (Llumnix artifact's `block`
dispatch load, `(used + Σ waiting blocks) / M`). If none fits, the least-loaded instance overall.
"""
from __future__ import annotations

from typing import Sequence

from tierserve.core import RequestState
from tierserve.policies.cluster.base import ClusterPolicy, InstanceView
from tierserve.policies.cluster.freeness import blocks_for


def committed_blocks(view: InstanceView) -> int:
    """Blocks held (incl. in flight) plus the full prompt demand of everything queued or swapped
    (from the view's load counters when it has them, else by walking its queues)."""
    if hasattr(view, "waiting_demand_blocks"):
        return view.used_blocks + view.waiting_demand_blocks + view.swapped_demand_blocks
    bs = view.block_size
    queued = sum(blocks_for(s.num_tokens, bs) for s in view.waiting)
    queued += sum(blocks_for(s.num_tokens, bs) for s in view.swapped)
    return view.used_blocks + queued


class InfaasDispatch(ClusterPolicy):
    name = "infaas"

    def dispatch(self, state: RequestState, instances: Sequence[InstanceView], now: float) -> int:
        need = blocks_for(state.num_tokens, instances[0].block_size)
        best_fit, best_any = None, None
        for v in instances:
            committed = committed_blocks(v)
            key = (committed / v.total_blocks, v.index)
            if best_any is None or key < best_any:
                best_any = key
            if v.total_blocks - committed >= need and (best_fit is None or key < best_fit):
                best_fit = key
        return (best_fit or best_any)[1]
