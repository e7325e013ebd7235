"""Sarathi-SRPF: Sarathi's batch with a fixed chunk, prefills (partial, then new) by fewest remaining
prompt tokens — known at arrival, so no oracle is involved (seed 003's baseline)."""
from __future__ import annotations

from tierserve.core import RequestState
from tierserve.policies.local.base import declares_steady_plans
from tierserve.policies.local.sarathi_edf import KeyedWaitingMixin
from tierserve.policies.local.sarathi_fcfs import SarathiFCFSPolicy


def remaining_prefill_key(state: RequestState) -> tuple[int, float, int]:
    return (state.num_tokens - state.num_computed_tokens, state.arrival_s, state.id)


@declares_steady_plans
class SarathiSRPFPolicy(KeyedWaitingMixin, SarathiFCFSPolicy):
    name = "sarathi_srpf"
    order_key = staticmethod(remaining_prefill_key)
