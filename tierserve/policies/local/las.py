"""`las` (MLFQ+): FastServe's skip-join multi-level feedback queue, in its least-attained-service reading.

Level i has quantum q0·2^i seconds of service (q0 = 10 ms). A new request joins the first level whose quantum
covers its predicted prefill time (skip-join); it is demoted one level each time it uses up its level's
quantum (attained service `service_s`, which preemption never resets); a request left without service for
`promote_after_s` (3 s) returns to the top level. FCFS within a level. No oracle: attained service only.

Levels move with service time, so a repeatable plan carries `revise_at_s`: the earliest time a scheduled
request's service crosses its level's end (it takes part in every iteration of the run, so its service
grows one for one with time) or a blocked request reaches the promotion age.
"""
from __future__ import annotations

import math

from tierserve.core import ConfigError, RequestState, Status
from tierserve.policies.local.base import ReplicaView
from tierserve.policies.local.base import declares_steady_plans
from tierserve.policies.local.priority import PriorityLoopPolicy


@declares_steady_plans
class LASPolicy(PriorityLoopPolicy):
    name = "las"
    uses_predictor = True           # skip-join prices a prompt's prefill time

    def __init__(self, q0_s: float = 0.010, promote_after_s: float = 3.0, **kwargs) -> None:
        super().__init__(**kwargs)
        for field, v in (("q0_s", q0_s), ("promote_after_s", promote_after_s)):
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ConfigError(field, v, "a positive number of seconds")
        self.q0_s = float(q0_s)
        self.promote_after_s = float(promote_after_s)
        self._now = 0.0

    def on_arrival(self, state: RequestState, view: ReplicaView) -> None:
        d = state.policy_data
        if "las_join" not in d:
            t = view.recompute_time_s(state.num_tokens - state.num_computed_tokens)
            d["las_join"] = max(0, math.ceil(math.log2(t / self.q0_s))) if t > self.q0_s else 0
            d["las_base_s"] = state.service_s

    def _level(self, s: RequestState) -> tuple[int, float]:
        """(level, service at which it ends): level i spans service q0·(2^i − 1) … q0·(2^{i+1} − 1)."""
        d = s.policy_data
        used = s.service_s - d.get("las_base_s", 0.0)
        lvl = int(math.floor(math.log2(used / self.q0_s + 1.0))) if used > 0 else 0
        lvl = max(lvl, d.get("las_join", 0))
        return lvl, d.get("las_base_s", 0.0) + self.q0_s * (2.0 ** (lvl + 1) - 1.0)

    def begin(self, view: ReplicaView) -> None:
        now = self._now = view.now
        for s in (*view.swapped, *view.waiting):
            last = s.last_scheduled_s if s.last_scheduled_s >= 0 else s.arrival_s
            if now - last >= self.promote_after_s and self._level(s)[0] > 0:
                s.policy_data["las_base_s"] = s.service_s      # back to the top: a fresh start of level 0
                s.policy_data["las_join"] = 0

    def key(self, s: RequestState) -> tuple:
        return (self._level(s)[0],)

    def time_horizon(self, view: ReplicaView, scheduled: list[RequestState], blocked: list[RequestState]) -> float:
        now = view.now
        t = math.inf
        for s in scheduled:
            t = min(t, now + (self._level(s)[1] - s.service_s))
        for s in blocked:
            if s.status != Status.RUNNING and self._level(s)[0] > 0:        # queued (not running) and not at the top
                last = s.last_scheduled_s if s.last_scheduled_s >= 0 else s.arrival_s
                t = min(t, last + self.promote_after_s)
        return t
