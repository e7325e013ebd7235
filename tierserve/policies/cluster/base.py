"""The cluster-level policy interface: dispatch each request, and rebalance by migration."""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Protocol, Sequence

from tierserve.core import RequestState


class InstanceView(Protocol):
    """What a cluster policy sees of one replica (values exact at the moment they are read)."""

    index: int
    total_blocks: int
    block_size: int
    max_num_seqs: int

    @property
    def used_blocks(self) -> int: ...       # KV blocks held now (incl. the iteration in flight)

    @property
    def running(self) -> list[RequestState]: ...

    @property
    def waiting(self) -> list[RequestState]: ...

    @property
    def swapped(self) -> list[RequestState]: ...

    @property
    def num_outstanding(self) -> int: ...   # running + waiting + swapped

    @property
    def terminating(self) -> bool: ...      # being drained (scale-in): freeness −∞

    @property
    def migrating(self) -> bool: ...        # a migration in or out is in progress


class LoadCounters(Protocol):
    """Optional InstanceView fields a driver keeps up to date as requests join and leave the replica's
    queues, so a policy reads load in constant time instead of walking every request (the simulator's
    `InstanceHandle` has them; `freeness.measure` and `infaas.committed_blocks` use them when present)."""

    @property
    def num_running(self) -> int: ...

    @property
    def num_queued(self) -> int: ...        # waiting + swapped

    @property
    def tier_counts(self) -> dict[int, int]: ...   # running + waiting + swapped per tier, in order of first
                                                    # appearance in running, then waiting, then swapped

    @property
    def waiting_head(self) -> RequestState | None: ...   # first waiting request in (tier, arrival, id) order

    @property
    def waiting_demand_blocks(self) -> int: ...   # Σ ceil(num_tokens / block_size) over waiting

    @property
    def swapped_demand_blocks(self) -> int: ...   # … over swapped

    @property
    def num_preempted_waiting(self) -> int: ...   # waiting requests preempted at least once


class DeadlineLoadView(Protocol):
    """Optional InstanceView fields for deadline-aware dispatch, kept by the driver when the policy sets
    `uses_deadline_load` (the simulator's `InstanceHandle`, through `sim.deadline_load`)."""

    @property
    def predictor(self): ...       # the replica's own execution-time model (`iteration_time(...)`)

    def deadline_load(self, deadline: float) -> tuple[int, int, int]: ...
    # (Σ prefill tokens left of the non-relegated requests whose prefill deadline is ≤ `deadline` — waiting,
    #  swapped or mid-prefill —, running decodes, Σ their context tokens): exact at the time of the read


@dataclass(frozen=True, slots=True)
class Move:
    """Migrate `request` from replica `source` to replica `destination`."""

    request: RequestState
    source: int
    destination: int


class ClusterPolicy(ABC):
    """Global scheduler. `dispatch` returns a replica index, or None to hold the request in the global
    queue (retried when replicas change). `rebalance` is called every `rebalance_period_s` when the policy
    sets it (Llumnix: 50 ms) and returns migrations to start."""

    name: str = "base"
    rebalance_period_s: float | None = None
    uses_deadline_load: bool = False      # the driver keeps `DeadlineLoadView` on each instance
    uses_instance_predictor: bool = False  # reads each instance's execution-time model (`InstanceView.predictor`)

    def setup(self, num_replicas: int, seed: int) -> None:
        """Called once before the run."""

    @abstractmethod
    def dispatch(self, state: RequestState, instances: Sequence[InstanceView], now: float) -> int | None:
        ...

    def dispatch_order(self, queued: list[RequestState], now: float) -> list[RequestState]:
        """Order in which held requests are retried at time `now`; arrival order by default."""
        return queued

    def queue_lane(self, state: RequestState) -> int:
        """Optional: the lane of the global queue a held request waits in. A policy that defines it (with
        `queue_key`) promises that within a lane its order is arrival order (arrival_s, id) at every `now`,
        and that `dispatch_order` is the order of `queue_key`; the cluster then keeps each lane in arrival
        order and retries the lane head with the least key, instead of re-sorting the queue."""
        raise NotImplementedError

    def queue_key(self, state: RequestState, now: float) -> tuple:
        """Sort key of a held request at `now` (with `queue_lane`)."""
        raise NotImplementedError

    def rebalance(self, instances: Sequence[InstanceView], now: float) -> list[Move]:
        return []
