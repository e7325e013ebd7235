"""Round-robin dispatch (Vidur's default global scheduler)."""
from __future__ import annotations

from typing import Sequence

from tierserve.core import RequestState
from tierserve.policies.cluster.base import ClusterPolicy, InstanceView


class RoundRobin(ClusterPolicy):
    name = "round_robin"

    def setup(self, num_replicas: int, seed: int) -> None:
        self._next = 0

    def dispatch(self, state: RequestState, instances: Sequence[InstanceView], now: float) -> int:
        i = self._next % len(instances)
        self._next = i + 1
        return i
