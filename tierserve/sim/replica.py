"""One LLM replica: paged KV blocks, continuous batching, preemption, and iteration timing.

The local policy plans each batch; this executor validates it, allocates blocks, and advances time.
Exact skip-ahead: when the policy marks a decode-only batch `repeatable`, the executor runs it as a
*decode run* of k iterations at once — bounded by the next completion, the first KV-block shortfall and
the policy's `max_repeat` — computing each iteration's time with the same arithmetic a single step uses,
and applying per-request progress once. An arrival (or anything that needs the replica's exact state)
truncates the run to the iteration in flight, so skipping and stepping give identical results.
"""
from __future__ import annotations

import heapq
from math import log
from typing import Callable

from tierserve.core import BatchPlan, PreemptMode, RequestState, Status
from tierserve.core.histogram import LogHistogram
from tierserve.policies.local.base import (LocalPolicy, PolicyError, _hold_per_chunk, _hold_whole_prompt,
                                           holds_computed_plus_next)
from tierserve.policies.local.view import Oracle, ReplicaView
from tierserve.sim.events import EventLoop

RANK_ITERATION_END = 0   # an iteration that ends when a request arrives is applied before the arrival
RANK_PLAN = 5            # an idle replica plans once everything else at this instant has happened
_MAX_REPEAT, _REVISE_AT_S = BatchPlan().max_repeat, BatchPlan().revise_at_s    # a plan's defaults
_MAX_CHUNK_RUN = 64      # iterations a chunk run times ahead (what a cut wastes is bounded by it)


def prefill_attention_pairs(chunk: int, context_before: int) -> float:
    """Causal attention work of a prefill chunk, in query·key pairs (chunk × (prefix + chunk/2))."""
    return chunk * (context_before + chunk * 0.5)


_MASK64 = (1 << 64) - 1
_GOLDEN64 = 0x9E3779B97F4A7C15


def _splitmix64(z: int) -> int:
    """splitmix64's output function of a 64-bit counter value: a stateless, well-mixed 64-bit hash."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def step_factor_key(seed: int, replica_index: int) -> int:
    """The counter key of one replica's step-time factors, from the run's seed and the replica's index."""
    return _splitmix64((_splitmix64((seed & _MASK64) ^ _GOLDEN64) + replica_index * _GOLDEN64) & _MASK64)


def step_time_factor(table: list[float], key: int, iteration: int) -> float:
    """The step-time factor of the replica's `iteration`-th iteration (0-based, counted as stepping counts
    them): one of `table`'s equally likely values, chosen by a counter-based hash, so an iteration timed
    ahead in a run and the same iteration stepped alone draw the same factor."""
    z = _splitmix64((key + (iteration + 1) * _GOLDEN64) & _MASK64)
    return table[(z * len(table)) >> 64]


def _flush_bin(hists: list[LogHistogram], b: int, pend: list[int]) -> None:
    """Count pend[t] values in bin `b` of tier t's histogram (their sum is kept by the caller); zero pend."""
    for t, n in enumerate(pend):
        if n:
            counts = hists[t].counts
            counts[b] = counts.get(b, 0) + n
            hists[t].total += n
            pend[t] = 0


def _less(tier_counts: dict[int, int], finished: list[RequestState]) -> dict[int, int]:
    """Per-tier counts of a batch without its finished requests (tiers in the same order, empty ones gone)."""
    if not finished:
        return tier_counts
    counts = dict(tier_counts)
    for r in finished:
        counts[r.tier] -= 1
    return {t: c for t, c in counts.items() if c}


class DecodeRun:
    """A repeatable decode-only batch executing k iterations; `done` of them applied so far.

    `pending`: checkpoints (iterations ended, one in flight?) at which the run was read or cut but not yet
    applied; they are applied, in order and with the same arithmetic as one `_apply_run` each, in the
    next pass over the batch (a cut by an arrival then costs no pass of its own).
    """

    __slots__ = ("batch", "start_s", "ends", "done", "tier_counts", "pending", "applied_tokens", "block_growth")

    def __init__(self, batch: list[RequestState], start_s: float, ends: list[float],
                 tier_counts: dict[int, int]) -> None:
        self.batch = batch
        self.start_s = start_s
        self.ends = ends
        self.done = 0
        self.tier_counts = tier_counts
        self.pending: list[tuple[int, bool]] = []
        # Tokens of the run each request's blocks cover as applied (iteration 0's are given at the start).
        self.applied_tokens = 1
        self.block_growth: BlockGrowth | None = None    # built when first read (`Replica.used_blocks_now`)


class BlockGrowth:
    """The KV blocks a decode run's requests add as its iterations pass, counted without a pass over them.

    Request r, holding b blocks with c tokens computed when the run started, needs its next block once the
    run has covered s = b·bs − c + 1 of its tokens, then one every bs tokens; so the blocks added at count u
    are the requests whose s is u plus those added at u − bs. `total[u]`: blocks added from the state the
    schedule was built in (every s lies beyond it) up to u tokens; extended as far as it is read."""

    __slots__ = ("block_size", "starts", "steps", "total")

    def __init__(self, batch: list[RequestState], done: int, block_size: int) -> None:
        starts: dict[int, int] = {}
        for r in batch:
            s = r.num_blocks * block_size - (r.num_computed_tokens - done) + 1
            starts[s] = starts.get(s, 0) + 1
        self.block_size = block_size
        self.starts = starts
        self.steps = [0]
        self.total = [0]

    def added(self, tokens: int) -> int:
        total, steps, starts, bs = self.total, self.steps, self.starts, self.block_size
        u = len(total)
        while u <= tokens:
            step = starts.get(u, 0)
            if u > bs:
                step += steps[u - bs]
            steps.append(step)
            total.append(total[u - 1] + step)
            u += 1
        return total[tokens]


class ChunkRun:
    """Iterations of the same decodes beside one prefill's next chunks, started as one (`_continue_chunk`
    under a `repeats_prefill_chunk` policy): iteration j ends at ends[j], lasts durations[j] (as charged),
    runs chunks[j] prompt tokens and first allocates p_needs[j] blocks to the prefill. Iteration 0 is
    allocated and charged when the run starts; the rest is applied in one pass (`_chunks_catch_up`), after
    which the iteration in flight ends as an ordinary one. Each iteration still ends with its own event
    (`_chunks_tick`, scheduled when stepping would schedule it): `ended` counts them, and the event order —
    ties and the events statistic included — is stepping's."""

    __slots__ = ("batch", "start_s", "ends", "durations", "chunks", "p_needs", "ended")

    def __init__(self, batch: list[tuple[RequestState, int]], start_s: float, ends: list[float],
                 durations: list[float], chunks: list[int], p_needs: list[int]) -> None:
        self.batch = batch
        self.start_s = start_s
        self.ends = ends
        self.durations = durations
        self.chunks = chunks
        self.p_needs = p_needs
        self.ended = 0


