"""The Markdown report of the Niyama study (`tierserve.experiments.niyama`), and `run_study`: the study run whole
(its runs, then this report; here so that the study module never imports its report)."""
from __future__ import annotations

import math
from typing import Any

from tierserve.experiments.niyama import (
    CALIBRATED, CALIBRATED_MODE, DECODE_BINS, DIURNAL_RATES, PROMPT_BINS, SEED_ABLATION, SEED_DIURNAL,
    SEED_GOODPUT, SEED_GPUS_50QPS, STACKS, Study,
)
from pathlib import Path
from tierserve.experiments.scenario import ScenarioConfig
from dataclasses import asdict
from tierserve.policies.cluster.silo import silo_layout
from tierserve.experiments.niyama import ABLATION, CLASSES, Points, SILO_CHUNKS, _cap_row, _save, diurnal_jobs_of, diurnal_rows, judge_whole, plot_diurnal, run_searches, scenario


# ---- report ----------------------------------------------------------------------------------------------
def _f(x: float, nd: int = 2) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _pct(x: float) -> str:
    """A violation rate (%): one decimal, or two significant digits below 0.1% so a rare miss does not read 0."""
    return _f(x, 1) if x is None or not (0 < abs(x) < 0.1) else f"{x:.2g}"


def report(study: Study, res: dict[str, Any]) -> str:
    L = ["# Niyama/QoServe (seed 003) — tierserve reproduction", "",
         f"{study.model} / {study.gpu}, physical execution model; seeds {list(study.seeds)}; goodput and capacities by "
         f"bisection to ±{study.rel_tol:.0%} over the seeds pooled (every class ≥ 99% deadlines met over the "
         "arrivals from the warm-up's end on, and the run stable by the work verdict: unfinished prefill + decode "
         "tokens do not grow with run length; each probe runs its requests, doubled while undecided up to 4×); "
         "violation rates mean ± 95% over seeds.", "",
         "Predictor: Niyama's dynamic chunking sizes every batch by the predicted iteration time, and in every "
         "row but one that prediction is the simulator's own execution-time model (exact by construction). The "
         f"row `{CALIBRATED}` gives it the `{CALIBRATED_MODE}` model of the same GPU (separately calibrated "
         "coefficients, 0–20% off the simulator's chunk sizes) while the simulator keeps its physical model: "
         "the one change is the predictor. Batch shape and preemption mode are the same for every stack.", "",
         "## Goodput per replica (QPS)", "",
         "| dataset | " + " | ".join(STACKS) + f" | {CALIBRATED} | Niyama / FCFS | Niyama / EDF | "
         "calibrated / EDF | seed (FCFS / EDF / Niyama) |",
         "|---|" + "---|" * (len(STACKS) + 5)]
    for d, row in res["goodput"].items():
        g = {k: v["rate"] for k, v in row.items()}
        seed = SEED_GOODPUT.get(d)
        cal = row.get(CALIBRATED)
        L.append(f"| {d} | " + " | ".join(_f(g[k]) + ("+" if row[k]["saturated"] else "") for k in STACKS) +
                 (f" | {_f(cal['rate'])}{'+' if cal['saturated'] else ''}" if cal else " | —") +
                 f" | {_f(g['Niyama'] / g['Sarathi-FCFS'])}× | {_f(g['Niyama'] / g['Sarathi-EDF'])}× | "
                 + (f"{_f(cal['rate'] / g['Sarathi-EDF'])}× | " if cal else "— | ")
                 + (" / ".join(f"{x:g}" for x in seed.values()) if seed else "—") + " |")
    for d, row in res.get("second_model", {}).items():
        if d == next(iter(res["second_model"])):
            L += ["", f"## Goodput per replica, {study.second_model} on {study.second_tp}× {study.gpu} (TP"
                      f"{study.second_tp}) (QPS)", "",
                  "| dataset | " + " | ".join(STACKS) + " | Niyama / FCFS | Niyama / EDF | binding (stack) |",
                  "|---|" + "---|" * (len(STACKS) + 3)]
        g = {k: v["rate"] for k, v in row.items()}
        bind = ", ".join(f"{k}: " + min(v["tiers"], key=v["tiers"].get) if v["stable_rate"] > v["rate"] * 1.001
                         else f"{k}: stability" for k, v in row.items())
        L.append(f"| {d} | " + " | ".join(_f(g[k]) + ("+" if row[k]["saturated"] else "") for k in STACKS) +
                 f" | {_f(g['Niyama'] / g['Sarathi-FCFS'])}× | {_f(g['Niyama'] / g['Sarathi-EDF'])}× | {bind} |")
    L += ["", f"## GPUs for {study.target_qps:g} QPS (M = {study.cluster_replicas}-replica capacity, scaled)", "",
          "| dataset | silo pools Q1/Q2/Q3 | silo total | Niyama (shared) | saving | seed silo → Niyama |",
          "|---|---|---|---|---|---|"]
    for d, g in res["gpus"].items():
        seed = SEED_GPUS_50QPS.get(d)
        saving = 1 - g["niyama_gpus"] / g["silo_total"] if g["silo_total"] else math.nan
        L.append(f"| {d} | {' / '.join(str(x) for x in g['silo_gpus'])} | {g['silo_total']} | {g['niyama_gpus']} | "
                 f"{_f(100 * saving, 0)}% | {seed[0]} → {seed[1]} ({100 * (1 - seed[1] / seed[0]):.0f}%) |")
    if "ablation_overload_rate" not in res:        # a goodput-only study: nothing else was run
        return "\n".join(L)
    L += ["", f"## Ablation ({study.datasets[0]}; overload = {study.overload_rho:g} × Sarathi-EDF goodput = "
              f"{_f(res['ablation_overload_rate'])} QPS)", "",
          "| config | goodput (QPS) | violations at overload (%) | relegated per run | seed goodput | seed violations at 6 QPS |",
          "|---|---|---|---|---|---|"]
    for label, a in res["ablation"].items():
        v = a["overload"]
        seed = SEED_ABLATION.get(label)
        L.append(f"| {label} | {_f(a['goodput'])} | {_f(v['all'][0], 1)} ± {_f(v['all'][1], 1)} | {v['relegated']:.0f} | "
                 + (f"{seed[0]:g} | {seed[1]:g}" if seed else "— | —") + " |")
    if res.get("dispatch"):
        m = study.dispatch_replicas
        rhos = list(study.dispatch_rhos)
        jsq = res["dispatch"].get("jsq", {}).get("capacity", math.nan)
        L += ["", f"## Niyama behind cluster dispatchers ({study.datasets[0]}, {m} replicas)", "",
              f"Capacity of the {m}-replica cluster (every class ≥ 99% and stable; "
              f"{study.dispatch_requests_per_replica * m} requests per probe) and per replica; violations "
              f"(%, mean ± 95% over seeds) per class at ρ = {', '.join(f'{r:g}' for r in rhos)} of "
              f"Niyama-behind-JSQ's capacity ({_f(jsq)} QPS), {study.overload_duration_s:g} s of arrivals.", "",
              "| dispatcher | capacity (QPS) | per replica | " + " | ".join(
                  f"ρ={r:g} {c}" for r in rhos for c in ("all", "Q1", "Q2", "Q3")) + " | stable seeds |",
              "|---|---|---|" + "---|" * (4 * len(rhos) + 1)]
        for name, row in res["dispatch"].items():
            pts = row.get("points", {})
            cells = [f"{_pct(pts[r][c][0])} ± {_pct(pts[r][c][1])}" if r in pts else "—"
                     for r in rhos for c in ("all", "Q1", "Q2", "Q3")]
            stable = " / ".join(f"{pts[r]['stable_seeds']}" for r in rhos if r in pts)
            L.append(f"| {name} | {_f(row['capacity'])}{'+' if row['saturated'] else ''} | {_f(row['per_replica'])} | "
                     + " | ".join(cells) + f" | {stable} |")
    L += ["", "## α sensitivity (Niyama; violations %, overall and Q1)", "", "| α (ms/token) | " +
          " | ".join(f"ρ = {rho:g}" for rho in (1.0, study.overload_rho)) + " |", "|---|---|---|"]
    for alpha, row in res["alpha"].items():
        L.append(f"| {alpha * 1e3:g} | " + " | ".join(
            f"{_f(v['all'][0], 1)} ± {_f(v['all'][1], 1)} (Q1 {_f(v['Q1'][0], 1)})" for v in row.values()) + " |")
    for rho, row in res.get("lengths", {}).items():
        rate = next(iter(row.values()))["rate"]
        for col, edges, what in (("prompt_tokens", PROMPT_BINS, "prompt"), ("output_tokens", DECODE_BINS, "decode")):
            lows = [0] + [int(e) for e in edges[:-1]]
            heads = [f"{lo + 1}–{int(hi)}" if math.isfinite(hi) else f"> {lo}" for lo, hi in zip(lows, edges)]
            L += ["", f"## Violations by {what} length ({study.datasets[0]}, ρ = {float(rho):g} × Sarathi-EDF "
                      f"goodput = {_f(rate)} QPS; %, mean ± 95% over seeds; requests in the bin over all seeds)", "",
                  f"| stack | " + " | ".join(f"{h} tokens" for h in heads) + " | all |",
                  "|---|" + "---|" * (len(heads) + 1)]
            for label, v in row.items():
                L.append(f"| {label} | " + " | ".join(
                    f"{_f(b['violations_pct'][0], 1)} ± {_f(b['violations_pct'][1], 1)} (n={b['requests']})"
                    for b in v["bins"][col]) + f" | {_f(v['all'][0], 1)} |")
    d = res["diurnal"]
    names = ["Q1", "Q2", "Q3", "Q1-low", "Q2-low", "Q3-low"]
    if not d:
        return "\n".join(L)
    L += ["", f"## Diurnal ({len(DIURNAL_RATES)} segments of {d['segment_s']:g} s at {d['rates']} QPS "
              f"(the seed's {list(DIURNAL_RATES)} in units of its EDF goodput), "
              f"{d['num_requests']} requests, 20% low priority; violations %)", "",
          "| stack | overall | critical (Q1–Q3 high) | " + " | ".join(names) + " | relegated (low) | seed overall |",
          "|---|" + "---|" * (len(names) + 4)]
    for label in [k for k in d if isinstance(d[k], dict) and "critical" in d[k]]:
        row = d[label]
        L.append(f"| {label} | {_f(row['all'][0])} ± {_f(row['all'][1])} | {_f(row['critical'][0])} ± "
                 f"{_f(row['critical'][1])} | " + " | ".join(_f(row[n][0]) for n in names) +
                 f" | {row['relegated']:.0f} ({row['relegated_low']:.0f}) | {SEED_DIURNAL.get(label, '—')} |")
    return "\n".join(L)


