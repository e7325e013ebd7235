"""`tierserve reproduce contract`: the tier contract (docs/contract.md) against every registered stack, at equal GPUs.

Sections (each a list of runs, every run judged by the work verdict of `tierserve.metrics.stability`):
  default     — the default scenario (`tierserve simulate`: ρ = 0.9 of FCFS capacity with a 3× burst), whole run
                (the burst included), every stack, per-tier attainment / TTFT P99 / TPOT P99, goodput, deferrals;
  capacity    — per stack on the default mix (Poisson, no burst): the highest rate at which every tier meets its
                goal and the queue is stable (`experiments.capacity.scenario_capacity`), and stable-only;
  steady      — Poisson loads ρ = rate / (FCFS capacity measured in `capacity`, else the default scenario's
                committed DEFAULT_BASELINE_CAPACITY_RPS, the same search's result) from 0.5 to 1.1, steady window;
  ktier       — seed 000's tier distributions (uniform, Gaussian, enterprise) with K = 3…5 tiers at ρ = 0.9;
  reasoning   — seed 001's reasoning-heavy mix (70% reasoning, 30% chat; 3 tiers) at ρ of FCFS's stable-only
                capacity on that mix (measured here);
  qos_diurnal — seed 003's QoS classes (Q1 interactive, Q2/Q3 TTLT) under a diurnal load;
  ablation    — the tierserve stack with one piece removed at a time, default scenario;
  sensitivity — tier TBT targets scaled, and the execution model in vidur_parity mode instead of physical.
Every figure is mean ± 95% Student-t half-width over the seeds; each row also says how many seeds were stable.
"""
from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tierserve.experiments.capacity import (
    RunLength, StackCapacity, find_capacity, judge, scenario_capacity, with_rate,
)
from tierserve.experiments.scenario import (
    DEFAULT_BASELINE_CAPACITY_RPS, ScenarioConfig, baseline_scenario, run_scenario,
)
from tierserve.experiments.contract_report import ABLATIONS, FCFS, SECTIONS, STACKS, TIERSERVE, json_safe, report
from tierserve.metrics.stability import mean_ci95


@dataclass(frozen=True)
class CapacitySearch:
    """The one capacity search of the default mix (Poisson, no burst): the FCFS baseline's — whose result is
    the default scenario's `DEFAULT_BASELINE_CAPACITY_RPS` (`scripts/measure_default_capacity.py`) — and every
    stack's in the study's capacity section. Runs as long as the default scenario (3,000 requests), doubled
    while the verdict is undecided; bisection on [lo, hi] to ±rel_tol.

    The FCFS capacity is bound by tier 0 (99% of TTFT ≤ 0.5 s), whose attainment is flat near 99% over a wide
    range of rates (≈ 99.1% from 14.6 to 15.5 req/s): a miss or two more or less in a shorter run moves the
    crossing by req/s, which is why a 1,000–2,000-request search gave 14.6 where a 3,000-request one gave
    15.4. `goal_interval` states that uncertainty: the probed rates where the seed interval of every tier's
    attainment lies clearly above / clearly below its goal."""

    lo: float = 8.0
    hi: float = 40.0
    rel_tol: float = 0.05
    run_length: tuple[int, int] = (3000, 12000)
    seeds: tuple[int, ...] = (0, 1, 2)


DEFAULT_MIX_SEARCH = CapacitySearch()