class Replica:
    """Executor of one replica; its local policy reads it through `self.view` (a read-only `ReplicaView`)."""

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
        self._iteration_hook = type(policy).on_iteration_end is not LocalPolicy.on_iteration_end
        self._decode_hold_inline = holds_computed_plus_next(policy)
        # The policy names its all-decode batch (`decode_batch`): when nothing waits, a decode run starts
        # from it without a plan, and after a run its sums come from the run's own last pass.
        # An iteration hook is called at every iteration's end either way (a decode run's too), so it does
        # not bar decode runs started without a plan; admissions and chunks started so do (below).
        self._keeps_batch = (type(policy).decode_batch is not LocalPolicy.decode_batch
                             and self._decode_hold_inline)
        self._carry: tuple | None = None
        # A run's carry kept over an iteration that only admits new requests (vLLM v0's prefill batches):
        # (running-set epoch, n, grow, ctx, rem, tier counts); the epoch counts joins and leaves of `running`.
        self._held_carry: tuple | None = None
        self._running_epoch = 0
        self._admitted_all = False                # every request of the batch in flight joined running for it
        # The policy plans a prefill's next chunk beside the same decodes (`repeats_prefill_chunk`): such an
        # iteration starts without a plan. `_decodes_then_prefill`: the batch in flight has that shape.
        self._repeats_chunk = policy.repeats_prefill_chunk() and not self._iteration_hook
        self._decodes_then_prefill = False
        # The policy names its admissions beside running decodes (`admits_waiting`): after a decode run or an
        # iteration that leaves only decodes, with requests waiting, the next starts without a plan.
        self._admission_cap = (policy.admits_waiting() if self._keeps_batch and not self._iteration_hook
                               else None)
        self._chunks: ChunkRun | None = None      # chunk iterations in flight as one (see `ChunkRun`)
        self._hold_per_chunk = type(policy).blocks_to_hold is _hold_per_chunk
        self._hold_whole_prompt = type(policy).blocks_to_hold is _hold_whole_prompt
        self._plan_pending = False
        self.on_finish = on_finish
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

    # ----- entry points -----
    def enqueue(self, state: RequestState, front: bool = False) -> None:
        """A request joins this replica's waiting queue (dispatch or migration of a queued request)."""
        if self._chunks is not None and getattr(self.policy.on_arrival, "__func__", None) is LocalPolicy.on_arrival:
            # No hook reads the state: the chunk run goes on (stepping, too, continues a chunk that takes
            # the whole budget whatever waits) less a last, partial chunk, which the policy would now plan.
            state.replica = self.index
            if state.status != Status.SWAPPED:
                state.status = Status.WAITING
            self._join_waiting(state, front)
            self._chunks_drop_partial()
            return
        self._flush()                   # the policy's hook sees the state as of now
        state.replica = self.index
        if state.status != Status.SWAPPED:
            state.status = Status.WAITING
        self._join_waiting(state, front)
        self.policy.on_arrival(state, self.view)
        self.poke()

    def poke(self) -> None:
        """Something changed that the policy must see: re-plan at the end of this instant if idle (so
        requests arriving together share the first iteration), else after the iteration in flight."""
        if not self._busy:
            if not self._plan_pending:
                self._plan_pending = True
                self.loop.at(self.loop.now, RANK_PLAN, self._plan_if_idle)
        elif self._run is not None:
            self._truncate_run(self.loop.now, defer=True)
        elif self._chunks is not None:
            self._chunks_dissolve()

    def _plan_if_idle(self) -> None:
        self._plan_pending = False
        if not self._busy:
            self._start_next()

    def set_slowdown(self, factor: float) -> None:
        """Scale iteration times from the next iteration on (a live migration copying KV out of here)."""
        if factor != self.slowdown:
            if self._run is not None:
                self._truncate_run(self.loop.now)
            elif self._chunks is not None:
                self._chunks_dissolve()
            self.slowdown = factor
            self._scaled = factor != 1.0 or self._varies

    def _scale(self, dt: float, iteration: int) -> float:
        """`dt` (the model's time of iteration `iteration`) × the slowdown, then × its step-time factor."""
        if self.slowdown != 1.0:
            dt *= self.slowdown
        if self._varies:
            dt *= step_time_factor(self._step_ratios, self._step_key, iteration)
        return dt

    def sync(self) -> None:
        """Bring per-request state up to now (iterations ended so far; blocks of the one in flight)."""
        run = self._run
        if run is not None:
            j = self._ended_by(run, self.loop.now)
            self._apply_run(run, j, j < len(run.ends))
        elif self._chunks is not None:
            self._chunks_dissolve()

    def checkpoint(self) -> None:
        """`sync` for a reader that adds a decode run's unapplied progress itself (`DeadlineLoad.load`): the
        run's iterations ended by now are recorded as a pending checkpoint — applied in the run's next pass with
        the arithmetic `sync` would apply them with now, as a deferred cut's are — instead of a pass now."""
        run = self._run
        if run is not None:
            j = self._ended_by(run, self.loop.now)
            if j > (run.pending[-1][0] if run.pending else run.done):
                run.pending.append((j, j < len(run.ends)))
        elif self._chunks is not None:
            self._chunks_dissolve()

    def used_blocks_now(self) -> int:
        """KV blocks in use as `sync` would leave them now, without its pass over a decode run: the run's
        iterations ended by now are recorded as a pending checkpoint (as `checkpoint` does; applied later with
        the same arithmetic) and the blocks they add are read off the run's `BlockGrowth`."""
        self.checkpoint()
        run = self._run
        if run is None or not run.pending:
            return self.total_blocks - self.free_blocks
        u, flying = run.pending[-1]
        growth = run.block_growth
        if growth is None:
            growth = run.block_growth = BlockGrowth(run.batch, run.done, self.block_size)
        added = growth.added(u + 1 if flying else u) - growth.added(run.applied_tokens)
        return self.total_blocks - self.free_blocks + added

    def _flush(self) -> None:
        """Apply the checkpoints a deferred cut left (the state as of that cut), before anything reads it."""
        run = self._run
        if run is not None and run.pending:
            self._apply_run(run, 0, False)
        elif self._chunks is not None:
            self._chunks_dissolve()

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

    # ----- planning -----
    def _start_next(self) -> None:
        now = self.loop.now
        plan = self.policy.plan(self.view)
        if plan.relegate:
            self._apply_relegations(plan, now)
        # Only a preemption or a request whose KV is in host memory costs PCIe time.
        swap_s = (self._apply_preemptions(plan) if plan.preempt or self.swapped or self._swapped_in_waiting
                  else 0.0)
        scheduled = plan.scheduled
        if not scheduled:
            self._busy = False
            if plan.preempt:            # evictions freed blocks: plan again (bounded: running only shrinks)
                self._start_next()
            return
        self._busy = True
        if plan.repeatable and not swap_s and self._start_run(plan, now):
            return
        prefill_tokens, pairs, decodes, ctx = self._allocate(scheduled, now)
        if prefill_tokens:
            dt = self.predictor.iteration_time(prefill_tokens, pairs, decodes, ctx)
        else:
            dt = self.predictor.decode_base_time(decodes) + self.predictor.decode_context_coef_s * ctx
        if self._scaled:
            dt = self._scale(dt, self.iterations)
        dt += swap_s
        self._batch = scheduled
        self._batch_start_s = now
        self._account(dt)
        self._version += 1
        self.loop.at(now + dt, RANK_ITERATION_END, self._end_iteration, self._version)

    def _apply_relegations(self, plan: BatchPlan, now: float) -> None:
        for state, reason in plan.relegate:
            if state.replica != self.index or state.status in (Status.FINISHED, Status.REJECTED):
                raise PolicyError(f"{self.policy.name}: cannot relegate request {state.id} (status {state.status.name})")
            if state.relegated_s < 0:
                state.relegated_s = now
                state.relegation_reason = reason
                self.policy.on_relegate(state, self.view)

    def _apply_preemptions(self, plan: BatchPlan) -> float:
        """Evict the plan's victims; returns the PCIe seconds of swaps out (and in, for swapped requests
        the plan resumes), which the iteration is charged."""
        swap_s = 0.0
        for victim, mode in plan.preempt:
            if victim.status != Status.RUNNING or victim.replica != self.index:
                raise PolicyError(f"{self.policy.name}: cannot preempt request {victim.id} (status {victim.status.name})")
            self._leave_running(victim)
            self.free_blocks += victim.num_blocks
            victim.num_preemptions += 1
            self.preemptions += 1
            if mode == PreemptMode.SWAP and victim.num_blocks > self.free_swap_blocks:
                mode = PreemptMode.RECOMPUTE          # host swap space full: vLLM v0 would fail; recompute
                self.swap_fallbacks += 1
            if mode == PreemptMode.SWAP:
                swap_s += victim.num_blocks * self.swap_time_per_block_s
                self.swap_blocks_out += victim.num_blocks
                self.free_swap_blocks -= victim.num_blocks
                self._host_blocks[victim.id] = victim.num_blocks
                victim.num_blocks = 0
                victim.num_swaps += 1
                self.swap_outs += 1
                victim.status = Status.SWAPPED
                self._join_swapped(victim)
            else:
                victim.num_blocks = 0
                victim.num_computed_tokens = 0        # KV dropped: prompt + generated are recomputed
                victim.status = Status.WAITING
                self._join_waiting(victim, True)
            self.policy.on_preempt(victim, mode, self.view)
        for r, _ in plan.scheduled:
            if r.status == Status.SWAPPED:
                held = self._host_blocks.get(r.id)
                if held is None:      # swapped elsewhere and moved here while queued: its KV crosses PCIe once
                    held = self.policy.blocks_to_hold(r, 0, self.block_size)
                swap_s += held * self.swap_time_per_block_s
                self.swap_blocks_in += held
        self.swap_pcie_s += swap_s
        return swap_s

    def _release_host_blocks(self, state: RequestState) -> None:
        held = self._host_blocks.pop(state.id, 0)
        self.free_swap_blocks += held

    def _allocate(self, scheduled: list[tuple[RequestState, int]], now: float) -> tuple[int, float, int, int]:
        """Validate the plan against memory and batch limits, allocate blocks, admit new requests; returns
        the batch's shape for the execution model: (prefill tokens, prefill attention pairs, decodes,
        decode context tokens)."""
        if len(scheduled) > self.max_num_seqs:
            raise PolicyError(f"{self.policy.name}: batch of {len(scheduled)} > max_num_seqs {self.max_num_seqs}")
        bs = self.block_size
        hold = self.policy.blocks_to_hold
        per_chunk = self._hold_per_chunk            # these two rules are computed inline (hot loop)
        whole_prompt = self._hold_whole_prompt
        decode_inline = self._decode_hold_inline    # a decode then holds ceil((computed + 1) / bs) under both
        running = Status.RUNNING
        total = 0
        prefill_tokens = 0
        pairs = 0.0
        decodes = 0
        ctx = 0
        admitted = 0
        for r, n in scheduled:
            computed = r.num_computed_tokens
            to_run = r.num_tokens - computed
            if n < 1 or n > to_run:
                raise PolicyError(f"{self.policy.name}: request {r.id} scheduled {n} tokens, has {to_run} to run")
            total += n
            r.last_scheduled_s = now
            if n == 1 and to_run == 1 and r.num_generated > 0:
                decodes += 1
                ctx += computed + 1
                need = (-(-(computed + 1) // bs) if decode_inline else hold(r, 1, bs)) - r.num_blocks
            else:
                prefill_tokens += n
                pairs += n * (computed + n * 0.5)      # prefill_attention_pairs, inline (hot loop)
                if per_chunk:
                    need = -(-(computed + n) // bs) - r.num_blocks
                elif whole_prompt:
                    tokens = computed + n
                    known = r.num_tokens
                    need = -(-(tokens if tokens > known else known) // bs) - r.num_blocks
                else:
                    need = hold(r, n, bs) - r.num_blocks
            if need > 0:
                if need > self.free_blocks:
                    raise PolicyError(f"{self.policy.name}: request {r.id} needs {need} KV blocks, {self.free_blocks} free")
                self.free_blocks -= need
                r.num_blocks += need
            if r.status != running:
                if r.replica != self.index:
                    raise PolicyError(f"{self.policy.name}: request {r.id} is not on replica {self.index}")
                if r.status == Status.SWAPPED:
                    self._leave_swapped(r)
                    self._release_host_blocks(r)
                else:
                    self._leave_waiting(r)
                r.status = Status.RUNNING
                self._join_running(r)
                admitted += 1
        self._admitted_all = admitted == len(scheduled)
        if total > self.token_budget:
            raise PolicyError(f"{self.policy.name}: batch of {total} tokens > token budget {self.token_budget}")
        used = self.total_blocks - self.free_blocks
        if used > self.max_used_blocks:
            self.max_used_blocks = used
        if self._repeats_chunk:
            r, n = scheduled[-1]
            self._decodes_then_prefill = decodes == len(scheduled) - 1 and not (
                n == 1 and r.num_tokens - r.num_computed_tokens == 1 and r.num_generated > 0)
        return prefill_tokens, pairs, decodes, ctx

    def _account(self, dt: float) -> None:
        self.iterations += 1
        self.busy_s += dt
        self.kv_block_seconds += (self.total_blocks - self.free_blocks) * dt

    # ----- a general (prefill-carrying) iteration -----
    def _end_iteration(self, version: int) -> None:
        if version != self._version:
            return
        now = self.loop.now
        finished = []
        dt = now - self._batch_start_s
        hists = self.tbt
        # LogHistogram.add inlined: the requests decoding in this batch share one previous token time, so
        # their gaps are equal and binned once (the same bins, counts and sums, added in the same order).
        h0 = hists[0]
        log_min, inv, min_value = h0._log_min, h0._inv_log_step, h0.min_value
        last_gap, last_bin = -1.0, 0
        # Counts of the current bin per tier, and each tier's running sum (added in the same order as
        # LogHistogram.add would), written back once per bin change and at the end.
        pend = [0] * len(hists)
        pend_any = False
        sums = [h.sum for h in hists]
        prefilling = False                      # some request still has prompt (or recompute) to run
        # Over the requests that emitted a token and go on decoding: what their next decode needs (the
        # sums `_continue_decodes` and `_continue_chunk` start from): count, blocks, Σ (computed + 1), min rest.
        bs = self.block_size
        gather = self._keeps_batch or self._repeats_chunk
        emitted, grow_next, ctx_next, rem_next = 0, [], 0, 1 << 62
        for r, n in self._batch:
            c = r.num_computed_tokens + n
            r.num_computed_tokens = c
            r.service_tokens += n
            r.service_s += dt
            prompt = r.prompt_tokens
            if c - n < prompt:                   # the chunk covered prompt tokens: some may be new progress
                attained_prompt = r.attained_tokens - r.num_generated
                if c > attained_prompt:
                    r.attained_tokens += (c if c < prompt else prompt) - attained_prompt
            if c == r.num_tokens:                # the iteration emits a token
                generated = r.num_generated + 1
                r.num_generated = generated
                r.num_tokens = c + 1
                r.attained_tokens += 1
                if r.first_token_s < 0:
                    r.first_token_s = now
                else:
                    gap = now - r.last_token_s
                    t = r.tier
                    if gap != last_gap:
                        if pend_any:
                            _flush_bin(hists, last_bin, pend)
                        last_gap = gap
                        last_bin = int((log(gap) - log_min) * inv) if gap > min_value else 0
                    pend[t] += 1
                    pend_any = True
                    sums[t] += gap
                    if gap > r.tbt_max_s:
                        r.tbt_max_s = gap
                r.last_token_s = now
                rem = r._request.output_tokens - generated     # the executor owns the truth
                if rem <= 0:
                    finished.append(r)  # type: ignore[union-attr]  # collect: finished is a list
                elif gather:
                    emitted += 1
                    ctx_next += c + 1
                    if rem < rem_next:
                        rem_next = rem
                    need = -(-(c + 1) // bs) - r.num_blocks
                    if need > 0:
                        grow_next.append((r, need))
            else:
                prefilling = True
        if pend_any:
            _flush_bin(hists, last_bin, pend)
        for h, total in zip(hists, sums):
            h.sum = total
        batch, self._batch = self._batch, []
        if self._iteration_hook:
            self.policy.on_iteration_end([r for r, _ in batch], 1, dt, self.view)
        self._after_iteration(now, batch, finished, prefilling, emitted, grow_next, ctx_next, rem_next)

    def _after_iteration(self, now: float, batch: list[tuple[RequestState, int]], finished: list[RequestState],
                         prefilling: bool, emitted: int, grow_next: list, ctx_next: int, rem_next: int) -> None:
        """The end of a general iteration once its requests are applied: finishes, pauses, and what starts
        next (`emitted`, `grow_next`, `ctx_next`, `rem_next`: the sums gathered over requests that go on)."""
        for r in finished:
            self._finish(r, now)
        epoch = self._running_epoch
        self._settle_pauses()
        held, self._held_carry = self._held_carry, None      # good for this iteration's end only
        # (a request paused here left running after the pass: its sums no longer describe `running`)
        sums_next = (emitted if self._running_epoch == epoch else -1, grow_next, ctx_next, rem_next)
        if self._keeps_batch and not prefilling and self._continue_decodes(now, batch, held, sums_next):
            return
        if self._repeats_chunk and self._continue_chunk(batch, now, sums_next, finished):
            return
        if (self._admission_cap is not None and not prefilling and self.waiting
                and sums_next[0] == len(self.running) and self._admit_waiting(sums_next, now)):
            return
        self._start_next()

    def _continue_chunk(self, batch: list[tuple[RequestState, int]], now: float, sums_next: tuple,
                        finished: list[RequestState]) -> bool:
        """After an iteration whose last request is a prefill with tokens left and every other either emitted
        a token (decodes, prompts completed) or finished: start the next iteration as `_start_next` would from
        the plan a `repeats_prefill_chunk` policy returns — those that go on in the policy's decode order, the
        prefill's next chunk — when nothing waits (or the chunk takes the whole budget), no other request runs
        and the blocks fit; when one request waits and the chunk is the prompt's last, short of the budget,
        also that request's first chunk (`admits_waiting`). `sums_next`: the sums of the iteration's pass
        over those that go on. False (nothing changed): plan instead."""
        if self.swapped or len(batch) - len(finished) != len(self.running):
            return False
        p, _ = batch[-1]
        pc = p.num_computed_tokens
        left = p.num_tokens - pc
        if left <= 1 and p.num_generated > 0:
            return False                # it decodes next: the policy plans
        num_decodes = len(batch) - 1 - len(finished)
        emitted, grow, ctx, rem_min = sums_next
        if emitted != num_decodes:
            return False                # another prefill goes on (or a request paused): the policy plans
        order = None
        if not self._decodes_then_prefill:
            # Prompts completed in this batch: the decodes' order is the policy's, not the batch's.
            order = self.policy.decode_batch([r for r, _ in batch[:-1] if r.status is not Status.FINISHED])
            if order is None:
                return False
        n = self.token_budget - num_decodes
        admit = False
        if left < n:
            if self.waiting:
                if self._admission_cap is None or self._swapped_in_waiting:
                    return False        # budget is left over for waiting requests: the policy plans
                admit = True
            n = left
        if n < 1:
            return False
        bs = self.block_size
        free = self.free_blocks
        for _, need in grow:
            free -= need
        if free < 0:
            return False                # the policy evicts: let it plan
        p_need = self.policy.blocks_to_hold(p, n, bs) - p.num_blocks
        if p_need > free:
            return False                # refused when allocated: let the plan path raise it
        admitted = None
        if admit:
            if p_need > 0:
                return False            # the policy's free blocks would not be the executor's: plan
            admitted = self._admissions(free, self.token_budget - num_decodes - n, num_decodes + 1)
            if admitted is None:
                return False
            for _, _, need in admitted:
                free -= need
        if order is not None:
            batch = [(r, 1) for r in order]
            batch.append((p, n))
        elif finished:                  # the batch's order less the finished (p, prefilling, is not one)
            batch = [entry for entry in batch if entry[0].status is not Status.FINISHED]
        # What `_allocate` does for this batch: blocks in batch order (all fit), the start of the iteration.
        for r, need in grow:
            r.num_blocks += need
        if p_need > 0:
            free -= p_need
            p.num_blocks += p_need
        for r, _ in batch:
            r.last_scheduled_s = now
        pairs = 0.0
        pairs += n * (pc + n * 0.5)
        prefill_tokens = n
        if admitted:
            batch[-1] = (p, n)
            tokens, pairs = self._admit(admitted, now, pairs)
            batch += [(w, n_w) for w, n_w, _ in admitted]
            prefill_tokens += tokens
        self.free_blocks = free
        used = self.total_blocks - free
        if used > self.max_used_blocks:
            self.max_used_blocks = used
        dt = self.predictor.iteration_time(prefill_tokens, pairs, num_decodes, ctx)
        if self._scaled:
            dt = self._scale(dt, self.iterations)
        dt += 0.0                       # no PCIe time: nothing swapped or preempted
        self._batch = batch
        self._batch_start_s = now
        self._account(dt)
        self._version += 1
        end = now + dt
        if admitted:                    # two prefills or more: an ordinary iteration (as `_allocate` says)
            self._decodes_then_prefill = False
            self.loop.at(end, RANK_ITERATION_END, self._end_iteration, self._version)
            return True
        batch[-1] = (p, n)
        self._decodes_then_prefill = True
        if (self.skip_ahead and rem_min > 1
                and self._chunks_start(batch, pc + n, num_decodes, ctx, free, rem_min, now, dt, end)):
            return True
        self.loop.at(end, RANK_ITERATION_END, self._end_iteration, self._version)
        return True

    # ----- chunk runs: the iterations `_continue_chunk` would start one by one, applied in one pass -----
    def _chunks_start(self, batch: list[tuple[RequestState, int]], pc: int, num_decodes: int, ctx0: int,
                      free: int, rem_min: int, start_s: float, dt0: float, end0: float) -> bool:
        """Iteration 0 of `batch` (decodes, then a prefill chunk) has just started with `free` blocks left:
        time the iterations `_continue_chunk` would start after it, with the same arithmetic, while it surely
        would — up to the prompt's last chunk, the first decode's last token (`rem_min` tokens left each at
        least), a partial chunk while something waits, and as long as the decodes' growth (≤ one block per
        `block_size` iterations each) and the prefill's blocks surely fit in `free`; past that, stepping
        checks exactly. `pc`: the prefill's computed tokens after iteration 0. True: a run of ≥ 2 started."""
        if self._hold_whole_prompt:
            per_chunk = False
        elif self._hold_per_chunk:
            per_chunk = True
        else:
            return False
        p = batch[-1][0]
        budget = self.token_budget - num_decodes
        total = p.num_tokens
        generated = p.num_generated
        waiting = bool(self.waiting)
        bs = self.block_size
        p_blocks = p.num_blocks
        predictor = self.predictor
        scaled = self._scaled
        first = self.iterations - 1     # iteration 0's index: `_account` has counted it already
        ends, durations, chunks, p_needs = [end0], [dt0], [batch[-1][1]], [0]
        t = end0
        grown = 0                       # blocks the prefill takes after iteration 0
        limit = rem_min if rem_min < _MAX_CHUNK_RUN else _MAX_CHUNK_RUN
        j = 1
        while j < limit:                # iteration j: every decode is still short of its last token
            left = total - pc
            if left < 1 or (left == 1 and generated > 0):
                break                   # the prompt is done: it decodes next
            n = budget
            if left < n:
                if waiting:
                    break               # budget left over for a waiting request: the policy plans
                n = left
            if n < 1:
                break
            tokens = pc + n
            if not per_chunk and tokens < total:
                tokens = total
            need = -(-tokens // bs) - p_blocks
            if need < 0:
                need = 0
            if num_decodes * (-(-j // bs)) + grown + need > free:
                break                   # might not fit: stepping checks it exactly
            grown += need
            p_blocks += need
            pairs = 0.0
            pairs += n * (pc + n * 0.5)
            dt = predictor.iteration_time(n, pairs, num_decodes, ctx0 + num_decodes * j)
            if scaled:
                dt = self._scale(dt, first + j)
            dt += 0.0
            t = t + dt
            ends.append(t)
            durations.append(dt)
            chunks.append(n)
            p_needs.append(need)
            pc += n
            j += 1
        if j < 2:
            return False
        self._chunks = ChunkRun(batch, start_s, ends, durations, chunks, p_needs)
        self._held_carry = None         # as iteration 0's end leaves it (`_end_iteration` drops it)
        self.loop.at(end0, RANK_ITERATION_END, self._chunks_tick, self._version)
        return True

    def _chunks_tick(self, version: int) -> None:
        """The end of a chunk run's iteration (`run.ended` of them before it)."""
        if version != self._version:
            return
        run = self._chunks
        if run is None:                 # dissolved while this iteration ran: it ends as an ordinary one
            self._end_iteration(version)
            return
        j = run.ended + 1
        ends = run.ends
        if j == len(ends):
            self._chunks_catch_up(run, j, True)     # every iteration, the last as `_end_iteration` ends it
            return
        run.ended = j
        self.loop.at(ends[j], RANK_ITERATION_END, self._chunks_tick, version)

    def _chunks_dissolve(self) -> None:
        """Something reads or changes the state: bring it to what stepping has now (the iteration in flight
        allocated); the pending tick then ends that iteration as an ordinary one."""
        run = self._chunks
        assert run is not None          # only called while a chunk run is in flight
        self._chunks_catch_up(run, run.ended, False)

    def _chunks_drop_partial(self) -> None:
        """A request now waits: a last chunk short of the budget would be planned, not repeated; drop it
        unless it has started."""
        run = self._chunks
        assert run is not None
        chunks = run.chunks
        if chunks[-1] >= self.token_budget - (len(run.batch) - 1):
            return                      # every chunk takes the whole budget: stepping repeats them all
        ends = run.ends
        if run.ended == len(ends) - 1:
            return                      # the last iteration has started
        for seq in (ends, run.durations, chunks, run.p_needs):
            seq.pop()
        if len(ends) == 1:
            self._chunks = None         # iteration 0 alone, in flight: an ordinary iteration (state current)

    def _chunks_catch_up(self, run: ChunkRun, u: int, final: bool) -> None:
        """Apply iterations 0 … u-1 of the run to every request, all as `_end_iteration` and `_continue_chunk`
        would one by one (the same float operations in the same order). Not `final`: then start iteration u
        (its blocks, the statistics of iterations 1 … u) and make it the ordinary one in flight. `final`
        (u = every iteration, ended now): the last one ends as `_end_iteration` ends it, what follows too."""
        self._chunks = None
        if u == 0:
            return                      # iteration 0 is `_batch` already, allocated and charged
        batch = run.batch
        p = batch[-1][0]
        ends = run.ends
        spans = [ends[0] - run.start_s]     # each iteration's `now - _batch_start_s`
        shared_max = 0.0
        prev = ends[0]
        for j in range(1, u):
            e = ends[j]
            g = e - prev                # every decode's gap at iteration j (its last token came at ends[j-1])
            prev = e
            spans.append(g)
            if g > shared_max:
                shared_max = g
        first_end = ends[0]
        last = ends[u - 1]              # the decodes' last token
        alloc_to = u - 1 if final else u                    # iterations 1 … alloc_to start here
        scheduled_s = ends[alloc_to - 1]                    # the start of the last iteration started
        hists = self.tbt
        h0 = hists[0]
        log_min, inv, min_value = h0._log_min, h0._inv_log_step, h0.min_value
        last_gap, last_bin = -1.0, 0
        # Iteration 0's gaps, as `_end_iteration` adds them: per tier in batch order, one bin per run of
        # equal gaps (written back at each change and at the end).
        pend = [0] * len(hists)
        pend_any = False
        sums = [h.sum for h in hists]
        tier_decodes = [0] * len(hists)
        bs = self.block_size
        grow = [0] * (alloc_to + 1)     # blocks the decodes take as iteration a (1 … alloc_to) starts
        one = u == 1
        span0 = spans[0]
        finished: list[RequestState] = []
        emitted, grow_next, ctx_next, rem_next = 0, [], 0, 1 << 62   # as `_end_iteration` gathers them
        p_index = len(batch) - 1
        for i in range(p_index):
            r = batch[i][0]
            c0 = r.num_computed_tokens
            c = c0 + u
            r.num_computed_tokens = c
            r.num_tokens += u
            generated = r.num_generated + u
            r.num_generated = generated
            r.attained_tokens += u
            r.service_tokens += u
            if one:
                r.service_s += span0
            else:
                service = r.service_s
                for span in spans:
                    service += span
                r.service_s = service
            r.last_scheduled_s = scheduled_s
            gap = first_end - r.last_token_s
            t = r.tier
            if gap != last_gap:
                if pend_any:
                    _flush_bin(hists, last_bin, pend)
                last_gap = gap
                last_bin = int((log(gap) - log_min) * inv) if gap > min_value else 0
            pend[t] += 1
            pend_any = True
            sums[t] += gap
            tier_decodes[t] += 1
            if shared_max > gap:
                gap = shared_max
            if gap > r.tbt_max_s:
                r.tbt_max_s = gap
            r.last_token_s = last
            # Iteration a needs ceil((c0 + a + 1) / bs) blocks: one more than `blocks` from a = blocks·bs − c0.
            blocks = r.num_blocks
            a = blocks * bs - c0
            if a <= alloc_to:
                while a <= alloc_to:
                    grow[a] += 1
                    blocks += 1
                    a += bs
                r.num_blocks = blocks
            if final:
                rem = r._request.output_tokens - generated
                if rem <= 0:
                    finished.append(r)  # type: ignore[union-attr]  # collect: finished is a list
                else:
                    emitted += 1
                    ctx_next += c + 1
                    if rem < rem_next:
                        rem_next = rem
                    need = -(-(c + 1) // bs) - blocks
                    if need > 0:
                        grow_next.append((r, need))
        if pend_any:
            _flush_bin(hists, last_bin, pend)
        for h, total in zip(hists, sums):
            h.sum = total
        # Iterations 1 … u-1: one gap for every decode, added once per decode of each tier, in order.
        for j in range(1, u):
            g = spans[j]
            b = int((log(g) - log_min) * inv) if g > min_value else 0
            for t, c in enumerate(tier_decodes):
                if c:
                    h = hists[t]
                    h.counts[b] = h.counts.get(b, 0) + c
                    h.total += c
                    total = h.sum
                    for _ in range(c):
                        total += g
                    h.sum = total
        # The prefill's chunks: only the run's last can be the prompt's last (it then emits, after the decodes).
        chunks = run.chunks
        pc = p.num_computed_tokens
        prompt = p.prompt_tokens
        service = p.service_s
        tokens = 0
        for j in range(u):
            n = chunks[j]
            c = pc + n
            service += spans[j]
            if pc < prompt:
                attained_prompt = p.attained_tokens - p.num_generated
                if c > attained_prompt:
                    p.attained_tokens += (c if c < prompt else prompt) - attained_prompt
            pc = c
            tokens += n
        p.num_computed_tokens = pc
        p.service_tokens += tokens
        p.service_s = service
        p.last_scheduled_s = scheduled_s
        # Iterations 1 … alloc_to start: blocks, then the statistics `_account` keeps, in iteration order.
        p_needs, durations = run.p_needs, run.durations
        free = self.free_blocks
        total_blocks = self.total_blocks
        max_used = self.max_used_blocks
        busy, kv = self.busy_s, self.kv_block_seconds
        p_blocks = p.num_blocks
        for a in range(1, alloc_to + 1):
            free -= grow[a] + p_needs[a]
            p_blocks += p_needs[a]
            used = total_blocks - free
            if used > max_used:
                max_used = used
            dt = durations[a]
            busy += dt
            kv += used * dt
        if free < 0:
            raise AssertionError(f"replica {self.index}: KV over capacity during a chunk run")
        p.num_blocks = p_blocks
        self.free_blocks = free
        self.max_used_blocks = max_used
        self.busy_s, self.kv_block_seconds = busy, kv
        self.iterations += alloc_to
        if not final:
            if pc >= p.num_tokens:
                raise AssertionError(f"replica {self.index}: a chunk run passed request {p.id}'s last chunk")
            batch[-1] = (p, chunks[u])
            self._batch = batch
            self._batch_start_s = last
            return
        batch[-1] = (p, chunks[u - 1])
        prefilling = pc != p.num_tokens
        if not prefilling:              # the prompt's last chunk: its token, as `_end_iteration` emits it
            generated = p.num_generated + 1
            p.num_generated = generated
            p.num_tokens = pc + 1
            p.attained_tokens += 1
            if p.first_token_s < 0:
                p.first_token_s = last
            else:
                gap = last - p.last_token_s
                h = hists[p.tier]
                b = int((log(gap) - log_min) * inv) if gap > min_value else 0
                h.counts[b] = h.counts.get(b, 0) + 1
                h.total += 1
                h.sum += gap
                if gap > p.tbt_max_s:
                    p.tbt_max_s = gap
            p.last_token_s = last
            rem = p._request.output_tokens - generated
            if rem <= 0:
                finished.append(p)
            else:
                emitted += 1
                ctx_next += pc + 1
                if rem < rem_next:
                    rem_next = rem
                need = -(-(pc + 1) // bs) - p_blocks
                if need > 0:
                    grow_next.append((p, need))
        self._batch = []
        self._after_iteration(last, batch, finished, prefilling, emitted, grow_next, ctx_next, rem_next)

    def _finish(self, r: RequestState, now: float) -> None:
        self._leave_running(r)
        self.free_blocks += r.num_blocks
        r.num_blocks = 0
        r.status = Status.FINISHED
        r.finish_s = now
        self.policy.on_finish(r, self.view)
        self.on_finish(r)

    # ----- decode runs (skip-ahead) -----
    def _start_run(self, plan: BatchPlan, now: float) -> bool:
        """Start a decode run of the plan's batch; False (nothing changed but `last_scheduled_s`, which the
        single-iteration path sets the same) when some scheduled request is not a running decode."""
        scheduled = plan.scheduled
        b = len(scheduled)
        if b > self.max_num_seqs:
            return False                # the single-iteration path refuses it with the error
        bs = self.block_size
        inline_hold = self._decode_hold_inline
        hold = self.policy.blocks_to_hold
        running = Status.RUNNING
        batch = []
        grow = []                       # (request, blocks) for the ones crossing into a new block
        ctx0 = 0
        k = plan.max_repeat if self.skip_ahead else 1
        for r, n in scheduled:
            c = r.num_computed_tokens
            generated = r.num_generated
            if n != 1 or r.status != running or generated == 0 or r.num_tokens - c != 1:
                return False
            need = (-(-(c + 1) // bs) if inline_hold else hold(r, 1, bs)) - r.num_blocks
            if need > 0:
                grow.append((r, need))
            batch.append(r)
            ctx0 += c + 1
            rem = r._request.output_tokens - generated          # true_output_tokens, inline (hot loop)
            if rem < k:
                k = rem
            r.last_scheduled_s = now
        # Each tier's histogram is separate: the order of tiers here changes no count and no sum.
        if self.num_tiers == 1:
            tiers = {0: b}
        else:
            tier_list = [r.tier for r in batch]
            tiers = {}
            for t in range(self.num_tiers):
                c = tier_list.count(t)
                if c:
                    tiers[t] = c
        return self._launch_run(batch, ctx0, k, grow, tiers, plan.revise_at_s, now)

    def _launch_run(self, batch: list[RequestState], ctx0: int, k: int, grow: list, tiers: dict[int, int],
                    revise: float, now: float) -> bool:
        """Start the decode run of `batch` (running decodes, checked): `ctx0` = Σ (computed + 1), `k` the
        iterations allowed by completions and the plan, `grow` (request, blocks) for its first iteration."""
        b = len(batch)
        bs = self.block_size
        inline_hold = self._decode_hold_inline
        # Blocks for the first iteration, as `_allocate` would give them (its checks hold for running decodes).
        if grow:
            free = self.free_blocks
            for r, need in grow:
                if need > free:
                    raise PolicyError(f"{self.policy.name}: request {r.id} needs {need} KV blocks, {free} free")
                free -= need
                r.num_blocks += need
            self.free_blocks = free
        used = self.total_blocks - self.free_blocks
        if used > self.max_used_blocks:
            self.max_used_blocks = used
        if b > self.token_budget:
            raise PolicyError(f"{self.policy.name}: batch of {b} tokens > token budget {self.token_budget}")
        # After this iteration's blocks every request holds ≥ c + 1 tokens' worth, so each of the next k − 1
        # iterations adds at most ceil((k − 1) / bs) blocks per request: when even that fits, k stands.
        if k > 1 and (not inline_hold or b * (-(-(k - 1) // bs)) > self.free_blocks):
            k = self._kv_bound(batch, k, bs)
        base = self.predictor.decode_base_time(b)
        coef = self.predictor.decode_context_coef_s
        scaled = self._scaled
        ends = []
        t = now
        busy = 0.0
        if not scaled and revise == _REVISE_AT_S:      # the usual case: the loop below without its two tests
            for j in range(k):
                dt = base + coef * (ctx0 + b * j)
                t = t + dt
                busy += dt
                ends.append(t)
        else:
            first = self.iterations     # the index stepping gives iteration 0 of the run
            for j in range(k):
                dt = base + coef * (ctx0 + b * j)     # the same arithmetic as a single decode step
                if scaled:
                    dt = self._scale(dt, first + j)
                t = t + dt
                busy += dt
                ends.append(t)
                if t >= revise:      # the policy re-plans after the iteration that crosses its revision point
                    break
        self.iterations += len(ends)
        self.busy_s += busy
        self._run = DecodeRun(batch, now, ends, tiers)      # KV block-seconds are charged as it is applied
        self._version += 1
        self.loop.at(ends[-1], RANK_ITERATION_END, self._end_run, self._version)
        return True

    def _kv_bound(self, batch: list[RequestState], k: int, bs: int) -> int:
        """Largest k' ≤ k such that iterations 1..k'-1 find the KV blocks they need (iteration 0's are held)."""
        free = self.free_blocks

        def extra(kk: int) -> int:
            total = 0
            for r in batch:
                over = r.num_computed_tokens + kk - r.num_blocks * bs
                if over > 0:
                    total += -(-over // bs)
            return total

        if extra(k) <= free:
            return k
        lo, hi = 1, k          # extra(lo) == 0 ≤ free; extra(hi) > free
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if extra(mid) <= free:
                lo = mid
            else:
                hi = mid
        return lo

    def _apply_run(self, run: DecodeRun, upto: int, in_flight: bool, finished: list | None = None) -> None:
        """Apply the run's pending checkpoints, then iterations … upto-1 (`in_flight`: the next one has
        started, so its blocks are held), to every request in the run, in one pass; with `finished`, append
        to it the requests whose last token that was (in batch order)."""
        pieces = run.pending
        if upto > (pieces[-1][0] if pieces else run.done):
            pieces.append((upto, in_flight))
        if not pieces:      # already applied (another replica read this one at the instant its run ended)
            if finished is not None:
                finished += [r for r in run.batch if r.num_generated >= r._request.output_tokens]
            return
        if len(pieces) > 1:
            self._apply_pieces(run, finished)
            return
        upto, in_flight = pieces.pop()
        ends = run.ends
        m0 = run.done
        used_before = self.total_blocks - self.free_blocks
        cnt = upto - m0
        last = ends[upto - 1]
        hists = self.tbt
        shared_max = self._add_shared_gaps(run, m0, upto)
        bs = self.block_size
        first_end = ends[m0]
        extra_tok = 1 if in_flight else 0
        free = self.free_blocks
        span = last - (ends[m0 - 1] if m0 else run.start_s)
        # As stepping would leave it: the start of the iteration in flight, else of the last one applied.
        scheduled_s = last if in_flight else (ends[upto - 2] if upto >= 2 else run.start_s)
        # LogHistogram.add inlined for each request's first gap; requests that ran the previous iteration
        # share it, so it is binned once (the same bins, counts and sums, added in the same order).
        h0 = hists[0]
        log_min, inv, min_value = h0._log_min, h0._inv_log_step, h0.min_value
        last_gap, last_bin = -1.0, 0
        # Counts of the current bin per tier, and each tier's running sum (added in the same order as
        # LogHistogram.add would), written back once per bin change and at the end.
        pend = [0] * len(hists)
        pend_any = False
        sums = [h.sum for h in hists]
        collect = finished is not None
        # At a run's end, what the next run of the same batch (less the finished) needs, gathered here.
        carry = collect and self._keeps_batch
        n_next, grow_next, ctx_next, rem_next = 0, [], 0, 1 << 62
        for r in run.batch:
            c = r.num_computed_tokens + cnt
            r.num_computed_tokens = c
            r.num_tokens += cnt
            generated = r.num_generated + cnt
            r.num_generated = generated
            r.attained_tokens += cnt
            r.service_tokens += cnt
            r.service_s += span
            r.last_scheduled_s = scheduled_s
            gap = first_end - r.last_token_s
            t = r.tier
            if gap != last_gap:
                if pend_any:
                    _flush_bin(hists, last_bin, pend)
                last_gap = gap
                last_bin = int((log(gap) - log_min) * inv) if gap > min_value else 0
            pend[t] += 1
            pend_any = True
            sums[t] += gap
            if shared_max > gap:
                gap = shared_max
            if gap > r.tbt_max_s:
                r.tbt_max_s = gap
            r.last_token_s = last
            need = -(-(c + extra_tok) // bs) - r.num_blocks
            if need > 0:
                r.num_blocks += need
                free -= need
            if collect:
                rem = r._request.output_tokens - generated
                if rem <= 0:
                    finished.append(r)  # type: ignore[union-attr]  # collect: finished is a list
                elif carry:
                    n_next += 1
                    ctx_next += c + 1
                    if rem < rem_next:
                        rem_next = rem
                    need = -(-(c + 1) // bs) - r.num_blocks
                    if need > 0:
                        grow_next.append((r, need))
        if carry:
            self._carry = (n_next, grow_next, ctx_next, rem_next)
        if pend_any:
            _flush_bin(hists, last_bin, pend)
        for h, total in zip(hists, sums):
            h.sum = total
        if free < 0:
            raise AssertionError(f"replica {self.index}: KV over capacity during a decode run")
        self.free_blocks = free
        used = self.total_blocks - free
        if used > self.max_used_blocks:
            self.max_used_blocks = used
        # Trapezoid over the applied iterations; exact for one iteration, as stepping charges it.
        self.kv_block_seconds += 0.5 * (used_before + used) * span
        run.done = upto
        run.applied_tokens = upto + extra_tok

    def _add_shared_gaps(self, run: DecodeRun, m0: int, upto: int) -> float:
        """Add the token gaps every request of the run shares (iterations m0+1 … upto-1 after their
        predecessors) to each tier's histogram; returns the largest (0 if none)."""
        shared_max = 0.0
        if upto - m0 > 1:
            segments: list[tuple[int, int, float]] = []
            shared_max = self._shared_segments(run, m0, upto, segments)
            for tier, c in run.tier_counts.items():
                h = self.tbt[tier]
                counts = h.counts
                for b, n, sm in segments:       # LogHistogram.add_bin(b, n * c, sm * c), inlined
                    counts[b] = counts.get(b, 0) + n * c
                    h.total += n * c
                    h.sum += sm * c
        return shared_max

    def _shared_segments(self, run: DecodeRun, m0: int, upto: int, segments: list[tuple[int, int, float]]) -> float:
        """Append to `segments` the shared gaps of iterations m0+1 … upto-1 (upto − m0 > 1) binned once each,
        as (bin, gaps, their sum) per run of equal bins (the bins `add` would give, one by one); returns the
        largest gap."""
        ends = run.ends
        h0 = self.tbt[0]
        log_min, inv, min_value = h0._log_min, h0._inv_log_step, h0.min_value
        shared_max = 0.0
        cur_b, n_b, sum_b = -1, 0, 0.0
        prev = ends[m0]
        for m in range(m0 + 1, upto):
            e = ends[m]
            gap = e - prev
            prev = e
            if gap > shared_max:
                shared_max = gap
            b = int((log(gap) - log_min) * inv) if gap > min_value else 0
            if b == cur_b:
                n_b += 1
                sum_b += gap
            else:
                if n_b:
                    segments.append((cur_b, n_b, sum_b))
                cur_b, n_b, sum_b = b, 1, gap
        segments.append((cur_b, n_b, sum_b))
        return shared_max

    def _apply_pieces(self, run: DecodeRun, finished: list | None) -> None:
        """`_apply_run` of each pending checkpoint in turn, fused into one pass over the batch: every
        quantity is computed with the same operations in the same order as applying them one by one (integer
        counts in any order)."""
        pieces = run.pending
        ends = run.ends
        m0 = run.done
        hists = self.tbt
        h0 = hists[0]
        log_min, inv, min_value = h0._log_min, h0._inv_log_step, h0.min_value
        spans: list[float] = []
        later_gaps: list[float] = []
        shared_max = self._add_shared_gaps(run, m0, pieces[0][0])    # the first piece's, before its requests'
        prev = m0
        for u, flying in pieces:
            if prev > m0:
                # A later piece's first gap is the same for every request (all emitted at ends[prev-1]).
                g = ends[prev] - ends[prev - 1]
                later_gaps.append(g)
                if g > shared_max:
                    shared_max = g
            spans.append(ends[u - 1] - (ends[prev - 1] if prev else run.start_s))
            prev = u
        upto, in_flight = pieces[-1]
        cnt = upto - m0
        last = ends[upto - 1]
        scheduled_s = last if in_flight else (ends[upto - 2] if upto >= 2 else run.start_s)
        # The shared gaps of later pieces do not depend on the request: their largest, for tbt_max.
        for p in range(1, len(pieces)):
            a, b = pieces[p - 1][0], pieces[p][0]
            for m in range(a + 1, b):
                g = ends[m] - ends[m - 1]
                if g > shared_max:
                    shared_max = g
        bs = self.block_size
        extra_tok = 1 if in_flight else 0
        # Tokens of the run each checkpoint covers (from the last one applied), and the blocks each adds.
        covered: list[int] = [u - m0 + (1 if flying else 0) for u, flying in pieces]
        covered_last = cnt + extra_tok
        grow = [0] * len(pieces)
        first_end = ends[m0]
        last_gap, last_bin = -1.0, 0
        # Counts of the current bin per tier, and each tier's running sum (added in the same order as
        # LogHistogram.add would), written back once per bin change and at the end.
        pend = [0] * len(hists)
        pend_any = False
        sums = [h.sum for h in hists]
        two = len(pieces) == 2          # the usual case (one deferred cut): its span loop unrolled
        span0 = spans[0]
        span1 = spans[1]
        collect = finished is not None
        carry = collect and self._keeps_batch     # as in `_apply_run`
        n_next, grow_next, ctx_next, rem_next = 0, [], 0, 1 << 62
        for r in run.batch:
            c0 = r.num_computed_tokens
            r.num_computed_tokens = c0 + cnt
            r.num_tokens += cnt
            generated = r.num_generated + cnt
            r.num_generated = generated
            r.attained_tokens += cnt
            r.service_tokens += cnt
            if two:
                r.service_s = r.service_s + span0 + span1
            else:
                service = r.service_s
                for span in spans:
                    service += span
                r.service_s = service
            r.last_scheduled_s = scheduled_s
            gap = first_end - r.last_token_s
            t = r.tier
            if gap != last_gap:
                if pend_any:
                    _flush_bin(hists, last_bin, pend)
                last_gap = gap
                last_bin = int((log(gap) - log_min) * inv) if gap > min_value else 0
            pend[t] += 1
            pend_any = True
            sums[t] += gap
            if shared_max > gap:
                gap = shared_max
            if gap > r.tbt_max_s:
                r.tbt_max_s = gap
            r.last_token_s = last
            blocks = r.num_blocks
            next_block = blocks * bs - c0 + 1     # tokens covered at which r needs its next block
            if next_block <= covered_last:
                p = 0
                while next_block <= covered_last:     # each block to the checkpoint that first covers it
                    while covered[p] < next_block:
                        p += 1
                    grow[p] += 1
                    next_block += bs
                blocks = -(-(c0 + covered_last) // bs)
                r.num_blocks = blocks
            if collect:
                rem = r._request.output_tokens - generated
                if rem <= 0:
                    finished.append(r)  # type: ignore[union-attr]  # collect: finished is a list
                elif carry:
                    n_next += 1
                    c = c0 + cnt
                    ctx_next += c + 1
                    if rem < rem_next:
                        rem_next = rem
                    need = -(-(c + 1) // bs) - blocks
                    if need > 0:
                        grow_next.append((r, need))
        if carry:
            self._carry = (n_next, grow_next, ctx_next, rem_next)
        if pend_any:
            _flush_bin(hists, last_bin, pend)
        for h, total in zip(hists, sums):
            h.sum = total
        self._add_later_pieces(run, later_gaps)
        free = self.free_blocks
        used_before = self.total_blocks - free
        for p in range(len(pieces)):
            free -= grow[p]
            if free < 0:
                raise AssertionError(f"replica {self.index}: KV over capacity during a decode run")
            used = self.total_blocks - free
            if used > self.max_used_blocks:
                self.max_used_blocks = used
            self.kv_block_seconds += 0.5 * (used_before + used) * spans[p]
            used_before = used
        self.free_blocks = free
        run.done = upto
        run.applied_tokens = upto + extra_tok
        pieces.clear()

    def _add_later_pieces(self, run: DecodeRun, later_gaps: list[float]) -> None:
        """The histogram part of the pending checkpoints after the first, as applying them in turn adds it:
        per piece its shared gaps, then every request's first gap (`later_gaps`: one value for all). Each
        tier's sum takes the same additions in the same order; the bin counts (integers) are gathered in runs
        of equal bins and added once per run."""
        pieces = run.pending
        if len(pieces) < 2:
            return
        hists = self.tbt
        h0 = hists[0]
        log_min, inv, min_value = h0._log_min, h0._inv_log_step, h0.min_value
        tiers: list[int] = []
        weights: list[int] = []               # requests of the run per tier
        sums: list[float] = []
        for tier, c in run.tier_counts.items():
            tiers.append(tier)
            weights.append(c)
            sums.append(hists[tier].sum)
        num_tiers = len(tiers)
        run_bins: list[int] = []              # runs of equal bins over all later pieces: bin, gaps per request
        run_gaps: list[int] = []
        cur_bin, cur_gaps = -1, 0
        segments: list[tuple[int, int, float]] = []
        for p in range(1, len(pieces)):
            a, b = pieces[p - 1][0], pieces[p][0]
            if b - a > 1:
                segments.clear()
                self._shared_segments(run, a, b, segments)
                for bn, n, sm in segments:    # LogHistogram.add_bin(bn, n * c, sm * c) per tier
                    for k in range(num_tiers):
                        sums[k] += sm * weights[k]
                    if bn == cur_bin:
                        cur_gaps += n
                    else:
                        if cur_gaps:
                            run_bins.append(cur_bin)
                            run_gaps.append(cur_gaps)
                        cur_bin, cur_gaps = bn, n
            g = later_gaps[p - 1]
            for k in range(num_tiers):        # c requests' first gaps, added one by one
                total = sums[k]
                for _i in range(weights[k]):
                    total += g
                sums[k] = total
            bn = int((log(g) - log_min) * inv) if g > min_value else 0
            if bn == cur_bin:
                cur_gaps += 1
            else:
                if cur_gaps:
                    run_bins.append(cur_bin)
                    run_gaps.append(cur_gaps)
                cur_bin, cur_gaps = bn, 1
        run_bins.append(cur_bin)
        run_gaps.append(cur_gaps)
        gaps = 0
        for n in run_gaps:
            gaps += n
        for k in range(num_tiers):
            h = hists[tiers[k]]
            c = weights[k]
            counts = h.counts
            for j in range(len(run_bins)):
                bn = run_bins[j]
                counts[bn] = counts.get(bn, 0) + run_gaps[j] * c
            h.total += gaps * c
            h.sum = sums[k]

    def _clear_carries(self) -> None:
        """Forget both carries before a pass sets them. A method, not two assignments in `_end_run`: a type
        checker would narrow `self._carry` to None there, which a compiled build checks at run time."""
        self._carry = self._held_carry = None

    def _end_run(self, version: int) -> None:
        if version != self._version:
            return
        run = self._run
        assert run is not None          # a current version means its run is in flight
        now = self.loop.now
        finished: list[RequestState] = []        # the executor owns the truth (true output lengths)
        self._clear_carries()
        self._apply_run(run, len(run.ends), False, finished)
        self._run = None
        if self._iteration_hook:
            self.policy.on_iteration_end(run.batch, len(run.ends), now - run.start_s, self.view)
        for r in finished:
            self._finish(r, now)
        self._settle_pauses()
        carry, self._carry = self._carry, None      # set by _apply_run (not narrowed: _clear_carries)
        if carry is None:
            self._start_next()
        elif not self._continue_run(run, carry, finished, now):
            if carry[0] and self.waiting:   # kept for the decode run after an admission-only iteration
                n, grow, ctx0, rem = carry
                self._held_carry = (self._running_epoch, n, grow, ctx0, rem, _less(run.tier_counts, finished))
                if self._admission_cap is not None and self._admit_waiting(carry, now):
                    return
            self._start_next()

    def _admissions(self, free: int, budget: int, num_seqs: int) -> list | None:
        """The waiting requests an `admits_waiting` policy admits with `free` blocks (the decodes' next ones
        taken), `budget` tokens and `num_seqs` requests scheduled: [(request, tokens, blocks)], in its order.
        None: a case the promise does not cover (the policy must plan)."""
        bs = self.block_size
        hold = self.policy.blocks_to_hold
        chunk_cap = self._admission_cap
        watermark = self.watermark_blocks
        max_seqs = self.max_num_seqs
        admitted = []
        for w in self.policy.order_waiting(self.waiting):
            if num_seqs >= max_seqs or budget <= 0:
                break
            if w.status != Status.WAITING or w.replica != self.index:
                return None
            n = w.num_tokens - w.num_computed_tokens
            if chunk_cap and n > chunk_cap:
                n = chunk_cap
            if n > budget:
                n = budget
            need = hold(w, n, bs) - w.num_blocks
            if need > free - watermark:
                break                   # the first that does not fit stops admission
            if need < 0 or n < 1:
                return None             # blocks or a chunk the plan path would treat otherwise
            admitted.append((w, n, need))
            free -= need
            budget -= n
            num_seqs += 1
        return admitted

    def _admit(self, admitted: list, now: float, pairs: float) -> tuple[int, float]:
        """Admit `admitted` (from `_admissions`) as `_allocate` does, in order; returns their prefill tokens
        and `pairs` (the batch's attention pairs before them) plus theirs, added in that order."""
        prefill_tokens = 0
        for w, n, need in admitted:
            w.last_scheduled_s = now
            prefill_tokens += n
            pairs += n * (w.num_computed_tokens + n * 0.5)
            w.num_blocks += need
            self._leave_waiting(w)
            w.status = Status.RUNNING
            self._join_running(w)
        self._admitted_all = False
        return prefill_tokens, pairs

    def _admit_waiting(self, sums: tuple, now: float) -> bool:
        """With every running request decoding and requests waiting: start the iteration an `admits_waiting`
        policy plans — the decodes, then the waiting requests it admits — as `_start_next` and `_allocate`
        would, from the sums the last pass gathered over the running requests (`sums`), when nothing is
        swapped, the cap and budget leave room, the decodes' blocks fit and at least one request is admitted;
        after a single Sarathi admission a chunk run may follow. False (nothing changed): plan instead."""
        n_dec, grow, ctx, rem_min = sums
        if not n_dec or self.swapped or self._swapped_in_waiting or n_dec != len(self.running):
            return False
        budget = self.token_budget - n_dec
        max_seqs = self.max_num_seqs
        if n_dec > max_seqs or budget < 0:
            return False                # not every decode is scheduled: the policy plans
        free = self.free_blocks
        for _, need in grow:
            free -= need
        if free < 0:
            return False                # the policy evicts: let it plan
        admitted = self._admissions(free, budget, n_dec)
        if not admitted:
            return False                # a decode-only plan (the policy repeats it), or not promised
        for _, _, need in admitted:
            free -= need
        order = self.policy.decode_batch(self.running)
        if order is None:
            return False
        # What `_allocate` does for this batch, in its order: blocks (all fit), the start, the admissions.
        for r, need in grow:
            r.num_blocks += need
        for r in order:
            r.last_scheduled_s = now
        batch = [(r, 1) for r in order]
        prefill_tokens, pairs = self._admit(admitted, now, 0.0)
        batch += [(w, n) for w, n, _ in admitted]
        self.free_blocks = free
        used = self.total_blocks - free
        if used > self.max_used_blocks:
            self.max_used_blocks = used
        w, n, _ = admitted[-1]
        if self._repeats_chunk:         # as `_allocate` classifies the batch
            self._decodes_then_prefill = len(admitted) == 1 and not (
                n == 1 and w.num_tokens - w.num_computed_tokens == 1 and w.num_generated > 0)
        dt = self.predictor.iteration_time(prefill_tokens, pairs, n_dec, ctx)
        if self._scaled:
            dt = self._scale(dt, self.iterations)
        dt += 0.0                       # no PCIe time: nothing swapped or preempted
        self._batch = batch
        self._batch_start_s = now
        self._account(dt)
        self._version += 1
        end = now + dt
        if (self._repeats_chunk and self._decodes_then_prefill and self.skip_ahead and rem_min > 1
                and self._chunks_start(batch, w.num_computed_tokens + n, n_dec, ctx, free, rem_min, now, dt, end)):
            return True
        self.loop.at(end, RANK_ITERATION_END, self._end_iteration, self._version)
        return True

    def _continue_run(self, run: DecodeRun, carry: tuple, finished: list[RequestState], now: float) -> bool:
        """After a decode run ends: start the next run from the policy's `decode_batch` — what `plan` would
        return — with the sums the run's last pass gathered over the requests still in it (`carry`), when
        nothing waits, they are all the running requests and their next blocks fit. False: plan instead."""
        n, grow, ctx0, rem = carry
        if not n or self.waiting or self.swapped or n != len(self.running):
            return False
        if grow:
            total = 0
            for _, need in grow:
                total += need
            if total > self.free_blocks:
                return False            # the policy evicts: let it plan
        batch = self.policy.decode_batch(self.running)
        if batch is None or n > self.max_num_seqs or n > self.token_budget:
            return False
        for r in batch:
            r.last_scheduled_s = now
        k = _MAX_REPEAT if self.skip_ahead else 1
        if rem < k:
            k = rem
        tiers = _less(run.tier_counts, finished)
        # `grow` is in the run's order, not the batch's: all of it fits, so the order changes nothing.
        return self._launch_run(batch, ctx0, k, grow, tiers, _REVISE_AT_S, now)

    def _continue_decodes(self, now: float, batch: list[tuple[RequestState, int]], held: tuple | None,
                          sums_next: tuple) -> bool:
        """After a general iteration (`batch`): when nothing waits and every running request is decoding,
        start the decode run of the policy's `decode_batch` — what `plan` would return — if their next
        blocks fit. False (nothing changed): plan instead. The sums come from the iteration's own pass
        (`sums_next`) when every running request was in it; when it only admitted new requests right after a
        decode run ended, the others' sums come from that run's last pass (`held`)."""
        running = self.running
        b = len(running)
        if not b or self.waiting or self.swapped or b > self.max_num_seqs or b > self.token_budget:
            return False
        bs = self.block_size
        k = _MAX_REPEAT if self.skip_ahead else 1
        if (held is not None and self._admitted_all and self._running_epoch == held[0] + len(batch)
                and b == held[1] + len(batch)):
            # Nothing but this batch joined or left since that run ended: its survivors are as it left them.
            _, _, grow, ctx0, rem, tiers = held
            grow = list(grow)
            total = 0
            for _, need in grow:
                total += need
            if rem < k:
                k = rem
            members = [r for r, _ in batch]
        elif sums_next[0] == b:
            # Every running request emitted in this iteration (it was in the batch): its pass has the sums.
            _, grow, ctx0, rem = sums_next
            total = 0
            for _, need in grow:
                total += need
            if rem < k:
                k = rem
            tiers = None
            members = None
        else:
            grow = []
            total = 0
            ctx0 = 0
            tiers = None
            members = running
        for r in members or ():
            c = r.num_computed_tokens
            generated = r.num_generated
            if generated == 0 or r.num_tokens - c != 1:
                return False            # a prefill still runs: the policy plans it
            need = -(-(c + 1) // bs) - r.num_blocks
            if need > 0:
                grow.append((r, need))
                total += need
            ctx0 += c + 1
            rem = r._request.output_tokens - generated
            if rem < k:
                k = rem
        if total > self.free_blocks:
            return False                # the policy evicts: let it plan
        order = self.policy.decode_batch(running)
        if order is None:
            return False
        for r in order:
            r.last_scheduled_s = now
        if self.num_tiers == 1:
            tiers = {0: b}
        else:
            tier_list = [r.tier for r in (running if members is None else members)]
            counts = dict(tiers) if tiers is not None else {}
            for t in range(self.num_tiers):
                c = tier_list.count(t)
                if c:
                    counts[t] = counts.get(t, 0) + c
            tiers = {t: counts[t] for t in range(self.num_tiers) if counts.get(t)}
        return self._launch_run(order, ctx0, k, grow, tiers, _REVISE_AT_S, now)

    def _truncate_run(self, now: float, defer: bool = False) -> None:
        """End the current run after the iteration in flight at `now` (it cannot be interrupted).

        The state is brought up to now; with `defer` (a new request queued: nothing reads the running
        requests before the run ends) only a checkpoint is recorded, applied in the run's next pass.
        """
        run = self._run
        assert run is not None
        ends = run.ends
        if defer:
            j = self._ended_by(run, now)
            if j > (run.pending[-1][0] if run.pending else run.done):
                run.pending.append((j, j < len(ends)))
            keep = j + 1
        else:
            self.sync()
            keep = run.done + 1
        if keep < len(ends):
            self.busy_s -= ends[-1] - ends[keep - 1]
            self.iterations -= len(ends) - keep
            del ends[keep:]
            self._version += 1
            self.loop.at(ends[-1], RANK_ITERATION_END, self._end_run, self._version)

    # ----- used by live migration (the simulator's migration executor) -----
    def in_flight(self, state: RequestState) -> bool:
        """True if `state` is part of the iteration (or decode run) executing now."""
        if self._run is not None:
            return state in self._run.batch
        if self._chunks is not None:
            return any(r is state for r, _ in self._chunks.batch)
        return any(r is state for r, _ in self._batch)

    def pause(self, state: RequestState, on_paused: Callable[[bool], None]) -> None:
        """Stop scheduling a running request once the iteration in flight ends; its KV blocks stay held.

        `on_paused(True)` fires when it is paused; `on_paused(False)` if it finished, was preempted, or
        left this replica first (the migration then aborts and nothing is lost).
        """
        self._flush()
        if state.status != Status.RUNNING or state.replica != self.index:
            on_paused(False)
            return
        if not self.in_flight(state):
            self._pause_now(state)
            on_paused(True)
            self.poke()                 # the running set changed: the policy must see it, as stepping would
            return
        self._pause_requests.append((state, on_paused))
        if self._run is not None:
            self._truncate_run(self.loop.now)

    def _pause_now(self, state: RequestState) -> None:
        self._leave_running(state)
        state.status = Status.MIGRATING
        self.paused.append(state)

    def _settle_pauses(self) -> None:
        if not self._pause_requests:
            return
        pending, self._pause_requests = self._pause_requests, []
        for state, cb in pending:
            ok = state.status == Status.RUNNING and state.replica == self.index
            if ok:
                self._pause_now(state)
            cb(ok)

    def release_paused(self, state: RequestState) -> None:
        """Migration committed: the paused request leaves; its blocks here are freed."""
        self._flush()
        self.paused.remove(state)
        self.free_blocks += state.num_blocks
        state.num_blocks = 0
        self.policy.on_migrate_out(state, self.view)
        self.poke()

    def resume_paused(self, state: RequestState) -> None:
        """Migration aborted: the paused request runs here again, KV intact."""
        self._flush()
        self.paused.remove(state)
        state.status = Status.RUNNING
        self._join_running(state)
        self.poke()

    def reserve_blocks(self, n: int) -> bool:
        """Hold n free blocks for an incoming migration (Llumnix pre-allocates on the destination).

        A decode run in flight was sized on the current free blocks, so it is cut to the iteration in flight.
        """
        if self._run is not None:
            self._truncate_run(self.loop.now)
        elif self._chunks is not None:
            self._chunks_dissolve()
        if n > self.free_blocks - self.watermark_blocks:
            return False
        self.free_blocks -= n
        self.reserved_blocks += n
        return True

    def unreserve_blocks(self, n: int) -> None:
        self._flush()
        self.free_blocks += n
        self.reserved_blocks -= n
        self.poke()

    def adopt(self, state: RequestState, reserved: int) -> None:
        """Migration committed: take over a running request whose KV was copied into `reserved` blocks."""
        self._flush()
        self.reserved_blocks -= reserved
        state.num_blocks = reserved
        state.replica = self.index
        state.status = Status.RUNNING
        state.num_migrations += 1
        self._join_running(state)
        self.policy.on_migrate_in(state, self.view)
        self.poke()

    def withdraw_waiting(self, state: RequestState) -> None:
        """Take a queued request (no KV, or swapped) off this replica so it can be enqueued elsewhere."""
        self._flush()
        if state.status == Status.SWAPPED:
            self._leave_swapped(state)
            self._release_host_blocks(state)
        else:
            self._leave_waiting(state)
        state.replica = -1
        self.policy.on_migrate_out(state, self.view)
