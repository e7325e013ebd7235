"""`srpt` (TRAIL+): shortest true remaining work first, with a perfect length oracle (an oracle baseline).

Remaining work = tokens still to compute before the request is done (prefill left + output left). A running
request may be evicted for priority only while it has decoded less than C of its output (TRAIL's
swap-prevention threshold; C = 0.6 by default; C = 1 is plain SRPT, C = 0 non-preemptive SJF).
"""
from __future__ import annotations

import math

from tierserve.core import ConfigError, RequestState
from tierserve.policies.local.base import declares_steady_plans
from tierserve.policies.local.priority import PriorityLoopPolicy


@declares_steady_plans
class SRPTPolicy(PriorityLoopPolicy):
    name = "srpt"
    needs_oracle = True

    def __init__(self, C: float = 0.6, **kwargs) -> None:
        super().__init__(**kwargs)
        if not (isinstance(C, (int, float)) and math.isfinite(C) and 0 <= C <= 1):
            raise ConfigError("C", C, "a fraction in [0, 1] of the output after which a request is not preempted")
        self.C = float(C)

    def remaining(self, s: RequestState, j: int = 0) -> int:
        return s.num_tokens - s.num_computed_tokens - 1 + self.oracle.remaining_output_tokens(s) - j

    def key(self, s: RequestState) -> tuple:
        return (self.remaining(s),)

    def key_after(self, s: RequestState, j: int) -> tuple:
        return (self.remaining(s, j),)

    def evictable(self, victim: RequestState, by: RequestState) -> bool:
        return victim.num_generated < self.C * self.oracle.output_tokens(victim)
