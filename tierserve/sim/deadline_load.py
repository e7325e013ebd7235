# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""Driver-kept deadline load of one replica, for `deadline_slack` dispatch in O(log n + running) per read.

`DeadlineLoad(replica)` answers `load(D)` = (ahead, decodes, context):
  ahead    Σ prefill tokens still to compute of the replica's requests that are not relegated and whose
           prefill deadline (`deadlines.prefill_deadline`) is ≤ D — waiting, swapped, or running a partial
           prefill (a running request with > 1 token left, or none generated yet);
  decodes  running requests that are not partial prefills;
  context  Σ (computed tokens + 1) over those decodes.

Exactly the walk over running + waiting + swapped that `deadline_slack`'s docstring defines (integers, so
the sums are exact), but the queued part is kept, not walked: a queued request's deadline and prefill tokens
left do not change while it waits, so each is inserted once into a sorted structure keyed by deadline
(`PrefixSums`) and read as a prefix sum. Only the running list (≤ max_num_seqs) is walked per read.

What keeps it exact: it is a `QueueListener` (queue_events.py) of its replica, which reports every way into
waiting/swapped (enqueue, preemption), relegation, withdrawal and a finish (in case a request ended before
any read); the policy's hooks are left alone. A request leaves the queues for running without an event: the
next read finds it in running and drops its entry. If the entries ever disagree in number with the queues
(a path no hook sees, e.g. a migration pausing a request the reads never saw running), the read rebuilds from
the queues (`rebuilds` counts it) rather than answer wrong.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from typing import Any

from tierserve.core import RequestState
from tierserve.policies.local.deadlines import prefill_deadline
from tierserve.sim.queue_events import QueueListener
from tierserve.sim.replica import Replica

_BLOCK = 256          # entries per block of the sorted structure: a read sums ≤ n/_BLOCK block totals


class PrefixSums:
    """Integer values under unique sortable keys (deadline, seq); `sum_upto(D)` = Σ values with deadline ≤ D.

    A list of sorted blocks with per-block totals: insert/remove O(log n + _BLOCK), a prefix sum
    O(log n + n/_BLOCK + _BLOCK) — all list operations that run in C. Each block also keeps its keys'
    deadlines as plain floats, so a prefix sum bisects floats, not (deadline, seq) tuples.
    """

    __slots__ = ("_keys", "_deadlines", "_vals", "_totals", "_lasts", "_last_deadlines", "count")

    def __init__(self) -> None:
        self._keys: list[list[tuple[float, int]]] = []
        self._deadlines: list[list[float]] = []        # the keys' deadlines, block by block
        self._vals: list[list[int]] = []
        self._totals: list[int] = []
        self._lasts: list[tuple[float, int]] = []     # the largest key of each block
        self._last_deadlines: list[float] = []        # … and its deadline
        self.count = 0

    def insert(self, key: tuple[float, int], value: int) -> None:
        self.count += 1
        lasts = self._lasts
        if not lasts:
            self._keys.append([key])
            self._deadlines.append([key[0]])
            self._vals.append([value])
            self._totals.append(value)
            lasts.append(key)
            self._last_deadlines.append(key[0])
            return
        b = bisect_left(lasts, key)
        if b == len(lasts):
            b -= 1
        keys, deadlines, vals = self._keys[b], self._deadlines[b], self._vals[b]
        i = bisect_left(keys, key)
        keys.insert(i, key)
        deadlines.insert(i, key[0])
        vals.insert(i, value)
        self._totals[b] += value
        lasts[b] = keys[-1]
        self._last_deadlines[b] = deadlines[-1]
        if len(keys) > 2 * _BLOCK:                    # split: keep blocks short so an insert stays cheap
            self._keys[b + 1:b + 1] = [keys[_BLOCK:]]
            self._deadlines[b + 1:b + 1] = [deadlines[_BLOCK:]]
            self._vals[b + 1:b + 1] = [vals[_BLOCK:]]
            del keys[_BLOCK:], deadlines[_BLOCK:], vals[_BLOCK:]
            self._totals[b:b + 1] = [sum(vals), sum(self._vals[b + 1])]
            lasts[b:b + 1] = [keys[-1], self._keys[b + 1][-1]]
            self._last_deadlines[b:b + 1] = [deadlines[-1], self._deadlines[b + 1][-1]]

    def remove(self, key: tuple[float, int]) -> None:
        b = bisect_left(self._lasts, key)
        if b == len(self._lasts):
            raise KeyError(key)
        keys = self._keys[b]
        i = bisect_left(keys, key)
        if i == len(keys) or keys[i] != key:
            raise KeyError(key)
        self.count -= 1
        del keys[i]
        deadlines = self._deadlines[b]
        del deadlines[i]
        self._totals[b] -= self._vals[b].pop(i)
        if keys:
            self._lasts[b] = keys[-1]
            self._last_deadlines[b] = deadlines[-1]
        else:
            del self._keys[b], self._deadlines[b], self._vals[b], self._totals[b]
            del self._lasts[b], self._last_deadlines[b]

    def sum_upto(self, deadline: float) -> int:
        last_deadlines = self._last_deadlines
        b = bisect_right(last_deadlines, deadline)    # blocks before b lie wholly at or below the deadline
        total = 0
        totals = self._totals
        for j in range(b):
            total += totals[j]
        if b < len(last_deadlines):
            vals = self._vals[b]
            for j in range(bisect_right(self._deadlines[b], deadline)):
                total += vals[j]
        return total


