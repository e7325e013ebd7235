"""Seed 000's K sweep: K-tier Llumnix vs INFaaS+vLLM over K = 1…10 × {uniform, gaussian, enterprise}.

Every system runs on the same replica executor, KV accounting, batch limits and execution-time model; only
the cluster and replica policies differ. Systems:
  baseline  infaas + vllm (cost-based dispatch, FCFS, no migration)      — the speedup denominator
  vllm / orca / sarathi + round_robin                                     — local-scheduler references
  llumnix   two-level Llumnix (tier 0 high, artifact's flat headroom) + llumlet, on the K = 2 workload
  llumnix_k K tiers, H_p = M·0.2·e^{−p ln 3}, + llumlet (K = 1: no headroom: migration + dispatch only)
  adaptive  llumnix_k_adaptive (SLO-driven budgets + promotion) + llumlet
Speedup of a metric = baseline value / system value (higher is better).
Cost-per-latency gain = 1 − (C·L)_system / (C·L)_baseline, C = GPU-seconds = replicas·TP·makespan,
L = mean E2E latency of finished requests (the product falls when either cost or latency does).
"""
from __future__ import annotations

import csv
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.experiments.sweep import run_many

MIXES = ("uniform", "gaussian", "enterprise")
COST_FORMULA = ("cost/latency gain = 1 − (C_sys·L_sys)/(C_base·L_base), C = replicas·TP·makespan (GPU-s), "
                "L = mean E2E of finished requests")
# Seed 000's table (uniform tiers, speedup over INFaaS+vLLM): (scale, K) → P99/mean TTFT, P99/mean E2E, cost/lat.
SEED_TABLE = {
    (10000, 3): (4.79, 8.23, 2.87, 2.80, 0.65), (10000, 4): (4.87, 8.23, 3.13, 2.88, 0.68),
    (10000, 5): (4.16, 8.11, 3.04, 2.92, 0.67), (15000, 3): (2.98, 5.00, 1.87, 1.97, 0.46),
    (15000, 4): (3.16, 5.16, 2.12, 2.08, 0.53), (15000, 5): (2.72, 5.07, 2.04, 2.12, 0.51),
}


@dataclass(frozen=True)
class KTierSetup:
    """What the sweep runs. `rate_per_replica` sets the load (Poisson req/s per replica)."""

    ks: tuple[int, ...] = tuple(range(1, 11))
    mixes: tuple[str, ...] = MIXES
    scales: tuple[int, ...] = (10000, 15000)
    num_replicas: int = 8
    model: str = "Llama-2-7B"
    gpu: str = "A100-80GB"
    rate_per_replica: float = 5.0        # INFaaS+vLLM serves ~4.4 req/s per replica here: offered/served ≈ 1.14
    max_total_tokens: int = 4096
    seed: int = 0
    time_limit_factor: float = 4.0      # censor at this × the arrival span
    adaptive: bool = True
    references: tuple[str, ...] = ("vllm", "orca", "sarathi")

    @classmethod
    def quick(cls) -> KTierSetup:
        return cls(ks=(1, 2, 3, 4, 6), scales=(1500,), num_replicas=4)


@dataclass
class RunRow:
    system: str
    mix: str
    scale: int
    k: int
    local_policy: str
    cluster_policy: str
    finished: int
    censored: int
    rejected: int
    ttft_mean: float
    ttft_p99: float
    e2e_mean: float
    e2e_p99: float
    makespan_s: float
    gpu_s: float
    busy_fraction: float
    preemptions: int
    migrations_committed: int = 0
    migrations_aborted: int = 0
    migration_downtime_p99_s: float = 0.0
    tier_ttft_p50: list[float] = field(default_factory=list)
    tier_ttft_p99: list[float] = field(default_factory=list)
    tier_slo_attainment: list[float] = field(default_factory=list)
    ttft: list[float] = field(default_factory=list)        # finished requests, for plots
    tier: list[int] = field(default_factory=list)


