"""Uniform random dispatch, seeded for determinism."""
from __future__ import annotations

import random
from typing import Sequence

from tierserve.core import RequestState
from tierserve.policies.cluster.base import ClusterPolicy, InstanceView


class RandomDispatch(ClusterPolicy):
    name = "random"

    def setup(self, num_replicas: int, seed: int) -> None:
        self._rng = random.Random(seed)

    def dispatch(self, state: RequestState, instances: Sequence[InstanceView], now: float) -> int:
        return self._rng.randrange(len(instances))
