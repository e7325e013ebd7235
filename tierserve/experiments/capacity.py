"""Capacity of a policy stack, per stack and per tier, and loads stated as ρ = rate / capacity of a baseline.

Definitions (used by every reproduction):
- A run is judged by the work verdict (`tierserve.metrics.stability`): the unfinished work (prefill and
  decode tokens still to compute) read over the arrival span, its warm-up found by MSER and dropped, and its
  growth over the rest fitted with a 95% interval: "stable" below the tolerance, "unstable" above it,
  "undecided" when the interval straddles it. Statistics come from the same window (arrivals from the
  warm-up's end on).
- Run length is chosen by the method: each (rate, seed) runs `RunLength.start` requests and doubles while
  its verdict is undecided, up to `RunLength.most`; still undecided there, it does not pass. Every result
  states the lengths it ran (`StackCapacity.lengths`, each probe's runs).
- At one rate, over the seeds given, tier k *passes* when its pooled steady-state SLO attainment
  (Σ requests meeting the SLO / Σ requests, over seeds) reaches its goal (the tier's `SLO.attainment`, or
  `goals`; a tier without a goal is judged on stability alone) AND the run is stable in more than half of
  the seeds. One verdict covers every tier: a tier's unfinished work is part of the whole, so bounded total
  work bounds each tier's. The *stack* passes when every tier passes. *Stable* alone drops attainment.
- Capacity (stack, each tier, and stable-only) = the highest rate in [lo, hi] that passes, found by bisection
  on a geometric grid to within `rel_tol`: the stated interval is [capacity, lowest failing rate probed],
  at most (1 + rel_tol) × the capacity wide. A stricter criterion never yields a higher capacity.
- Common random numbers: every rate is run with the same seeds. The workload generators draw unit-rate
  inter-arrival gaps, lengths and tiers from independent child streams of the seed, and a rate only rescales
  the gaps (`with_rate`), so at every rate the requests are the same: same sizes, same tiers, arrival times
  scaled by 1/rate (time-varying profiles keep their shape in time and scale the intensity instead).
- ρ = rate / capacity of a named baseline stack (`rho`).

API:
    find_capacity(make_run: (rate, seed[, num_requests]) -> SteadyRun, lo, hi, seeds=(0, 1, 2), rel_tol=0.02,
                  *, goals=None, executor="serial", run_length=None) -> StackCapacity
    RunLength(start, most)                                               # the sequential run lengths
    ScenarioRunner(cfg)(rate, seed, num_requests=None) -> SteadyRun      # picklable make_run for a scenario
    scenario_capacity(cfg, lo, hi, seeds, rel_tol, run_length=...) -> StackCapacity
    run_seeds(cfg, seeds, drop_fraction, metrics, executor, outdir) -> SeedsResult
    run_seeds_many({label: cfg}, seeds, ...) -> {label: SeedsResult}   # e.g. stacks of `compare`
    with_rate(cfg, rate) -> ScenarioConfig; rate_of(cfg) -> float; rho(rate, capacity) -> float
    judge(scenario_result, rate, drop_fraction) -> SteadyRun              # a finished run, judged
StackCapacity: .rate (stack), .interval, .stable_rate, .tiers[name] / .tier_rates(), .lengths,
.runs[rate] (SteadyRun per seed).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tierserve.core import ConfigError
from tierserve.metrics import ALL, CapacityResult, Probe, bisect_rate
from tierserve.metrics.stability import (
    WORK, SeedsResult, SteadyRun, aggregate, majority, sequential_verdict, steady_run, table_work_verdict,
)

from tierserve.experiments.scenario import (
    ScenarioConfig, ScenarioResult, run_scenario, workload_seed, write_result,
)

# Metrics the per-tier tables show over seeds (TierSummary.get names).
SEED_METRICS: tuple[str, ...] = ("ttft.p50", "ttft.p99", "tpot.p50", "ttlt.p50", "ttlt.p99", "slo_attainment",
                                 "goodput_rps")


# ---- rate of a scenario -------------------------------------------------------------------------------
_RATE_FIELD = {"poisson": "rate", "gamma": "rate", "piecewise": "mean_rate", "diurnal": "mean_rate",
               "servegen": "mean_rate", "trace": "target_rate"}


def with_rate(cfg: ScenarioConfig, rate: float) -> ScenarioConfig:
    """The scenario with its workload's mean arrival rate set to `rate` req/s (all other draws unchanged)."""
    if not (math.isfinite(rate) and rate > 0):
        raise ConfigError("rate", rate, "a positive finite rate (req/s)")
    data = cfg.model_dump(mode="json")
    arrivals = data["workload"]["arrivals"]
    arrivals[_RATE_FIELD[arrivals["kind"]]] = float(rate)
    return ScenarioConfig.from_dict(data)


