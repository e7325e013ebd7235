"""Seed 001 (UniBoost) reproduced on tierserve's replica model, in units of measured capacity.

Every point is a (policy, setup, ρ, seed) run judged in steady state (⌊0.1·n⌋ first and last arrivals dropped)
with the queue-trend stability verdict; points are reported as mean ± 95% over ≥ 3 seeds, with the share of
seeds whose queue was stable. ρ = rate / the stable-only capacity of `fcfs` (Sarathi order) on the same setup,
found by `find_capacity` (bisection, common random numbers across rates).

Sections (seed 001's numbering): Table 2 (Llama-3-8B, 70% reasoning + 30% Azure conversation, every policy as %
change vs `srpt`), §4.4 (tightest SLO scale at 99% attainment: P99 of latency / the request's unloaded latency),
Fig. 7 (CodeLlama-34B TP1, memory-bound: P90/P99 vs ρ per ablation phase), A.3 (starvation: 90% short + 10%
long, ρ ≈ 0.99, random dispatch), Tables 6–8 (k, δ, chunk), Table 9 (random / round-robin / JSQ dispatch, vs
`vllm`), and tiers (UniBoost's per-tier offset vs strict tier priority vs `vllm_priority`).

API: Study (defaults = the full run; Study.quick()), run_study(study, outdir, executor) -> dict,
run_point(**job) -> dict (one run's numbers), mixed_requests(setup, rate, seed).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core import Request, Status, true_output_tokens
from tierserve.metrics import RequestTable
from tierserve.metrics.stability import SteadyRun, mean_ci95, steady_run, steady_state_mask
from tierserve.workload.mixes import reasoning_chat_lengths, short_long_lengths
from tierserve.workload.tiers import default_tier_set

TABLE2_POLICIES = ("fcfs", "sjf", "las", "srpt", "distboost", "uniboost_base", "uniboost_memguard", "uniboost")
ABLATION = ("las", "distboost", "uniboost_base", "uniboost_memguard", "uniboost")
# Seed 001's reported numbers we can check (ALGORITHMS.md §3; the seed's tables carry no other values here).
SEED_HEADLINE = {"uniboost.ttlt.p99": 35.0, "uniboost.ttft.p95": 97.0}
SEED_SLO_GAIN = (2.9, 8.7)
SEED_FIG7 = "knee moves right by 4-6%; UniBoost P99 sub-second at the highest QPS where others are multi-second"
METRICS = ("ttft.p50", "ttft.p95", "ttft.p99", "ttlt.p50", "ttlt.p95", "ttlt.p99", "tpot.p50", "tpot.p95",
           "tpot.p99", "tokens_per_s")


@dataclass(frozen=True)
class Setup:
    """One cluster + workload shape; the rate is set per point."""

    name: str = "table2"
    model: str = "Llama-3-8B"
    gpu: str = "A100-80GB"
    num_replicas: int = 1
    cluster_policy: str = "round_robin"
    num_requests: int = 1200
    workload: str = "mix"               # mix (70% reasoning + 30% chat) | starvation (90% short + 10% long)
    reasoning_fraction: float = 0.7
    num_tiers: int = 1
    token_budget: int | None = None     # None: the policy's default (2,048 for the new policies)
    max_total: int = 8192


@dataclass(frozen=True)
class Study:
    seeds: tuple[int, ...] = (0, 1, 2)
    table2: Setup = Setup(num_requests=3000)
    table2_rhos: tuple[float, ...] = (0.8, 0.95)
    fig7: Setup = Setup(name="fig7", model="CodeLlama-34B", num_requests=600, max_total=8192)
    fig7_rhos: tuple[float, ...] = (0.6, 0.8, 0.9, 1.0, 1.1)
    starvation: Setup = Setup(name="starvation", workload="starvation", num_replicas=4, cluster_policy="random",
                              num_requests=1600)
    starvation_rho: float = 0.99
    sens_rho: float = 0.95
    ks: tuple[int, ...] = (64, 256, 1024)
    deltas: tuple[int, ...] = (0, 32, 256)
    chunks: tuple[int, ...] = (512, 1024, 2048)
    dispatch: Setup = Setup(name="dispatch", num_replicas=4, num_requests=2400)
    dispatch_rho: float = 0.9
    tiers: Setup = Setup(name="tiers", num_tiers=3, num_requests=1200)
    tiers_rho: float = 0.9
    sections: tuple[str, ...] = ("table2", "fig7", "starvation", "sensitivity", "dispatch", "tiers")
    capacity_rel_tol: float = 0.05
    capacity_executor: str | None = None      # None: the study's executor (tiny runs go faster serially)

    @classmethod
    def quick(cls) -> Study:
        small = Setup(num_requests=240)
        return cls(table2=small, table2_rhos=(0.9,), sections=("table2", "starvation"),
                   starvation=Setup(name="starvation", workload="starvation", num_replicas=2,
                                    cluster_policy="random", num_requests=300),
                   capacity_rel_tol=0.1, capacity_executor="serial")


# ---- one run ------------------------------------------------------------------------------------------------
def mixed_requests(setup: Setup, rate: float, seed: int) -> list[Request]:
    """The setup's requests at `rate` (Poisson): the same sizes at every rate (unit gaps scaled by 1/rate)."""
    ss = np.random.SeedSequence([seed, 1])
    r_arr, r_len, r_tier = (np.random.default_rng(c) for c in ss.spawn(3))
    n = setup.num_requests
    times = np.cumsum(r_arr.exponential(1.0, n)) / rate
    if setup.workload == "starvation":
        lens = short_long_lengths(n, r_len)
    else:
        lens = reasoning_chat_lengths(n, r_len, setup.reasoning_fraction, setup.max_total)
    tier_set = default_tier_set(setup.num_tiers)
    if setup.num_tiers > 1:
        from tierserve.workload.tiers import assign_tiers, enterprise_mix
        tiers = assign_tiers(n, enterprise_mix(setup.num_tiers), r_tier)
    else:
        tiers = np.zeros(n, np.int64)
    return [Request(i, float(times[i]), int(lens.prompts[i]), int(lens.outputs[i]), int(tiers[i]),
                    tier_set[int(tiers[i])].slo, "long" if lens.reasoning[i] else "short") for i in range(n)]


