"""The Markdown report of the Niyama study (`tierserve.experiments.niyama`)."""
from __future__ import annotations

import math
from typing import Any

from tierserve.experiments.niyama import (
    CALIBRATED, CALIBRATED_MODE, DECODE_BINS, DIURNAL_RATES, PROMPT_BINS, SEED_ABLATION, SEED_DIURNAL,
    SEED_GOODPUT, SEED_GPUS_50QPS, STACKS, Study,
)


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