def workload(setup: KTierSetup, mix: str, scale: int, k: int):
    from tierserve.workload import WorkloadConfig, build_requests
    from tierserve.workload.config import FitLengthConfig, PoissonConfig, TiersConfig
    cfg = WorkloadConfig(num_requests=scale, seed=setup.seed,
                         arrivals=PoissonConfig(rate=setup.rate_per_replica * setup.num_replicas),
                         lengths=FitLengthConfig(dataset="azure2023_conv", max_total_tokens=setup.max_total_tokens),
                         tiers=TiersConfig(num_tiers=k, mix=mix))
    return build_requests(cfg)


def run_one(system: str, local_policy: str, cluster_policy: str, params: dict[str, Any], mix: str, scale: int,
            k: int, setup: dict[str, Any], local_params: dict[str, Any] | None = None) -> RunRow:
    """One simulation → one row (a top-level function so a process pool or Ray can run it)."""
    from tierserve.metrics import RequestTable
    from tierserve.sim import ClusterConfig, ReplicaConfig, simulate
    su = KTierSetup(**setup)
    reqs = workload(su, mix, scale, k)
    span = reqs[-1].arrival_s
    cfg = ClusterConfig(num_replicas=su.num_replicas, replica=ReplicaConfig(model=su.model, gpu=su.gpu),
                        local_policy=local_policy, local_policy_params=local_params or {},
                        cluster_policy=cluster_policy, cluster_policy_params=params,
                        time_limit_s=span * su.time_limit_factor)
    res = simulate(cfg, reqs, num_tiers=k, seed=su.seed)
    tab = RequestTable.from_states(res.states, res.reasons)
    fin = tab.finished
    ttft, e2e = tab.ttft_s[fin], tab.ttlt_s[fin]
    tiers = tab.tier
    meets = tab.meets_slo

    def q(x: np.ndarray, p: float) -> float:
        return float(np.percentile(x, p)) if x.size else math.nan

    st = res.stats
    return RunRow(
        system=system, mix=mix, scale=scale, k=k, local_policy=local_policy, cluster_policy=cluster_policy,
        finished=int(fin.sum()), censored=int(tab.censored.sum()), rejected=int(tab.rejected.sum()),
        ttft_mean=float(ttft.mean()) if ttft.size else math.nan, ttft_p99=q(ttft, 99),
        e2e_mean=float(e2e.mean()) if e2e.size else math.nan, e2e_p99=q(e2e, 99),
        makespan_s=res.duration_s, gpu_s=res.duration_s * su.num_replicas * cfg.replica.tp,
        busy_fraction=float(st.get("busy_fraction", math.nan)), preemptions=int(st.get("preemptions", 0)),
        migrations_committed=int(st.get("migrations_live_committed", 0) + st.get("migrations_queued", 0)),
        migrations_aborted=int(st.get("migrations_live_aborted", 0)),
        migration_downtime_p99_s=float(st.get("migration_downtime_p99_s", 0.0)),
        tier_ttft_p50=[q(tab.ttft_s[fin & (tiers == t)], 50) for t in range(k)],
        tier_ttft_p99=[q(tab.ttft_s[fin & (tiers == t)], 99) for t in range(k)],
        tier_slo_attainment=[float(meets[tiers == t].mean()) if (tiers == t).any() else math.nan for t in range(k)],
        ttft=ttft.tolist(), tier=tiers[fin].tolist())


def jobs(setup: KTierSetup) -> list[dict[str, Any]]:
    s = asdict(setup)
    out = []
    for mix in setup.mixes:
        for scale in setup.scales:
            def add(system, local, cluster, params, k, local_params=None):
                out.append(dict(system=system, local_policy=local, cluster_policy=cluster, params=params,
                                mix=mix, scale=scale, k=k, setup=s, local_params=local_params))
            add("baseline", "vllm", "infaas", {}, 3)
            for ref in setup.references:
                add(ref, ref, "round_robin", {}, 3)
            add("llumnix", "llumlet", "llumnix", {"num_tiers": 2}, 2)
            for k in setup.ks:
                add("llumnix_k", "llumlet", "llumnix_k", {"num_tiers": k}, k)
                if setup.adaptive and k >= 2:
                    # Promotion acts in the global queue (cluster policy) and in each replica's queue (llumlet).
                    add("adaptive", "llumlet", "llumnix_k_adaptive", {"num_tiers": k}, k,
                        {"promote_after_s": 5.0, "promote_floor": 1})
    return out