def _cluster(setup: Setup, policy: str, params: dict, cluster_policy: str | None = None):
    from tierserve.sim import ClusterConfig
    replica: dict[str, Any] = {"model": setup.model, "gpu": setup.gpu}
    if setup.token_budget:
        replica["token_budget"] = setup.token_budget
    return ClusterConfig(num_replicas=setup.num_replicas, local_policy=policy, local_policy_params=dict(params),
                         cluster_policy=cluster_policy or setup.cluster_policy, replica=replica)


def simulate_point(policy: str, params: dict, setup: Setup, rate: float, seed: int):
    from tierserve.sim import simulate
    reqs = mixed_requests(setup, rate, seed)
    res = simulate(_cluster(setup, policy, params), reqs, setup.num_tiers, seed=seed)
    table = RequestTable.from_states(res.states, res.reasons)
    run = steady_run(table, res.duration_s, default_tier_set(setup.num_tiers), seed, rate)
    return res, table, run


@dataclass(frozen=True)
class PointRunner:
    """`make_run(rate, seed) -> SteadyRun` for `find_capacity` (picklable)."""

    policy: str
    params: tuple = ()
    setup: Setup = Setup()

    def __call__(self, rate: float, seed: int) -> SteadyRun:
        return simulate_point(self.policy, dict(self.params), self.setup, rate, seed)[2]


def _unloaded_latency(states, predictor) -> tuple[np.ndarray, np.ndarray]:
    """Per request: TTFT and TTLT alone on an idle replica (the prompt as one chunk, then its decodes)."""
    ttft0, ttlt0 = [], []
    for s in states:
        p, o = s.prompt_tokens, true_output_tokens(s)
        t1 = predictor.iteration_time(p, p * p * 0.5, 0, 0)
        dec = (o - 1) * (predictor.decode_base_time(1) + predictor.decode_context_coef_s * (p + o / 2))
        ttft0.append(t1)
        ttlt0.append(t1 + dec)
    return np.asarray(ttft0), np.asarray(ttlt0)


