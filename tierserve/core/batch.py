"""What a local policy returns: the next batch, which requests to preempt first, which to relegate."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from tierserve.core.request import RequestState


class PreemptMode(IntEnum):
    RECOMPUTE = 0   # drop KV; the request's known tokens are recomputed later (vLLM v1)
    SWAP = 1        # copy KV to host over PCIe and back later (falls back to recompute when host swap is full)


class AllocationRule(IntEnum):
    """How many KV blocks a request holds while it runs — named apart from a policy's ordering, so an
    engine adapter can refuse a rule its engine cannot honour (vLLM v1 allocates per chunk only)."""

    PER_CHUNK = 0      # exactly the computed tokens plus this iteration's (vLLM v1)
    WHOLE_PROMPT = 1   # the whole prompt (or recompute prefix) at admission (Sarathi-Serve, vLLM v0)
    MAX_LENGTH = 2     # prompt + max_model_len reserved up front (Orca)


@dataclass(slots=True)
class BatchPlan:
    """One iteration's batch.

    `scheduled` pairs each request with the number of tokens it runs (a decode runs 1; a prefill chunk runs
    its chunk). `preempt` lists requests to evict before the batch runs. `relegate` marks requests whose
    deadline the policy gives up on (they stay queued and still finish; their outcome is RELEGATED).

    Revision points (how skip-ahead stays exact): `repeatable` tells the executor the policy would plan the
    same decode-only batch again until something external changes (an arrival, a completion, a KV-block
    shortfall, a migration), `max_repeat` iterations pass (token thresholds: e.g. a MemGuard or LAS quantum
    crossed after n more tokens), or simulated time reaches `revise_at_s` (times: an aging promotion, a
    deadline); the executor may then run the batch k iterations at once and re-plan after the last.
    """

    scheduled: list[tuple[RequestState, int]] = field(default_factory=list)
    preempt: list[tuple[RequestState, PreemptMode]] = field(default_factory=list)
    relegate: list[tuple[RequestState, str]] = field(default_factory=list)
    repeatable: bool = False
    max_repeat: int = 1 << 30
    revise_at_s: float = float("inf")

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    def __len__(self) -> int:
        return len(self.scheduled)
