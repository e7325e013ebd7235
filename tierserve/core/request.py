# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""The request (what arrives) and its serving state (what the executor advances).

One abstraction for every phase, after vLLM v1: a request has `num_tokens` known tokens (prompt plus
generated) and `num_computed_tokens` whose KV is computed; each iteration schedules some of the gap.
Chunked prefill, decode and recompute after preemption are the same code path.

Oracle boundary: the true output length is part of the `Request` record the workload produces, but a
`RequestState` (what policies see) does not expose it under any public name. The executor and the
metrics read it through `true_output_tokens`/`request_of`; an oracle baseline (SJF, SRPT) declares
`needs_oracle` and is handed an `Oracle` (see `tierserve.policies.local.view`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from tierserve.core.slo import NO_SLO, SLO


@dataclass(frozen=True, slots=True)
class Request:
    """An arriving request. `output_tokens` is the true output length: known to the workload, the
    simulator and the metrics, and only through an explicit `Oracle` to a policy."""

    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    tier: int = 0
    slo: SLO = NO_SLO
    app: str = ""
    # Prefix identity for prefix caching (issue 28): hash i names the prompt's first (i+1)·hash_block_tokens
    # tokens (chained, as vLLM v1 hashes blocks), so equal hashes mean an equal prefix. Empty: nothing shareable.
    prefix_hashes: tuple[int, ...] = ()
    hash_block_tokens: int = 0
    session_id: int = -1               # the conversation this request is a turn of (-1: none)

    def __reduce__(self) -> tuple:
        # Pickle through __init__: compiled (tierserve/_native.py), a frozen class cannot be restored field by field.
        return (Request, (self.id, self.arrival_s, self.prompt_tokens, self.output_tokens, self.tier, self.slo,
                          self.app, self.prefix_hashes, self.hash_block_tokens, self.session_id))


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
    RELEGATED = 3  # finished, after a policy gave up on its deadline (Niyama's eager relegation; reason kept)


@dataclass(slots=True, eq=False)
class RequestState:
    """Serving progress of one request. Written only by an executor (simulated or real); policies read it.

    The counters `attained_tokens`, `service_tokens` and `service_s` only grow: preemption, recompute and
    migration never reset them (UniBoost's and LAS's attained work; ALGORITHMS.md §2).
    """

    _request: Request = field(repr=False)
    # Public copies of what a policy may know of the request (not the output length).
    id: int = field(init=False)
    tier: int = field(init=False)
    arrival_s: float = field(init=False)
    prompt_tokens: int = field(init=False)
    slo: SLO = field(init=False)
    app: str = field(init=False)
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
    num_swaps: int = 0                 # preemptions that swapped KV to host (the rest recomputed)
    num_migrations: int = 0
    attained_tokens: int = 0           # distinct tokens of progress: prompt tokens computed once + generated
    service_tokens: int = 0            # every token the request ran, recomputation included
    service_s: float = 0.0             # seconds of iterations it took part in
    last_scheduled_s: float = -1.0     # start of the last iteration that gave it tokens (for aging)
    relegated_s: float = -1.0          # when a policy relegated it (it still runs, after the rest)
    relegation_reason: str = ""
    policy_data: dict = field(default_factory=dict)  # scratch space a policy may use (keys it owns)

    def __post_init__(self) -> None:
        r = self._request
        self.id = r.id
        self.tier = r.tier
        self.arrival_s = r.arrival_s
        self.prompt_tokens = r.prompt_tokens
        self.slo = r.slo
        self.app = r.app
        if self.num_tokens == 0:
            self.num_tokens = r.prompt_tokens

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
        """Tokens to compute before the next output token: the prompt's rest, or the recompute's (0 in decode)."""
        return self.num_tokens - self.num_computed_tokens if self.in_prefill else 0

    @property
    def relegated(self) -> bool:
        return self.relegated_s >= 0.0


def request_of(state: RequestState) -> Request:
    """The full request record, true output length included. For executors and metrics, never policies."""
    return state._request


def true_output_tokens(state: RequestState) -> int:
    """The true output length. For executors, metrics and the `Oracle`; never read by a policy directly."""
    return state._request.output_tokens
