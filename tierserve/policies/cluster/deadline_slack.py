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

What the view carries (`base.DeadlineLoadView`, kept by the driver because this policy sets
`uses_deadline_load`): `deadline_load(D_r)` = (ahead_i, B_i, C_i) exactly as defined above, from a structure the
driver keeps per replica (`sim.deadline_load`: queued requests' prefill tokens in a sorted
prefix-sum structure keyed by prefill deadline, updated through the replica's hooks; the running part kept
between reads and recounted only when the replica's running set or iteration changed), so a dispatch costs
O(R · log n) in the usual case instead of a walk over every request of every replica; and `predictor`, the
replica's own execution-time model (the same exec_mode, overhead and exec_model_file its iterations are timed
with). `predictor=` overrides it (tests). The loop over instances is `slack_argmax.SlackArgmax` (compiled),
which also reuses an instance's iteration price while its (B_i, C_i) are unchanged.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tierserve.core import ConfigError, RequestState
from tierserve.policies.cluster.base import ClusterPolicy, InstanceView
from tierserve.policies.cluster.slack_argmax import SlackArgmax
from tierserve.policies.local.deadlines import prefill_deadline


class DeadlineSlackDispatch(ClusterPolicy):
    name = "deadline_slack"

    uses_deadline_load = True

    def __init__(self, chunk_tokens: int = 512, predictor=None) -> None:
        if not (isinstance(chunk_tokens, int) and not isinstance(chunk_tokens, bool) and chunk_tokens >= 1):
            raise ConfigError("chunk_tokens", chunk_tokens, "an integer >= 1 (prefill tokens per iteration)")
        if predictor is not None and not callable(getattr(predictor, "iteration_time", None)):
            raise ConfigError("predictor", predictor, "an execution-time model with iteration_time(...)")
        self.chunk_tokens = chunk_tokens
        self.predictor = predictor
        self._argmax = SlackArgmax()

    def predicted_slack_s(self, state: RequestState, inst: InstanceView, now: float) -> float:
        """D_r − predicted first-token time of `state` on `inst` (module docstring)."""
        deadline = prefill_deadline(state)
        view: Any = inst                      # an InstanceView that is also a DeadlineLoadView
        ahead, decodes, context = view.deadline_load(deadline)
        predictor = self.predictor if self.predictor is not None else view.predictor
        c = self.chunk_tokens
        per_iteration_s = predictor.iteration_time(c, c * c * 0.5, decodes, context)
        return deadline - (now + (ahead + state.num_tokens - state.num_computed_tokens) / c * per_iteration_s)

    def dispatch(self, state: RequestState, instances: Sequence[InstanceView], now: float) -> int:
        """argmax over instances of `predicted_slack_s` (ties: fewer outstanding requests, then the lower
        index), with the same arithmetic (`SlackArgmax`, compiled with the simulator's hot path)."""
        return self._argmax.best(instances, prefill_deadline(state), state.num_tokens - state.num_computed_tokens,
                                 self.chunk_tokens, self.predictor, now)