@dataclass(frozen=True)
class Study:
    seeds: tuple[int, ...] = (0, 1, 2)
    num_requests: int = 3000                     # default-scenario runs (the burst needs the full 3,000)
    variant_requests: int = 2000                 # ablation and sensitivity runs: the burst and 40 s after it
    stacks: tuple[str, ...] = STACKS
    capacity_stacks: tuple[str, ...] = STACKS    # every registered stack (the issue: ≥ every other stack's)
    capacity_range: tuple[float, float] = (DEFAULT_MIX_SEARCH.lo, DEFAULT_MIX_SEARCH.hi)
    capacity_rel_tol: float = DEFAULT_MIX_SEARCH.rel_tol
    capacity_run_length: tuple[int, int] = DEFAULT_MIX_SEARCH.run_length
    rhos: tuple[float, ...] = (0.5, 0.7, 0.9, 1.0, 1.1)
    steady_requests: int = 1500
    steady_stacks: tuple[str, ...] = (FCFS, "vllm_priority+round_robin", "niyama+deadline_slack", TIERSERVE)
    ktier_mixes: tuple[str, ...] = ("uniform", "gaussian", "enterprise")
    ktier_ks: tuple[int, ...] = (3, 4, 5)
    ktier_stacks: tuple[str, ...] = (FCFS, "llumlet+llumnix_k", TIERSERVE)
    ktier_rho: float = 0.9
    reasoning_requests: int = 800
    reasoning_rho: float = 0.8
    reasoning_stacks: tuple[str, ...] = (FCFS, "vllm_priority+round_robin", "uniboost+jsq", TIERSERVE)
    diurnal_requests: int = 2000
    diurnal_period_s: float = 120.0
    diurnal_rho: float = 1.0                     # mean rate; peaks at 1.5× (amplitude 0.5)
    diurnal_stacks: tuple[str, ...] = (FCFS, "niyama+deadline_slack", TIERSERVE)
    tbt_scales: tuple[float, ...] = (0.6, 1.0, 1.6)
    sensitivity_stacks: tuple[str, ...] = (FCFS, TIERSERVE)
    sections: tuple[str, ...] = SECTIONS
    workers: int = 2
    quick: bool = False

    def capacity_search(self) -> CapacitySearch:
        """The study's capacity search of the default mix (`DEFAULT_MIX_SEARCH` unless quick)."""
        lo, hi = self.capacity_range
        return CapacitySearch(lo, hi, self.capacity_rel_tol, tuple(self.capacity_run_length), tuple(self.seeds))

    @classmethod
    def quick_study(cls) -> Study:
        """About a minute on two cores: short runs, one seed (two for the default scenario), few stacks."""
        return cls(seeds=(0,), num_requests=1200, stacks=(FCFS, "vllm_priority+round_robin", TIERSERVE),
                   capacity_stacks=(FCFS, TIERSERVE), capacity_rel_tol=0.25, capacity_run_length=(300, 300),
                   rhos=(0.5, 1.1), steady_requests=300, steady_stacks=(FCFS, TIERSERVE),
                   ktier_mixes=("uniform",), ktier_ks=(4,), ktier_stacks=(FCFS, TIERSERVE),
                   reasoning_requests=150, reasoning_stacks=(FCFS, TIERSERVE), diurnal_requests=400,
                   diurnal_period_s=20.0, diurnal_stacks=(FCFS, TIERSERVE), tbt_scales=(0.6,),
                   sensitivity_stacks=(FCFS, TIERSERVE), variant_requests=400, quick=True)


# ---- one run -----------------------------------------------------------------------------------------------
def stack_config(base: ScenarioConfig, stack: str, local_params: dict | None = None,
                 cluster_params: dict | None = None) -> ScenarioConfig:
    local, _, cluster = stack.partition("+")
    data = base.model_dump(mode="json")
    data["cluster"].update(local_policy=local, cluster_policy=cluster, local_policy_params=dict(local_params or {}),
                           cluster_policy_params=dict(cluster_params or {}))
    return ScenarioConfig.from_dict(data)


def run_numbers(run: Any, table: Any, deferred: dict[int, int]) -> dict[str, Any]:
    """The figures one run contributes: per tier and all, with its verdict."""
    s = run.summary
    out: dict[str, Any] = {"stable": bool(run.stable), "verdict": run.verdict_line(), "tiers": {}}
    for index, t in enumerate(s.per_tier):          # per_tier is in tier-index order
        out["tiers"][t.name] = {"attainment": t.slo_attainment, "ttft_p99": t.ttft.p99, "tpot_p99": t.tpot.p99,
                                "ttlt_p99": t.ttlt.p99, "goodput": t.goodput_rps, "relegated": t.relegated,
                                "deferred": deferred.get(index, 0), "n": t.total}
    out["all"] = {"attainment": s.all.slo_attainment, "goodput": s.all.goodput_rps, "ttlt_p99": s.all.ttlt.p99}
    return out


