"""One budget loop for the size- and boost-ordered replica policies (`fcfs`, `sjf`, `srpt`, `las`, the boost
family): every request on the replica — running, swapped, waiting — in one priority order, served in that
order on vLLM v1's batch shape (chunked prefill, per-chunk KV allocation, a token budget, `max_num_seqs`).

Per iteration, in key order (smaller first): a request runs its next decode token or a prefill chunk (at
most `chunk` tokens, 0 = the budget). When it lacks KV blocks it may evict running requests later in the order
— worst first — that `evictable` allows (a *priority* preemption). A running request that still lacks blocks
evicts any later running request, and as a last resort itself (a *forced* preemption, counted apart). A
waiting or swapped request that does not fit stops admission (later ones may not jump it), while running
requests after it keep their turn. Both kinds are counted per request in `policy_data`
(`priority_preemptions`, `forced_preemptions`, and `preempted_s`, the seconds spent evicted).

Skip-ahead stays exact: a decode-only plan that preempted nothing is repeatable for as long as no request
left out (a *blocked* one) could overtake a scheduled one. A subclass says how its keys move with decoded
tokens (`key_after`) and when its evictability or any state changes (`token_horizon`, `time_horizon`);
`plan` turns that into `BatchPlan.max_repeat` / `revise_at_s`.
"""
from __future__ import annotations

from typing import Any

from tierserve.core import AllocationRule, BatchPlan, ConfigError, PreemptMode, RequestState, Status
from tierserve.policies.local.base import LocalPolicy, ReplicaView
from tierserve.policies.local.chunks import next_chunk
from tierserve.policies.local.vllm import is_decode_step, parse_preempt_mode

NEVER = 1 << 30


