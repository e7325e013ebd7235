"""What a planned fleet absorbs: head-room per tier (a capacity search that reuses the plan search's runs), the
burst what-if (rate × f for a window: which tier breaks first, recovery), each tier's overflow rule, and
replicas per hour for a daily curve. Split from `plan` (the search); `plan.add_extras` calls these."""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from dataclasses import asdict

from tierserve.experiments.plan import (
    HEADROOM_ROWS, RUN_LENGTH_GROWTH, Fleet, Plan, PlanMix, RecordingRunner, probe_fleet, scenario_for,
    search_config, search_plan,
)
from tierserve.workload import WorkloadConfig


def plan_fleet(mix: PlanMix, executor: str = "process", workers: int | None = None, top: int = 5,
               progress: bool = True, extras: bool = True) -> Plan:
    """Search every configuration, rank the cheapest passing fleets (`plan.search_plan`), and (with `extras`)
    add head-room, the burst what-if, overflow rules, the pool-per-class plan and, for a daily curve, replicas
    per hour."""
    import time
    t0 = time.perf_counter()
    plan = search_plan(mix, executor, workers, top, progress)
    if extras and plan.chosen is not None:
        add_extras(plan, executor, workers, progress)
    plan.wall_s = time.perf_counter() - t0
    return plan


def add_extras(plan: Plan, executor: str, workers: int | None, progress: bool) -> None:
    """Pool per class, head-room, bursts (and replicas per hour) as one batch of jobs, so the pool stays busy;
    burst factors above the what-if's run only when some tier has not broken by then."""
    from tierserve.experiments.runs import run_many
    mix, chosen = plan.mix, plan.chosen
    assert chosen is not None
    data = mix.model_dump(mode="json")
    tiers = list(chosen.goals)
    f = chosen.fleet
    first, rest = burst_factors(mix)
    jobs: list[dict[str, Any]] = [{"kind": "burst", "mix": data, "fleet": asdict(f), "factor": x} for x in first]
    for p in plan.ranked[:HEADROOM_ROWS]:
        below = next((q for s in plan.searches for q in s.probes if q.fleet == Fleet(p.fleet.gpu, p.fleet.tp,
                      p.fleet.stack, p.fleet.replicas - 1)), None)
        jobs.append({"kind": "headroom", "mix": data, "fleet": asdict(p.fleet), "runs": p.runs,
                     "below_fails": below is not None and not below.passes})
    jobs += [{"kind": "pool", "mix": data, "gpu": f.gpu, "tp": f.tp, "stack": f.stack, "tier_only": k}
             for k in range(len(tiers))]      # each tier in a pool of its own, on the chosen GPU, TP and stack
    results = run_many(extra_job, jobs, executor=executor, workers=workers, progress=progress,
                       description=f"plan: {len(jobs)} what-ifs")
    by_factor = {j["factor"]: r for j, r in zip(jobs, results) if j["kind"] == "burst"}
    broken = all(any(b["tiers"][t]["window_attainment"] < chosen.goals[t] for b in by_factor.values()
                     if t in b["tiers"]) for t in tiers)
    if rest and not broken:
        more = run_many(extra_job, [{"kind": "burst", "mix": data, "fleet": asdict(f), "factor": x} for x in rest],
                        executor=executor, workers=workers, progress=progress, description="plan: larger bursts")
        by_factor.update(zip(rest, more))
    plan.burst = by_factor[mix.burst.factor]
    plan.overflow = overflow_rules(by_factor, chosen.goals, mix.burst.length_s)
    plan.headroom = {Fleet(**j["fleet"]).label(): r for j, r in zip(jobs, results) if j["kind"] == "headroom"}
    for k, t in enumerate(tiers):
        s = next(r for j, r in zip(jobs, results) if j["kind"] == "pool" and j["tier_only"] == k)
        plan.pool_per_class.append((t, s if s.best is not None else None))
    if mix.daily_rates:
        plan.hourly = hourly_replicas(mix, chosen.fleet)


def extra_job(kind: str, **kw: Any) -> Any:
    """Process-pool worker for `plan.add_extras`: "burst", "headroom" or "pool" (a per-class search)."""
    return {"burst": burst_job, "headroom": headroom_job, "pool": search_config}[kind](**kw)