def run_point(policy: str, params: dict, setup: dict, rate: float, seed: int) -> dict[str, Any]:
    """One run's numbers (steady-state window): latency percentiles, throughput, verdict, preemption counts,
    SLO-scale P99s, and, for the starvation workload, the long-request trend and preempted-time P99."""
    st = Setup(**setup)
    t0 = time.perf_counter()
    res, table, run = simulate_point(policy, params, st, rate, seed)
    allsum = run.summary.tiers["all"]
    out: dict[str, Any] = {"policy": policy, "params": params, "setup": st.name, "rate": rate, "seed": seed,
                           "stable": run.stable, "verdict": run.verdict_line(), "wall_s": 0.0}
    for m in METRICS[:-1]:
        out[m] = allsum.get(m)
    out["ttlt.p90"] = allsum.get("ttlt.p90")
    out["tokens_per_s"] = allsum.output_tokens_per_s
    out["censored"] = allsum.censored
    window = steady_state_mask(table.arrival_s)
    states = [s for s, keep in zip(res.states, window) if keep and s.status == Status.FINISHED]
    out["preemptions"] = sum(s.num_preemptions for s in states)
    out["forced_preemptions"] = sum(s.policy_data.get("forced_preemptions", 0) for s in states)
    out["priority_preemptions"] = sum(s.policy_data.get("priority_preemptions", 0) for s in states)
    from tierserve.hardware.exec_model import make_execution_model
    pred = make_execution_model(st.model, st.gpu, 1)
    f0, l0 = _unloaded_latency(states, pred)
    ttft = np.array([s.first_token_s - s.arrival_s for s in states])
    ttlt = np.array([s.finish_s - s.arrival_s for s in states])
    if len(states):
        out["ttft_scale99"] = float(np.percentile(ttft / f0, 99))     # tightest SLO scale met by 99%
        out["ttlt_scale99"] = float(np.percentile(ttlt / l0, 99))
    if st.num_tiers > 1:
        for t in range(st.num_tiers):
            tier = [s for s in states if s.tier == t]
            tt = np.array([s.first_token_s - s.arrival_s for s in tier])
            slo = default_tier_set(st.num_tiers)[t].slo
            out[f"tier{t}.ttft.p99"] = float(np.percentile(tt, 99)) if len(tt) else math.nan
            met = [s for s in tier if (slo.ttft_s is None or s.first_token_s - s.arrival_s <= slo.ttft_s)
                   and (slo.ttlt_s is None or s.finish_s - s.arrival_s <= slo.ttlt_s)]
            out[f"tier{t}.attainment"] = len(met) / len(tier) if tier else math.nan
    if st.workload == "starvation":
        longs = [s for s in states if s.app == "long"]
        shorts = [s for s in states if s.app == "short"]
        if len(longs) >= 3:
            e2e = np.array([s.finish_s - s.arrival_s for s in longs])
            ids = np.array([s.id for s in longs], float)
            out["long_slope_s_per_req"] = float(np.polyfit(ids, e2e, 1)[0])
            out["long_e2e.p50"], out["long_e2e.p99"] = (float(x) for x in np.percentile(e2e, [50, 99]))
            out["long_preempted_s.p99"] = float(np.percentile([s.policy_data.get("preempted_s", 0.0) for s in longs], 99))
        if shorts:
            e2e = np.array([s.finish_s - s.arrival_s for s in shorts])
            out["short_e2e.p50"], out["short_e2e.p99"] = (float(x) for x in np.percentile(e2e, [50, 99]))
    out["wall_s"] = time.perf_counter() - t0
    return out


# ---- the study --------------------------------------------------------------------------------------------
def capacity_of(setup: Setup, seeds, rel_tol: float, executor: str) -> float:
    """Stable-only capacity (req/s) of `fcfs` on `setup`."""
    from tierserve.experiments.capacity import find_capacity
    from tierserve.hardware.exec_model import make_execution_model
    # Bracket from a crude service-rate estimate (mean tokens at full-batch cost), then bisect on measured runs.
    reqs = mixed_requests(setup, 1.0, 0)
    pred = make_execution_model(setup.model, setup.gpu, 1)
    per_tok = pred.iteration_time(2048, 2048 * 1024, 0, 0) / 2048
    guess = setup.num_replicas / (per_tok * np.mean([r.prompt_tokens + r.output_tokens for r in reqs]))
    cap = find_capacity(PointRunner("fcfs", (), setup), guess / 8, guess * 4, seeds, rel_tol, executor=executor)
    return cap.stable_rate


