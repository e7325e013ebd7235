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
"""
from __future__ import annotations

import importlib
import math
import operator
import time
from bisect import bisect_left
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from tierserve.core import (AllocationRule, ConfigError, PreemptMode, Request, RequestState, Status)
from tierserve.policies.local import LOCAL_POLICIES, LocalPolicy, PolicyError, ReplicaView
from tierserve.policies.local.traits import traits_of
from tierserve.policies.local.vllm import VLLMPolicy
from tierserve.engines.vllm.logs import DecisionLog, IterationLog, RequestLog
from tierserve.engines.vllm.mapping import request_meta
from tierserve.engines.vllm.predictor import make_predictor
from tierserve.engines.vllm.settings import EngineSettings


def make_policy(name: str, params: Mapping[str, Any] | None = None) -> LocalPolicy:
    """A registered policy by name, or
    `module:Class` of a LocalPolicy subclass; checked for vLLM v1."""
    params = dict(params or {})
    if ":" in name:
        module, _, cls_name = name.partition(":")
        try:
            cls = getattr(importlib.import_module(module), cls_name)
        except (ImportError, AttributeError) as exc:
            raise ConfigError("tierserve.policy", name, f"a registered name ({', '.join(LOCAL_POLICIES.names)}) "
                                                        f"or an importable module:Class ({exc})") from None
        if not (isinstance(cls, type) and issubclass(cls, LocalPolicy)):
            raise ConfigError("tierserve.policy", name, "a LocalPolicy subclass")
        try:
            policy = cls(**params)
        except TypeError as exc:
            raise ConfigError("tierserve.policy_params", params, f"parameters of {cls.__name__}: {exc}") from None
    else:
        try:
            policy = LOCAL_POLICIES.create(name, **params)
        except ConfigError as exc:
            if exc.field == "local_policy":
                raise ConfigError("tierserve.policy", name, f"{exc.allowed} (or module:Class of a LocalPolicy)") from None
            raise
    check_policy(policy)
    return policy


def check_policy(policy: LocalPolicy) -> None:
    """Refuse, naming the reason, a policy vLLM v1 cannot honour."""
    name = policy.name
    if policy.needs_oracle:
        raise ConfigError("tierserve.policy", name, "a policy without needs_oracle: a real engine never knows a "
                                                    "request's output length (the Oracle exists only in the simulator)")
    if policy.allocation != AllocationRule.PER_CHUNK:
        raise ConfigError("tierserve.policy", name, f"a policy with allocation PER_CHUNK: vLLM v1 allocates KV blocks "
                                                    f"per chunk only, and {name} declares {policy.allocation.name}")
    probe = RequestState(Request(-1, 0.0, 1, 1))
    if PreemptMode.RECOMPUTE not in policy.preempt_modes or policy.preempt_mode(probe) != PreemptMode.RECOMPUTE:
        raise ConfigError("tierserve.policy", name, "a policy that preempts by recompute: vLLM v1 has no swap "
                                                    "(set preempt_mode: recompute)")


def check_calibration(policy: LocalPolicy, exec_model_file: str | None) -> None:
    """Refuse at start, naming the way out, a policy that asks the execution-time predictor (`uses_predictor`)
    where the engine was given no fit of its own iterations: it would fail at its first question, mid-run."""
    if policy.uses_predictor and not exec_model_file:
        raise ConfigError("tierserve.exec_model_file", exec_model_file,
                          f"a fit of this engine's iterations, because {policy.name} asks the execution-time "
                          f"predictor (uses_predictor): run once with iteration_log (a policy that does not ask, "
                          f"e.g. vllm_priority), then `tierserve calibrate --iterations LOG --out fit.json`, and "
                          f"set exec_model_file")


def fixed_waiting_key(policy: LocalPolicy) -> Callable[[RequestState], Any] | None:
    """The key `policy.order_waiting` sorts by, where the driver can keep that order between steps; else None.

    What the policy promises is read from its traits (`tierserve.policies.local.traits`, the one place that
    infers promises, shared with the simulator's executor): a declared `waiting_order_key`, a plan that admits a
    prefix of that order, no hook that could change a state behind the driver's back. The driver adds one need
    of its own: its kept path stands in for vLLM v1's `resumable`, so the policy must use `VLLMPolicy`'s.
    vllm_priority, vllm_priority_sorted and llumlet without promotion: (tier, arrival, id), fixed at entry;
    vllm_edf: (prefill deadline, arrival, id). Policies without a key take the full path.
    """
    if getattr(type(policy), "resumable", None) is not VLLMPolicy.resumable or "resumable" in policy.__dict__:
        return None
    return traits_of(policy).fixed_waiting_key


@dataclass(slots=True)
class StepHints:
    """What vLLM's loop obeys this step (engine request objects, not states); `held` stays empty when
    `plan_step` is asked for no held-back list (the kept path's scheduler never moves those requests)."""

    preempt: list = field(default_factory=list)
    running: list = field(default_factory=list)
    admit: list = field(default_factory=list)
    held: list = field(default_factory=list)
    budget: int = 0


class EngineReplica:
    """The `ReplicaSource` a `ReplicaView` reads, filled from the engine each step."""

    def __init__(self, *, block_size: int, total_blocks: int, token_budget: int, max_num_seqs: int,
                 watermark_blocks: int, predictor, clock: Callable[[], float]) -> None:
        self.index = 0
        self.running: list[RequestState] = []
        self.waiting: list[RequestState] = []
        self.swapped: list[RequestState] = []        # v1 never swaps
        self.free_blocks = total_blocks
        self.total_blocks = total_blocks
        self.block_size = block_size
        self.watermark_blocks = watermark_blocks
        self.free_swap_blocks = 0
        self.token_budget = token_budget
        self.max_num_seqs = max_num_seqs
        self.swap_time_per_block_s = math.inf
        self.predictor = predictor
        self._clock = clock

    @property
    def now(self) -> float:
        return self._clock()


class PolicyDriver:
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

    # ----- requests -----
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

    # ----- the incremental path's waiting order -----
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

    # ----- one step -----
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
