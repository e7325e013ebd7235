# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""A waiting queue ordered by a key fixed when a request enters it (a priority queue, as Niyama's prefill
queue is implemented), for policies whose waiting line can grow to thousands under overload.

Entries are pushed by hooks (arrival, recompute preemption) and validated lazily when popped: an entry is
live while its request is still waiting on this replica and the entry is the request's newest. `ordered()`
yields live requests in key order; whatever it yielded is pushed back by `restore()` after the plan (the
executor then admits some; the rest stay), so a plan costs O(k log n) for the k requests it looks at.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator

from tierserve.core import RequestState, Status


class WaitingHeap:
    __slots__ = ("slot", "_heap", "_popped", "_accept")

    def __init__(self, slot: str, accept: Callable[[RequestState], bool] | None = None) -> None:
        self.slot = slot                     # the policy_data key holding a request's newest entry
        self._heap: list[tuple] = []
        self._popped: list[tuple] = []
        self._accept = accept

    def push(self, state: RequestState, key: tuple) -> None:
        entry = (*key, state.id, state)
        state.policy_data[self.slot] = entry
        heapq.heappush(self._heap, entry)

    def _live(self, entry: tuple, replica: int) -> bool:
        s = entry[-1]
        return (s.policy_data.get(self.slot) is entry and s.status == Status.WAITING and s.replica == replica
                and (self._accept is None or self._accept(s)))

    def entries(self, replica: int) -> Iterator[tuple]:
        """Live entries (key..., id, state) in key order, popped as they are yielded (see `restore`)."""
        heap = self._heap
        while heap:
            entry = heapq.heappop(heap)
            if not self._live(entry, replica):
                continue
            self._popped.append(entry)
            yield entry

    def ordered(self, replica: int) -> Iterator[RequestState]:
        for entry in self.entries(replica):
            yield entry[-1]

    def restore(self) -> None:
        for entry in self._popped:
            heapq.heappush(self._heap, entry)
        self._popped.clear()

    def __len__(self) -> int:
        return len(self._heap)