def with_seed(cfg: ScenarioConfig, seed: int) -> ScenarioConfig:
    return cfg.model_copy(update={"seed": int(seed)})


def rate_of(cfg: ScenarioConfig, requests: Sequence[Any] | None = None) -> float:
    """The workload's mean arrival rate (req/s); for a trace without `target_rate`, measured from its times
    ((n − 1) / arrival span of `requests`, built from `cfg` when not given)."""
    a = cfg.workload.arrivals
    value = getattr(a, _RATE_FIELD[a.kind], None)
    if value is not None:
        return float(value)
    if a.kind == "piecewise":  # no mean_rate: the profile's own time average
        return float(sum(r * d for r, d in zip(a.rates, a.durations_s)) / sum(a.durations_s))
    from tierserve.workload import build_workload
    reqs = list(requests) if requests is not None else build_workload(cfg.workload, workload_seed(cfg)).requests
    span_s = reqs[-1].arrival_s - reqs[0].arrival_s if len(reqs) > 1 else 0.0
    if span_s <= 0:
        raise ConfigError("workload.arrivals", a.kind, "a trace whose arrivals span a positive time")
    return (len(reqs) - 1) / span_s


def rho(rate: float, capacity: StackCapacity | float) -> float:
    """Load in units of a baseline's capacity: rate / capacity (NaN when the capacity was not found)."""
    cap = capacity.rate if isinstance(capacity, StackCapacity) else float(capacity)
    return rate / cap if cap > 0 and math.isfinite(cap) else math.nan


# ---- one seed of a scenario, judged ---------------------------------------------------------------------
def judge(result: ScenarioResult, rate: float = math.nan, drop_fraction: float | None = None,
          **rule: Any) -> SteadyRun:
    """Work verdict and steady-state summary of a finished scenario run.

    drop_fraction None (default): the summary starts at the warm-up the verdict found; a fraction f drops
    ⌊f·n⌋ arrivals at each end; 0 keeps the whole-run summary (token-level TBT included). The verdict is the
    same in each case.
    """
    tiers = result.workload.tier_set
    end_s = result.sim.duration_s
    if drop_fraction != 0:
        return steady_run(result.table, end_s, tiers, result.config.seed, rate, drop_fraction,
                          result.summary.extras, **rule)
    return SteadyRun(result.summary, {WORK: table_work_verdict(result.table, end_s, **rule)},
                     result.config.seed, rate, 0.0)


def with_requests(cfg: ScenarioConfig, num_requests: int) -> ScenarioConfig:
    """The scenario with `num_requests` requests (the run length; every other draw unchanged)."""
    data = cfg.model_dump(mode="json")
    data["workload"]["num_requests"] = int(num_requests)
    return ScenarioConfig.from_dict(data)


@dataclass(frozen=True)
class ScenarioRunner:
    """`make_run` for a scenario: `runner(rate, seed, num_requests)` runs `cfg` at that rate, seed and length
    (its own length when None), judged by the work verdict.

    Picklable, so `find_capacity(..., executor="process")` can spread seeds over a process pool.
    """

    cfg: ScenarioConfig
    drop_fraction: float | None = None

    def __call__(self, rate: float, seed: int, num_requests: int | None = None) -> SteadyRun:
        cfg = with_seed(self.cfg, seed) if num_requests is None else with_requests(with_seed(self.cfg, seed),
                                                                                   num_requests)
        return judge(run_scenario(with_rate(cfg, rate)), rate, self.drop_fraction)


