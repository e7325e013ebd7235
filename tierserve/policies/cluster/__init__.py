"""Cluster-level (global) scheduling policies, by the names the papers use."""
from tierserve.policies.cluster.base import ClusterPolicy, InstanceView, Move
from tierserve.policies.registry import Registry

CLUSTER_POLICIES = Registry("cluster", {
    "round_robin": "tierserve.policies.cluster.round_robin:RoundRobin",
    "random": "tierserve.policies.cluster.random_dispatch:RandomDispatch",
    "jsq": "tierserve.policies.cluster.jsq:JoinShortestQueue",
    "infaas": "tierserve.policies.cluster.infaas:InfaasDispatch",
    "llumnix": "tierserve.policies.cluster.llumnix:LlumnixPolicy",
    "llumnix_k": "tierserve.policies.cluster.llumnix_k:LlumnixK",
    "llumnix_k_adaptive": "tierserve.policies.cluster.llumnix_k:LlumnixKAdaptive",
    "silo": "tierserve.policies.cluster.silo:SiloDispatch",
    "deadline_slack": "tierserve.policies.cluster.deadline_slack:DeadlineSlackDispatch",
    "tierserve": "tierserve.policies.cluster.tierserve:TierServeDispatch",
})

__all__ = ["CLUSTER_POLICIES", "ClusterPolicy", "InstanceView", "Move"]
