"""Everything a replica policy may see — the one documented read-only view, for policy authors.

The simulator's executor (`tierserve.sim.replica`) and an engine adapter (`tierserve.engines`) both build
a `ReplicaView` over their own state and drive the same `LocalPolicy` objects with it.

What a policy sees
  * requests as `RequestState` (`tierserve.core.request`): progress (`num_tokens`, `num_computed_tokens`,
    `num_generated`, `prefill_remaining`), monotone attained work (`attained_tokens`, `service_tokens`,
    `service_s`), timestamps, tier, SLO, app, and a `policy_data` dict for the policy's own keys. Never the
    true output length: a policy that needs it (SJF, SRPT: oracle baselines) sets `needs_oracle = True`
    and receives an `Oracle` through `bind_oracle` before the run.
  * the replica: `running` (admission order), `waiting`, `swapped` as tuples; KV `free_blocks`,
    `total_blocks`, `block_size`, `watermark_blocks`; host `free_swap_blocks`; `token_budget`,
    `max_num_seqs`; `now` (s).
  * costs: `swap_time_s(n_blocks)` (one direction over PCIe), `recompute_time_s(n_tokens)` (prefill of n
    tokens from scratch) and the `predictor` (`IterationPredictor` below).

What a policy returns: a `BatchPlan` (`tierserve.core.batch`); the executor validates it, so a policy
cannot corrupt memory. Revision points keep skip-ahead exact: token thresholds through
`BatchPlan.max_repeat`, times through `BatchPlan.revise_at_s` (see `BatchPlan`).

Hooks (`LocalPolicy.on_*`): arrival, iteration end (once per decode run under skip-ahead, with the number
of iterations it covered — a policy must give the same result for one call of k as for k calls of 1),
preempt, relegate, migrate in/out, finish.
"""
from __future__ import annotations

from typing import Protocol

from tierserve.core import RequestState, true_output_tokens


class IterationPredictor(Protocol):
    """What a policy may ask the execution-time model (all times in seconds)."""

    decode_context_coef_s: float    # seconds per context token read by a decode (time is linear in it)

    def iteration_time(self, prefill_tokens: int, prefill_attn_pairs: float, decode_count: int,
                       decode_context_sum: int) -> float:
        """One iteration: prefill chunks totalling `prefill_tokens` with Σ chunk·(ctx + chunk/2) pairs,
        plus `decode_count` decodes over `decode_context_sum` context tokens."""

    def decode_base_time(self, decode_count: int) -> float:
        """iteration_time(0, 0, B, 0); a decode run's iteration j costs base + coef·(C0 + B·j)."""

    def max_prefill_tokens_within(self, slack_s: float, decode_count: int, decode_context_sum: int,
                                  prefill_context: int = 0, lo: int = 0, hi: int = 8192) -> int:
        """Largest prefill chunk in [lo, hi] whose iteration (with these decodes) fits in `slack_s`."""


class ReplicaSource(Protocol):
    """What a driver (simulator or engine adapter) provides for a `ReplicaView` to read."""

    index: int
    running: list[RequestState]
    waiting: list[RequestState]
    swapped: list[RequestState]
    free_blocks: int
    total_blocks: int
    block_size: int
    watermark_blocks: int
    free_swap_blocks: int
    token_budget: int
    max_num_seqs: int
    swap_time_per_block_s: float
    predictor: IterationPredictor

    @property
    def now(self) -> float: ...


class ReplicaView:
    """A read-only facade over one replica: what `LocalPolicy.plan` and the hooks receive."""

    __slots__ = ("_src",)

    def __init__(self, source: ReplicaSource) -> None:
        self._src = source

    @property
    def index(self) -> int:
        return self._src.index

    @property
    def now(self) -> float:
        return self._src.now

    @property
    def running(self) -> tuple[RequestState, ...]:
        """Requests holding KV blocks, in admission order (vLLM v1's service order)."""
        return tuple(self._src.running)

    @property
    def waiting(self) -> tuple[RequestState, ...]:
        """Queued requests; preempted-by-recompute ones re-enter at the front."""
        return tuple(self._src.waiting)

    @property
    def swapped(self) -> tuple[RequestState, ...]:
        """Preempted by swap: KV in host memory."""
        return tuple(self._src.swapped)

    @property
    def free_blocks(self) -> int:
        return self._src.free_blocks

    @property
    def total_blocks(self) -> int:
        return self._src.total_blocks

    @property
    def block_size(self) -> int:
        return self._src.block_size

    @property
    def watermark_blocks(self) -> int:
        return self._src.watermark_blocks

    @property
    def free_swap_blocks(self) -> int:
        """Host (CPU) KV blocks free for swap-out; a swap that does not fit becomes a recompute."""
        return self._src.free_swap_blocks

    @property
    def token_budget(self) -> int:
        return self._src.token_budget

    @property
    def max_num_seqs(self) -> int:
        return self._src.max_num_seqs

    @property
    def predictor(self) -> IterationPredictor:
        return self._src.predictor

    def swap_time_s(self, num_blocks: int) -> float:
        """Seconds to copy `num_blocks` KV blocks one way between GPU and host."""
        return num_blocks * self._src.swap_time_per_block_s

    def recompute_time_s(self, num_tokens: int) -> float:
        """Seconds to recompute `num_tokens` of KV as one prefill from scratch (what a recompute costs)."""
        if num_tokens <= 0:
            return 0.0
        return self._src.predictor.iteration_time(num_tokens, num_tokens * num_tokens * 0.5, 0, 0)


class Oracle:
    """The true output length, for baselines that are defined by knowing it (SJF/LTR+, SRPT/TRAIL+).

    Handed only to a policy with `needs_oracle = True`, by the driver that owns the truth.
    """

    __slots__ = ()

    def output_tokens(self, state: RequestState) -> int:
        return true_output_tokens(state)

    def remaining_output_tokens(self, state: RequestState) -> int:
        return true_output_tokens(state) - state.num_generated
