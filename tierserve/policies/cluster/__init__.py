"""Cluster-level (global) scheduling policies, by the names the papers use."""
from tierserve.policies.cluster.base import ClusterPolicy, InstanceView, Move
from tierserve.policies.registry import Registry

CLUSTER_POLICIES = Registry("cluster", {
    "round_robin": "tierserve.policies.cluster.round_robin:RoundRobin",
    "random": "tierserve.policies.cluster.random_dispatch:RandomDispatch",
    "jsq": "tierserve.policies.cluster.jsq:JoinShortestQueue",
})

__all__ = ["CLUSTER_POLICIES", "ClusterPolicy", "InstanceView", "Move"]
