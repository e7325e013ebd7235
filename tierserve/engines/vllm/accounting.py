"""The driver's accounting of what vLLM did: the batch it scheduled (the step's shape for the iteration log, the
plan/engine agreement for the decision log), its own evictions, the step's measured time when its output
arrives, the tokens delivered (timestamps, gaps, attained work) and requests leaving the engine (the request
log, the policy's `on_finish`). A mixin of `PolicyDriver` (driver.py), whose state it reads and writes; it
makes no plan."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from tierserve.core import PreemptMode, RequestState, Status


class StepAccounting:
    """`PolicyDriver`'s record of each step and request as the engine ran it (see the module docstring)."""

    def record_schedule(self, num_scheduled: Mapping[str, int], requests: Mapping[str, Any],
                        engine_preempted: Sequence[str], sched_start: float) -> None:
        """What vLLM scheduled this step (after its loop advanced num_computed_tokens)."""
        # the step's shape as the execution-time model sees it (the simulator's `Replica` computes the same):
        # prefill chunks' tokens and Σ chunk·(context + chunk/2); decodes and their context tokens
        prefill_tokens = decode_count = decode_context_sum = 0
        prefill_attn_pairs = 0.0
        batch = []
        states = self.states
        now = self.replica.now                  # one stamp for the step's batch, as the simulator stamps it
        first_scheduled = self._first_scheduled if self.request_log is not None else None
        placeholders = self.max_output_placeholders
        for rid, n in num_scheduled.items():
            req = requests[rid]
            if req.num_output_placeholders > placeholders:    # > 0 only under vLLM's AsyncScheduler
                placeholders = req.num_output_placeholders
            computed = req.num_computed_tokens
            before = computed - n
            if n == 1 and before >= max(req.num_prompt_tokens, req.num_tokens - 1):
                decode_count += 1
                decode_context_sum += computed
            else:
                prefill_tokens += n
                prefill_attn_pairs += n * (before + n * 0.5)
            s = states.get(rid)
            if s is not None:
                s.service_tokens += n
                s.last_scheduled_s = now
                if first_scheduled is not None and s.id not in first_scheduled:
                    first_scheduled[s.id] = now
                prompt = s.prompt_tokens
                if before < prompt:             # prompt tokens computed for the first time count once
                    attained_prompt = s.attained_tokens - s.num_generated
                    if computed > attained_prompt:
                        s.attained_tokens += (computed if computed < prompt else prompt) - attained_prompt
                batch.append(s)
        self.max_output_placeholders = placeholders
        agree = (num_scheduled if type(num_scheduled) is dict else dict(num_scheduled)) == self._last_plan
        if not agree:
            self.disagreements += 1
        if self.decision_log is not None and self._last_record is not None:
            rec = self._last_record
            rec["engine"] = [[rid, n] for rid, n in num_scheduled.items()]
            rec["engine_preempt"] = list(engine_preempted)
            rec["agree"] = agree
            self.decision_log.write(rec)
            self._last_record = None
        if num_scheduled:
            self._pending.append((self.step, sched_start, batch, (prefill_tokens, prefill_attn_pairs, decode_count,
                                  decode_context_sum, len(num_scheduled), len(engine_preempted))))

    def engine_preempted(self, req, planned: bool) -> None:
        """vLLM evicted `req` (recompute): planned by the policy, or its own fallback."""
        if not planned:
            self.engine_preemptions += 1
        s = self.states.get(req.request_id)
        if s is None:
            return
        s.num_preemptions += 1
        if self.incremental:
            self._remove(s)                     # (admitted last step and evicted before a plan saw it run)
        self._sync(s, req, False)               # progress as vLLM reset it (recompute: nothing computed)
        if self.incremental:
            self._insert(s, req)
        self.policy.on_preempt(s, PreemptMode.RECOMPUTE, self.view)

    def record_output(self, t_end: float, requests: Mapping[str, Any], busy_after: bool) -> None:
        """The oldest scheduled step's output arrived at `t_end` (perf_counter seconds)."""
        if not self._pending:
            self._busy_since = t_end if busy_after else None
            # vLLM's last busy step still reports work (finished ids not yet sent): the engine goes idle here
            if not busy_after and self.iteration_log is not None:
                self.iteration_log.flush()
            return
        step, sched_start, batch, shape = self._pending.popleft()
        busy_since = self._busy_since
        measured = t_end - (busy_since if busy_since is not None else sched_start)
        self._busy_since = t_end if busy_after else None
        now = self.replica.now
        req_of = self._req
        delivered = self._delivered
        for s in batch:
            s.service_s += measured
            req = req_of.get(s.id)
            if req is not None:
                out = req.num_output_tokens
                done = delivered.get(s.id, 0)
                if out > done:
                    self._book_tokens(s, done, out, now)
        if self.iteration_log is not None:
            self.iteration_log.add(step, shape, measured)
            if not busy_after:
                self.iteration_log.flush()      # idle: the log is complete up to now
        if self._iteration_hook:
            self.policy.on_iteration_end(batch, 1, measured, self.view)

    def _deliver(self, s: RequestState, req, now: float) -> None:
        """Record the output tokens the engine delivered since the last look (timestamps, attained work)."""
        done = self._delivered.get(s.id, 0)
        out = req.num_output_tokens
        if out > done:
            self._book_tokens(s, done, out, now)

    def _book_tokens(self, s: RequestState, done: int, out: int, now: float) -> None:
        """Output tokens done+1..out arrived at `now`."""
        self._delivered[s.id] = out
        # the tokens arrive together at `now`: the first a gap after the last token (or the first token), the
        # rest 0 s after it
        s.attained_tokens += out - done
        zeros = out - done - 1
        if s.first_token_s < 0:
            s.first_token_s = now
        else:
            gap = now - s.last_token_s
            if gap > s.tbt_max_s:
                s.tbt_max_s = gap
            if self.request_log is not None:
                self._gaps.setdefault(s.id, []).append(gap)
        if zeros and self.request_log is not None:
            self._gaps.setdefault(s.id, []).extend([0.0] * zeros)
        s.last_token_s = now
        if self.incremental and s.id in self._wkey_of:     # delivered after it was evicted (async scheduling)
            self._rekey(s)

    def finished(self, req) -> None:
        """`req` left the engine (finished, stopped or aborted)."""
        rid = req.request_id
        self.finishes[rid] = self.finishes.get(rid, 0) + 1
        s = self.states.pop(rid, None)
        if self.decision_log is not None:
            self.decision_log.write({"finished": rid, "step": self.step,
                                     "relegated": bool(s is not None and s.relegated)})
        if s is None:
            return
        if self.incremental:
            self._remove(s)
        now = self.replica.now
        self._deliver(s, req, now)
        self._req.pop(s.id, None)
        self._delivered.pop(s.id, None)
        s.status = Status.FINISHED
        s.finish_s = now
        s.num_blocks = 0
        if self.request_log is not None:
            sp = getattr(req, "sampling_params", None)
            self.request_log.write({
                "id": rid, "tier": s.tier, "xargs": dict(getattr(sp, "extra_args", None) or {}),
                "arrival_s": s.arrival_s, "queued_s": s.dispatch_s,
                "first_scheduled_s": self._first_scheduled.pop(s.id, -1.0),
                "first_token_s": s.first_token_s, "finish_s": now,
                "tokens": req.num_output_tokens, "relegated": s.relegated,
                "gaps_ms": [round(g * 1e3, 3) for g in self._gaps.pop(s.id, ())]})
        self.policy.on_finish(s, self.view)
