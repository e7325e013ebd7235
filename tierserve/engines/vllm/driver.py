"""What a tierserve `LocalPolicy` decides inside vLLM v1, and how vLLM is made to follow it.

Every engine step, before vLLM's own scheduling loop runs, `PolicyDriver.plan_step`:
  1. brings one `RequestState` per engine request up to date (known and computed tokens, blocks held, status);
  2. builds the simulator's `ReplicaView` over them and the KV manager's free blocks;
  3. calls `policy.plan(view)` — the very call the simulator's executor makes — and returns `StepHints`:
       preempt   the plan's victims; the scheduler evicts them (v1: recompute) before its loop, as the
                 simulator does before a batch;
       running   the service order: running requests the plan schedules, in plan order, then the rest;
       admit     the only waiting requests vLLM may admit this step, in plan order (the rest are held back
                 for the step, in `policy.order_waiting` order);
       budget    the plan's token total (Niyama sizes it by deadline slack), or the configured budget when
                 the plan schedules nothing;
     and applies the plan's relegations to the states (`relegated_s`, reason, `on_relegate`): the request
     stays queued and finishes, as in the simulator.
Where the policy orders the waiting queue by a key fixed while a request waits (`fixed_waiting_key`:
vllm_priority, vllm_priority_sorted, llumlet without promotion, vllm_edf), the driver keeps the waiting states in
that order between steps, updated on arrival, admission (seen as running), preemption, delivered tokens,
relegation and finish, and the scheduler hides the held-back requests from vLLM's loop without moving them: a step
costs O(running + admitted + changes), and its plan is the full path's (`incremental_waiting: false`), which
re-reads and re-sorts the whole waiting queue every step (any other policy takes that path). On that kept path a
plan the policy marks `repeatable` (decode-only, nothing admissible) is reused without asking the policy while
nothing it depends on changes (`_repeat_step`), as the simulator runs such a batch ahead; inside a plan,
`policy.resumable` returns the kept list itself, uncopied.
vLLM then runs its loop — allocation, prefix caching, the KV blocks themselves — inside those limits. If it
still runs short of blocks it evicts the tail of the service order (v1's rule); the decision log records the
plan, what vLLM scheduled, and whether they agreed.

Engine requests are read duck-typed (vLLM's `Request`): request_id, priority, arrival_time (s, epoch),
sampling_params.extra_args, max_tokens, num_prompt_tokens, num_output_tokens, num_tokens_with_spec,
num_output_placeholders, num_computed_tokens. Nothing here imports vLLM.

The driver in rooms: this module keeps the driver's state, admission and the full path's plan step;
`kept_order.py` the kept path (the waiting order between steps, its plan step, `_repeat_step`);
`accounting.py` what vLLM then did (the scheduled batch, evictions, measured steps, delivered tokens,
finished requests and the logs); `policy_check.py` which policies may run and how one is made;
`step_state.py` `StepHints` and the `EngineReplica` the view reads.
"""
from __future__ import annotations

import operator
import time
from collections import deque
from typing import Any, Callable, Sequence

from tierserve.core import Request, RequestState, Status
from tierserve.policies.local import LocalPolicy, PolicyError, ReplicaView
from tierserve.policies.local.traits import traits_of
from tierserve.engines.vllm.accounting import StepAccounting
from tierserve.engines.vllm.kept_order import KeptWaitingOrder
from tierserve.engines.vllm.logs import DecisionLog, IterationLog, RequestLog
from tierserve.engines.vllm.mapping import request_meta
from tierserve.engines.vllm.policy_check import (check_calibration, check_policy, fixed_waiting_key,  # noqa: F401
                                                 make_policy)
from tierserve.engines.vllm.predictor import make_predictor
from tierserve.engines.vllm.settings import EngineSettings
from tierserve.engines.vllm.step_state import EngineReplica, StepHints


