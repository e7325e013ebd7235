# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""Iteration execution: ask the policy for a plan, validate and allocate it, time it, and apply its end.

Owns: `_start_next` (plan → relegations, preemptions, blocks, time), `_allocate` (the plan checked against
memory and batch limits), `_end_iteration` (every request's progress, tokens and gaps), `_after_iteration`
(finishes, pauses, and which step follows: a promised decode run, chunk or admission, else a plan),
`_continue_chunk` (the next chunk a `repeats_prefill_chunk` policy promises) and `_finish`.
May not touch: a run's own arithmetic (decode_runs.py, chunk_runs.py), queue counters other than through
the `_join_*` / `_leave_*` moves of replica_state.py.
"""
from __future__ import annotations

from tierserve.core import RequestState, Status
from tierserve.policies.local.base import PolicyError
from tierserve.sim.chunk_runs import ChunkRuns
from tierserve.sim.preemption import apply_preemptions, apply_relegations
from tierserve.sim.replica_state import RANK_ITERATION_END
from tierserve.sim.runs import NextSums, TokenGaps, emit_token


class Iterations(ChunkRuns):
    """The replica's planned iterations (module docstring)."""

    def _start_next(self) -> None:
        now = self.loop.now
        plan = self.policy.plan(self.view)
        if plan.relegate:
            apply_relegations(self, plan, now)
        # Only a preemption or a request whose KV is in host memory costs PCIe time.
        swap_s = (apply_preemptions(self, plan) if plan.preempt or self.swapped or self._swapped_in_waiting
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
        # Each gap binned as LogHistogram.add would, the sums added in the same order (`TokenGaps`).
        gaps = TokenGaps(hists)
        prefilling = False                      # some request still has prompt (or recompute) to run
        # Over the requests that emitted a token and go on decoding: what their next decode needs (the
        # sums `_continue_decodes` and `_continue_chunk` start from): count, blocks, Σ (computed + 1), min rest.
        bs = self.block_size
        gather = self._keeps_batch or self._repeats_chunk
        nxt = NextSums()
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
                rem = emit_token(r, c, now, gaps)
                if rem <= 0:
                    finished.append(r)  # type: ignore[union-attr]  # collect: finished is a list
                elif gather:
                    nxt.add(r, c, r.num_blocks, bs, rem)
            else:
                prefilling = True
        gaps.close()
        batch, self._batch = self._batch, []
        if self._iteration_hook:
            self.policy.on_iteration_end([r for r, _ in batch], 1, dt, self.view)
        self._after_iteration(now, batch, finished, prefilling, nxt.count, nxt.grow, nxt.ctx, nxt.rem_min)

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
        dt = self._start_unplanned(batch, free, prefill_tokens, pairs, num_decodes, ctx, now)
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


    def _start_unplanned(self, batch: list[tuple[RequestState, int]], free: int, prefill_tokens: int, pairs: float,
                         num_decodes: int, ctx: int, now: float) -> float:
        """Start `batch` — a promised iteration with prefill tokens, its blocks given (`free` left) — as
        `_start_next` starts a plan's: the time (no PCIe: nothing swapped or preempted), the statistics, the
        batch in flight. Returns its duration; the caller schedules its end."""
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
        return dt

    def _finish(self, r: RequestState, now: float) -> None:
        self._leave_running(r)
        self.free_blocks += r.num_blocks
        r.num_blocks = 0
        r.status = Status.FINISHED
        r.finish_s = now
        self.policy.on_finish(r, self.view)
        for listener in self._queue_listeners:
            listener.finished(r)
        self.on_finish(r)

