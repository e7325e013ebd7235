"""Capacity planning per tier: the cheapest fleet (GPU type × TP × replicas × policy stack) that meets every
tier's SLO-attainment goal for a traffic mix, with alternatives, a Pareto table, a burst what-if and a
pool-per-class comparison. Every figure comes from simulations judged as `tierserve.experiments.capacity`
judges them (pooled attainment over seeds ≥ the tier's goal, and a stable work verdict in most seeds; a run
whose verdict is undecided is lengthened, up to 4 × the mix's requests, by `capacity.judged_run`).

Search, per (GPU, TP, stack): the fewest replicas that pass at the mix's rate — replicas doubled from 1 until a
count passes, then bisection between the last failing and the first passing count (passing is taken as
monotone in replicas). Pruning: a probe stops after its first seed when that seed clearly misses (a tier more
than `clear_miss` below its goal, or an unstable queue), and a configuration stops growing once its cost
exceeds the N-th cheapest plan found so far. A model that does not fit the GPU at that TP is skipped, with the
reason. Daily curves are planned for their busiest hour.

API:
    PlanMix.from_yaml(path) / PlanMix() (the default mix)
    plan_fleet(mix, executor="process", workers=None, top=5) -> Plan
    plan_output.verify_plan(plan, seeds=(100, 101, 102))   # the plan and its next-cheaper neighbour
    plan_output.write_plan(plan, outdir)                  # plan.json + one scenario YAML per row
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tierserve.core import ConfigError, TierserveError
from tierserve.core.errors import config_error_from_validation
from tierserve.core.files import read_mapping
from tierserve.core.limits import Float, Int
from tierserve.workload import WorkloadConfig

# On-demand list prices, US$ per GPU-hour: the midpoints of the "specialty provider" on-demand ranges in
# Mercatus, "Cloud GPU pricing" (May 2026, https://www.mercatus-ai.com/blog/cloud-gpu-pricing): A100 80GB
# $1.10-1.50, H100 SXM5 $2.50-3.50, H200 SXM5 $3.50-4.50. Hyperscalers list more (AWS p5.48xlarge, 8× H100:
# $98.32/h, i.e. $12.29 per GPU-hour); override with `prices:` in the mix or --price GPU=USD.
DEFAULT_PRICES_USD_PER_GPU_HOUR: dict[str, float] = {
    "A100-80GB": 1.30, "A100-80GB-PCIe": 1.30, "H100-80GB": 3.00, "H200": 4.00,
}
PRICE_SOURCE = ("on-demand $/GPU-h, midpoints of the specialty-provider ranges in Mercatus 'Cloud GPU pricing' "
                "(May 2026); override with --price GPU=USD")
SCHEDULER_CLS = "tierserve.engines.vllm.scheduler.TierScheduler"
RUN_LENGTH_GROWTH = 4      # a probe's run may double up to 4 × the mix's num_requests while undecided
HEADROOM_ROWS = 3          # head-room (a capacity search each) for the cheapest rows only
DEFAULT_STACKS = ("vllm+round_robin", "vllm_priority+round_robin", "sarathi+round_robin", "tierserve+tierserve")


def _default_workload() -> dict[str, Any]:
    """Three tiers (interactive, standard, batch) sharing 20/50/30%, Azure-conversation lengths."""
    return {"num_requests": 2000,
            "tiers": {"num_tiers": 3, "mix": "weights", "weights": [0.2, 0.5, 0.3],
                      "names": ["interactive", "standard", "batch"],
                      "slos": [{"ttft_s": 0.5, "tbt_s": 0.05, "attainment": 0.99},
                               {"ttft_s": 1.5, "tbt_s": 0.1, "attainment": 0.95},
                               {"ttlt_s": 60.0, "attainment": 0.9}]},
            "lengths": {"kind": "fit", "dataset": "azure2023_conv"}}


class SearchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gpus: list[str] = Field(default_factory=lambda: ["A100-80GB", "H100-80GB", "H200"], min_length=1)
    tp: list[Int] = Field(default_factory=lambda: [1, 2], min_length=1)
    stacks: list[str] = Field(default_factory=lambda: list(DEFAULT_STACKS), min_length=1,
                              description="LOCAL+CLUSTER; stacks whose policies are not registered are skipped")
    max_replicas: Int = Field(64, ge=1, le=4096)
    seeds: list[Int] = Field(default_factory=lambda: [0, 1, 2], min_length=1, max_length=100)
    clear_miss: Float = Field(0.10, ge=0, le=1, description="stop a probe after one seed this far below a goal")


class BurstConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")
    factor: Float = Field(2.0, gt=1, le=100)
    start_s: Float = Field(60.0, gt=0, le=1e6)
    length_s: Float = Field(30.0, gt=0, le=1e6)
    after_s: Float = Field(120.0, gt=0, le=1e6, description="simulated time after the burst, to see recovery")
    bin_s: Float = Field(5.0, gt=0, le=1e5, description="attainment is read per bin of arrival time")
    overflow_factors: list[Float] = Field(default_factory=lambda: [1.25, 1.5, 2.0, 3.0])


class PlanMix(BaseModel):
    """A traffic mix to plan for (YAML). `rate` (req/s) or `daily_rates` (req/s per hour; the fleet is sized
    for the busiest hour); `workload`: tier shares (tiers.weights), per-tier SLOs and goals (tiers.slos), and
    lengths (a named distribution, or a trace) — a `tierserve` workload section without arrivals."""

    model_config = ConfigDict(extra="forbid")
    name: str = Field("default-mix", max_length=200)
    model: str = "Llama-3-8B"
    rate: Float | None = Field(24.0, gt=0, le=1e6)
    daily_rates: list[Float] | None = Field(None, min_length=1, max_length=24 * 366)
    workload: dict[str, Any] = Field(default_factory=_default_workload)
    search: SearchConfig = Field(default_factory=SearchConfig)
    burst: BurstConfig = Field(default_factory=BurstConfig)
    prices: dict[str, Float] = Field(default_factory=dict, description="US$ per GPU-hour, by GPU name")
    exec_models: dict[str, str] = Field(default_factory=dict, description="calibrated model file, by GPU name")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanMix:
        try:
            mix = cls.model_validate(dict(data))
        except ValidationError as e:
            raise config_error_from_validation(e, "mix") from None
        if "arrivals" in mix.workload:
            raise ConfigError("mix.workload.arrivals", mix.workload["arrivals"],
                              "no arrivals section (the rate comes from `rate` or `daily_rates`)")
        mix.workload_config()             # validated now, so a bad field is named before any simulation
        for g in mix.search.gpus:
            mix.price(g)
        return mix

    @classmethod
    def from_yaml(cls, path: str | Path) -> PlanMix:
        return cls.from_dict(read_mapping(path, "--mix", "yaml"))

    @property
    def peak_rate(self) -> float:
        return float(max(self.daily_rates)) if self.daily_rates else float(self.rate)  # type: ignore[arg-type]

    def workload_config(self, rate: float | None = None, tier_only: int | None = None) -> WorkloadConfig:
        data = json.loads(json.dumps(self.workload))
        data["arrivals"] = {"kind": "poisson", "rate": rate or self.peak_rate}
        if tier_only is not None:           # a pool of its own: only this tier's requests, at its share
            k = int(data.get("tiers", {}).get("num_tiers", 3))
            data.setdefault("tiers", {})
            data["tiers"]["mix"] = "weights"
            data["tiers"]["weights"] = [1.0 if i == tier_only else 0.0 for i in range(k)]
        try:
            return WorkloadConfig.model_validate(data)
        except ValidationError as e:
            raise config_error_from_validation(e, "mix.workload") from None

    def shares(self) -> list[float]:
        w = self.workload_config().tiers.mix_weights()
        return [float(x) / float(sum(w)) for x in w]

    def price(self, gpu: str) -> float:
        from tierserve.hardware.specs import get_gpu
        name = get_gpu(gpu).name
        table = {**DEFAULT_PRICES_USD_PER_GPU_HOUR, **{get_gpu(k).name: v for k, v in self.prices.items()}}
        if name not in table:
            raise ConfigError("mix.prices", gpu, f"a US$/GPU-hour price for {name} (prices: {name}: 2.5)")
        return float(table[name])


# ---- one fleet, judged --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fleet:
    gpu: str
    tp: int
    stack: str
    replicas: int

    @property
    def gpus(self) -> int:
        return self.tp * self.replicas

    def label(self) -> str:
        return f"{self.replicas}× {self.gpu} TP{self.tp} {self.stack}"


@dataclass
class Probe:
    """A fleet run at the mix's rate: per-tier pooled attainment over the seeds that ran, and the verdict."""

    fleet: Fleet
    cost_usd_h: float
    passes: bool
    attainment: dict[str, float]
    goals: dict[str, float]
    stable_seeds: int
    seeds_run: int
    clear_miss: bool = False

    @property
    def worst_margin(self) -> float:
        """min over tiers of attainment − goal (negative: that tier misses)."""
        m = [a - self.goals[t] for t, a in self.attainment.items() if not math.isnan(a) and t in self.goals]
        return min(m) if m else math.nan


