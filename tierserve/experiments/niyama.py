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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core import ConfigError
from tierserve.experiments.capacity import RunLength, find_capacity, with_rate, with_seed
from tierserve.experiments.scenario import ScenarioConfig, run_scenario
from tierserve.metrics import RequestTable
from tierserve.metrics.stability import SteadyRun, mean_ci95, steady_run, table_work_verdict
from tierserve.metrics.summary import summarize

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
# Niyama's dynamic chunking sizes each batch by the predicted iteration time. By default it asks the simulator's
# own execution-time model (the predictor is exact); the row below gives it a separately calibrated model of the
# same GPU instead (`vidur_parity`, Vidur-profile coefficients), while the simulator keeps its physical model.
CALIBRATED = "Niyama, calibrated predictor"
CALIBRATED_MODE = "vidur_parity"
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
    second_model: str = "Qwen-7B"        # the seed's second model, on `second_tp` GPUs per replica
    second_tp: int = 2
    second_datasets: tuple[str, ...] = ("azure_code",)
    dispatchers: tuple[str, ...] = ("round_robin", "jsq", "deadline_slack")
    dispatch_replicas: int = 8           # cluster size of the dispatch comparison (2 leaves a request two choices)
    dispatch_requests_per_replica: int = 1000    # per run of its capacity searches (2,000 at 2 replicas, as M's)
    # Violation points in units of Niyama-behind-JSQ's capacity: at it, 20% over, and the seed's overload in
    # units of its own Niyama goodput (6 QPS / 3.65 QPS).
    dispatch_rhos: tuple[float, ...] = (1.0, 1.2, 6.0 / 3.65)
    workers: int = 2                     # process-pool size (the machine is shared)
    goodput_only: bool = False           # only the one-replica goodput searches (and their report table)

    def __post_init__(self) -> None:
        for d in self.datasets + (self.diurnal_dataset,) + self.second_datasets:
            if d not in DATASETS:
                raise ConfigError("dataset", d, " | ".join(DATASETS))
        if len(self.seeds) < 3:
            raise ConfigError("seeds", list(self.seeds), "at least 3 seeds (95% intervals need them)")
        if not (isinstance(self.workers, int) and self.workers >= 1):
            raise ConfigError("workers", self.workers, "an integer >= 1")
        for name in ("dispatch_replicas", "dispatch_requests_per_replica"):
            v = getattr(self, name)
            if not (isinstance(v, int) and not isinstance(v, bool) and v >= (2 if name == "dispatch_replicas" else 1)):
                raise ConfigError(name, v, "an integer >= 2 (replicas behind the dispatcher)"
                                  if name == "dispatch_replicas" else "an integer >= 1 (requests per replica)")
        from tierserve.policies.cluster import CLUSTER_POLICIES
        for name in self.dispatchers:
            if name not in CLUSTER_POLICIES.table:
                raise ConfigError("dispatchers", name, " | ".join(CLUSTER_POLICIES.table))

    @classmethod
    def quick(cls) -> Study:
        # runs start at 250 requests (the work verdict reads no growth from fewer than 200) and double to 1,000
        return cls(datasets=("azure_code",), num_requests=250, cluster_requests=300, cluster_replicas=2,
                   dispatch_replicas=3, dispatch_requests_per_replica=100, rel_tol=0.5, lo=1.0, hi=16.0,
                   alphas=(0.008,), segment_s=5.0, overload_duration_s=30.0, ablation_goodput=False)


# Length bins (tokens, upper edges inclusive) for violations by request length: the seed reports violations per
# length because SRPF and a large α sacrifice long requests.
PROMPT_BINS = (512, 2048, 4096, math.inf)
DECODE_BINS = (16, 64, 256, math.inf)


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


@dataclass(frozen=True)
class DeadlineRunner:
    """`make_run` for `find_capacity`: one seed of a scenario at a rate, judged on deadlines in steady state
    (the work verdict: `tierserve.metrics.stability.steady_run`)."""

    cfg: ScenarioConfig
    drop_fraction: float | None = None
    planner: str = ""          # exec mode of the policy's planning predictor ("": the simulator's own)

    def __call__(self, rate: float, seed: int, num_requests: int | None = None) -> SteadyRun:
        cfg = with_seed(self.cfg, seed)
        if num_requests is not None:
            data = cfg.model_dump(mode="json")
            data["workload"]["num_requests"] = int(num_requests)
            cfg = ScenarioConfig.from_dict(data)
        result = run_scenario(with_rate(cfg, rate), predictor=planning_predictor(cfg, self.planner))
        table = deadline_table(result.table)
        return steady_run(table, result.sim.duration_s, result.workload.tier_set, seed, rate, self.drop_fraction,
                          {"relegated": result.sim.stats["relegated"]})


