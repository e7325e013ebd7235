"""Llumnix's llumlet queue discipline on vLLM v1's batch shape: tier first, then arrival (seed 000).

With `promote_after_s`, a request still waiting for its first token rises one tier per `promote_after_s`
seconds of waiting (the seed's "promote long-waiting requests so no tier starves"), but not above
`promote_floor` (default 1: aged traffic never competes with tier 0, whose isolation is what it pays for);
the plan declares the next promotion as its revision point so skip-ahead stays exact.
"""
from __future__ import annotations

import math

from tierserve.core import BatchPlan, ConfigError, RequestState
from tierserve.policies.local.base import ReplicaView
from tierserve.policies.local.vllm import VLLMPrioritySortedPolicy, declares_steady_plans, priority_key_fast


@declares_steady_plans
class LlumletPolicy(VLLMPrioritySortedPolicy):
    name = "llumlet"
    waiting_order_key = priority_key_fast

    def __init__(self, promote_after_s: float | None = None, promote_floor: int = 1, **kwargs) -> None:
        super().__init__(**kwargs)
        if promote_after_s is not None and not promote_after_s > 0:
            raise ConfigError("promote_after_s", promote_after_s, "a positive number of seconds, or null")
        if not (isinstance(promote_floor, int) and promote_floor >= 0):
            raise ConfigError("promote_floor", promote_floor, "an integer tier >= 0")
        self.promote_after_s = promote_after_s
        if promote_after_s:
            self.waiting_order_key = None        # promotion re-ranks waiting requests as time passes
        self.promote_floor = promote_floor
        self._now = 0.0

    def effective_tier(self, state: RequestState) -> int:
        t = state.tier
        if self.promote_after_s is None or t <= self.promote_floor or state.first_token_s >= 0:
            return t
        return max(self.promote_floor, t - int((self._now - state.arrival_s) / self.promote_after_s))

    def _key(self, state: RequestState) -> tuple[int, float, int]:
        return (self.effective_tier(state), state.arrival_s, state.id)

    def running_order(self, running: list[RequestState]) -> list[RequestState]:
        return sorted(running, key=self._key if self.promote_after_s else priority_key_fast)

    def order_waiting(self, waiting: list[RequestState]) -> list[RequestState]:
        return sorted(waiting, key=self._key if self.promote_after_s else priority_key_fast)

    def plan(self, view: ReplicaView) -> BatchPlan:
        self._now = view.now
        plan = super().plan(view)
        if self.promote_after_s and plan.repeatable:
            plan.revise_at_s = self._next_promotion(view)
        return plan

    def decode_batch(self, running: list[RequestState]) -> list[RequestState] | None:
        # Every running request is decoding (its first token out), so promotion leaves its tier as it is:
        # the order is (tier, arrival, id) at any time, and `_next_promotion` finds nothing to revise at.
        if not self.promises_hold():
            return None
        return sorted(running, key=priority_key_fast)

    def admits_waiting(self) -> int | None:
        # With promotion the waiting order depends on the time of the plan: no promise.
        return None if self.promote_after_s else super().admits_waiting()

    def _next_promotion(self, view: ReplicaView) -> float:
        """Earliest time a queued request's effective tier drops (its order may then change)."""
        step = self.promote_after_s
        nxt = math.inf
        for s in view.waiting + view.running:     # running requests still in prefill are ordered too
            if self.effective_tier(s) > self.promote_floor and s.first_token_s < 0:
                waited = view.now - s.arrival_s
                nxt = min(nxt, s.arrival_s + (math.floor(waited / step) + 1) * step)
        return nxt
