"""What one engine step exchanges between the driver and vLLM's scheduler: `StepHints` (the limits vLLM's loop
obeys) and `EngineReplica` (the `ReplicaSource` a policy's `ReplicaView` reads, filled from the engine)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from tierserve.core import RequestState


@dataclass(slots=True)
class StepHints:
    """What vLLM's loop obeys this step (engine request objects, not states); `held` stays empty when
    `plan_step` is asked for no held-back list (the kept path's scheduler never moves those requests)."""

    preempt: list = field(default_factory=list)
    running: list = field(default_factory=list)
    admit: list = field(default_factory=list)
    held: list = field(default_factory=list)
    budget: int = 0


class EngineReplica:
    """The `ReplicaSource` a `ReplicaView` reads, filled from the engine each step."""

    def __init__(self, *, block_size: int, total_blocks: int, token_budget: int, max_num_seqs: int,
                 watermark_blocks: int, predictor, clock: Callable[[], float]) -> None:
        self.index = 0
        self.running: list[RequestState] = []
        self.waiting: list[RequestState] = []
        self.swapped: list[RequestState] = []        # v1 never swaps
        self.free_blocks = total_blocks
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.watermark_blocks = watermark_blocks
        self.free_swap_blocks = 0
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.swap_time_per_block_s = math.inf
        self.predictor = predictor
        self._clock = clock

    @property
    def now(self) -> float:
        return self._clock()