class PolicyDriver(KeptWaitingOrder, StepAccounting):
    """Drives one `LocalPolicy` from inside an engine's scheduler (see the module docstring)."""

    def __init__(self, settings: EngineSettings, *, block_size: int, total_blocks: int, token_budget: int,
                 max_num_seqs: int, watermark_blocks: int = 0, clock: Callable[[], float] = time.time,
                 policy: LocalPolicy | None = None, incremental: bool | None = None) -> None:
        """`incremental`: keep the waiting order between steps (None: as `settings.incremental_waiting` says,
        where the policy's key allows it; False: the full path, e.g. where vLLM queues requests elsewhere)."""
        self.settings = settings
        self.policy = policy if policy is not None else make_policy(settings.policy, settings.policy_params)
        if policy is not None:
            check_policy(policy)
        check_calibration(self.policy, settings.exec_model_file)
        if self.policy.uses_watermark:
            watermark_blocks = max(watermark_blocks, int(settings.watermark_fraction * total_blocks))
        self.replica = EngineReplica(block_size=block_size, total_blocks=total_blocks, token_budget=token_budget,
                                     max_num_seqs=max_num_seqs, watermark_blocks=watermark_blocks,
                                     predictor=make_predictor(settings.exec_model_file), clock=clock)
        self.view = ReplicaView(self.replica)
        self.states: dict[str, RequestState] = {}     # engine request id -> state (live requests)
        self._req: dict[int, Any] = {}                # state id -> engine request
        self._delivered: dict[int, int] = {}          # state id -> output tokens seen delivered
        self._next_id = 0
        self.finishes: dict[str, int] = {}            # engine request id -> times finished (must be 1)
        self.step = 0
        self.planned_steps = 0
        self.disagreements = 0
        self.engine_preemptions = 0                   # evictions vLLM made on its own (outside the plan)
        self.relegations = 0
        self.max_output_placeholders = 0              # tokens in flight seen on one request (async scheduling)
        # per scheduled step until its output arrives: (step, sched_start, batch states, `IterationLog.add` shape)
        self._pending: deque[tuple] = deque()
        self._busy_since: float | None = None         # end of the last step while requests remained
        self._last_plan: dict[str, int] = {}
        self._last_record: dict | None = None
        self.traits = traits_of(self.policy)           # what the policy promises (shared with the simulator)
        self._iteration_hook = self.traits.iteration_hook
        self._order_waiting = self.policy.order_waiting
        self._order_memo: tuple | None = None
        key = fixed_waiting_key(self.policy)
        wanted = settings.incremental_waiting if incremental is None else incremental
        self.incremental = bool(wanted) and key is not None
        self._waiting_key = key
        # incremental path: the waiting states, their keys and engine requests, in key order (parallel lists)
        self._wkeys: list = []
        self._wstates: list[RequestState] = []
        self._wreqs: list = []
        self._wkey_of: dict[int, Any] = {}            # state id -> its key, for states in those lists
        self._planning = False
        self._plan_now = 0.0
        # incremental path: the last plan while it may be repeated without asking the policy (`_repeat_step`):
        # (plan, engine requests in service order, the budget, `_last_plan`, free blocks left after it, uses)
        self._repeat: tuple | None = None
        self.repeated_plans = 0                       # steps that reused the previous plan that way
        if self.incremental:
            self._resumable = self.policy.resumable     # (only VLLMPolicy's plan has it: `fixed_waiting_key`)
            self.replica.waiting = self._wstates
            self.policy.order_waiting = self._order_waiting_kept   # this driver's own policy object
            self.policy.resumable = self._resumable_kept
        else:
            self.policy.order_waiting = self._order_waiting_memo
        self.iteration_log = IterationLog(settings.iteration_log) if settings.iteration_log else None
        self.decision_log = DecisionLog(settings.decision_log) if settings.decision_log else None
        self.request_log = RequestLog(settings.request_log) if settings.request_log else None
        self._gaps: dict[int, list[float]] = {}       # state id -> token gaps (s), kept only for the request log
        self._first_scheduled: dict[int, float] = {}  # state id -> first step start (epoch s), request log only

    def admit(self, req) -> RequestState:
        """A request entered the engine. Raises ConfigError when its tier/SLO fields are malformed."""
        sp = getattr(req, "sampling_params", None)
        meta = request_meta(int(req.priority), getattr(sp, "extra_args", None))
        r = Request(self._next_id, float(req.arrival_time), int(req.num_prompt_tokens),
                    int(req.max_tokens),            # an upper bound: the true length is never known here
                    meta.tier, meta.slo, meta.app)
        self._next_id += 1
        s = RequestState(r)
        s.dispatch_s = self.replica.now
        s.replica = 0
        self.states[req.request_id] = s
        self._req[s.id] = req
        self._sync(s, req, False)
        if self.incremental:
            self._insert(s, req)
        else:
            self.replica.waiting.append(s)
        self.policy.on_arrival(s, self.view)
        return s

    def _sync(self, s: RequestState, req, running: bool) -> None:
        generated = req.num_output_tokens + req.num_output_placeholders
        s.num_tokens = req.num_tokens_with_spec + req.num_output_placeholders
        s.num_computed_tokens = req.num_computed_tokens
        s.num_generated = generated
        s.num_blocks = -(-req.num_computed_tokens // self.replica.block_size) if running else 0
        s.status = Status.RUNNING if running else Status.WAITING

    def _order_waiting_memo(self, waiting):
        """The policy's `order_waiting`, remembered for the step: the held-back order reuses the plan's."""
        ordered = self._order_waiting(waiting)
        if isinstance(ordered, (list, tuple)):      # an iterator (a heap-fed order) is consumed by the plan
            self._order_memo = (waiting, ordered)
        return ordered

    def _waiting_order(self, wait_states: list[RequestState]) -> list[RequestState]:
        """`policy.order_waiting(wait_states)`, or the plan's own result for the same queue."""
        memo = self._order_memo
        self._order_memo = None
        if memo is not None:
            seen, ordered = memo
            if len(seen) == len(wait_states) and all(map(operator.is_, seen, wait_states)):
                return ordered
        return self._order_waiting(wait_states)

    def plan_step(self, running: Sequence, waiting: Sequence | None, free_blocks: int, *,
                  held: bool = True) -> StepHints:
        """The policy's plan for this step, as limits vLLM's loop obeys (module docstring). `waiting`: the
        engine's waiting requests; on the incremental path None (the driver's own kept order) or a check of it.
        `held=False` (incremental path only) leaves `hints.held` empty: a caller that never moves the held-back
        requests skips an O(waiting) copy."""
        if self.incremental:
            return self._plan_step_kept(running, waiting, free_blocks, held)
        states = self.states
        rep = self.replica
        sync = self._sync
        rep.running = run_states = []
        for req in running:
            s = states[req.request_id]
            sync(s, req, True)
            run_states.append(s)
        # A waiting request's progress changes only when it runs or is preempted, and both re-sync it (the
        # running loop above; `engine_preempted`): the rest are read as they are, not copied again each step.
        rep.waiting = wait_states = []
        waiting_status = Status.WAITING
        get = states.get
        for req in waiting:
            s = get(req.request_id)
            if s is None:                       # entered by a path that bypassed add_request
                s = self.admit(req)
                rep.waiting.pop()
            elif s.status is not waiting_status:
                sync(s, req, False)
            wait_states.append(s)
        rep.free_blocks = free_blocks
        plan = self._plan()
        hints, admit = self._hints(plan, run_states)
        admitted = {s.id for s in admit}
        hints.held = [self._req[s.id] for s in self._waiting_order(wait_states) if s.id not in admitted]
        self._finish_hints(hints, plan, run_states, wait_states, free_blocks)
        return hints

    def _plan(self):
        try:
            plan = self.policy.plan(self.view)
        except Exception as exc:
            raise PolicyError(f"policy {self.policy.name!r} failed to plan engine step {self.step + 1}: {exc}") from exc
        self.step += 1
        self.planned_steps += 1
        self._plan_now = now = self.replica.now
        for s, reason in plan.relegate:
            if s.relegated_s < 0:
                s.relegated_s = now
                s.relegation_reason = reason
                self.relegations += 1
                if self.incremental:
                    self._rekey(s)
                self.policy.on_relegate(s, self.view)
        return plan

    def _hints(self, plan, run_states: list[RequestState]) -> tuple[StepHints, list[RequestState]]:
        """Victims, service order and admissions from the plan (the held-back order is the caller's)."""
        req_of = self._req
        hints = StepHints()
        victims = {s.id for s, _ in plan.preempt}
        hints.preempt = [req_of[s.id] for s, _ in plan.preempt if s.status == Status.RUNNING]
        first = [s for s, _ in plan.scheduled if s.status == Status.RUNNING]
        placed = {s.id for s in first} | victims
        hints.running = [req_of[s.id] for s in first] + [req_of[s.id] for s in run_states if s.id not in placed]
        admit = [s for s, _ in plan.scheduled if s.status != Status.RUNNING]
        hints.admit = [req_of[s.id] for s in admit]
        return hints, admit

    def _finish_hints(self, hints: StepHints, plan, run_states: list[RequestState], wait_states: list[RequestState],
                      free_blocks: int) -> None:
        req_of = self._req
        total = plan.num_tokens
        hints.budget = total if total > 0 else self.replica.token_budget
        self._last_plan = {req_of[s.id].request_id: n for s, n in plan.scheduled}
        if self.decision_log is not None:
            self._last_record = self._decision_record(hints, plan, run_states, wait_states, free_blocks)

    def _decision_record(self, hints: StepHints, plan, run_states: list[RequestState],
                         wait_states: list[RequestState], free_blocks: int) -> dict:
        req_of = self._req
        return {"step": self.step, "t": round(self._plan_now, 6), "policy": self.policy.name, "budget": hints.budget,
                "running": len(run_states), "waiting": len(wait_states), "free_blocks": free_blocks,
                "plan": [[req_of[s.id].request_id, n] for s, n in plan.scheduled],
                "preempt": [r.request_id for r in hints.preempt],
                "relegate": [req_of[s.id].request_id for s, _ in plan.relegate],
                "admit": [r.request_id for r in hints.admit]}

    @property
    def planned_tokens(self) -> dict[str, int]:
        """This step's plan: engine request id -> tokens (the scheduler caps each running request at it)."""
        return self._last_plan

    def close(self) -> None:
        for log in (self.iteration_log, self.decision_log, self.request_log):
            if log is not None:
                log.close()

    def stats(self) -> dict[str, Any]:
        return {"policy": self.policy.name, "steps": self.step, "planned_steps": self.planned_steps,
                "disagreements": self.disagreements, "engine_preemptions": self.engine_preemptions,
                "relegations": self.relegations, "finished": sum(self.finishes.values()),
                "max_output_placeholders": self.max_output_placeholders,
                "finished_more_than_once": sorted(k for k, v in self.finishes.items() if v > 1)}