def burst_factors(mix: PlanMix) -> tuple[list[float], list[float]]:
    """The burst factors up to the what-if's own (run first), and the larger ones (run only when needed)."""
    factors = sorted({mix.burst.factor, *mix.burst.overflow_factors})
    return [f for f in factors if f <= mix.burst.factor], [f for f in factors if f > mix.burst.factor]


def headroom_job(mix: dict[str, Any], fleet: dict[str, Any], runs: Mapping[Any, Any] | None = None,
                 below_fails: bool = False) -> dict[str, float]:
    """Extra load (fraction of the mix's rate, whole mix scaled) each tier absorbs before it misses, at this
    fleet: each tier's capacity from `find_capacity` (±5%) divided by the rate, − 1. The search reuses the plan
    search's runs at the rate (`runs`) and, when the fleet with one replica fewer failed at the rate
    (`below_fails`), searches up to rate × r/(r − 1) × 1.1 (the same load per replica, 10% for pooling),
    else up to 4 × rate; a tier that still passes at the top reads as at least that (saturated)."""
    from tierserve.experiments.capacity import RunLength, ScenarioRunner, find_capacity
    m = PlanMix.model_validate(mix)
    f = Fleet(**fleet)
    cfg = scenario_for(m, f)
    rate = m.peak_rate
    n = int(cfg.workload.num_requests or 0)
    top = min(4.0, 1.1 * f.replicas / (f.replicas - 1)) if below_fails and f.replicas > 1 else 4.0
    maker = RecordingRunner(ScenarioRunner(cfg), dict(runs or {}))
    cap = find_capacity(maker, rate, top * rate, m.search.seeds, 0.05, run_length=RunLength(n, RUN_LENGTH_GROWTH * n))
    out = {"search_top": top - 1.0}              # a tier at this value passed at the top: at least this much
    for t, c in cap.tiers.items():
        if t == "all":
            continue
        out[t] = (math.nan if not c.feasible else (top - 1.0 if c.saturated else c.rate / rate - 1.0))
    return out


def _burst_workload(mix: PlanMix, factor: float) -> WorkloadConfig:
    b = mix.burst
    rate = mix.peak_rate
    wl = mix.workload_config(rate)
    n = int(math.ceil(rate * (b.start_s + factor * b.length_s + b.after_s)))
    data = wl.model_dump(mode="json")
    data["num_requests"] = n
    data["arrivals"] = {"kind": "piecewise", "rates": [rate, factor * rate, rate],
                        "durations_s": [b.start_s, b.length_s, 1e6]}
    return WorkloadConfig.model_validate(data)


