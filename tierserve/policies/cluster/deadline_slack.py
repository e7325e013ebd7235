"""Deadline-aware dispatch (issue 9, beyond seed 003): send each request to the replica where its predicted
slack at the first token is largest.

For request r with prefill deadline D_r (a + TTFT for an interactive request, a + TTLT for a non-interactive
one: `deadlines.prefill_deadline`) and P_r prompt tokens, on replica i:

    ahead_i  = Σ prefill tokens still to compute of the requests on i that are not relegated and whose own
               prefill deadline is ≤ D_r (waiting, swapped, or running a partial prefill): the work a
               deadline-ordered replica serves before r;
    T_i      = predicted time of one iteration that runs a `chunk_tokens` prefill chunk next to i's running
               decodes (B_i of them over C_i context tokens): predictor.iteration_time(c, c·c/2, B_i, C_i);
    t_first  = now + (ahead_i + P_r) / c · T_i              (r's first token, prefill at c tokens per iteration)
    slack_i  = D_r − t_first

and r goes to argmax_i slack_i (ties: fewer outstanding requests, then the lower index). D_r − now is the same
on every replica, so the choice is the replica that drains the deadline-ordered work ahead of r soonest: an
interactive request ignores the relaxed backlog it will overtake, a relaxed one sees (nearly) all of it, and a
replica with many running decodes prices each prefill chunk higher. Ordering is by deadline (Niyama's hybrid
priority with α = 0); relegated requests are left out, since a Niyama replica serves them last.

The predictor is the replicas' execution-time model, built from `model`/`gpu`/`tp` like the simulator's (the
cluster's replica view does not carry one), or given directly (tests).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from tierserve.core import ConfigError, RequestState
from tierserve.policies.cluster.base import ClusterPolicy, InstanceView
from tierserve.policies.local.deadlines import prefill_deadline


class DeadlineSlackDispatch(ClusterPolicy):
    name = "deadline_slack"

    def __init__(self, model: str = "Llama-3-8B", gpu: str = "A100-80GB", tp: int = 1, chunk_tokens: int = 512,
                 exec_mode: str = "physical", predictor=None) -> None:
        if not (isinstance(chunk_tokens, int) and not isinstance(chunk_tokens, bool) and chunk_tokens >= 1):
            raise ConfigError("chunk_tokens", chunk_tokens, "an integer >= 1 (prefill tokens per iteration)")
        self.chunk_tokens = chunk_tokens
        if predictor is None:
            from tierserve.hardware.exec_model import make_execution_model
            predictor = make_execution_model(model, gpu, tp, mode=exec_mode)
        self.predictor = predictor

    def predicted_slack_s(self, state: RequestState, inst: InstanceView, now: float) -> float:
        """D_r − predicted first-token time of `state` on `inst` (module docstring)."""
        deadline = prefill_deadline(state)
        ahead = 0
        decodes = 0
        context = 0
        for q in inst.running:
            left = q.num_tokens - q.num_computed_tokens
            if left > 1 or q.num_generated == 0:          # a partial prefill
                if not q.relegated and prefill_deadline(q) <= deadline:
                    ahead += left
            else:
                decodes += 1
                context += q.num_computed_tokens + 1
        for queue in (inst.waiting, inst.swapped):
            for q in queue:
                if not q.relegated and prefill_deadline(q) <= deadline:
                    ahead += q.num_tokens - q.num_computed_tokens
        c = self.chunk_tokens
        per_iteration_s = self.predictor.iteration_time(c, c * c * 0.5, decodes, context)
        return deadline - (now + (ahead + state.num_tokens - state.num_computed_tokens) / c * per_iteration_s)

    def dispatch(self, state: RequestState, instances: Sequence[InstanceView], now: float) -> int:
        best, best_key = 0, (math.inf, math.inf, math.inf)
        for i, inst in enumerate(instances):
            key = (-self.predicted_slack_s(state, inst, now), inst.num_outstanding, i)
            if key < best_key:
                best, best_key = i, key
        return best