class PlannedPredictor:
    """The simulator's execution-time model for everything the replica times, with a policy's chunk sizing
    (`max_prefill_tokens_within`, asked only by policies) answered by another model."""

    def __init__(self, truth, planner) -> None:
        self._truth, self._planner = truth, planner

    def __getattr__(self, name: str):
        return getattr(self._truth, name)

    def max_prefill_tokens_within(self, *args, **kwargs) -> int:
        return self._planner.max_prefill_tokens_within(*args, **kwargs)


def planning_predictor(cfg: ScenarioConfig, planner: str):
    """None (the simulator builds its own, exact for the policy) or a `PlannedPredictor` whose planning answers
    come from the `planner` exec mode of the same model and GPU."""
    if not planner:
        return None
    from tierserve.hardware.exec_model import make_execution_model
    rc = cfg.cluster.replica
    truth = make_execution_model(rc.model, rc.gpu, rc.tp, mode=rc.exec_mode,
                                 iteration_overhead_ms=rc.iteration_overhead_ms, exec_model_file=rc.exec_model_file)
    return PlannedPredictor(truth, make_execution_model(rc.model, rc.gpu, rc.tp, mode=planner))


def judge_whole(cfg: ScenarioConfig, seed: int) -> dict[str, Any]:
    """Process-pool worker: one seed of a time-varying run, judged on deadlines over the whole run."""
    result = run_scenario(with_seed(cfg, seed))
    table = deadline_table(result.table)
    summary = summarize(table, None, result.sim.duration_s, result.workload.tier_set)
    stability = {"work": table_work_verdict(table, result.sim.duration_s)}
    viol = {name: 100.0 * (1.0 - t.slo_attainment) for name, t in summary.tiers.items()}
    high = np.isin(table["tier"], [0, 1, 2])            # the critical (high-priority) requests
    critical = 100.0 * (1.0 - float(table.meets_slo[high].mean())) if high.any() else math.nan
    q1 = np.isin(table["tier"], [i for i, t in enumerate(result.workload.tier_set) if t.name.startswith("Q1")])
    relegated = ~np.isnan(table["relegated_s"])
    return {"violations_pct": viol, "critical_pct": critical, "stable": {k: v.stable for k, v in stability.items()},
            "relegated": int(result.sim.stats["relegated"]), "relegated_low": int((relegated & ~high).sum()),
            "q1_arrival_s": table.arrival_s[q1].tolist(), "q1_ttft_s": np.nan_to_num(table.ttft_s[q1], nan=1e9).tolist()}


# ---- scenarios -------------------------------------------------------------------------------------------
def scenario(study: Study, dataset: str, policy: str, params: dict[str, Any], *, replicas: int = 1,
             cluster_policy: str = "round_robin", cluster_params: dict | None = None, num_requests: int | None = None,
             rate: float = 1.0, arrivals: dict | None = None, tiers: dict | None = None, model: str | None = None,
             tp: int = 1) -> ScenarioConfig:
    return ScenarioConfig.from_dict({
        "name": f"niyama-{dataset}-{policy}", "seed": 0,
        "cluster": {"num_replicas": replicas, "replica": {"model": model or study.model, "gpu": study.gpu, "tp": tp},
                    "local_policy": policy, "local_policy_params": params,
                    "cluster_policy": cluster_policy, "cluster_policy_params": cluster_params or {}},
        "workload": {"num_requests": num_requests or study.num_requests,
                     "arrivals": arrivals or {"kind": "poisson", "rate": rate},
                     "lengths": {"kind": "empirical", "dataset": DATASETS[dataset],
                                 "max_total_tokens": study.max_total_tokens},
                     "tiers": tiers or {"num_tiers": 3, "preset": "niyama"}}})


def search_job(key: tuple, study: Study, cfg: ScenarioConfig, goals: dict | None, hi: float,
               planner: str = "") -> dict[str, Any]:
    """Process-pool worker: one capacity search (serial inside), as plain numbers and its log line. Each probe
    runs the scenario's requests, doubled while its work verdict is undecided, up to 4× that."""
    n = cfg.workload.num_requests
    cap = find_capacity(DeadlineRunner(cfg, planner=planner), study.lo, hi, study.seeds, study.rel_tol,
                        goals=goals, executor="serial", run_length=RunLength(n, 4 * n))
    return {"key": key, "rate": cap.rate, "stable_rate": cap.stable_rate, "saturated": cap.stack.saturated,
            "tiers": cap.tier_rates(), "text": str(cap), "interval": list(cap.interval),
            "lengths": list(cap.lengths)}


