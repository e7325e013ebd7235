"""`tierserve`: the replica half of the tier contract (docs/contract.md) on vLLM v1's batch shape — chunked
prefill, per-chunk KV allocation, recompute preemption, a token budget and `max_num_seqs` — so the vLLM
adapter can run it as it runs `vllm_priority`.

Each iteration:

* every running decode runs one token;
* the prefill tokens next to them are capped so that the iteration's *predicted* time (the replica's
  execution-time model, `predictor.max_prefill_tokens_within`) stays within `tbt_margin` × the tightest TBT
  target among the running decodes (tier 0's 50 ms when one decodes here, tier 1's 100 ms when only tier 1
  does, the whole token budget when no decode has a TBT target); never less than `min_chunk_tokens`, so
  prefills always progress (a batch whose decodes alone exceed the target then runs that one small chunk);
* prefill candidates — partial prefills and waiting requests — are taken in (tier, prefill deadline,
  arrival) order (`tier_deadline_key`; the deadline is a + TTFT, a + TTLT, or the next token's after a
  recompute), each a chunk of what is left of the budget; a waiting request that does not fit its KV stops
  admission (vLLM's rule), a partial prefill, which holds its blocks, still runs;
* KV victims (when the decodes' next blocks do not fit) are taken from the lowest tier and the latest
  deadline; a decode of a protected tier (tier < `protected_tiers`) is evicted only when nothing else is
  left, so it is never preempted while a lower tier runs;
* displacement: when the head of the waiting order is of a protected tier and the replica already holds
  `max_num_seqs` requests, the worst running request of a lower tier is preempted (recompute) so the head
  is admitted in this iteration (stock vLLM cannot: vllm-project/vllm#40004). At most one per iteration.

Skip-ahead: a decode-only plan that preempted nothing is `repeatable` — the same decodes are planned again
until an arrival, a completion or a KV shortfall (its keys do not move with time). No other promise is made
(`decode_batch`, `admits_waiting`, `repeats_prefill_chunk` keep their defaults): the executor asks `plan`
at every other iteration.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from tierserve.core import AllocationRule, BatchPlan, ConfigError, PreemptMode, RequestState
from tierserve.policies.local.base import LocalPolicy, ReplicaView
from tierserve.policies.local.chunks import next_chunk
from tierserve.policies.local.deadlines import prefill_deadline

DEFAULT_TBT_MARGIN = 0.9          # predicted iteration time may use 90% of the tightest TBT target
DEFAULT_MIN_CHUNK_TOKENS = 16     # prefill tokens every iteration may run whatever the target (progress)
DEFAULT_PROTECTED_TIERS = 1       # tier 0 is the premium tier
DEFAULT_SIZE_WEIGHT_S_PER_TOKEN = 0.0      # > 0: each prompt token left counts as this much later a deadline


class ServiceOrder:
    """The key of the replica's service order (smaller first): relegated requests last; then the tier (unless
    `by_tier` is off: the ablation that orders by deadline alone); then the prefill deadline pushed back by
    `size_weight_s_per_token` per prefill token left (seed 003's hybrid priority: under overload the short
    prompts that can still make their deadline go first, so fewer requests miss); then arrival."""

    __slots__ = ("by_tier", "size_weight")

    def __init__(self, by_tier: bool = True, size_weight_s_per_token: float = 0.0) -> None:
        self.by_tier = by_tier
        self.size_weight = size_weight_s_per_token

    def __call__(self, state: RequestState) -> tuple[bool, int, float, float, int]:
        rest = state.num_tokens - state.num_computed_tokens
        return (state.relegated_s >= 0.0, state.tier if self.by_tier else 0,
                prefill_deadline(state) + self.size_weight * rest, state.arrival_s, state.id)

    def __reduce__(self) -> tuple:
        return (ServiceOrder, (self.by_tier, self.size_weight))


def is_decoding(state: RequestState) -> bool:
    """Its next iteration is one decode token (not a prompt chunk or a recompute)."""
    return state.num_tokens - state.num_computed_tokens == 1 and state.num_generated > 0


def check_fraction(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value <= 1.0:
        raise ConfigError(name, value, "a fraction in (0, 1]")
    return float(value)


def check_count(name: str, value: int, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(name, value, f"an integer >= {minimum}")
    return value


def check_flag(name: str, value: bool) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(name, value, "true | false")
    return value


class TierServePolicy(LocalPolicy):
    """The tier contract on one replica (module docstring). Every knob is an ablation or a margin:

    tbt_budget — cap prefill tokens by the tightest TBT target (False: the whole token budget, as vLLM);
    tbt_margin — fraction of that target the predicted iteration may take;
    min_chunk_tokens — prefill tokens an iteration may always run;
    tier_order — waiting and victim order by tier first (False: by deadline alone);
    protect_decodes — never evict a protected tier's decode while another request runs (False: the victim
      is simply the worst (tier, deadline) running request, decodes included);
    displace — a waiting protected request may displace a lower-tier running one at max_num_seqs;
    protected_tiers — how many top tiers are protected (tier < protected_tiers).
    """

    name = "tierserve"
    default_token_budget = 2048
    default_max_num_seqs = 256
    allocation = AllocationRule.PER_CHUNK
    preempt_modes = (PreemptMode.RECOMPUTE,)
    uses_watermark = False           # v1's KV manager admits while blocks are free
    follows_engine_defaults = True   # budget and batch cap as vLLM picks them for the GPU
    uses_predictor = True            # the budget asks the execution-time model every iteration
    waiting_order_key: ServiceOrder | None = None     # set per instance: the key moves only with relegation

    def __init__(self, tbt_budget: bool = True, tbt_margin: float = DEFAULT_TBT_MARGIN,
                 min_chunk_tokens: int = DEFAULT_MIN_CHUNK_TOKENS, tier_order: bool = True,
                 protect_decodes: bool = True, displace: bool = True,
                 protected_tiers: int = DEFAULT_PROTECTED_TIERS, bank_loose: bool = True,
                 relegate: bool = True, lift_for_protected: bool = True,
                 size_weight_s_per_token: float = DEFAULT_SIZE_WEIGHT_S_PER_TOKEN) -> None:
        self.tbt_budget = check_flag("tbt_budget", tbt_budget)
        self.tbt_margin = check_fraction("tbt_margin", tbt_margin)
        self.min_chunk_tokens = check_count("min_chunk_tokens", min_chunk_tokens, 1)
        self.tier_order = check_flag("tier_order", tier_order)
        self.protect_decodes = check_flag("protect_decodes", protect_decodes)
        self.displace = check_flag("displace", displace)
        self.protected_tiers = check_count("protected_tiers", protected_tiers, 0)
        self.bank_loose = check_flag("bank_loose", bank_loose)
        self.relegate = check_flag("relegate", relegate)
        self.lift_for_protected = check_flag("lift_for_protected", lift_for_protected)
        if isinstance(size_weight_s_per_token, bool) or not isinstance(size_weight_s_per_token, (int, float)) or not (
                math.isfinite(size_weight_s_per_token) and size_weight_s_per_token >= 0):
            raise ConfigError("size_weight_s_per_token", size_weight_s_per_token, "a finite number of s per token >= 0")
        self.key = ServiceOrder(tier_order, float(size_weight_s_per_token))
        self.waiting_order_key = self.key
        self.displacements = 0           # lower-tier requests preempted to admit a protected one
        self.protected_evictions = 0     # protected decodes evicted for KV (only protected requests left)

    def order_waiting(self, waiting: Sequence[RequestState]) -> list[RequestState]:
        return sorted(waiting, key=self.key)

    # ----- the budget rule -----
    def tightest_tbt_s(self, decodes: Sequence[RequestState]) -> float:
        """The smallest TBT target among `decodes` (inf when none has one)."""
        t = math.inf
        for r in decodes:
            tbt = r.slo.tbt_s
            if tbt is not None and tbt < t:
                t = tbt
        return t

    def iteration_limits_s(self, decodes: Sequence[RequestState], now: float) -> tuple[float, float]:
        """(strict, loose): the longest predicted iteration the protected and the other running decodes
        allow (inf where none has a TBT target).

        A protected decode allows margin × its TBT, every iteration. A loose one (with `bank_loose`) allows
        what is left until its next token's deadline on the margin's pace from its first token,
        first_token + num_generated × margin × TBT − now: tokens it got early are banked (its TBT is judged
        on mean TPOT), tokens it got late are caught up with smaller chunks; without `bank_loose`, margin × TBT.
        """
        strict = loose = math.inf
        margin = self.tbt_margin
        protected = self.protected_tiers
        bank = self.bank_loose
        for r in decodes:
            tbt = r.slo.tbt_s
            if tbt is None:
                continue
            if r.tier < protected:
                if margin * tbt < strict:
                    strict = margin * tbt
            else:
                t = r.first_token_s + r.num_generated * margin * tbt - now if bank else margin * tbt
                if t < loose:
                    loose = t
        return strict, loose

    def iteration_limit_s(self, view: ReplicaView, decodes: Sequence[RequestState],
                          head: RequestState | None) -> float:
        """This iteration's limit: the tighter of (strict, loose); but when `head`, the first prefill in line,
        is a protected request whose first token that limit would make late (its prompt's rest at that limit's
        chunk, iteration after iteration, past a + TTFT), the limit is lifted for it (`lift_for_protected`) to
        the protected decodes' TBT target itself (no margin; no limit when none decodes): a premium first token
        outranks a loose tier's pace and the margin, never a premium decode's target."""
        if not self.tbt_budget:
            return math.inf
        strict, loose = self.iteration_limits_s(decodes, view.now)
        limit = strict if strict < loose else loose
        if (not self.lift_for_protected or head is None or head.tier >= self.protected_tiers
                or head.num_generated > 0 or head.slo.ttft_s is None):
            return limit
        lifted = math.inf                          # the protected decodes' tightest TBT target (inf: none runs)
        for r in decodes:
            tbt = r.slo.tbt_s
            if tbt is not None and r.tier < self.protected_tiers and tbt < lifted:
                lifted = tbt
        if lifted <= limit:
            return limit
        rest = head.num_tokens - head.num_computed_tokens
        chunk = self._chunk_within(view, decodes, limit, head.num_computed_tokens)
        ctx = 0
        for r in decodes:
            ctx += r.num_computed_tokens + 1
        per_iteration_s = view.predictor.iteration_time(chunk, chunk * (head.num_computed_tokens + chunk * 0.5),
                                                        len(decodes), ctx)
        if view.now + -(-rest // chunk) * per_iteration_s > head.arrival_s + head.slo.ttft_s:
            return lifted
        return limit

    def _chunk_within(self, view: ReplicaView, decodes: Sequence[RequestState], limit: float,
                      prefill_context: int) -> int:
        """The predictor's largest prefill chunk next to `decodes` within `limit` s (at least the floor)."""
        room = view.token_budget - len(decodes)
        if room <= 0:
            return 0
        if limit == math.inf:
            return room
        ctx = 0
        for r in decodes:
            ctx += r.num_computed_tokens + 1
        return view.predictor.max_prefill_tokens_within(limit, len(decodes), ctx, prefill_context,
                                                        lo=min(self.min_chunk_tokens, room), hi=room)

    # ----- victims -----
    def victim_order_key(self, state: RequestState) -> tuple:
        """Larger is evicted first: unprotected before protected decodes, then the lowest tier, latest deadline."""
        shielded = self.protect_decodes and state.tier < self.protected_tiers and is_decoding(state)
        return (not shielded, *self.key(state))

    # ----- the batch -----
    def plan(self, view: ReplicaView) -> BatchPlan:
        plan = BatchPlan()
        preempt = plan.preempt
        bs = view.block_size
        free = view.free_blocks
        max_seqs = view.max_num_seqs
        running = list(view.running)
        waiting = self.order_waiting(view.waiting)
        gone: set[int] = set()
        victims = sorted(running, key=self.victim_order_key)        # worst last

        def evict(v: RequestState) -> int:
            gone.add(id(v))
            preempt.append((v, PreemptMode.RECOMPUTE))
            victims.remove(v)
            return v.num_blocks

        # Displacement: admit a protected head of line into a full batch.
        if (self.displace and waiting and len(running) >= max_seqs and waiting[0].tier < self.protected_tiers):
            head = waiting[0]
            worst = victims[-1] if victims else None
            if worst is not None and worst.tier > head.tier:
                free += evict(worst)
                self.displacements += 1
        # KV for the decodes' next tokens: evict from the tail of the victim order until they fit.
        decodes = [r for r in running if id(r) not in gone and is_decoding(r)]
        need = 0
        for r in decodes:
            n = -(-(r.num_computed_tokens + 1) // bs) - r.num_blocks
            if n > 0:
                need += n
        while need > free and victims:
            v = victims[-1]
            if v.tier < self.protected_tiers and is_decoding(v):
                self.protected_evictions += 1
            if is_decoding(v):
                n = -(-(v.num_computed_tokens + 1) // bs) - v.num_blocks
                need -= n if n > 0 else 0
            free += evict(v)
        decodes = [r for r in decodes if id(r) not in gone]
        scheduled = plan.scheduled
        for r in decodes:
            scheduled.append((r, 1))
        free -= need
        # Prefill candidates in service order: partial prefills (hold blocks) merged with waiting requests.
        partial = [r for r in running if id(r) not in gone and not is_decoding(r)]
        candidates = sorted(partial + waiting, key=self.key) if partial else waiting
        context = max((r.num_computed_tokens for r in partial), default=0)
        limit = self.iteration_limit_s(view, decodes, candidates[0] if candidates else None)
        left = self._chunk_within(view, decodes, limit, context)
        if self.relegate and candidates:
            candidates = self._relegate(view, plan, candidates, decodes, left)
        num_seqs = len(running) - len(preempt)
        partial_ids = {id(p) for p in partial}
        admitting = True
        for r in candidates:
            if left <= 0 or len(scheduled) >= max_seqs:
                break
            held = id(r) in partial_ids
            if not held and (not admitting or num_seqs >= max_seqs):
                continue
            n = next_chunk(r, 0, left)
            need_r = -(-(r.num_computed_tokens + n) // bs) - r.num_blocks
            if need_r > free:
                admitting = admitting and held      # the first that does not fit stops admission (vLLM v1)
                continue
            free -= need_r if need_r > 0 else 0
            scheduled.append((r, n))
            left -= n
            if not held:
                num_seqs += 1
        self._fit_to_target(view, plan, decodes, limit)
        # Relegation moves with time: a plan that left a candidate it could relegate later is not repeated.
        plan.repeatable = (not preempt and not plan.relegate and all(is_decoding(r) for r, _ in scheduled)
                           and not (self.relegate and any(self._may_relegate(r) for r in candidates)))
        return plan

    def _may_relegate(self, r: RequestState) -> bool:
        return (r.relegated_s < 0.0 and r.tier >= self.protected_tiers and r.slo.ttft_s is not None
                and r.num_generated == 0)

    def _relegate(self, view: ReplicaView, plan: BatchPlan, candidates: list[RequestState],
                  decodes: list[RequestState], chunk: int) -> list[RequestState]:
        """Eager relegation (seed 003) of the loose interactive tiers: a candidate still waiting for its first
        token whose predicted first token — the prefill tokens ahead of it in line and its own, at this
        iteration's chunk per predicted iteration — is past its TTFT deadline goes behind every request that
        can still make it (it still runs; its outcome is RELEGATED). Protected tiers are never relegated."""
        ctx = 0
        for r in decodes:
            ctx += r.num_computed_tokens + 1
        c = max(chunk, 1)
        per_token_s = view.predictor.iteration_time(c, c * c * 0.5, len(decodes), ctx) / c
        now = view.now
        ahead = 0
        kept: list[RequestState] = []
        moved: list[RequestState] = []
        for r in candidates:
            left = r.num_tokens - r.num_computed_tokens
            if self._may_relegate(r) and now + (ahead + left) * per_token_s > r.arrival_s + r.slo.ttft_s:
                plan.relegate.append((r, "relegated: predicted to miss its TTFT"))
                moved.append(r)
                continue
            if r.relegated_s < 0.0:
                ahead += left
            kept.append(r)
        return kept + moved if moved else candidates

    def _fit_to_target(self, view: ReplicaView, plan: BatchPlan, decodes: list[RequestState], limit: float) -> None:
        """Several prefill chunks share the budget computed for one: trim the last chunk while the batch's
        predicted time exceeds `limit` (never below `min_chunk_tokens` of prefill in all)."""
        if limit == math.inf:
            return
        ctx = sum(r.num_computed_tokens + 1 for r in decodes)
        scheduled = plan.scheduled
        while True:
            chunks = scheduled[len(decodes):]
            if len(chunks) < 2:
                return
            tokens = sum(n for _, n in chunks)
            pairs = sum(n * (r.num_computed_tokens + n * 0.5) for r, n in chunks)
            if view.predictor.iteration_time(tokens, pairs, len(decodes), ctx) <= limit:
                return
            r, n = chunks[-1]
            keep = self.min_chunk_tokens - (tokens - n)      # what the last chunk must keep of the floor
            if n <= keep:
                return
            if n == 1:
                scheduled.pop()
            else:
                scheduled[-1] = (r, max(n // 2, keep))