def deferred_per_tier(table: Any) -> dict[int, int]:
    """Requests the cluster held in its global queue (reason "deferred: …" in requests.csv), per tier."""
    out: dict[int, int] = {}
    for tier, reason in zip(table["tier"].tolist(), table["reason"]):
        if isinstance(reason, str) and reason.startswith("deferred:"):
            out[int(tier)] = out.get(int(tier), 0) + 1
    return out


def scenario_run(cfg: dict, seed: int, rate: float | None, whole_run: bool) -> dict[str, Any]:
    """Process-pool job: one seed of a scenario (at `rate` when given), judged; whole run or steady window."""
    c = ScenarioConfig.from_dict(cfg).model_copy(update={"seed": int(seed)})
    if rate is not None:
        c = with_rate(c, rate)
    result = run_scenario(c)
    run = judge(result, rate if rate is not None else math.nan, 0.0 if whole_run else None)
    return run_numbers(run, result.table, deferred_per_tier(result.table))


def reasoning_setup(stack: str, num_requests: int) -> Any:
    from tierserve.experiments.uniboost_runs import Setup
    return Setup(name="contract_reasoning", num_replicas=4, cluster_policy=stack.partition("+")[2],
                 num_requests=num_requests, num_tiers=3)


def reasoning_run(stack: str, num_requests: int, rate: float, seed: int) -> dict[str, Any]:
    """Process-pool job: seed 001's reasoning mix on the 4-replica cluster, 3 tiers, steady window."""
    from tierserve.experiments.uniboost_runs import simulate_point
    _, table, run = simulate_point(stack.partition("+")[0], {}, reasoning_setup(stack, num_requests), rate, seed)
    return run_numbers(run, table, deferred_per_tier(table))


def default_mix_capacity(stack: str, search: CapacitySearch = DEFAULT_MIX_SEARCH,
                         executor: str = "serial") -> StackCapacity:
    """`stack`'s capacity on the default mix by the one search (`CapacitySearch`)."""
    cfg = stack_config(with_requests_of(baseline_scenario(), search.run_length[0]), stack)
    return scenario_capacity(cfg, search.lo, search.hi, search.seeds, search.rel_tol,
                             run_length=RunLength(*search.run_length), executor=executor)


def goal_interval(cap: StackCapacity) -> dict[str, Any]:
    """The search's uncertainty from its own probes: at each probed rate, every tier's attainment per seed,
    mean ± 95% (Student t) over the seeds; `passes` = the highest probed rate where every tier's lower bound
    reaches its goal and most seeds are stable, `fails` = the lowest where some tier's upper bound is below
    its goal or most seeds are unstable (None where no probe is that clear). The capacity lies between."""
    probes = []
    for rate in sorted(cap.runs):
        rs = cap.runs[rate]
        tiers = {}
        clear_pass, clear_fail = True, False
        for t in (x.name for x in rs[0].summary.per_tier):
            goal = rs[0].summary.tiers[t].attainment_goal
            iv = mean_ci95([r.summary.tiers[t].slo_attainment for r in rs])
            tiers[t] = {"mean": iv.mean, "half_width": iv.half_width, "goal": goal}
            if math.isfinite(goal):
                hw = iv.half_width if math.isfinite(iv.half_width) else math.inf
                clear_pass = clear_pass and iv.mean - hw >= goal
                clear_fail = clear_fail or iv.mean + hw < goal
        stable = sum(bool(r.stable) for r in rs) * 2 > len(rs)
        probes.append({"rate": rate, "stable": stable, "tiers": tiers,
                       "clear_pass": clear_pass and stable, "clear_fail": clear_fail or not stable})
    passing = [p["rate"] for p in probes if p["clear_pass"]]
    failing = [p["rate"] for p in probes if p["clear_fail"]]
    return {"passes": max(passing) if passing else None, "fails": min(failing) if failing else None,
            "probes": probes}


