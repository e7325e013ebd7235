"""`tierserve` dispatch: the cluster half of the tier contract (docs/contract.md), paired with the `tierserve`
replica policy, whose budget rule and service order it predicts.

K-tier Llumnix (seed 000) keeps KV head-room for the upper tiers so bulk traffic avoids the replicas that
hold them; here the scarce resource is iteration time. A replica whose running decodes include a TBT target
T runs at most the prefill chunk whose predicted iteration fits `tbt_margin`·T (the replica policy's rule), so
what a request meets on replica i is read off i's predictor:

    chunk_i  = max_prefill_tokens_within(margin·T_i, B_i, C_i)    (B_i decodes over C_i context tokens; the
                                                                    whole `token_budget` when no TBT binds)
    iter_i   = iteration_time(chunk_i, chunk_i²/2, B_i, C_i)
    ahead_i  = prefill tokens left of i's queued and partially prefilled requests served before r in the
               replica's (tier, deadline, arrival) order
    t_first  = (ahead_i + P_r) / chunk_i · iter_i                  (r's predicted wait for its first token)

* a protected request (tier < `protected_tiers`) goes where its first token comes soonest among the
  replicas with TBT head-room for it — those where a floor chunk next to its own decode still fits
  margin·its TBT — (all replicas if none has), so it meets few decodes and large spare iteration time;
* any other request goes where its first token comes soonest, which steers bulk prefill away from replicas
  whose chunks are throttled by a protected decode (their chunk_i is small);
* deferral: while every replica's *interactive* backlog — the seconds to clear the queued prefill work of
  the non-deferrable tiers, at chunk_i per iter_i — exceeds `defer_backlog_s` (a burst), a request of a
  deferrable tier (default: those with no TTFT/TBT target) is held in the global queue instead of joining a
  replica; it is released when the backlog falls or when `release_fraction` of its TTLT has passed, so it
  still finishes in time. Held requests are retried every `retry_period_s`; the cluster records every
  deferral in requests.csv (reason "deferred: …", dispatch_s after arrival_s).

* re-dispatch (`redispatch`): every `retry_period_s`, a waiting request of an unprotected interactive tier
  that holds no KV and has no first token yet (relegated or not), whose predicted first token on its replica
  is past its TTFT deadline, moves to the replica where it comes soonest if it comes in time there — a
  queued move (no KV to copy; `sim.migration`), at most one per source replica per tick. The dispatch-time
  choice goes stale when a burst or a protected decode shrinks a replica's chunk; this corrects it.

Ties: fewer outstanding requests, then the lower index. `headroom=False` (ablation) dispatches every request
to the replica with the fewest outstanding requests; `defer=False` never holds.
"""
from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from tierserve.core import ConfigError, RequestState
from tierserve.policies.cluster.base import ClusterPolicy, InstanceView, Move
from tierserve.policies.local.deadlines import prefill_deadline
from tierserve.policies.local.tierserve import (
    DEFAULT_MIN_CHUNK_TOKENS, DEFAULT_PROTECTED_TIERS, DEFAULT_TBT_MARGIN, check_count, check_flag,
    check_fraction, is_decoding, DEFAULT_SIZE_WEIGHT_S_PER_TOKEN, ServiceOrder,
)

DEFAULT_DEFER_BACKLOG_S = 0.5     # interactive prefill backlog (s) above which every replica counts as bursting
DEFAULT_RELEASE_FRACTION = 0.5    # a held request is released once half its TTLT has passed
DEFAULT_RETRY_PERIOD_S = 0.05     # how often held requests are retried
DEFAULT_REDISPATCH = False        # move waiting KV-less unprotected requests to a replica where they make TTFT
DEFAULT_REDISPATCH_GAIN_S = math.inf   # also move one whose first token comes this much sooner elsewhere
DEFAULT_GATHER_FRACTION = 0.0     # > 0: a protected request joins an already-throttled replica if its first
                                  # is predicted within this fraction of its TTFT there


