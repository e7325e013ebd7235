"""Niyama / QoServe (seed 003; ALGORITHMS.md §4): deadline-driven replica scheduling on Sarathi's batch.

Each iteration: every decode, plus prefill chunks chosen by priority within a budget. Four mechanisms, each
switchable (the ablation turns them on one by one):

* dynamic chunking — the batch's token total is the largest in [128, 2552] whose *predicted* iteration time
  × 1.2 fits the tightest next-token slack of the running decodes (through the predictor protocol; the
  smallest when that slack is ≤ 0; ≤ 512 while free KV is below `pressure_free_fraction`). Off: a fixed
  `chunk_tokens` (256, the shared-cluster baseline's).
* priority — `edf`: the prefill deadline; `hybrid` (paper eq. 4/5): interactive a + TTFT + α·prefill_rem,
  non-interactive a + TTLT + α·(prefill_rem + decode_rem_est), decode_rem_est = per-application mean + 2σ
  of observed decode lengths (learned online in `on_finish`); `latest_start` (the public QoServe code):
  non-interactive a + TTLT − decode_rem_est·`latest_start_tbt_s` + α·prefill_rem. α = 0 is EDF.
* eager relegation — a prefill candidate that has missed, or is estimated to miss, its first-token (TTLT)
  deadline (now + prefill_rem / prefill-throughput EWMA > deadline; EWMA from 8,500 tok/s) is relegated:
  it still runs, after every non-relegated prefill, and finishes with outcome RELEGATED. With importance
  ranks (`tier_importance`, default: all equal) the lowest tier is relegated first (seed 003: low-priority
  requests are relegated preferentially, and a violated high-priority one only when no low-priority request
  is left): a violator — one that has missed its deadline too — keeps its place and a less important
  candidate gives way instead, the least important one ahead of it in line, else (`relegation_scope`
  "queue", the default) the least important waiting one nearest the front of the line; only when no less
  important candidate is left is the violator itself relegated. `relegation_scope` "ahead" (the rule before
  issue 9's fix) looks only ahead of the violator and relegates a violator past its deadline itself.
* selective preemption — a partially prefilled request may be paused (its KV kept, its chunk given to a
  higher-priority request) only if it still meets its own deadline after the pause; off, partial prefills
  go first as in Sarathi. Decodes are never paused; under a KV shortfall partial prefills are evicted first
  and a decode only when no partial prefill is left (`forced_decode_evictions` counts those).

Skip-ahead stays exact: a decode-only batch is repeatable only when no prefill was withheld for lack of
slack (that decision changes with time), and a relegation instant is a revision point (`revise_at_s`).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from tierserve.core import AllocationRule, BatchPlan, ConfigError, PreemptMode, RequestState
from tierserve.policies.local.base import LocalPolicy, ReplicaView
from tierserve.policies.local.deadlines import (
    DecodeLengthEstimator, decode_slack_s, prefill_deadline,
)
from tierserve.policies.local.prioqueue import WaitingHeap
from tierserve.policies.local.sarathi_fcfs import check_chunk
from tierserve.policies.local.vllm_v0 import arrival_key

PRIORITIES = ("hybrid", "edf", "latest_start")
RELEGATION_SCOPES = ("queue", "ahead")


def _positive(name: str, value, allow_zero: bool = False) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(name, value, "a finite number >= 0" if allow_zero else "a finite number > 0")
    return float(value)


class NiyamaPolicy(LocalPolicy):
    name = "niyama"
    default_token_budget = 2552      # the top of the dynamic-chunk search space
    default_max_num_seqs = 128
    allocation = AllocationRule.WHOLE_PROMPT

    def __init__(self, dynamic_chunking: bool = True, chunk_tokens: int = 256, min_chunk_tokens: int = 128,
                 max_chunk_tokens: int = 2552, pressure_chunk_tokens: int = 512,
                 pressure_free_fraction: float = 0.1, slack_factor: float = 1.2, priority: str = "hybrid",
                 alpha_s_per_token: float = 0.008, eager_relegation: bool = True,
                 selective_preemption: bool = True, tier_importance: Sequence[int] | None = None,
                 prefill_throughput_tok_s: float = 8500.0, throughput_ewma_weight: float = 0.2,
                 decode_sigmas: float = 2.0, decode_prior_tokens: float = 256.0,
                 latest_start_tbt_s: float = 0.05, relegation_scope: str = "queue") -> None:
        for name, v in (("dynamic_chunking", dynamic_chunking), ("eager_relegation", eager_relegation),
                        ("selective_preemption", selective_preemption)):
            if not isinstance(v, bool):
                raise ConfigError(name, v, "true | false")
        if priority not in PRIORITIES:
            raise ConfigError("priority", priority, " | ".join(PRIORITIES))
        self.dynamic_chunking = dynamic_chunking
        self.chunk_tokens = check_chunk("chunk_tokens", chunk_tokens)
        self.min_chunk_tokens = check_chunk("min_chunk_tokens", min_chunk_tokens)
        self.max_chunk_tokens = check_chunk("max_chunk_tokens", max_chunk_tokens)
        if self.max_chunk_tokens < self.min_chunk_tokens:
            raise ConfigError("max_chunk_tokens", max_chunk_tokens, f">= min_chunk_tokens ({min_chunk_tokens})")
        self.pressure_chunk_tokens = check_chunk("pressure_chunk_tokens", pressure_chunk_tokens)
        self.pressure_free_fraction = _positive("pressure_free_fraction", pressure_free_fraction, allow_zero=True)
        if self.pressure_free_fraction >= 1:
            raise ConfigError("pressure_free_fraction", pressure_free_fraction, "a fraction in [0, 1)")
        self.slack_factor = _positive("slack_factor", slack_factor)
        self.priority = priority
        self.alpha = _positive("alpha_s_per_token", alpha_s_per_token, allow_zero=True)
        self.eager_relegation = eager_relegation
        self.selective_preemption = selective_preemption
        if tier_importance is not None:
            if isinstance(tier_importance, (str, bytes)) or not isinstance(tier_importance, Sequence) or not all(
                    isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in tier_importance):
                raise ConfigError("tier_importance", tier_importance,
                                  "a list of integer ranks >= 0, one per tier (0 = most important)")
            tier_importance = tuple(tier_importance)
        self.tier_importance = tier_importance
        if relegation_scope not in RELEGATION_SCOPES:
            raise ConfigError("relegation_scope", relegation_scope, " | ".join(RELEGATION_SCOPES))
        self.relegation_scope = relegation_scope
        # Waiting requests of each rank below the most important, in line order: where a less important
        # request to relegate is found when none is ahead of the violator.
        self._by_rank: dict[int, WaitingHeap] = {}
        if tier_importance is not None and relegation_scope == "queue":
            self._by_rank = {rank: WaitingHeap(f"niyama.rank{rank}", accept=lambda s: not s.relegated)
                             for rank in sorted(set(tier_importance)) if rank > min(tier_importance)}
        self.prefill_tput = _positive("prefill_throughput_tok_s", prefill_throughput_tok_s)
        w = _positive("throughput_ewma_weight", throughput_ewma_weight)
        if w > 1:
            raise ConfigError("throughput_ewma_weight", throughput_ewma_weight, "a weight in (0, 1]")
        self.ewma_weight = w
        self.latest_start_tbt_s = _positive("latest_start_tbt_s", latest_start_tbt_s)
        self.decode_lengths = DecodeLengthEstimator(
            _positive("decode_sigmas", decode_sigmas, allow_zero=True),
            _positive("decode_prior_tokens", decode_prior_tokens))
        self._planned_prefill_tokens = 0
        # The prefill queue and the relegated queue, keyed on entry (a priority queue, as in Niyama).
        self._live = WaitingHeap("niyama.live", accept=lambda s: not s.relegated)
        self._parked = WaitingHeap("niyama.parked", accept=lambda s: s.relegated)
        self.forced_decode_evictions = 0
        self.pauses = 0              # partial prefills passed over for a higher-priority request

    # ----- priorities -----
    def importance(self, state: RequestState) -> int:
        ranks = self.tier_importance
        if ranks is None:
            return 0
        if state.tier >= len(ranks):
            raise ConfigError("tier_importance", list(ranks), f"a rank for tier {state.tier}")
        return ranks[state.tier]

    def priority_value(self, state: RequestState) -> float:
        """Smaller is served first (paper eq. 4/5, or EDF, or the public code's latest-start form)."""
        d = prefill_deadline(state)
        if self.priority == "edf":
            return d
        rem = state.num_tokens - state.num_computed_tokens
        if state.slo.tbt_s is not None:          # interactive, eq. 4
            return d + self.alpha * rem
        dec = self.decode_lengths.remaining(state)
        if self.priority == "latest_start":
            return d - dec * self.latest_start_tbt_s + self.alpha * rem
        return d + self.alpha * (rem + dec)       # non-interactive, eq. 5

    def relegate_at(self, state: RequestState) -> float:
        """The instant after which the candidate is estimated to miss its prefill deadline."""
        return prefill_deadline(state) - (state.num_tokens - state.num_computed_tokens) / self.prefill_tput

    # ----- dynamic chunking -----
    def batch_tokens(self, view: ReplicaView, decodes: Sequence[RequestState], free_blocks: int,
                     head: RequestState | None) -> int:
        """Token total of this iteration (decodes included)."""
        hi = min(self.max_chunk_tokens, view.token_budget)
        if not self.dynamic_chunking:
            return min(self.chunk_tokens, view.token_budget)
        if free_blocks < self.pressure_free_fraction * view.total_blocks:
            hi = min(hi, self.pressure_chunk_tokens)
        lo = min(self.min_chunk_tokens, hi)
        now = view.now
        slack = math.inf
        ctx = 0
        for r in decodes:
            ctx += r.num_computed_tokens + 1
            if not r.relegated:
                s = decode_slack_s(r, now, self.decode_lengths.remaining(r))
                if s < slack:
                    slack = s
        n = len(decodes)
        if slack == math.inf:
            return hi
        if slack <= 0:
            return lo
        prefill_ctx = head.num_computed_tokens if head is not None else 0
        p = view.predictor.max_prefill_tokens_within(slack / self.slack_factor, n, ctx, prefill_ctx,
                                                     lo=max(lo - n, 0), hi=max(hi - n, 0))
        return n + p

    # ----- the batch -----
    def plan(self, view: ReplicaView) -> BatchPlan:
        now = view.now
        idx = view.index
        bs = view.block_size
        free = view.free_blocks
        cap = view.max_num_seqs
        plan = BatchPlan()
        scheduled = plan.scheduled
        running = sorted(view.running, key=arrival_key)
        decodes, partial = [], []
        for r in running:
            (partial if r.num_tokens - r.num_computed_tokens > 1 or r.num_generated == 0 else decodes).append(r)
        decodes = decodes[:cap]
        need = 0
        for r in decodes:
            n = self.blocks_to_hold(r, 1, bs) - r.num_blocks
            if n > 0:
                need += n
        if need > free:           # KV shortfall: partial prefills go first (worst priority), then decodes
            partial.sort(key=self.priority_value)
            while need > free and partial:
                v = partial.pop()
                plan.preempt.append((v, PreemptMode.RECOMPUTE))
                free += v.num_blocks
            while need > free and decodes:
                v = decodes.pop()
                n = self.blocks_to_hold(v, 1, bs) - v.num_blocks
                need -= n if n > 0 else 0
                plan.preempt.append((v, PreemptMode.RECOMPUTE))
                free += v.num_blocks
                self.forced_decode_evictions += 1
        for r in decodes:
            scheduled.append((r, 1))
        free -= need
        self._planned_prefill_tokens = 0
        if len(scheduled) >= cap:         # no room for a prefill: examine (and relegate) nothing
            plan.repeatable = not plan.preempt
            return plan
        try:
            return self._plan_prefills(view, plan, decodes, partial, free, now, idx)
        finally:
            self._live.restore()
            self._parked.restore()
            for heap in self._by_rank.values():
                heap.restore()

    def _plan_prefills(self, view: ReplicaView, plan: BatchPlan, decodes: list[RequestState],
                       partial: list[RequestState], free: int, now: float, idx: int) -> BatchPlan:
        scheduled = plan.scheduled
        cap = view.max_num_seqs
        bs = view.block_size
        er = self.eager_relegation
        gone: set[int] = set()             # relegated by this plan
        live_p: list[tuple] = []           # (priority, arrival, id, state) of partial prefills
        parked_p: list[tuple] = []
        for r in partial:
            k = (self.priority_value(r), r.arrival_s, r.id, r)
            (parked_p if r.relegated else live_p).append(k)
        live_p.sort(key=_key)
        prefix: list[tuple] = []           # live waiting entries examined so far, in key order
        stream = self._live.entries(idx)

        def violates(k: tuple) -> bool:
            """Eager relegation of an examined candidate; True when the candidate itself was relegated."""
            r = k[-1]
            if not er or now <= self.relegate_at(r):
                return False
            target = r
            whole_queue = self.relegation_scope == "queue"
            if self.tier_importance is not None and (whole_queue or now <= prefill_deadline(r)):
                rank = self.importance(r)
                ahead = [a for a in live_p + prefix if _key(a) < _key(k) and id(a[-1]) not in gone
                         and self.importance(a[-1]) > rank]
                if ahead:     # a less important request ahead of it in line gives way
                    target = max(ahead, key=lambda a: (self.importance(a[-1]), _key(a)))[-1]
                elif whole_queue:    # else the least important waiting one nearest the front
                    target = self._least_important_waiting(rank, idx, gone) or r
            gone.add(id(target))
            why = "missed" if now > prefill_deadline(target) else "would miss"
            plan.relegate.append((target, f"eager relegation: {why} its deadline" if target is r else
                                  f"eager relegation: gave way to tier {r.tier} request {r.id}"))
            return target is r

        for k in live_p:
            if id(k[-1]) not in gone:
                violates(k)

        def pull() -> tuple | None:
            for e in stream:
                if id(e[-1]) in gone or violates(e):
                    continue
                prefix.append(e)
                return e
            return None

        def live_waiting():
            i = 0
            while True:
                if i >= len(prefix) and pull() is None:
                    return
                e = prefix[i]
                i += 1
                if id(e[-1]) not in gone:
                    yield e

        first_w = pull()
        partials = [k for k in live_p if id(k[-1]) not in gone]
        heads = [k for k in (partials[0] if partials else None, first_w) if k is not None]
        head = min(heads, key=_key)[-1] if heads else None
        budget = self.batch_tokens(view, decodes, free, head) - len(decodes)
        if self.selective_preemption and partials:
            pinned, movable = self._pin(partials, prefix, pull, gone, budget, now)
            order = _chain(pinned, _merge(movable, live_waiting()))
        else:
            order = _chain(partials, live_waiting())
        parked_p.sort(key=_key)
        order = _chain(order, parked_p, self._parked.entries(idx))

        running_ids = {id(r) for r in partial}
        partials_left = len(partials) + len(parked_p)
        num_seqs = len(view.running) - len(plan.preempt)
        prefill_tokens = 0
        withheld_for_slack = False
        admitting = True
        for k in order:
            r = k[-1]
            if id(r) in gone:
                continue
            if len(scheduled) >= cap:
                break
            if budget <= 0:
                withheld_for_slack = True
                break
            n = r.num_tokens - r.num_computed_tokens
            if n > budget:
                n = budget
            if id(r) in running_ids:
                partials_left -= 1
            else:
                if not admitting:
                    if partials_left <= 0:
                        break
                    continue
                need_w = self.blocks_to_hold(r, n, bs) - r.num_blocks
                if num_seqs >= cap or need_w > free - view.watermark_blocks:
                    admitting = False       # the first that does not fit stops admission (Sarathi);
                    if partials_left <= 0:  # partial prefills, which hold their blocks, still run
                        break
                    continue
                free -= need_w
                num_seqs += 1
            scheduled.append((r, n))
            budget -= n
            prefill_tokens += n
        self._planned_prefill_tokens = prefill_tokens
        if prefill_tokens == 0 and not plan.preempt and not plan.relegate and not withheld_for_slack:
            plan.repeatable = True
            if er:        # the candidates examined turn violators at these instants: revision points
                plan.revise_at_s = min((self.relegate_at(k[-1]) for k in partials + prefix
                                        if id(k[-1]) not in gone), default=math.inf)
        return plan

    def _least_important_waiting(self, rank: int, idx: int, gone: set) -> RequestState | None:
        """The waiting request of the least important rank below `rank` that is first in line, if any."""
        for r in sorted((x for x in self._by_rank if x > rank), reverse=True):
            for e in self._by_rank[r].entries(idx):
                if id(e[-1]) not in gone:
                    return e[-1]
        return None

    def _pin(self, partials: list, prefix: list, pull, gone: set, budget: int, now: float) -> tuple[list, list]:
        """Selective preemption, one iteration at a time: a partial prefill yields this iteration's tokens to
        higher-priority waiting requests only if it still meets its deadline after them."""
        last = _key(partials[-1])
        while (sum(e[-1].num_tokens - e[-1].num_computed_tokens for e in prefix if id(e[-1]) not in gone) < budget
               and (not prefix or _key(prefix[-1]) < last)):
            if pull() is None:
                break
        pinned, movable = [], []
        tput = self.prefill_tput
        for k in partials:
            ahead = 0
            for e in prefix:
                if _key(e) < _key(k) and id(e[-1]) not in gone:
                    ahead += e[-1].num_tokens - e[-1].num_computed_tokens
            if ahead > budget:
                ahead = budget
            r = k[-1]
            if ahead and now + (ahead + r.num_tokens - r.num_computed_tokens) / tput > prefill_deadline(r):
                pinned.append(k)          # pausing it would make it miss: it keeps its turn
            else:
                if ahead:
                    self.pauses += 1
                movable.append(k)
        return pinned, movable

    # ----- hooks -----
    def on_arrival(self, state: RequestState, view: ReplicaView) -> None:
        self._enqueue(state)

    def on_preempt(self, state: RequestState, mode: PreemptMode, view: ReplicaView) -> None:
        self._enqueue(state)

    def _enqueue(self, state: RequestState) -> None:
        key = (self.priority_value(state), state.arrival_s)
        self._queue_of(state).push(state, key)
        if self._by_rank and not state.relegated:
            heap = self._by_rank.get(self.importance(state))
            if heap is not None:
                heap.push(state, key)

    def on_relegate(self, state: RequestState, view: ReplicaView) -> None:
        if state.num_blocks == 0:     # waiting: it moves to the relegated queue (a partial prefill stays put)
            self._parked.push(state, (self.priority_value(state), state.arrival_s))

    def _queue_of(self, state: RequestState) -> WaitingHeap:
        return self._parked if state.relegated else self._live

    def on_iteration_end(self, batch: Sequence[RequestState], num_iterations: int, elapsed_s: float,
                         view: ReplicaView) -> None:
        tokens = self._planned_prefill_tokens
        if tokens and num_iterations == 1 and elapsed_s > 0:
            w = self.ewma_weight
            self.prefill_tput = (1.0 - w) * self.prefill_tput + w * tokens / elapsed_s
        self._planned_prefill_tokens = 0

    def on_finish(self, state: RequestState, view: ReplicaView) -> None:
        self.decode_lengths.observe(state)


def _key(k: tuple) -> tuple:
    return k[:3]                  # (priority, arrival, id): unique, so a state is never compared


def _chain(*parts):
    for part in parts:
        yield from part


def _merge(a: list, b):
    """Two key-ordered streams of (priority, arrival, id, state) merged by key (b may be lazy)."""
    i = 0
    for e in b:
        while i < len(a) and _key(a[i]) < _key(e):
            yield a[i]
            i += 1
        yield e
    yield from a[i:]