# ---- the study run whole: its runs, then this report ---------------------------------------------------
def run_study(study: Study, out: str | Path, executor: str = "process", log=print,
              reuse: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run every part: first every capacity search (one process pool, `study.workers` processes, each search
    serial inside), then every fixed-rate run (one pool). `reuse` (a previous niyama_results.json of the same
    study) skips the Llama-3-8B goodput and silo searches and takes their results from it."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict[str, Any] = {"study": asdict(study), "goodput": {}, "second_model": {}, "gpus": {}, "dispatch": {},
                           "ablation": {}, "alpha": {}, "lengths": {}, "diurnal": {}}
    m = study.cluster_replicas
    d0 = study.datasets[0]

    # Phase 1: capacity searches. -------------------------------------------------------------------------
    jobs: list[dict[str, Any]] = []

    def search(key: tuple, cfg: ScenarioConfig, goals=None, hi: float | None = None, planner: str = "") -> None:
        jobs.append({"key": key, "study": study, "cfg": cfg, "goals": goals, "hi": hi or study.hi,
                     "planner": planner})

    if reuse is None:
        for d in study.datasets:
            for label, (pol, params) in STACKS.items():
                search(("goodput", d, label), scenario(study, d, pol, params))
            search(("goodput", d, CALIBRATED), scenario(study, d, "niyama", {}), planner=CALIBRATED_MODE)
        for d in (() if study.goodput_only else study.datasets):
            search(("shared", d), scenario(study, d, "niyama", {}, replicas=m, cluster_policy="jsq",
                                           num_requests=study.cluster_requests), hi=study.hi * m)
            for c, chunk in enumerate(SILO_CHUNKS):
                params, chunks = silo_layout([[c]], [m], [chunk])
                cfg = scenario(study, d, "sarathi_fcfs", {"chunk_by_replica": chunks}, replicas=m,
                               cluster_policy="silo", cluster_params=params, num_requests=study.cluster_requests,
                               tiers={"num_tiers": 3, "preset": "niyama",
                                      "weights": [1.0 if i == c else 0.0 for i in range(3)]})
                search(("silo", d, c), cfg, goals={CLASSES[c]: 0.99}, hi=study.hi * m * 3)
        if study.ablation_goodput:
            for label, (pol, params) in ABLATION.items():
                if label not in ("Sarathi-EDF", "+SP (Niyama)"):
                    search(("ablation", d0, label), scenario(study, d0, pol, params))
    else:
        res["goodput"], res["gpus"] = reuse["goodput"], reuse["gpus"]
        res["reused_from"] = "Llama-3-8B goodput and silo searches of a previous run (niyama_results.json)"
    for d in (() if study.goodput_only else study.second_datasets):
        for label, (pol, params) in STACKS.items():
            search(("second", d, label), scenario(study, d, pol, params, model=study.second_model,
                                                   tp=study.second_tp))
    k = study.dispatch_replicas
    for name in (() if study.goodput_only else study.dispatchers):
        search(("dispatch", d0, name), scenario(study, d0, "niyama", {}, replicas=k, cluster_policy=name,
                                                 num_requests=study.dispatch_requests_per_replica * k),
               hi=study.hi * k)
    found = run_searches(study, jobs, executor, log)

    for (kind, *rest), r in found.items():
        if kind == "goodput":
            res["goodput"].setdefault(rest[0], {})[rest[1]] = _cap_row(r)
        elif kind == "second":
            res["second_model"].setdefault(rest[0], {})[rest[1]] = _cap_row(r)
        elif kind == "dispatch":
            res["dispatch"][rest[1]] = {"capacity": r["rate"], "per_replica": r["rate"] / k, "replicas": k,
                                        **_cap_row(r)}
    for d in (study.datasets if reuse is None and not study.goodput_only else ()):
        shared = found[("shared", d)]["rate"]
        pools = [found[("silo", d, c)]["rate"] for c in range(len(SILO_CHUNKS))]
        share = study.target_qps / 3
        silo_gpus = [math.ceil(share * m / p) if p > 0 else math.nan for p in pools]
        shared_gpus = math.ceil(study.target_qps * m / shared) if shared > 0 else math.nan
        res["gpus"][d] = {"shared_capacity": shared, "pool_capacity": pools, "silo_gpus": silo_gpus,
                          "silo_total": sum(silo_gpus), "niyama_gpus": shared_gpus}
        log(f"GPUs for {study.target_qps:g} QPS on {d}: silos {silo_gpus} = {sum(silo_gpus)}, Niyama {shared_gpus}")
    _save(out, res)
    if study.goodput_only:
        res["markdown"] = report(study, res)
        (out / "niyama_report.md").write_text(res["markdown"] + "\n")
        res["plots"] = []
        return res

    # Phase 2: fixed-rate runs. ---------------------------------------------------------------------------
    points = Points(study)
    g0 = res["goodput"][d0]
    edf_goodput, ny_goodput = g0["Sarathi-EDF"]["rate"], g0["Niyama"]["rate"]
    overload = study.overload_rho * edf_goodput
    res["ablation_overload_rate"] = overload
    ablation_pts, alpha_pts = {}, {}
    if reuse is not None and reuse.get("ablation") and reuse.get("alpha"):
        # Their stacks carry no tier importance, which is all this change touched in `niyama`: same runs.
        res["ablation"], res["alpha"] = reuse["ablation"], reuse["alpha"]
        res["reused_from"] += "; ablation and α runs"
    else:
        for label, (pol, params) in ABLATION.items():
            ablation_pts[label] = points.add(scenario(study, d0, pol, params), overload)
        alpha_pts = {alpha: {rho: points.add(scenario(study, d0, "niyama", {"alpha_s_per_token": alpha}),
                                             rho * ny_goodput) for rho in (1.0, study.overload_rho)}
                     for alpha in study.alphas}
    # Violations by request length: every stack at the same rates (ρ = 1 and the overload, in units of
    # Sarathi-EDF's goodput, as the ablation).
    length_pts = {rho: {label: points.add(scenario(study, d0, pol, params), rho * edf_goodput)
                        for label, (pol, params) in STACKS.items()} for rho in (1.0, study.overload_rho)}
    jsq_cap = res["dispatch"].get("jsq", {}).get("capacity", math.nan)
    dispatch_pts = {}
    if math.isfinite(jsq_cap) and jsq_cap > 0:
        for name in study.dispatchers:
            cfg = scenario(study, d0, "niyama", {}, replicas=k, cluster_policy=name)
            dispatch_pts[name] = {rho: points.add(cfg, rho * jsq_cap) for rho in study.dispatch_rhos}
    diurnal_jobs = diurnal_jobs_of(study, res["goodput"][study.diurnal_dataset]["Sarathi-EDF"]["rate"]) \
        if study.diurnal_dataset in res["goodput"] else None
    log(f"fixed-rate runs: {len(points.jobs)} ({len(points.where)} points × {len(study.seeds)} seeds)"
        + (f", diurnal runs: {len(diurnal_jobs[1])}" if diurnal_jobs else ""))
    extra = []
    if diurnal_jobs:                       # longest jobs first, so the pool ends with short ones
        extra = [{"fn": judge_whole, "kw": j} for j in diurnal_jobs[1]]
    pts, extra_runs = points.run(executor, extra)

    for label, pid in ablation_pts.items():
        if label == "Sarathi-EDF":
            cap = edf_goodput
        elif label == "+SP (Niyama)":
            cap = ny_goodput
        elif reuse is not None:
            cap = reuse.get("ablation", {}).get(label, {}).get("goodput", math.nan)
        else:
            cap = found[("ablation", d0, label)]["rate"] if ("ablation", d0, label) in found else math.nan
        v = pts[pid]
        res["ablation"][label] = {"goodput": cap, "overload": v}
        log(f"ablation {label:<13} goodput {cap:.3g}  at {overload:.3g} QPS: violations {v['all'][0]:.1f} ± "
            f"{v['all'][1]:.1f}% ({v['stable_seeds']}/{len(study.seeds)} seeds stable)")
    for alpha, row in alpha_pts.items():
        res["alpha"][alpha] = {rho: pts[pid] for rho, pid in row.items()}
        log(f"alpha {alpha * 1e3:g} ms/token: " + ", ".join(
            f"ρ={rho:g}: {v['all'][0]:.1f}% (Q1 {v['Q1'][0]:.1f}%)" for rho, v in res["alpha"][alpha].items()))
    for rho, row in length_pts.items():
        res["lengths"][rho] = {label: pts[pid] for label, pid in row.items()}
        for label, v in res["lengths"][rho].items():
            log(f"lengths ρ={rho:g} {label:<13} by prompt: " + " ".join(
                f"{b['violations_pct'][0]:.1f}" for b in v["bins"]["prompt_tokens"]) + "  by decode: " + " ".join(
                f"{b['violations_pct'][0]:.1f}" for b in v["bins"]["output_tokens"]))
    for name, row in dispatch_pts.items():
        res["dispatch"][name]["points"] = {rho: pts[pid] for rho, pid in row.items()}
        log(f"dispatch {name:<15} {k} replicas: capacity {res['dispatch'][name]['capacity']:.3g} QPS ("
            f"{res['dispatch'][name]['per_replica']:.3g}/replica); " + ", ".join(
                f"ρ={rho:g}: {v['all'][0]:.1f}% (Q1 {v['Q1'][0]:.1f}, Q2 {v['Q2'][0]:.1f}, Q3 {v['Q3'][0]:.1f})"
                for rho, v in res["dispatch"][name]["points"].items()))
    _save(out, res)

    res["diurnal"] = diurnal_rows(diurnal_jobs[0], extra_runs, diurnal_jobs[2], log) if diurnal_jobs else {}
    _save(out, res)
    res["markdown"] = report(study, res)
    (out / "niyama_report.md").write_text(res["markdown"] + "\n")
    res["plots"] = plot_diurnal(res["diurnal"], out / "niyama_diurnal_p99.png") if res["diurnal"] else []
    return res
