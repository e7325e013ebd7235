# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""The event core: a heap of (time, rank, seq) → callback. It knows no event kinds.

`rank` orders simultaneous events (lower first) so runs are deterministic; `seq` keeps insertion order.
Cancellation is lazy: a caller holding a stale handle's token simply ignores it (see `Timer`).
"""
from __future__ import annotations

import heapq
from typing import Any, Callable


class EventLoop:
    __slots__ = ("now", "_heap", "_seq", "events_processed")

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, int, Callable[..., Any], tuple]] = []
        self._seq = 0
        self.events_processed = 0

    def at(self, time: float, rank: int, fn: Callable[..., Any], *args: Any) -> None:
        if time < self.now:
            raise RuntimeError(f"event scheduled in the past: {time} < now {self.now}")
        self._seq += 1
        heapq.heappush(self._heap, (time, rank, self._seq, fn, args))

    def run(self, until: float = float("inf")) -> None:
        heap = self._heap
        pop = heapq.heappop
        while heap:
            if heap[0][0] > until:
                self.now = until
                return
            time, _, _, fn, args = pop(heap)
            self.now = time
            self.events_processed += 1
            fn(*args)

    @property
    def pending(self) -> int:
        return len(self._heap)