def run_seed_job(cfg: dict, seed: int, drop_fraction: float | None, outdir: str | None = None) -> SteadyRun:
    """Process-pool worker: one seed of a scenario (given as a dict), its files written to `outdir` if set.

    The files are the whole run's; summary.json's `extras` add the verdicts and, in steady state, the window.
    """
    result = run_scenario(with_seed(ScenarioConfig.from_dict(cfg), seed))
    run = judge(result, rate_of(result.config, result.workload.requests), drop_fraction)
    if outdir:
        extras = result.summary.extras
        extras["stability"] = {k: v.to_dict() for k, v in run.stability.items()}
        if drop_fraction != 0:  # this file's summary is the whole run; the window's own is in seeds.json
            extras["steady_state"] = {**run.summary.extras["steady_state"],
                                      "summary": "whole run here; steady-state summary in ../seeds.json"}
        write_result(result, outdir)
    return run


def run_seeds(cfg: ScenarioConfig, seeds: Sequence[int], drop_fraction: float | None = None,
              metrics: Sequence[str] = SEED_METRICS, executor: str = "serial",
              outdir: str | Path | None = None) -> SeedsResult:
    """Each seed judged in steady state, and mean ± 95% per tier and metric over the seeds.

    With `outdir`, each seed's files go to `outdir/seed<N>/` and the intervals to `outdir/seeds.json`.
    """
    return run_seeds_many({"": cfg}, seeds, drop_fraction, metrics, executor, outdir)[""]


def run_seeds_many(cfgs: Mapping[str, ScenarioConfig], seeds: Sequence[int],
                   drop_fraction: float | None = None, metrics: Sequence[str] = SEED_METRICS,
                   executor: str = "serial", outdir: str | Path | None = None) -> dict[str, SeedsResult]:
    """`run_seeds` for several labelled scenarios (e.g. policy stacks) on one pool of (scenario, seed) jobs.

    With `outdir`, scenario `label` writes under `outdir/label/` (label "" writes into `outdir` itself).
    """
    from tierserve.experiments.runs import run_many
    if not seeds:
        raise ValueError("run_seeds needs at least one seed")
    from tierserve.core.files import is_stage, output_folder
    if outdir is not None and not is_stage(outdir):    # published whole: a rerun never mixes old and new seeds
        with output_folder(outdir, "outdir") as stage:
            return run_seeds_many(cfgs, seeds, drop_fraction, metrics, executor, stage)
    dirs = {label: (Path(outdir) / label if label else Path(outdir)) if outdir else None for label in cfgs}
    jobs = [{"cfg": cfg.model_dump(mode="json"), "seed": int(s), "drop_fraction": drop_fraction,
             "outdir": str(dirs[label] / f"seed{s}") if dirs[label] else None}
            for label, cfg in cfgs.items() for s in seeds]
    runs = iter(run_many(run_seed_job, jobs, executor=executor, progress=False))
    out: dict[str, SeedsResult] = {}
    for label in cfgs:
        mine = [next(runs) for _ in seeds]
        out[label] = SeedsResult(mine, aggregate([r.summary for r in mine], metrics))
        if dirs[label] is not None:
            write_seeds_json(out[label], dirs[label] / "seeds.json")
    return out


def write_seeds_json(result: SeedsResult, path: str | Path) -> Path:
    import json

    from tierserve.metrics.summary import _nan_to_none
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(_nan_to_none(result.to_dict()), indent=2, allow_nan=False) + "\n", encoding="utf-8")
    return p


# ---- capacity search ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class RunLength:
    """Sequential run lengths: `start` requests first, doubled while the verdict is undecided, up to `most`."""

    start: int = 2000
    most: int = 16000

    def __post_init__(self) -> None:
        if not (0 < self.start <= self.most):
            raise ConfigError("run_length", (self.start, self.most), "0 < start <= most requests")

    def __str__(self) -> str:
        return f"{self.start}–{self.most} requests (doubled while undecided)"