def scenario_for(mix: PlanMix, fleet: Fleet, rate: float | None = None, tier_only: int | None = None,
                 workload: WorkloadConfig | None = None) -> Any:
    from tierserve.experiments.scenario import ScenarioConfig
    local, _, glob = fleet.stack.partition("+")
    replica: dict[str, Any] = {"model": mix.model, "gpu": fleet.gpu, "tp": fleet.tp}
    exec_file = _exec_model_for(mix, fleet.gpu)
    if exec_file:
        replica["exec_model_file"] = exec_file
    wl = workload or mix.workload_config(rate, tier_only)
    return ScenarioConfig.from_dict({"name": f"plan {fleet.label()}", "cluster": {
        "num_replicas": fleet.replicas, "replica": replica, "local_policy": local, "cluster_policy": glob},
        "workload": wl.model_dump(mode="json")})


def _exec_model_for(mix: PlanMix, gpu: str) -> str | None:
    from tierserve.hardware.specs import get_gpu
    name = get_gpu(gpu).name
    return next((p for g, p in mix.exec_models.items() if get_gpu(g).name == name), None)


def tier_goals(runs: Sequence[Any]) -> dict[str, float]:
    """Each tier's attainment goal (its SLO's), from a run's summary."""
    from tierserve.metrics.summary import ALL
    return {t: s.attainment_goal for t, s in runs[0].summary.tiers.items() if t != ALL}


