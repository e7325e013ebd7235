"""The K-tier study (seed 000, issue 13): what do K priority tiers buy, and where — in units of capacity.

Workload: every run serves the same ten SLO classes c0…c9 (uniform mix, 10% each; Azure-2023 conversation
lengths clipped to 4,096 tokens). Class c has a TTFT target of `0.5 s · 1.5^c` (c0 0.5 s … c9 19.2 s) and an
attainment goal of 95%; the ladder is fixed, so it does not change with K. A scheduler with K tiers sees the
classes bucketed in order: class c runs as tier ⌊c·K/10⌋ (K = 1: one tier; K = 10: one class per tier).
Two-level `llumnix` uses its own cut (tier 0 = c0 only: its 10% priority ratio; or c0…c4: 50%).

Stacks (one batch shape for all: vLLM v1 token budget 2,048, 256 sequences; a repeat at 512):
  fcfs          infaas + vllm           INFaaS-style dispatch (least committed KV blocks among instances that fit
                                        the prompt; no priority, no migration) and FCFS replicas — the baseline
  local_prio    infaas + vllm_priority  + local priority only (vLLM v1 priority scheduling, priority = tier)
  headroom      llumnix_k + vllm        + global headroom only (per-tier freeness dispatch; no migration, no hold)
  both          llumnix_k + vllm_priority                (headroom dispatch and local priority)
  +migration    llumnix_k(migration) + vllm_priority
  +hold         llumnix_k(migration, hold in the global queue) + vllm_priority
  llumnix_k     the seed's full system: llumnix_k + llumlet (llumlet = vllm_priority with running requests
                also served in tier order); K = 1…10, and `llumnix_k_adaptive` (SLO-driven budgets, promotion)

Capacity (tierserve.experiments.capacity): the highest rate at which every class meets its goal and every
queue is stable, by bisection over rate with common random numbers and ≥ 3 seeds; per class likewise. Loads
are ρ = rate / capacity of `fcfs` under the same arrival process. Statistics are over the steady-state window
(first and last 10% of arrivals dropped) with mean ± 95% Student-t intervals over seeds; every result line
carries the queue-trend stability verdict of its seeds (tierserve.metrics.stability).

Overload episode: Poisson at ρ_base of the baseline's capacity, 2× that rate for `burst_s`, then ρ_base again.
Recovery time of a class = from the end of the burst until the first 10-s arrival window that, with the
window after it, has attainment ≥ (its pre-episode attainment − 0.10); pre-episode = arrivals from
`warm_s` to the burst start. "Not recovered" when no such window comes before the arrivals end.

GPUs needed at a rate R (the cost metric): the smallest replica count N whose runs at R pass the capacity
rule (every class meets its goal, queues stable), stepping N down from a start that passes / up from one that
fails.
"""
from __future__ import annotations

import csv
import json
import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from tierserve.experiments.sweep import run_many

NUM_CLASSES = 10
LADDER_BASE_TTFT_S = 0.5          # c0's TTFT target
LADDER_STEP = 1.5                 # each class waits 1.5× longer than the one above it
ATTAINMENT_GOAL = 0.95            # per class; pooled over seeds in the capacity rule
CLASS_NAMES = tuple(f"c{c}" for c in range(NUM_CLASSES))
RECOVERY_WINDOW_S = 10.0          # arrival-time windows of the overload timeline
RECOVERY_TOLERANCE = 0.10         # a window counts as recovered within this of the pre-episode attainment
DEFAULT_SEEDS = (0, 1, 2)

# Seed 000's table (uniform tiers, speedup over INFaaS+vLLM): (requests, K) → P99/mean TTFT, P99/mean E2E, cost/lat.
SEED_TABLE = {
    (10000, 3): (4.79, 8.23, 2.87, 2.80, 0.65), (10000, 4): (4.87, 8.23, 3.13, 2.88, 0.68),
    (10000, 5): (4.16, 8.11, 3.04, 2.92, 0.67), (15000, 3): (2.98, 5.00, 1.87, 1.97, 0.46),
    (15000, 4): (3.16, 5.16, 2.12, 2.08, 0.53), (15000, 5): (2.72, 5.07, 2.04, 2.12, 0.51),
}
COST_FORMULA = ("cost/latency gain = 1 − (C_sys·L_sys)/(C_base·L_base), C = replicas·TP·makespan (GPU-s), "
                "L = mean E2E of finished requests")


def ladder_ttft_s(c: int) -> float:
    return LADDER_BASE_TTFT_S * LADDER_STEP ** c


