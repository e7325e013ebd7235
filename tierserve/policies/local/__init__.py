"""Replica-level scheduling policies, by the names the papers use."""
from tierserve.policies.local.base import LocalPolicy, PolicyError
from tierserve.policies.local.view import IterationPredictor, Oracle, ReplicaView
from tierserve.policies.registry import Registry

LOCAL_POLICIES = Registry("local", {
    "vllm": "tierserve.policies.local.vllm:VLLMPolicy",
    "vllm_priority": "tierserve.policies.local.vllm:VLLMPriorityPolicy",
    "vllm_priority_sorted": "tierserve.policies.local.vllm:VLLMPrioritySortedPolicy",
    "vllm_edf": "tierserve.policies.local.vllm_edf:VLLMDeadlinePolicy",
    "vllm_v0": "tierserve.policies.local.vllm_v0:VLLMv0Policy",
    "sarathi": "tierserve.policies.local.sarathi:SarathiPolicy",
    "orca": "tierserve.policies.local.orca:OrcaPolicy",
    "llumlet": "tierserve.policies.local.llumlet:LlumletPolicy",
    "fcfs": "tierserve.policies.local.fcfs:FCFSPolicy",
    "sjf": "tierserve.policies.local.sjf:SJFPolicy",
    "srpt": "tierserve.policies.local.srpt:SRPTPolicy",
    "las": "tierserve.policies.local.las:LASPolicy",
    "distboost": "tierserve.policies.local.distboost:DistBoostPolicy",
    "uniboost_base": "tierserve.policies.local.uniboost:UniBoostBasePolicy",
    "uniboost_memguard": "tierserve.policies.local.uniboost:UniBoostMemGuardPolicy",
    "uniboost": "tierserve.policies.local.uniboost:UniBoostPolicy",
    "sarathi_fcfs": "tierserve.policies.local.sarathi_fcfs:SarathiFCFSPolicy",
    "sarathi_edf": "tierserve.policies.local.sarathi_edf:SarathiEDFPolicy",
    "sarathi_srpf": "tierserve.policies.local.sarathi_srpf:SarathiSRPFPolicy",
    "niyama": "tierserve.policies.local.niyama:NiyamaPolicy",
    "tierserve": "tierserve.policies.local.tierserve:TierServePolicy",
    "niyama_chunked": "tierserve.policies.local.niyama_chunked:NiyamaChunkedPolicy",
})

__all__ = ["LOCAL_POLICIES", "IterationPredictor", "LocalPolicy", "Oracle", "PolicyError", "ReplicaView"]
