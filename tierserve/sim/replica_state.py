# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""The replica's state: its queues, KV blocks, counters and statistics, in one class every room extends.

`ReplicaState` owns every attribute of a replica (one place lists them, with what each means), the queue
moves that keep the load counters exact (`_join_*` / `_leave_*`), the reads a cluster policy makes in
constant time (`waiting_head`, `tier_order`), and an iteration's charge (`_account`, `_scale`).
May not touch: planning or executing iterations (iteration.py), runs (decode_runs.py, chunk_runs.py),
steady plans (steady.py), preemption (preemption.py), migration (migration_endpoints.py).

The rooms form one chain of classes, each adding one job (mypyc compiles a single-inheritance chain of
native classes; mixins of native classes it does not):
    ReplicaState → DecodeRuns → ChunkRuns → Iterations → SteadyPlans → MigrationEndpoints → Replica
A room calls a transition defined above it through the stubs at the end of this class (the events'
callbacks and the steps between iterations), so this file is also the table of contents of those steps.
"""
from __future__ import annotations

import heapq
from typing import Callable

from tierserve.core import BatchPlan, RequestState, Status
from tierserve.core.histogram import LogHistogram
from tierserve.policies.local.base import LocalPolicy
from tierserve.policies.local.traits import traits_of
from tierserve.policies.local.view import Oracle, ReplicaView
from tierserve.sim.events import EventLoop
from tierserve.sim.queue_events import QueueListener
from tierserve.sim.runs import ChunkRun, DecodeRun
from tierserve.sim.step_time import step_factor_key, step_time_factor

RANK_ITERATION_END = 0   # an iteration that ends when a request arrives is applied before the arrival
RANK_PLAN = 5            # an idle replica plans once everything else at this instant has happened
_MAX_REPEAT, _REVISE_AT_S = BatchPlan().max_repeat, BatchPlan().revise_at_s    # a plan's defaults
_MAX_CHUNK_RUN = 64      # iterations a chunk run times ahead (what a cut wastes is bounded by it)


def prefill_attention_pairs(chunk: int, context_before: int) -> float:
    """Causal attention work of a prefill chunk, in query·key pairs (chunk × (prefix + chunk/2))."""
    return chunk * (context_before + chunk * 0.5)




class ReplicaState:
    """A replica's state (module docstring); its local policy reads it through `self.view` (a `ReplicaView`)."""

    def __init__(self, index: int, policy: LocalPolicy, predictor, loop: EventLoop, *, total_blocks: int,
                 block_size: int, token_budget: int, max_num_seqs: int, watermark_blocks: int,
                 swap_time_per_block_s: float, num_tiers: int,
                 on_finish: Callable[[RequestState], None], skip_ahead: bool = True,
                 swap_blocks: int = 1 << 62, step_time_ratios: list[float] | None = None,
                 step_time_seed: int = 0) -> None:
        self.index = index
        self.policy = policy
        self.predictor = predictor
        self.loop = loop
        self.total_blocks = total_blocks
        self.free_blocks = total_blocks
        self.block_size = block_size
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.watermark_blocks = watermark_blocks
        self.swap_time_per_block_s = swap_time_per_block_s
        self.total_swap_blocks = swap_blocks
        self.free_swap_blocks = swap_blocks
        self._host_blocks: dict[int, int] = {}    # request id -> host blocks its swapped-out KV occupies
        self.skip_ahead = skip_ahead
        self.slowdown = 1.0                       # iteration-time factor (>1 while a migration copies out)
        # Step-time variability: each iteration's time × one of these measured/predicted ratios (equally
        # likely), drawn from (seed, replica, iteration); empty = off. `_scaled`: some factor applies.
        self._step_ratios: list[float] = list(step_time_ratios) if step_time_ratios else []
        self._varies = bool(self._step_ratios)
        self._step_key = step_factor_key(step_time_seed, index) if self._varies else 0
        self._scaled = self._varies
        self.view = ReplicaView(self)
        if policy.needs_oracle:
            policy.bind_oracle(Oracle())
        # What the policy promises, computed once (policies/local/traits.py); the executor reads nothing else.
        traits = self.traits = traits_of(policy)
        self._steady = traits.steady              # its plans' `repeatable` is honoured (else one step each)
        self._iteration_hook = traits.iteration_hook
        self._decode_hold_inline = traits.decode_hold_inline
        # The policy names its all-decode batch (`decode_batch`): when nothing waits, a decode run starts
        # from it without a plan, and after a run its sums come from the run's own last pass.
        self._keeps_batch = traits.keeps_decode_batch
        self._carry: tuple | None = None
        # A run's carry kept over an iteration that only admits new requests (vLLM v0's prefill batches):
        # (running-set epoch, n, grow, ctx, rem, tier counts); the epoch counts joins and leaves of `running`.
        self._held_carry: tuple | None = None
        self._running_epoch = 0
        self._admitted_all = False                # every request of the batch in flight joined running for it
        # The policy plans a prefill's next chunk beside the same decodes (`repeats_prefill_chunk`): such an
        # iteration starts without a plan. `_decodes_then_prefill`: the batch in flight has that shape.
        self._repeats_chunk = traits.repeats_chunk
        self._decodes_then_prefill = False
        # The policy names its admissions beside running decodes (`admits_waiting`): after a decode run or an
        # iteration that leaves only decodes, with requests waiting, the next starts without a plan.
        self._admission_cap = traits.admission_cap
        self._chunks: ChunkRun | None = None      # chunk iterations in flight as one (see `ChunkRun`)
        self._hold_per_chunk = traits.hold_rule == "per_chunk"
        self._hold_whole_prompt = traits.hold_rule == "whole_prompt"
        self._plan_pending = False
        self.on_finish = on_finish
        # Indexes the simulator keeps beside the replica, told of every queue event (queue_events.py).
        self._queue_listeners: list[QueueListener] = []
        # The three queues change only through _join/_leave, which keep the load counters below exact.
        self.running: list[RequestState] = []
        self.waiting: list[RequestState] = []
        self.swapped: list[RequestState] = []
        self.num_tiers = num_tiers
        self.tier_running = [0] * num_tiers
        self.tier_waiting = [0] * num_tiers
        self.tier_swapped = [0] * num_tiers
        self.waiting_demand_blocks = 0            # Σ ceil(num_tokens / block_size) over waiting
        self.swapped_demand_blocks = 0            # … over swapped (their KV must come back before they run)
        self.num_preempted_waiting = 0            # waiting requests preempted at least once
        self._swapped_in_waiting = 0              # waiting requests whose KV is in host memory (moved here swapped)
        self.queues_version = 0                   # bumped on every change to running/waiting/swapped
        self._waiting_heap: list[tuple] = []      # (tier, arrival_s, id, stamp, state), lazily pruned
        self._waiting_stamp: dict[int, int] = {}  # id -> stamp of its live heap entry
        self._stamps = 0
        self._head_kept = False                   # the heap is kept from the first `waiting_head` read on
        self._tier_order: list[int] = []
        self._tier_order_version = -1
        self.tbt = [LogHistogram() for _ in range(num_tiers)]
        self._run: DecodeRun | None = None
        self._busy = False
        self._version = 0
        self._batch: list[tuple[RequestState, int]] = []
        self._batch_start_s = 0.0
        self._pause_requests: list[tuple[RequestState, Callable[[bool], None]]] = []
        self.paused: list[RequestState] = []      # held KV, not scheduled (final stage of a migration)
        self.reserved_blocks = 0                  # held for incoming migrations
        # Statistics.
        self.iterations = 0
        self.busy_s = 0.0
        self.kv_block_seconds = 0.0
        self.preemptions = 0
        self.swap_outs = 0
        self.swap_fallbacks = 0                   # swaps refused for lack of host space (recomputed instead)
        self.swap_blocks_out = 0
        self.swap_blocks_in = 0
        self.swap_pcie_s = 0.0
        self.max_used_blocks = 0


    # ----- view -----
    @property
    def now(self) -> float:
        return self.loop.now

    @property
    def used_blocks(self) -> int:
        return self.total_blocks - self.free_blocks

    @property
    def idle(self) -> bool:
        return not self._busy


    def _scale(self, dt: float, iteration: int) -> float:
        """`dt` (the model's time of iteration `iteration`) × the slowdown, then × its step-time factor."""
        if self.slowdown != 1.0:
            dt *= self.slowdown
        if self._varies:
            dt *= step_time_factor(self._step_ratios, self._step_key, iteration)
        return dt


    @staticmethod
    def _ended_by(run: DecodeRun, now: float) -> int:
        """Iterations of `run` ended by `now` (counting from the last applied or pending checkpoint)."""
        ends = run.ends
        j = run.pending[-1][0] if run.pending else run.done
        k = len(ends)
        while j < k and ends[j] <= now:
            j += 1
        return j

    # ----- queues and the load counters a cluster policy reads (constant time per read) -----
    def _join_running(self, state: RequestState) -> None:
        self.running.append(state)
        self.tier_running[state.tier] += 1
        self.queues_version += 1
        self._running_epoch += 1

    def _leave_running(self, state: RequestState) -> None:
        self.running.remove(state)
        self.tier_running[state.tier] -= 1
        self.queues_version += 1
        self._running_epoch += 1

    def _join_waiting(self, state: RequestState, front: bool) -> None:
        if front:
            self.waiting.insert(0, state)
        else:
            self.waiting.append(state)
        self.tier_waiting[state.tier] += 1
        self.waiting_demand_blocks += -(-state.num_tokens // self.block_size)   # fixed while it waits
        if state.num_preemptions > 0:
            self.num_preempted_waiting += 1
        if state.status == Status.SWAPPED:
            self._swapped_in_waiting += 1
        if self._head_kept:
            self._stamps += 1
            self._waiting_stamp[state.id] = self._stamps
            heapq.heappush(self._waiting_heap, (state.tier, state.arrival_s, state.id, self._stamps, state))
        self.queues_version += 1

    def _leave_waiting(self, state: RequestState) -> None:
        self.waiting.remove(state)
        self.tier_waiting[state.tier] -= 1
        self.waiting_demand_blocks -= -(-state.num_tokens // self.block_size)
        if state.num_preemptions > 0:
            self.num_preempted_waiting -= 1
        if state.status == Status.SWAPPED:
            self._swapped_in_waiting -= 1
        if self._head_kept:
            del self._waiting_stamp[state.id]
            if not self.waiting:
                self._waiting_heap.clear()
        self.queues_version += 1

    def _join_swapped(self, state: RequestState) -> None:
        self.swapped.append(state)
        self.tier_swapped[state.tier] += 1
        self.swapped_demand_blocks += -(-state.num_tokens // self.block_size)
        self.queues_version += 1

    def _leave_swapped(self, state: RequestState) -> None:
        self.swapped.remove(state)
        self.tier_swapped[state.tier] -= 1
        self.swapped_demand_blocks -= -(-state.num_tokens // self.block_size)
        self.queues_version += 1

    @property
    def waiting_head(self) -> RequestState | None:
        """The waiting request first in (tier, arrival, id) order: the head of a llumlet queue."""
        if not self._head_kept:         # first read: the heap of the requests waiting now, kept from here on
            self._head_kept = True
            for state in self.waiting:
                self._stamps += 1
                self._waiting_stamp[state.id] = self._stamps
                self._waiting_heap.append((state.tier, state.arrival_s, state.id, self._stamps, state))
            heapq.heapify(self._waiting_heap)
        heap = self._waiting_heap
        live = self._waiting_stamp
        while heap:
            top = heap[0]
            if live.get(top[2]) == top[3]:
                return top[4]
            heapq.heappop(heap)
        return None

    @property
    def tier_order(self) -> list[int]:
        """Tiers with a request running, waiting or swapped, in order of first appearance in running, then
        waiting, then swapped (so sums over them add up in the same order as a walk over the queues)."""
        if self._tier_order_version == self.queues_version:
            return self._tier_order
        order: list[int] = []
        seen = [False] * self.num_tiers
        for queue, counts in ((self.running, self.tier_running), (self.waiting, self.tier_waiting),
                              (self.swapped, self.tier_swapped)):
            missing = 0
            for t, c in enumerate(counts):
                if c and not seen[t]:
                    missing += 1
            for s in queue:              # stops at the last tier still missing: a few requests, usually
                if not missing:
                    break
                t = s.tier
                if not seen[t]:
                    seen[t] = True
                    order.append(t)
                    missing -= 1
        self._tier_order = order
        self._tier_order_version = self.queues_version
        return order


    def _release_host_blocks(self, state: RequestState) -> None:
        held = self._host_blocks.pop(state.id, 0)
        self.free_swap_blocks += held


    def _account(self, dt: float) -> None:
        self.iterations += 1
        self.busy_s += dt
        self.kv_block_seconds += (self.total_blocks - self.free_blocks) * dt


    def add_queue_listener(self, listener: QueueListener) -> None:
        """Tell `listener` of every queue event from now on, after the policy's hook for it."""
        self._queue_listeners.append(listener)

    # ----- the steps a room calls, defined above it in the chain -----
    def poke(self) -> None:
        """The policy must see a change (replica.py)."""
        raise NotImplementedError

    def sync(self) -> None:
        """Bring per-request state up to now (replica.py)."""
        raise NotImplementedError

    def _flush(self) -> None:
        """Apply a deferred cut's checkpoints before anything reads the state (replica.py)."""
        raise NotImplementedError

    def _end_run(self, version: int) -> None:
        """A decode run's last iteration ended (steady.py)."""
        raise NotImplementedError

    def _chunks_dissolve(self) -> None:
        """Bring a chunk run in flight to stepping's state (chunk_runs.py)."""
        raise NotImplementedError

    def _end_iteration(self, version: int) -> None:
        """A general iteration ended (iteration.py)."""
        raise NotImplementedError

    def _after_iteration(self, now: float, batch: list[tuple[RequestState, int]], finished: list[RequestState],
                         prefilling: bool, emitted: int, grow_next: list, ctx_next: int, rem_next: int) -> None:
        """Finishes, pauses and what starts after an iteration applied (iteration.py)."""
        raise NotImplementedError

    def _start_run(self, plan: BatchPlan, now: float) -> bool:
        """Start a repeatable plan's decode run (steady.py)."""
        raise NotImplementedError

    def _continue_decodes(self, now: float, batch: list[tuple[RequestState, int]], held: tuple | None,
                          sums_next: tuple) -> bool:
        """After a general iteration, the decode run `decode_batch` promises (steady.py)."""
        raise NotImplementedError

    def _admissions(self, free: int, budget: int, num_seqs: int) -> list | None:
        """The waiting requests an `admits_waiting` policy admits (steady.py)."""
        raise NotImplementedError

    def _admit(self, admitted: list, now: float, pairs: float) -> tuple[int, float]:
        """Admit what `_admissions` chose (steady.py)."""
        raise NotImplementedError

    def _admit_waiting(self, sums: tuple, now: float) -> bool:
        """The iteration `admits_waiting` promises: the decodes, then admissions (steady.py)."""
        raise NotImplementedError

    def _settle_pauses(self) -> None:
        """Pause the requests a migration asked for once their iteration ended (migration_endpoints.py)."""
        raise NotImplementedError