def even_cuts(k: int) -> tuple[int, ...]:
    """First class of tiers 1…K−1 when ten classes are bucketed evenly: class c → tier ⌊c·K/10⌋."""
    return tuple(-(-NUM_CLASSES * j // k) for j in range(1, k))


def tier_of_class(cuts: Sequence[int]) -> np.ndarray:
    """Tier of each class: the number of cut points at or below it."""
    return np.searchsorted(np.asarray(cuts, np.int64), np.arange(NUM_CLASSES), side="right").astype(np.int64)


# ---- what is run -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Stack:
    """A policy stack and how it sees the classes: `k` tiers, class c → tier by `cuts` (even split if None)."""

    label: str
    local_policy: str
    cluster_policy: str
    k: int = 1
    cluster_params: tuple[tuple[str, Any], ...] = ()
    local_params: tuple[tuple[str, Any], ...] = ()
    cuts: tuple[int, ...] | None = None

    def class_tiers(self) -> np.ndarray:
        return tier_of_class(even_cuts(self.k) if self.cuts is None else self.cuts)

    def cluster_kwargs(self) -> dict[str, Any]:
        kw = dict(self.cluster_params)
        if self.cluster_policy.startswith("llumnix"):
            kw.setdefault("num_tiers", self.k)    # these policies validate tiers against K
        return kw


def ladder_stacks(k: int) -> list[Stack]:
    """The controls, each adding one thing to the one before it (module docstring)."""
    off = (("migration", False), ("hold_when_busy", False))
    return [
        Stack("fcfs", "vllm", "infaas", k),
        Stack("local_prio", "vllm_priority", "infaas", k),
        Stack("headroom", "vllm", "llumnix_k", k, off),
        Stack("both", "vllm_priority", "llumnix_k", k, off),
        Stack("+migration", "vllm_priority", "llumnix_k", k, (("migration", True), ("hold_when_busy", False))),
        Stack("+hold", "vllm_priority", "llumnix_k", k, (("migration", True), ("hold_when_busy", True))),
        Stack(f"llumnix_k", "llumlet", "llumnix_k", k),
    ]


def ktier_stack(k: int, adaptive: bool = False) -> Stack:
    if adaptive:
        # promotion acts in the global queue (cluster policy) and each replica's queue (llumlet), never into tier 0
        return Stack("adaptive", "llumlet", "llumnix_k_adaptive", k, (),
                     (("promote_after_s", 5.0), ("promote_floor", min(1, k - 1))))
    return Stack("llumnix_k", "llumlet", "llumnix_k", k)


def llumnix_two_level(high_classes: int) -> Stack:
    """Two-level Llumnix: classes c0…c{high−1} are its high priority (10% per class under the uniform mix)."""
    return Stack(f"llumnix_{10 * high_classes}pct", "llumlet", "llumnix", 2, cuts=(high_classes,))


@dataclass(frozen=True)
class Arrival:
    """An arrival process at a mean rate given per run. `overload`: Poisson at the given (base) rate with
    `burst_factor`× that rate for `burst_s` from `pre_s`, then `post_s` more at the base rate."""

    kind: str = "poisson"            # poisson | gamma | servegen | overload
    cv: float = 1.0
    servegen_model: str = "deepseek_r1"
    servegen_period_s: float = 600.0  # the whole (one-day) series compressed into this many seconds
    pre_s: float = 90.0
    burst_s: float = 60.0
    post_s: float = 180.0
    burst_factor: float = 2.0
    warm_s: float = 20.0             # pre-episode level is read from arrivals after this

    @property
    def label(self) -> str:
        if self.kind == "gamma":
            return f"gamma_cv{self.cv:g}"
        if self.kind == "servegen":
            return f"servegen_{self.servegen_model}"
        if self.kind == "overload":
            return f"overload_{self.burst_factor:g}x_{self.burst_s:g}s"
        return self.kind


POISSON = Arrival()


@dataclass(frozen=True)
class RunSetup:
    """One run's cluster and workload size (the rate and seed are given per run)."""

    model: str = "Llama-2-7B"
    gpu: str = "A100-80GB"
    num_replicas: int = 4
    token_budget: int = 2048
    max_num_seqs: int = 256
    exec_mode: str = "physical"
    bandwidth_gbytes_s: float = 1.0
    num_requests: int = 1000
    max_total_tokens: int = 4096
    drop_fraction: float = 0.1
    time_limit_factor: float = 3.0    # stop at this × the arrival span (+60 s); the rest is censored

    @property
    def label(self) -> str:
        parts = [self.model, f"budget {self.token_budget}", self.exec_mode, f"{self.bandwidth_gbytes_s:g} GB/s",
                 f"{self.num_replicas} replicas"]
        return ", ".join(parts)


def class_tier_set():
    from tierserve.core import SLO, Tier, TierSet
    return TierSet([Tier(c, CLASS_NAMES[c], SLO(ttft_s=ladder_ttft_s(c), attainment=ATTAINMENT_GOAL))
                    for c in range(NUM_CLASSES)])


def workload_config(setup: RunSetup, arrival: Arrival, rate: float, seed: int):
    """Ten SLO classes, uniform; `rate` is the mean rate (overload: the base rate)."""
    from tierserve.workload import WorkloadConfig
    from tierserve.workload.config import (
        FitLengthConfig, GammaConfig, PiecewiseConfig, PoissonConfig, ServeGenConfig, SLOConfig, TiersConfig,
    )
    n = setup.num_requests
    if arrival.kind == "poisson":
        arr = PoissonConfig(rate=rate)
    elif arrival.kind == "gamma":
        arr = GammaConfig(rate=rate, cv=arrival.cv)
    elif arrival.kind == "servegen":
        arr = ServeGenConfig(model=arrival.servegen_model, mean_rate=rate, period_s=arrival.servegen_period_s)
    elif arrival.kind == "overload":
        # the last segment is long enough that one period covers the whole run (the profile repeats)
        tail_s = arrival.post_s + 1e4
        arr = PiecewiseConfig(rates=[rate, rate * arrival.burst_factor, rate],
                              durations_s=[arrival.pre_s, arrival.burst_s, tail_s])
        n = int(round(rate * (arrival.pre_s + arrival.post_s + arrival.burst_factor * arrival.burst_s)))
    else:
        raise ValueError(f"arrival kind {arrival.kind!r}: poisson | gamma | servegen | overload")
    tiers = TiersConfig(num_tiers=NUM_CLASSES, mix="uniform", names=list(CLASS_NAMES),
                        slos=[SLOConfig(ttft_s=ladder_ttft_s(c), attainment=ATTAINMENT_GOAL)
                              for c in range(NUM_CLASSES)])
    return WorkloadConfig(num_requests=max(n, 1), seed=seed, arrivals=arr,
                          lengths=FitLengthConfig(dataset="azure2023_conv", max_total_tokens=setup.max_total_tokens),
                          tiers=tiers)


def cluster_config(stack: Stack, setup: RunSetup, time_limit_s: float | None):
    from tierserve.sim import ClusterConfig, ReplicaConfig
    return ClusterConfig(
        num_replicas=setup.num_replicas,
        replica=ReplicaConfig(model=setup.model, gpu=setup.gpu, token_budget=setup.token_budget,
                              max_num_seqs=setup.max_num_seqs, exec_mode=setup.exec_mode),
        local_policy=stack.local_policy, local_policy_params=dict(stack.local_params),
        cluster_policy=stack.cluster_policy, cluster_policy_params=stack.cluster_kwargs(),
        migration_params={"bandwidth_gbytes_s": setup.bandwidth_gbytes_s}, time_limit_s=time_limit_s)


def run_point(stack: Stack, setup: RunSetup, arrival: Arrival, rate: float, seed: int):
    """One seed at one rate → `SteadyRun` judged per class, with run-level counters in `summary.extras`."""
    from tierserve.metrics import RequestTable
    from tierserve.metrics.stability import steady_run
    from tierserve.sim import simulate
    from tierserve.workload import build_workload
    wl = build_workload(workload_config(setup, arrival, rate, seed), seed)
    tier_map = stack.class_tiers()
    classes = np.array([r.tier for r in wl.requests], np.int64)
    # the scheduler sees the bucketed tier; the SLO (and every statistic) stays the class's
    reqs = [replace(r, tier=int(tier_map[r.tier])) for r in wl.requests]
    span_s = reqs[-1].arrival_s if reqs else 0.0
    cfg = cluster_config(stack, setup, span_s * setup.time_limit_factor + 60.0)
    sim = simulate(cfg, reqs, num_tiers=stack.k, seed=seed)
    tab = RequestTable.from_states(sim.states, sim.reasons)
    cols = dict(tab.columns)
    cols["tier"] = classes[cols["id"]]
    tab = RequestTable(cols)
    st = sim.stats
    extras: dict[str, Any] = {k: st.get(k, 0) for k in (
        "preemptions", "migrations_live_started", "migrations_live_committed", "migrations_live_aborted",
        "migrations_queued", "migration_downtime_mean_s", "migration_downtime_p99_s")}
    extras["num_requests"] = len(reqs)
    if arrival.kind == "overload":
        extras["episode"] = episode_windows(tab, arrival, rate)
    return steady_run(tab, sim.duration_s, class_tier_set(), seed, rate, setup.drop_fraction, extras)


def episode_windows(tab, arrival: Arrival, rate: float) -> dict[str, Any]:
    """Per class and 10-s arrival window: requests and how many met their SLO (for recovery times).

    Window edges are aligned to the burst's end (window `end_index` starts exactly there)."""
    a = tab.arrival_s
    end_s = arrival.pre_s + arrival.burst_s
    end_index = int(math.ceil(end_s / RECOVERY_WINDOW_S))
    origin_s = end_s - end_index * RECOVERY_WINDOW_S           # ≤ 0: the first window starts at or before t = 0
    nwin = int(math.ceil(((float(a.max()) if a.size else 0.0) - origin_s) / RECOVERY_WINDOW_S)) or 1
    w = np.minimum(((a - origin_s) // RECOVERY_WINDOW_S).astype(np.int64), nwin - 1)
    meets = tab.meets_slo
    total = np.zeros((NUM_CLASSES, nwin), np.int64)
    met = np.zeros((NUM_CLASSES, nwin), np.int64)
    np.add.at(total, (tab.tier, w), 1)
    np.add.at(met, (tab.tier, w), meets.astype(np.int64))
    burst = (a >= arrival.pre_s) & (a < end_s)
    pre = (a >= arrival.warm_s) & (a < arrival.pre_s)
    return {"total": total.tolist(), "met": met.tolist(), "end_index": end_index,
            "burst_attainment": [float(meets[burst & (tab.tier == c)].mean()) if (burst & (tab.tier == c)).any()
                                 else math.nan for c in range(NUM_CLASSES)],
            "pre_attainment": [float(meets[pre & (tab.tier == c)].mean()) if (pre & (tab.tier == c)).any()
                               else math.nan for c in range(NUM_CLASSES)],
            "last_arrival_s": float(a.max()) if a.size else 0.0, "base_rate": rate}


def recovery_s(ep: dict[str, Any], c: int) -> float:
    """Seconds from the burst's end until class c recovers (module docstring); inf when it does not."""
    total, met = np.asarray(ep["total"][c]), np.asarray(ep["met"][c])
    att = np.where(total > 0, met / np.maximum(total, 1), np.nan)
    level = ep["pre_attainment"][c] - RECOVERY_TOLERANCE
    ok = [not (x < level) for x in att]      # an empty window (NaN) does not block recovery
    # the last window is cut short by the end of arrivals, so a recovery must show in a full pair before it
    for wi in range(ep["end_index"], len(att) - 1):
        if ok[wi] and ok[wi + 1]:
            return (wi - ep["end_index"]) * RECOVERY_WINDOW_S
    return math.inf


# ---- capacity -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PointRunner:
    """`make_run(rate, seed)` for the capacity search (picklable)."""

    stack: Stack
    setup: RunSetup
    arrival: Arrival = POISSON

    def __call__(self, rate: float, seed: int):
        return run_point(self.stack, self.setup, self.arrival, rate, seed)


@dataclass
class CapacityRow:
    """One stack's capacities (req/s) under one arrival process and run setup."""

    group: str
    stack: Stack
    setup: RunSetup
    arrival: Arrival
    rate: float
    saturated: bool
    stable_rate: float
    class_rates: dict[str, float]
    class_saturated: dict[str, bool]
    seeds: tuple[int, ...]
    rel_tol: float
    lo: float
    hi: float
    probes: int
    verdict_at_capacity: str
    fails_above: str
    wall_s: float
    downtime_p99_ms: float = math.nan
    migrations_live: float = math.nan
    migrations_queued: float = math.nan


def verdict_of(runs) -> str:
    """'stable (3/3 seeds)' or 'unstable (1/3 seeds stable; c8, all)': the majority verdict over seeds, how many
    seeds had every queue (each class and all) stable, and the entries unstable in some seed."""
    ok = sum(r.stable for r in runs)
    bad: list[str] = []
    for r in runs:
        for k, v in r.stability.items():
            if not v.stable and k not in bad:
                bad.append(k)
    word = "stable" if 2 * ok > len(runs) else "unstable"
    return f"{word} ({ok}/{len(runs)} seeds stable" + (f"; {', '.join(bad)})" if bad else ")")


def passes_every_slo(runs) -> tuple[bool, str]:
    """The capacity rule at one rate (local mirror of capacity.find_capacity's stack check, which is not
    public): every class's pooled attainment reaches its goal and its queue is stable in most seeds, and every
    verdict is stable in most seeds. Returns (passes, why not)."""
    from tierserve.experiments.capacity import pooled_attainment
    why = []
    for t in runs[0].summary.per_tier:
        att = pooled_attainment(runs, t.name)
        if att < t.attainment_goal:
            why.append(f"{t.name} attainment {att:.3f}")
    if 2 * sum(r.stable for r in runs) <= len(runs):
        why.append(verdict_of(runs))
    return not why, "; ".join(why)


def capacity_job(group: str, stack: Stack, setup: RunSetup, arrival: Arrival, lo: float, hi: float,
                 seeds: tuple[int, ...], rel_tol: float) -> CapacityRow:
    """A worker: one stack's capacity search (serial inside; stacks run in parallel)."""
    from tierserve.experiments.capacity import find_capacity
    t0 = time.perf_counter()
    cap = find_capacity(PointRunner(stack, setup, arrival), lo, hi, seeds, rel_tol)
    rates = sorted(cap.runs)
    at = cap.runs.get(cap.rate) if cap.stack.feasible else None
    above = [r for r in rates if r > cap.rate] if cap.stack.feasible else rates[:1]
    fails = ""
    if above:
        _, why = passes_every_slo(cap.runs[above[0]])
        fails = f"{above[0]:.3g} req/s: {why}"
    mig = at or cap.runs[rates[0]]
    return CapacityRow(
        group=group, stack=stack, setup=setup, arrival=arrival, rate=cap.rate, saturated=cap.stack.saturated,
        stable_rate=cap.stable_rate, class_rates=cap.tier_rates(),
        class_saturated={k: v.saturated for k, v in cap.tiers.items()}, seeds=tuple(seeds), rel_tol=rel_tol,
        lo=lo, hi=hi, probes=len(rates), verdict_at_capacity=verdict_of(at) if at else "—", fails_above=fails,
        wall_s=time.perf_counter() - t0,
        downtime_p99_ms=1e3 * float(np.mean([r.summary.extras["migration_downtime_p99_s"] for r in mig])),
        migrations_live=float(np.mean([r.summary.extras["migrations_live_committed"] for r in mig])),
        migrations_queued=float(np.mean([r.summary.extras["migrations_queued"] for r in mig])))


def gpus_job(label: str, stack: Stack, setup: RunSetup, rate: float, start: int, max_n: int,
             seeds: tuple[int, ...]) -> dict[str, Any]:
    """Smallest replica count whose runs at `rate` pass the capacity rule: step from `start`."""
    checked: dict[int, tuple[bool, str, str]] = {}

    def check(n: int) -> bool:
        if n not in checked:
            s = replace(setup, num_replicas=n)
            runs = [run_point(stack, s, POISSON, rate, sd) for sd in seeds]
            ok, why = passes_every_slo(runs)
            checked[n] = (ok, why, verdict_of(runs))
        return checked[n][0]

    n = max(1, start)
    if check(n):
        while n > 1 and check(n - 1):
            n -= 1
        needed: float = n
    else:
        while n < max_n and not check(n + 1):
            n += 1
        needed = n + 1 if n < max_n else math.inf
    return {"label": label, "stack": stack, "rate": rate, "gpus": needed,
            "checked": {k: {"passes": v[0], "why": v[1], "verdict": v[2]} for k, v in sorted(checked.items())}}


# ---- load sweeps and the overload episode --------------------------------------------------------------
def point_job(tag: str, stack: Stack, setup: RunSetup, arrival: Arrival, rate: float, seed: int,
              rho: float, rho_of: str) -> dict[str, Any]:
    """One seed at one load; `rho_of` names the arrival process whose baseline capacity ρ is relative to."""
    run = run_point(stack, setup, arrival, rate, seed)
    return {"tag": tag, "stack": stack, "setup": setup, "arrival": arrival, "rate": rate, "rho": rho,
            "rho_of": rho_of, "seed": seed, "run": run}


def seed_setup_job(system: str, local: str, cluster: str, k: int, num_requests: int, num_replicas: int,
                   rate_per_replica: float, model: str, gpu: str) -> dict[str, Any]:
    """The seed's own setup: K tiers straight from the workload (uniform mix, default SLOs), one seed."""
    from tierserve.metrics import RequestTable
    from tierserve.sim import ClusterConfig, ReplicaConfig, simulate
    from tierserve.workload import WorkloadConfig, build_requests
    from tierserve.workload.config import FitLengthConfig, PoissonConfig, TiersConfig
    reqs = build_requests(WorkloadConfig(
        num_requests=num_requests, seed=0, arrivals=PoissonConfig(rate=rate_per_replica * num_replicas),
        lengths=FitLengthConfig(dataset="azure2023_conv", max_total_tokens=4096),
        tiers=TiersConfig(num_tiers=k, mix="uniform")))
    cfg = ClusterConfig(num_replicas=num_replicas, replica=ReplicaConfig(model=model, gpu=gpu, token_budget=2048),
                        local_policy=local, cluster_policy=cluster,
                        cluster_policy_params={"num_tiers": k} if cluster.startswith("llumnix") else {},
                        time_limit_s=reqs[-1].arrival_s * 4.0)
    res = simulate(cfg, reqs, num_tiers=k, seed=0)
    tab = RequestTable.from_states(res.states, res.reasons)
    fin = tab.finished
    ttft, e2e = tab.ttft_s[fin], tab.ttlt_s[fin]
    return {"system": system, "K": k, "requests": num_requests, "ttft_mean": float(ttft.mean()),
            "ttft_p99": float(np.percentile(ttft, 99)), "e2e_mean": float(e2e.mean()),
            "e2e_p99": float(np.percentile(e2e, 99)), "gpu_s": res.duration_s * num_replicas,
            "finished": int(fin.sum()), "censored": int(tab.censored.sum())}


# ---- the study -----------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Study:
    """What `tierserve reproduce ktier` runs (module docstring). `quick()` is the smoke-test size."""

    setup: RunSetup = RunSetup()
    seeds: tuple[int, ...] = DEFAULT_SEEDS
    rel_tol: float = 0.05
    ladder_k: int = 4                                   # K of the controls (the seed's optimum)
    controls: tuple[str, ...] = ("fcfs", "local_prio", "headroom", "both", "+migration", "+hold", "llumnix_k")
    ks: tuple[int, ...] = tuple(range(1, 11))           # llumnix_k sweep, K = 1…10
    adaptive_ks: tuple[int, ...] = tuple(range(2, 11))  # K = 1 has no budget to adapt
    rhos: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1)
    bursty_rhos: tuple[float, ...] = (0.5, 0.8, 1.1)
    bursty_arrivals: tuple[Arrival, ...] = (Arrival("gamma", 2.0), Arrival("gamma", 4.0), Arrival("servegen"))
    bursty_stacks: tuple[str, ...] = ("fcfs", "local_prio", "both", "llumnix_k")
    overload: Arrival = Arrival("overload")
    overload_rho: float = 0.7
    two_level_rhos: tuple[float, ...] = (0.7, 0.9)      # where the two-level rows' class latencies are shown
    baseline_bracket_per_replica: tuple[float, float] = (0.25, 12.0)   # req/s per replica
    bracket: tuple[float, float] = (0.6, 1.5)                        # × the baseline's capacity
    sensitivity: bool = True
    two_level: bool = True
    gpus_factor: float = 2.0          # GPUs needed at this × the baseline's capacity on `setup`
    seed_requests: tuple[int, ...] = (10000,)
    seed_ks: tuple[int, ...] = (4,)                   # the seed's headline row
    seed_replicas: int = 8
    seed_rate_per_replica: float = 5.0

    @classmethod
    def quick(cls) -> Study:
        return cls(setup=RunSetup(num_replicas=2, num_requests=300), rel_tol=0.15, ladder_k=3,
                   controls=("fcfs", "local_prio", "llumnix_k"), ks=(1, 3), adaptive_ks=(3,), rhos=(0.6, 2.0),
                   bursty_rhos=(2.0,), bursty_arrivals=(Arrival("gamma", 4.0),), bursty_stacks=("fcfs", "llumnix_k"),
                   baseline_bracket_per_replica=(1.0, 10.0), bracket=(0.6, 1.8),
                   overload=Arrival("overload", pre_s=30.0, burst_s=15.0, post_s=60.0, warm_s=5.0),
                   sensitivity=False, two_level=True, two_level_rhos=(0.6,), seed_requests=(300,), seed_ks=(3,), seed_replicas=2)

    def variants(self) -> dict[str, RunSetup]:
        """Sensitivity setups (label → setup); '' is the main one."""
        out = {"": self.setup}
        if self.sensitivity:
            s = self.setup
            out["budget 512"] = replace(s, token_budget=512)
            out["exec vidur_parity"] = replace(s, exec_mode="vidur_parity")
            out["Llama-3-8B (GQA)"] = replace(s, model="Llama-3-8B")
            out["migration 10 GB/s"] = replace(s, bandwidth_gbytes_s=10.0)
            out["migration 100 GB/s"] = replace(s, bandwidth_gbytes_s=100.0)
        return out


def _baseline(k: int) -> Stack:
    return ladder_stacks(k)[0]


def _cap_key(setup: RunSetup, arrival: Arrival) -> tuple:
    return (setup, arrival)


def run_study(study: Study, out: Path, executor: str = "process", progress: bool = True) -> dict[str, Any]:
    """Run everything, write CSV/JSON/Markdown/PNG under `out`, return the tables."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    s0, k = study.setup, study.ladder_k
    seeds, tol = tuple(study.seeds), study.rel_tol
    variants = study.variants()
    lo_r, hi_r = study.baseline_bracket_per_replica
    # forked workers inherit the parent's loaded modules and cached model fits: one study, one code version
    warm = ladder_stacks(k) + [ktier_stack(k, adaptive=True), llumnix_two_level(1)]
    for s in variants.values():
        for st in warm if s == s0 else warm[:1]:
            run_point(st, replace(s, num_replicas=2, num_requests=20), POISSON, 1.0, 0)

    # Phase 1: the baseline's capacity for every arrival process and setup (ρ and brackets come from it).
    base_jobs: list[dict[str, Any]] = []
    arrivals = (POISSON,) + tuple(study.bursty_arrivals)
    for a in arrivals:
        base_jobs.append(dict(group="controls" if a == POISSON else f"arrival {a.label}", stack=_baseline(k),
                              setup=s0, arrival=a, lo=lo_r * s0.num_replicas, hi=hi_r * s0.num_replicas,
                              seeds=seeds, rel_tol=tol))
    for name, s in variants.items():
        if name and (s.token_budget, s.exec_mode, s.model) != (s0.token_budget, s0.exec_mode, s0.model):
            base_jobs.append(dict(group=f"sensitivity {name}", stack=_baseline(k), setup=s, arrival=POISSON,
                                  lo=lo_r * s.num_replicas, hi=hi_r * s.num_replicas, seeds=seeds, rel_tol=tol))
    base_rows: list[CapacityRow] = run_many(capacity_job, base_jobs, executor=executor, progress=progress,
                                            description="ktier: baseline capacity")
    base_cap = {_cap_key(r.setup, r.arrival): r.rate for r in base_rows}
    for name, s in variants.items():   # bandwidth changes nothing without migration: reuse the main baseline
        base_cap.setdefault(_cap_key(s, POISSON), base_cap[_cap_key(s0, POISSON)])
    c_base = base_cap[_cap_key(s0, POISSON)]
    if not (c_base > 0):
        raise RuntimeError(f"the baseline's capacity was not found in [{lo_r}, {hi_r}] req/s per replica")

    def bracket(s: RunSetup, a: Arrival) -> tuple[float, float]:
        c = base_cap[_cap_key(s, a)]
        if not (c > 0):
            c = lo_r * s.num_replicas
        return study.bracket[0] * c, study.bracket[1] * c

    # Phase 2: every other capacity search, the load sweeps, the overload episode, GPUs needed, the seed's table.
    cap_jobs: list[dict[str, Any]] = []

    def add_cap(group: str, stack: Stack, s: RunSetup = s0, a: Arrival = POISSON) -> None:
        lo, hi = bracket(s, a)
        cap_jobs.append(dict(group=group, stack=stack, setup=s, arrival=a, lo=lo, hi=hi, seeds=seeds, rel_tol=tol))

    full_ladder = ladder_stacks(k)
    ladder = [st for st in full_ladder if st.label in study.controls]
    for st in ladder[1:]:
        add_cap("controls", st)
    for kk in study.ks:
        if kk != k:
            add_cap("K sweep", ktier_stack(kk))
    for kk in study.adaptive_ks:
        add_cap("K sweep", ktier_stack(kk, adaptive=True))
    if study.ladder_k != 10 and 10 in study.ks:
        add_cap("K sweep", Stack("local_prio", "vllm_priority", "infaas", 10))   # local priority at full resolution
    if study.two_level:
        add_cap("two-level llumnix", llumnix_two_level(1))
        add_cap("two-level llumnix", llumnix_two_level(5))
    for name, s in variants.items():
        if not name:
            continue
        if s.bandwidth_gbytes_s == s0.bandwidth_gbytes_s:
            add_cap(f"sensitivity {name}", full_ladder[1], s)
        add_cap(f"sensitivity {name}", full_ladder[-1], s)

    point_jobs: list[dict[str, Any]] = []
    by_label = {st.label: st for st in full_ladder}
    for rho in study.rhos:
        for st in ladder:
            for sd in seeds:
                point_jobs.append(dict(tag="rho", stack=st, setup=s0, arrival=POISSON, rate=rho * c_base, seed=sd,
                                       rho=rho, rho_of=POISSON.label))
    if study.two_level:
        for rho in study.two_level_rhos:
            for st in (llumnix_two_level(1), llumnix_two_level(5)):
                for sd in seeds:
                    point_jobs.append(dict(tag="rho", stack=st, setup=s0, arrival=POISSON, rate=rho * c_base,
                                           seed=sd, rho=rho, rho_of=POISSON.label))
    for a in study.bursty_arrivals:
        ca, of = base_cap[_cap_key(s0, a)], a.label
        if not (ca > 0):     # no capacity under this arrival process even at the bracket's bottom: use Poisson's
            ca, of = c_base, POISSON.label
        for rho in study.bursty_rhos:
            for lab in study.bursty_stacks:
                for sd in seeds:
                    point_jobs.append(dict(tag="rho", stack=by_label[lab], setup=s0, arrival=a, rate=rho * ca,
                                           seed=sd, rho=rho, rho_of=of))
    for st in ladder:
        for sd in seeds:
            point_jobs.append(dict(tag="overload", stack=st, setup=s0, arrival=study.overload,
                                   rate=study.overload_rho * c_base, seed=sd, rho=study.overload_rho,
                                   rho_of=POISSON.label))

    gpu_rate = study.gpus_factor * c_base
    gpu_start = int(math.ceil(study.gpus_factor * s0.num_replicas))
    gpu_jobs = [dict(label=st.label, stack=st, setup=s0, rate=gpu_rate, start=gpu_start,
                     max_n=2 * gpu_start, seeds=seeds) for st in ladder]

    seed_jobs = []
    for n in study.seed_requests:
        seed_jobs.append(dict(system="baseline", local="vllm", cluster="infaas", k=max(study.seed_ks)))
        seed_jobs[-1].update(num_requests=n)
        for kk in study.seed_ks:
            seed_jobs.append(dict(system="llumnix_k", local="llumlet", cluster="llumnix_k", k=kk, num_requests=n))
    for j in seed_jobs:
        j.update(num_replicas=study.seed_replicas, rate_per_replica=study.seed_rate_per_replica, model=s0.model,
                 gpu=s0.gpu)

    # one pool for everything: long jobs first so the pool does not end on a straggler
    tagged = ([("gpus", gpus_job, j) for j in gpu_jobs] + [("cap", capacity_job, j) for j in cap_jobs]
              + [("seed", seed_setup_job, j) for j in seed_jobs] + [("point", point_job, j) for j in point_jobs])
    results = run_many(_call, [{"fn": fn, "job": j} for _, fn, j in tagged], executor=executor,
                       progress=progress, description="ktier: study")
    gpus = [r for (t, _, _), r in zip(tagged, results) if t == "gpus"]
    caps = base_rows + [r for (t, _, _), r in zip(tagged, results) if t == "cap"]
    seed_rows = [r for (t, _, _), r in zip(tagged, results) if t == "seed"]
    points = [r for (t, _, _), r in zip(tagged, results) if t == "point"]
    wall_s = time.perf_counter() - t0
    return write_report(study, out, caps, points, gpus, seed_rows, base_cap, wall_s)


def _call(fn, job):
    return fn(**job)


# ---- tables ---------------------------------------------------------------------------------------------
def _ci(values: Sequence[float]):
    from tierserve.metrics.stability import mean_ci95
    return mean_ci95(values)


def _fmt_ci(iv, digits: int = 3) -> str:
    if not math.isfinite(iv.mean):
        return "—"
    if not math.isfinite(iv.half_width):
        return f"{iv.mean:.{digits}f}"
    return f"{iv.mean:.{digits}f} ± {iv.half_width:.{digits}f}"


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        if math.isnan(x):
            return "—"
        if math.isinf(x):
            return "∞"
        return f"{x:.{digits}f}"
    return str(x)


def stack_name(st: Stack) -> str:
    return f"{st.label} (K={st.k})"


def capacity_table(caps: list[CapacityRow], c_base: dict) -> list[dict[str, Any]]:
    rows = []
    for r in caps:
        base = c_base.get(_cap_key(r.setup, r.arrival), math.nan)
        row = {"group": r.group, "stack": stack_name(r.stack), "local": r.stack.local_policy,
               "cluster": r.stack.cluster_policy, "K": r.stack.k, "arrival": r.arrival.label,
               "setup": r.setup.label, "capacity_rps": r.rate, "saturated": r.saturated,
               "capacity_x_baseline": r.rate / base if base > 0 else math.nan,
               "per_replica_rps": r.rate / r.setup.num_replicas, "stable_only_rps": r.stable_rate}
        for c in CLASS_NAMES:
            row[f"{c}_rps"] = r.class_rates.get(c, math.nan)
        row.update({"verdict_at_capacity": r.verdict_at_capacity, "fails_above": r.fails_above,
                    "live_migrations": r.migrations_live, "queued_migrations": r.migrations_queued,
                    "downtime_p99_ms": r.downtime_p99_ms, "probes": r.probes, "lo": r.lo, "hi": r.hi,
                    "seeds": len(r.seeds), "rel_tol": r.rel_tol})
        rows.append(row)
    return rows


def rho_table(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for p in points:
        if p["tag"] == "rho":
            groups.setdefault((p["arrival"].label, p["stack"].label, p["stack"].k, p["rho"]), []).append(p)
    rows = []
    for (arr, lab, kk, rho), ps in groups.items():
        runs = [p["run"] for p in ps]
        row: dict[str, Any] = {"arrival": arr, "stack": f"{lab} (K={kk})", "rho": rho,
                               "rho_of": f"fcfs capacity under {ps[0]['rho_of']}", "rate_rps": ps[0]["rate"],
                               "seeds": len(runs), "verdict": verdict_of(runs)}
        row["all_attainment"] = _ci([r.summary.all.slo_attainment for r in runs])
        for c in CLASS_NAMES:
            row[f"{c}_attainment"] = _ci([r.summary.tiers[c].slo_attainment for r in runs])
        row["classes_meeting_goal"] = _ci([sum(t.slo_attainment >= t.attainment_goal for t in r.summary.per_tier)
                                           for r in runs])
        row["c0_ttft_p99_s"] = _ci([r.summary.tiers["c0"].ttft.p99 for r in runs])
        for c in (0, 4, 9):
            row[f"c{c}_ttft_p50_s"] = _ci([r.summary.tiers[f"c{c}"].ttft.p50 for r in runs])
        st = ps[0]["stack"]
        aware = st.k > 1 and (st.local_policy, st.cluster_policy) != ("vllm", "infaas")
        # priority inversion: c0 (always in the top tier) waits over twice as long at the median as c9 (always the
        # bottom tier); "twice" so that equal medians at light load, which differ by noise, do not count
        row["inversion"] = aware and row["c0_ttft_p50_s"].mean > 2.0 * row["c9_ttft_p50_s"].mean
        ex = [r.summary.extras for r in runs]
        row["live_migrations"] = _ci([e["migrations_live_committed"] for e in ex])
        row["queued_migrations"] = _ci([e["migrations_queued"] for e in ex])
        row["downtime_p99_ms"] = _ci([1e3 * e["migration_downtime_p99_s"] for e in ex])
        row["preemptions"] = _ci([e["preemptions"] for e in ex])
        rows.append(row)
    rows.sort(key=lambda r: (r["arrival"] != "poisson", r["arrival"], r["stack"], r["rho"]))
    return rows


def overload_table(points: list[dict[str, Any]], arrival: Arrival) -> list[dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        if p["tag"] == "overload":
            groups.setdefault(stack_name(p["stack"]), []).append(p)
    rows = []
    for name, ps in groups.items():
        runs = [p["run"] for p in ps]
        eps = [r.summary.extras["episode"] for r in runs]
        row: dict[str, Any] = {"stack": name, "base_rho": ps[0]["rho"], "base_rate_rps": ps[0]["rate"],
                               "seeds": len(runs), "verdict": verdict_of(runs)}
        row["c0_pre_attainment"] = _ci([e["pre_attainment"][0] for e in eps])
        for c in range(NUM_CLASSES):
            row[f"c{c}_burst_attainment"] = _ci([e["burst_attainment"][c] for e in eps])
        for c in range(1, NUM_CLASSES):
            rec = [recovery_s(e, c) for e in eps]
            fin = [x for x in rec if math.isfinite(x)]
            row[f"c{c}_recovery_s"] = _ci(fin) if len(fin) == len(rec) else None
            row[f"c{c}_not_recovered"] = len(rec) - len(fin)
        rows.append(row)
    return rows


def _cell(v: Any) -> str:
    from tierserve.metrics.stability import Interval
    if isinstance(v, Interval):
        return _fmt_ci(v, 2 if abs(v.mean) >= 10 else 3)
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        return _fmt(v, 3 if abs(v) < 10 else 1)
    return _fmt(v)


def md_table(rows: list[dict[str, Any]], cols: list[str], headers: list[str] | None = None) -> str:
    lines = ["| " + " | ".join(headers or cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def _csv_value(v: Any) -> Any:
    from tierserve.metrics.stability import Interval
    if isinstance(v, Interval):
        return v.mean
    return v


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """Intervals become two columns: the mean and `<name>_ci95` (the half-width)."""
    from tierserve.metrics.stability import Interval
    if not rows:
        path.write_text("")
        return
    cols: list[str] = []
    for c in rows[0]:
        cols.append(c)
        if isinstance(rows[0][c], Interval):
            cols.append(f"{c}_ci95")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            d = {}
            for c, v in r.items():
                d[c] = _csv_value(v)
                if isinstance(v, Interval):
                    d[f"{c}_ci95"] = v.half_width
            w.writerow(d)


def seed_table(seed_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    base = {r["requests"]: r for r in seed_rows if r["system"] == "baseline"}
    out = []
    for r in seed_rows:
        b = base[r["requests"]]

        def x(m: str) -> float:
            return b[m] / r[m] if r[m] > 0 else math.nan
        gain = 1.0 - (r["gpu_s"] * r["e2e_mean"]) / (b["gpu_s"] * b["e2e_mean"])
        seed = SEED_TABLE.get((r["requests"], r["K"])) if r["system"] == "llumnix_k" else None
        out.append({"system": r["system"], "K": r["K"], "requests": r["requests"],
                    "prefill_p99_x": x("ttft_p99"), "seed_prefill_p99_x": seed[0] if seed else None,
                    "prefill_mean_x": x("ttft_mean"), "seed_prefill_mean_x": seed[1] if seed else None,
                    "e2e_p99_x": x("e2e_p99"), "seed_e2e_p99_x": seed[2] if seed else None,
                    "e2e_mean_x": x("e2e_mean"), "seed_e2e_mean_x": seed[3] if seed else None,
                    "cost_latency_gain": gain, "seed_cost_latency_gain": seed[4] if seed else None,
                    "ttft_mean_s": r["ttft_mean"], "finished": r["finished"], "censored": r["censored"]})
    return out


def ktier_vs_local(caps: list[CapacityRow], ladder_k: int) -> list[dict[str, Any]]:
    """Every stack with global (llumnix) dispatch against local priority alone (infaas + vllm_priority) in the
    same setup and arrival process, at the same K where that was measured, else at the controls' K."""
    def key(setup: RunSetup) -> RunSetup:
        return replace(setup, bandwidth_gbytes_s=1.0)     # without migration, bandwidth changes nothing
    ref = {(key(r.setup), r.arrival, r.stack.k): r for r in caps if r.stack.label == "local_prio"}
    out = []
    for r in caps:
        if r.stack.cluster_policy == "infaas":
            continue
        lp = ref.get((key(r.setup), r.arrival, r.stack.k)) or ref.get((key(r.setup), r.arrival, ladder_k))
        if lp is None:
            continue
        out.append({"setup": r.setup.label, "arrival": r.arrival.label, "stack": stack_name(r.stack),
                    "capacity_rps": r.rate, "local_prio": stack_name(lp.stack), "local_prio_rps": lp.rate,
                    "gain_x": r.rate / lp.rate if lp.rate > 0 else math.nan,
                    "note": " / ".join(n for n, sat in (("stack ≥ (top passed)", r.saturated),
                                                        ("local ≥ (top passed)", lp.saturated)) if sat),
                    "verdict_at_capacity": r.verdict_at_capacity})
    return out


def plots(study: Study, rho_rows: list[dict[str, Any]], caps: list[CapacityRow], out: Path) -> list[Path]:
    from tierserve.report.plots import _pyplot, _save
    plt = _pyplot()
    paths = []
    for arr in sorted({r["arrival"] for r in rho_rows}):
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
        for stack in sorted({r["stack"] for r in rho_rows if r["arrival"] == arr}):
            sel = sorted((r for r in rho_rows if r["arrival"] == arr and r["stack"] == stack), key=lambda r: r["rho"])
            xs = [r["rho"] for r in sel]
            for ax, col in zip(axes, ("c0_attainment", "c9_attainment", "classes_meeting_goal")):
                ys = [r[col].mean for r in sel]
                es = [r[col].half_width if math.isfinite(r[col].half_width) else 0.0 for r in sel]
                ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=stack)
        titles = ("c0 (TTFT ≤ 0.5 s) attainment", f"c9 (TTFT ≤ {ladder_ttft_s(9):.1f} s) attainment",
                  f"classes meeting the {ATTAINMENT_GOAL:.0%} goal (of 10)")
        for ax, t in zip(axes, titles):
            ax.set_xlabel("ρ = rate / FCFS baseline capacity")
            ax.set_title(t, fontsize=9)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"Attainment vs load, {arr} arrivals (mean ± 95% over seeds)", fontsize=10)
        paths.append(_save(fig, out / f"attainment_vs_rho_{arr}.png"))
    main = [r for r in caps if r.setup == study.setup and r.arrival == POISSON]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for lab in ("llumnix_k", "adaptive"):
        sel = sorted((r for r in main if r.stack.label == lab and r.group in ("K sweep", "controls")),
                     key=lambda r: r.stack.k)
        if sel:
            ax.plot([r.stack.k for r in sel], [r.rate for r in sel], marker="o", label=lab)
    for r in main:
        if r.stack.label in ("fcfs", "local_prio") and r.stack.k == study.ladder_k:
            ax.axhline(r.rate, linestyle="--", linewidth=1, color="grey" if r.stack.label == "fcfs" else "black",
                       label=f"{r.stack.label} (K={r.stack.k})")
    ax.set_xlabel("K (tiers the scheduler sees)")
    ax.set_ylabel("capacity (req/s, every class meets its goal)")
    ax.set_title(f"Capacity vs K (±{study.rel_tol:.0%} bisection), {study.setup.num_replicas} replicas", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "capacity_vs_k.png"))
    return paths


