# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""N replicas behind a global dispatcher: arrivals streamed in order, dispatch, global queue, rebalance."""
from __future__ import annotations

from collections import deque
from typing import Any, Callable, Sequence

from tierserve.core import Request, RequestState, Status
from tierserve.policies.cluster.base import ClusterPolicy, Move
from tierserve.policies.cluster.freeness import InstanceLoad, check_tier_counts, measure
from tierserve.policies.cluster.slack_argmax import DeadlineLoadView
from tierserve.sim.deadline_load import DeadlineLoad
from tierserve.sim.events import EventLoop
from tierserve.sim.replica import Replica

RANK_ARRIVAL = 1
RANK_TICK = 2


class InstanceHandle(DeadlineLoadView):
    """A replica as a cluster policy sees it; every read brings the replica's state up to now."""

    __slots__ = ("_replica", "index", "total_blocks", "block_size", "max_num_seqs", "migrating_count",
                 "_deadline_load", "_load", "_load_version", "_load_num_tiers", "_load_queues")

    def __init__(self, replica: Replica) -> None:
        self._replica = replica
        self.index = replica.index
        self.total_blocks = replica.total_blocks
        self.block_size = replica.block_size
        self.max_num_seqs = replica.max_num_seqs
        self.migrating_count = 0
        self._deadline_load: DeadlineLoad | None = None      # once `track_deadline_load` ran
        # `measure_load`'s last answer: the queue-derived part is valid while the replica's queues_version
        # equals _load_version; the whole load while its blocks, running count and migrations are unchanged too.
        self._load: InstanceLoad | None = None
        self._load_version = -1
        self._load_num_tiers: int | None = None
        self._load_queues: tuple[dict[int, int], int, int, bool] = ({}, 0, 0, False)

    @property
    def predictor(self) -> Any:
        """The replica's own execution-time model (the one its iterations are timed with)."""
        return self._replica.predictor

    def iteration_predictor(self) -> Any:
        return self._replica.predictor

    def track_deadline_load(self) -> None:
        """Keep the replica's deadline load from now on (`DeadlineLoad`; for policies that read it)."""
        load = DeadlineLoad(self._replica)
        self._replica.add_queue_listener(load)
        self._deadline_load = load

    def deadline_load(self, deadline: float) -> tuple[int, int, int]:
        """(prefill tokens ahead of `deadline`, running decodes, their context tokens): `DeadlineLoad.load`."""
        load = self._deadline_load
        if load is None:
            raise RuntimeError("deadline_load: the cluster was not asked to track it (policy.uses_deadline_load)")
        self._replica.checkpoint()           # the load adds a decode run's unapplied progress itself
        return load.load(deadline)

    @property
    def used_blocks(self) -> int:
        return self._replica.used_blocks_now()

    @property
    def running(self) -> list[RequestState]:
        self._replica.sync()
        return self._replica.running

    @property
    def waiting(self) -> list[RequestState]:
        return self._replica.waiting

    @property
    def swapped(self) -> list[RequestState]:
        return self._replica.swapped

    @property
    def num_outstanding(self) -> int:
        r = self._replica
        return len(r.running) + len(r.waiting) + len(r.swapped)

    # Load counters the executor keeps as requests join and leave its queues (constant time per read).
    @property
    def num_running(self) -> int:
        return len(self._replica.running)

    @property
    def num_queued(self) -> int:
        r = self._replica
        return len(r.waiting) + len(r.swapped)

    @property
    def tier_counts(self) -> dict[int, int]:
        r = self._replica
        run, wait, swap = r.tier_running, r.tier_waiting, r.tier_swapped
        return {t: run[t] + wait[t] + swap[t] for t in r.tier_order}

    @property
    def waiting_head(self) -> RequestState | None:
        return self._replica.waiting_head

    @property
    def waiting_demand_blocks(self) -> int:
        return self._replica.waiting_demand_blocks

    @property
    def swapped_demand_blocks(self) -> int:
        return self._replica.swapped_demand_blocks

    @property
    def num_preempted_waiting(self) -> int:
        return self._replica.num_preempted_waiting

    @property
    def migrating(self) -> bool:
        return self.migrating_count > 0

    def measure_load(self, num_tiers: int | None = None) -> InstanceLoad:
        """`freeness.measure_counters(self, num_tiers)`, the same values read at the same moments (queue
        counters, then blocks as a sync would leave them (`Replica.used_blocks_now`) and the running count),
        but kept between reads: a dispatch reads every instance while few changed since the last one. The
        queue-derived part is recomputed when `queues_version` moved (every join or leave bumps it), the load
        object when anything else it holds changed; an unchanged load is the same object (policies treat loads
        as read-only)."""
        r = self._replica
        version = r.queues_version
        if version != self._load_version or num_tiers != self._load_num_tiers:
            run, wait, swap = r.tier_running, r.tier_waiting, r.tier_swapped
            counts = {t: run[t] + wait[t] + swap[t] for t in r.tier_order}
            check_tier_counts(counts, num_tiers)
            head = r.waiting_head
            bs = r.block_size
            hol = (-(-head.num_tokens // bs) if head is not None else 0) + r.swapped_demand_blocks
            self._load_queues = (counts, hol, len(r.waiting) + len(r.swapped),
                                 r.num_preempted_waiting > 0 or bool(r.swapped))
            self._load_version = version
            self._load_num_tiers = num_tiers
            self._load = None
        used = r.used_blocks_now()
        num_running = len(r.running)
        migrating = self.migrating_count > 0
        load = self._load
        if (load is not None and load.used_blocks == used and load.num_running == num_running
                and load.migrating == migrating):
            return load
        counts, hol, queued, preempted = self._load_queues
        load = self._load = InstanceLoad(self.index, self.total_blocks, self.block_size, used, hol, num_running,
                                         queued, counts, preempted, migrating, False)
        return load

    @staticmethod
    def measure_each(views: Sequence[Any], num_tiers: int | None = None) -> list[InstanceLoad]:
        """`freeness.measure_all(views, num_tiers)`: each handle's `measure_load` (a direct call when
        compiled), `freeness.measure` for any other view, in order."""
        loads: list[InstanceLoad] = []
        for v in views:
            if isinstance(v, InstanceHandle):
                loads.append(v.measure_load(num_tiers))
            else:
                loads.append(measure(v, num_tiers))
        return loads

    @property
    def terminating(self) -> bool:
        return False          # no autoscaling yet: no instance is ever drained


class Cluster:
    """Drives arrivals through the cluster policy onto replicas and collects every request's end."""

    def __init__(self, replicas: list[Replica], policy: ClusterPolicy, loop: EventLoop, requests: Sequence[Request],
                 reject_reason, seed: int = 0, migration_executor=None) -> None:
        self.replicas = replicas
        self.handles = [InstanceHandle(r) for r in replicas]
        # Any: compiled, a declared type is checked at run time; a policy's answers (an index as a numpy
        # integer, moves as a tuple) are accepted as they were before this module was compiled.
        self.policy: Any = policy
        self.loop = loop
        self.requests = requests
        self.reject_reason = reject_reason          # (Request, its fresh RequestState) -> str | None
        self.states: list[RequestState] = []
        self.reasons: dict[int, str] = {}
        # Requests the cluster policy holds: in lanes (`ClusterPolicy.queue_lane`), each kept in arrival
        # order, so a retry looks at one head per lane instead of re-sorting; else one list that
        # `dispatch_order` orders at every retry.
        self.queue: list[RequestState] = []
        self._lanes: dict[int, deque[RequestState]] = {}
        self._uses_lanes = type(policy).queue_lane is not ClusterPolicy.queue_lane
        self.num_held = 0
        # Deferrals: a request the policy held and later dispatched ends with reason "deferred: …" in its
        # record (requests.csv), counted per tier here; one still held at the end is censored as any other.
        self._held_since: dict[int, float] = {}
        self.deferred_by_tier: dict[int, int] = {}
        self.num_ended = 0
        self._next_arrival = 0
        self.migration = migration_executor
        self.progress: Callable[[int, int], None] | None = None   # optional: (num_arrived, num_total)
        # Streaming (set by `simulate(..., sink=...)`): a request that ends goes to `on_end(index, state,
        # reason)` and is forgotten; `live` holds the ones in flight (object id -> (arrival index, state)).
        self.on_end: Callable[[int, RequestState, str | None], None] | None = None
        self.live: dict[int, tuple[int, RequestState]] = {}
        policy.setup(len(replicas), seed)
        self._tracks_deadline_load = getattr(policy, "uses_deadline_load", False)
        if self._tracks_deadline_load:
            for h in self.handles:
                h.track_deadline_load()
        for r in replicas:
            r.on_finish = self._on_finish

    def start(self) -> None:
        if self.requests:
            self.loop.at(self.requests[0].arrival_s, RANK_ARRIVAL, self._arrive)
        if self.policy.rebalance_period_s:
            self.loop.at(self.policy.rebalance_period_s, RANK_TICK, self._tick)

    @property
    def all_ended(self) -> bool:
        return self.num_ended == len(self.requests)

    def _arrive(self) -> None:
        i = self._next_arrival
        request = self.requests[i]
        self._next_arrival = i + 1
        if i + 1 < len(self.requests):
            self.loop.at(self.requests[i + 1].arrival_s, RANK_ARRIVAL, self._arrive)
        state = RequestState(request)
        if self.on_end is None:
            self.states.append(state)
        if self.progress is not None and (i & 1023) == 0:
            self.progress(i, len(self.requests))
        reason = self.reject_reason(request, state)
        if reason is not None:
            state.status = Status.REJECTED
            self.num_ended += 1
            if self.on_end is not None:
                self.on_end(i, state, reason)
            else:
                self.reasons[request.id] = reason
            return
        if self.on_end is not None:
            self.live[id(state)] = (i, state)
        if self.num_held:                 # keep the global queue's order: newcomers wait behind it
            self._hold(state)
            self._drain_queue()
        else:
            self._dispatch(state)

    def _dispatch(self, state: RequestState) -> bool:
        now = self.loop.now
        target = self.policy.dispatch(state, self.handles, now)
        if target is None:
            self._hold(state)
            return False
        state.dispatch_s = now
        self.replicas[target].enqueue(state)
        return True

    def _hold(self, state: RequestState) -> None:
        self.num_held += 1
        self._held_since[id(state)] = self.loop.now
        if not self._uses_lanes:
            self.queue.append(state)
            return
        lane = self._lanes.get(self.policy.queue_lane(state))
        if lane is None:
            lane = self._lanes[self.policy.queue_lane(state)] = deque()
        key = (state.arrival_s, state.id)
        i = len(lane)
        while i and (lane[i - 1].arrival_s, lane[i - 1].id) > key:    # arrivals come in order: O(1) here
            i -= 1
        lane.insert(i, state)

    def _drain_queue(self) -> None:
        now = self.loop.now
        policy = self.policy
        if not self._uses_lanes:
            for state in policy.dispatch_order(list(self.queue), now):
                target = policy.dispatch(state, self.handles, now)
                if target is None:
                    break                     # strict order: nothing overtakes a held request
                self.queue.remove(state)
                self.num_held -= 1
                state.dispatch_s = now
                self._record_deferral(state, now)
                self.replicas[target].enqueue(state)
            return
        # The same order as sorting every held request by `queue_key`: the least lane head, repeatedly.
        lanes = self._lanes.values()
        while True:
            best_key: Any = None
            best: deque[RequestState] | None = None
            for lane in lanes:
                if lane:
                    key = policy.queue_key(lane[0], now)
                    if best is None or key < best_key:
                        best_key, best = key, lane
            if best is None:
                return
            state = best[0]
            target = policy.dispatch(state, self.handles, now)
            if target is None:
                return                        # strict order: nothing overtakes a held request
            best.popleft()
            self.num_held -= 1
            state.dispatch_s = now
            self._record_deferral(state, now)
            self.replicas[target].enqueue(state)

    def _record_deferral(self, state: RequestState, now: float) -> None:
        """A held request leaves the global queue: if it waited there, its record says for how long."""
        since = self._held_since.pop(id(state))
        if now > since:
            self.deferred_by_tier[state.tier] = self.deferred_by_tier.get(state.tier, 0) + 1
            self.reasons[state.id] = (f"deferred: held {now - state.arrival_s:.3f} s in the global queue by "
                                      f"{self.policy.name}")

    def _on_finish(self, state: RequestState) -> None:
        self.num_ended += 1
        if self.on_end is not None:
            self.on_end(self.live.pop(id(state))[0], state, self.reasons.pop(state.id, None))
        if self.num_held:
            self._drain_queue()

    def _tick(self) -> None:
        now = self.loop.now
        if self.num_held:
            self._drain_queue()
        moves: Sequence[Move] = self.policy.rebalance(self.handles, now)
        started = 0
        if moves and self.migration is not None:
            for move in moves:
                started += bool(self.migration.start(move))
        # With no other event pending and nothing moved, no later tick can change anything: stop, and let
        # the run report what is left (stranded) rather than tick forever.
        period = self.policy.rebalance_period_s
        if not self.all_ended and (self.loop.pending or started) and period is not None:
            self.loop.at(now + period, RANK_TICK, self._tick)