def point_job(cfg: ScenarioConfig, rate: float, seed: int, num_requests: int) -> dict[str, Any]:
    """Process-pool worker: one seed at a fixed rate, judged on deadlines (steady-state window): violation % per
    class and overall, the verdict, relegations, and misses / requests per prompt- and decode-length bin."""
    data = cfg.model_dump(mode="json")
    data["workload"]["num_requests"] = num_requests
    result = run_scenario(with_rate(with_seed(ScenarioConfig.from_dict(data), seed), rate))
    table = deadline_table(result.table)
    run = steady_run(table, result.sim.duration_s, result.workload.tier_set, seed, rate, None,
                     {"relegated": result.sim.stats["relegated"]})
    start = run.work.warmup_s if math.isfinite(run.work.warmup_s) else -math.inf
    keep = np.asarray(table.arrival_s) >= start        # the summary's window: from the warm-up found on
    miss = ~table.meets_slo[keep]
    bins = {}
    for col, edges in (("prompt_tokens", PROMPT_BINS), ("output_tokens", DECODE_BINS)):
        which = np.searchsorted(np.asarray(edges[:-1], float), table[col][keep], side="left")
        bins[col] = {"requests": np.bincount(which, minlength=len(edges)).tolist(),
                     "misses": np.bincount(which, weights=miss, minlength=len(edges)).astype(int).tolist()}
    return {"violations_pct": {name: 100.0 * (1.0 - t.slo_attainment) for name, t in run.summary.tiers.items()},
            "stable": run.stable, "verdict": run.verdict_line(), "relegated": int(result.sim.stats["relegated"]),
            "bins": bins}


def _point_summary(runs: list[dict[str, Any]], rate: float) -> dict[str, Any]:
    """Mean ± 95% over seeds per class, overall and per length bin; how many seeds were stable."""
    out: dict[str, Any] = {"rate": rate, "stable_seeds": sum(r["stable"] for r in runs),
                           "verdicts": [r["verdict"] for r in runs],
                           "relegated": float(np.mean([r["relegated"] for r in runs]))}
    for name in runs[0]["violations_pct"]:
        out[name] = _ci([r["violations_pct"][name] for r in runs])
    out["bins"] = {}
    for col in runs[0]["bins"]:
        rows = []
        for b in range(len(runs[0]["bins"][col]["requests"])):
            pct = [100.0 * r["bins"][col]["misses"][b] / r["bins"][col]["requests"][b]
                   for r in runs if r["bins"][col]["requests"][b]]
            rows.append({"requests": int(sum(r["bins"][col]["requests"][b] for r in runs)),
                         "violations_pct": _ci(pct) if pct else (math.nan, math.nan)})
        out["bins"][col] = rows
    return out


class Points:
    """Fixed-rate runs collected from every part of the study and run in one process pool; identical
    (config, rate) points are run once."""

    def __init__(self, study: Study) -> None:
        self.study = study
        self.jobs: list[dict[str, Any]] = []
        self.where: dict[str, tuple[int, int]] = {}     # point id -> (first job, last job + 1)
        self._ids: dict[str, str] = {}

    def add(self, cfg: ScenarioConfig, rate: float, num_requests: int | None = None) -> str:
        n = num_requests or max(int(rate * self.study.overload_duration_s), 50)
        ident = json.dumps([cfg.model_dump(mode="json"), rate, n], sort_keys=True)
        if ident not in self._ids:
            pid = f"p{len(self._ids)}"
            self._ids[ident] = pid
            first = len(self.jobs)
            self.jobs += [{"cfg": cfg, "rate": rate, "seed": s, "num_requests": n} for s in self.study.seeds]
            self.where[pid] = (first, len(self.jobs))
        return self._ids[ident]

    def run(self, executor: str, extra: list[dict[str, Any]] = ()) -> tuple[dict[str, dict[str, Any]], list]:
        """Every point (summarised by id) and the `extra` jobs ({"fn", "kw"}, run first) in one pool."""
        from tierserve.experiments.runs import run_many
        jobs = list(extra) + [{"fn": point_job, "kw": j} for j in self.jobs]
        runs = run_many(_call, jobs, executor=executor, workers=self.study.workers, progress=False)
        extra_runs, runs = runs[:len(extra)], runs[len(extra):]
        return {pid: _point_summary(runs[a:b], self.jobs[a]["rate"]) for pid, (a, b) in self.where.items()}, extra_runs


def _call(fn, kw: dict[str, Any]):
    """Process-pool worker: `fn(**kw)` (one pool for jobs of several kinds)."""
    return fn(**kw)


def run_searches(study: Study, jobs: list[dict[str, Any]], executor: str, log) -> dict[tuple, dict[str, Any]]:
    from tierserve.experiments.runs import run_many
    out = {}
    for r in run_many(search_job, jobs, executor=executor, workers=study.workers, progress=False):
        out[tuple(r["key"])] = r
        log(f"capacity {' / '.join(str(k) for k in r['key'])}: {r['text']}")
    return out


def _cap_row(r: dict[str, Any]) -> dict[str, Any]:
    return {"rate": r["rate"], "stable_rate": r["stable_rate"], "saturated": r["saturated"], "tiers": r["tiers"],
            "interval": r.get("interval"), "lengths": r.get("lengths")}