def speedups(row: RunRow, base: RunRow) -> dict[str, float]:
    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else math.nan
    cl_sys = row.gpu_s * row.e2e_mean
    cl_base = base.gpu_s * base.e2e_mean
    return {"prefill_p99_x": ratio(base.ttft_p99, row.ttft_p99), "prefill_mean_x": ratio(base.ttft_mean, row.ttft_mean),
            "e2e_p99_x": ratio(base.e2e_p99, row.e2e_p99), "e2e_mean_x": ratio(base.e2e_mean, row.e2e_mean),
            "cost_latency_gain": 1.0 - cl_sys / cl_base if cl_base > 0 else math.nan}


def table_rows(rows: list[RunRow]) -> list[dict[str, Any]]:
    """The seed's table: each system row's speedups over the baseline of the same mix and scale."""
    base = {(r.mix, r.scale): r for r in rows if r.system == "baseline"}
    out = []
    for r in rows:
        b = base[(r.mix, r.scale)]
        sp = speedups(r, b)
        seed = SEED_TABLE.get((r.scale, r.k)) if r.system == "llumnix_k" and r.mix == "uniform" else None
        out.append({"mix": r.mix, "scale": r.scale, "system": r.system, "K": r.k, **sp,
                    "seed_prefill_p99_x": seed[0] if seed else None, "seed_prefill_mean_x": seed[1] if seed else None,
                    "seed_e2e_p99_x": seed[2] if seed else None, "seed_e2e_mean_x": seed[3] if seed else None,
                    "seed_cost_latency_gain": seed[4] if seed else None,
                    "ttft_mean_s": r.ttft_mean, "ttft_p99_s": r.ttft_p99, "e2e_mean_s": r.e2e_mean, "e2e_p99_s": r.e2e_p99,
                    "tier0_ttft_p50_s": r.tier_ttft_p50[0] if r.tier_ttft_p50 else math.nan,
                    "lowest_tier_ttft_p50_s": r.tier_ttft_p50[-1] if r.tier_ttft_p50 else math.nan,
                    "finished": r.finished, "censored": r.censored, "rejected": r.rejected,
                    "migrations": r.migrations_committed, "migration_aborts": r.migrations_aborted,
                    "downtime_p99_ms": r.migration_downtime_p99_s * 1e3, "preemptions": r.preemptions,
                    "busy_fraction": r.busy_fraction})
    return out


def best_k(table: list[dict[str, Any]], system: str = "llumnix_k") -> dict[tuple[str, int], int]:
    """Per (mix, scale), the K with the highest geometric mean of the four speedups."""
    best: dict[tuple[str, int], tuple[float, int]] = {}
    for t in table:
        if t["system"] != system:
            continue
        xs = [t[c] for c in ("prefill_p99_x", "prefill_mean_x", "e2e_p99_x", "e2e_mean_x")]
        if any(not (x > 0) for x in xs):
            continue
        g = float(np.exp(np.mean(np.log(xs))))
        key = (t["mix"], t["scale"])
        if key not in best or g > best[key][0]:
            best[key] = (g, t["K"])
    return {k: v[1] for k, v in best.items()}


def _fmt(x: Any) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.2f}"
    return str(x)


def markdown(table: list[dict[str, Any]], setup: KTierSetup, load_note: str) -> str:
    lines = [f"# K-tier Llumnix sweep (seed 000)", "", load_note, "", f"Speedup = INFaaS+vLLM value / system value. {COST_FORMULA}.",
             "Seed columns: the seed's reported numbers (uniform tiers, 10K/15K requests, K = 3–5 only).", ""]
    cols = ["mix", "scale", "system", "K", "prefill_p99_x", "seed_prefill_p99_x", "prefill_mean_x", "seed_prefill_mean_x",
            "e2e_p99_x", "seed_e2e_p99_x", "e2e_mean_x", "seed_e2e_mean_x", "cost_latency_gain", "seed_cost_latency_gain",
            "tier0_ttft_p50_s", "lowest_tier_ttft_p50_s", "finished", "censored", "migrations", "downtime_p99_ms"]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "---|" * len(cols))
    for t in table:
        lines.append("| " + " | ".join(_fmt(t[c]) for c in cols) + " |")
    lines.append("")
    for (mix, scale), k in sorted(best_k(table).items()):
        lines.append(f"- best K for llumnix_k ({mix}, {scale} requests): **{k}** (geometric mean of the four speedups)")
    for (mix, scale), k in sorted(best_k(table, "adaptive").items()):
        lines.append(f"- best K for adaptive ({mix}, {scale} requests): **{k}**")
    return "\n".join(lines) + "\n"


