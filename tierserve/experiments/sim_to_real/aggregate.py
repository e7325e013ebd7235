"""sim_to_real --aggregate: finished runs (their summary.json) over seeds — mean and 95% interval per load and
side, the engine-side boundaries side by side, and the runs pooled per load."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tierserve.experiments.sim_to_real.boundaries import BOUNDARIES
from tierserve.experiments.sim_to_real.tables import BOOTSTRAP_SEED, bootstrap_quantile_ci
from tierserve.experiments.sim_to_real.workload import QUANTILES


def aggregate(outs: list[Path]) -> int:
    """Mean and 95% interval over seeds (runs) of each load's summary errors, engine- and client-side."""
    from tierserve.metrics.stability import mean_ci95
    runs = [json.loads((o / "summary.json").read_text()) for o in outs]
    caps = ", ".join(f"{r['capacity_rps']:.2f}" for r in runs)
    print(f"over {len(runs)} runs ({', '.join(str(o) for o in outs)}); capacity req/s: {caps}")
    if all("drifted" in r for r in runs):
        print("  machine drift within the validation run (table.txt 'drift verdict'): " + "; ".join(
            f"{o.name}: " + ", ".join(f"{k} {'DRIFTED' if v else 'steady'}" for k, v in r["drifted"].items())
            for o, r in zip(outs, runs)))
    for side in ("engine_side", "engine_side_same_run", "client_side", "speed_replay_core"):
        if not all(side in r for r in runs):
            print(f"  {side}: not in every run (rerun --reanalyse on older runs)")
            continue
        for load in runs[0][side]:
            cells = []
            for key, name in (("mean", "mean |err| P50/P90"), ("max", "max |err| P50/P90"),
                              ("within_10", "cells <= 10% (of 12)"), ("inside_ci", "inside real 95% CI (of 12)"),
                              ("p99_mean", "mean |err| P99")):
                if not all(key in r[side][load] for r in runs):
                    continue
                ci = mean_ci95([r[side][load][key] for r in runs])
                cells.append(f"{name} {ci.mean:.1f} ± {ci.half_width:.1f}")
            print(f"  {side.replace('_', '-'):11s} {load:14s} " + "; ".join(cells))
    sides = [s for s in ("engine_side", "engine_side_same_run", "client_side")
             if all(s in r and s + "_varied" in r for r in runs)]
    if sides:
        print("step-time variability, same step model without -> with (mean ± 95% half-width over the runs; TBT: "
              "signed error, mean over tiers):")
        keys = (("mean", "mean |err| P50/P90 TTFT+TTLT"), ("max", "max |err| P50/P90"),
                ("p99_mean", "mean |err| P99 TTFT+TTLT"), ("tbt_p50_err", "TBT P50 err"),
                ("tbt_p90_err", "TBT P90 err"), ("tbt_p99_err", "TBT P99 err"))
        for side in sides:
            for load in runs[0][side]:
                cells = []
                for key, name in keys:
                    if not all(key in r[side][load] for r in runs):
                        continue
                    a = mean_ci95([r[side][load][key] for r in runs])
                    b = mean_ci95([r[side + "_varied"][load][key] for r in runs])
                    cells.append(f"{name} {a.mean:.1f} ± {a.half_width:.1f} -> {b.mean:.1f} ± {b.half_width:.1f}")
                print(f"  {side.replace('_', '-'):20s} {load:14s} " + "; ".join(cells))
    boundary_table(runs)
    pooled_table(runs)
    return 0


def pooled_errors(runs: list[dict], side: str, load: str) -> dict:
    """Per tier, the runs' requests at one load pooled (real with real, simulated with simulated): signed error
    of each P50/P90/P99 of TTFT and TTLT, and whether the simulated value lies inside the pooled real value's
    95% bootstrap interval."""
    cells = {}
    for tier in runs[0][side][load]["samples"]["real"]:
        for mi, metric in enumerate(("ttft", "ttlt")):
            rv = np.concatenate([r[side][load]["samples"]["real"][tier][metric] for r in runs])
            sv = np.concatenate([r[side][load]["samples"]["sim"][tier][metric] for r in runs])
            ci = bootstrap_quantile_ci(rv, seed=(BOOTSTRAP_SEED, int(tier), mi))
            for qi, q in enumerate(QUANTILES):
                a, b = float(np.percentile(sv, q)), float(np.percentile(rv, q))
                cells[f"tier {tier} {metric} P{q}"] = ((a - b) / b * 100, bool(ci[qi, 0] <= a <= ci[qi, 1]), len(rv))
    return cells


