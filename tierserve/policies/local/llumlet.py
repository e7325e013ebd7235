"""Llumnix's llumlet queue discipline: tier first, then arrival (seed 000), on vLLM v1's batch shape."""
from __future__ import annotations

from tierserve.policies.local.vllm import VLLMPriorityPolicy


class LlumletPolicy(VLLMPriorityPolicy):
    name = "llumlet"
