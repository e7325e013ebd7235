"""vLLM's waiting queue on the incremental path: held-back requests stay put, admissions are shown to vLLM's loop.

`KeptWaitingQueue` implements vLLM v1's `RequestQueue` interface (add/pop/peek/prepend/remove, bool, len,
iteration; duck-typed, so this module imports nothing from vLLM). Outside `TierScheduler.schedule` it holds
every waiting request, in no particular order: the driver keeps the policy's order itself (`driver.py`). For
the duration of vLLM's own loop, `show(admit)` makes the queue look like the step's admissions alone, in plan
order; `hide()` puts back whatever the loop left (not admitted, skipped, or evicted meanwhile). Both cost
O(admitted + changes): the held-back requests are never touched.
"""
from __future__ import annotations

from collections import deque
from typing import Iterable, Iterator


class KeptWaitingQueue:
    __slots__ = ("_held", "_shown", "_showing")

    def __init__(self) -> None:
        self._held: dict[str, object] = {}        # request id -> request, every waiting request not shown
        self._shown: deque = deque()              # what vLLM's loop sees while `_showing`
        self._showing = False

    # ----- the scheduler's two calls around vLLM's loop -----
    def show(self, admit: Iterable) -> None:
        """From now until `hide`, the queue is `admit` (those of them queued here), in that order."""
        held = self._held
        shown = self._shown
        for r in admit:
            if held.pop(r.request_id, None) is not None:
                shown.append(r)
        self._showing = True

    def hide(self) -> None:
        """The queue is every waiting request again."""
        held = self._held
        for r in self._shown:
            held[r.request_id] = r
        self._shown.clear()
        self._showing = False

    # ----- vLLM's RequestQueue interface -----
    def add_request(self, request) -> None:
        if self._showing:
            self._shown.append(request)
        else:
            self._held[request.request_id] = request

    def pop_request(self):
        if self._shown:
            return self._shown.popleft()
        if self._showing or not self._held:
            raise IndexError("pop from an empty queue")
        return self._held.pop(next(iter(self._held)))

    def peek_request(self):
        if self._shown:
            return self._shown[0]
        if self._showing or not self._held:
            raise IndexError("peek from an empty queue")
        return next(iter(self._held.values()))

    def prepend_request(self, request) -> None:
        if self._showing:
            self._shown.appendleft(request)
        else:
            self._held[request.request_id] = request

    def prepend_requests(self, requests: Iterable) -> None:
        for r in requests:                       # vLLM's deque semantics: each goes to the front in turn
            self.prepend_request(r)

    def remove_request(self, request) -> None:
        if self._held.pop(request.request_id, None) is None:
            self._shown.remove(request)

    def remove_requests(self, requests: Iterable) -> None:
        gone = [r for r in requests if self._held.pop(r.request_id, None) is None]
        if gone:
            drop = {id(r) for r in gone}
            kept = [r for r in self._shown if id(r) not in drop]
            self._shown.clear()
            self._shown.extend(kept)

    def __bool__(self) -> bool:
        return bool(self._shown) or (not self._showing and bool(self._held))

    def __len__(self) -> int:
        return len(self._shown) if self._showing else len(self._held) + len(self._shown)

    def __iter__(self) -> Iterator:
        if self._showing:
            return iter(self._shown)
        return iter([*self._shown, *self._held.values()])
