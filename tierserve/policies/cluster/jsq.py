"""Join-the-shortest-queue: the replica with the fewest outstanding requests (lowest index on ties)."""
from __future__ import annotations

from typing import Sequence

from tierserve.core import RequestState
from tierserve.policies.cluster.base import ClusterPolicy, InstanceView


class JoinShortestQueue(ClusterPolicy):
    name = "jsq"

    def dispatch(self, state: RequestState, instances: Sequence[InstanceView], now: float) -> int:
        return min(range(len(instances)), key=lambda i: (instances[i].num_outstanding, i))