class PriorityLoopPolicy(LocalPolicy):
    name = "priority_loop"
    default_token_budget = 2048
    default_max_num_seqs = 256
    allocation = AllocationRule.PER_CHUNK
    preempt_modes = (PreemptMode.RECOMPUTE, PreemptMode.SWAP)
    uses_watermark = False

    def __init__(self, preempt_mode: str = "recompute", chunk: int = 0) -> None:
        self._mode = parse_preempt_mode(preempt_mode)
        if not (isinstance(chunk, int) and chunk >= 0):
            raise ConfigError("chunk", chunk, "an integer >= 0 (prefill tokens per request per iteration; 0 = budget)")
        self.chunk = chunk
        self._swap_left = 0

    # ----- what a subclass defines -----
    def key(self, s: RequestState) -> tuple:
        """Priority of `s` now (smaller first); ties are broken by (arrival, id) after it."""
        raise NotImplementedError

    def key_after(self, s: RequestState, j: int) -> tuple:
        """The key a running decode would have after j more tokens (default: keys do not move)."""
        return self.key(s)

    def evictable(self, victim: RequestState, by: RequestState) -> bool:
        """May `by` evict `victim` (later in the order) for priority? Default: always."""
        return True

    def token_horizon(self, scheduled: list[RequestState]) -> int:
        """Decode iterations until the policy's own state (evictability, counters) changes; NEVER if not."""
        return NEVER

    def time_horizon(self, view: ReplicaView, scheduled: list[RequestState], blocked: list[RequestState]) -> float:
        """Simulated time at which keys move on their own (aging); inf if never."""
        return float("inf")

    def begin(self, view: ReplicaView) -> None:
        """Called at the start of every plan (state that depends on time)."""

    def victim_mode(self, victim: RequestState, view: ReplicaView) -> PreemptMode:
        return self._mode

    def preempt_mode(self, state: RequestState) -> PreemptMode:
        return self._mode

    # ----- the loop -----
    def full_key(self, s: RequestState) -> tuple:
        return (*self.key(s), s.arrival_s, s.id)

    def plan(self, view: ReplicaView) -> BatchPlan:
        self.begin(view)
        now = view.now
        bs = view.block_size
        budget = view.token_budget
        cap = view.max_num_seqs
        free = view.free_blocks
        self._swap_left = view.free_swap_blocks
        chunk = self.chunk
        order = sorted((*view.running, *view.swapped, *view.waiting), key=self.full_key)
        plan = BatchPlan()
        scheduled, preempt = plan.scheduled, plan.preempt
        evicted: set[int] = set()
        blocked: list[RequestState] = []
        held = len(view.running)
        admit = True
        decode_only = True
        for idx, r in enumerate(order):
            if r.id in evicted:
                continue
            running = r.status == Status.RUNNING
            if len(scheduled) >= cap or budget <= 0 or (not running and (not admit or held >= cap)):
                blocked.append(r)
                continue
            n = next_chunk(r, chunk, budget)
            need = self.blocks_to_hold(r, n, bs) - r.num_blocks
            if need > free:
                for v in reversed(order[idx + 1:]):        # priority victims, worst first
                    if need <= free:
                        break
                    if v.status == Status.RUNNING and v.id not in evicted and self.evictable(v, r):
                        free += self._evict(v, r, False, view, preempt, evicted)
                        held -= 1
                if need > free and running:
                    for v in reversed(order[idx + 1:]):    # forced: the running request must make progress
                        if need <= free:
                            break
                        if v.status == Status.RUNNING and v.id not in evicted:
                            free += self._evict(v, r, True, view, preempt, evicted)
                            held -= 1
                    if need > free:
                        self._evict(r, r, True, view, preempt, evicted)
                        held -= 1
                        continue
                if need > free:
                    admit = False
                    blocked.append(r)
                    continue
            if need > 0:
                free -= need
            scheduled.append((r, n))
            budget -= n
            if not running:
                held += 1
                self._resumed(r, now)
            if decode_only and not is_decode_step(r, n):
                decode_only = False
        if decode_only and scheduled and not preempt:
            self._set_horizon(plan, view, [r for r, _ in scheduled], blocked)
        return plan

    def _set_horizon(self, plan: BatchPlan, view: ReplicaView, scheduled: list[RequestState],
                     blocked: list[RequestState]) -> None:
        k = self.token_horizon(scheduled)
        if blocked:
            best = min(self.full_key(b) for b in blocked)
            for v in scheduled:
                j = self._overtaken_after(v, best, k)
                if j < k:
                    k = j
            plan.revise_at_s = self.time_horizon(view, scheduled, blocked)
        if k < 1:
            return
        plan.repeatable = True
        plan.max_repeat = k

    def _overtaken_after(self, v: RequestState, best: tuple, limit: int) -> int:
        """Smallest j ≥ 1 with key_after(v, j) ordered after `best` (keys are monotone in j); `limit` if none."""
        def after(j: int) -> bool:
            return (*self.key_after(v, j), v.arrival_s, v.id) > best
        if not after(limit):
            return limit
        lo, hi = 0, limit                     # after(lo) False (j = 0 is the present order), after(hi) True
        step = 1
        while step < limit and not after(step):
            lo = step
            step *= 2
        if step < limit:
            hi = step
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if after(mid):
                hi = mid
            else:
                lo = mid
        return hi

    def _evict(self, v: RequestState, by: RequestState, forced: bool, view: ReplicaView, preempt: list,
               evicted: set[int]) -> int:
        mode = self.victim_mode(v, view)
        if mode == PreemptMode.SWAP:
            if v.num_blocks > self._swap_left:
                mode = PreemptMode.RECOMPUTE
            else:
                self._swap_left -= v.num_blocks
        preempt.append((v, mode))
        evicted.add(v.id)
        d = v.policy_data
        label = "forced_preemptions" if forced else "priority_preemptions"
        d[label] = d.get(label, 0) + 1
        d["preempted_at_s"] = view.now
        return v.num_blocks

    def _resumed(self, r: RequestState, now: float) -> None:
        d = r.policy_data
        t = d.pop("preempted_at_s", None)
        if t is not None:
            d["preempted_s"] = d.get("preempted_s", 0.0) + (now - t)
        self.on_dispatch(r)

    def on_dispatch(self, r: RequestState) -> None:
        """`r` is admitted (first time) or resumed after a preemption in the plan being built."""


def preemption_counts(states: list[RequestState]) -> dict[str, Any]:
    """Totals of the per-request counters the priority loop keeps."""
    out = {"priority_preemptions": 0, "forced_preemptions": 0}
    for s in states:
        for k in out:
            out[k] += s.policy_data.get(k, 0)
    return out
