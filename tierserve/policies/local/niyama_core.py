# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""Niyama's plan and queues (`tierserve.policies.local.niyama` describes the policy): the part that runs at
every iteration, kept apart from the policy class so that mypyc can compile it (`tierserve/_native.py`) into a
native class — the policy class derives from `LocalPolicy`, whose class-level declarations a native class
cannot keep.

`NiyamaCore` holds the validated parameters, the prefill queues, the decode-length estimate and the
prefill-throughput EWMA; `NiyamaPolicy` creates one and hands it every plan and hook.
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, Callable, cast

from tierserve.core import BatchPlan, ConfigError, PreemptMode, RequestState
from tierserve.policies.local.deadlines import DecodeLengthEstimator, prefill_deadline
from tierserve.policies.local.prioqueue import WaitingHeap

Hold = Callable[[RequestState, int, int], int]


def _not_relegated(state: RequestState) -> bool:
    return state.relegated_s < 0.0


def _relegated(state: RequestState) -> bool:
    return state.relegated_s >= 0.0


class NiyamaCore:
    """Everything `NiyamaPolicy.plan` and its hooks compute (parameters already validated by the policy)."""

    def __init__(self, hold: Hold, whole_prompt: bool, dynamic_chunking: bool, chunk_tokens: int,
                 min_chunk_tokens: int, max_chunk_tokens: int, pressure_chunk_tokens: int,
                 pressure_free_fraction: float, slack_factor: float, priority: str, alpha: float,
                 eager_relegation: bool, selective_preemption: bool, tier_importance: tuple[int, ...] | None,
                 relegation_scope: str, prefill_tput: float, ewma_weight: float, latest_start_tbt_s: float,
                 decode_lengths: DecodeLengthEstimator) -> None:
        self.hold = hold                          # the policy's blocks_to_hold (bound)
        self.whole_prompt = whole_prompt          # it is _hold_whole_prompt: computed inline
        self.dynamic_chunking = dynamic_chunking
        self.chunk_tokens = chunk_tokens
        self.min_chunk_tokens = min_chunk_tokens
        self.max_chunk_tokens = max_chunk_tokens
        self.pressure_chunk_tokens = pressure_chunk_tokens
        self.pressure_free_fraction = pressure_free_fraction
        self.slack_factor = slack_factor
        self.priority = priority
        self.alpha = alpha
        self.eager_relegation = eager_relegation
        self.selective_preemption = selective_preemption
        self.tier_importance = tier_importance
        self.relegation_scope = relegation_scope
        self.prefill_tput = prefill_tput
        self.ewma_weight = ewma_weight
        self.latest_start_tbt_s = latest_start_tbt_s
        self.decode_lengths = decode_lengths
        # Waiting requests of each rank below the most important, in line order: where a less important
        # request to relegate is found when none is ahead of the violator.
        self.by_rank: dict[int, WaitingHeap] = {}
        if tier_importance is not None and relegation_scope == "queue":
            top = min(tier_importance)
            for rank in sorted(set(tier_importance)):
                if rank > top:
                    self.by_rank[rank] = WaitingHeap(f"niyama.rank{rank}", accept=_not_relegated)
        self.planned_prefill_tokens = 0
        # The prefill queue and the relegated queue, keyed on entry (a priority queue, as in Niyama).
        self.live = WaitingHeap("niyama.live", accept=_not_relegated)
        self.parked = WaitingHeap("niyama.parked", accept=_relegated)
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
    def batch_tokens(self, view: Any, decodes: Sequence[RequestState], free_blocks: int,
                     head: RequestState | None) -> int:
        """Token total of this iteration (decodes included)."""
        budget: int = view.token_budget
        hi = min(self.max_chunk_tokens, budget)
        if not self.dynamic_chunking:
            return min(self.chunk_tokens, budget)
        if free_blocks < self.pressure_free_fraction * view.total_blocks:
            hi = min(hi, self.pressure_chunk_tokens)
        lo = min(self.min_chunk_tokens, hi)
        now: float = view.now
        slack = math.inf
        ctx = 0
        est = self.decode_lengths
        for r in decodes:
            ctx += r.num_computed_tokens + 1
            if r.relegated_s >= 0.0:
                continue
            # decode_slack_s(r, now, decode_lengths.remaining(r)), inline: once per decode per plan
            slo = r.slo
            tbt = slo.tbt_s
            g = r.num_generated
            if tbt is not None:             # interactive: its next token's deadline (token_deadline, g + 1)
                d_first = r.arrival_s + cast(float, slo.ttft_s)
                if g < 1:
                    s = d_first - now
                else:
                    first = r.first_token_s
                    s = (first if first > d_first else d_first) + g * tbt - now
            else:                           # non-interactive: time to TTLT over the estimated tokens left
                ttlt = slo.ttlt_s
                s = (r.arrival_s + ttlt if ttlt is not None else math.inf) - now
                if s > 0:
                    rem = est.total_tokens(r) - g
                    s = s / (rem if rem > 1.0 else 1.0)
            if s < slack:
                slack = s
        n = len(decodes)
        if slack == math.inf:
            return hi
        if slack <= 0:
            return lo
        prefill_ctx = head.num_computed_tokens if head is not None else 0
        p: int = view.predictor.max_prefill_tokens_within(slack / self.slack_factor, n, ctx, prefill_ctx,
                                                          lo=max(lo - n, 0), hi=max(hi - n, 0))
        return n + p

    # ----- the batch -----
    def plan(self, view: Any) -> BatchPlan:
        now: float = view.now
        idx: int = view.index
        bs: int = view.block_size
        free: int = view.free_blocks
        cap: int = view.max_num_seqs
        plan = BatchPlan()
        scheduled = plan.scheduled
        running = oldest_first(view.running)
        decodes: list[RequestState] = []
        partial: list[RequestState] = []
        for r in running:
            if r.num_tokens - r.num_computed_tokens > 1 or r.num_generated == 0:
                partial.append(r)
            else:
                decodes.append(r)
        del decodes[cap:]
        need = 0
        if self.whole_prompt:
            for r in decodes:               # _hold_whole_prompt(r, 1, bs), inline (hot loop)
                tokens = r.num_computed_tokens + 1
                known = r.num_tokens
                n = -(-(tokens if tokens > known else known) // bs) - r.num_blocks
                if n > 0:
                    need += n
        else:
            for r in decodes:
                n = self.hold(r, 1, bs) - r.num_blocks
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
                n = self.hold(v, 1, bs) - v.num_blocks
                need -= n if n > 0 else 0
                plan.preempt.append((v, PreemptMode.RECOMPUTE))
                free += v.num_blocks
                self.forced_decode_evictions += 1
        for r in decodes:
            scheduled.append((r, 1))
        free -= need
        self.planned_prefill_tokens = 0
        if len(scheduled) >= cap:         # no room for a prefill: examine (and relegate) nothing
            plan.repeatable = not plan.preempt
            return plan
        try:
            return self._plan_prefills(view, plan, decodes, partial, free, now, idx, len(running))
        finally:
            self.live.restore()
            self.parked.restore()
            for heap in self.by_rank.values():
                heap.restore()

    def _plan_prefills(self, view: Any, plan: BatchPlan, decodes: list[RequestState],
                       partial: list[RequestState], free: int, now: float, idx: int, num_running: int) -> BatchPlan:
        scheduled = plan.scheduled
        cap: int = view.max_num_seqs
        bs: int = view.block_size
        er = self.eager_relegation
        live_p: list[tuple] = []           # (priority, arrival, id, state) of partial prefills
        parked_p: list[tuple] = []
        for r in partial:
            k = (self.priority_value(r), r.arrival_s, r.id, r)
            (parked_p if r.relegated_s >= 0.0 else live_p).append(k)
        live_p.sort(key=_key)
        cands = _Candidates(self, plan, live_p, idx, now)
        gone = cands.gone                  # relegated by this plan
        prefix = cands.prefix              # live waiting entries examined so far, in key order
        pull = cands.pull
        live_waiting = cands.live_waiting

        for k in live_p:
            if id(k[-1]) not in gone:
                cands.violates(k)

        first_w = pull()
        partials = [k for k in live_p if id(k[-1]) not in gone]
        heads = [k for k in (partials[0] if partials else None, first_w) if k is not None]
        head = cast(RequestState, min(heads, key=_key)[-1]) if heads else None
        budget = self.batch_tokens(view, decodes, free, head) - len(decodes)
        first: Iterator[tuple]              # the candidates in turn: first, then the relegated ones
        if self.selective_preemption and partials:
            pinned, movable = self._pin(partials, prefix, pull, gone, budget, now)
            first = _chain(pinned, _merge(movable, live_waiting()))
        elif partials:
            first = _chain(partials, live_waiting())
        else:
            first = live_waiting()
        parked_p.sort(key=_key)

        running_ids = {id(r) for r in partial}
        partials_left = len(partials) + len(parked_p)
        num_seqs = num_running - len(plan.preempt)
        watermark: int = view.watermark_blocks
        whole_prompt = self.whole_prompt
        prefill_tokens = 0
        withheld_for_slack = False
        admitting = True
        done = False
        for part in (first, parked_p, self.parked.entries(idx)):
            for k in part:
                r = cast(RequestState, k[-1])
                if id(r) in gone:
                    continue
                if len(scheduled) >= cap:
                    done = True
                    break
                if budget <= 0:
                    withheld_for_slack = done = True
                    break
                n = r.num_tokens - r.num_computed_tokens
                if n > budget:
                    n = budget
                if id(r) in running_ids:
                    partials_left -= 1
                else:
                    if not admitting:
                        if partials_left <= 0:
                            done = True
                            break
                        continue
                    if whole_prompt:            # _hold_whole_prompt(r, n, bs), inline
                        tokens = r.num_computed_tokens + n
                        known = r.num_tokens
                        need_w = -(-(tokens if tokens > known else known) // bs) - r.num_blocks
                    else:
                        need_w = self.hold(r, n, bs) - r.num_blocks
                    if num_seqs >= cap or need_w > free - watermark:
                        admitting = False       # the first that does not fit stops admission (Sarathi);
                        if partials_left <= 0:  # partial prefills, which hold their blocks, still run
                            done = True
                            break
                        continue
                    free -= need_w
                    num_seqs += 1
                scheduled.append((r, n))
                budget -= n
                prefill_tokens += n
            if done:
                break
        self.planned_prefill_tokens = prefill_tokens
        if prefill_tokens == 0 and not plan.preempt and not plan.relegate and not withheld_for_slack:
            plan.repeatable = True
            if er:        # the candidates examined turn violators at these instants: revision points
                plan.revise_at_s = min((self.relegate_at(k[-1]) for k in partials + prefix
                                        if id(k[-1]) not in gone), default=math.inf)
        return plan

    def _least_important_waiting(self, rank: int, idx: int, gone: set[int]) -> RequestState | None:
        """The waiting request of the least important rank below `rank` that is first in line, if any."""
        for r in sorted((x for x in self.by_rank if x > rank), reverse=True):
            for e in self.by_rank[r].entries(idx):
                if id(e[-1]) not in gone:
                    return cast(RequestState, e[-1])
        return None

    def _pin(self, partials: list[tuple], prefix: list[tuple], pull: Callable[[], tuple | None], gone: set[int],
             budget: int, now: float) -> tuple[list[tuple], list[tuple]]:
        """Selective preemption, one iteration at a time: a partial prefill yields this iteration's tokens to
        higher-priority waiting requests only if it still meets its deadline after them."""
        last = _key(partials[-1])
        while (sum(e[-1].num_tokens - e[-1].num_computed_tokens for e in prefix if id(e[-1]) not in gone) < budget
               and (not prefix or _key(prefix[-1]) < last)):
            if pull() is None:
                break
        pinned: list[tuple] = []
        movable: list[tuple] = []
        tput = self.prefill_tput
        for k in partials:
            ahead = 0
            for e in prefix:
                if _key(e) < _key(k) and id(e[-1]) not in gone:
                    ahead += e[-1].num_tokens - e[-1].num_computed_tokens
            if ahead > budget:
                ahead = budget
            r = cast(RequestState, k[-1])
            if ahead and now + (ahead + r.num_tokens - r.num_computed_tokens) / tput > prefill_deadline(r):
                pinned.append(k)          # pausing it would make it miss: it keeps its turn
            else:
                if ahead:
                    self.pauses += 1
                movable.append(k)
        return pinned, movable

    # ----- hooks -----
    def enqueue(self, state: RequestState) -> None:
        key = (self.priority_value(state), state.arrival_s)
        (self.parked if state.relegated_s >= 0.0 else self.live).push(state, key)
        if self.by_rank and state.relegated_s < 0.0:
            heap = self.by_rank.get(self.importance(state))
            if heap is not None:
                heap.push(state, key)

    def on_relegate(self, state: RequestState) -> None:
        if state.num_blocks == 0:     # waiting: it moves to the relegated queue (a partial prefill stays put)
            self.parked.push(state, (self.priority_value(state), state.arrival_s))

    def on_iteration_end(self, num_iterations: int, elapsed_s: float) -> None:
        tokens = self.planned_prefill_tokens
        if tokens and num_iterations == 1 and elapsed_s > 0:
            w = self.ewma_weight
            self.prefill_tput = (1.0 - w) * self.prefill_tput + w * tokens / elapsed_s
        self.planned_prefill_tokens = 0


def oldest_first(running: Sequence[RequestState]) -> list[RequestState]:
    """`sorted(running, key=arrival_key)`: by (arrival_s, id), unique, so the order is the same; insertion
    sort, as running requests mostly stay in arrival order from one plan to the next (linear then)."""
    out = list(running)
    for i in range(1, len(out)):
        s = out[i]
        a = s.arrival_s
        sid = s.id
        j = i - 1
        while j >= 0:
            t = out[j]
            ta = t.arrival_s
            if ta < a or (ta == a and t.id < sid):
                break
            out[j + 1] = t
            j -= 1
        out[j + 1] = s
    return out


def _key(k: tuple) -> tuple:
    return k[:3]                  # (priority, arrival, id): unique, so a state is never compared


class _Candidates:
    """The live waiting candidates one `_plan_prefills` examines, in key order, each checked for eager
    relegation as it is reached. A class, not nested functions: nested functions that call each other form a
    reference cycle (their shared scope holds them), left to the cyclic collector after every plan."""

    def __init__(self, core: NiyamaCore, plan: BatchPlan, live_p: list[tuple], idx: int, now: float) -> None:
        self.core = core
        self.plan = plan
        self.live_p = live_p
        self.idx = idx
        self.now = now
        self.gone: set[int] = set()
        self.prefix: list[tuple] = []
        self.stream: Iterator[tuple] = core.live.entries(idx)

    def violates(self, k: tuple) -> bool:
        """Eager relegation of an examined candidate; True when the candidate itself was relegated."""
        core, now, gone = self.core, self.now, self.gone
        r = cast(RequestState, k[-1])
        if not core.eager_relegation or now <= core.relegate_at(r):
            return False
        target = r
        whole_queue = core.relegation_scope == "queue"
        if core.tier_importance is not None and (whole_queue or now <= prefill_deadline(r)):
            rank = core.importance(r)
            ahead = [a for a in self.live_p + self.prefix if _key(a) < _key(k) and id(a[-1]) not in gone
                     and core.importance(a[-1]) > rank]
            if ahead:     # a less important request ahead of it in line gives way
                target = max(ahead, key=lambda a: (core.importance(a[-1]), _key(a)))[-1]
            elif whole_queue:    # else the least important waiting one nearest the front
                target = core._least_important_waiting(rank, self.idx, gone) or r
        gone.add(id(target))
        why = "missed" if now > prefill_deadline(target) else "would miss"
        self.plan.relegate.append((target, f"eager relegation: {why} its deadline" if target is r else
                                   f"eager relegation: gave way to tier {r.tier} request {r.id}"))
        return target is r

    def pull(self) -> tuple | None:
        """The next live waiting entry not relegated (examined: appended to `prefix`), or None."""
        for e in self.stream:
            if id(e[-1]) in self.gone or self.violates(e):
                continue
            self.prefix.append(e)
            return e
        return None

    def live_waiting(self) -> Iterator[tuple]:
        """The examined entries still live, in order, pulling more as they are consumed."""
        prefix = self.prefix
        i = 0
        while True:
            if i >= len(prefix) and self.pull() is None:
                return
            e = prefix[i]
            i += 1
            if id(e[-1]) not in self.gone:
                yield e


def _chain(*parts: Any) -> Iterator[tuple]:
    for part in parts:
        yield from part


def _merge(a: list[tuple], b: Iterator[tuple]) -> Iterator[tuple]:
    """Two key-ordered streams of (priority, arrival, id, state) merged by key (b may be lazy)."""
    i = 0
    for e in b:
        while i < len(a) and _key(a[i]) < _key(e):
            yield a[i]
            i += 1
        yield e
    yield from a[i:]


__all__ = ["NiyamaCore", "oldest_first"]