def capacity_job(kind: str, stack: str, study: dict) -> dict[str, Any]:
    """Process-pool job: one stack's capacity on the default mix (kind "default") or the reasoning mix."""
    st = Study(**{k: tuple(v) if isinstance(v, list) else v for k, v in study.items()})
    if kind == "default":
        cap = default_mix_capacity(stack, st.capacity_search())
        return {**cap.to_dict(), "stack_name": stack, "kind": kind, "goal_interval": goal_interval(cap)}
    else:
        from tierserve.experiments.uniboost_runs import PointRunner
        runner = PointRunner(stack.partition("+")[0], (), reasoning_setup(stack, st.reasoning_requests))
        cap = find_capacity(runner, 0.5, 20.0, st.seeds[:1], 0.1,
                            run_length=RunLength(st.reasoning_requests, st.reasoning_requests))
    return {**cap.to_dict(), "stack_name": stack, "kind": kind}


def with_requests_of(cfg: ScenarioConfig, n: int) -> ScenarioConfig:
    data = cfg.model_dump(mode="json")
    data["workload"]["num_requests"] = int(n)
    return ScenarioConfig.from_dict(data)


def default_scenario(n: int, *, tbt_scale: float = 1.0, exec_mode: str = "physical") -> ScenarioConfig:
    """The default scenario (`tierserve simulate`), `n` requests, tier TBT targets × `tbt_scale`."""
    from tierserve.workload.tiers import default_slos
    data = ScenarioConfig().model_dump(mode="json")
    data["workload"]["num_requests"] = int(n)
    data["cluster"]["replica"]["exec_mode"] = exec_mode
    if tbt_scale != 1.0:
        data["workload"]["tiers"]["slos"] = [
            {"ttft_s": s.ttft_s, "tbt_s": s.tbt_s * tbt_scale if s.tbt_s else None, "ttlt_s": s.ttlt_s,
             "attainment": s.attainment} for s in default_slos(3)]
    return ScenarioConfig.from_dict(data)


# ---- the study ---------------------------------------------------------------------------------------------
def _jobs_over_seeds(study: Study, label: dict[str, Any], fn: Callable, **kw: Any) -> list[dict[str, Any]]:
    return [{"label": label, "fn": fn, "kw": {**kw, "seed": s}} for s in study.seeds]


def _call(fn: Callable, kw: dict[str, Any]) -> Any:
    return fn(**kw)


# The order sections run in: the default scenario and its ablation first, the wide sweeps last.
RUN_ORDER = ("default", "ablation", "capacity", "steady", "sensitivity", "ktier", "qos_diurnal", "reasoning")