def judge_fleet(runs: Sequence[Any], goals: Mapping[str, float]) -> tuple[bool, dict[str, float]]:
    """The fleet passes when every tier with requests reaches its goal in pooled attainment over the runs and
    most runs are stable (capacity.py's rule for a stack)."""
    from tierserve.experiments.capacity import pooled_attainment
    from tierserve.metrics.stability import majority
    att = {t: pooled_attainment(runs, t) for t in goals}
    meets = all(math.isnan(a) or math.isnan(goals[t]) or a >= goals[t] for t, a in att.items())
    return meets and majority([r.stable for r in runs]), att


def probe_fleet(mix: PlanMix, fleet: Fleet, seeds: Sequence[int], clear_miss: float | None = None,
                rate: float | None = None, tier_only: int | None = None) -> Probe:
    """Run the fleet over `seeds` (stopping after the first on a clear miss) and judge it."""
    from tierserve.experiments.capacity import RunLength, ScenarioRunner, judged_run
    cfg = scenario_for(mix, fleet, rate, tier_only)
    runner = ScenarioRunner(cfg)
    rate_rps = cfg.workload.arrivals.rate
    n = int(cfg.workload.num_requests or 0)
    lengths = RunLength(n, RUN_LENGTH_GROWTH * n)      # lengthened while the verdict is undecided (capacity.py)
    runs: list[Any] = []
    clear = False
    for i, seed in enumerate(seeds):
        runs.append(judged_run(runner, rate_rps, int(seed), lengths))
        if i == 0 and clear_miss is not None and len(seeds) > 1:
            goals = tier_goals(runs)
            _, att = judge_fleet(runs, goals)
            if not runs[0].stable or any(not math.isnan(a) and a < goals[t] - clear_miss for t, a in att.items()):
                clear = True                  # a clear miss: the other seeds would not change the verdict
                break
    goals = tier_goals(runs)
    ok, att = judge_fleet(runs, goals)
    cost = fleet.gpus * mix.price(fleet.gpu)
    return Probe(fleet, cost, ok and not clear, att, goals, sum(r.stable for r in runs), len(runs), clear)


@dataclass
class ConfigSearch:
    """The search of one (GPU, TP, stack): every probe it ran, its cheapest passing fleet (None: none within
    max_replicas or the cost cut-off), or why it was skipped."""

    gpu: str
    tp: int
    stack: str
    probes: list[Probe] = field(default_factory=list)
    best: Probe | None = None
    skipped: str | None = None


