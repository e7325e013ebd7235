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
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from tierserve.core import (AllocationRule, ConfigError, PreemptMode, Request, RequestState, Status)
from tierserve.policies.local import LOCAL_POLICIES, LocalPolicy, PolicyError, ReplicaView
from tierserve.engines.vllm.logs import DecisionLog, IterationLog, RequestLog, StepShape
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


@dataclass(slots=True)
class StepHints:
    """What vLLM's loop obeys this step (engine request objects, not states)."""

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


@dataclass(slots=True)
class _Pending:
    step: int
    sched_start: float
    shape: StepShape
    batch: list


class PolicyDriver:
    """Drives one `LocalPolicy` from inside an engine's scheduler (see the module docstring)."""

    def __init__(self, settings: EngineSettings, *, block_size: int, total_blocks: int, token_budget: int,
                 max_num_seqs: int, watermark_blocks: int = 0, clock: Callable[[], float] = time.time,
                 policy: LocalPolicy | None = None) -> None:
        self.settings = settings
        self.policy = policy if policy is not None else make_policy(settings.policy, settings.policy_params)
        if policy is not None:
            check_policy(policy)
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
        self._pending: deque[_Pending] = deque()
        self._busy_since: float | None = None         # end of the last step while requests remained
        self._last_plan: dict[str, int] = {}
        self._last_record: dict | None = None
        self._iteration_hook = type(self.policy).on_iteration_end is not LocalPolicy.on_iteration_end
        self._order_waiting = self.policy.order_waiting
        self._order_memo: tuple | None = None
        self.policy.order_waiting = self._order_waiting_memo     # this driver's own policy object
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

    # ----- one step -----
    def plan_step(self, running: Sequence, waiting: Sequence, free_blocks: int) -> StepHints:
        """The policy's plan for this step, as limits vLLM's loop obeys (module docstring)."""
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
        try:
            plan = self.policy.plan(self.view)
        except Exception as exc:
            raise PolicyError(f"policy {self.policy.name!r} failed to plan engine step {self.step + 1}: {exc}") from exc
        self.step += 1
        self.planned_steps += 1
        now = rep.now
        for s, reason in plan.relegate:
            if s.relegated_s < 0:
                s.relegated_s = now
                s.relegation_reason = reason
                self.relegations += 1
                self.policy.on_relegate(s, self.view)
        req_of = self._req
        hints = StepHints()
        victims = {s.id for s, _ in plan.preempt}
        hints.preempt = [req_of[s.id] for s, _ in plan.preempt if s.status == Status.RUNNING]
        first = [s for s, _ in plan.scheduled if s.status == Status.RUNNING]
        placed = {s.id for s in first} | victims
        hints.running = [req_of[s.id] for s in first] + [req_of[s.id] for s in run_states if s.id not in placed]
        admit = [s for s, _ in plan.scheduled if s.status != Status.RUNNING]
        hints.admit = [req_of[s.id] for s in admit]
        admitted = {s.id for s in admit}
        hints.held = [req_of[s.id] for s in self._waiting_order(wait_states) if s.id not in admitted]
        total = plan.num_tokens
        hints.budget = total if total > 0 else rep.token_budget
        self._last_plan = {req_of[s.id].request_id: n for s, n in plan.scheduled}
        if self.decision_log is not None:
            self._last_record = {
                "step": self.step, "t": round(now, 6), "policy": self.policy.name, "budget": hints.budget,
                "running": len(run_states), "waiting": len(wait_states), "free_blocks": free_blocks,
                "plan": [[req_of[s.id].request_id, n] for s, n in plan.scheduled],
                "preempt": [r.request_id for r in hints.preempt],
                "relegate": [req_of[s.id].request_id for s, _ in plan.relegate],
                "admit": [r.request_id for r in hints.admit]}
        return hints

    def record_schedule(self, num_scheduled: Mapping[str, int], requests: Mapping[str, Any],
                        engine_preempted: Sequence[str], sched_start: float) -> None:
        """What vLLM scheduled this step (after its loop advanced num_computed_tokens)."""
        shape = StepShape(preemptions=len(engine_preempted))
        batch = []
        states = self.states
        placeholders = self.max_output_placeholders
        for rid, n in num_scheduled.items():
            req = requests[rid]
            if req.num_output_placeholders > placeholders:    # > 0 only under vLLM's AsyncScheduler
                placeholders = req.num_output_placeholders
            before = req.num_computed_tokens - n
            shape.add(n, before, n == 1 and before >= max(req.num_prompt_tokens, req.num_tokens - 1))
            s = states.get(rid)
            if s is not None:
                s.service_tokens += n
                s.last_scheduled_s = self.replica.now
                if self.request_log is not None and s.id not in self._first_scheduled:
                    self._first_scheduled[s.id] = s.last_scheduled_s
                c = before + n
                prompt = s.prompt_tokens
                if before < prompt:             # prompt tokens computed for the first time count once
                    attained_prompt = s.attained_tokens - s.num_generated
                    if c > attained_prompt:
                        s.attained_tokens += min(c, prompt) - attained_prompt
                batch.append(s)
        self.max_output_placeholders = placeholders
        agree = dict(num_scheduled) == self._last_plan
        if not agree:
            self.disagreements += 1
        if self.decision_log is not None and self._last_record is not None:
            rec = self._last_record
            rec["engine"] = [[rid, n] for rid, n in num_scheduled.items()]
            rec["engine_preempt"] = list(engine_preempted)
            rec["agree"] = agree
            self.decision_log.write(rec)
            self._last_record = None
        if shape.num_requests:
            self._pending.append(_Pending(self.step, sched_start, shape, batch))

    def engine_preempted(self, req, planned: bool) -> None:
        """vLLM evicted `req` (recompute): planned by the policy, or its own fallback."""
        if not planned:
            self.engine_preemptions += 1
        s = self.states.get(req.request_id)
        if s is None:
            return
        s.num_preemptions += 1
        self._sync(s, req, False)               # progress as vLLM reset it (recompute: nothing computed)
        self.policy.on_preempt(s, PreemptMode.RECOMPUTE, self.view)

    def record_output(self, t_end: float, requests: Mapping[str, Any], busy_after: bool) -> None:
        """The oldest scheduled step's output arrived at `t_end` (perf_counter seconds)."""
        if not self._pending:
            self._busy_since = t_end if busy_after else None
            return
        p = self._pending.popleft()
        start = self._busy_since if self._busy_since is not None else p.sched_start
        measured = t_end - start
        self._busy_since = t_end if busy_after else None
        now = self.replica.now
        for s in p.batch:
            s.service_s += measured
            req = self._req.get(s.id)
            if req is not None:
                self._deliver(s, req, now)
        if self.iteration_log is not None:
            self.iteration_log.write(p.step, p.shape, measured)
            if not busy_after:
                self.iteration_log.file.flush()    # idle: the log is complete up to now
        if self._iteration_hook:
            self.policy.on_iteration_end(p.batch, 1, measured, self.view)

    def _deliver(self, s: RequestState, req, now: float) -> None:
        """Record the output tokens the engine delivered since the last look (timestamps, attained work)."""
        done = self._delivered.get(s.id, 0)
        out = req.num_output_tokens
        if out <= done:
            return
        self._delivered[s.id] = out
        for _ in range(out - done):
            s.attained_tokens += 1
            if s.first_token_s < 0:
                s.first_token_s = now
            else:
                gap = now - s.last_token_s
                if gap > s.tbt_max_s:
                    s.tbt_max_s = gap
                if self.request_log is not None:
                    self._gaps.setdefault(s.id, []).append(gap)
            s.last_token_s = now

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