@dataclass(slots=True)
class StackCapacity:
    """Capacities of one stack (req/s). `rate`: every tier meets its goal and the run is stable;
    `tiers[name]`: that tier alone; `stable`: queue stability alone. Each is a `CapacityResult`
    (rate NaN when even `lo` failed; `saturated` when `hi` passed). `runs[rate]`: the seeds run there, each at
    the length its verdict needed; `run_length`: the rule that chose those lengths (None: the runs' own)."""

    stack: CapacityResult
    tiers: dict[str, CapacityResult]
    stable: CapacityResult
    seeds: tuple[int, ...]
    rel_tol: float
    runs: dict[float, list[SteadyRun]] = field(default_factory=dict, repr=False)
    run_length: RunLength | None = None

    @property
    def rate(self) -> float:
        return self.stack.rate

    @property
    def stable_rate(self) -> float:
        return self.stable.rate

    @property
    def interval(self) -> tuple[float, float]:
        """[capacity, lowest failing rate probed] of the stack (inf above when `hi` passed)."""
        return interval_of(self.stack)

    @property
    def lengths(self) -> tuple[int, int]:
        """(shortest, longest) run the verdicts chose over every probe and seed (requests)."""
        ns = [r.num_requests for rs in self.runs.values() for r in rs if r.num_requests]
        return (min(ns), max(ns)) if ns else (0, 0)

    def tier_rates(self) -> dict[str, float]:
        return {k: v.rate for k, v in self.tiers.items()}

    def __str__(self) -> str:
        def fmt(c: CapacityResult) -> str:
            return ("below lo" if not c.feasible else f"≥ {c.rate:.3g}" if c.saturated else f"{c.rate:.3g}")
        tiers = ", ".join(f"{k} {fmt(v)}" for k, v in self.tiers.items())
        lo, hi = self.interval
        short, long = self.lengths
        return (f"capacity {fmt(self.stack)} req/s [{lo:.3g}, {hi:.3g}) (stable-only {fmt(self.stable)}; "
                f"{tiers}); seeds {list(self.seeds)}, ±{self.rel_tol:.0%}; runs of {short}–{long} requests")

    def to_dict(self) -> dict[str, Any]:
        def one(c: CapacityResult) -> dict[str, Any]:
            return {"rate": c.rate, "saturated": c.saturated, "interval": list(interval_of(c)),
                    "probes": [{"rate": p.rate, "attainment": p.attainment, "ok": p.ok,
                                "num_requests": [r.num_requests for r in self.runs.get(p.rate, [])],
                                "verdicts": [r.verdict_line() for r in self.runs.get(p.rate, [])]}
                               for p in c.probes]}
        rl = None if self.run_length is None else {"start": self.run_length.start, "most": self.run_length.most}
        return {"rate": self.rate, "interval": list(self.interval), "stable_rate": self.stable_rate,
                "seeds": list(self.seeds), "rel_tol": self.rel_tol, "run_length": rl,
                "lengths": list(self.lengths), "stack": one(self.stack), "stable": one(self.stable),
                "tiers": {k: one(v) for k, v in self.tiers.items()}}


def interval_of(c: CapacityResult) -> tuple[float, float]:
    """[passing rate, lowest failing probe above it] of one search (inf when nothing above failed)."""
    above = [p.rate for p in c.probes if not p.ok and (not c.feasible or p.rate > c.rate)]
    return c.rate, min(above) if above else math.inf


def pooled_attainment(runs: Sequence[SteadyRun], tier: str) -> float:
    """Σ met / Σ requests of `tier` over the runs (NaN when it has no requests)."""
    met = sum(r.summary.tiers[tier].slo_met for r in runs if tier in r.summary.tiers)
    total = sum(r.summary.tiers[tier].total for r in runs if tier in r.summary.tiers)
    return met / total if total else math.nan


def judged_run(make_run: Callable[..., SteadyRun], rate: float, seed: int,
               run_length: RunLength | None = None) -> SteadyRun:
    """One (rate, seed): a single run of its own length, or lengthened while undecided (`run_length`)."""
    if run_length is None:
        return make_run(rate, seed)
    run, verdict = sequential_verdict(lambda n: make_run(rate, seed, n), run_length.start, run_length.most,
                                      lambda r: r.stability[WORK])
    run.stability[WORK] = verdict
    return run


