"""Siloed deployment (seed 003's Sarathi-Silo): one replica pool per QoS class, each request dispatched only
to its class's pool (join-the-shortest-queue inside the pool). Pools never share a replica.

`pools`: for each pool, the tiers it serves; `pool_replicas`: replicas per pool, laid out in order (pool 0
gets replicas 0..n0−1, pool 1 the next n1, …); their sum must equal the cluster's replica count. Per-pool
chunk sizes are the local policy's (`sarathi_fcfs` `chunk_by_replica`; `silo_layout` builds both).
"""
from __future__ import annotations

from collections.abc import Sequence

from tierserve.core import ConfigError, RequestState
from tierserve.policies.cluster.base import ClusterPolicy, InstanceView


def silo_layout(pools: Sequence[Sequence[int]], pool_replicas: Sequence[int],
                pool_chunks: Sequence[int]) -> tuple[dict, list[int]]:
    """(`silo` cluster parameters, `chunk_by_replica` for the local policy) of a siloed deployment."""
    if len(pool_chunks) != len(pools):
        raise ConfigError("pool_chunks", list(pool_chunks), f"one chunk per pool ({len(pools)})")
    chunks = [int(c) for c, n in zip(pool_chunks, pool_replicas) for _ in range(int(n))]
    return {"pools": [list(p) for p in pools], "pool_replicas": [int(n) for n in pool_replicas]}, chunks


class SiloDispatch(ClusterPolicy):
    name = "silo"

    def __init__(self, pools: Sequence[Sequence[int]], pool_replicas: Sequence[int]) -> None:
        if isinstance(pools, (str, bytes)) or not isinstance(pools, Sequence) or not pools:
            raise ConfigError("pools", pools, "a non-empty list of tier lists, one per pool")
        if isinstance(pool_replicas, (str, bytes)) or not isinstance(pool_replicas, Sequence) \
                or len(pool_replicas) != len(pools):
            raise ConfigError("pool_replicas", pool_replicas, f"a list of {len(pools)} replica counts, one per pool")
        self._pool_of_tier: dict[int, int] = {}
        for p, tiers in enumerate(pools):
            if isinstance(tiers, (str, bytes)) or not isinstance(tiers, Sequence) or not tiers:
                raise ConfigError(f"pools[{p}]", tiers, "a non-empty list of tier indices")
            for t in tiers:
                if not (isinstance(t, int) and t >= 0):
                    raise ConfigError(f"pools[{p}]", list(tiers), "tier indices >= 0")
                if t in self._pool_of_tier:
                    raise ConfigError(f"pools[{p}]", list(tiers), f"tiers not in another pool (tier {t} is in pool "
                                      f"{self._pool_of_tier[t]})")
                self._pool_of_tier[t] = p
        self.ranges: list[range] = []
        start = 0
        for p, n in enumerate(pool_replicas):
            if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
                raise ConfigError(f"pool_replicas[{p}]", n, "an integer >= 1")
            self.ranges.append(range(start, start + n))
            start += n
        self.num_replicas = start

    def setup(self, num_replicas: int, seed: int) -> None:
        if num_replicas != self.num_replicas:
            raise ConfigError("num_replicas", num_replicas, f"{self.num_replicas} (the sum of pool_replicas)")

    def pool_of(self, tier: int) -> int:
        p = self._pool_of_tier.get(tier)
        if p is None:
            raise ConfigError("tier", tier, f"a tier of some pool ({sorted(self._pool_of_tier)})")
        return p

    def dispatch(self, state: RequestState, instances: Sequence[InstanceView], now: float) -> int:
        pool = self.ranges[self.pool_of(state.tier)]
        return min(pool, key=lambda i: (instances[i].num_outstanding, i))