def _jobs_for(study: Study, caps: dict[str, float]) -> list[dict[str, Any]]:
    jobs = []

    def add(section, policy, params, setup, rho):
        for s in study.seeds:
            jobs.append({"section": section, "policy": policy, "params": params, "setup": asdict(setup),
                         "rate": rho * caps[setup.name], "seed": s, "rho": rho})
    if "table2" in study.sections:
        for rho in study.table2_rhos:
            for p in TABLE2_POLICIES:
                add("table2", p, {}, study.table2, rho)
    if "fig7" in study.sections:
        for rho in study.fig7_rhos:
            for p in ("fcfs", *ABLATION):
                add("fig7", p, {}, study.fig7, rho)
    if "starvation" in study.sections:
        for p in ("fcfs", "sjf", "srpt", "las", "uniboost"):
            add("starvation", p, {}, study.starvation, study.starvation_rho)
    if "sensitivity" in study.sections:
        for k in study.ks:
            add("sens_k", "uniboost", {"k": k}, study.table2, study.sens_rho)
        for d in study.deltas:
            add("sens_delta", "uniboost", {"delta": d}, study.table2, study.sens_rho)
        for c in study.chunks:
            su = replace(study.table2, token_budget=c)
            caps.setdefault(su.name, caps[study.table2.name])
            for p in ("fcfs", "uniboost"):
                add(f"sens_chunk{c}", p, {}, su, study.sens_rho)
    if "dispatch" in study.sections:
        for cp in ("random", "round_robin", "jsq"):
            su = replace(study.dispatch, cluster_policy=cp)
            caps.setdefault(su.name, caps[study.dispatch.name])
            for p in ("vllm", "uniboost"):
                add(f"dispatch_{cp}", p, {}, su, study.dispatch_rho)
    if "tiers" in study.sections:
        for p, params in (("vllm_priority", {}), ("uniboost", {"tier_mode": "strict"}),
                          ("uniboost", {"tier_mode": "offset"}), ("uniboost", {"tier_mode": "none"})):
            add("tiers", p, params, study.tiers, study.tiers_rho)
    return jobs


def _label(job: dict) -> str:
    p = job["params"]
    return job["policy"] + ("[" + ",".join(f"{k}={v}" for k, v in p.items()) + "]" if p else "")


def run_study(study: Study, outdir: str | Path, executor: str = "process") -> dict[str, Any]:
    from tierserve.experiments.sweep import run_many
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    caps: dict[str, float] = {}
    cap_exec = study.capacity_executor or executor
    setups = {"table2": study.table2, "fig7": study.fig7, "starvation": study.starvation,
              "sensitivity": study.table2, "dispatch": study.dispatch, "tiers": study.tiers}
    for sec in study.sections:
        su = setups[sec]
        if su.name not in caps:
            if sec == "tiers":      # same lengths and cluster as Table 2: its capacity
                caps[su.name] = caps.get(study.table2.name) or capacity_of(study.table2, study.seeds,
                                                                             study.capacity_rel_tol, cap_exec)
            else:
                caps[su.name] = capacity_of(su, study.seeds, study.capacity_rel_tol, cap_exec)
    cap_wall = time.perf_counter() - t0
    caps = dict(caps)
    jobs = _jobs_for(study, caps)
    meta_keys = ("section", "rho")
    results = run_many(run_point, [{k: v for k, v in j.items() if k not in meta_keys} for j in jobs],
                       executor=executor, progress=False)
    rows = []
    for j, r in zip(jobs, results):
        rows.append({**r, "section": j["section"], "rho": j["rho"], "label": _label(j)})
    (out / "uniboost_runs.json").write_text(json.dumps(rows, indent=1, default=float) + "\n")
    md = report(study, rows, caps)
    md += f"\n_Capacity searches {cap_wall:.0f} s; {len(jobs)} runs; total wall {time.perf_counter() - t0:.0f} s._\n"
    (out / "uniboost_report.md").write_text(md)
    (out / "uniboost_meta.json").write_text(json.dumps({"capacities_rps": caps, "study": asdict(study)}, indent=1,
                                                       default=str) + "\n")
    return {"markdown": md, "rows": rows, "capacities": caps}


# ---- report -------------------------------------------------------------------------------------------------
def group(rows, section, label=None, rho=None):
    return [r for r in rows if r["section"] == section and (label is None or r["label"] == label)
            and (rho is None or r["rho"] == rho)]


def ci(rows, metric) -> str:
    iv = mean_ci95([r.get(metric, math.nan) for r in rows])
    return f"{iv.mean:.3g} ± {iv.half_width:.2g}" if math.isfinite(iv.half_width) else f"{iv.mean:.3g}"


def stable_share(rows) -> str:
    return f"{sum(r['stable'] for r in rows)}/{len(rows)}"


