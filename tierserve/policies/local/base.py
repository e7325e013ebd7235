"""The replica-level policy interface: a read-only view in, the next batch out (see `view.py`)."""
from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable, Sequence

from tierserve.core import AllocationRule, BatchPlan, PreemptMode, RequestState
from tierserve.policies.local.view import IterationPredictor, Oracle, ReplicaView


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


class LocalPolicy(ABC):
    """Chooses each iteration's batch on one replica.

    Subclasses implement `plan`. The executor validates every plan (KV blocks, token budget, batch size)
    and raises `PolicyError` on a plan that would corrupt memory, so a policy cannot.

    Declarations an engine adapter checks before it accepts a policy:
      `allocation` — how many KV blocks a running request holds (`AllocationRule`);
      `preempt_modes` — the preemption modes the policy may ask for;
      `uses_watermark` — whether admission keeps `watermark_blocks` free (vLLM v0/Sarathi; v1 does not);
      `needs_oracle` — the policy is an oracle baseline and must be given the true output length;
      `uses_predictor` — its plan or hooks ask `view.predictor` (or `recompute_time_s`): an engine needs a fit.
    """

    name: str = "base"
    default_token_budget: int = 2048
    default_max_num_seqs: int = 256
    allocation: AllocationRule = AllocationRule.PER_CHUNK
    preempt_modes: tuple[PreemptMode, ...] = (PreemptMode.RECOMPUTE,)
    uses_watermark: bool = True
    needs_oracle: bool = False
    uses_predictor: bool = False    # asks the execution-time model (an instance may set it from its parameters)
    follows_engine_defaults: bool = False   # token budget / max_num_seqs default to vLLM's per-GPU choice
    max_model_len: int = 0          # MAX_LENGTH allocation reserves this many tokens per request
    # The key `order_waiting` sorts by, where a waiting request's key moves only with its own num_generated,
    # first_token_s or relegation, so an engine may keep that order between plans; None: no such promise.
    # Declared by the class that defines `order_waiting` (a subclass overriding `order_waiting` redeclares it).
    waiting_order_key: Callable[[RequestState], Any] | None = None

    @abstractmethod
    def plan(self, view: ReplicaView) -> BatchPlan:
        """Return the next iteration's batch (may be empty when nothing can run)."""

    def bind_oracle(self, oracle: Oracle) -> None:
        """Receive the true-length oracle; only drivers call this, and only when `needs_oracle`."""
        if not self.needs_oracle:
            raise TypeError(f"policy {self.name!r} does not declare needs_oracle")
        self.oracle = oracle

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        # The allocation rule picks the block count (hot path: bound once per class, not branched per call).
        if "blocks_to_hold" not in cls.__dict__:
            cls.blocks_to_hold = _HOLD_BY_RULE[cls.allocation]

    def blocks_to_hold(self, state: RequestState, num_tokens: int, block_size: int) -> int:
        """Blocks `state` must hold to run `num_tokens` more tokens, by the policy's allocation rule."""
        return _HOLD_BY_RULE[self.allocation](self, state, num_tokens, block_size)

    def order_waiting(self, waiting: Sequence[RequestState]) -> Sequence[RequestState]:
        """The order in which waiting requests are considered; FCFS by default."""
        return waiting

    def decode_batch(self, running: Sequence[RequestState]) -> list[RequestState] | None:
        """The batch `plan` returns when nothing is waiting or swapped and every request in `running` (the
        replica's running requests, admission order) is decoding, provided their next KV blocks all fit: all
        of `running`, one token each, in this policy's service order, as a repeatable plan with the default
        `max_repeat` and `revise_at_s` (and no preemption, relegation or other side effect). None: no such
        promise (the default). The simulator then starts a decode run without calling `plan`, so an
        implementation must answer None whenever its `plan` is not the one it describes (a subclass's, or
        one replaced on the instance)."""
        return None

    def repeats_prefill_chunk(self) -> bool:
        """True when `plan`, right after an iteration whose last request ran a prefill chunk and still has
        prompt left while every other request emitted a token (decodes, or prompts just completed) or finished —
        with nothing swapped, no other request running and the next KV blocks of those that go on all free —
        returns those in `decode_batch` order (the batch's own order when they all were decodes already), one
        token each, then that request's next chunk, min(tokens left, token_budget − decodes), and nothing else
        (no preemption or relegation, not repeatable), both when nothing is waiting and when that chunk takes
        the whole budget left (see also `admits_waiting`). The simulator then starts that iteration without
        calling `plan`. Default False; answer False for a `plan` other than the one described."""
        return False

    def admits_waiting(self) -> int | None:
        """A promise on admission; None (the default): no promise. Otherwise `plan`, with every running request
        decoding (their next KV blocks all free, fewer of them than max_num_seqs and the token budget) and
        nothing swapped or swapped out, returns the running requests in `decode_batch` order, one token each,
        then waiting requests in `order_waiting` order, each min(tokens left, the returned cap if > 0, budget
        left), while fewer than max_num_seqs requests are scheduled and budget is left, stopping at the first
        whose blocks (`blocks_to_hold`) exceed the free blocks less the decodes' next blocks, the earlier
        admissions' and `watermark_blocks`; nothing else (no preemption or relegation, not repeatable). With
        `repeats_prefill_chunk` also: after the iteration that promise describes, when the prefill's next chunk
        is its last and short of the budget and one request waits, that chunk is followed by the waiting
        request's (as above, in the budget left; the prefill holds its whole prompt's blocks). The simulator
        then starts those iterations without calling `plan`; answer None for a `plan` other than the one
        described."""
        return None

    def max_request_tokens(self) -> int | None:
        """Largest prompt+output this policy can ever serve (None: bounded by KV capacity only)."""
        return None

    def max_prompt_tokens(self, token_budget: int) -> int | None:
        """Largest prompt it can ever schedule; policies without chunked prefill need it in one batch."""
        return None

    def preempt_mode(self, state: RequestState) -> PreemptMode:
        return PreemptMode.RECOMPUTE

    # Hooks; no-ops by default. `view` is the replica's `ReplicaView`.
    def on_arrival(self, state: RequestState, view: ReplicaView) -> None:
        """A request joined this replica's queue (dispatch, or a queued request moved here)."""

    def on_iteration_end(self, batch: Sequence[RequestState], num_iterations: int, elapsed_s: float,
                         view: ReplicaView) -> None:
        """`num_iterations` iterations of `batch` ended (k > 1 for a decode run), taking `elapsed_s`."""

    def on_preempt(self, state: RequestState, mode: PreemptMode, view: ReplicaView) -> None:
        """`state` was evicted (`mode` is what the executor did: a swap may fall back to recompute)."""

    def on_relegate(self, state: RequestState, view: ReplicaView) -> None:
        """`state` was relegated (its reason and time are on the state)."""

    def on_migrate_out(self, state: RequestState, view: ReplicaView) -> None:
        """`state` left this replica for another (live migration or a queued move)."""

    def on_migrate_in(self, state: RequestState, view: ReplicaView) -> None:
        """`state` arrived by live migration, KV already copied (queued moves arrive via `on_arrival`)."""

    def on_finish(self, state: RequestState, view: ReplicaView) -> None:
        """`state` produced its last token here."""


