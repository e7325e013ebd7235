"""Capacity planning per tier: the cheapest fleet (GPU type × TP × replicas × policy stack) that meets every
tier's SLO-attainment goal for a traffic mix, with alternatives, a Pareto table, a burst what-if and a
pool-per-class comparison. Every figure comes from simulations judged as `tierserve.experiments.capacity`
judges them (pooled attainment over seeds ≥ the tier's goal, and a stable work verdict in most seeds; a run
whose verdict is undecided is lengthened, up to 4 × the mix's requests, by `capacity.judged_run`).

Search, per (GPU, TP, stack) (`search_config`): the fewest replicas that pass at the mix's rate. One replica's
capacity is measured first (`plan_probe.replica_capacity`); counts whose total capacity is clearly below the
rate are taken as failing unprobed, the search starts at rate / capacity, grows ×1.5 until a count passes, then
bisects between the largest failing and the smallest passing count (passing is taken as monotone in
replicas); the count one below the answer is always probed. Pruning: a probe's first seed runs under a watch
that stops the simulation once a tier has certainly missed by more than `clear_miss` (`plan_probe.MissWatch`),
and a probe stops after its first seed when that seed clearly misses (a tier more than `clear_miss` below its
goal, or an unstable queue); a configuration stops growing once its cost exceeds the N-th cheapest plan found
so far. A model that does not fit the GPU at that TP is skipped, with the reason. Daily curves are planned for
their busiest hour. The what-ifs (head-room, bursts, overflow, pool per class) are in `plan_whatif`.

API:
    PlanMix.from_yaml(path) / PlanMix() (the default mix)
    plan_whatif.plan_fleet(mix, executor="process", workers=None, top=5) -> Plan
    plan_output.verify_plan(plan, seeds=(100, 101, 102))   # the plan and its next-cheaper neighbour
    plan_output.write_plan(plan, outdir)                  # plan.json + one scenario YAML per row
"""
from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
    stopped: str = ""                 # why the watch stopped the first seed's run (plan_probe.MissWatch)
    wall_s: float = 0.0
    runs: dict[tuple[float, int, int], Any] | None = field(default=None, repr=False, compare=False)

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


@dataclass
class RecordingRunner:
    """A run maker (`make_run(rate, seed, num_requests)`) that keeps every run it made, so later capacity
    searches at the same rate, seed and length reuse them (`plan_whatif.headroom_job`)."""

    make: Any
    runs: dict[tuple[float, int, int], Any] = field(default_factory=dict)

    def __call__(self, rate: float, seed: int, num_requests: int | None = None) -> Any:
        key = (float(rate), int(seed), int(num_requests or 0))
        if key not in self.runs:
            self.runs[key] = self.make(rate, seed, num_requests)
        return self.runs[key]


def probe_fleet(mix: PlanMix, fleet: Fleet, seeds: Sequence[int], clear_miss: float | None = None,
                rate: float | None = None, tier_only: int | None = None, keep_runs: bool = False) -> Probe:
    """Run the fleet over `seeds` and judge it. With `clear_miss` (and more than one seed), the first seed
    runs under a `plan_probe.MissWatch` that stops the simulation once a tier has certainly missed by more
    than `clear_miss`, and the other seeds are not run after a clear miss. `keep_runs`: the probe keeps its
    runs by (rate, seed, length) for reuse."""
    import time

    from tierserve.experiments.capacity import RunLength, ScenarioRunner, judged_run
    from tierserve.experiments.plan_probe import ClearMiss, WatchedRunner
    t0 = time.perf_counter()
    cfg = scenario_for(mix, fleet, rate, tier_only)
    watching = clear_miss is not None and len(seeds) > 1
    plain = RecordingRunner(ScenarioRunner(cfg))
    rate_rps = cfg.workload.arrivals.rate
    n = int(cfg.workload.num_requests or 0)
    lengths = RunLength(n, RUN_LENGTH_GROWTH * n)      # lengthened while the verdict is undecided (capacity.py)
    runs: list[Any] = []
    clear = False
    cost = fleet.gpus * mix.price(fleet.gpu)
    for i, seed in enumerate(seeds):
        runner = RecordingRunner(WatchedRunner(cfg, clear_miss), plain.runs) if watching and i == 0 else plain
        try:
            runs.append(judged_run(runner, rate_rps, int(seed), lengths))
        except ClearMiss as e:              # the first seed already misses a tier by more than clear_miss
            names = [t.name for t in cfg.workload.tiers.tier_set()]
            goals = {t.name: t.slo.attainment for t in cfg.workload.tiers.tier_set()}
            return Probe(fleet, cost, False, {t: math.nan for t in names}, goals, 0, 1, True,
                         f"stopped at t = {e.at_s:.0f} s: {e}", time.perf_counter() - t0)
        if i == 0 and watching:
            goals = tier_goals(runs)
            _, att = judge_fleet(runs, goals)
            if not runs[0].stable or any(not math.isnan(a) and a < goals[t] - clear_miss for t, a in att.items()):
                clear = True                  # a clear miss: the other seeds would not change the verdict
                break
    goals = tier_goals(runs)
    ok, att = judge_fleet(runs, goals)
    return Probe(fleet, cost, ok and not clear, att, goals, sum(r.stable for r in runs), len(runs), clear,
                 wall_s=time.perf_counter() - t0, runs=plain.runs if keep_runs else None)


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
    replica_capacity_rps: float = math.nan    # plan_probe.replica_capacity of one replica
    bound: int = 0                            # replica counts up to this are taken as failing unprobed
    wall_s: float = 0.0


