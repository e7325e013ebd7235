"""What a local policy returns: the next batch, and which requests to preempt first."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

from tierserve.core.request import RequestState


class PreemptMode(IntEnum):
    RECOMPUTE = 0   # drop KV; the request's known tokens are recomputed later (vLLM v1)
    SWAP = 1        # copy KV to host over PCIe and back later


@dataclass(slots=True)
class BatchPlan:
    """One iteration's batch.

    `scheduled` pairs each request with the number of tokens it runs (a decode runs 1; a prefill chunk runs
    its chunk). `preempt` lists requests to evict before the batch runs. `repeatable` tells the executor
    the policy would plan the same decode-only batch again until something external changes (an arrival,
    a completion, a KV-block shortfall), `max_repeat` iterations pass, or simulated time reaches
    `revise_at_s` (a policy revision point such as an aging promotion): the executor may then skip ahead.
    """

    scheduled: list[tuple[RequestState, int]] = field(default_factory=list)
    preempt: list[tuple[RequestState, PreemptMode]] = field(default_factory=list)
    repeatable: bool = False
    max_repeat: int = 1 << 30
    revise_at_s: float = float("inf")

    @property
    def num_tokens(self) -> int:
        return sum(n for _, n in self.scheduled)

    def __len__(self) -> int:
        return len(self.scheduled)
