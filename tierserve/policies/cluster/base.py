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

    def setup(self, num_replicas: int, seed: int) -> None:
        """Called once before the run."""

    @abstractmethod
    def dispatch(self, state: RequestState, instances: Sequence[InstanceView], now: float) -> int | None:
        ...

    def dispatch_order(self, queued: list[RequestState], now: float) -> list[RequestState]:
        """Order in which held requests are retried at time `now`; arrival order by default."""
        return queued

    def rebalance(self, instances: Sequence[InstanceView], now: float) -> list[Move]:
        return []
