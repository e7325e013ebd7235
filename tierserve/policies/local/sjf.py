"""`sjf` (LTR+): shortest job first by the *true* output length (a perfect ranking predictor; an oracle
baseline), preemptive, with LTR's starvation guard: a request left unscheduled for `starvation_steps`
iterations (200) is promoted ahead of everyone for `quantum_steps` iterations (10) — Fu et al., NeurIPS 2024.

Iterations are counted from `on_iteration_end` (a decode run of k counts k), so the guard is the same under
skip-ahead; the plan's `max_repeat` stops a run where the next promotion or demotion falls.
"""
from __future__ import annotations

from tierserve.core import ConfigError, RequestState
from tierserve.policies.local.base import ReplicaView
from tierserve.policies.local.base import declares_steady_plans
from tierserve.policies.local.priority import NEVER, PriorityLoopPolicy


@declares_steady_plans
class SJFPolicy(PriorityLoopPolicy):
    name = "sjf"
    needs_oracle = True

    def __init__(self, starvation_steps: int = 200, quantum_steps: int = 10, **kwargs) -> None:
        super().__init__(**kwargs)
        for field, v in (("starvation_steps", starvation_steps), ("quantum_steps", quantum_steps)):
            if not (isinstance(v, int) and v >= 1):
                raise ConfigError(field, v, "an integer >= 1 (iterations)")
        self.starvation_steps = starvation_steps
        self.quantum_steps = quantum_steps
        self.iteration = 0

    def on_iteration_end(self, batch, num_iterations: int, elapsed_s: float, view: ReplicaView) -> None:
        self.iteration += num_iterations
        for r in batch:
            r.policy_data["sjf_last_iter"] = self.iteration

    def begin(self, view: ReplicaView) -> None:
        it = self.iteration
        for s in (*view.running, *view.swapped, *view.waiting):
            d = s.policy_data
            if "sjf_last_iter" not in d:        # first seen here (at a plan: arrivals land mid-run under skip-ahead)
                d["sjf_last_iter"] = it
            if d.get("sjf_promoted_until", -1) <= it and it - d.get("sjf_last_iter", it) >= self.starvation_steps:
                d["sjf_promoted_until"] = it + self.quantum_steps

    def key(self, s: RequestState) -> tuple:
        promoted = s.policy_data.get("sjf_promoted_until", -1) > self.iteration
        return (0 if promoted else 1, self.oracle.output_tokens(s))

    def token_horizon(self, scheduled: list[RequestState]) -> int:
        k = NEVER
        it = self.iteration
        for s in scheduled:
            until = s.policy_data.get("sjf_promoted_until", -1)
            if until > it and until - it < k:
                k = until - it
        return k

    def time_horizon(self, view: ReplicaView, scheduled, blocked) -> float:
        return float("inf")

    def _set_horizon(self, plan, view, scheduled, blocked) -> None:
        super()._set_horizon(plan, view, scheduled, blocked)
        it = self.iteration
        for b in blocked:                       # a blocked request is promoted once it has starved long enough
            left = self.starvation_steps - (it - b.policy_data.get("sjf_last_iter", it))
            if b.policy_data.get("sjf_promoted_until", -1) > it:
                left = min(left, b.policy_data["sjf_promoted_until"] - it)
            if left < plan.max_repeat:
                plan.max_repeat = max(left, 1)