def search_config(mix: dict[str, Any], gpu: str, tp: int, stack: str, cost_cutoff: float = math.inf,
                  tier_only: int | None = None, rate: float | None = None) -> ConfigSearch:
    """Process-pool worker: the fewest replicas of (gpu, tp, stack) that pass (doubling, then bisection)."""
    m = PlanMix.model_validate(mix)
    s = m.search
    out = ConfigSearch(gpu, tp, stack)
    by_r: dict[int, Probe] = {}

    def probe(r: int) -> Probe:
        if r not in by_r:
            by_r[r] = probe_fleet(m, Fleet(gpu, tp, stack, r), s.seeds, s.clear_miss, rate, tier_only)
            out.probes.append(by_r[r])
        return by_r[r]

    try:
        lo, r = 0, 1                                  # lo: the largest count known to fail
        while True:
            if r * tp * m.price(gpu) > cost_cutoff:
                out.skipped = f"over the cost cut-off ${cost_cutoff:.2f}/h at {r} replicas"
                return out
            if probe(r).passes:
                break
            lo = r
            if r >= s.max_replicas:
                out.skipped = f"misses a tier even at {r} replicas (max_replicas)"
                return out
            r = min(2 * r, s.max_replicas)
        hi = r
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if probe(mid).passes:
                hi = mid
            else:
                lo = mid
        out.best = by_r[hi]
    except TierserveError as e:                       # e.g. the model does not fit this GPU at this TP
        out.skipped = f"cannot run: {e}"
    return out


# ---- the plan -------------------------------------------------------------------------------------------------
@dataclass
class Plan:
    mix: PlanMix
    searches: list[ConfigSearch]
    ranked: list[Probe]                               # cheapest passing fleet per configuration, by cost
    pool_per_class: list[tuple[str, ConfigSearch | None]] = field(default_factory=list)
    headroom: dict[str, dict[str, float]] = field(default_factory=dict)   # fleet label -> tier -> extra load
    burst: dict[str, Any] = field(default_factory=dict)
    overflow: dict[str, dict[str, Any]] = field(default_factory=dict)
    hourly: list[int] = field(default_factory=list)   # replicas of the chosen configuration per hour
    wall_s: float = 0.0

    @property
    def chosen(self) -> Probe | None:
        return self.ranked[0] if self.ranked else None

    def all_probes(self) -> list[Probe]:
        return [p for s in self.searches for p in s.probes]

    def pareto(self) -> list[Probe]:
        """Fleets no other probed fleet beats on both cost (lower) and worst-tier margin (higher), among those
        whose queue was stable in most seeds (an unstable fleet's attainment describes a growing queue)."""
        pts = sorted((p for p in self.all_probes() if not math.isnan(p.worst_margin)
                      and 2 * p.stable_seeds > p.seeds_run),
                     key=lambda p: (p.cost_usd_h, -p.worst_margin))
        front: list[Probe] = []
        for p in pts:
            if not front or p.worst_margin > front[-1].worst_margin:
                front.append(p)
        return front

    def pool_cost(self) -> float:
        return sum(s.best.cost_usd_h if s and s.best else math.nan for _, s in self.pool_per_class)


def usable_stacks(stacks: Sequence[str]) -> tuple[list[str], list[str]]:
    """The stacks whose local and cluster policies are registered, and those that are not (by name)."""
    from tierserve.policies.cluster import CLUSTER_POLICIES
    from tierserve.policies.local import LOCAL_POLICIES
    ok, missing = [], []
    for st in stacks:
        local, _, glob = st.partition("+")
        if not local or not glob:
            raise ConfigError("mix.search.stacks", st, "LOCAL+CLUSTER, e.g. vllm+round_robin")
        (ok if local in LOCAL_POLICIES.table and glob in CLUSTER_POLICIES.table else missing).append(st)
    if not ok:
        raise ConfigError("mix.search.stacks", list(stacks), "at least one stack whose policies are registered")
    return ok, missing