class DeadlineLoad(QueueListener):
    """The deadline load of one replica (module docstring); `replica` has running/waiting/swapped lists. With
    the simulator's replica, register it: `replica.add_queue_listener(load)`."""

    def __init__(self, replica: Any) -> None:
        self._replica: Any = replica
        # The simulator's replica: its executor stamps say when the running part may have changed.
        self._stamped: Replica | None = replica if isinstance(replica, Replica) else None
        self._queued = PrefixSums()
        # id -> key in `_queued`, or None for a relegated one (queued, counted as no work ahead)
        self._entries: dict[int, tuple[float, int] | None] = {}
        self._seq = 0
        self.rebuilds = 0
        # The running part as of the last walk, valid while the stamps below are unchanged: decodes, their
        # context, and the running non-relegated partial prefills' (prefill deadline, tokens left).
        self._kept = False
        self._queues_version = -1
        self._exec_version = -1
        self._busy = False
        self._run_done = -1
        self._run_batch = 0
        self._decodes = 0
        self._context = 0
        self._partial_deadlines: list[float] = []
        self._partial_left: list[int] = []
        self.walks = 0                   # reads that walked the running list (the rest reused the kept part)
        self.advances = 0                # reads that advanced the kept context over a decode run's iterations

    # ----- updates (the queue events) -----
    def queued(self, state: RequestState) -> None:
        """`state` joined waiting or swapped (its deadline and tokens left are fixed until it leaves)."""
        self.forget(state)
        if state.relegated:
            self._entries[state.id] = None
            return
        self._seq += 1
        key = (prefill_deadline(state), self._seq)
        self._queued.insert(key, state.num_tokens - state.num_computed_tokens)
        self._entries[state.id] = key

    def relegated(self, state: RequestState) -> None:
        self._kept = False                            # a running partial prefill may be the one relegated
        if state.id in self._entries:
            self.forget(state)
            self._entries[state.id] = None

    def forget(self, state: RequestState) -> None:
        key = self._entries.pop(state.id, None)
        if key is not None:
            self._queued.remove(key)

    def left(self, state: RequestState) -> None:
        self.forget(state)

    def finished(self, state: RequestState) -> None:
        self.forget(state)

    def _rebuild(self) -> None:
        self.rebuilds += 1
        self._queued = PrefixSums()
        self._entries.clear()
        for queue in (self._replica.waiting, self._replica.swapped):
            for q in queue:
                self.queued(q)

    # ----- the read -----
    def load(self, deadline: float) -> tuple[int, int, int]:
        """(prefill tokens ahead of `deadline`, running decodes, their context tokens); the replica must be
        brought to now first: `Replica.sync`, or `Replica.checkpoint` (a decode run's iterations ended but
        not applied are then added here)."""
        r = self._stamped
        if r is None:
            rep = self._replica
            self._walk(rep.running, rep.waiting, rep.swapped)
        else:
            run = r._run
            # Iterations of the decode run in flight ended by now: applied (`done`), or recorded for its next
            # pass (`checkpoint`), so the requests' counts still lack them.
            done = -1
            if run is not None:
                done = run.pending[-1][0] if run.pending else run.done
            if not (self._kept and r.queues_version == self._queues_version and r._version == self._exec_version
                    and r._busy == self._busy):
                self._walk(r.running, r.waiting, r.swapped)
                if run is not None and done > run.done:
                    self._context += len(run.batch) * (done - run.done)
                self._kept = True
                self._queues_version, self._exec_version, self._busy = r.queues_version, r._version, r._busy
                self._run_done = done
                self._run_batch = len(run.batch) if run is not None else 0
            elif done != self._run_done:
                # The same decode run advanced: each of its requests (all running decodes) gained a token per
                # iteration applied, and nothing else in running changed (any join, leave or new iteration
                # moves a stamp).
                self._context += self._run_batch * (done - self._run_done)
                self._run_done = done
                self.advances += 1
        ahead = 0
        partial_deadlines = self._partial_deadlines
        if partial_deadlines:
            partial_left = self._partial_left
            for j in range(len(partial_deadlines)):
                if partial_deadlines[j] <= deadline:
                    ahead += partial_left[j]
        queued = self._queued
        if queued.count:
            ahead += queued.sum_upto(deadline)
        return ahead, self._decodes, self._context

    def _walk(self, running: list[RequestState], waiting: list[RequestState],
              swapped: list[RequestState]) -> None:
        """Recount the running part; drop the entries of requests that left a queue for running (no hook
        sees that) and rebuild the queued part if the entries still disagree in number with the queues."""
        self.walks += 1
        entries = self._entries
        left_queues = len(entries) > len(waiting) + len(swapped)     # some entry is for a request gone
        decodes = context = 0
        partial_deadlines: list[float] = []
        partial_left: list[int] = []
        for q in running:
            if left_queues and q.id in entries:
                self.forget(q)                        # left the queue for running since the last read
            left = q.num_tokens - q.num_computed_tokens
            if left > 1 or q.num_generated == 0:      # a partial prefill
                if not q.relegated:
                    partial_deadlines.append(prefill_deadline(q))
                    partial_left.append(left)
            else:
                decodes += 1
                context += q.num_computed_tokens + 1
        self._decodes, self._context = decodes, context
        self._partial_deadlines, self._partial_left = partial_deadlines, partial_left
        if len(entries) != len(waiting) + len(swapped):
            self._rebuild()