class ReplicaOutlook:
    """What a request would meet on one replica now: its decodes, their tightest TBT target, the chunk the
    replica policy would run, the iteration's predicted time, and its queued prefill work in service order."""

    __slots__ = ("decodes", "context", "tbt_s", "protected_decodes", "chunk", "iteration_s", "queued",
                 "outstanding", "predictor", "key", "_sorted", "_prefix")

    def __init__(self, inst: InstanceView, predictor: Any, token_budget: int, margin: float,
                 min_chunk: int, protected_tiers: int, key: ServiceOrder) -> None:
        self.key = key
        decodes = context = protected = 0
        tbt = math.inf
        queued: list[tuple[tuple, int, bool]] = []     # (service key, prefill tokens left, interactive)
        for r in inst.running:
            if is_decoding(r):
                decodes += 1
                context += r.num_computed_tokens + 1
                protected += r.tier < protected_tiers
                t = r.slo.tbt_s
                if t is not None and t < tbt:
                    tbt = t
            else:
                queued.append((key(r), r.num_tokens - r.num_computed_tokens, r.slo.interactive))
        for r in (*inst.waiting, *inst.swapped):
            queued.append((key(r), r.num_tokens - r.num_computed_tokens, r.slo.interactive))
        self.decodes, self.context, self.tbt_s, self.queued = decodes, context, tbt, queued
        self.protected_decodes = protected
        self.outstanding = inst.num_outstanding
        self.predictor = predictor
        room = max(token_budget - decodes, 1)
        self.chunk = room if tbt == math.inf else max(predictor.max_prefill_tokens_within(
            tbt * margin, decodes, context, 0, lo=min(min_chunk, room), hi=room), 1)
        c = self.chunk
        self.iteration_s = predictor.iteration_time(c, c * c * 0.5, decodes, context)
        self._sorted: list[tuple] | None = None     # queued service keys in order, and prefix sums of tokens
        self._prefix: list[int] = []

    def wait_s(self, tokens: int) -> float:
        """Predicted seconds to run `tokens` prefill tokens at this replica's chunk and iteration time."""
        return tokens / self.chunk * self.iteration_s

    def first_token_s(self, state: RequestState) -> float:
        key = self.key(state)
        ahead = 0
        for k, tokens, _ in self.queued:
            if k < key:
                ahead += tokens
        return self.wait_s(ahead + state.num_tokens - state.num_computed_tokens)

    def first_token_by_order_s(self, state: RequestState) -> float:
        """`first_token_s` by bisection on the queue sorted once (for many reads of one outlook)."""
        if self._sorted is None:
            entries = sorted((k, tokens) for k, tokens, _ in self.queued)
            self._sorted = [k for k, _ in entries]
            self._prefix = [0]
            for _, tokens in entries:
                self._prefix.append(self._prefix[-1] + tokens)
        ahead = self._prefix[bisect_left(self._sorted, self.key(state))]
        return self.wait_s(ahead + state.num_tokens - state.num_computed_tokens)

    def move_in(self, state: RequestState) -> None:
        """Count `state` as queued here (a re-dispatch moved it in)."""
        self.queued.append((self.key(state), state.num_tokens - state.num_computed_tokens, state.slo.interactive))
        self.outstanding += 1
        self._sorted = None

    def move_out(self, state: RequestState) -> None:
        key = self.key(state)
        self.queued = [q for q in self.queued if q[0] != key]
        self.outstanding -= 1
        self._sorted = None

    def interactive_backlog_s(self) -> float:
        return self.wait_s(sum(tokens for _, tokens, interactive in self.queued if interactive))