def pooled_table(runs: list[dict]) -> None:
    """The runs pooled per load (3x the requests of one run): only where every run defines its loads alike."""
    loads = [r.get("loads") for r in runs]
    if any(v is None for v in loads):
        print("pooled runs: a run has no load definitions in its summary.json (rerun --reanalyse)")
        return
    if any(v != loads[0] for v in loads):
        print(f"pooled runs: not pooled, the runs' loads differ: {loads}")
        return
    if not all("samples" in r[s][load] for r in runs for s in ("engine_side", "client_side") for load in r[s]):
        print("pooled runs: no per-request samples in summary.json (rerun --reanalyse)")
        return
    print("pooled runs: per load and tier, every run's requests together, real vs simulated percentiles; the loads "
          "are the same definition in every run (" + "; ".join(f"{k}: rho {v['frac']:.2f} of the run's own measured "
                                                               f"capacity, {v['requests']} requests"
                                                               for k, v in loads[0].items())
          + "), so the absolute rates differ with each run's capacity:")
    models = (("client_side", "client-side"), ("engine_side", "held-out calibration"),
              ("engine_side_same_run", "own-log fit"))
    for model, model_name in models:
        for boundary in (("stamp",) if model == "client_side" else BOUNDARIES):
            side = model + ("" if boundary == "stamp" else "_" + boundary)
            if not all(side in r for r in runs):
                continue
            for load in runs[0][side]:
                cells = pooled_errors(runs, side, load)
                target = {k: v for k, v in cells.items() if k.split()[2] in ("ttft", "ttlt") and k.split()[3] != "P99"}
                p99 = [abs(e) for k, (e, _, _) in cells.items() if k.endswith("P99")]
                worst = sorted(target.items(), key=lambda kv: -abs(kv[1][0]))[:3]
                where = f" [{boundary}]" if model != "client_side" else ""
                print(f"  {model_name}{where}, {load}: mean |err| P50/P90 "
                      f"{np.mean([abs(e) for e, _, _ in target.values()]):.1f}%, cells <= 10% "
                      f"{sum(abs(e) <= 10 for e, _, _ in target.values())}/{len(target)}, inside pooled real 95% CI "
                      f"{sum(i for _, i, _ in target.values())}/{len(target)}; mean |err| P99 {np.mean(p99):.1f}%; "
                      f"worst: " + ", ".join(f"{k} {e:+.1f}%{'*' if i else ''} (n {n})" for k, (e, i, n) in worst))


def boundary_table(runs: list[dict]) -> None:
    """The engine-side errors at each boundary (`engine_entry`), side by side: mean ± 95% half-width over runs."""
    from tierserve.metrics.stability import mean_ci95
    keys = (("mean", "mean |err| P50/P90", "{:.1f}"), ("max", "max |err| P50/P90", "{:.1f}"),
            ("within_10", "cells <= 10% (of 12)", "{:.1f}"), ("inside_ci", "inside real 95% CI (of 12)", "{:.1f}"),
            ("p99_mean", "mean |err| P99", "{:.1f}"),
            ("p99_max", "max |err| P99", "{:.1f}"), ("tbt_p50_err", "TBT P50 err", "{:+.1f}"),
            ("tbt_p90_err", "TBT P90 err", "{:+.1f}"), ("tbt_p99_err", "TBT P99 err", "{:+.1f}"))
    models = (("engine_side", "held-out calibration"), ("engine_side_same_run", "own-log fit"))
    if not all(m + "_queue" in r for m, _ in models for r in runs):
        print("engine boundaries: not in every run (rerun --reanalyse)")
        return
    print("engine-side boundary (the simulated engine receives each request, and real latencies are measured, from): "
          "stamp = vLLM's arrival stamp; queue = entry into the engine core's scheduler queue; core = the earliest it "
          "can have reached the core. Mean ± 95% half-width over the runs:")
    for model, model_name in models:
        for varied in ("", "_varied"):
            for load in runs[0][model]:
                print(f"  {model_name}{' + variability' if varied else ''}, {load}:")
                for key, name, fmt in keys:
                    cells = []
                    for boundary in BOUNDARIES:
                        side = model + ("" if boundary == "stamp" else "_" + boundary) + varied
                        vals = [r[side][load][key] for r in runs if key in r[side][load]]
                        if len(vals) < len(runs):
                            continue
                        ci = mean_ci95(vals)
                        cells.append(f"{boundary} {fmt.format(ci.mean)} ± {ci.half_width:.1f}")
                    if cells:
                        print(f"    {name:22s} " + "   ".join(cells))
                print("    " + bracket_verdict([r[model + "_core" + varied][load] for r in runs],
                                             [r[model + "_queue" + varied][load] for r in runs]))


def bracket_verdict(core: list[dict], queue: list[dict]) -> str:
    """The engine really received each request between its 'core' and 'queue' boundaries: per run, the P50/P90
    TTFT/TTLT cells within 10% at both, and those beyond 10% on the same side at both (a miss at either bound)."""
    if not all("signed" in s for s in core + queue):
        return "bracket: no per-cell errors (rerun --reanalyse)"
    within, missed, names = [], [], []
    for c, q in zip(core, queue):
        cells = [k for k in c["signed"] if k.split()[2] in ("ttft", "ttlt") and k.split()[3] in ("P50", "P90")]
        within.append(sum(abs(c["signed"][k]) <= 10 and abs(q["signed"][k]) <= 10 for k in cells))
        both = {k: (c["signed"][k], q["signed"][k]) for k in cells}
        miss = [k for k, (a, b) in both.items() if min(a, b) > 10 or max(a, b) < -10]
        missed.append(len(miss))
        names.append(", ".join(f"{k} {c['signed'][k]:+.0f}..{q['signed'][k]:+.0f}%" for k in miss) or "none")
    return (f"bracket core..queue, cells (of 12) within 10% at both: {' / '.join(map(str, within))}; beyond 10% on "
            f"the same side at both: {' / '.join(map(str, missed))} (per run) — " + "; ".join(names))
