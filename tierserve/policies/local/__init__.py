"""Replica-level scheduling policies, by the names the papers use."""
from tierserve.policies.local.base import LocalPolicy, PolicyError
from tierserve.policies.local.view import IterationPredictor, Oracle, ReplicaView
from tierserve.policies.registry import Registry

LOCAL_POLICIES = Registry("local", {
    "vllm": "tierserve.policies.local.vllm:VLLMPolicy",
    "vllm_priority": "tierserve.policies.local.vllm:VLLMPriorityPolicy",
    "vllm_priority_sorted": "tierserve.policies.local.vllm:VLLMPrioritySortedPolicy",
    "vllm_v0": "tierserve.policies.local.vllm_v0:VLLMv0Policy",
    "sarathi": "tierserve.policies.local.sarathi:SarathiPolicy",
    "orca": "tierserve.policies.local.orca:OrcaPolicy",
    "llumlet": "tierserve.policies.local.llumlet:LlumletPolicy",
})

__all__ = ["LOCAL_POLICIES", "IterationPredictor", "LocalPolicy", "Oracle", "PolicyError", "ReplicaView"]
