"""`vllm_edf`: vLLM v1's per-chunk loop (chunked prefill, per-chunk KV allocation, recompute preemption —
everything v1 can honour) with the waiting queue in earliest-deadline-first order and the victim the running
request whose deadline is latest. The deadline is the one Sarathi-EDF and Niyama use
(`tierserve.policies.local.deadlines.prefill_deadline`): a + TTFT for an interactive request, a + TTLT for a
non-interactive one, the next token's deadline for a request refilling after a recompute; a request without
an SLO has no deadline (infinity) and goes after every request with one, in arrival order.

`sarathi_edf` and `niyama` themselves reserve a request's whole prompt at admission (`WHOLE_PROMPT`), which v1
cannot honour, so the adapter refuses them (`check_policy`); `vllm_edf` is their deadline order on v1's rule.
In the simulator it is `-l vllm_edf`; in vLLM, `--additional-config '{"tierserve": {"policy": "vllm_edf"}}'`; per-request targets come in
`vllm_xargs` (`ttft_s`, `tbt_s`, `ttlt_s`; see `mapping.py`).
"""
from __future__ import annotations

from typing import Sequence

from tierserve.core import RequestState
from tierserve.policies.local.sarathi_edf import deadline_key
from tierserve.policies.local.vllm import VLLMPolicy, declares_steady_plans


@declares_steady_plans
class VLLMDeadlinePolicy(VLLMPolicy):
    """vLLM v1 with the waiting queue by earliest deadline (then arrival) and the latest deadline evicted."""

    name = "vllm_edf"
    waiting_order_key = staticmethod(deadline_key)

    def victim_index(self, running: list[RequestState], i: int) -> int:
        worst = 0
        worst_key = deadline_key(running[0])
        for k in range(1, len(running)):
            key = deadline_key(running[k])
            if key > worst_key:
                worst, worst_key = k, key
        return worst

    def order_waiting(self, waiting: Sequence[RequestState]) -> list[RequestState]:
        return sorted(waiting, key=deadline_key)

