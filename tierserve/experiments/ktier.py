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

import math
import time
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np


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
    num_requests: int = 2000          # a run's first length; doubled while its work verdict is undecided
    max_requests: int = 16000         # ... up to this (the run length is chosen by the verdict)
    max_total_tokens: int = 4096
    drop_fraction: float | None = None   # None: statistics from the warm-up's end the verdict found
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


def run_length_of(setup: RunSetup, arrival: Arrival):
    """The sequential run lengths of a setup (None for the overload episode, whose length is its profile's)."""
    from tierserve.experiments.capacity import RunLength
    return None if arrival.kind == "overload" else RunLength(setup.num_requests, setup.max_requests)


def run_point(stack: Stack, setup: RunSetup, arrival: Arrival, rate: float, seed: int,
              num_requests: int | None = None):
    """One seed at one rate (`num_requests` long, else the setup's first length) → `SteadyRun` with the work
    verdict and run-level counters in `summary.extras`."""
    if num_requests is not None:
        setup = replace(setup, num_requests=int(num_requests))
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

    def __call__(self, rate: float, seed: int, num_requests: int | None = None):
        return run_point(self.stack, self.setup, self.arrival, rate, seed, num_requests)


def judged_point(stack: Stack, setup: RunSetup, arrival: Arrival, rate: float, seed: int):
    """One seed at one rate, lengthened while its verdict is undecided (`run_length_of`)."""
    from tierserve.experiments.capacity import judged_run
    return judged_run(PointRunner(stack, setup, arrival), rate, seed, run_length_of(setup, arrival))


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
    fails_at: float = math.inf         # lowest failing rate probed above the capacity (the interval's top)
    lengths: tuple[int, int] = (0, 0)  # shortest and longest run the verdicts chose (requests)
    migrations_live_above: float = math.nan   # mean per run at the lowest failing rate above the capacity


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
    cap = find_capacity(PointRunner(stack, setup, arrival), lo, hi, seeds, rel_tol,
                        run_length=run_length_of(setup, arrival))
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
        migrations_queued=float(np.mean([r.summary.extras["migrations_queued"] for r in mig])),
        fails_at=cap.interval[1], lengths=cap.lengths,
        migrations_live_above=(float(np.mean([r.summary.extras["migrations_live_committed"]
                                              for r in cap.runs[above[0]]])) if above else math.nan))


def gpus_job(label: str, stack: Stack, setup: RunSetup, rate: float, start: int, max_n: int,
             seeds: tuple[int, ...]) -> dict[str, Any]:
    """Smallest replica count whose runs at `rate` pass the capacity rule: step from `start`."""
    checked: dict[int, tuple[bool, str, str]] = {}

    def check(n: int) -> bool:
        if n not in checked:
            s = replace(setup, num_replicas=n)
            runs = [judged_point(stack, s, POISSON, rate, sd) for sd in seeds]
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
    run = judged_point(stack, setup, arrival, rate, seed)
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
    sensitivity_axes: tuple[str, ...] = ("budget", "exec", "model", "bandwidth")   # which assumptions to repeat
    two_level: bool = True
    gpus_factor: float = 2.0          # GPUs needed at this × the baseline's capacity on `setup`
    seed_requests: tuple[int, ...] = (10000,)
    seed_ks: tuple[int, ...] = (4,)                   # the seed's headline row
    seed_replicas: int = 8
    seed_rate_per_replica: float = 5.0

    @classmethod
    def quick(cls) -> Study:
        return cls(setup=RunSetup(num_replicas=2, num_requests=400, max_requests=1600), rel_tol=0.15, ladder_k=3,
                   controls=("fcfs", "local_prio", "llumnix_k"), ks=(1, 3), adaptive_ks=(3,), rhos=(0.6, 2.0),
                   bursty_rhos=(2.0,), bursty_arrivals=(Arrival("gamma", 4.0),), bursty_stacks=("fcfs", "llumnix_k"),
                   baseline_bracket_per_replica=(1.0, 10.0), bracket=(0.6, 1.8),
                   overload=Arrival("overload", pre_s=30.0, burst_s=15.0, post_s=60.0, warm_s=5.0),
                   sensitivity=False, two_level=True, two_level_rhos=(0.6,), seed_requests=(300,), seed_ks=(3,), seed_replicas=2)

    @classmethod
    def standard(cls) -> Study:
        """The main setup on 4 replicas, every control, K ∈ {1, 2, 4, 10} and four loads, without the
        sensitivity repeats and with one bursty arrival process; runs from 1,000 requests: what fits a shared 2-core machine in about an hour."""
        return cls(setup=RunSetup(num_requests=1000, max_requests=8000),
                   ks=(1, 2, 4, 10), adaptive_ks=(4,), rhos=(0.5, 0.8, 1.0, 1.1), bursty_rhos=(0.8,),
                   bursty_arrivals=(Arrival("gamma", 4.0),), bursty_stacks=("fcfs", "llumnix_k"),
                   sensitivity=False, seed_requests=(2000,))

    def variants(self) -> dict[str, RunSetup]:
        """Sensitivity setups (label → setup); '' is the main one."""
        out = {"": self.setup}
        if self.sensitivity:
            s = self.setup
            bw = s.bandwidth_gbytes_s
            if "budget" in self.sensitivity_axes:
                out["budget 512"] = replace(s, token_budget=512)
            if "exec" in self.sensitivity_axes:
                out["exec vidur_parity"] = replace(s, exec_mode="vidur_parity")
            if "model" in self.sensitivity_axes:
                out["Llama-3-8B (GQA)"] = replace(s, model="Llama-3-8B")
            if "bandwidth" in self.sensitivity_axes:   # halved and doubled around the main setup's link
                out[f"migration {bw / 2:g} GB/s (×0.5)"] = replace(s, bandwidth_gbytes_s=bw / 2)
                out[f"migration {bw * 2:g} GB/s (×2)"] = replace(s, bandwidth_gbytes_s=bw * 2)
        return out


def _baseline(k: int) -> Stack:
    return ladder_stacks(k)[0]


def _cap_key(setup: RunSetup, arrival: Arrival) -> tuple:
    return (setup, arrival)


def _call(fn, job):
    return fn(**job)