def search_config(mix: dict[str, Any], gpu: str, tp: int, stack: str, cost_cutoff: float = math.inf,
                  tier_only: int | None = None, rate: float | None = None) -> ConfigSearch:
    """Process-pool worker: the fewest replicas of (gpu, tp, stack) that pass. The search starts above the
    lower bound from one replica's measured capacity (`plan_probe`), grows ×1.5 until a count passes, then
    bisects between the largest failing and the smallest passing count; the count one below the answer is
    always probed (so the bound never decides the answer alone)."""
    import time

    from tierserve.experiments.plan_probe import replica_capacity, replica_lower_bound
    t0 = time.perf_counter()
    m = PlanMix.model_validate(mix)
    s = m.search
    out = ConfigSearch(gpu, tp, stack)
    by_r: dict[int, Probe] = {}

    def probe(r: int) -> Probe:
        if r not in by_r:
            by_r[r] = probe_fleet(m, Fleet(gpu, tp, stack, r), s.seeds, s.clear_miss, rate, tier_only,
                                  keep_runs=True)
            out.probes.append(by_r[r])
        return by_r[r]

    try:
        one = scenario_for(m, Fleet(gpu, tp, stack, 1), rate, tier_only)
        out.replica_capacity_rps = cap = replica_capacity(one, int(s.seeds[0]))
        lo = out.bound = min(replica_lower_bound(one.workload.arrivals.rate, cap), s.max_replicas - 1)
        r = max(lo + 1, min(s.max_replicas, math.ceil(one.workload.arrivals.rate / cap))
                if math.isfinite(cap) else 1)
        while True:
            if r * tp * m.price(gpu) > cost_cutoff:
                out.skipped = f"over the cost cut-off ${cost_cutoff:.2f}/h at {r} replicas"
                return _done(out, by_r, t0)
            if probe(r).passes:
                break
            lo = r
            if r >= s.max_replicas:
                out.skipped = f"misses a tier even at {r} replicas (max_replicas)"
                return _done(out, by_r, t0)
            r = min(max(r + 1, math.ceil(1.5 * r)), s.max_replicas)
        hi = r
        while True:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if probe(mid).passes:
                    hi = mid
                else:
                    lo = mid
            if hi == 1 or hi - 1 in by_r or not probe(hi - 1).passes:
                break
            hi, lo = hi - 1, 0                    # the bound was wrong here: search below it
        out.best = by_r[hi]
    except TierserveError as e:                       # e.g. the model does not fit this GPU at this TP
        out.skipped = f"cannot run: {e}"
    return _done(out, by_r, t0)


def _done(out: ConfigSearch, by_r: dict[int, Probe], t0: float) -> ConfigSearch:
    """Only the chosen probe keeps its runs (for head-room); the search's wall time."""
    import time
    for p in by_r.values():
        if p is not out.best:
            p.runs = None
    out.wall_s = time.perf_counter() - t0
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


def search_plan(mix: PlanMix, executor: str = "process", workers: int | None = None, top: int = 5,
                progress: bool = True) -> Plan:
    """Search every configuration and rank the cheapest passing fleets (`plan_whatif.plan_fleet` adds the
    what-ifs)."""
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
    plan.wall_s = time.perf_counter() - t0
    return plan
