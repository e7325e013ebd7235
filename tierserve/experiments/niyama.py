"""`tierserve reproduce niyama`: Niyama/QoServe (seed 003) against Sarathi-FCFS/EDF/SRPF and silos.

What is measured (Llama-3-8B on A100-80GB, physical execution model; lengths from the shared traces, Poisson
arrivals so that seeds vary the arrivals and lengths, prompt+output clipped to the model's 8,192 tokens):
  1. goodput per replica: the highest rate one replica serves with every QoS class at ≥ 99% deadlines met and
     every class's queue stable (`capacity.find_capacity`, common random numbers, steady-state window), for
     Sarathi-FCFS/EDF/SRPF (chunk 256) and Niyama, per dataset;
  2. GPUs for 50 QPS, silos versus one shared Niyama cluster: the capacity of an M-replica JSQ cluster
     (shared: all classes on Niyama; silo pool c: class c alone on Sarathi-FCFS with chunk 256 for the strict
     class, 2,048 for the relaxed ones) scaled to 50 QPS as ⌈50·M / capacity⌉ (silos: ⌈(50/3)·M / capacity_c⌉
     per class, summed);
  3. the ablation Sarathi-EDF → +dynamic chunking → +eager relegation → +hybrid priority → +selective
     preemption (= Niyama): goodput and the deadline-violation rate at an overload of ρ = `overload_rho` ×
     Sarathi-EDF's goodput (the seed's 6 QPS over its 2.75 QPS EDF goodput: ρ = 2.18);
  4. α sensitivity of the hybrid priority at ρ = 1 and the overload, ρ in units of Niyama's goodput;
  5. the diurnal run: the seed's 2…6 QPS profile (16 segments of `segment_s`, the seed's 15 min over 4 h)
     carried over in units of Sarathi-EDF's goodput, 20% of requests low priority (tiers Q1..Q3 high,
     Q1-low..Q3-low; Niyama relegates low ones first), per-class violation rates, critical (high-priority)
     violations, and rolling P99 TTFT of Q1 requests.

A deadline is missed when (ALGORITHMS.md §4) an interactive request's first token comes after a + TTFT or
its last after max(t_first, a + TTFT) + (n−1)·TBT, or a non-interactive request ends after a + TTLT;
relegated requests count as misses. (`deadline_table` rewrites the request table's targets so that the
shared summaries and capacity search judge exactly this.)
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core import ConfigError
from tierserve.experiments.capacity import StackCapacity, find_capacity, with_rate, with_seed
from tierserve.experiments.scenario import ScenarioConfig, run_scenario
from tierserve.metrics import RequestTable
from tierserve.metrics.stability import (
    STABLE, UNKNOWN, UNSTABLE, StabilityVerdict, SteadyRun, mean_ci95, run_stability, steady_run, steady_state_mask,
)
from tierserve.metrics.summary import summarize
from tierserve.policies.cluster.silo import silo_layout

DATASETS = {"azure_code": "azure2023_code", "azure_conv": "azure2023_conv", "sharegpt": "sharegpt"}
CLASSES = ("Q1", "Q2", "Q3")
SHARED_CHUNK = 256                       # seed 003: shared baselines use the strict class's chunk
SILO_CHUNKS = (256, 2048, 2048)          # strict pool 256, relaxed pools 2K

STACKS: dict[str, tuple[str, dict[str, Any]]] = {
    "Sarathi-FCFS": ("sarathi_fcfs", {"chunk_tokens": SHARED_CHUNK}),
    "Sarathi-EDF": ("sarathi_edf", {"chunk_tokens": SHARED_CHUNK}),
    "Sarathi-SRPF": ("sarathi_srpf", {"chunk_tokens": SHARED_CHUNK}),
    "Niyama": ("niyama", {}),
}
ABLATION: dict[str, tuple[str, dict[str, Any]]] = {
    "Sarathi-EDF": ("sarathi_edf", {"chunk_tokens": SHARED_CHUNK}),
    "+DC": ("niyama", {"priority": "edf", "eager_relegation": False, "selective_preemption": False}),
    "+ER": ("niyama", {"priority": "edf", "eager_relegation": True, "selective_preemption": False}),
    "+HP": ("niyama", {"priority": "hybrid", "eager_relegation": True, "selective_preemption": False}),
    "+SP (Niyama)": ("niyama", {}),
}
SEED_GOODPUT = {"azure_code": {"Sarathi-FCFS": 1.5, "Sarathi-EDF": 2.75, "Niyama": 3.65},
                "azure_conv": {"Sarathi-FCFS": 2.75, "Sarathi-EDF": 3.55, "Niyama": 4.25}}
SEED_GPUS_50QPS = {"azure_code": (62, 42), "azure_conv": (41, 36), "sharegpt": (76, 66)}   # (silo, Niyama)
SEED_ABLATION = {"Sarathi-EDF": (2.75, 100.0), "+DC": (3.3, 74.0), "+ER": (3.6, 26.0), "+HP": (3.65, 16.0)}
SEED_DIURNAL = {"Sarathi-FCFS": 81.88, "Sarathi-EDF": 84.12, "Niyama": 8.64}
DIURNAL_RATES = (2.0, 3.0, 4.0, 5.0, 6.0, 5.0, 4.0, 3.0, 2.0, 3.0, 4.0, 6.0, 6.0, 4.0, 3.0, 2.0)   # seed's QPS
# Loads are carried over in units of the seed's own Sarathi-EDF goodput on Azure-Code (2.75 QPS): the seed's
# 6 QPS overload is ρ = 2.18 and its diurnal 2–6 QPS is ρ = 0.73–2.18, applied to our measured EDF goodput.
SEED_EDF_GOODPUT = 2.75
DIURNAL_LOW_SHARE = 0.2


@dataclass(frozen=True)
class Study:
    datasets: tuple[str, ...] = ("azure_code", "azure_conv", "sharegpt")
    seeds: tuple[int, ...] = (0, 1, 2)
    num_requests: int = 2000             # per run of the one-replica searches
    cluster_requests: int = 2000         # per run of the M-replica capacity searches
    cluster_replicas: int = 2            # M (capacity of an M-replica cluster, scaled to the target)
    target_qps: float = 50.0
    lo: float = 0.2
    hi: float = 16.0
    rel_tol: float = 0.05
    overload_rho: float = 6.0 / SEED_EDF_GOODPUT
    overload_duration_s: float = 1800.0  # arrivals span of the overload runs (3× Q2's 600 s TTLT)
    ablation_goodput: bool = True        # search the goodput of the intermediate ablation rows too
    alphas: tuple[float, ...] = (0.0, 0.001, 0.008, 0.032)
    segment_s: float = 900.0
    diurnal_dataset: str = "azure_code"
    max_total_tokens: int = 8192
    model: str = "Llama-3-8B"
    gpu: str = "A100-80GB"

    def __post_init__(self) -> None:
        for d in self.datasets + (self.diurnal_dataset,):
            if d not in DATASETS:
                raise ConfigError("dataset", d, " | ".join(DATASETS))
        if len(self.seeds) < 3:
            raise ConfigError("seeds", list(self.seeds), "at least 3 seeds (95% intervals need them)")

    @classmethod
    def quick(cls) -> Study:
        return cls(datasets=("azure_code",), num_requests=300, cluster_requests=400, cluster_replicas=2,
                   rel_tol=0.3, lo=1.0, hi=16.0, alphas=(0.0, 0.008), segment_s=10.0, overload_duration_s=40.0,
                   ablation_goodput=False)


# ---- deadlines as the judged targets ---------------------------------------------------------------------
def deadline_table(table: RequestTable) -> RequestTable:
    """The table with its SLO targets rewritten so that `meets_slo` is Niyama's deadline criterion (module
    docstring): an interactive request's TTLT target becomes max(t_first − a, TTFT) + (n−1)·TBT and its TBT
    target is dropped; a relegated request gets an unmeetable TTLT target (a miss)."""
    cols = table.columns
    ttft_t, tbt_t, ttlt_t = cols["ttft_slo_s"], cols["tbt_slo_s"], cols["ttlt_slo_s"].copy()
    interactive = ~np.isnan(tbt_t)
    first = cols["first_token_s"] - cols["arrival_s"]
    base = np.where(first > ttft_t, first, ttft_t)
    gaps = np.maximum(cols["generated_tokens"].astype(np.float64) - 1.0, 0.0)
    last = base + gaps * tbt_t
    ttlt_t[interactive] = np.where(np.isnan(last[interactive]), ttft_t[interactive], last[interactive])
    ttlt_t[~np.isnan(cols["relegated_s"])] = 0.0
    return RequestTable({**cols, "ttlt_slo_s": ttlt_t, "tbt_slo_s": np.full_like(tbt_t, np.nan)})


MAX_BACKLOG_GROWTH = 0.05


def backlog_verdict(table: RequestTable, drop_fraction: float = 0.1,
                    max_growth: float | None = None) -> StabilityVerdict:
    """Does the number of unfinished requests grow across the steady-state window?

    The queue-trend verdict reads TTFT against arrival order; a deadline-ordered scheduler with TTLT targets
    of 600–1800 s serves the relaxed classes after the run's arrivals end, so their TTFT need not trend up
    within a short run even when the replica is overloaded. The backlog does not depend on the order of a
    work-conserving scheduler: unstable when (unfinished at the window's last arrival − unfinished at its
    first) exceeds `max_growth` × the window's n requests; by default max(5%, 2/√n), so that the Poisson noise
    of small windows (--quick) is not read as growth (5% from n = 1,600 up).
    """
    a = table.arrival_s
    keep = steady_state_mask(a, drop_fraction)
    if keep.sum() < 20:
        return StabilityVerdict(UNKNOWN, reason="too few requests for a backlog verdict")
    t0, t1 = a[keep].min(), a[keep].max()
    done = np.nan_to_num(table["finish_s"], nan=np.inf)

    def backlog(t: float) -> int:
        return int(((a <= t) & (done > t)).sum())
    growth = (backlog(t1) - backlog(t0)) / keep.sum()
    if max_growth is None:
        max_growth = max(MAX_BACKLOG_GROWTH, 2.0 / math.sqrt(keep.sum()))
    verdict = UNSTABLE if growth > max_growth else STABLE
    return StabilityVerdict(verdict, ratio=growth, n=int(keep.sum()),
                            reason=f"backlog grew by {growth:.1%} of the window's requests")


@dataclass(frozen=True)
class DeadlineRunner:
    """`make_run` for `find_capacity`: one seed of a scenario at a rate, judged on deadlines in steady state,
    with the backlog verdict added to the queue-trend verdicts (key "backlog")."""

    cfg: ScenarioConfig
    drop_fraction: float = 0.1

    def __call__(self, rate: float, seed: int) -> SteadyRun:
        result = run_scenario(with_rate(with_seed(self.cfg, seed), rate))
        table = deadline_table(result.table)
        run = steady_run(table, result.sim.duration_s, result.workload.tier_set, seed, rate, self.drop_fraction,
                         {"relegated": result.sim.stats["relegated"]})
        run.stability["backlog"] = backlog_verdict(table, self.drop_fraction)
        return run


def judge_whole(cfg: ScenarioConfig, seed: int) -> dict[str, Any]:
    """Process-pool worker: one seed of a time-varying run, judged on deadlines over the whole run."""
    result = run_scenario(with_seed(cfg, seed))
    table = deadline_table(result.table)
    summary = summarize(table, None, result.sim.duration_s, result.workload.tier_set)
    stability = run_stability(table, result.sim.duration_s, result.workload.tier_set)
    viol = {name: 100.0 * (1.0 - t.slo_attainment) for name, t in summary.tiers.items()}
    high = np.isin(table["tier"], [0, 1, 2])            # the critical (high-priority) requests
    critical = 100.0 * (1.0 - float(table.meets_slo[high].mean())) if high.any() else math.nan
    q1 = np.isin(table["tier"], [i for i, t in enumerate(result.workload.tier_set) if t.name.startswith("Q1")])
    return {"violations_pct": viol, "critical_pct": critical, "stable": {k: v.stable for k, v in stability.items()},
            "relegated": int(result.sim.stats["relegated"]),
            "q1_arrival_s": table.arrival_s[q1].tolist(), "q1_ttft_s": np.nan_to_num(table.ttft_s[q1], nan=1e9).tolist()}


# ---- scenarios -------------------------------------------------------------------------------------------
def scenario(study: Study, dataset: str, policy: str, params: dict[str, Any], *, replicas: int = 1,
             cluster_policy: str = "round_robin", cluster_params: dict | None = None, num_requests: int | None = None,
             rate: float = 1.0, arrivals: dict | None = None, tiers: dict | None = None) -> ScenarioConfig:
    return ScenarioConfig.from_dict({
        "name": f"niyama-{dataset}-{policy}", "seed": 0,
        "cluster": {"num_replicas": replicas, "replica": {"model": study.model, "gpu": study.gpu},
                    "local_policy": policy, "local_policy_params": params,
                    "cluster_policy": cluster_policy, "cluster_policy_params": cluster_params or {}},
        "workload": {"num_requests": num_requests or study.num_requests,
                     "arrivals": arrivals or {"kind": "poisson", "rate": rate},
                     "lengths": {"kind": "empirical", "dataset": DATASETS[dataset],
                                 "max_total_tokens": study.max_total_tokens},
                     "tiers": tiers or {"num_tiers": 3, "preset": "niyama"}}})


def capacity(study: Study, cfg: ScenarioConfig, executor: str, goals=None, hi: float | None = None) -> StackCapacity:
    return find_capacity(DeadlineRunner(cfg), study.lo, hi or study.hi, study.seeds, study.rel_tol,
                         goals=goals, executor=executor)


def violation_at(study: Study, cfg: ScenarioConfig, rate: float, executor: str) -> dict[str, Any]:
    """Deadline-violation % per class and overall at `rate` over `overload_duration_s` of arrivals, mean ± 95%
    over seeds, and how many seeds were stable."""
    from tierserve.experiments.capacity import _apply
    from tierserve.experiments.sweep import run_many
    data = cfg.model_dump(mode="json")
    data["workload"]["num_requests"] = max(int(rate * study.overload_duration_s), 50)
    runner = DeadlineRunner(ScenarioConfig.from_dict(data))
    runs = run_many(_apply, [{"make_run": runner, "rate": rate, "seed": s} for s in study.seeds],
                    executor=executor, progress=False)
    out: dict[str, Any] = {"rate": rate, "stable_seeds": sum(r.stable for r in runs)}
    for name in list(CLASSES) + ["all"]:
        ci = mean_ci95([100.0 * (1.0 - r.summary.tiers[name].slo_attainment) for r in runs])
        out[name] = (ci.mean, ci.half_width)
    out["relegated"] = float(np.mean([r.summary.extras.get("relegated", 0) for r in runs]))
    return out


# ---- the study -------------------------------------------------------------------------------------------
def run_study(study: Study, out: str | Path, executor: str = "process", log=print,
              reuse: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run every part; `reuse` (a previous niyama_results.json of the same study) skips the capacity
    searches (goodput, GPUs, ablation goodputs) and reruns only the load-driven parts."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"study": asdict(study), "goodput": {}, "gpus": {}, "ablation": {}, "alpha": {},
                           "diurnal": {}}
    if reuse is not None:
        res["goodput"], res["gpus"] = reuse["goodput"], reuse["gpus"]
        res["reused_from"] = "capacity searches of a previous run (niyama_results.json)"

    # 1. goodput per replica
    for d in study.datasets if reuse is None else ():
        res["goodput"][d] = {}
        for label, (pol, params) in STACKS.items():
            cap = capacity(study, scenario(study, d, pol, params), executor)
            res["goodput"][d][label] = {"rate": cap.rate, "stable_rate": cap.stable_rate,
                                        "saturated": cap.stack.saturated, "tiers": cap.tier_rates()}
            log(f"goodput {d:<11} {label:<13} {cap}")

    # 2. GPUs for 50 QPS: silos vs one shared Niyama cluster
    m = study.cluster_replicas
    for d in study.datasets if reuse is None else ():
        shared = capacity(study, scenario(study, d, "niyama", {}, replicas=m, cluster_policy="jsq",
                                          num_requests=study.cluster_requests), executor, hi=study.hi * m)
        pools = []
        for c, chunk in enumerate(SILO_CHUNKS):
            weights = [1.0 if i == c else 0.0 for i in range(3)]
            params, chunks = silo_layout([[c]], [m], [chunk])
            cfg = scenario(study, d, "sarathi_fcfs", {"chunk_by_replica": chunks}, replicas=m,
                           cluster_policy="silo", cluster_params=params, num_requests=study.cluster_requests,
                           tiers={"num_tiers": 3, "preset": "niyama", "weights": weights})
            cap = capacity(study, cfg, executor, goals={CLASSES[c]: 0.99}, hi=study.hi * m * 3)
            pools.append(cap)
            log(f"silo pool {d:<11} {CLASSES[c]} chunk {chunk}: {cap}")
        share = study.target_qps / 3
        silo_gpus = [math.ceil(share * m / p.rate) if p.rate > 0 else math.nan for p in pools]
        shared_gpus = math.ceil(study.target_qps * m / shared.rate) if shared.rate > 0 else math.nan
        res["gpus"][d] = {"shared_capacity": shared.rate, "pool_capacity": [p.rate for p in pools],
                          "silo_gpus": silo_gpus, "silo_total": sum(silo_gpus), "niyama_gpus": shared_gpus}
        log(f"GPUs for {study.target_qps:g} QPS on {d}: silos {silo_gpus} = {sum(silo_gpus)}, Niyama {shared_gpus}")

    # 3. ablation on the first dataset; 4. α sensitivity
    d0 = study.datasets[0]
    edf_goodput = res["goodput"][d0]["Sarathi-EDF"]["rate"]
    ny_goodput = res["goodput"][d0]["Niyama"]["rate"]
    overload = study.overload_rho * edf_goodput
    res["ablation_overload_rate"] = overload
    for label, (pol, params) in ABLATION.items():
        cfg = scenario(study, d0, pol, params)
        if label in ("Sarathi-EDF", "+SP (Niyama)"):
            cap = res["goodput"][d0]["Sarathi-EDF" if label == "Sarathi-EDF" else "Niyama"]["rate"]
        elif reuse is not None:
            cap = reuse["ablation"][label]["goodput"]
        else:
            cap = capacity(study, cfg, executor).rate if study.ablation_goodput else math.nan
        v = violation_at(study, cfg, overload, executor)
        res["ablation"][label] = {"goodput": cap, "overload": v}
        log(f"ablation {label:<13} goodput {cap:.3g}  at {overload:.3g} QPS: violations {v['all'][0]:.1f} ± {v['all'][1]:.1f}%")
    for alpha in study.alphas:
        cfg = scenario(study, d0, "niyama", {"alpha_s_per_token": alpha})
        res["alpha"][alpha] = {rho: violation_at(study, cfg, rho * ny_goodput, executor)
                               for rho in (1.0, study.overload_rho)}
        log(f"alpha {alpha * 1e3:g} ms/token: " + ", ".join(
            f"ρ={rho:g}: {v['all'][0]:.1f}% (Q1 {v['Q1'][0]:.1f}%)" for rho, v in res["alpha"][alpha].items()))

    # 5. diurnal
    res["diurnal"] = diurnal(study, res["goodput"][study.diurnal_dataset]["Sarathi-EDF"]["rate"], executor, log) \
        if study.diurnal_dataset in res["goodput"] else {}
    (out / "niyama_results.json").write_text(json.dumps(_jsonable(res), indent=1, allow_nan=True) + "\n")
    res["markdown"] = report(study, res)
    (out / "niyama_report.md").write_text(res["markdown"] + "\n")
    res["plots"] = plot_diurnal(res["diurnal"], out / "niyama_diurnal_p99.png")
    return res


DIURNAL_STACKS: dict[str, tuple[str, dict[str, Any]]] = {
    "Sarathi-FCFS": ("sarathi_fcfs", {"chunk_tokens": SHARED_CHUNK}),
    "Sarathi-EDF": ("sarathi_edf", {"chunk_tokens": SHARED_CHUNK}),
    "Niyama": ("niyama", {"tier_importance": [0, 0, 0, 1, 1, 1]}),
}


def diurnal_tiers() -> dict[str, Any]:
    hi, lo = (1 - DIURNAL_LOW_SHARE) / 3, DIURNAL_LOW_SHARE / 3
    slos = [{"ttft_s": 6.0, "tbt_s": 0.05}, {"ttlt_s": 600.0}, {"ttlt_s": 1800.0}]
    return {"num_tiers": 6, "weights": [hi] * 3 + [lo] * 3, "slos": slos * 2,
            "names": ["Q1", "Q2", "Q3", "Q1-low", "Q2-low", "Q3-low"]}


def diurnal(study: Study, edf_goodput: float, executor: str, log=print) -> dict[str, Any]:
    """The seed's diurnal profile in ρ units of Sarathi-EDF's goodput (see SEED_EDF_GOODPUT)."""
    from tierserve.experiments.sweep import run_many
    seg = study.segment_s
    rates = [round(r / SEED_EDF_GOODPUT * edf_goodput, 3) for r in DIURNAL_RATES]
    n = int(sum(r * seg for r in rates))
    arrivals = {"kind": "piecewise", "rates": rates, "durations_s": [seg] * len(rates)}
    out: dict[str, Any] = {"segment_s": seg, "num_requests": n, "rates": rates}
    jobs, labels = [], []
    for label, (pol, params) in DIURNAL_STACKS.items():
        cfg = scenario(study, study.diurnal_dataset, pol, params, num_requests=n, arrivals=arrivals,
                       tiers=diurnal_tiers())
        for s in study.seeds:
            jobs.append({"cfg": cfg, "seed": s})
            labels.append(label)
    runs = run_many(judge_whole, jobs, executor=executor, progress=False)
    for label in DIURNAL_STACKS:
        mine = [r for r, lab in zip(runs, labels) if lab == label]
        names = list(mine[0]["violations_pct"])
        row = {name: _ci([r["violations_pct"][name] for r in mine]) for name in names}
        row["critical"] = _ci([r["critical_pct"] for r in mine])
        row["relegated"] = float(np.mean([r["relegated"] for r in mine]))
        row["rolling"] = (mine[0]["q1_arrival_s"], mine[0]["q1_ttft_s"])
        out[label] = row
        log(f"diurnal {label:<13} overall {row['all'][0]:.2f}%  critical {row['critical'][0]:.2f}%  "
            f"Q1 {row['Q1'][0]:.2f}% Q1-low {row['Q1-low'][0]:.2f}%")
    return out


def _ci(values) -> tuple[float, float]:
    ci = mean_ci95(values)
    return (ci.mean, ci.half_width)


def plot_diurnal(d: dict[str, Any], path: Path) -> list[str]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(8, 3.5))
    window_s = max(4 * d["segment_s"] / 15, 1.0)        # a 4-minute window at the paper's 15-minute segments
    for label in DIURNAL_STACKS:
        a, t = (np.asarray(x) for x in d[label]["rolling"])
        if len(a) == 0:
            continue
        centers = np.arange(a.min(), a.max(), window_s / 2)
        p99 = [np.percentile(t[(a >= c - window_s / 2) & (a < c + window_s / 2)], 99)
               if np.any((a >= c - window_s / 2) & (a < c + window_s / 2)) else np.nan for c in centers]
        ax.plot(centers / 60, p99, label=label)
    ax.axhline(6.0, color="k", ls=":", lw=1, label="Q1 TTFT target")
    ax.set_yscale("log")
    ax.set_xlabel("arrival time (min)")
    ax.set_ylabel("rolling P99 TTFT of Q1 (s)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [str(path)]


# ---- report ----------------------------------------------------------------------------------------------
def _f(x: float, nd: int = 2) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def report(study: Study, res: dict[str, Any]) -> str:
    L = ["# Niyama/QoServe (seed 003) — tierserve reproduction", "",
         f"Llama-3-8B / A100-80GB, physical execution model; seeds {list(study.seeds)}; goodput and capacities by "
         f"bisection to ±{study.rel_tol:.0%} over the seeds pooled (steady-state window, every class ≥ 99% "
         "deadlines met and every queue stable); violation rates mean ± 95% over seeds.", "",
         "## Goodput per replica (QPS)", "",
         "| dataset | " + " | ".join(STACKS) + " | Niyama / FCFS | Niyama / EDF | seed (FCFS / EDF / Niyama) |",
         "|---|" + "---|" * (len(STACKS) + 3)]
    for d, row in res["goodput"].items():
        g = {k: v["rate"] for k, v in row.items()}
        seed = SEED_GOODPUT.get(d)
        L.append(f"| {d} | " + " | ".join(_f(g[k]) + ("+" if row[k]["saturated"] else "") for k in STACKS) +
                 f" | {_f(g['Niyama'] / g['Sarathi-FCFS'])}× | {_f(g['Niyama'] / g['Sarathi-EDF'])}× | "
                 + (" / ".join(f"{x:g}" for x in seed.values()) if seed else "—") + " |")
    L += ["", f"## GPUs for {study.target_qps:g} QPS (M = {study.cluster_replicas}-replica capacity, scaled)", "",
          "| dataset | silo pools Q1/Q2/Q3 | silo total | Niyama (shared) | saving | seed silo → Niyama |",
          "|---|---|---|---|---|---|"]
    for d, g in res["gpus"].items():
        seed = SEED_GPUS_50QPS.get(d)
        saving = 1 - g["niyama_gpus"] / g["silo_total"] if g["silo_total"] else math.nan
        L.append(f"| {d} | {' / '.join(str(x) for x in g['silo_gpus'])} | {g['silo_total']} | {g['niyama_gpus']} | "
                 f"{_f(100 * saving, 0)}% | {seed[0]} → {seed[1]} ({100 * (1 - seed[1] / seed[0]):.0f}%) |")
    L += ["", f"## Ablation ({study.datasets[0]}; overload = {study.overload_rho:g} × Sarathi-EDF goodput = "
              f"{_f(res['ablation_overload_rate'])} QPS)", "",
          "| config | goodput (QPS) | violations at overload (%) | relegated per run | seed goodput | seed violations at 6 QPS |",
          "|---|---|---|---|---|---|"]
    for label, a in res["ablation"].items():
        v = a["overload"]
        seed = SEED_ABLATION.get(label)
        L.append(f"| {label} | {_f(a['goodput'])} | {_f(v['all'][0], 1)} ± {_f(v['all'][1], 1)} | {v['relegated']:.0f} | "
                 + (f"{seed[0]:g} | {seed[1]:g}" if seed else "— | —") + " |")
    L += ["", "## α sensitivity (Niyama; violations %, overall and Q1)", "", "| α (ms/token) | " +
          " | ".join(f"ρ = {rho:g}" for rho in (1.0, study.overload_rho)) + " |", "|---|---|---|"]
    for alpha, row in res["alpha"].items():
        L.append(f"| {alpha * 1e3:g} | " + " | ".join(
            f"{_f(v['all'][0], 1)} ± {_f(v['all'][1], 1)} (Q1 {_f(v['Q1'][0], 1)})" for v in row.values()) + " |")
    d = res["diurnal"]
    names = ["Q1", "Q2", "Q3", "Q1-low", "Q2-low", "Q3-low"]
    if not d:
        return "\n".join(L)
    L += ["", f"## Diurnal ({len(DIURNAL_RATES)} segments of {d['segment_s']:g} s at {d['rates']} QPS "
              f"(the seed's {list(DIURNAL_RATES)} in units of its EDF goodput), "
              f"{d['num_requests']} requests, 20% low priority; violations %)", "",
          "| stack | overall | critical (Q1–Q3 high) | " + " | ".join(names) + " | relegated | seed overall |",
          "|---|" + "---|" * (len(names) + 4)]
    for label in DIURNAL_STACKS:
        row = d[label]
        L.append(f"| {label} | {_f(row['all'][0])} ± {_f(row['all'][1])} | {_f(row['critical'][0])} | "
                 + " | ".join(_f(row[n][0]) for n in names) + f" | {row['relegated']:.0f} | {SEED_DIURNAL[label]} |")
    return "\n".join(L)


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items() if k != "rolling"}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return x


__all__ = ["ABLATION", "DATASETS", "DeadlineRunner", "STACKS", "Study", "deadline_table", "run_study", "scenario"]
