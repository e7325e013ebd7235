"""How the planner runs one fleet cheaply: a measured per-replica capacity that bounds the replica search from
below, and a watch on a running simulation that stops it once a tier has clearly missed.

`replica_capacity(cfg)`: one replica of the configuration offered the mix's rate for a short run (at most
`CAPACITY_REQUESTS` requests, the drain after the last arrival cut by the cluster's own `time_limit_s`): the
work it completes per second over the second half of the arrival span (tokens, read with
`metrics.stability.unfinished_work`), divided by the mix's mean work per request — requests per second. A
saturated replica completes at least the work it completes at any SLO-meeting load, so a fleet of r replicas
with r × capacity below the rate (by more than `BOUND_SLACK`) cannot keep up: the search starts above that.

`MissWatch`: a simulator sink (`simulate(..., sink=...)`, the simulator's own interface for requests as they
end) that keeps every state, as the simulator would, and raises `ClearMiss` as soon as one tier has more
certain misses in the run than (1 − goal + clear_miss) of its requests. A miss is certain when a request ended
without meeting its SLO, or is still unfinished past the last instant at which it could still meet it
(arrival + TTLT target; or arrival + TTFT target + TBT target × (output − 1), TBT being judged on mean TPOT):
the whole run's attainment of that tier is then below goal − clear_miss whatever the simulation does next.
A run that is not stopped gives the same table as `run_scenario` (tests/test_plan_probe.py checks it).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

CAPACITY_REQUESTS = 600     # requests in the one-replica capacity run
BOUND_SLACK = 0.9           # fleets with r × capacity < 0.9 × rate are taken as failing without a probe


class ClearMiss(Exception):
    """Raised by `MissWatch` inside the simulation: `tier` has `missed` certain misses of `total` by `at_s`."""

    def __init__(self, tier: str, missed: int, total: int, at_s: float) -> None:
        super().__init__(f"{tier}: {missed} of {total} requests certainly missed by t = {at_s:.1f} s")
        self.tier, self.missed, self.total, self.at_s = tier, missed, total, at_s


class MissWatch:
    """Simulator sink: holds the ended states (index order) and their reasons; see the module docstring."""

    def __init__(self, requests: list[Any], tier_set: Any, clear_miss: float | None) -> None:
        n = len(requests)
        self.states: list[Any] = [None] * n
        self.reasons: dict[int, str] = {}
        self.clear_miss = clear_miss
        self.now = 0.0
        if clear_miss is None:
            return
        tiers = list(tier_set)
        self.names = [t.name for t in tiers]
        tier = np.array([r.tier for r in requests], dtype=np.int64)
        deadline = np.array([_deadline(r) for r in requests], dtype=np.float64)
        self.deadline = deadline
        self.by_deadline = np.argsort(deadline, kind="stable")
        self.next = 0
        self.tier = tier
        self.totals = np.bincount(tier, minlength=len(tiers))
        self.limit = np.array([(1.0 - t.slo.attainment + clear_miss) * self.totals[t.index] for t in tiers])
        self.missed = np.zeros(len(tiers), dtype=np.int64)
        self.counted = np.zeros(n, dtype=bool)          # counted as a certain miss already
        self.ended = np.zeros(n, dtype=bool)

    def add(self, index: int, state: Any, reason: str | None) -> None:
        self.states[index] = state
        if reason is not None:
            self.reasons[state.id] = reason
        if self.clear_miss is None:
            return
        self.ended[index] = True
        fin = float(state.finish_s)
        self.now = max(self.now, fin if fin >= 0 else float(state.arrival_s))
        if not self.counted[index] and not self._meets(state):
            self.counted[index] = True
            self.missed[self.tier[index]] += 1
        order, dl = self.by_deadline, self.deadline
        while self.next < len(order) and dl[order[self.next]] < self.now:
            i = order[self.next]
            self.next += 1
            if not self.ended[i] and not self.counted[i]:
                self.counted[i] = True
                self.missed[self.tier[i]] += 1
        over = np.nonzero(self.missed > self.limit)[0]
        if over.size:
            k = int(over[0])
            raise ClearMiss(self.names[k], int(self.missed[k]), int(self.totals[k]), self.now)

    def _meets(self, state: Any) -> bool:
        """As `RequestTable.meets_slo` for one ended state (finished, and every set target met)."""
        from tierserve.core.request import Status
        if state.status != Status.FINISHED:
            return False
        s = state.slo
        first, fin, arr = float(state.first_token_s), float(state.finish_s), float(state.arrival_s)
        if s.ttft_s is not None and not first - arr <= s.ttft_s:
            return False
        gaps = state.num_generated - 1
        if s.tbt_s is not None and gaps > 0 and not (fin - first) / gaps <= s.tbt_s:
            return False
        return not (s.ttlt_s is not None and not fin - arr <= s.ttlt_s)


def _deadline(r: Any) -> float:
    """The last instant at which request `r` can still meet its SLO (inf: none, while it has no TTLT target and
    not both TTFT and TBT)."""
    s, d = r.slo, math.inf
    if s.ttlt_s is not None:
        d = r.arrival_s + s.ttlt_s
    if s.ttft_s is not None and s.tbt_s is not None:
        d = min(d, r.arrival_s + s.ttft_s + s.tbt_s * max(r.output_tokens - 1, 0))
    return d


def watched_run(cfg: Any, clear_miss: float | None) -> Any:
    """`run_scenario(cfg)` (non-streamed) with a `MissWatch` on it: raises `ClearMiss` when it stops the run."""
    from tierserve.experiments.scenario import ScenarioResult, token_tbt, workload_seed
    from tierserve.metrics import RequestTable, summarize
    from tierserve.sim import simulate
    from tierserve.workload import build_workload
    workload = build_workload(cfg.workload, workload_seed(cfg))
    watch = MissWatch(workload.requests, workload.tier_set, clear_miss)
    sim = simulate(cfg.cluster, workload.requests, num_tiers=len(workload.tier_set), seed=cfg.seed, sink=watch)
    table = RequestTable.from_states(watch.states, watch.reasons)
    extras = {k: v for k, v in sim.stats.items() if k != "wall_s"}
    extras["clipped_prompts"] = workload.num_clipped
    extras["clamped_outputs"] = workload.num_clamped
    summary = summarize(table, token_tbt(sim), sim.duration_s, workload.tier_set, extras)
    return ScenarioResult(cfg, workload, sim, table, summary)


@dataclass(frozen=True)
class WatchedRunner:
    """`ScenarioRunner` whose runs carry a `MissWatch` (`clear_miss` None: no watch, the plain runner's runs)."""

    cfg: Any
    clear_miss: float | None = None

    def __call__(self, rate: float, seed: int, num_requests: int | None = None) -> Any:
        from tierserve.experiments.capacity import judge, with_rate, with_requests, with_seed
        cfg = with_seed(self.cfg, seed) if num_requests is None else with_requests(with_seed(self.cfg, seed),
                                                                                   num_requests)
        return judge(watched_run(with_rate(cfg, rate), self.clear_miss), rate)


def replica_capacity(cfg: Any, seed: int) -> float:
    """Requests per second one replica of `cfg`'s configuration completes when offered `cfg`'s rate (module
    docstring); `cfg` must have one replica."""
    from tierserve.experiments.capacity import with_requests, with_seed
    from tierserve.experiments.scenario import ScenarioConfig, run_scenario
    from tierserve.metrics.stability import unfinished_work
    rate = float(cfg.workload.arrivals.rate)
    n = min(int(cfg.workload.num_requests or CAPACITY_REQUESTS), CAPACITY_REQUESTS)
    data = with_requests(with_seed(cfg, seed), n).model_dump(mode="json")
    data["cluster"]["time_limit_s"] = 1.2 * n / rate + 1.0      # the drain is not needed: cut it
    res = run_scenario(ScenarioConfig.from_dict(data))
    t = res.table
    keep = ~t.rejected
    a = np.asarray(t.arrival_s, dtype=np.float64)[keep]
    first = np.asarray(t["first_token_s"], dtype=np.float64)[keep]
    fin = np.asarray(t["finish_s"], dtype=np.float64)[keep]
    p = np.asarray(t["prompt_tokens"], dtype=np.float64)[keep]
    d = np.asarray(t["output_tokens"], dtype=np.float64)[keep]
    if a.size < 2:
        return math.inf
    t0, t1 = float(np.quantile(a, 0.5)), float(a.max())
    left = unfinished_work([t0, t1], a, first, fin, p, d)
    arrived = np.array([(p + d)[a <= x].sum() for x in (t0, t1)])
    done = (arrived[1] - left[1]) - (arrived[0] - left[0])
    per_request = float((p + d).mean())
    if t1 <= t0 or per_request <= 0:
        return math.inf
    return max(done / (t1 - t0), 1e-9) / per_request


def replica_lower_bound(rate: float, capacity_rps: float) -> int:
    """The largest replica count taken as failing without a probe: r × capacity < BOUND_SLACK × rate."""
    if not (capacity_rps > 0) or math.isinf(capacity_rps):
        return 0
    return max(0, math.ceil(BOUND_SLACK * rate / capacity_rps) - 1)