def write_report(study: Study, out: Path, caps: list[CapacityRow], points: list[dict[str, Any]],
                 gpus: list[dict[str, Any]], seed_rows: list[dict[str, Any]], base_cap: dict,
                 wall_s: float) -> dict[str, Any]:
    s0 = study.setup
    cap_rows = capacity_table(caps, base_cap)
    rho_rows = rho_table(points)
    over_rows = overload_table(points, study.overload)
    vs_local = ktier_vs_local(caps, study.ladder_k)
    seed_rows_t = seed_table(seed_rows)
    gpu_rows = [{"stack": stack_name(g["stack"]), "rate_rps": g["rate"], "gpus_needed": g["gpus"],
                 "checked": "; ".join(f"N={n}: {'pass' if v['passes'] else 'fail'} ({v['verdict']}"
                                      + (f"; {v['why']}" if v["why"] else "") + ")" for n, v in g["checked"].items())}
                for g in gpus]
    write_csv(cap_rows, out / "ktier_capacity.csv")
    write_csv(rho_rows, out / "ktier_rho.csv")
    write_csv(over_rows, out / "ktier_overload.csv")
    write_csv(vs_local, out / "ktier_vs_local_priority.csv")
    write_csv(gpu_rows, out / "ktier_gpus.csv")
    write_csv(seed_rows_t, out / "ktier_seed_table.csv")
    pngs = plots(study, rho_rows, caps, out)
    c_base = base_cap[_cap_key(s0, POISSON)]
    md = markdown(study, cap_rows, rho_rows, over_rows, vs_local, gpu_rows, seed_rows_t, c_base, wall_s)
    (out / "ktier_report.md").write_text(md)
    meta = {"study": _jsonable(asdict(study)), "wall_s": wall_s, "baseline_capacity_rps": c_base,
            "ladder_ttft_s": [ladder_ttft_s(c) for c in range(NUM_CLASSES)], "attainment_goal": ATTAINMENT_GOAL,
            "recovery": {"window_s": RECOVERY_WINDOW_S, "tolerance": RECOVERY_TOLERANCE}}
    (out / "ktier_meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return {"capacity": cap_rows, "rho": rho_rows, "overload": over_rows, "vs_local": vs_local, "gpus": gpu_rows,
            "seed_table": seed_rows_t, "markdown": md, "plots": pngs, "baseline_capacity_rps": c_base,
            "wall_s": wall_s}


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def markdown(study: Study, cap_rows, rho_rows, over_rows, vs_local, gpu_rows, seed_rows, c_base: float,
             wall_s: float) -> str:
    s0 = study.setup
    ladder = ", ".join(f"{c} {ladder_ttft_s(i):.2f} s" for i, c in enumerate(CLASS_NAMES))
    L = [f"# K-tier study (seed 000), capacity-normalised", "",
         f"Setup: {s0.num_replicas} × {s0.model}/{s0.gpu} replicas, vLLM v1 batch shape (token budget "
         f"{s0.token_budget}, {s0.max_num_seqs} sequences) for every stack, exec model `{s0.exec_mode}`, migration "
         f"{s0.bandwidth_gbytes_s:g} GB/s; {s0.num_requests} requests per run (Azure-2023 conversation lengths clipped "
         f"to {s0.max_total_tokens} tokens), seeds {list(study.seeds)}.",
         f"SLO ladder (fixed for every K): ten classes, 10% each, TTFT targets {ladder}; goal {ATTAINMENT_GOAL:.0%} "
         f"per class. A K-tier scheduler sees class c as tier ⌊c·K/10⌋.",
         f"Statistics: steady-state window (first and last {s0.drop_fraction:.0%} of arrivals dropped); mean ± 95% "
         f"Student-t half-width over seeds. Verdict: seeds whose every queue (each class and all) is stable, by the "
         f"queue-trend rule; listed entries are unstable in some seed.",
         f"Capacity: bisection over rate to ±{study.rel_tol:.0%} with common random numbers (capacity rule in "
         f"`tierserve.experiments.capacity`). Baseline `fcfs` (INFaaS + vLLM FCFS) capacity under Poisson arrivals: "
         f"**{c_base:.2f} req/s** ({c_base / s0.num_replicas:.2f} per replica); ρ = rate / the baseline's capacity "
         f"under the same arrival process.",
         f"Wall time of this command: {wall_s:.0f} s.", ""]
    inv50 = [r for r in rho_rows if r["stack"].startswith("llumnix_50pct")]
    inv_rhos = ", ".join(f"{r['rho']:g}" for r in inv50 if r["inversion"])
    inv_note = ("**a priority inversion here**: its top tier (c0) waits over twice as long at the median as its bottom "
                "tier "
                f"(c9) at ρ = {inv_rhos}"
                if any(r["inversion"] for r in inv50) else
                "no inversion measured here (c0's median TTFT is never twice c9's at the loads run)" if inv50 else
                "not run in the load sweep")
    L += ["## Stacks", "",
          "- `fcfs`: INFaaS-style dispatch — each request to the instance with the least committed KV (held blocks + "
          "prompt blocks of everything queued) among those whose free blocks fit its prompt, else the least loaded; "
          "no priority, no migration — on vLLM v1 FCFS replicas. The baseline.",
          "- `local_prio`: the same dispatch on vLLM v1 priority replicas (priority = tier).",
          "- `headroom`: `llumnix_k` dispatch (freeness with per-tier headroom H_p = 0.2·M·3^−p, strict tier order) "
          "with migration and the global hold off, on FCFS replicas; `both`: the same on priority replicas; "
          "`+migration`: live migration on; `+hold`: requests held in the global queue while every instance is "
          "busy; `llumnix_k`: the seed's full system (all of that, llumlet replicas = priority with running "
          "requests also served in tier order); `adaptive`: `llumnix_k_adaptive` (SLO-driven budgets, promotion "
          "after 5 s, never into tier 0).",
          "- `llumnix_10pct`: Llumnix's two-level policy (flat M − 100-block headroom for its high level) with c0 "
          "(10% of traffic) high — Llumnix's own priority ratio. `llumnix_50pct`: c0–c4 (50%) high — "
          f"{inv_note}.", ""]
    cap_cols = ["group", "stack", "arrival", "setup", "capacity_rps", "saturated", "capacity_x_baseline",
                "stable_only_rps"] + [f"{c}_rps" for c in CLASS_NAMES] + [
        "verdict_at_capacity", "fails_above", "live_migrations", "queued_migrations", "downtime_p99_ms"]
    L += ["## Capacity (req/s; per stack and per class)", "",
          "`saturated`: the bracket's top passed, so capacity is at least that. Per-class columns: the highest rate at "
          "which that class alone meets its goal with a stable queue. Migrations: mean per run at the capacity rate.",
          "", md_table(cap_rows, cap_cols), ""]
    L += ["## K-tier dispatch against local priority alone (capacity, same setup)", "",
          f"Capacities are bisected to ±{study.rel_tol:.0%}, so a gain within about that of 1.00 is no difference.", "",
          md_table(vs_local, ["setup", "arrival", "stack", "capacity_rps", "local_prio", "local_prio_rps", "gain_x",
                              "note", "verdict_at_capacity"]), ""]
    L += [f"## GPUs needed to meet every class's SLO at {study.gpus_factor:g}× the baseline's capacity", "",
          md_table(gpu_rows, ["stack", "rate_rps", "gpus_needed", "checked"]), ""]
    rho_cols = ["arrival", "stack", "rho", "rho_of", "rate_rps", "verdict", "all_attainment", "c0_attainment",
                "c4_attainment", "c9_attainment", "classes_meeting_goal", "c0_ttft_p99_s", "c0_ttft_p50_s",
                "c9_ttft_p50_s", "inversion",
                "live_migrations", "queued_migrations", "downtime_p99_ms"]
    L += ["## Attainment vs ρ (mean ± 95% over seeds)", "", md_table(rho_rows, rho_cols), ""]
    ov = study.overload
    rec_cols = [f"c{c}_recovery_s" for c in range(1, NUM_CLASSES)]
    L += [f"## Overload episode: Poisson at ρ = {study.overload_rho:g}, {ov.burst_factor:g}× for {ov.burst_s:g} s "
          f"from t = {ov.pre_s:g} s, then {ov.post_s:g} s at ρ = {study.overload_rho:g}", "",
          f"Tier-0 isolation: c0's attainment over arrivals during the burst (pre: from {ov.warm_s:g} s to the burst). "
          f"Recovery of class c: seconds from the burst's end to the first {RECOVERY_WINDOW_S:g}-s arrival window "
          f"that, with the next window, has attainment ≥ its pre-episode attainment − {RECOVERY_TOLERANCE:.2f}; "
          f"'—' where some seed did not recover before the arrivals ended (count in the CSV).", "",
          md_table(over_rows, ["stack", "verdict", "c0_pre_attainment", "c0_burst_attainment", "c9_burst_attainment"]
                   + rec_cols), ""]
    L += ["## The seed's table at the seed's own setup (labelled; no conclusions drawn from it)", "",
          f"{study.seed_replicas} replicas at {study.seed_rate_per_replica:g} req/s each, uniform tiers with the "
          f"project's default per-K SLOs, one seed, whole-run statistics (not steady state), as the seed reported. "
          f"Speedup = INFaaS+vLLM value / system value; {COST_FORMULA}.", "",
          md_table(seed_rows, ["system", "K", "requests", "prefill_p99_x", "seed_prefill_p99_x", "prefill_mean_x",
                               "seed_prefill_mean_x", "e2e_p99_x", "seed_e2e_p99_x", "e2e_mean_x", "seed_e2e_mean_x",
                               "cost_latency_gain", "seed_cost_latency_gain", "finished", "censored"]), ""]
    return "\n".join(L) + "\n"
