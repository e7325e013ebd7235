# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""Steady plans: the decode runs and admissions a policy promises, started without asking it for a plan.

Owns: starting a repeatable plan's run (`_start_run`), a run's end and what follows it (`_end_run`,
`_continue_run`), the decode run after a general iteration (`_continue_decodes`) and the admissions beside
running decodes (`_admissions`, `_admit`, `_admit_waiting`). Each of these reproduces what the policy's
`plan` returns under the promise its traits state (`policies/local/traits.py`); when a case falls outside
the promise it changes nothing and answers False, and the policy plans. May not touch: a run's arithmetic
(decode_runs.py), the policy's plan (it is never called here).
"""
from __future__ import annotations

from tierserve.core import BatchPlan, RequestState, Status
from tierserve.sim.iteration import Iterations
from tierserve.sim.replica_state import _MAX_REPEAT, _REVISE_AT_S, RANK_ITERATION_END
from tierserve.sim.runs import DecodeRun, _less


class SteadyPlans(Iterations):
    """The replica's steady plans (module docstring)."""

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
        k = plan.max_repeat if self.skip_ahead and self._steady else 1     # a withdrawn promise: one step
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
        w, n, _ = admitted[-1]
        if self._repeats_chunk:         # as `_allocate` classifies the batch
            self._decodes_then_prefill = len(admitted) == 1 and not (
                n == 1 and w.num_tokens - w.num_computed_tokens == 1 and w.num_generated > 0)
        dt = self._start_unplanned(batch, free, prefill_tokens, pairs, n_dec, ctx, now)
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