def _hold_per_chunk(policy: LocalPolicy, state: RequestState, num_tokens: int, block_size: int) -> int:
    return -(-(state.num_computed_tokens + num_tokens) // block_size)


def _hold_whole_prompt(policy: LocalPolicy, state: RequestState, num_tokens: int, block_size: int) -> int:
    tokens = state.num_computed_tokens + num_tokens
    return -(-(tokens if tokens > state.num_tokens else state.num_tokens) // block_size)


def _hold_max_length(policy: LocalPolicy, state: RequestState, num_tokens: int, block_size: int) -> int:
    tokens = state.num_computed_tokens + num_tokens
    return -(-(tokens if tokens > policy.max_model_len else policy.max_model_len) // block_size)


_HOLD_BY_RULE = {AllocationRule.PER_CHUNK: _hold_per_chunk, AllocationRule.WHOLE_PROMPT: _hold_whole_prompt,
                 AllocationRule.MAX_LENGTH: _hold_max_length}


def holds_computed_plus_next(policy: LocalPolicy) -> bool:
    """True when a decode step's blocks are ceil((computed + 1) / block_size), as per-chunk and whole-prompt
    allocation give it (hot loops then compute it inline instead of calling `blocks_to_hold`)."""
    return type(policy).blocks_to_hold in (_hold_per_chunk, _hold_whole_prompt)


def evict_from_tail(running: Sequence[RequestState], i: int, end: int, need: int, free: int,
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


HOOK_NAMES = ("on_arrival", "on_iteration_end", "on_preempt", "on_relegate", "on_migrate_out", "on_migrate_in",
              "on_finish")


def declares_steady_plans(cls: type[LocalPolicy]) -> type[LocalPolicy]:
    """Class decorator: the class's plans keep the promises it makes or inherits (`BatchPlan.repeatable`,
    `decode_batch`, `repeats_prefill_chunk`, `admits_waiting`) with the methods it defines. Needed by a class
    that defines behaviour under an inherited `plan` (an order, a key, a victim rule): without it those
    promises are withdrawn for it (`traits.steady_plans`), so an order that, say, depends on the clock cannot
    silently break skip-ahead."""
    cls.steady_plans_of = cls   # type: ignore[attr-defined]
    return cls


class PolicyError(RuntimeError):
    """A policy returned a plan the executor refuses (it would break a memory or batch invariant)."""


__all__ = ["HOOK_NAMES", "IterationPredictor", "LocalPolicy", "Oracle", "PolicyError", "ReplicaView", "blocks_for",
           "declares_steady_plans", "evict_from_tail"]