def section_jobs(section: str, study: Study, fcfs_cap: float, reasoning_cap: float) -> list[dict[str, Any]]:
    """The runs of one section (each a job over the seeds)."""
    jobs: list[dict[str, Any]] = []
    if section == "default":
        base = default_scenario(study.num_requests)
        for stack in study.stacks:
            jobs += _jobs_over_seeds(study, {"section": "default", "stack": stack}, scenario_run,
                                     cfg=stack_config(base, stack).model_dump(mode="json"), rate=None, whole_run=True)
    elif section == "steady":
        base = with_requests_of(baseline_scenario(), study.steady_requests)
        for stack in study.steady_stacks:
            for r in study.rhos:
                jobs += _jobs_over_seeds(study, {"section": "steady", "stack": stack, "rho": r}, scenario_run,
                                         cfg=stack_config(base, stack).model_dump(mode="json"), rate=r * fcfs_cap,
                                         whole_run=False)
    elif section == "ktier":
        for mix in study.ktier_mixes:
            for k in study.ktier_ks:
                data = with_requests_of(baseline_scenario(), study.steady_requests).model_dump(mode="json")
                data["workload"]["tiers"] = {"num_tiers": k, "mix": mix}
                base = ScenarioConfig.from_dict(data)
                for stack in study.ktier_stacks:
                    params = {"num_tiers": k} if "llumnix_k" in stack else {}
                    jobs += _jobs_over_seeds(study, {"section": "ktier", "stack": stack, "mix": mix, "K": k},
                                             scenario_run, cfg=stack_config(base, stack, None, params).model_dump(
                                                 mode="json"), rate=study.ktier_rho * fcfs_cap, whole_run=False)
    elif section == "reasoning" and math.isfinite(reasoning_cap):
        for stack in study.reasoning_stacks:
            jobs += _jobs_over_seeds(study, {"section": "reasoning", "stack": stack, "rho": study.reasoning_rho},
                                     reasoning_run, stack=stack, num_requests=study.reasoning_requests,
                                     rate=study.reasoning_rho * reasoning_cap)
    elif section == "qos_diurnal":
        data = with_requests_of(baseline_scenario(), study.diurnal_requests).model_dump(mode="json")
        data["workload"]["tiers"] = {"num_tiers": 3, "preset": "niyama"}
        data["workload"]["arrivals"] = {"kind": "diurnal", "mean_rate": study.diurnal_rho * fcfs_cap,
                                        "amplitude": 0.5, "period_s": study.diurnal_period_s, "segments": 24}
        base = ScenarioConfig.from_dict(data)
        for stack in study.diurnal_stacks:
            jobs += _jobs_over_seeds(study, {"section": "qos_diurnal", "stack": stack, "rho": study.diurnal_rho},
                                     scenario_run, cfg=stack_config(base, stack).model_dump(mode="json"), rate=None,
                                     whole_run=True)
    elif section == "ablation":
        base = default_scenario(study.variant_requests)
        for name, lp, cp in ABLATIONS:
            jobs += _jobs_over_seeds(study, {"section": "ablation", "stack": TIERSERVE, "variant": name},
                                     scenario_run, cfg=stack_config(base, TIERSERVE, lp, cp).model_dump(mode="json"),
                                     rate=None, whole_run=True)
    elif section == "sensitivity":
        variants = [(f"TBT targets x{scale:g}", default_scenario(study.variant_requests, tbt_scale=scale))
                    for scale in study.tbt_scales]
        variants.append(("exec model vidur_parity", default_scenario(study.variant_requests,
                                                                     exec_mode="vidur_parity")))
        for name, base in variants:
            for stack in study.sensitivity_stacks:
                jobs += _jobs_over_seeds(study, {"section": "sensitivity", "stack": stack, "variant": name},
                                         scenario_run, cfg=stack_config(base, stack).model_dump(mode="json"),
                                         rate=None, whole_run=True)
    return jobs