def plots(rows: list[RunRow], out: Path) -> list[Path]:
    from tierserve.report.plots import _pyplot, _save, plot_metric_vs
    paths = []
    plt = _pyplot()
    for r in rows:
        if r.system != "llumnix_k" or r.mix != "uniform" or r.k not in (1, 3, 5):
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        ttft, tier = np.asarray(r.ttft), np.asarray(r.tier)
        for t in range(r.k):
            x = np.sort(ttft[tier == t])
            if x.size:
                ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=f"tier{t} (p50 {np.median(x):.2f} s)")
        ax.set_xscale("log")
        ax.set_xlabel("TTFT (s)")
        ax.set_ylabel("fraction of finished requests")
        ax.set_title(f"llumnix_k, K = {r.k}, uniform, {r.scale} requests")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        paths.append(_save(fig, out / f"ttft_by_tier_uniform_K{r.k}_{r.scale}.png"))
    for mix in sorted({r.mix for r in rows}):
        for scale in sorted({r.scale for r in rows}):
            sel = sorted((r for r in rows if r.system == "llumnix_k" and r.mix == mix and r.scale == scale), key=lambda r: r.k)
            if not sel:
                continue
            ks = [r.k for r in sel]
            series = {"tier 0 p50": [r.tier_ttft_p50[0] for r in sel],
                      "lowest tier p50": [r.tier_ttft_p50[-1] for r in sel],
                      "all p99": [r.ttft_p99 for r in sel]}
            paths.append(plot_metric_vs(ks, series, out / f"ttft_vs_k_{mix}_{scale}.png", "K (tiers)", "TTFT (s)",
                                        title=f"llumnix_k TTFT vs K ({mix}, {scale})", logy=True))
    return paths


def run_ktier(setup: KTierSetup, out: Path, executor: str = "process", progress: bool = True) -> dict[str, Any]:
    """Run the sweep and write runs CSV, table CSV + Markdown and PNG plots under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    rows: list[RunRow] = run_many(run_one, jobs(setup), executor=executor, progress=progress, description="ktier")
    base = [r for r in rows if r.system == "baseline"]
    offered = setup.rate_per_replica * setup.num_replicas
    served = [r.finished / r.makespan_s for r in base]
    load_note = (f"Load: Poisson {offered:.1f} req/s on {setup.num_replicas} × {setup.model}/{setup.gpu} replicas "
                 f"({setup.rate_per_replica} req/s per replica; Azure-2023 conversation lengths clipped to "
                 f"{setup.max_total_tokens} tokens). INFaaS+vLLM served {min(served):.1f}–{max(served):.1f} req/s with "
                 f"busy fraction {min(r.busy_fraction for r in base):.2f}–{max(r.busy_fraction for r in base):.2f}: "
                 f"offered/served = {offered / max(served):.2f}–{offered / min(served):.2f} "
                 f"({'saturated cluster' if offered / max(served) > 1.0 else 'below saturation'}). "
                 f"Runs stop at {setup.time_limit_factor}× the arrival span; unfinished requests are reported as censored.")
    table = table_rows(rows)
    with open(out / "ktier_runs.csv", "w", newline="") as f:
        keys = [k for k in asdict(rows[0]) if k not in ("ttft", "tier")]
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        for r in rows:
            d = asdict(r)
            w.writerow({k: d[k] for k in keys})
    with open(out / "ktier_table.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(table[0]))
        w.writeheader()
        w.writerows(table)
    md = markdown(table, setup, load_note)
    (out / "ktier_table.md").write_text(md)
    pngs = plots(rows, out)
    return {"rows": rows, "table": table, "markdown": md, "load_note": load_note, "plots": pngs,
            "best_k": best_k(table), "best_k_adaptive": best_k(table, "adaptive")}
