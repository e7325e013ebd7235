"""Sarathi-EDF: Sarathi's batch with a fixed chunk, prefills (partial, then new) by earliest deadline —
the first token's deadline a + TTFT for interactive requests, a + TTLT for non-interactive ones
(seed 003's baseline; deadlines from `tierserve.policies.local.deadlines`). The waiting line is a priority
queue keyed on entry (`WaitingHeap`): the same order as sorting it every iteration, without the cost."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from tierserve.core import BatchPlan, PreemptMode, RequestState
from tierserve.policies.local.base import ReplicaView, declares_steady_plans
from tierserve.policies.local.deadlines import prefill_deadline
from tierserve.policies.local.prioqueue import WaitingHeap
from tierserve.policies.local.sarathi_fcfs import SarathiFCFSPolicy


def deadline_key(state: RequestState) -> tuple[float, float, int]:
    return (prefill_deadline(state), state.arrival_s, state.id)


class KeyedWaitingMixin:
    """The Sarathi orders' scaffolding: one key, `order_key` (a policy sets it, `staticmethod(key)`), orders
    both the waiting line (through a `WaitingHeap` fed by the arrival/preempt hooks) and the partial prefills."""

    order_key: Callable[[RequestState], tuple]

    def waiting_key(self, state: RequestState) -> tuple:
        return self.order_key(state)

    def prefill_order(self, partial: list[RequestState]) -> list[RequestState]:
        return sorted(partial, key=self.order_key)

    def _heap(self) -> WaitingHeap:
        h = self.__dict__.get("_waiting_heap")
        if h is None:
            h = self._waiting_heap = WaitingHeap(f"{self.name}.entry")
        return h

    def on_arrival(self, state: RequestState, view: ReplicaView) -> None:
        self._heap().push(state, self.waiting_key(state)[:-1])

    def on_preempt(self, state: RequestState, mode: PreemptMode, view: ReplicaView) -> None:
        self._heap().push(state, self.waiting_key(state)[:-1])

    def order_waiting(self, waiting: Sequence[RequestState]) -> Iterator[RequestState]:
        return self._heap().ordered(self._replica_index)

    def plan(self, view: ReplicaView) -> BatchPlan:
        self._replica_index = view.index
        try:
            return super().plan(view)
        finally:
            self._heap().restore()


@declares_steady_plans
class SarathiEDFPolicy(KeyedWaitingMixin, SarathiFCFSPolicy):
    name = "sarathi_edf"
    order_key = staticmethod(deadline_key)
