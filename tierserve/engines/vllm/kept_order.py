"""The driver's kept path (`PolicyDriver.incremental`): the waiting states held in the policy's fixed key order
between steps (inserted, removed and re-keyed as requests arrive, run, are evicted, delivered or relegated),
the plan made over that kept list in O(running + admitted + changes), and a `repeatable` plan reused without
asking the policy (`_repeat_step`). A mixin of `PolicyDriver` (driver.py), whose state it reads and writes;
it owns no state of its own and never touches the request accounting (accounting.py)."""
from __future__ import annotations

import math
import operator
from bisect import bisect_left
from typing import Sequence

from tierserve.core import RequestState, Status
from tierserve.engines.vllm.step_state import StepHints


class KeptWaitingOrder:
    """`PolicyDriver`'s kept waiting order and the plan step made on it (see the module docstring)."""

    def _insert(self, s: RequestState, req) -> None:
        key = self._waiting_key(s)
        i = bisect_left(self._wkeys, key)
        self._wkeys.insert(i, key)
        self._wstates.insert(i, s)
        self._wreqs.insert(i, req)
        self._wkey_of[s.id] = key
        self._repeat = None                           # the waiting order changed: the policy plans again

    def _remove(self, s: RequestState) -> None:
        key = self._wkey_of.pop(s.id, None)
        if key is None:
            return
        i = bisect_left(self._wkeys, key)         # keys end in the state id: unique, so this is its slot
        del self._wkeys[i]
        del self._wstates[i]
        del self._wreqs[i]
        self._repeat = None

    def _rekey(self, s: RequestState) -> None:
        """A waiting state's fields changed: move it if its key did."""
        old = self._wkey_of.get(s.id)
        if old is not None and self._waiting_key(s) != old:
            req = self._req[s.id]
            self._remove(s)
            self._insert(s, req)

    def requeued(self, req) -> None:
        """vLLM put `req` back in its waiting queue by a path without a hook here (a resumed streaming session)."""
        s = self.states.get(req.request_id)
        if s is None or not self.incremental or s.id in self._wkey_of:
            return
        self._sync(s, req, False)
        self._insert(s, req)

    def _order_waiting_kept(self, waiting):
        """Inside the plan, the view's waiting queue is the kept list, already in key order."""
        ws = self._wstates
        if self._planning and len(waiting) == len(ws) and (not ws or waiting[0] is ws[0]):
            return waiting
        return self._order_waiting(waiting)

    def _resumable_kept(self, view):
        """Inside the plan, `VLLMPolicy.resumable` (swapped, then waiting in policy order) is the kept list itself:
        v1 never swaps, and the plan only iterates it, so nothing is copied or re-sorted."""
        if self._planning and view is self.view and not self.replica.swapped:
            return self._wstates
        return self._resumable(view)

    def _plan_step_kept(self, running: Sequence, waiting: Sequence | None, free_blocks: int,
                        want_held: bool) -> StepHints:
        """`plan_step` on the kept waiting order: O(running + admitted + changes) per step."""
        states = self.states
        rep = self.replica
        kept = self._wkey_of
        block_size = rep.block_size
        running_status = Status.RUNNING
        rep.running = run_states = []
        for req in running:
            s = states[req.request_id]
            if s.id in kept:                    # vLLM admitted it last step
                self._remove(s)
            placeholders = req.num_output_placeholders       # `_sync(s, req, True)`, inline (every step)
            s.num_tokens = req.num_tokens_with_spec + placeholders
            s.num_computed_tokens = computed = req.num_computed_tokens
            s.num_generated = req.num_output_tokens + placeholders
            s.num_blocks = -(-computed // block_size)
            s.status = running_status
            run_states.append(s)
        wait_states = self._wstates
        if waiting is not None:                 # a caller's list (tests, other engines): must match the kept set
            get = states.get
            for req in waiting:
                s = get(req.request_id)
                if s is None:
                    self.admit(req)
                elif s.id not in kept:
                    self._sync(s, req, False)
                    self._insert(s, req)
            if len(waiting) != len(wait_states):
                raise RuntimeError(f"engine step {self.step + 1}: the engine reports {len(waiting)} waiting requests, "
                                   f"the driver holds {len(wait_states)} (a request left or entered the waiting "
                                   f"queue without the scheduler's hooks)")
        rep.free_blocks = free_blocks
        if self._repeat is not None:
            hints = self._repeat_step(running, run_states, wait_states, free_blocks, want_held)
            if hints is not None:
                return hints
        self._planning = True
        try:
            plan = self._plan()
        finally:
            self._planning = False
        # `_hints` and `_finish_hints` in one pass over the plan (same results)
        req_of = self._req
        last_plan = {}
        first = []                              # running requests the plan schedules, in plan order
        admit = []
        admit_states = []
        total = 0
        for s, n in plan.scheduled:
            req = req_of[s.id]
            last_plan[req.request_id] = n
            total += n
            if s.status == running_status:
                first.append(req)
            else:
                admit.append(req)
                admit_states.append(s)
        preempt = []
        if plan.preempt or len(first) != len(run_states):     # else every running request is scheduled: in order
            victims = {s.id for s, _ in plan.preempt}
            preempt = [req_of[s.id] for s, _ in plan.preempt if s.status == running_status]
            placed = {s.id for s, _ in plan.scheduled if s.status == running_status} | victims
            first += [req_of[s.id] for s in run_states if s.id not in placed]
        hints = StepHints(preempt, first, admit, [], total if total > 0 else rep.token_budget)
        if want_held:
            k = len(admit_states)
            if k <= len(wait_states) and all(map(operator.is_, admit_states, wait_states[:k])):
                hints.held = self._wreqs[k:]        # the plan admitted a prefix of the kept order (always, for
            else:                                   # the policies `fixed_waiting_key` accepts)
                admitted = {s.id for s in admit_states}
                hints.held = [r for s, r in zip(wait_states, self._wreqs) if s.id not in admitted]
        self._last_plan = last_plan
        if self.decision_log is not None:
            self._last_record = self._decision_record(hints, plan, run_states, wait_states, free_blocks)
        if (self.traits.steady and plan.repeatable and not plan.relegate and not admit
                and len(first) == len(run_states)):
            free_after = free_blocks
            for s, n in plan.scheduled:
                free_after -= -(-(s.num_computed_tokens + n) // block_size) - s.num_blocks
            self._repeat = (plan, tuple(first), hints.budget, last_plan, free_after, 1)
        return hints

    def _repeat_step(self, running: Sequence, run_states: list[RequestState], wait_states: list[RequestState],
                     free_blocks: int, want_held: bool) -> StepHints | None:
        """The previous plan again, without asking the policy, where the policy's promise (`BatchPlan.repeatable`:
        the same decode-only batch until an arrival, a completion, a KV shortfall, `max_repeat` or `revise_at_s`)
        and what the driver saw since then say the plan would be the same; else None.

        Since that plan the kept waiting order has not changed (no arrival, abort, eviction, re-queue or moved
        key: `_insert` and `_remove` clear `_repeat`); the engine runs the same requests in the same order (none
        finished or evicted), each again one decode token, whose new blocks fit; and the free blocks left after
        them are no more than that plan left, so the waiting request it could not admit (its need unchanged)
        still does not fit."""
        plan, reqs, budget, last_plan, free_after, uses = self._repeat
        if (len(running) != len(reqs) or not all(map(operator.is_, running, reqs)) or uses >= plan.max_repeat
                or (plan.revise_at_s != math.inf and self.replica.now >= plan.revise_at_s)):
            self._repeat = None
            return None
        block_size = self.replica.block_size
        needed = 0
        for s in run_states:
            computed = s.num_computed_tokens
            if s.num_tokens - computed != 1 or s.num_generated <= 0:
                self._repeat = None
                return None
            needed += -(-(computed + 1) // block_size) - s.num_blocks
        if needed > free_blocks or free_blocks - needed > free_after:
            self._repeat = None
            return None
        self._repeat = (plan, reqs, budget, last_plan, free_after, uses + 1)
        self.repeated_plans += 1
        self.step += 1
        self.planned_steps += 1
        self._last_plan = last_plan
        hints = StepHints([], list(reqs), [], self._wreqs[:] if want_held else [], budget)
        if self.decision_log is not None:
            self._plan_now = self.replica.now
            self._last_record = self._decision_record(hints, plan, run_states, wait_states, free_blocks)
        return hints
