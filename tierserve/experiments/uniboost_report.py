"""The Markdown report and γ plot of the UniBoost study (`tierserve.experiments.uniboost`), and `run_study`: the study
run whole (its runs, then this report; here so that the study module never imports its report)."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from tierserve.experiments.uniboost import CAPACITY_GROWTH, Study, _table2_policies, point_most
from tierserve.experiments.uniboost_runs import (
    ABLATION, METRICS, SEED_FIG7, SEED_HEADLINE, SEED_SLO_GAIN,
)
from tierserve.metrics.stability import mean_ci95
import json
import time
from typing import Any
from dataclasses import asdict
from tierserve.experiments.uniboost_runs import run_point
from tierserve.experiments.uniboost import _capacity_setups, _jobs_for, _label, _point_key, _same_setup, _write_json, capacities, saturation_capacity

# ---- report -------------------------------------------------------------------------------------------------
def group(rows, section, label=None, rho=None, setup=None):
    return [r for r in rows if r["section"] == section and (label is None or r["label"] == label)
            and (rho is None or r["rho"] == rho) and (setup is None or r["setup"] == setup)]


def ci(rows, metric) -> str:
    vals = [r.get(metric, math.nan) for r in rows]
    vals = [v for v in vals if v is not None]
    if not vals:
        return "—"
    iv = mean_ci95(vals)
    return f"{iv.mean:.3g} ± {iv.half_width:.2g}" if math.isfinite(iv.half_width) else f"{iv.mean:.3g}"


def stable_share(rows) -> str:
    return f"{sum(r['stable'] for r in rows)}/{len(rows)}" if rows else "—"


def pct_vs(rows, base, metric, higher_better=False) -> str:
    """Mean over seeds of the per-seed % improvement vs `base` (seed 001's sign: positive = better), ± 95%."""
    by_seed = {r["seed"]: r.get(metric) for r in base}
    vals = []
    for r in rows:
        b, v = by_seed.get(r["seed"]), r.get(metric)
        if b is not None and v is not None and b > 0 and math.isfinite(v):
            vals.append(100.0 * ((v - b) if higher_better else (b - v)) / b)
    if not vals:
        return "—"
    iv = mean_ci95(vals)
    return f"{iv.mean:+.0f}% ± {iv.half_width:.0f}" if math.isfinite(iv.half_width) else f"{iv.mean:+.0f}%"


def per_seed_pct(rows, base, metric) -> str:
    by_seed = {r["seed"]: r.get(metric) for r in base}
    out = []
    for r in sorted(rows, key=lambda r: r["seed"]):
        b, v = by_seed.get(r["seed"]), r.get(metric)
        out.append(f"{100.0 * (b - v) / b:+.0f}%" if b and v is not None and math.isfinite(v) else "—")
    return ", ".join(out)


def per_seed_val(rows, metric) -> str:
    return ", ".join(f"{r.get(metric, math.nan):.0f}" for r in sorted(rows, key=lambda r: r["seed"]))


def gamma_plot(rows, study: Study, path: Path) -> Path | None:
    """γ over time (log scale) for each γ policy, one line per seed, with the offered load (rate profile) and
    γ-Ada's load estimate on a second axis."""
    g = [r for r in rows if r["section"] == "gamma" and r.get("gamma_trace")]
    if not g:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]})
    colours = {"uniboost": "tab:orange", "uniboost[gamma_rule=nudge]": "tab:purple", "uniboost_memguard": "tab:green"}
    for r in sorted(g, key=lambda r: (r["label"], r["seed"])):
        tr = np.asarray(r["gamma_trace"], float)
        ax.plot(tr[:, 0], tr[:, 1], color=colours.get(r["label"], "k"), lw=1, alpha=0.8,
                label=r["label"] if r["seed"] == study.seeds[0] else None)
        if r["label"] == "uniboost":
            ax2.plot(tr[:, 0], tr[:, 2], color="tab:orange", lw=1, alpha=0.6,
                     label="γ-Ada's estimate λ·E[S]" if r["seed"] == study.seeds[0] else None)
    prof = study.gamma.rate_profile or (1.0,)
    r0 = next(r for r in g if r["seed"] == study.seeds[0])
    starts = list(r0["segment_starts_s"]) + [max(t[0] for t in r0["gamma_trace"])]
    for j, m in enumerate(prof):
        ax2.hlines(m, starts[j], starts[j + 1], color="k", lw=2, label="offered ρ (× fcfs capacity), seed 0"
                   if j == 0 else None)
        ax.axvline(starts[j], color="grey", lw=0.5, ls=":")
    ax.set_yscale("log")
    ax.set_ylabel("γ (1/s)")
    ax.legend(fontsize=8)
    ax.set_title(f"γ over time, {study.gamma.model}, {study.gamma.num_requests} requests, seeds {list(study.seeds)}")
    ax2.set_ylabel("load")
    ax2.set_xlabel("simulated time (s)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def pct_paired(rows, base, metric) -> str:
    """Like `pct_vs`, pairing runs by (seed, replica); the per-pair changes are averaged within a seed first, so
    the interval is over seeds (replicas of one seed share a trace)."""
    by = {(r["seed"], r.get("replica", 0)): r.get(metric) for r in base}
    per_seed: dict[int, list[float]] = {}
    for r in rows:
        b, v = by.get((r["seed"], r.get("replica", 0))), r.get(metric)
        if b is not None and v is not None and b > 0 and math.isfinite(v):
            per_seed.setdefault(r["seed"], []).append(100.0 * (b - v) / b)
    if not per_seed:
        return "—"
    iv = mean_ci95([float(np.mean(v)) for v in per_seed.values()])
    return f"{iv.mean:+.0f}% ± {iv.half_width:.0f}" if math.isfinite(iv.half_width) else f"{iv.mean:+.0f}%"


def _ratio(a_rows, b_rows, metric) -> str:
    a = [r[metric] for r in a_rows if r.get(metric) is not None]
    b = [r[metric] for r in b_rows if r.get(metric) is not None]
    return f"{np.mean(a) / np.mean(b):.2f}×" if a and b and np.mean(b) > 0 else "—"


def _mode_labels(study: Study) -> list[str]:
    return [f"{p}[preempt_mode=recompute]" for p in study.preempt_rows]


def run_lengths_text(study: Study, section: str, setup) -> str:
    """How a section's points chose their run lengths, for its heading."""
    most = point_most(study, section, setup)
    if most is None:
        return f"{setup.num_requests} requests"
    return f"runs of {setup.num_requests}–{most} requests (doubled while the work verdict is undecided)"


def run_lengths_table(rows, section: str, labels, rhos) -> list[str]:
    """The run length each seed's verdict chose (requests, by seed) and the verdicts, per label and ρ."""
    lines = ["Run lengths the verdict chose (requests per seed, in seed order) and the verdicts "
             "(s = stable, u = unstable, ? = still undecided at the bound):", "",
             "| policy | " + " | ".join(f"ρ={r}" for r in rhos) + " |", "|" + "---|" * (len(rhos) + 1)]
    mark = {"stable": "s", "unstable": "u", "undecided": "?"}
    for p in labels:
        cells = []
        for rho in rhos:
            g = sorted(group(rows, section, p, rho), key=lambda r: r["seed"])
            cells.append(", ".join(f"{r.get('lengths', [r['requests']])[-1]} {mark.get(r['verdict'], r['verdict'])}"
                                   for r in g) if g else "—")
        lines.append(f"| {p} | " + " | ".join(cells) + " |")
    return lines + [""]


def report(study: Study, rows, caps, derived=None, saturation=None) -> str:
    derived = derived or {}
    saturation = saturation or {}
    lines = ["# UniBoost (seed 001) on tierserve", "",
             f"Seeds {list(study.seeds)}; steady state = arrivals from the end of the warm-up the work verdict "
             "found; ± = 95% interval over seeds; `stable` = seeds whose work verdict (unfinished prefill + "
             "decode tokens do not grow with run length) is stable. ρ = rate / stable-only capacity of `fcfs` "
             f"on the same setup (probes lengthened while undecided, up to {CAPACITY_GROWTH}× the setup's "
             "requests). "
             "Improvements use seed 001's sign: positive = better.", "",
             f"One change at a time: every stack preempts by **{study.preempt_mode}** (UniBoost with MemGuard "
             "picks the cheaper of swap and recompute per victim, so the baselines are given swap too); the rows "
             + ", ".join(f"`{m}`" for m in _mode_labels(study)) + " differ from their policy's row in the "
             "preemption mode alone. Batch shape, token budget and predictor are the same for every row.", "",
             "Capacities (fcfs, stable-only): " + ", ".join(
                 f"{k} {v:.4g} req/s" + (" (derived: " + derived[k] + ")" if k in derived else "")
                 for k, v in caps.items() if k in derived or k in (study.table2.name, study.fig7.name,
                                                                    study.starvation.name)), ""]
    sec_rows = lambda s: [r for r in rows if r["section"] == s]  # noqa: E731
    for rho in study.table2_rhos if sec_rows("table2") else ():
        base = group(rows, "table2", "srpt", rho)
        lines += [f"## Table 2 — % change vs srpt (TRAIL+), ρ = {rho} ({rho * caps[study.table2.name]:.3g} req/s), "
                  f"{study.table2.model}, {study.table2.num_requests} requests, 70% reasoning + 30% Azure conv", "",
                  "| policy | stable | " + " | ".join(METRICS) + " |", "|" + "---|" * (len(METRICS) + 2)]
        labels = list(_table2_policies(study, rho)) + (_mode_labels(study) if rho == study.table2_main_rho else [])
        for p in labels:
            g = group(rows, "table2", p, rho)
            cells = [pct_vs(g, base, m, higher_better=(m == "tokens_per_s")) for m in METRICS]
            lines.append(f"| {p} | {stable_share(g)} | " + " | ".join(cells) + " |")
        lines += ["", "Absolute values (s; tokens/s):", "",
                  "| policy | ttft.p95 | ttft.p99 | ttlt.p50 | ttlt.p99 | tpot.p99 | tokens_per_s | "
                  "preemptions (forced) | swaps |", "|---|---|---|---|---|---|---|---|---|"]
        for p in labels:
            g = group(rows, "table2", p, rho)
            lines.append(f"| {p} | {ci(g, 'ttft.p95')} | {ci(g, 'ttft.p99')} | {ci(g, 'ttlt.p50')} | "
                         f"{ci(g, 'ttlt.p99')} | {ci(g, 'tpot.p99')} | {ci(g, 'tokens_per_s')} | "
                         f"{ci(g, 'preemptions')} ({ci(g, 'forced_preemptions')}) | {ci(g, 'swaps')} |")
        fc = group(rows, "table2", "fcfs", rho)
        ub = group(rows, "table2", "uniboost", rho)
        lines += ["", f"Headline at ρ = {rho}: UniBoost vs srpt — P99 TTLT {pct_vs(ub, base, 'ttlt.p99')} "
                  f"(seed: +{SEED_HEADLINE['uniboost.ttlt.p99']:.0f}%), P95 TTFT {pct_vs(ub, base, 'ttft.p95')} "
                  f"(seed: +{SEED_HEADLINE['uniboost.ttft.p95']:.0f}%); vs fcfs — P99 TTLT "
                  f"{pct_vs(ub, fc, 'ttlt.p99')}, P95 TTFT {pct_vs(ub, fc, 'ttft.p95')}.", "",
                  f"Per seed {[r['seed'] for r in sorted(ub, key=lambda r: r['seed'])]}: vs srpt P99 TTLT "
                  f"{per_seed_pct(ub, base, 'ttlt.p99')}, P95 TTFT {per_seed_pct(ub, base, 'ttft.p95')}; vs fcfs "
                  f"P99 TTLT {per_seed_pct(ub, fc, 'ttlt.p99')}, P95 TTFT {per_seed_pct(ub, fc, 'ttft.p95')}; "
                  f"preemptions (uniboost / srpt / fcfs) {per_seed_val(ub, 'preemptions')} / "
                  f"{per_seed_val(base, 'preemptions')} / {per_seed_val(fc, 'preemptions')}.", ""]
        lines += [f"### §4.4 — tightest SLO scale met by 99% (P99 of latency / unloaded latency), ρ = {rho}", "",
                  "| policy | TTFT scale | TTLT scale | TTFT gain of uniboost | TTLT gain of uniboost |",
                  "|---|---|---|---|---|"]
        for p in _table2_policies(study, rho):
            g = group(rows, "table2", p, rho)
            lines.append(f"| {p} | {ci(g, 'ttft_scale99')} | {ci(g, 'ttlt_scale99')} | "
                         f"{_ratio(g, ub, 'ttft_scale99')} | {_ratio(g, ub, 'ttlt_scale99')} |")
        lines += ["", f"(seed: {SEED_SLO_GAIN[0]}–{SEED_SLO_GAIN[1]}× tighter TTFT SLO at 99% with UniBoost)", ""]
    if sec_rows("fig7"):
        cap = caps[study.fig7.name]
        runs = run_lengths_text(study, "fig7", study.fig7)
        for metric, name in (("ttft", "TTFT"), ("ttlt", "TTLT")):
            lines += [f"## Fig. 7 — {study.fig7.model} TP1 on {study.fig7.gpu}, {runs}: "
                      f"P90 / P99 {name} (s) vs ρ (stable seeds)", "",
                      "| policy | " + " | ".join(f"ρ={r} ({r * cap:.3g} req/s)" for r in study.fig7_rhos) + " |",
                      "|" + "---|" * (len(study.fig7_rhos) + 1)]
            for p in ("fcfs", *ABLATION, *_mode_labels(study)):
                cells = []
                for rho in study.fig7_rhos:
                    g = group(rows, "fig7", p, rho)
                    cells.append(f"{ci(g, metric + '.p90')} / {ci(g, metric + '.p99')} ({stable_share(g)})"
                                 if g else "—")
                lines.append(f"| {p} | " + " | ".join(cells) + " |")
            lines.append("")
        lines += ["Preemptions per run (forced = outside MemGuard's rules; for policies without MemGuard every "
                  "eviction counts as forced):", "",
                  "| policy | " + " | ".join(f"ρ={r}" for r in study.fig7_rhos) + " |",
                  "|" + "---|" * (len(study.fig7_rhos) + 1)]
        for p in ("fcfs", *ABLATION, *_mode_labels(study)):
            cells = [f"{ci(g, 'preemptions')} ({ci(g, 'forced_preemptions')}, {ci(g, 'swaps')} swaps)"
                     if (g := group(rows, "fig7", p, rho))
                     else "—" for rho in study.fig7_rhos]
            lines.append(f"| {p} | " + " | ".join(cells) + " |")
        lines += ["", *run_lengths_table(rows, "fig7", ("fcfs", *ABLATION, *_mode_labels(study)), study.fig7_rhos),
                  f"(seed: {SEED_FIG7})", ""]
    sens = [r for r in rows if r["section"].startswith("sens_")]
    if sens:
        rho = study.sens_rho
        ref = group(rows, "fig7", "uniboost", rho)
        ref_f = group(rows, "fig7", "fcfs", rho)
        lines += [f"## Tables 6–8 — sensitivity of uniboost on the Fig. 7 setup, ρ = {rho}, "
                  f"{run_lengths_text(study, 'sensitivity', study.fig7)}", "",
                  "Default: k = 256, δ = 32, chunk (token budget) 2,048 — the Fig. 7 point at this ρ. "
                  "% = change vs that default (positive = better); Table 8's rows also vs `fcfs` at the same chunk.",
                  "", "| variant | stable | ttft.p99 (s) | ttlt.p99 (s) | tpot.p99 (s) | preemptions | "
                  "Δ ttft.p99 | Δ ttlt.p99 |", "|---|---|---|---|---|---|---|---|"]

        def row(name, g, base):
            return (f"| {name} | {stable_share(g)} | {ci(g, 'ttft.p99')} | {ci(g, 'ttlt.p99')} | {ci(g, 'tpot.p99')} | "
                    f"{ci(g, 'preemptions')} | {pct_vs(g, base, 'ttft.p99')} | {pct_vs(g, base, 'ttlt.p99')} |")
        lines.append(row("uniboost default (k=256, δ=32, chunk 2048)", ref, ref))
        for k in study.ks:
            lines.append(row(f"Table 6: k = {k}", group(rows, "sens_k", f"uniboost[k={k}]"), ref))
        for d in study.deltas:
            lines.append(row(f"Table 7: δ = {d}", group(rows, "sens_delta", f"uniboost[delta={d}]"), ref))
        lines.append(row("fcfs, chunk 2048", ref_f, ref_f))
        for c in study.chunks:
            f_ = group(rows, "sens_chunk", "fcfs", setup=f"{study.fig7.name}_chunk{c}")
            u_ = group(rows, "sens_chunk", "uniboost", setup=f"{study.fig7.name}_chunk{c}")
            lines.append(row(f"Table 8: fcfs, chunk {c}", f_, f_))
            lines.append(row(f"Table 8: uniboost, chunk {c} (Δ vs fcfs at chunk {c})", u_, f_))
        lines.append(row("uniboost, chunk 2048 (Δ vs fcfs at chunk 2048)", ref, ref_f))
        lines.append("")
        lengths = [f"{r['label']} {r['setup']}: " + ", ".join(str(x["lengths"][-1]) for x in
                                                          sorted(group(sens, r["section"], r["label"], None, r["setup"]),
                                                                 key=lambda x: x["seed"]))
                   for r in {(r["section"], r["label"], r["setup"]): r for r in sens if "lengths" in r}.values()]
        if lengths:
            lines += ["Run lengths the verdict chose (requests per seed): " + "; ".join(lengths) + ".", ""]
    if sec_rows("starvation"):
        su = study.starvation
        size = su.replay_of or su.num_replicas
        how = (f"replay: one replica's share of the {size}-replica trace per seed, simulated alone"
               if su.replay_of else f"{size} replicas simulated together")
        lines += [f"## A.3 — starvation: 90% short (125/100) + 10% long (2k/6k), ρ = {study.starvation_rho} "
                  f"of fcfs's stable-only capacity on these runs ({study.starvation_rho * caps[su.name]:.4g} req/s "
                  f"on {size} "
                  f"replicas), {su.cluster_policy} dispatch ({how}), {su.num_requests} requests per replica", "",
                  "Slope = least-squares slope of finished long requests' E2E latency against arrival time, per "
                  "request of the cluster's arrival order (s/req; seed 001's regression on request ids); growth = "
                  "that slope × the fitted arrival span (s). Per seed: the fit's own 95% interval; ± here = over "
                  "seeds. `unfinished` = long requests of the steady-state window still unfinished when the run "
                  f"stopped ({su.drain_s:.0f} s after the last arrival).", ""]
        if su.name in saturation:
            sat = saturation[su.name]
            lines += [f"fcfs's saturation throughput (backlog of {sat['requests']} requests on one replica, per seed): "
                      + ", ".join(f"{v:.3g}" for v in sat["per_replica_per_seed"]) + f" req/s per replica, vs its "
                      f"stable-only capacity {caps[su.name] / size:.3g} req/s per replica on these runs.", ""]
        lines += [
                  "| policy | stable | arrivals (s) | short E2E p50 / p99 (s) | long E2E p50 / p99 (s) | long slope "
                  "(s/req) | growth over the run (s) | per-seed slope ± its 95% (s/req) | long preempted p99 (s) | "
                  "long unfinished | preemptions |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for p in study.starvation_policies:
            g = group(rows, "starvation", p)
            if g:
                per_seed = "; ".join(f"{r['long_slope_s_per_req']:+.2g} ± {r['long_slope_hw_s_per_req']:.1g}"
                                     if "long_slope_hw_s_per_req" in r else "—" for r in g)
                lines.append(f"| {p} | {stable_share(g)} | {ci(g, 'arrival_span_s')} | {ci(g, 'short_e2e.p50')} / "
                             f"{ci(g, 'short_e2e.p99')} | {ci(g, 'long_e2e.p50')} / {ci(g, 'long_e2e.p99')} | "
                             f"{ci(g, 'long_slope_s_per_req')} | {ci(g, 'long_growth_s')} | {per_seed} | "
                             f"{ci(g, 'long_preempted_s.p99')} | {ci(g, 'long_unfinished')} | {ci(g, 'preemptions')} |")
        lines += ["", "(seed: slopes ≈ 0.0003 s/req, no policy starves long requests at ρ < 1)", ""]
    if sec_rows("tiers"):
        k = study.tiers.num_tiers
        lines += [f"## Tiers — {k} tiers (enterprise mix, default SLOs), ρ = {study.tiers_rho} "
                  f"({study.tiers_rho * caps[study.tiers.name]:.3g} req/s), {study.tiers.num_requests} requests "
                  "(no seed counterpart)", "",
                  "| policy | stable | " + " | ".join(f"tier{t} TTFT p99 (s) / attainment" for t in range(k)) + " |",
                  "|" + "---|" * (k + 2)]
        for lab in sorted({r["label"] for r in rows if r["section"] == "tiers"}):
            g = group(rows, "tiers", lab)
            lines.append(f"| {lab} | {stable_share(g)} | " + " | ".join(
                f"{ci(g, f'tier{t}.ttft.p99')} / {ci(g, f'tier{t}.attainment')}" for t in range(k)) + " |")
        lines.append("")
    if any(r["section"].startswith("dispatch_") for r in rows):
        su = study.dispatch
        lines += [f"## Table 9 — uniboost vs vllm under dispatch policies, {su.num_replicas} × {su.model} replicas, "
                  f"{su.num_requests} requests, ρ = {study.dispatch_rho} ({study.dispatch_rho * caps[su.name]:.4g} "
                  "req/s)", "", "% = improvement of uniboost over vllm (positive = better), per seed, mean ± 95%.",
                  "", "| dispatch | stable (vllm / uniboost) | TTFT p99 | TBT (TPOT) p99 | E2E p99 | E2E p50 | "
                  "vllm E2E p99 (s) | uniboost E2E p99 (s) | preemptions per replica (vllm / uniboost) |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for cp in ("random", "round_robin", "jsq"):
            v, u = group(rows, f"dispatch_{cp}", "vllm"), group(rows, f"dispatch_{cp}", "uniboost")
            if v or u:
                per = lambda g: ci([{**r, "pp": r["preemptions"] / su.num_replicas} for r in g], "pp")  # noqa: E731
                lines.append(f"| {cp} | {stable_share(v)} / {stable_share(u)} | {pct_vs(u, v, 'ttft.p99')} | "
                             f"{pct_vs(u, v, 'tpot.p99')} | {pct_vs(u, v, 'ttlt.p99')} | {pct_vs(u, v, 'ttlt.p50')} "
                             f"| {ci(v, 'ttlt.p99')} | {ci(u, 'ttlt.p99')} | {per(v)} / {per(u)} |")
        lines.append("")
    if sec_rows("replay"):
        su = study.replay
        lines += [f"## Table 10 — uniboost vs vllm by trace replay, 32…512 replicas of {su.model}, random dispatch, "
                  f"ρ = {study.replay_rho}", "",
                  f"Arrivals: the Azure 2023 conversation trace's inter-arrival gaps (bursty), from a random start per "
                  f"seed, rescaled to the cluster's rate N × ρ × the one-replica capacity and dispatched at random; "
                  f"{study.replay_sampled} replicas' shares per seed simulated alone, {su.num_requests} requests "
                  "each on average. % = improvement of uniboost over vllm on the same replica's requests, averaged "
                  "over the sampled replicas of a seed, then mean ± 95% over seeds.", "",
                  "| replicas | cluster rate (req/s) | stable (vllm / uniboost) | TTFT p99 | TBT (TPOT) p99 | "
                  "E2E p99 | "
                  "E2E p50 | vllm E2E p99 (s) | uniboost E2E p99 (s) | preemptions per replica (vllm / uniboost) |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for size in study.replay_sizes:
            v = group(rows, "replay", "vllm", setup=f"replay{size}")
            u = group(rows, "replay", "uniboost", setup=f"replay{size}")
            if v or u:
                lines.append(f"| {size} | {study.replay_rho * caps.get(f'replay{size}', math.nan):.4g} | "
                             f"{stable_share(v)} / {stable_share(u)} | {pct_paired(u, v, 'ttft.p99')} | "
                             f"{pct_paired(u, v, 'tpot.p99')} | {pct_paired(u, v, 'ttlt.p99')} | "
                             f"{pct_paired(u, v, 'ttlt.p50')} | {ci(v, 'ttlt.p99')} | {ci(u, 'ttlt.p99')} | "
                             f"{ci(v, 'preemptions')} / {ci(u, 'preemptions')} |")
        lines += ["", "(seed: gains consistent from 32 to 512 replicas)", ""]
    if sec_rows("gamma"):
        su = study.gamma
        cap = caps.get(su.name, math.nan)
        prof = su.rate_profile or (1.0,)
        lines += [f"## γ-Ada over time — {su.model}, Table 2's mix, {su.num_requests} requests, load stepping "
                  + " → ".join(f"{m:g}" for m in prof) + f" × fcfs's capacity ({cap:.4g} req/s)", "",
                  "Per load segment (by completion time): median γ at completion (1/s) and γ-Ada's load estimate "
                  "λ·E[S] (S = a finished request's share of the GPU time of the iterations it ran in, so λ·E[S] is the "
                  "replica's busy fraction), mean ± 95% "
                  "over seeds; then the tails of the requests arriving in each segment. `uniboost_memguard` keeps "
                  "γ fixed at its start value; `uniboost[gamma_rule=nudge]` is the seed code's p99/p95 nudge. "
                  "Plot: uniboost_gamma.png.", "",
                  "| policy | stable | " + " | ".join(f"seg {j} (×{m:g}): γ / load est." for j, m in enumerate(prof))
                  + " | TTFT p95 (s) | TTLT p99 (s) | TTLT p99 by segment (s) |", "|" + "---|" * (len(prof) + 5)]
        for lab in ("uniboost", "uniboost[gamma_rule=nudge]", "uniboost_memguard"):
            g = group(rows, "gamma", lab)
            if g:
                segs = " | ".join(f"{ci(g, f'seg{j}.gamma.p50')} / {ci(g, f'seg{j}.load.p50')}"
                                  for j in range(len(prof)))
                by_seg = " / ".join(ci(g, f"seg{j}.ttlt.p99") for j in range(len(prof)))
                lines.append(f"| {lab} | {stable_share(g)} | {segs} | {ci(g, 'ttft.p95')} | {ci(g, 'ttlt.p99')} | "
                             f"{by_seg} |")
        fixed = group(rows, "gamma", "uniboost_memguard")
        ada = group(rows, "gamma", "uniboost")
        lines += ["", f"γ-Ada vs fixed γ (uniboost vs uniboost_memguard): P99 TTLT {pct_vs(ada, fixed, 'ttlt.p99')}, "
                  f"P95 TTFT {pct_vs(ada, fixed, 'ttft.p95')} (positive = γ-Ada better).", ""]
    return "\n".join(lines)


# ---- the study run whole: its runs, then this report ---------------------------------------------------
def run_study(study: Study, outdir: str | Path, executor: str = "process", log=print,
              reuse_meta: str | Path | None = None, resume: bool = False) -> dict[str, Any]:
    """Capacities, then every point in batches (see the module doc). `reuse_meta`: a previous run's
    uniboost_meta.json whose measured capacities (and probes) are taken instead of searching again — only for
    setups identical to this study's (same requests, model, replicas, workload); the others are searched.
    `resume`: keep the runs already in outdir's uniboost_runs.json that match a job of this study exactly (same
    policy, parameters, setup, rate and seed) and run only the rest."""
    from tierserve.core.errors import Interrupted
    from tierserve.experiments.runs import run_many
    out = Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    to_measure, derived = _capacity_setups(study)
    old_meta = (json.loads((out / "uniboost_meta.json").read_text())
                if resume and (out / "uniboost_meta.json").exists() else None)
    meta: dict[str, Any] = {"status": "capacity search", "study": asdict(study), "capacities_rps": {},
                            "capacity_derived": derived}
    found: dict[str, dict] = {}
    if reuse_meta is not None:
        old = json.loads(Path(reuse_meta).read_text())
        old_setups = {v["name"]: v for v in old["study"].values() if isinstance(v, dict) and "name" in v}
        for su in list(to_measure):
            same = _same_setup(old_setups.get(su.name), su, ignore=("drain_s",))
            if same and su.name in old.get("capacity_probes", {}):
                found[su.name] = {"rate": old["capacities_rps"][su.name], "probes": old["capacity_probes"][su.name]}
                to_measure.remove(su)
                log(f"capacity of {su.name}: {found[su.name]['rate']:.4g} req/s, reused from {reuse_meta}")
        meta["capacity_reused_from"] = str(reuse_meta)
    _write_json(out / "uniboost_meta.json", meta)
    (out / "uniboost_report.md").write_text("# UniBoost (seed 001) on tierserve\n\n**PARTIAL: still searching "
                                            "capacities; no point has run yet.**\n")
    saturation: dict[str, Any] = {}
    su = study.starvation
    if "starvation" in study.sections and any(m.name == su.name for m in to_measure):
        # where the capacity search starts: fcfs's completion rate when backlogged (an under-estimate when
        # fcfs thrashes under a backlog, so the search doubles up from it)
        saturation[su.name] = saturation_capacity(su, study.seeds, study.saturation_requests, executor, log)
    elif reuse_meta is not None and su.name in found:     # the capacity came from there: so does its start point
        saturation.update(json.loads(Path(reuse_meta).read_text()).get("saturation", {}))
    meta["saturation"] = saturation
    if to_measure:
        log(f"capacity search for {', '.join(s.name for s in to_measure)} ({len(study.seeds)} seeds per probe)")
        found.update(capacities(to_measure, study.seeds, study.capacity_rel_tol, executor, log,
                                guesses={k: v["rate"] for k, v in saturation.items()}, mode=study.preempt_mode))
    caps = {k: v["rate"] for k, v in found.items()}
    if study.dispatch.name in derived:
        caps[study.dispatch.name] = study.dispatch.num_replicas * caps[study.fig7.name]
    if study.tiers.name in derived:
        caps[study.tiers.name] = caps[study.table2.name]
    cap_wall = time.perf_counter() - t0
    jobs = _jobs_for(study, caps)
    meta.update(capacities_rps=caps, capacity_probes={k: v["probes"] for k, v in found.items()},
                capacity_wall_s=cap_wall, status="running", runs_total=len(jobs))
    log("capacities (fcfs, stable-only): " + ", ".join(f"{k} {v:.4g} req/s" for k, v in caps.items())
        + f"  [{cap_wall:.0f} s]; {len(jobs)} runs to go")
    _write_json(out / "uniboost_meta.json", meta)

    points: dict[tuple, list[int]] = {}
    for i, j in enumerate(jobs):
        points.setdefault(_point_key(j), []).append(i)
    keys = list(points)
    batches = [keys[i:i + study.batch_points] for i in range(0, len(keys), study.batch_points)]
    rows: list[dict[str, Any]] = []
    def job_id(policy, params, setup_name, rate, seed, replica=0) -> str:
        return json.dumps([policy, params, setup_name, round(rate, 9), seed] + ([replica] if replica else []),
                          sort_keys=True, default=float)
    have: set[str] = set()
    if resume and (out / "uniboost_runs.json").exists() and old_meta is not None:
        # a run is kept only if its setup family is unchanged (the previous meta's Setup equals this study's)
        same = {k for k, v in asdict(study).items() if isinstance(v, dict) and "name" in v
                and _same_setup(old_meta["study"].get(k), getattr(study, k))}
        fam = {getattr(study, k).name for k in same}
        old_rows = {job_id(r["policy"], r["params"], r["setup"], r["rate"], r["seed"], r.get("replica", 0)): r
                    for r in json.loads((out / "uniboost_runs.json").read_text())}
        for j in jobs:
            base = j["setup"]["name"].split("_chunk")[0].split("_")[0]
            if base.startswith(study.replay.name) and base[len(study.replay.name):].isdigit():
                base = study.replay.name            # replay<N>: the replay family at N replicas
            jid = job_id(j["policy"], j["params"], j["setup"]["name"], j["rate"], j["seed"],
                         j["setup"]["replay_replica"])
            r = old_rows.get(jid)
            if r is not None and base in fam and r.get("run_most") == j["most"]:   # same run-length rule too
                rows.append(r)
                have.add(jid)
        meta["resumed_runs"] = len(rows)
        log(f"resume: {len(rows)} of {len(jobs)} runs kept from {out / 'uniboost_runs.json'} "
            f"(unchanged setups: {', '.join(sorted(fam))})")

    def flush(status: str) -> str:
        meta.update(status=status, runs_done=len(rows), wall_s=time.perf_counter() - t0)
        _write_json(out / "uniboost_runs.json", rows)
        _write_json(out / "uniboost_meta.json", meta)
        n_done: dict[tuple, int] = {}
        for r in rows:
            kk = (r["section"], r["setup"], r["label"], r["rho"])
            n_done[kk] = n_done.get(kk, 0) + 1
        missing = [k for k in keys if n_done.get(k, 0) < len(points[k])]
        md = report(study, rows, caps, derived, saturation)
        if missing:
            secs = sorted({k[0] for k in missing}, key=[k[0] for k in keys].index)
            md = md.replace("# UniBoost (seed 001) on tierserve\n", "# UniBoost (seed 001) on tierserve\n\n"
                            f"**{status}: {len(keys) - len(missing)} of {len(keys)} points finished "
                            f"({len(rows)} of {len(jobs)} runs). Sections with points still missing: "
                            f"{', '.join(secs)}. Not the complete study.**\n", 1)
        (out / "uniboost_report.md").write_text(md)
        log(f"capacity searches {cap_wall:.0f} s; {len(rows)} of {len(jobs)} runs; wall "
            f"{time.perf_counter() - t0:.0f} s ({executor})")
        gamma_plot(rows, study, out / "uniboost_gamma.png")
        return md

    def add_rows(idx: list[int], results: list) -> None:
        for i, r in zip(idx, results):
            if r is not None:
                rows.append({**r, "section": jobs[i]["section"], "rho": jobs[i]["rho"], "label": _label(jobs[i])})

    for b, batch in enumerate(batches, 1):
        idx = [i for k in batch for i in points[k]
               if job_id(jobs[i]["policy"], jobs[i]["params"], jobs[i]["setup"]["name"], jobs[i]["rate"],
                         jobs[i]["seed"], jobs[i]["setup"]["replay_replica"]) not in have]
        if not idx:
            continue
        # the longest runs first (boost-family policies, more requests), so the pool's tail is short
        idx.sort(key=lambda i: -(jobs[i]["setup"]["num_requests"] * (2.5 if "boost" in jobs[i]["policy"] else 1.0)))
        tb = time.perf_counter()
        try:
            res = run_many(run_point, [{k: v for k, v in jobs[i].items() if k not in ("section", "rho")}
                                       for i in idx], executor=executor, progress=True,
                           description=f"batch {b}/{len(batches)}")
        except Interrupted as e:
            add_rows(idx, e.results)
            flush("INTERRUPTED")
            raise
        add_rows(idx, res)
        for k in batch:
            g = [r for r in rows if (r["section"], r["setup"], r["label"], r["rho"]) == k]
            log(f"[{b}/{len(batches)}] {k[0]} {k[2]} ρ={k[3]}: stable {stable_share(g)}, "
                f"ttft.p95 {ci(g, 'ttft.p95')} s, ttlt.p99 {ci(g, 'ttlt.p99')} s, "
                f"preemptions {ci(g, 'preemptions')}")
        log(f"[{b}/{len(batches)}] batch of {len(idx)} runs in {time.perf_counter() - tb:.0f} s; "
            f"{len(rows)}/{len(jobs)} runs done, {time.perf_counter() - t0:.0f} s elapsed")
        flush("PARTIAL" if b < len(batches) else "complete")
    md = flush("complete")
    return {"markdown": md, "rows": rows, "capacities": caps}
