"""The request (what arrives) and its serving state (what the executor advances).

One abstraction for every phase, after vLLM v1: a request has `num_tokens` known tokens (prompt plus
generated) and `num_computed_tokens` whose KV is computed; each iteration schedules some of the gap.
Chunked prefill, decode and recompute after preemption are the same code path.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from tierserve.core.slo import NO_SLO, SLO


@dataclass(frozen=True, slots=True)
class Request:
    """An arriving request. `output_tokens` is the true output length: visible to the simulator and
    to oracle baselines (SJF/SRPT), never to prediction-free policies."""

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    tier: int = 0
    slo: SLO = NO_SLO
    app: str = ""


class Status(IntEnum):
    WAITING = 0      # queued, never run or preempted by recompute (KV dropped)
    RUNNING = 1      # holds KV blocks on a replica
    SWAPPED = 2      # preempted by swap: KV lives in host memory
    MIGRATING = 3    # paused for the final stage of a live migration
    FINISHED = 4
    REJECTED = 5


class Outcome(IntEnum):
    """How a request left the simulation; every request ends with exactly one."""

    FINISHED = 0
    REJECTED = 1   # never admitted (reason recorded, e.g. larger than KV capacity)
    CENSORED = 2   # still in the system when the run's time limit was reached


@dataclass(slots=True, eq=False)
class RequestState:
    """Serving progress of one request. Written only by an executor (simulated or real)."""

    request: Request
    num_tokens: int = 0                # prompt + generated tokens known so far
    num_computed_tokens: int = 0       # tokens whose KV is computed (and held, unless swapped)
    num_generated: int = 0             # output tokens emitted
    num_blocks: int = 0                # KV blocks held on the current replica
    status: Status = Status.WAITING
    replica: int = -1
    dispatch_s: float = -1.0
    first_token_s: float = -1.0
    last_token_s: float = -1.0
    finish_s: float = -1.0
    tbt_max_s: float = 0.0
    num_preemptions: int = 0
    num_migrations: int = 0
    last_scheduled_s: float = -1.0     # start of the last iteration that gave it tokens (for aging)
    policy_data: dict = field(default_factory=dict)  # scratch space a policy may use (keys it owns)

    def __post_init__(self) -> None:
        if self.num_tokens == 0:
            self.num_tokens = self.request.prompt_tokens

    # Read-only derived quantities that policies use.
    @property
    def id(self) -> int:
        return self.request.id

    @property
    def tier(self) -> int:
        return self.request.tier

    @property
    def arrival_s(self) -> float:
        return self.request.arrival_s

    @property
    def num_uncomputed(self) -> int:
        """Tokens this request wants to run in its next iteration (1 for a decode)."""
        return self.num_tokens - self.num_computed_tokens

    @property
    def in_prefill(self) -> bool:
        """True while the prompt (or a recomputed prefix) is not yet fully computed."""
        return self.num_tokens - self.num_computed_tokens > 1 or self.num_generated == 0

    @property
    def prefill_remaining(self) -> int:
        return max(self.request.prompt_tokens - self.num_computed_tokens, 0)

    @property
    def attained_tokens(self) -> int:
        """Work done so far in tokens (prompt computed + generated), never reset by preemption."""
        return min(self.num_computed_tokens, self.request.prompt_tokens) + self.num_generated

    @property
    def done(self) -> bool:
        return self.num_generated >= self.request.output_tokens
