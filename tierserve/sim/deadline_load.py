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

What keeps it exact: every way into waiting/swapped passes a local-policy hook the replica calls (enqueue →
`on_arrival`, preemption → `on_preempt`), as does relegation (`on_relegate`) and withdrawal (`on_migrate_out`);
`observe(policy)` chains onto those hooks of the replica's local policy. A request leaves the queues for
running without a hook: the next read finds it in running and drops its entry, and the driver reports a
finish (`finished`) in case it ended before any read. If the entries ever disagree in number with the queues
(a path no hook sees, e.g. a migration pausing a request the reads never saw running), the read rebuilds from
the queues (`rebuilds` counts it) rather than answer wrong.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right

from tierserve.core import RequestState
from tierserve.policies.local.deadlines import prefill_deadline

_BLOCK = 256          # entries per block of the sorted structure: a read sums ≤ n/_BLOCK block totals


class PrefixSums:
    """Integer values under unique sortable keys (deadline, seq); `sum_upto(D)` = Σ values with deadline ≤ D.

    A list of sorted blocks with per-block totals: insert/remove O(log n + _BLOCK), a prefix sum
    O(log n + n/_BLOCK + _BLOCK) — all list operations that run in C.
    """

    __slots__ = ("_keys", "_vals", "_totals", "_lasts", "count")

    def __init__(self) -> None:
        self._keys: list[list[tuple[float, int]]] = []
        self._vals: list[list[int]] = []
        self._totals: list[int] = []
        self._lasts: list[tuple[float, int]] = []     # the largest key of each block
        self.count = 0

    def insert(self, key: tuple[float, int], value: int) -> None:
        self.count += 1
        lasts = self._lasts
        if not lasts:
            self._keys.append([key])
            self._vals.append([value])
            self._totals.append(value)
            lasts.append(key)
            return
        b = bisect_left(lasts, key)
        if b == len(lasts):
            b -= 1
        keys, vals = self._keys[b], self._vals[b]
        i = bisect_left(keys, key)
        keys.insert(i, key)
        vals.insert(i, value)
        self._totals[b] += value
        lasts[b] = keys[-1]
        if len(keys) > 2 * _BLOCK:                    # split: keep blocks short so an insert stays cheap
            self._keys[b + 1:b + 1] = [keys[_BLOCK:]]
            self._vals[b + 1:b + 1] = [vals[_BLOCK:]]
            del keys[_BLOCK:], vals[_BLOCK:]
            self._totals[b:b + 1] = [sum(vals), sum(self._vals[b + 1])]
            lasts[b:b + 1] = [keys[-1], self._keys[b + 1][-1]]

    def remove(self, key: tuple[float, int]) -> None:
        b = bisect_left(self._lasts, key)
        keys = self._keys[b]
        i = bisect_left(keys, key)
        if i == len(keys) or keys[i] != key:
            raise KeyError(key)
        self.count -= 1
        del keys[i]
        self._totals[b] -= self._vals[b].pop(i)
        if keys:
            self._lasts[b] = keys[-1]
        else:
            del self._keys[b], self._vals[b], self._totals[b], self._lasts[b]

    def sum_upto(self, deadline: float) -> int:
        bound = (deadline, float("inf"))              # above every (deadline, seq) key with that deadline
        b = bisect_right(self._lasts, bound)          # blocks before b lie wholly at or below the deadline
        total = sum(self._totals[:b])
        if b < len(self._lasts):
            keys = self._keys[b]
            total += sum(self._vals[b][:bisect_right(keys, bound)])
        return total


class DeadlineLoad:
    """The deadline load of one replica (module docstring); `replica` has running/waiting/swapped lists."""

    def __init__(self, replica) -> None:
        self._replica = replica
        self._queued = PrefixSums()
        # id -> key in `_queued`, or None for a relegated one (queued, counted as no work ahead)
        self._entries: dict[int, tuple[float, int] | None] = {}
        self._seq = 0
        self.rebuilds = 0

    def observe(self, local_policy) -> None:
        """Chain onto the hooks the replica calls when a request joins a queue, is relegated or leaves."""
        on_arrival, on_preempt = local_policy.on_arrival, local_policy.on_preempt
        on_relegate, on_migrate_out = local_policy.on_relegate, local_policy.on_migrate_out

        def arrived(state, view):
            on_arrival(state, view)
            self.queued(state)

        def preempted(state, mode, view):
            on_preempt(state, mode, view)
            self.queued(state)

        def relegated(state, view):
            on_relegate(state, view)
            self.relegated(state)

        def migrated_out(state, view):
            on_migrate_out(state, view)
            self.forget(state)

        local_policy.on_arrival, local_policy.on_preempt = arrived, preempted
        local_policy.on_relegate, local_policy.on_migrate_out = relegated, migrated_out

    # ----- updates -----
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
        if state.id in self._entries:
            self.forget(state)
            self._entries[state.id] = None

    def forget(self, state: RequestState) -> None:
        key = self._entries.pop(state.id, None)
        if key is not None:
            self._queued.remove(key)

    finished = forget

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
        synced to now (the handle's `running` does it)."""
        r = self._replica
        entries = self._entries
        ahead = decodes = context = 0
        for q in r.running:
            if entries and q.id in entries:
                self.forget(q)                        # left the queue for running since the last read
            left = q.num_tokens - q.num_computed_tokens
            if left > 1 or q.num_generated == 0:      # a partial prefill
                if not q.relegated and prefill_deadline(q) <= deadline:
                    ahead += left
            else:
                decodes += 1
                context += q.num_computed_tokens + 1
        if len(entries) != len(r.waiting) + len(r.swapped):
            self._rebuild()
        return ahead + self._queued.sum_upto(deadline), decodes, context
