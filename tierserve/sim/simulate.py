"""Build a cluster from its config, run a request stream through it, and return what happened."""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from itertools import islice
from operator import attrgetter, le
from typing import Sequence

from tierserve.core import ConfigError, Request, RequestState, Status
from tierserve.core.gc_tuning import collect_less_often
from tierserve.core.histogram import LogHistogram
from tierserve.hardware.specs import engine_defaults, get_model
from tierserve.hardware.memory import kv_bytes_per_token, kv_capacity_blocks, swap_time_s
from tierserve.policies.cluster import CLUSTER_POLICIES
from tierserve.policies.local import LOCAL_POLICIES
from tierserve.sim.cluster import Cluster
from tierserve.sim.config import ClusterConfig
from tierserve.sim.events import EventLoop
from tierserve.sim.replica import Replica

RANK_SPEED_CHANGE = 3     # after the iteration ends and arrivals of the same instant, as a migration's copy stages


@dataclass
class SimResult:
    """Everything a run produced. Every request that entered is in `states`, each with an outcome."""

    states: list[RequestState]
    reasons: dict[int, str]
    tbt_by_tier: list[LogHistogram]
    duration_s: float
    stats: dict[str, float] = field(default_factory=dict)
    streamed: bool = False          # requests went to a sink as they ended: `states` and `reasons` are empty


class RejectionRule:
    """Requests that can never be served on these replicas are rejected on arrival, with a reason.

    A request must fit alone: the blocks its policy makes it hold at its largest (prompt + output, or
    Orca's max_model_len reservation) within the capacity admission may use (total − watermark).
    """

    def __init__(self, policy, total_blocks: int, watermark_blocks: int, block_size: int, max_model_len: int,
                 max_prompt: int | None) -> None:
        self.policy = policy
        self.usable_blocks = total_blocks - watermark_blocks
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.max_prompt = max_prompt

    def __call__(self, r: Request, state: RequestState | None = None) -> str | None:
        """Why `r` can never be served (None if it can); `state`: its fresh serving state, if one exists."""
        total = r.prompt_tokens + r.output_tokens
        if total > self.max_model_len:
            return f"prompt+output = {total} tokens exceeds max_model_len {self.max_model_len}"
        need = self.policy.blocks_to_hold(RequestState(r) if state is None else state, total, self.block_size)
        if need > self.usable_blocks:
            return (f"needs {need} KV blocks of {self.block_size} tokens (prompt+output = {total} tokens) but a "
                    f"replica admits at most {self.usable_blocks} (KV capacity less the watermark)")
        if self.max_prompt is not None and total - 1 > self.max_prompt:
            return (f"prompt+output-1 = {total - 1} tokens cannot be (re)computed in one batch of at most "
                    f"{self.max_prompt} tokens (policy without chunked prefill)")
        return None