def burst_job(mix: dict[str, Any], fleet: dict[str, Any], factor: float) -> dict[str, Any]:
    """The fleet under rate × factor for the burst window, over the search seeds: per tier and arrival-time bin,
    pooled attainment; the first bin (from the burst's start) where the tier misses its goal; the time after the
    burst ends until every later bin meets it (recovery); and what became of the window's requests."""
    import numpy as np

    from tierserve.experiments.capacity import with_seed
    from tierserve.experiments.scenario import run_scenario
    m = PlanMix.model_validate(mix)
    b = m.burst
    cfg = scenario_for(m, Fleet(**fleet), workload=_burst_workload(m, factor))
    tables, tier_set = [], None
    for seed in m.search.seeds:
        res = run_scenario(with_seed(cfg, int(seed)))
        tables.append(res.table)
        tier_set = res.workload.tier_set
    end_s = b.start_s + b.length_s
    out: dict[str, Any] = {"factor": factor, "start_s": b.start_s, "length_s": b.length_s, "bin_s": b.bin_s,
                           "tiers": {}}
    horizon = b.start_s + b.length_s + b.after_s
    edges = np.arange(0.0, horizon + b.bin_s, b.bin_s)
    for tier in tier_set:                                       # type: ignore[union-attr]
        goal = tier.slo.attainment
        met = np.zeros(len(edges) - 1)
        tot = np.zeros(len(edges) - 1)
        window = {"requests": 0, "met": 0, "late": 0, "relegated": 0, "rejected": 0, "censored": 0}
        for t in tables:
            mask = t.tier == tier.index
            arr = t.arrival_s[mask]
            ok = t.meets_slo[mask]
            idx = np.digitize(arr, edges) - 1
            keep = (idx >= 0) & (idx < len(met))
            np.add.at(met, idx[keep], ok[keep])
            np.add.at(tot, idx[keep], 1)
            w = (arr >= b.start_s) & (arr < end_s)
            window["requests"] += int(w.sum())
            window["met"] += int(ok[w].sum())
            fin = t.finished[mask][w]
            window["late"] += int((fin & ~ok[w] & ~t.relegated[mask][w]).sum())
            window["relegated"] += int(t.relegated[mask][w].sum())
            window["rejected"] += int(t.rejected[mask][w].sum())
            window["censored"] += int(t.censored[mask][w].sum())
        att = np.where(tot > 0, met / np.maximum(tot, 1), np.nan)
        below = [i for i in range(len(att)) if tot[i] > 0 and att[i] < goal]
        first = next((edges[i] for i in below if edges[i + 1] > b.start_s), None)
        last_bad = max((edges[i + 1] for i in below), default=None)
        out["tiers"][tier.name] = {
            "goal": goal, "bins_start_s": edges[:-1].tolist(), "attainment": att.tolist(), "count": tot.tolist(),
            "window_attainment": window["met"] / window["requests"] if window["requests"] else math.nan,
            "breaks_at_s": None if first is None else max(0.0, float(first) - b.start_s),
            "recovery_s": None if last_bad is None else max(0.0, float(last_bad) - end_s),
            "recovered": bool(last_bad is None or last_bad < horizon), "window": window}
    broken = [(v["breaks_at_s"], t) for t, v in out["tiers"].items() if v["breaks_at_s"] is not None]
    out["breaks_first"] = min(broken)[1] if broken else None
    return out


def overflow_rules(bursts: Mapping[float, dict[str, Any]], goals: Mapping[str, float], length_s: float
                   ) -> dict[str, dict[str, Any]]:
    """Per tier: the largest burst factor (for the window's length) at which its window attainment still meets
    its goal, and, at the first factor where it does not, what became of its window's requests."""
    out: dict[str, dict[str, Any]] = {}
    for tier in goals:
        absorbs, beyond = 1.0, None
        for f in sorted(bursts):
            v = bursts[f]["tiers"].get(tier)
            if v is None:
                continue
            if v["window_attainment"] >= goals[tier]:
                if beyond is None:
                    absorbs = f
            elif beyond is None:
                beyond = {"factor": f, **v["window"]}
        if beyond is None:
            rule = f"absorbs every burst tried (up to ×{max(bursts):g} for {length_s:g} s)"
        else:
            w = beyond
            fate = max(("queued (finished late)", w["late"]), ("relegated", w["relegated"]),
                       ("refused (rejected)", w["rejected"]), ("still queued at the end", w["censored"]),
                       key=lambda kv: kv[1])
            rule = (f"absorbs ×{absorbs:g} for {length_s:g} s; at ×{beyond['factor']:g} its excess is mostly "
                    f"{fate[0]}: {w['late']} late, {w['relegated']} relegated, {w['rejected']} rejected, "
                    f"{w['censored']} unfinished of {w['requests']}")
        out[tier] = {"absorbs_factor": absorbs, "beyond": beyond, "rule": rule}
    return out


def hourly_replicas(mix: PlanMix, fleet: Fleet) -> list[int]:
    """For a daily curve: the fewest replicas of the chosen configuration that pass at each hour's rate
    (bisection in [1, the peak's count]; hours with the same rate share one search)."""
    assert mix.daily_rates
    cache: dict[float, int] = {}
    s = mix.search
    for r in mix.daily_rates:
        if r in cache:
            continue
        lo, hi = 0, fleet.replicas
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if probe_fleet(mix, Fleet(fleet.gpu, fleet.tp, fleet.stack, mid), s.seeds, s.clear_miss, r).passes:
                hi = mid
            else:
                lo = mid
        cache[r] = hi
    return [cache[r] for r in mix.daily_rates]
