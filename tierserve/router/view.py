"""An engine as a cluster policy sees it: the simulator's `InstanceView` (+ `LoadCounters`), filled from the
engine's `/metrics` and the router's own accounting of what it sent there since the last scrape.

Counts: a scrape gives running R, waiting W and KV usage u (a fraction) while the router had I0 requests in
flight there; with I in flight now, outstanding = max(0, R + W + I − I0) (requests of other clients stay counted
through the scrape), running = min(R, outstanding), the rest waiting. KV blocks: u·M plus the prompt blocks of
what was sent since the scrape. Per-request lists (`running`, `waiting`, tier counts, the waiting head) are the
router's own requests there in dispatch order, the first `running` of them taken as running: the engine does not
say which of its requests run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from tierserve.core import RequestState
from tierserve.policies.cluster.freeness import blocks_for, queue_head


@dataclass(slots=True)
class Scrape:
    """One read of an engine's /metrics (the vLLM names it came from in the comments)."""

    running: int = 0                 # vllm:num_requests_running
    waiting: int = 0                 # vllm:num_requests_waiting
    kv_usage: float = 0.0            # vllm:kv_cache_usage_perc (fraction; vllm:gpu_cache_usage_perc before)
    preemptions_total: float = 0.0   # vllm:num_preemptions_total
    prefix_queries_total: float = 0.0  # vllm:prefix_cache_queries_total
    prefix_hits_total: float = 0.0     # vllm:prefix_cache_hits_total
    total_blocks: int | None = None  # vllm:cache_config_info{num_gpu_blocks}
    block_size: int | None = None    # vllm:cache_config_info{block_size}
    kv_metric: str = ""              # which KV usage metric the engine exports


@dataclass(eq=False)
class EngineView:
    """What the router knows of one engine. Satisfies `InstanceView` and `LoadCounters`."""

    url: str
    engine_id: int                   # position in the configuration (labels, logs)
    index: int                       # position in the list a policy is handed (the ready engines), set per call
    total_blocks: int
    block_size: int
    max_num_seqs: int
    ready: bool = False
    scrape_failures: int = 0                   # failed scrapes in a row
    last: Scrape = field(default_factory=Scrape)
    in_flight_at_scrape: int = 0
    sent_blocks_since_scrape: int = 0
    preempted_recently: bool = False
    prefix_hit_rate: float = math.nan          # hits / queries over the last scrape interval
    mine: dict[int, RequestState] = field(default_factory=dict)   # router's requests there, dispatch order

    # ---- accounting ---------------------------------------------------------------------------------------
    def sent(self, state: RequestState) -> None:
        self.mine[state.id] = state
        self.sent_blocks_since_scrape += blocks_for(state.num_tokens, self.block_size)

    def ended(self, state: RequestState) -> None:
        self.mine.pop(state.id, None)

    def scraped(self, s: Scrape) -> None:
        prev = self.last
        if s.total_blocks:
            self.total_blocks = s.total_blocks
        if s.block_size:
            self.block_size = s.block_size
        self.preempted_recently = s.preemptions_total > prev.preemptions_total
        dq = s.prefix_queries_total - prev.prefix_queries_total
        if dq > 0:
            self.prefix_hit_rate = (s.prefix_hits_total - prev.prefix_hits_total) / dq
        self.last = s
        self.in_flight_at_scrape = len(self.mine)
        self.sent_blocks_since_scrape = 0

    # ---- InstanceView -------------------------------------------------------------------------------------
    @property
    def num_outstanding(self) -> int:
        return max(0, self.last.running + self.last.waiting + len(self.mine) - self.in_flight_at_scrape)

    @property
    def num_running(self) -> int:
        return min(self.last.running, self.num_outstanding)

    @property
    def num_queued(self) -> int:
        return self.num_outstanding - self.num_running

    @property
    def used_blocks(self) -> int:
        used = round(self.last.kv_usage * self.total_blocks) + self.sent_blocks_since_scrape
        return min(max(used, 0), self.total_blocks)

    def _split(self) -> tuple[list[RequestState], list[RequestState]]:
        states = list(self.mine.values())
        k = min(self.num_running, len(states))
        return states[:k], states[k:]

    @property
    def running(self) -> list[RequestState]:
        return self._split()[0]

    @property
    def waiting(self) -> list[RequestState]:
        return self._split()[1]

    @property
    def swapped(self) -> list[RequestState]:
        return []                          # vLLM v1 recomputes; nothing is swapped out

    @property
    def terminating(self) -> bool:
        return not self.ready

    @property
    def migrating(self) -> bool:
        return False

    # ---- LoadCounters -------------------------------------------------------------------------------------
    @property
    def tier_counts(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for s in self.mine.values():
            counts[s.tier] = counts.get(s.tier, 0) + 1
        return counts

    @property
    def waiting_head(self) -> RequestState | None:
        return queue_head(self.waiting)

    @property
    def waiting_demand_blocks(self) -> int:
        return sum(blocks_for(s.num_tokens, self.block_size) for s in self.waiting)

    @property
    def swapped_demand_blocks(self) -> int:
        return 0

    @property
    def num_preempted_waiting(self) -> int:
        return 1 if self.preempted_recently and self.num_queued else 0
