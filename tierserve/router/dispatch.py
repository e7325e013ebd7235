"""Admission and dispatch: per-tier caps with each tier's overflow rule, the global per-tier queue, and the
cluster policy choosing an engine — the simulator's `ClusterPolicy` objects, over the router's `EngineView`s.

A request is first given a served tier: its own while the tier is under its cap (and nobody of that tier waits
ahead of it); at the cap, the tier's rule: `downgrade` (try the next tier, recursively), `queue` (wait in the
tier's lane) or `reject` (429). Then the policy picks among the ready engines; `None` holds it in the lane.
A lane full is a 429 with Retry-After; no ready engine, a 503. Held requests are retried, in the policy's
`dispatch_order`, whenever a request ends or a scrape lands; nothing overtakes a request the policy held.
"""
from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Sequence

from tierserve.core import Request, RequestState
from tierserve.core.slo import SLO
from tierserve.policies.cluster.base import ClusterPolicy
from tierserve.router.config import RouterConfig
from tierserve.router.engines import EnginePool
from tierserve.router.metrics import RouterMetrics
from tierserve.router.tiers import RequestRefused
from tierserve.router.view import EngineView


@dataclass(eq=False)
class Ticket:
    """One request's place in the router, from admission to its end."""

    id: int
    asked_tier: int
    slo: SLO
    prompt_tokens: int
    max_tokens: int
    arrival_s: float
    tier: int = -1                               # served tier, once admitted
    state: RequestState | None = None
    engine: EngineView | None = None
    waiter: asyncio.Future | None = field(default=None, repr=False)
    queued_s: float = -1.0
    tried: set[int] = field(default_factory=set)   # engine ids that failed to take it (connect refused)


