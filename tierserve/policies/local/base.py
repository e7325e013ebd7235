"""The replica-level policy interface: a read-only view in, the next batch out."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Protocol

from tierserve.core import BatchPlan, RequestState


class IterationPredictor(Protocol):
    """What a policy may ask the execution-time model (seconds)."""

    def iteration_time(self, prefill_tokens: int, prefill_attn_pairs: float, decode_count: int,
                       decode_context_sum: int) -> float: ...


class ReplicaView(Protocol):
    """What a local policy sees of its replica. Lists are the executor's own: read them, never mutate."""

    index: int
    now: float
    running: list[RequestState]    # hold KV blocks, in admission order
    waiting: list[RequestState]    # queued; preempted-by-recompute requests re-enter at the front
    swapped: list[RequestState]    # preempted by swap, KV in host memory
    free_blocks: int
    total_blocks: int
    block_size: int
    watermark_blocks: int
    token_budget: int
    max_num_seqs: int
    predictor: IterationPredictor


class LocalPolicy(ABC):
    """Chooses each iteration's batch on one replica.

    Subclasses implement `plan`. The executor validates every plan (KV blocks, token budget, batch size)
    and raises `PolicyError` on a plan that would corrupt memory, so a policy cannot.
    """

    name: str = "base"
    default_token_budget: int = 2048
    default_max_num_seqs: int = 256

    @abstractmethod
    def plan(self, view: ReplicaView) -> BatchPlan:
        """Return the next iteration's batch (may be empty when nothing can run)."""

    def blocks_to_hold(self, state: RequestState, num_tokens: int, block_size: int) -> int:
        """Blocks `state` must hold to run `num_tokens` more tokens. Default: exactly its KV (vLLM v1)."""
        return -(-(state.num_computed_tokens + num_tokens) // block_size)

    def order_waiting(self, waiting: list[RequestState]) -> list[RequestState]:
        """The order in which waiting requests are considered; FCFS by default."""
        return waiting

    def max_request_tokens(self) -> int | None:
        """Largest prompt+output this policy can ever serve (None: bounded by KV capacity only)."""
        return None

    def max_prompt_tokens(self, token_budget: int) -> int | None:
        """Largest prompt it can ever schedule; policies without chunked prefill need it in one batch."""
        return None

    # Hooks; no-ops by default.
    def on_arrival(self, state: RequestState, view: ReplicaView) -> None:
        pass

    def on_finish(self, state: RequestState, view: ReplicaView) -> None:
        pass

    def preempt_mode(self, state: RequestState):
        from tierserve.core import PreemptMode
        return PreemptMode.RECOMPUTE


def evict_from_tail(running: list[RequestState], i: int, end: int, need: int, free: int,
                    preempt: list, mode) -> tuple[int, int]:
    """Preempt running[end-1], running[end-2], … until `need` blocks fit in `free` or running[i] itself goes.

    The shared victim rule of vLLM, Vidur and Sarathi (the tail of the service order is evicted first).
    Returns the new (end, free); end <= i means running[i] was evicted.
    """
    while need > free:
        end -= 1
        victim = running[end]
        preempt.append((victim, mode))
        free += victim.num_blocks
        if end == i:
            break
    return end, free


class PolicyError(RuntimeError):
    """A policy returned a plan the executor refuses (it would break a memory or batch invariant)."""