def find_capacity(make_run: Callable[..., SteadyRun], lo: float, hi: float,
                  seeds: Sequence[int] = (0, 1, 2), rel_tol: float = 0.02, *,
                  goals: Mapping[str, float] | float | None = None, executor: str = "serial",
                  max_probes: int = 40, run_length: RunLength | None = None) -> StackCapacity:
    """Capacities of the stack behind `make_run`, per the module's definitions.

    `make_run(rate, seed)` — or `make_run(rate, seed, num_requests)` with `run_length` — must be deterministic
    and use common random numbers across rates (`ScenarioRunner` does). `goals` overrides the tiers'
    attainment goals (one number for every tier, or by tier name). Runs are cached by rate, so the searches
    share the rates they have in common.
    """
    if not (0 < lo < hi) or not (rel_tol > 0):
        raise ValueError(f"find_capacity needs 0 < lo < hi and rel_tol > 0; got lo={lo}, hi={hi}, rel_tol={rel_tol}")
    if len(seeds) == 0:
        raise ValueError("find_capacity needs at least one seed")
    seeds = tuple(int(s) for s in seeds)
    runs: dict[float, list[SteadyRun]] = {}

    def runs_at(rate: float) -> list[SteadyRun]:
        if rate not in runs:
            if executor == "serial":
                runs[rate] = [judged_run(make_run, rate, s, run_length) for s in seeds]
            else:
                from tierserve.experiments.runs import run_many
                jobs = [{"make_run": make_run, "rate": rate, "seed": s, "run_length": run_length} for s in seeds]
                runs[rate] = run_many(judged_run, jobs, executor=executor, progress=False)
        return runs[rate]

    def goal_of(run: SteadyRun, tier: str) -> float:
        if goals is None:
            return run.summary.tiers[tier].attainment_goal
        return float(goals) if isinstance(goals, (int, float)) else float(goals.get(tier, math.nan))

    def tier_passes(rs: list[SteadyRun], tier: str) -> tuple[bool, float]:
        att, goal = pooled_attainment(rs, tier), goal_of(rs[0], tier)
        meets = math.isnan(goal) or att >= goal
        return meets and majority([r.stable for r in rs]), att

    def search(check: Callable[[list[SteadyRun]], tuple[bool, float]]) -> CapacityResult:
        probes: list[Probe] = []

        def passes(rate: float) -> bool:
            ok, att = check(runs_at(rate))
            probes.append(Probe(rate, att, ok))
            return ok
        rate, saturated = bisect_rate(passes, lo, hi, rel_tol=rel_tol, max_probes=max_probes)
        return CapacityResult(rate, probes, saturated)

    tier_names = [t.name for t in runs_at(lo)[0].summary.per_tier]

    def stable_check(rs: list[SteadyRun]) -> tuple[bool, float]:
        return majority([r.stable for r in rs]), pooled_attainment(rs, ALL)

    def stack_check(rs: list[SteadyRun]) -> tuple[bool, float]:
        ok = all(tier_passes(rs, t)[0] for t in tier_names) and majority([r.stable for r in rs])
        return ok, pooled_attainment(rs, ALL)

    stable = search(stable_check)
    stack = search(stack_check)
    tiers = {t: search(lambda rs, t=t: tier_passes(rs, t)) for t in tier_names}
    return StackCapacity(stack, tiers, stable, seeds, rel_tol, runs, run_length)


def scenario_capacity(cfg: ScenarioConfig, lo: float, hi: float, seeds: Sequence[int] = (0, 1, 2),
                      rel_tol: float = 0.02, *, drop_fraction: float | None = None,
                      goals: Mapping[str, float] | float | None = None, executor: str = "serial",
                      run_length: RunLength | None = None) -> StackCapacity:
    """`find_capacity` of a scenario's stack (its cluster and workload; the workload's rate is varied).

    Run lengths: `run_length`, or by default from the scenario's own request count up to 8× it."""
    n = cfg.workload.num_requests
    rl = run_length if run_length is not None else RunLength(n, 8 * n)
    return find_capacity(ScenarioRunner(cfg, drop_fraction), lo, hi, seeds, rel_tol, goals=goals,
                         executor=executor, run_length=rl)