class Dispatcher:
    def __init__(self, cfg: RouterConfig, pool: EnginePool, policy: ClusterPolicy, metrics: RouterMetrics) -> None:
        self.cfg = cfg
        self.pool = pool
        self.policy = policy
        self.metrics = metrics
        self.names = [t.name for t in cfg.tiers]
        self.in_flight = [0] * len(cfg.tiers)
        self.lanes: list[deque[Ticket]] = [deque() for _ in cfg.tiers]
        self.t0 = time.monotonic()
        self._next_id = 0
        policy.setup(len(cfg.engines), cfg.seed)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def ticket(self, asked_tier: int, slo: SLO, prompt_tokens: int, max_tokens: int) -> Ticket:
        self._next_id += 1
        return Ticket(self._next_id, asked_tier, slo, prompt_tokens, max_tokens, self.now())

    # ---- admission ----------------------------------------------------------------------------------------
    def _at_cap(self, tier: int) -> bool:
        cap = self.cfg.tiers[tier].max_in_flight
        return cap is not None and self.in_flight[tier] >= cap

    def admit(self, tk: Ticket) -> EngineView | None:
        """The engine the request goes to now, or None when it waits (then `wait`). Raises RequestRefused."""
        if not self.pool.ready():
            raise self.unavailable(tk.asked_tier)
        t = tk.asked_tier
        while self._at_cap(t) or self.lanes[t]:
            rule = self.cfg.tiers[t].overflow
            if rule == "downgrade":
                t += 1
                continue
            if rule == "reject" or len(self.lanes[t]) >= self.cfg.tiers[t].max_queued:
                raise self.shed(tk, t, "tier_full" if rule == "reject" else "queue_full")
            self._make_state(tk, t)
            return self._enqueue(tk)
        self._make_state(tk, t)
        view = self._choose(tk)
        if view is None:
            if len(self.lanes[t]) >= self.cfg.tiers[t].max_queued:
                raise self.shed(tk, t, "queue_full")
            return self._enqueue(tk)
        self._send(tk, view)
        return view

    def _make_state(self, tk: Ticket, tier: int) -> None:
        tk.tier = tier
        req = Request(tk.id, tk.arrival_s, tk.prompt_tokens, tk.max_tokens, tier, tk.slo)
        tk.state = RequestState(req)
        if tier != tk.asked_tier:
            self.metrics.downgraded.labels(self.names[tk.asked_tier], self.names[tier]).inc()

    def _choose(self, tk: Ticket) -> EngineView | None:
        ready = [v for v in self.pool.ready() if v.engine_id not in tk.tried]
        if not ready:
            return None
        for i, v in enumerate(ready):
            v.index = i
        try:
            target = self.policy.dispatch(tk.state, ready, self.now())
        except Exception as e:        # a policy's refusal (e.g. a tier it was not configured for): this request only
            raise RequestRefused(500, f"cluster policy {self.cfg.cluster_policy} failed: {type(e).__name__}: "
                                      f"{str(e)[:300]}", None, outcome="policy_error", kind="server_error") from None
        if target is None:
            return None
        if isinstance(target, bool) or not isinstance(target, int) and not hasattr(target, "__index__"):
            raise RequestRefused(500, f"cluster policy returned {target!r}, not an engine index", None,
                                 outcome="policy_error", kind="server_error")
        target = int(target)
        if not 0 <= target < len(ready):
            raise RequestRefused(500, f"cluster policy returned engine {target} of {len(ready)}", None,
                                 outcome="policy_error", kind="server_error")
        return ready[target]

    def _send(self, tk: Ticket, view: EngineView) -> None:
        tk.engine = view
        tk.state.dispatch_s = self.now()
        tk.state.replica = view.engine_id
        view.sent(tk.state)
        self.in_flight[tk.tier] += 1
        self.metrics.in_flight.labels(self.names[tk.tier]).set(self.in_flight[tk.tier])
        self.metrics.dispatched.labels(self.names[tk.tier], view.url).inc()

    def _enqueue(self, tk: Ticket) -> None:
        tk.waiter = asyncio.get_running_loop().create_future()
        tk.queued_s = self.now()
        self.lanes[tk.tier].append(tk)
        self.metrics.queued.labels(self.names[tk.tier]).set(len(self.lanes[tk.tier]))
        return None

    async def wait(self, tk: Ticket) -> EngineView:
        """Wait in the queue for an engine; 429 (or 503 with no engine up) after the tier's queue timeout.
        Cancelled (client gone): leaves the queue."""
        try:
            return await asyncio.wait_for(asyncio.shield(tk.waiter), self.cfg.tiers[tk.tier].queue_timeout_s)
        except asyncio.TimeoutError:
            self._unqueue(tk)
            if not self.pool.ready():
                raise self.unavailable(tk.asked_tier) from None
            raise self.shed(tk, tk.tier, "queue_timeout") from None
        except asyncio.CancelledError:
            if tk.engine is not None:          # dispatched just as the client left: give the slot back
                self.release(tk)
            self._unqueue(tk)
            raise
        finally:
            if tk.queued_s >= 0:
                self.metrics.queue_time.labels(self.names[tk.tier]).observe(self.now() - tk.queued_s)

    def _unqueue(self, tk: Ticket) -> None:
        lane = self.lanes[tk.tier]
        if tk in lane:
            lane.remove(tk)
            self.metrics.queued.labels(self.names[tk.tier]).set(len(lane))

    def retry_elsewhere(self, tk: Ticket) -> EngineView | None:
        """The engine refused the connection (never saw the request): take it back, try another one now."""
        self.release(tk, drain=False)
        tk.tried.add(tk.engine.engine_id)
        tk.engine = None
        view = self._choose(tk)
        if view is not None:
            self._send(tk, view)
        return view

    # ---- the end of a request ---------------------------------------------------------------------------
    def release(self, tk: Ticket, drain: bool = True) -> None:
        if tk.engine is not None and tk.state is not None and tk.state.id in tk.engine.mine:
            tk.engine.ended(tk.state)
            self.in_flight[tk.tier] -= 1
            self.metrics.in_flight.labels(self.names[tk.tier]).set(self.in_flight[tk.tier])
        if drain:
            self.drain()

    def drain(self) -> None:
        """Retry held requests in the policy's order; one the policy holds stops the round (strict order);
        one whose tier is at its cap waits without blocking other tiers."""
        if not any(self.lanes) or not self.pool.ready():
            return
        queued = [tk for lane in self.lanes for tk in lane if not tk.waiter.done()]
        by_id = {tk.state.id: tk for tk in queued}
        for state in self.policy.dispatch_order([tk.state for tk in queued], self.now()):
            tk = by_id[state.id]
            if self._at_cap(tk.tier):
                continue
            try:
                view = self._choose(tk)
            except RequestRefused as e:
                self._unqueue(tk)
                tk.waiter.set_exception(e)
                continue
            if view is None:
                break
            self._unqueue(tk)
            self._send(tk, view)
            tk.waiter.set_result(view)

    # ---- refusals ---------------------------------------------------------------------------------------
    def shed(self, tk: Ticket, tier: int, reason: str) -> RequestRefused:
        self.metrics.shed.labels(self.names[tk.asked_tier], reason).inc()
        retry = self.cfg.tiers[tier].retry_after_s
        why = {"tier_full": f"tier {self.names[tier]} is at its limit of {self.cfg.tiers[tier].max_in_flight} "
                            "requests in flight",
               "queue_full": f"tier {self.names[tier]}'s queue is full ({self.cfg.tiers[tier].max_queued})",
               "queue_timeout": f"waited {self.cfg.tiers[tier].queue_timeout_s:g} s in tier {self.names[tier]}'s "
                                "queue"}[reason]
        return RequestRefused(429, f"{why}; retry after {retry} s", None, outcome="shed",
                              headers={"retry-after": str(retry)}, kind="rate_limit_exceeded")

    def unavailable(self, tier: int) -> RequestRefused:
        retry = self.cfg.retry_after_unavailable_s
        return RequestRefused(503, f"no engine is ready; retry after {retry} s", None, outcome="unavailable",
                              headers={"retry-after": str(retry)}, kind="service_unavailable")

    def snapshot(self) -> dict:
        return {"in_flight": dict(zip(self.names, self.in_flight)),
                "queued": {n: len(lane) for n, lane in zip(self.names, self.lanes)}}


def engines_json(views: Sequence[EngineView]) -> list[dict]:
    return [{"url": v.url, "ready": v.ready, "outstanding": v.num_outstanding, "running": v.num_running,
             "queued": v.num_queued, "used_blocks": v.used_blocks, "total_blocks": v.total_blocks,
             "router_in_flight": len(v.mine), "kv_metric": v.last.kv_metric,
             "prefix_cache_hit_rate": None if v.prefix_hit_rate != v.prefix_hit_rate else v.prefix_hit_rate}
            for v in views]