def plan_fleet(mix: PlanMix, executor: str = "process", workers: int | None = None, top: int = 5,
               progress: bool = True, extras: bool = True) -> Plan:
    """Search every configuration, rank the cheapest passing fleets, and (with `extras`) add head-room, the
    burst what-if, overflow rules, the pool-per-class plan and, for a daily curve, replicas per hour."""
    import time

    from tierserve.experiments.runs import run_many
    t0 = time.perf_counter()
    stacks, _ = usable_stacks(mix.search.stacks)
    data = mix.model_dump(mode="json")
    configs = [(g, tp, st) for g in mix.search.gpus for tp in mix.search.tp for st in stacks]
    # Wave 1: the smallest TP of every GPU and stack; its top-N cost is the cut-off the other TPs must beat.
    first_tp = min(mix.search.tp)
    searches: list[ConfigSearch] = []
    cutoff = math.inf
    for wave in ([c for c in configs if c[1] == first_tp], [c for c in configs if c[1] != first_tp]):
        if not wave:
            continue
        jobs = [{"mix": data, "gpu": g, "tp": tp, "stack": st, "cost_cutoff": cutoff} for g, tp, st in wave]
        searches += run_many(search_config, jobs, executor=executor, workers=workers, progress=progress,
                             description=f"plan: {len(wave)} configurations")
        costs = sorted(s.best.cost_usd_h for s in searches if s.best is not None)
        cutoff = costs[top - 1] if len(costs) >= top else math.inf
    ranked = sorted((s.best for s in searches if s.best is not None), key=lambda p: (p.cost_usd_h, -p.worst_margin))
    plan = Plan(mix, searches, ranked[:max(top, 1)] if ranked else [])
    if extras and plan.chosen is not None:
        add_extras(plan, executor, workers, progress)
    plan.wall_s = time.perf_counter() - t0
    return plan


def add_extras(plan: Plan, executor: str, workers: int | None, progress: bool) -> None:
    from tierserve.experiments.runs import run_many
    mix, chosen = plan.mix, plan.chosen
    assert chosen is not None
    data = mix.model_dump(mode="json")
    tiers = list(chosen.goals)
    jobs: list[dict[str, Any]] = []
    f = chosen.fleet
    for k in range(len(tiers)):     # each tier in a pool of its own, on the chosen GPU, TP and stack
        jobs.append({"mix": data, "gpu": f.gpu, "tp": f.tp, "stack": f.stack, "tier_only": k})
    fleets = [asdict(p.fleet) for p in plan.ranked[:HEADROOM_ROWS]]
    jobs_h = [{"mix": data, "fleet": f} for f in fleets]
    pool = run_many(search_config, jobs, executor=executor, workers=workers, progress=progress,
                    description="plan: a pool per class")
    for k, t in enumerate(tiers):
        mine = [s for s, j in zip(pool, jobs) if j["tier_only"] == k and s.best is not None]
        plan.pool_per_class.append((t, min(mine, key=lambda s: s.best.cost_usd_h) if mine else None))  # type: ignore[union-attr]
    heads = run_many(headroom_job, jobs_h, executor=executor, workers=workers, progress=progress,
                     description="plan: head-room")
    plan.headroom = {Fleet(**f).label(): h for f, h in zip(fleets, heads)}
    factors = sorted({mix.burst.factor, *mix.burst.overflow_factors})
    bursts = run_many(burst_job, [{"mix": data, "fleet": asdict(chosen.fleet), "factor": f} for f in factors],
                      executor=executor, workers=workers, progress=progress, description="plan: bursts")
    by_factor = dict(zip(factors, bursts))
    plan.burst = by_factor[mix.burst.factor]
    plan.overflow = overflow_rules(by_factor, chosen.goals, mix.burst.length_s)
    if mix.daily_rates:
        plan.hourly = hourly_replicas(mix, chosen.fleet)


def headroom_job(mix: dict[str, Any], fleet: dict[str, Any]) -> dict[str, float]:
    """Extra load (fraction of the mix's rate, whole mix scaled) each tier absorbs before it misses, at this
    fleet: each tier's capacity from `find_capacity` over [rate, 4 × rate] (±5%), divided by the rate, − 1."""
    from tierserve.experiments.capacity import RunLength, scenario_capacity
    m = PlanMix.model_validate(mix)
    cfg = scenario_for(m, Fleet(**fleet))
    rate = m.peak_rate
    n = int(cfg.workload.num_requests or 0)
    cap = scenario_capacity(cfg, rate, 4 * rate, m.search.seeds, 0.05,
                            run_length=RunLength(n, RUN_LENGTH_GROWTH * n))
    out = {}
    for t, c in cap.tiers.items():
        if t == "all":
            continue
        out[t] = (math.nan if not c.feasible else (3.0 if c.saturated else c.rate / rate - 1.0))
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