def run_study(study: Study, out: Path, executor: str = "process", log: Callable[[str], None] = print,
              doc: Path | None = None, resume: bool = False) -> dict[str, Any]:
    """Run the study's sections in RUN_ORDER, saving results and report after each (`resume`: keep the
    sections an earlier run of the same study saved in `out` and run the rest)."""
    from tierserve.experiments.runs import run_many
    t0 = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    saved = out / "contract_results.json"
    res: dict[str, Any] = {"study": json_safe(asdict(study)), "capacity": {}, "rows": {s: [] for s in SECTIONS},
                           "done": [], "wall_s": 0.0}
    if resume and saved.exists():
        previous = json.loads(saved.read_text())
        if previous.get("study") == res["study"]:
            res = previous
            log(f"resuming: sections done {res['done']}")
    sd = asdict(study)
    elapsed0 = res["wall_s"]

    def fcfs_capacity() -> tuple[float, str]:
        fc = res["capacity"].get(f"default:{FCFS}")
        if fc is not None and fc["rate"] is not None and math.isfinite(fc["rate"]) and not study.quick:
            return fc["rate"], f"FCFS capacity measured here ({fc['rate']:.3g} req/s)"
        return (DEFAULT_BASELINE_CAPACITY_RPS,
                f"the default scenario's committed FCFS capacity ({DEFAULT_BASELINE_CAPACITY_RPS} req/s)")

    for section in RUN_ORDER:
        if section not in study.sections or section in res["done"]:
            continue
        t_section = time.perf_counter()
        cap_jobs = []
        if section == "capacity":
            cap_jobs = [{"kind": "default", "stack": s, "study": sd} for s in study.capacity_stacks]
        if section == "reasoning":
            cap_jobs = [{"kind": "reasoning", "stack": FCFS, "study": sd}]
        if cap_jobs:
            for c in run_many(capacity_job, cap_jobs, executor=executor, workers=study.workers, progress=False):
                res["capacity"][f"{c['kind']}:{c['stack_name']}"] = c
        fcfs_cap, fcfs_source = fcfs_capacity()
        res["fcfs_capacity_rps"], res["fcfs_capacity_source"] = fcfs_cap, fcfs_source
        rc = res["capacity"].get(f"reasoning:{FCFS}")
        reasoning_cap = rc["stable_rate"] if rc is not None and rc["stable_rate"] is not None else math.nan
        res["reasoning_capacity_rps"] = reasoning_cap
        jobs = section_jobs(section, study, fcfs_cap, reasoning_cap)
        outs = run_many(_call, [{"fn": j["fn"], "kw": j["kw"]} for j in jobs], executor=executor,
                        workers=study.workers, progress=False) if jobs else []
        groups: dict[str, dict[str, Any]] = {}
        for j, o in zip(jobs, outs):
            key = json.dumps(j["label"], sort_keys=True)
            groups.setdefault(key, {"label": j["label"], "runs": []})["runs"].append(o)
        res["rows"][section] = [{**g["label"], **summarise_runs(g["runs"])} for g in groups.values()]
        res["done"].append(section)
        res["wall_s"] = elapsed0 + time.perf_counter() - t0
        log(f"{section}: {len(cap_jobs)} capacity search(es), {len(jobs)} runs, "
            f"{time.perf_counter() - t_section:.0f} s")
        res["markdown"] = report(res, study)
        saved.write_text(json.dumps(json_safe(res), indent=1, sort_keys=True) + "\n")
        (out / "contract_report.md").write_text(res["markdown"])
    res.setdefault("fcfs_capacity_source", fcfs_capacity()[1])
    res.setdefault("reasoning_capacity_rps", math.nan)
    res["markdown"] = report(res, study)
    (out / "contract_report.md").write_text(res["markdown"])
    if doc is not None:
        write_doc(doc, study, res["markdown"])
    return res


def doc_section(study: Study) -> str:
    """The section of docs/results/contract.md a run of `study` writes: 'contract' (the full study),
    'contract quick' (the smoke size the tests rerun), with '-<sections>' when only some sections ran."""
    name = "contract quick" if study.quick else "contract"
    if tuple(study.sections) != SECTIONS:
        name += "-" + "-".join(study.sections)
    return name


def write_doc(doc: Path, study: Study, markdown: str) -> str:
    """Put the report in its section of the results document `doc` (the rest of it is left alone)."""
    from tierserve.experiments.results_doc import write_section
    name = doc_section(study)
    write_section(doc, name, markdown, "The tier contract: results")
    return name


def summarise_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Mean ± 95% over the seeds of every per-tier figure; how many seeds were stable."""
    tiers = list(runs[0]["tiers"])
    out: dict[str, Any] = {"seeds": len(runs), "stable": sum(r["stable"] for r in runs),
                           "verdicts": [r["verdict"] for r in runs], "tiers": {}}
    for t in tiers:
        out["tiers"][t] = {m: asdict(mean_ci95([r["tiers"][t][m] for r in runs]))
                           for m in runs[0]["tiers"][t]}
    out["all"] = {m: asdict(mean_ci95([r["all"][m] for r in runs])) for m in runs[0]["all"]}
    return out

__all__ = ["ABLATIONS", "SECTIONS", "STACKS", "Study", "deferred_per_tier", "run_study"]