# ---- the study -------------------------------------------------------------------------------------------


def _save(out: Path, res: dict[str, Any]) -> None:
    (out / "niyama_results.json").write_text(json.dumps(_jsonable(res), indent=1, allow_nan=True) + "\n")


DIURNAL_STACKS: dict[str, tuple[str, dict[str, Any]]] = {
    "Sarathi-FCFS": ("sarathi_fcfs", {"chunk_tokens": SHARED_CHUNK}),
    "Sarathi-EDF": ("sarathi_edf", {"chunk_tokens": SHARED_CHUNK}),
    "Niyama": ("niyama", {"tier_importance": [0, 0, 0, 1, 1, 1]}),
}
# The same Niyama with the low-priority 20% removed from the traffic (rates × 0.8): what the high-priority
# requests get when every low-priority one is shed at no cost — the floor any relegation order can reach.
HIGH_ONLY = "Niyama, high priority only"
# Niyama with the relegation rule it had before issue 9's fix (only a less important request ahead in line gives
# way, and a violator past its deadline is relegated itself): what the fix changed.
AHEAD_ONLY = "Niyama, relegation ahead only"


def diurnal_tiers(low_share: float = DIURNAL_LOW_SHARE) -> dict[str, Any]:
    hi, lo = (1 - low_share) / 3, low_share / 3
    slos = [{"ttft_s": 6.0, "tbt_s": 0.05}, {"ttlt_s": 600.0}, {"ttlt_s": 1800.0}]
    return {"num_tiers": 6, "weights": [hi] * 3 + [lo] * 3, "slos": slos * 2,
            "names": ["Q1", "Q2", "Q3", "Q1-low", "Q2-low", "Q3-low"]}


def diurnal_jobs_of(study: Study, edf_goodput: float) -> tuple[dict[str, Any], list[dict[str, Any]], list[str]]:
    """The seed's diurnal profile in ρ units of Sarathi-EDF's goodput (see SEED_EDF_GOODPUT): (what it is,
    `judge_whole` jobs, their row labels)."""
    seg = study.segment_s
    rates = [round(r / SEED_EDF_GOODPUT * edf_goodput, 3) for r in DIURNAL_RATES]
    n = int(sum(r * seg for r in rates))
    info: dict[str, Any] = {"segment_s": seg, "num_requests": n, "rates": rates}
    jobs, labels = [], []
    rows = [(label, pol, params, 1.0) for label, (pol, params) in DIURNAL_STACKS.items()]
    pol, params = DIURNAL_STACKS["Niyama"]
    rows.append((AHEAD_ONLY, pol, {**params, "relegation_scope": "ahead"}, 1.0))
    rows.append((HIGH_ONLY, pol, params, 1.0 - DIURNAL_LOW_SHARE))
    for label, pol, params, keep in rows:
        r = [round(x * keep, 4) for x in rates]
        arrivals = {"kind": "piecewise", "rates": r, "durations_s": [seg] * len(r)}
        cfg = scenario(study, study.diurnal_dataset, pol, params, num_requests=int(sum(x * seg for x in r)),
                       arrivals=arrivals, tiers=diurnal_tiers(DIURNAL_LOW_SHARE if keep == 1.0 else 0.0))
        for s in study.seeds:
            jobs.append({"cfg": cfg, "seed": s})
            labels.append(label)
    return info, jobs, labels


def diurnal_rows(info: dict[str, Any], runs: list[dict[str, Any]], labels: list[str], log=print) -> dict[str, Any]:
    out = dict(info)
    for label in dict.fromkeys(labels):
        mine = [r for r, lab in zip(runs, labels) if lab == label]
        names = list(mine[0]["violations_pct"])
        row = {name: _ci([r["violations_pct"][name] for r in mine]) for name in names}
        row["critical"] = _ci([r["critical_pct"] for r in mine])
        row["relegated"] = float(np.mean([r["relegated"] for r in mine]))
        row["relegated_low"] = float(np.mean([r["relegated_low"] for r in mine]))
        row["rolling"] = (mine[0]["q1_arrival_s"], mine[0]["q1_ttft_s"])
        out[label] = row
        log(f"diurnal {label:<13} overall {row['all'][0]:.2f}%  critical {row['critical'][0]:.2f}%  "
            f"Q1 {row['Q1'][0]:.2f}% Q1-low {row['Q1-low'][0]:.2f}%  relegated {row['relegated']:.0f} "
            f"(low {row['relegated_low']:.0f})")
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


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items() if k != "rolling"}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.floating, np.integer)):
        return x.item()
    return x


__all__ = ["ABLATION", "DATASETS", "DeadlineRunner", "STACKS", "Study", "deadline_table", "scenario"]