def pct_vs(rows, base, metric, higher_better=False) -> str:
    """Mean over seeds of the per-seed % improvement vs `base` (seed 001's sign: positive = better), ± 95%."""
    by_seed = {r["seed"]: r[metric] for r in base}
    vals = []
    for r in rows:
        b = by_seed.get(r["seed"])
        if b is not None and b > 0 and math.isfinite(r[metric]):
            vals.append(100.0 * ((r[metric] - b) if higher_better else (b - r[metric])) / b)
    iv = mean_ci95(vals)
    return f"{iv.mean:+.0f}% ± {iv.half_width:.0f}" if math.isfinite(iv.half_width) else f"{iv.mean:+.0f}%"


def report(study: Study, rows, caps) -> str:
    lines = ["# UniBoost (seed 001) on tierserve", "",
             f"Seeds {list(study.seeds)}; steady state = ⌊0.1·n⌋ first and last arrivals dropped; ± = 95% interval "
             "over seeds; `stable` = seeds whose queue-trend verdict is stable. ρ = rate / stable-only capacity "
             "of `fcfs` on the same setup.", "",
             "Capacities (fcfs, stable-only): " + ", ".join(f"{k} {v:.3g} req/s" for k, v in caps.items()), ""]
    for rho in study.table2_rhos if "table2" in study.sections else ():
        base = group(rows, "table2", "srpt", rho)
        lines += [f"## Table 2 — % change vs srpt (TRAIL+), ρ = {rho} ({rho * caps[study.table2.name]:.3g} req/s), "
                  f"{study.table2.model}, {study.table2.num_requests} requests, 70% reasoning + 30% Azure conv", "",
                  "| policy | stable | " + " | ".join(METRICS) + " |", "|" + "---|" * (len(METRICS) + 2)]
        for p in TABLE2_POLICIES:
            g = group(rows, "table2", p, rho)
            cells = [pct_vs(g, base, m, higher_better=(m == "tokens_per_s")) for m in METRICS]
            lines.append(f"| {p} | {stable_share(g)} | " + " | ".join(cells) + " |")
        lines += ["", "Absolute values (s; tokens/s):", "",
                  "| policy | ttft.p95 | ttft.p99 | ttlt.p99 | tpot.p99 | tokens_per_s | preemptions (forced) |",
                  "|---|---|---|---|---|---|---|"]
        for p in TABLE2_POLICIES:
            g = group(rows, "table2", p, rho)
            lines.append(f"| {p} | {ci(g, 'ttft.p95')} | {ci(g, 'ttft.p99')} | {ci(g, 'ttlt.p99')} | "
                         f"{ci(g, 'tpot.p99')} | {ci(g, 'tokens_per_s')} | {ci(g, 'preemptions')} "
                         f"({ci(g, 'forced_preemptions')}) |")
        fc = group(rows, "table2", "fcfs", rho)
        ub = group(rows, "table2", "uniboost", rho)
        lines += ["", f"Headline at ρ = {rho}: UniBoost vs srpt — P99 TTLT {pct_vs(ub, base, 'ttlt.p99')} "
                  f"(seed: +{SEED_HEADLINE['uniboost.ttlt.p99']:.0f}%), P95 TTFT {pct_vs(ub, base, 'ttft.p95')} "
                  f"(seed: +{SEED_HEADLINE['uniboost.ttft.p95']:.0f}%); vs fcfs — P99 TTLT "
                  f"{pct_vs(ub, fc, 'ttlt.p99')}, P95 TTFT {pct_vs(ub, fc, 'ttft.p95')}.", ""]
        lines += [f"### §4.4 — tightest SLO scale met by 99% (P99 of latency / unloaded latency), ρ = {rho}", "",
                  "| policy | TTFT scale | TTLT scale | TTFT gain of uniboost | TTLT gain of uniboost |",
                  "|---|---|---|---|---|"]
        for p in TABLE2_POLICIES:
            g = group(rows, "table2", p, rho)
            gain_f = np.mean([r["ttft_scale99"] for r in g]) / np.mean([r["ttft_scale99"] for r in ub])
            gain_l = np.mean([r["ttlt_scale99"] for r in g]) / np.mean([r["ttlt_scale99"] for r in ub])
            lines.append(f"| {p} | {ci(g, 'ttft_scale99')} | {ci(g, 'ttlt_scale99')} | {gain_f:.2f}× | {gain_l:.2f}× |")
        lines += ["", f"(seed: {SEED_SLO_GAIN[0]}–{SEED_SLO_GAIN[1]}× tighter TTFT SLO at 99% with UniBoost)", ""]
    if "fig7" in study.sections:
        lines += [f"## Fig. 7 — {study.fig7.model} TP1, P90/P99 TTLT (s) vs ρ", "",
                  "| policy | " + " | ".join(f"ρ={r} p90 / p99 (stable)" for r in study.fig7_rhos) + " |",
                  "|" + "---|" * (len(study.fig7_rhos) + 1)]
        for p in ("fcfs", *ABLATION):
            cells = []
            for rho in study.fig7_rhos:
                g = group(rows, "fig7", p, rho)
                cells.append(f"{ci(g, 'ttlt.p90') if 'ttlt.p90' in g[0] else ci(g, 'ttlt.p95')} / {ci(g, 'ttlt.p99')} "
                             f"({stable_share(g)})")
            lines.append(f"| {p} | " + " | ".join(cells) + " |")
        lines += ["", f"(seed: {SEED_FIG7})", ""]
    if "starvation" in study.sections:
        su = study.starvation
        lines += [f"## A.3 — starvation: 90% short (125/100) + 10% long (2k/6k), ρ = {study.starvation_rho}, "
                  f"{su.num_replicas} replicas, {su.cluster_policy} dispatch", "",
                  "| policy | stable | short E2E p50 / p99 (s) | long E2E p50 / p99 (s) | long slope (s/req) | "
                  "long preempted p99 (s) |", "|---|---|---|---|---|---|"]
        for p in ("fcfs", "sjf", "srpt", "las", "uniboost"):
            g = group(rows, "starvation", p)
            lines.append(f"| {p} | {stable_share(g)} | {ci(g, 'short_e2e.p50')} / {ci(g, 'short_e2e.p99')} | "
                         f"{ci(g, 'long_e2e.p50')} / {ci(g, 'long_e2e.p99')} | {ci(g, 'long_slope_s_per_req')} | "
                         f"{ci(g, 'long_preempted_s.p99')} |")
        lines.append("")
    if "sensitivity" in study.sections:
        lines += [f"## Tables 6–8 — sensitivity of uniboost at ρ = {study.sens_rho} (Table 2 setup)", "",
                  "| variant | stable | ttft.p99 | ttlt.p99 | tpot.p99 | preemptions |", "|---|---|---|---|---|---|"]
        for sec in sorted({r["section"] for r in rows if r["section"].startswith("sens_")}):
            for lab in sorted({r["label"] for r in rows if r["section"] == sec}):
                g = group(rows, sec, lab)
                lines.append(f"| {sec} {lab} | {stable_share(g)} | {ci(g, 'ttft.p99')} | {ci(g, 'ttlt.p99')} | "
                             f"{ci(g, 'tpot.p99')} | {ci(g, 'preemptions')} |")
        lines.append("")
    if "dispatch" in study.sections:
        lines += [f"## Table 9 — uniboost vs vllm under dispatch policies, {study.dispatch.num_replicas} replicas, "
                  f"ρ = {study.dispatch_rho}", "", "| dispatch | stable (vllm / uniboost) | TTFT p99 | TBT (TPOT) p99 | "
                  "E2E p99 | E2E p50 |", "|---|---|---|---|---|---|"]
        for cp in ("random", "round_robin", "jsq"):
            v, u = group(rows, f"dispatch_{cp}", "vllm"), group(rows, f"dispatch_{cp}", "uniboost")
            lines.append(f"| {cp} | {stable_share(v)} / {stable_share(u)} | {pct_vs(u, v, 'ttft.p99')} | "
                         f"{pct_vs(u, v, 'tpot.p99')} | {pct_vs(u, v, 'ttlt.p99')} | {pct_vs(u, v, 'ttlt.p50')} |")
        lines.append("")
    if "tiers" in study.sections:
        k = study.tiers.num_tiers
        lines += [f"## Tiers — {k} tiers (enterprise mix, default SLOs), ρ = {study.tiers_rho}", "",
                  "| policy | stable | " + " | ".join(f"tier{t} TTFT p99 / attainment" for t in range(k)) + " |",
                  "|" + "---|" * (k + 2)]
        for lab in sorted({r["label"] for r in rows if r["section"] == "tiers"}):
            g = group(rows, "tiers", lab)
            lines.append(f"| {lab} | {stable_share(g)} | " + " | ".join(
                f"{ci(g, f'tier{t}.ttft.p99')} / {ci(g, f'tier{t}.attainment')}" for t in range(k)) + " |")
        lines.append("")
    return "\n".join(lines)