def build_replicas(cfg: ClusterConfig, loop: EventLoop, num_tiers: int, predictor=None, seed: int = 0
                   ) -> tuple[list[Replica], RejectionRule]:
    """`seed`: the run's seed, which also seeds the step-time factors when `step_time_variability` is on."""
    rc = cfg.replica
    if predictor is None:
        from tierserve.hardware.exec_model import make_execution_model
        predictor = make_execution_model(rc.model, rc.gpu, rc.tp, mode=rc.exec_mode,
                                         iteration_overhead_ms=rc.iteration_overhead_ms,
                                         exec_model_file=rc.exec_model_file)
    total_blocks = rc.num_blocks or kv_capacity_blocks(rc.model, rc.gpu, rc.tp, rc.gpu_memory_utilization, rc.block_size)
    swap_per_block = swap_time_s(1, rc.model, rc.gpu, rc.tp, rc.block_size, rc.pcie_efficiency)
    block_bytes = kv_bytes_per_token(rc.model, rc.tp) * rc.block_size        # per GPU: each holds its shard
    swap_blocks = int(rc.swap_space_gib * 2**30 // block_bytes)
    step_ratios = None
    if rc.step_time_variability:
        from tierserve.hardware.calibration import read_step_time_ratios
        step_ratios = read_step_time_ratios(rc.exec_model_file or "")   # config checked the file has them
    replicas = []
    for i in range(cfg.num_replicas):
        policy = LOCAL_POLICIES.create(cfg.local_policy, **cfg.local_policy_params)
        budget, seqs = ((engine_defaults(rc.gpu)) if policy.follows_engine_defaults
                        else (policy.default_token_budget, policy.default_max_num_seqs))
        replicas.append(Replica(
            i, policy, predictor, loop, total_blocks=total_blocks, block_size=rc.block_size,
            token_budget=rc.token_budget or budget, max_num_seqs=rc.max_num_seqs or seqs,
            watermark_blocks=int(rc.watermark_fraction * total_blocks) if policy.uses_watermark else 0,
            swap_time_per_block_s=swap_per_block, num_tiers=num_tiers,
            on_finish=lambda s: None, skip_ahead=cfg.skip_ahead, swap_blocks=swap_blocks,
            step_time_ratios=step_ratios, step_time_seed=seed))
    policy0 = replicas[0].policy
    limits = [rc.max_model_len or get_model(rc.model).max_model_len]
    if policy0.max_request_tokens() is not None:
        limits.append(policy0.max_request_tokens())
    rule = RejectionRule(policy0, total_blocks, replicas[0].watermark_blocks, rc.block_size, min(limits),
                         policy0.max_prompt_tokens(replicas[0].token_budget))
    return replicas, rule


def simulate(cfg: ClusterConfig, requests: Sequence[Request], num_tiers: int = 1, seed: int = 0,
             predictor=None, progress=None, sink=None) -> SimResult:
    """Run `requests` (sorted by arrival) through the cluster described by `cfg`.

    `predictor` overrides the execution-time model built from the config (tests use simple ones).

    `sink` (e.g. `tierserve.metrics.stream.RunRecorder`): every request is handed to `sink.add(index, state,
    reason)` when it ends — `index` its 0-based arrival position, `reason` why it was rejected or censored
    (None when it finished) — and then dropped, so memory holds only the requests in flight; at the end the
    censored ones (in flight at the time limit, or stranded) and the ones that never arrived follow, so every
    request is handed over exactly once. The result's `states` and `reasons` are then empty. `requests` may
    then be any forward-read sequence (a `RequestStream`): its order is checked as it is read, and every tier
    must be below `num_tiers`.
    """
    with collect_less_often():
        return _simulate(cfg, requests, num_tiers, seed, predictor, progress, sink)


def _simulate(cfg: ClusterConfig, requests: Sequence[Request], num_tiers: int, seed: int, predictor, progress,
              sink) -> SimResult:
    if sink is None or isinstance(requests, (list, tuple)):
        arrivals = list(map(attrgetter("arrival_s"), requests))
        if not all(map(le, arrivals, islice(arrivals, 1, None))):         # then find the first, to name it
            i = next(i for i in range(1, len(arrivals)) if arrivals[i] < arrivals[i - 1])
            raise ValueError(f"requests must be sorted by arrival: request {requests[i].id} arrives at "
                             f"{requests[i].arrival_s} before request {requests[i - 1].id} at "
                             f"{requests[i - 1].arrival_s}")
        tiers = list(map(attrgetter("tier"), requests))
        if tiers:
            num_tiers = max(num_tiers, max(tiers) + 1)
    else:
        requests = _CheckedStream(requests, num_tiers)
    wall0 = time.perf_counter()
    loop = EventLoop()
    replicas, rule = build_replicas(cfg, loop, num_tiers, predictor, seed)
    policy = CLUSTER_POLICIES.create(cfg.cluster_policy, **cfg.cluster_policy_params)
    migration = None
    if getattr(policy, "migrates", False):
        from tierserve.sim.migration import MigrationExecutor
        migration = MigrationExecutor(replicas, loop, cfg)
    if cfg.replica.speed_trace:
        if migration is not None:
            raise ConfigError("replica.speed_trace", cfg.replica.speed_trace,
                              f"empty with a live-migrating cluster policy ({cfg.cluster_policy!r} sets each source "
                              f"replica's speed factor while it copies)")
        for from_s, factor in cfg.replica.speed_trace:
            for r in replicas:
                loop.at(from_s, RANK_SPEED_CHANGE, r.set_slowdown, float(factor))
    cluster = Cluster(replicas, policy, loop, requests, rule, seed=seed, migration_executor=migration)
    if migration is not None:
        migration.bind(cluster)
    cluster.progress = progress
    relegated = 0
    if sink is not None:
        def on_end(index: int, state: RequestState, reason: str | None) -> None:
            nonlocal relegated
            relegated += state.relegated_s >= 0
            sink.add(index, state, reason)
        cluster.on_end = on_end
    cluster.start()
    loop.run(until=cfg.time_limit_s if cfg.time_limit_s else float("inf"))
    for r in replicas:
        r.sync()

    def unfinished_reason(s: RequestState) -> str:
        return (f"still {s.status.name.lower()} at the time limit {cfg.time_limit_s} s" if cfg.time_limit_s
                else f"still {s.status.name.lower()} when no event was left to serve it (stranded)")
    late = f"arrives after the time limit {cfg.time_limit_s} s"
    reasons = dict(cluster.reasons)
    if sink is None:
        for s in cluster.states:
            if s.status not in (Status.FINISHED, Status.REJECTED):
                reasons[s.id] = unfinished_reason(s)
        for r in requests[len(cluster.states):]:    # never arrived before the time limit
            reasons[r.id] = late
            cluster.states.append(RequestState(r))
        relegated = sum(1 for s in cluster.states if s.relegated_s >= 0)
    else:
        for index, s in sorted(cluster.live.values(), key=lambda e: e[0]):
            on_end(index, s, unfinished_reason(s))
        cluster.live.clear()
        for index in range(cluster._next_arrival, len(requests)):
            on_end(index, RequestState(requests[index]), late)
    tbt = [LogHistogram() for _ in range(num_tiers)]
    for rep in replicas:
        for t, h in enumerate(rep.tbt):
            tbt[t].merge(h)
    duration = loop.now
    kv_util = sum(rep.kv_block_seconds / (rep.total_blocks * duration) for rep in replicas) / len(replicas) if duration > 0 else 0.0
    stats = {
        "wall_s": time.perf_counter() - wall0,
        "events": loop.events_processed,
        "iterations": sum(r.iterations for r in replicas),
        "preemptions": sum(r.preemptions for r in replicas),
        "swap_outs": sum(r.swap_outs for r in replicas),
        "swap_fallbacks": sum(r.swap_fallbacks for r in replicas),
        "swap_blocks_out": sum(r.swap_blocks_out for r in replicas),
        "swap_blocks_in": sum(r.swap_blocks_in for r in replicas),
        "swap_pcie_s": sum(r.swap_pcie_s for r in replicas),
        "relegated": relegated,
        "kv_blocks_per_replica": replicas[0].total_blocks,
        "kv_utilization_mean": kv_util,
        "kv_utilization_max": max(r.max_used_blocks for r in replicas) / replicas[0].total_blocks,
        "busy_fraction": sum(r.busy_s for r in replicas) / (len(replicas) * duration) if duration > 0 else 0.0,
    }
    if migration is not None:
        stats.update(migration.stats())
    for rep in replicas:
        held = rep.reserved_blocks + sum(s.num_blocks for s in rep.running + rep.paused)
        if rep.free_blocks + held != rep.total_blocks:
            raise AssertionError(f"replica {rep.index}: {rep.total_blocks - rep.free_blocks - held} KV blocks "
                                 f"unaccounted for at the end of the run")
    return SimResult(cluster.states, reasons, tbt, duration, stats, streamed=sink is not None)


class _CheckedStream:
    """A forward-read request sequence whose arrival order and tiers are checked as it is read."""

    __slots__ = ("_src", "_num_tiers", "_prev", "_checked")

    def __init__(self, src: Sequence[Request], num_tiers: int) -> None:
        self._src, self._num_tiers, self._prev, self._checked = src, num_tiers, None, -1

    def __len__(self) -> int:
        return len(self._src)

    def __getitem__(self, i: int) -> Request:
        r = self._src[i]
        if i > self._checked:
            prev = self._prev
            if prev is not None and r.arrival_s < prev.arrival_s:
                raise ValueError(f"requests must be sorted by arrival: request {r.id} arrives at {r.arrival_s} "
                                 f"before request {prev.id} at {prev.arrival_s}")
            if not 0 <= r.tier < self._num_tiers:
                raise ValueError(f"request {r.id} has tier {r.tier}; a streamed run has tiers 0..{self._num_tiers - 1}")
            self._prev, self._checked = r, i
        return r