class TierServeDispatch(ClusterPolicy):
    """Iteration-time head-room dispatch with burst deferral of the deferrable tiers (module docstring).

    protected_tiers — tiers < this are placed by TBT head-room first;
    tbt_margin, min_chunk_tokens, token_budget — the replica policy's budget rule, as it runs there;
    headroom — False: fewest outstanding requests instead (ablation);
    redispatch — move a waiting, KV-less request of an unprotected interactive tier predicted to miss its TTFT
      on its replica to one where it is predicted to make it (module docstring), every retry_period_s;
    defer — hold deferrable requests in the global queue during a burst; defer_tiers: which tiers (None: the
      tiers whose SLO has no TTFT/TBT target); defer_backlog_s: the interactive backlog (s) on every replica
      that counts as a burst; release_fraction: fraction of a held request's TTLT after which it is released
      whatever the load; retry_period_s: how often held requests are retried;
    predictor — an execution-time model to use instead of each replica's own (views without one).
    """

    name = "tierserve"
    uses_instance_predictor = True        # each replica's predictor, unless one is given (`predictor`)

    def __init__(self, protected_tiers: int = DEFAULT_PROTECTED_TIERS, tbt_margin: float = DEFAULT_TBT_MARGIN,
                 min_chunk_tokens: int = DEFAULT_MIN_CHUNK_TOKENS, token_budget: int = 2048,
                 headroom: bool = True, defer: bool = True, redispatch: bool = DEFAULT_REDISPATCH,
                 redispatch_gain_s: float = DEFAULT_REDISPATCH_GAIN_S, defer_tiers: Sequence[int] | None = None,
                 defer_backlog_s: float = DEFAULT_DEFER_BACKLOG_S,
                 release_fraction: float = DEFAULT_RELEASE_FRACTION,
                 retry_period_s: float = DEFAULT_RETRY_PERIOD_S, gather_fraction: float = DEFAULT_GATHER_FRACTION,
                 size_weight_s_per_token: float = DEFAULT_SIZE_WEIGHT_S_PER_TOKEN, predictor: Any = None) -> None:
        self.protected_tiers = check_count("protected_tiers", protected_tiers, 0)
        self.tbt_margin = check_fraction("tbt_margin", tbt_margin)
        self.min_chunk_tokens = check_count("min_chunk_tokens", min_chunk_tokens, 1)
        self.token_budget = check_count("token_budget", token_budget, 1)
        self.headroom = check_flag("headroom", headroom)
        self.defer = check_flag("defer", defer)
        self.redispatch = check_flag("redispatch", redispatch)
        if isinstance(redispatch_gain_s, bool) or not isinstance(redispatch_gain_s, (int, float)) or not (
                redispatch_gain_s >= 0):
            raise ConfigError("redispatch_gain_s", redispatch_gain_s, "a number of seconds >= 0 (inf: only late ones)")
        self.redispatch_gain_s = float(redispatch_gain_s)
        self.migrates = self.redispatch      # the simulator runs the moves `rebalance` returns (queued moves)
        if defer_tiers is not None and (isinstance(defer_tiers, (str, bytes)) or not isinstance(defer_tiers, Sequence)
                                        or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                   for t in defer_tiers)):
            raise ConfigError("defer_tiers", defer_tiers, "null (the non-interactive tiers) or a list of tiers >= 0")
        self.defer_tiers = None if defer_tiers is None else frozenset(defer_tiers)
        if isinstance(defer_backlog_s, bool) or not isinstance(defer_backlog_s, (int, float)) or not (
                math.isfinite(defer_backlog_s) and defer_backlog_s >= 0):
            raise ConfigError("defer_backlog_s", defer_backlog_s, "a finite number of seconds >= 0")
        self.defer_backlog_s = float(defer_backlog_s)
        self.release_fraction = check_fraction("release_fraction", release_fraction)
        if isinstance(gather_fraction, bool) or not isinstance(gather_fraction, (int, float)) or not (
                0.0 <= gather_fraction <= 1.0):
            raise ConfigError("gather_fraction", gather_fraction, "a fraction in [0, 1] (0: no gathering)")
        self.gather_fraction = float(gather_fraction)
        if isinstance(size_weight_s_per_token, bool) or not isinstance(size_weight_s_per_token, (int, float)) or not (
                math.isfinite(size_weight_s_per_token) and size_weight_s_per_token >= 0):
            raise ConfigError("size_weight_s_per_token", size_weight_s_per_token, "a finite number of s per token >= 0")
        self.key = ServiceOrder(True, float(size_weight_s_per_token))
        if isinstance(retry_period_s, bool) or not isinstance(retry_period_s, (int, float)) or not (
                math.isfinite(retry_period_s) and retry_period_s > 0):
            raise ConfigError("retry_period_s", retry_period_s, "a positive finite number of seconds")
        # The cluster retries held requests (and asks for re-dispatches) at every rebalance tick.
        self.rebalance_period_s = float(retry_period_s) if defer or redispatch else None
        if predictor is not None and not callable(getattr(predictor, "max_prefill_tokens_within", None)):
            raise ConfigError("predictor", predictor, "an execution-time model with max_prefill_tokens_within(...)")
        self.predictor = predictor

    # ----- the global queue: tier lanes, arrival order within a lane -----
    def queue_lane(self, state: RequestState) -> int:
        return state.tier

    def queue_key(self, state: RequestState, now: float) -> tuple:
        return (state.tier, state.arrival_s, state.id)

    def dispatch_order(self, queued: list[RequestState], now: float) -> list[RequestState]:
        return sorted(queued, key=lambda s: self.queue_key(s, now))

    # ----- dispatch -----
    def deferrable(self, state: RequestState) -> bool:
        if self.defer_tiers is not None:
            return state.tier in self.defer_tiers
        return not state.slo.interactive

    def outlooks(self, instances: Sequence[InstanceView]) -> list[ReplicaOutlook]:
        out = []
        for inst in instances:
            predictor = self.predictor if self.predictor is not None else getattr(inst, "predictor", None)
            if predictor is None:
                raise ConfigError("predictor", None, "an execution-time model: this instance view carries none")
            out.append(ReplicaOutlook(inst, predictor, self.token_budget, self.tbt_margin, self.min_chunk_tokens,
                                      self.protected_tiers, self.key))
        return out

    def has_headroom(self, view: ReplicaOutlook, state: RequestState) -> bool:
        """A floor chunk next to the replica's decodes and this request's own still fits margin·its TBT."""
        tbt = state.slo.tbt_s
        if tbt is None:
            return True
        c = self.min_chunk_tokens
        t = view.predictor.iteration_time(c, c * c * 0.5, view.decodes + 1, view.context + state.num_tokens)
        return t <= tbt * self.tbt_margin

    def dispatch(self, state: RequestState, instances: Sequence[InstanceView], now: float) -> int | None:
        if not self.headroom:
            return min(range(len(instances)), key=lambda i: (instances[i].num_outstanding, i))
        views = self.outlooks(instances)
        if self.defer and self.deferrable(state) and self.bursting(views) and not self.due(state, now):
            return None
        candidates = list(range(len(views)))
        first = [v.first_token_s(state) for v in views]
        if state.tier < self.protected_tiers:
            roomy = [i for i in candidates if self.has_headroom(views[i], state)]
            if roomy:
                candidates = roomy
            tbt, ttft = state.slo.tbt_s, state.slo.ttft_s
            if tbt is not None and ttft is not None and self.gather_fraction > 0:
                # Gather: a replica already throttled by a decode as tight as this one costs no more
                # throughput; the one with most protected decodes, while the first token comes in time there.
                soon = self.gather_fraction * ttft
                gathered = [i for i in candidates if views[i].tbt_s <= tbt and first[i] <= soon]
                if gathered:
                    return min(gathered, key=lambda i: (-views[i].protected_decodes, first[i], i))
        return min(candidates, key=lambda i: (first[i], views[i].outstanding, i))

    def rebalance(self, instances: Sequence[InstanceView], now: float) -> list[Move]:
        """Re-dispatch (module docstring): at most one queued move per source replica."""
        if not self.redispatch:
            return []
        protected = self.protected_tiers
        views: list[ReplicaOutlook] | None = None
        moves: list[Move] = []
        for i, inst in enumerate(instances):
            movable = [r for r in inst.waiting if r.tier >= protected and r.num_blocks == 0 and r.num_generated == 0
                       and r.slo.ttft_s is not None]
            if not movable:
                continue
            if views is None:
                views = self.outlooks(instances)
            here = views[i]
            gain = self.redispatch_gain_s
            for r in sorted(movable, key=self.key):
                deadline = r.arrival_s + r.slo.ttft_s
                if now + here.first_token_by_order_s(r) <= deadline and gain == math.inf:
                    continue
                others = [(views[j].first_token_by_order_s(r), views[j].outstanding, j)
                          for j in range(len(views)) if j != i]
                if not others:
                    break
                first, _, j = min(others)
                if now + first <= deadline or first + self.redispatch_gain_s <= here.first_token_by_order_s(r):
                    moves.append(Move(r, i, j))
                    here.move_out(r)
                    views[j].move_in(r)
                    break
        return moves

    def bursting(self, views: Sequence[ReplicaOutlook]) -> bool:
        """Every replica's interactive backlog exceeds `defer_backlog_s`."""
        return all(v.interactive_backlog_s() > self.defer_backlog_s for v in views)

    def due(self, state: RequestState, now: float) -> bool:
        """A held request is released once `release_fraction` of its TTLT (or its deadline's span) passed."""
        span = prefill_deadline(state) - state.arrival_s
        return span == math.inf or now - state.arrival_s >= self.release_fraction * span
