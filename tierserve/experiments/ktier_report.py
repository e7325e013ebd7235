"""Tables, CSV, plots and the Markdown report of the K-tier study (`tierserve.experiments.ktier`), and `run_study`:
the study run whole (its runs, then this report; here so that the study module never imports its report)."""
from __future__ import annotations

import csv
import json
import math
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Sequence

from tierserve.experiments.ktier import (
    ATTAINMENT_GOAL, CLASS_NAMES, COST_FORMULA, NUM_CLASSES, POISSON, RECOVERY_TOLERANCE, RECOVERY_WINDOW_S,
    SEED_TABLE, Arrival, CapacityRow, RunSetup, Stack, Study, _cap_key, ladder_ttft_s, recovery_s, verdict_of,
)
import time
from tierserve.experiments.runs import run_many
from tierserve.experiments.ktier import _baseline, _call, capacity_job, gpus_job, ktier_stack, ladder_stacks, llumnix_two_level, point_job, run_point, seed_setup_job


# ---- tables ---------------------------------------------------------------------------------------------
def _ci(values: Sequence[float]):
    from tierserve.metrics.stability import mean_ci95
    return mean_ci95(values)


def _fmt_ci(iv, digits: int = 3) -> str:
    if not math.isfinite(iv.mean):
        return "—"
    if not math.isfinite(iv.half_width):
        return f"{iv.mean:.{digits}f}"
    return f"{iv.mean:.{digits}f} ± {iv.half_width:.{digits}f}"


def _fmt(x: Any, digits: int = 2) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        if math.isnan(x):
            return "—"
        if math.isinf(x):
            return "∞"
        return f"{x:.{digits}f}"
    return str(x)


def stack_name(st: Stack) -> str:
    return f"{st.label} (K={st.k})"


def capacity_table(caps: list[CapacityRow], c_base: dict) -> list[dict[str, Any]]:
    rows = []
    for r in caps:
        base = c_base.get(_cap_key(r.setup, r.arrival), math.nan)
        row = {"group": r.group, "stack": stack_name(r.stack), "local": r.stack.local_policy,
               "cluster": r.stack.cluster_policy, "K": r.stack.k, "arrival": r.arrival.label,
               "setup": r.setup.label, "capacity_rps": r.rate, "saturated": r.saturated,
               "capacity_x_baseline": r.rate / base if base > 0 else math.nan,
               "per_replica_rps": r.rate / r.setup.num_replicas, "stable_only_rps": r.stable_rate,
               "fails_at_rps": r.fails_at, "runs": f"{r.lengths[0]}–{r.lengths[1]}"}
        for c in CLASS_NAMES:
            row[f"{c}_rps"] = r.class_rates.get(c, math.nan)
        row.update({"verdict_at_capacity": r.verdict_at_capacity, "fails_above": r.fails_above,
                    "live_migrations": r.migrations_live, "queued_migrations": r.migrations_queued,
                    "downtime_p99_ms": r.downtime_p99_ms, "probes": r.probes, "lo": r.lo, "hi": r.hi,
                    "seeds": len(r.seeds), "rel_tol": r.rel_tol})
        rows.append(row)
    return rows


def rho_table(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for p in points:
        if p["tag"] == "rho":
            groups.setdefault((p["arrival"].label, p["stack"].label, p["stack"].k, p["rho"]), []).append(p)
    rows = []
    for (arr, lab, kk, rho), ps in groups.items():
        runs = [p["run"] for p in ps]
        row: dict[str, Any] = {"arrival": arr, "stack": f"{lab} (K={kk})", "rho": rho,
                               "rho_of": f"fcfs capacity under {ps[0]['rho_of']}", "rate_rps": ps[0]["rate"],
                               "seeds": len(runs), "verdict": verdict_of(runs)}
        row["all_attainment"] = _ci([r.summary.all.slo_attainment for r in runs])
        for c in CLASS_NAMES:
            row[f"{c}_attainment"] = _ci([r.summary.tiers[c].slo_attainment for r in runs])
        row["classes_meeting_goal"] = _ci([sum(t.slo_attainment >= t.attainment_goal for t in r.summary.per_tier)
                                           for r in runs])
        row["c0_ttft_p99_s"] = _ci([r.summary.tiers["c0"].ttft.p99 for r in runs])
        for c in (0, 4, 9):
            row[f"c{c}_ttft_p50_s"] = _ci([r.summary.tiers[f"c{c}"].ttft.p50 for r in runs])
        st = ps[0]["stack"]
        aware = st.k > 1 and (st.local_policy, st.cluster_policy) != ("vllm", "infaas")
        # priority inversion: c0 (always in the top tier) waits over twice as long at the median as c9 (always the
        # bottom tier); "twice" so that equal medians at light load, which differ by noise, do not count
        row["inversion"] = aware and row["c0_ttft_p50_s"].mean > 2.0 * row["c9_ttft_p50_s"].mean
        ex = [r.summary.extras for r in runs]
        row["live_migrations"] = _ci([e["migrations_live_committed"] for e in ex])
        row["queued_migrations"] = _ci([e["migrations_queued"] for e in ex])
        row["downtime_p99_ms"] = _ci([1e3 * e["migration_downtime_p99_s"] for e in ex])
        row["preemptions"] = _ci([e["preemptions"] for e in ex])
        rows.append(row)
    rows.sort(key=lambda r: (r["arrival"] != "poisson", r["arrival"], r["stack"], r["rho"]))
    return rows


def overload_table(points: list[dict[str, Any]], arrival: Arrival) -> list[dict[str, Any]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for p in points:
        if p["tag"] == "overload":
            groups.setdefault(stack_name(p["stack"]), []).append(p)
    rows = []
    for name, ps in groups.items():
        runs = [p["run"] for p in ps]
        eps = [r.summary.extras["episode"] for r in runs]
        row: dict[str, Any] = {"stack": name, "base_rho": ps[0]["rho"], "base_rate_rps": ps[0]["rate"],
                               "seeds": len(runs), "verdict": verdict_of(runs)}
        row["c0_pre_attainment"] = _ci([e["pre_attainment"][0] for e in eps])
        for c in range(NUM_CLASSES):
            row[f"c{c}_burst_attainment"] = _ci([e["burst_attainment"][c] for e in eps])
        for c in range(1, NUM_CLASSES):
            rec = [recovery_s(e, c) for e in eps]
            fin = [x for x in rec if math.isfinite(x)]
            row[f"c{c}_recovery_s"] = _ci(fin) if len(fin) == len(rec) else None
            row[f"c{c}_not_recovered"] = len(rec) - len(fin)
        rows.append(row)
    return rows


def _cell(v: Any) -> str:
    from tierserve.metrics.stability import Interval
    if isinstance(v, Interval):
        return _fmt_ci(v, 2 if abs(v.mean) >= 10 else 3)
    if isinstance(v, bool):
        return "yes" if v else ""
    if isinstance(v, float):
        return _fmt(v, 3 if abs(v) < 10 else 1)
    return _fmt(v)


def md_table(rows: list[dict[str, Any]], cols: list[str], headers: list[str] | None = None) -> str:
    lines = ["| " + " | ".join(headers or cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(c)) for c in cols) + " |")
    return "\n".join(lines)


def _csv_value(v: Any) -> Any:
    from tierserve.metrics.stability import Interval
    if isinstance(v, Interval):
        return v.mean
    return v


def write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    """Intervals become two columns: the mean and `<name>_ci95` (the half-width)."""
    from tierserve.metrics.stability import Interval
    if not rows:
        path.write_text("")
        return
    cols: list[str] = []
    for c in rows[0]:
        cols.append(c)
        if isinstance(rows[0][c], Interval):
            cols.append(f"{c}_ci95")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=cols)
        w.writeheader()
        for r in rows:
            d = {}
            for c, v in r.items():
                d[c] = _csv_value(v)
                if isinstance(v, Interval):
                    d[f"{c}_ci95"] = v.half_width
            w.writerow(d)


def seed_table(seed_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    base = {r["requests"]: r for r in seed_rows if r["system"] == "baseline"}
    out = []
    for r in seed_rows:
        b = base[r["requests"]]

        def x(m: str) -> float:
            return b[m] / r[m] if r[m] > 0 else math.nan
        gain = 1.0 - (r["gpu_s"] * r["e2e_mean"]) / (b["gpu_s"] * b["e2e_mean"])
        seed = SEED_TABLE.get((r["requests"], r["K"])) if r["system"] == "llumnix_k" else None
        out.append({"system": r["system"], "K": r["K"], "requests": r["requests"],
                    "prefill_p99_x": x("ttft_p99"), "seed_prefill_p99_x": seed[0] if seed else None,
                    "prefill_mean_x": x("ttft_mean"), "seed_prefill_mean_x": seed[1] if seed else None,
                    "e2e_p99_x": x("e2e_p99"), "seed_e2e_p99_x": seed[2] if seed else None,
                    "e2e_mean_x": x("e2e_mean"), "seed_e2e_mean_x": seed[3] if seed else None,
                    "cost_latency_gain": gain, "seed_cost_latency_gain": seed[4] if seed else None,
                    "ttft_mean_s": r["ttft_mean"], "finished": r["finished"], "censored": r["censored"]})
    return out


def ktier_vs_local(caps: list[CapacityRow], ladder_k: int) -> list[dict[str, Any]]:
    """Every stack with global (llumnix) dispatch against local priority alone (infaas + vllm_priority) in the
    same setup and arrival process, at the same K where that was measured, else at the controls' K."""
    def key(setup: RunSetup) -> RunSetup:
        return replace(setup, bandwidth_gbytes_s=1.0)     # without migration, bandwidth changes nothing
    ref = {(key(r.setup), r.arrival, r.stack.k): r for r in caps if r.stack.label == "local_prio"}
    out = []
    for r in caps:
        if r.stack.cluster_policy == "infaas":
            continue
        lp = ref.get((key(r.setup), r.arrival, r.stack.k)) or ref.get((key(r.setup), r.arrival, ladder_k))
        if lp is None:
            continue
        out.append({"setup": r.setup.label, "arrival": r.arrival.label, "stack": stack_name(r.stack),
                    "capacity_rps": r.rate, "local_prio": stack_name(lp.stack), "local_prio_rps": lp.rate,
                    "gain_x": r.rate / lp.rate if lp.rate > 0 else math.nan,
                    "note": " / ".join(n for n, sat in (("stack ≥ (top passed)", r.saturated),
                                                        ("local ≥ (top passed)", lp.saturated)) if sat),
                    "verdict_at_capacity": r.verdict_at_capacity})
    return out


def plots(study: Study, rho_rows: list[dict[str, Any]], caps: list[CapacityRow], out: Path) -> list[Path]:
    from tierserve.report.plots import _pyplot, _save
    plt = _pyplot()
    paths = []
    for arr in sorted({r["arrival"] for r in rho_rows}):
        fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
        for stack in sorted({r["stack"] for r in rho_rows if r["arrival"] == arr}):
            sel = sorted((r for r in rho_rows if r["arrival"] == arr and r["stack"] == stack), key=lambda r: r["rho"])
            xs = [r["rho"] for r in sel]
            for ax, col in zip(axes, ("c0_attainment", "c9_attainment", "classes_meeting_goal")):
                ys = [r[col].mean for r in sel]
                es = [r[col].half_width if math.isfinite(r[col].half_width) else 0.0 for r in sel]
                ax.errorbar(xs, ys, yerr=es, marker="o", capsize=3, label=stack)
        titles = ("c0 (TTFT ≤ 0.5 s) attainment", f"c9 (TTFT ≤ {ladder_ttft_s(9):.1f} s) attainment",
                  f"classes meeting the {ATTAINMENT_GOAL:.0%} goal (of 10)")
        for ax, t in zip(axes, titles):
            ax.set_xlabel("ρ = rate / FCFS baseline capacity")
            ax.set_title(t, fontsize=9)
            ax.grid(alpha=0.3)
        axes[0].legend(fontsize=7)
        fig.suptitle(f"Attainment vs load, {arr} arrivals (mean ± 95% over seeds)", fontsize=10)
        paths.append(_save(fig, out / f"attainment_vs_rho_{arr}.png"))
    main = [r for r in caps if r.setup == study.setup and r.arrival == POISSON]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for lab in ("llumnix_k", "adaptive"):
        sel = sorted((r for r in main if r.stack.label == lab and r.group in ("K sweep", "controls")),
                     key=lambda r: r.stack.k)
        if sel:
            ax.plot([r.stack.k for r in sel], [r.rate for r in sel], marker="o", label=lab)
    for r in main:
        if r.stack.label in ("fcfs", "local_prio") and r.stack.k == study.ladder_k:
            ax.axhline(r.rate, linestyle="--", linewidth=1, color="grey" if r.stack.label == "fcfs" else "black",
                       label=f"{r.stack.label} (K={r.stack.k})")
    ax.set_xlabel("K (tiers the scheduler sees)")
    ax.set_ylabel("capacity (req/s, every class meets its goal)")
    ax.set_title(f"Capacity vs K (±{study.rel_tol:.0%} bisection), {study.setup.num_replicas} replicas", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    paths.append(_save(fig, out / "capacity_vs_k.png"))
    return paths


def write_report(study: Study, out: Path, caps: list[CapacityRow], points: list[dict[str, Any]],
                 gpus: list[dict[str, Any]], seed_rows: list[dict[str, Any]], base_cap: dict,
                 wall_s: float) -> dict[str, Any]:
    s0 = study.setup
    cap_rows = capacity_table(caps, base_cap)
    rho_rows = rho_table(points)
    over_rows = overload_table(points, study.overload)
    vs_local = ktier_vs_local(caps, study.ladder_k)
    seed_rows_t = seed_table(seed_rows)
    gpu_rows = gpus_table(gpus)
    write_csv(cap_rows, out / "ktier_capacity.csv")
    write_csv(rho_rows, out / "ktier_rho.csv")
    write_csv(over_rows, out / "ktier_overload.csv")
    write_csv(vs_local, out / "ktier_vs_local_priority.csv")
    write_csv(gpu_rows, out / "ktier_gpus.csv")
    write_csv(seed_rows_t, out / "ktier_seed_table.csv")
    pngs = plots(study, rho_rows, caps, out)
    c_base = base_cap[_cap_key(s0, POISSON)]
    md = markdown(study, cap_rows, rho_rows, over_rows, vs_local, gpu_rows, seed_rows_t, c_base, wall_s)
    (out / "ktier_report.md").write_text(md)
    meta = {"study": _jsonable(asdict(study)), "wall_s": wall_s, "baseline_capacity_rps": c_base,
            "ladder_ttft_s": [ladder_ttft_s(c) for c in range(NUM_CLASSES)], "attainment_goal": ATTAINMENT_GOAL,
            "recovery": {"window_s": RECOVERY_WINDOW_S, "tolerance": RECOVERY_TOLERANCE}}
    (out / "ktier_meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return {"capacity": cap_rows, "rho": rho_rows, "overload": over_rows, "vs_local": vs_local, "gpus": gpu_rows,
            "seed_table": seed_rows_t, "markdown": md, "plots": pngs, "baseline_capacity_rps": c_base,
            "wall_s": wall_s}


def gpus_table(gpus: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per stack: GPUs needed at the lower and the higher load, and whether the higher needs at most
    (load ratio) × the lower + 1 (`linear`)."""
    by_stack: dict[str, list[dict[str, Any]]] = {}
    for g in gpus:
        by_stack.setdefault(stack_name(g["stack"]), []).append(g)
    rows = []
    for name, gs in by_stack.items():
        low, high = sorted(gs, key=lambda g: g["rate"])[0], sorted(gs, key=lambda g: g["rate"])[-1]
        factor = high["rate"] / low["rate"]
        bound = factor * low["gpus"] + 1
        rows.append({"stack": name, "rate_low_rps": low["rate"], "gpus_low": low["gpus"],
                     "rate_high_rps": high["rate"], "gpus_high": high["gpus"], "bound": bound,
                     "linear": "yes" if high["gpus"] <= bound else "NO",
                     "checked": "; ".join(f"{g['rate']:.3g} req/s N={n}: {'pass' if v['passes'] else 'fail'} "
                                          f"({v['verdict']}" + (f"; {v['why']}" if v["why"] else "") + ")"
                                          for g in (low, high) for n, v in g["checked"].items())})
    return rows


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x


def setup_lines(study: Study) -> list[str]:
    """The setup, SLO ladder and statistics sentences every K-tier report opens with."""
    s0 = study.setup
    ladder = ", ".join(f"{c} {ladder_ttft_s(i):.2f} s" for i, c in enumerate(CLASS_NAMES))
    return [
         f"Setup: {s0.num_replicas} × {s0.model}/{s0.gpu} replicas, vLLM v1 batch shape (token budget "
         f"{s0.token_budget}, {s0.max_num_seqs} sequences) for every stack, exec model `{s0.exec_mode}`, migration "
         f"{s0.bandwidth_gbytes_s:g} GB/s; runs of {s0.num_requests} requests, doubled while the work verdict is "
         f"undecided up to {s0.max_requests} (Azure-2023 conversation lengths clipped to {s0.max_total_tokens} "
         f"tokens; each capacity row states the lengths its runs took), seeds {list(study.seeds)}.",
         f"SLO ladder (fixed for every K): ten classes, 10% each, TTFT targets {ladder}; goal {ATTAINMENT_GOAL:.0%} "
         f"per class. A K-tier scheduler sees class c as tier ⌊c·K/10⌋.",
         "Statistics: from the end of the warm-up the verdict found (MSER on the unfinished work) to the last "
         "arrival; mean ± 95% Student-t half-width over seeds. Verdict: seeds whose unfinished work (prefill + "
         "decode tokens still to compute) does not grow with run length beyond 2% of the arriving work "
         "(`tierserve.metrics.stability`, the work verdict)."]


def markdown(study: Study, cap_rows, rho_rows, over_rows, vs_local, gpu_rows, seed_rows, c_base: float,
             wall_s: float) -> str:
    s0 = study.setup
    L = [f"# K-tier study (seed 000), capacity-normalised", "", *setup_lines(study),
         f"Capacity: bisection over rate to ±{study.rel_tol:.0%} with common random numbers (capacity rule in "
         f"`tierserve.experiments.capacity`). Baseline `fcfs` (INFaaS + vLLM FCFS) capacity under Poisson arrivals: "
         f"**{c_base:.2f} req/s** ({c_base / s0.num_replicas:.2f} per replica); ρ = rate / the baseline's capacity "
         f"under the same arrival process. Capacity interval: [capacity, `fails_at`), the lowest failing rate probed.",
         ""]
    inv50 = [r for r in rho_rows if r["stack"].startswith("llumnix_50pct")]
    inv_rhos = ", ".join(f"{r['rho']:g}" for r in inv50 if r["inversion"])
    inv_note = ("**a priority inversion here**: its top tier (c0) waits over twice as long at the median as its bottom "
                "tier "
                f"(c9) at ρ = {inv_rhos}"
                if any(r["inversion"] for r in inv50) else
                "no inversion measured here (c0's median TTFT is never twice c9's at the loads run)" if inv50 else
                "not run in the load sweep")
    L += ["## Stacks", "",
          "- `fcfs`: INFaaS-style dispatch — each request to the instance with the least committed KV (held blocks + "
          "prompt blocks of everything queued) among those whose free blocks fit its prompt, else the least loaded; "
          "no priority, no migration — on vLLM v1 FCFS replicas. The baseline.",
          "- `local_prio`: the same dispatch on vLLM v1 priority replicas (priority = tier).",
          "- `headroom`: `llumnix_k` dispatch (freeness with per-tier headroom H_p = 0.2·M·3^−p, strict tier order) "
          "with migration and the global hold off, on FCFS replicas; `both`: the same on priority replicas; "
          "`+migration`: live migration on; `+hold`: requests held in the global queue while every instance is "
          "busy; `llumnix_k`: the seed's full system (all of that, llumlet replicas = priority with running "
          "requests also served in tier order); `adaptive`: `llumnix_k_adaptive` (SLO-driven budgets, promotion "
          "after 5 s, never into tier 0).",
          "- `llumnix_10pct`: Llumnix's two-level policy (flat M − 100-block headroom for its high level) with c0 "
          "(10% of traffic) high — Llumnix's own priority ratio. `llumnix_50pct`: c0–c4 (50%) high — "
          f"{inv_note}.", ""]
    cap_cols = ["group", "stack", "arrival", "setup", "capacity_rps", "fails_at_rps", "runs", "saturated",
                "capacity_x_baseline", "stable_only_rps"] + [f"{c}_rps" for c in CLASS_NAMES] + [
        "verdict_at_capacity", "fails_above", "live_migrations", "queued_migrations", "downtime_p99_ms"]
    L += ["## Capacity (req/s; per stack and per class)", "",
          "`saturated`: the bracket's top passed, so capacity is at least that. Per-class columns: the highest rate at "
          "which that class alone meets its goal with a stable queue. Migrations: mean per run at the capacity rate.",
          "", md_table(cap_rows, cap_cols), ""]
    L += ["## K-tier dispatch against local priority alone (capacity, same setup)", "",
          f"Capacities are bisected to ±{study.rel_tol:.0%}, so a gain within about that of 1.00 is no difference.", "",
          md_table(vs_local, ["setup", "arrival", "stack", "capacity_rps", "local_prio", "local_prio_rps", "gain_x",
                              "note", "verdict_at_capacity"]), ""]
    lin = all(r["linear"] == "yes" for r in gpu_rows)
    L += [f"## GPUs needed to meet every class's SLO at 1× and {study.gpus_factor:g}× the baseline's capacity", "",
          f"`linear`: the higher load needs at most {study.gpus_factor:g}× the GPUs of the lower + 1 "
          f"({'every stack' if lin else 'NOT every stack'}). Each N is judged by the same work verdict and run "
          "lengths as the capacities.", "",
          md_table(gpu_rows, ["stack", "rate_low_rps", "gpus_low", "rate_high_rps", "gpus_high", "bound", "linear",
                              "checked"]), ""]
    two = [r for r in cap_rows if r["group"] == "run length ×2"]
    base = [r for r in cap_rows if r["group"] == "controls" and r["stack"] == two[0]["stack"]] if two else []
    if two and base:
        a, b = base[0], two[0]
        overlap = a["capacity_rps"] < b["fails_at_rps"] and b["capacity_rps"] < a["fails_at_rps"]
        L += ["## Capacity at two run lengths", "",
              f"{a['stack']}: runs of {a['runs']} requests give [{a['capacity_rps']:.3g}, {a['fails_at_rps']:.3g}) "
              f"req/s; every run twice as long ({b['runs']}) gives [{b['capacity_rps']:.3g}, "
              f"{b['fails_at_rps']:.3g}) req/s: the intervals {'overlap' if overlap else 'DO NOT overlap'}.", ""]
    rho_cols = ["arrival", "stack", "rho", "rho_of", "rate_rps", "verdict", "all_attainment", "c0_attainment",
                "c4_attainment", "c9_attainment", "classes_meeting_goal", "c0_ttft_p99_s", "c0_ttft_p50_s",
                "c9_ttft_p50_s", "inversion",
                "live_migrations", "queued_migrations", "downtime_p99_ms"]
    L += ["## Attainment vs ρ (mean ± 95% over seeds)", "", md_table(rho_rows, rho_cols), ""]
    ov = study.overload
    rec_cols = [f"c{c}_recovery_s" for c in range(1, NUM_CLASSES)]
    L += [f"## Overload episode: Poisson at ρ = {study.overload_rho:g}, {ov.burst_factor:g}× for {ov.burst_s:g} s "
          f"from t = {ov.pre_s:g} s, then {ov.post_s:g} s at ρ = {study.overload_rho:g}", "",
          f"Tier-0 isolation: c0's attainment over arrivals during the burst (pre: from {ov.warm_s:g} s to the burst). "
          f"Recovery of class c: seconds from the burst's end to the first {RECOVERY_WINDOW_S:g}-s arrival window "
          f"that, with the next window, has attainment ≥ its pre-episode attainment − {RECOVERY_TOLERANCE:.2f}; "
          f"'—' where some seed did not recover before the arrivals ended (count in the CSV).", "",
          md_table(over_rows, ["stack", "verdict", "c0_pre_attainment", "c0_burst_attainment", "c9_burst_attainment"]
                   + rec_cols), ""]
    L += ["## The seed's table at the seed's own setup (labelled; no conclusions drawn from it)", "",
          f"{study.seed_replicas} replicas at {study.seed_rate_per_replica:g} req/s each, uniform tiers with the "
          f"project's default per-K SLOs, one seed, whole-run statistics (not steady state), as the seed reported. "
          f"Speedup = INFaaS+vLLM value / system value; {COST_FORMULA}.", "",
          md_table(seed_rows, ["system", "K", "requests", "prefill_p99_x", "seed_prefill_p99_x", "prefill_mean_x",
                               "seed_prefill_mean_x", "e2e_p99_x", "seed_e2e_p99_x", "e2e_mean_x", "seed_e2e_mean_x",
                               "cost_latency_gain", "seed_cost_latency_gain", "finished", "censored"]), ""]
    return "\n".join(L) + "\n"


# ---- the study run whole: its runs, then this report ---------------------------------------------------
def run_study(study: Study, out: Path, executor: str = "process", progress: bool = True) -> dict[str, Any]:
    """Run everything, write CSV/JSON/Markdown/PNG under `out`, return the tables."""
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    s0, k = study.setup, study.ladder_k
    seeds, tol = tuple(study.seeds), study.rel_tol
    variants = study.variants()
    lo_r, hi_r = study.baseline_bracket_per_replica
    # forked workers inherit the parent's loaded modules and cached model fits: one study, one code version
    warm = ladder_stacks(k) + [ktier_stack(k, adaptive=True), llumnix_two_level(1)]
    for s in variants.values():
        for st in warm if s == s0 else warm[:1]:
            run_point(st, replace(s, num_replicas=2, num_requests=20), POISSON, 1.0, 0)

    # Phase 1: the baseline's capacity for every arrival process and setup (ρ and brackets come from it).
    base_jobs: list[dict[str, Any]] = []
    arrivals = (POISSON,) + tuple(study.bursty_arrivals)
    for a in arrivals:
        base_jobs.append(dict(group="controls" if a == POISSON else f"arrival {a.label}", stack=_baseline(k),
                              setup=s0, arrival=a, lo=lo_r * s0.num_replicas, hi=hi_r * s0.num_replicas,
                              seeds=seeds, rel_tol=tol))
    for name, s in variants.items():
        if name and (s.token_budget, s.exec_mode, s.model) != (s0.token_budget, s0.exec_mode, s0.model):
            base_jobs.append(dict(group=f"sensitivity {name}", stack=_baseline(k), setup=s, arrival=POISSON,
                                  lo=lo_r * s.num_replicas, hi=hi_r * s.num_replicas, seeds=seeds, rel_tol=tol))
    base_rows: list[CapacityRow] = run_many(capacity_job, base_jobs, executor=executor, progress=progress,
                                            description="ktier: baseline capacity")
    base_cap = {_cap_key(r.setup, r.arrival): r.rate for r in base_rows}
    for name, s in variants.items():   # bandwidth changes nothing without migration: reuse the main baseline
        base_cap.setdefault(_cap_key(s, POISSON), base_cap[_cap_key(s0, POISSON)])
    c_base = base_cap[_cap_key(s0, POISSON)]
    if not (c_base > 0):
        raise RuntimeError(f"the baseline's capacity was not found in [{lo_r}, {hi_r}] req/s per replica")

    def bracket(s: RunSetup, a: Arrival) -> tuple[float, float]:
        c = base_cap[_cap_key(s, a)]
        if not (c > 0):
            c = lo_r * s.num_replicas
        return study.bracket[0] * c, study.bracket[1] * c

    # Phase 2: every other capacity search, the load sweeps, the overload episode, GPUs needed, the seed's table.
    cap_jobs: list[dict[str, Any]] = []

    def add_cap(group: str, stack: Stack, s: RunSetup = s0, a: Arrival = POISSON) -> None:
        lo, hi = bracket(s, a)
        cap_jobs.append(dict(group=group, stack=stack, setup=s, arrival=a, lo=lo, hi=hi, seeds=seeds, rel_tol=tol))

    full_ladder = ladder_stacks(k)
    ladder = [st for st in full_ladder if st.label in study.controls]
    for st in ladder[1:]:
        add_cap("controls", st)
    for kk in study.ks:
        if kk != k:
            add_cap("K sweep", ktier_stack(kk))
    for kk in study.adaptive_ks:
        add_cap("K sweep", ktier_stack(kk, adaptive=True))
    if study.ladder_k != 10 and 10 in study.ks:
        add_cap("K sweep", Stack("local_prio", "vllm_priority", "infaas", 10))   # local priority at full resolution
    if study.two_level:
        add_cap("two-level llumnix", llumnix_two_level(1))
        add_cap("two-level llumnix", llumnix_two_level(5))
    for name, s in variants.items():
        if not name:
            continue
        if s.bandwidth_gbytes_s == s0.bandwidth_gbytes_s:
            add_cap(f"sensitivity {name}", full_ladder[1], s)
        add_cap(f"sensitivity {name}", full_ladder[-1], s)

    point_jobs: list[dict[str, Any]] = []
    by_label = {st.label: st for st in full_ladder}
    for rho in study.rhos:
        for st in ladder:
            for sd in seeds:
                point_jobs.append(dict(tag="rho", stack=st, setup=s0, arrival=POISSON, rate=rho * c_base, seed=sd,
                                       rho=rho, rho_of=POISSON.label))
    if study.two_level:
        for rho in study.two_level_rhos:
            for st in (llumnix_two_level(1), llumnix_two_level(5)):
                for sd in seeds:
                    point_jobs.append(dict(tag="rho", stack=st, setup=s0, arrival=POISSON, rate=rho * c_base,
                                           seed=sd, rho=rho, rho_of=POISSON.label))
    for a in study.bursty_arrivals:
        ca, of = base_cap[_cap_key(s0, a)], a.label
        if not (ca > 0):     # no capacity under this arrival process even at the bracket's bottom: use Poisson's
            ca, of = c_base, POISSON.label
        for rho in study.bursty_rhos:
            for lab in study.bursty_stacks:
                for sd in seeds:
                    point_jobs.append(dict(tag="rho", stack=by_label[lab], setup=s0, arrival=a, rate=rho * ca,
                                           seed=sd, rho=rho, rho_of=of))
    for st in ladder:
        for sd in seeds:
            point_jobs.append(dict(tag="overload", stack=st, setup=s0, arrival=study.overload,
                                   rate=study.overload_rho * c_base, seed=sd, rho=study.overload_rho,
                                   rho_of=POISSON.label))

    # GPUs needed at 1× and gpus_factor× the baseline's capacity: the cost must grow at most linearly in load
    gpu_jobs = [dict(label=st.label, stack=st, setup=s0, rate=f * c_base, start=int(math.ceil(f * s0.num_replicas)),
                     max_n=2 * int(math.ceil(f * s0.num_replicas)) + 2, seeds=seeds)
                for f in (1.0, study.gpus_factor) for st in ladder]
    # the baseline's capacity again with every run twice as long: it must fall in the first one's interval
    longer = replace(s0, num_requests=2 * s0.num_requests, max_requests=2 * s0.max_requests)
    lo2, hi2 = bracket(s0, POISSON)
    cap_jobs.append(dict(group="run length ×2", stack=_baseline(k), setup=longer, arrival=POISSON, lo=lo2, hi=hi2,
                         seeds=seeds, rel_tol=tol))

    seed_jobs = []
    for n in study.seed_requests:
        seed_jobs.append(dict(system="baseline", local="vllm", cluster="infaas", k=max(study.seed_ks)))
        seed_jobs[-1].update(num_requests=n)
        for kk in study.seed_ks:
            seed_jobs.append(dict(system="llumnix_k", local="llumlet", cluster="llumnix_k", k=kk, num_requests=n))
    for j in seed_jobs:
        j.update(num_replicas=study.seed_replicas, rate_per_replica=study.seed_rate_per_replica, model=s0.model,
                 gpu=s0.gpu)

    # one pool for everything: long jobs first so the pool does not end on a straggler
    tagged = ([("gpus", gpus_job, j) for j in gpu_jobs] + [("cap", capacity_job, j) for j in cap_jobs]
              + [("seed", seed_setup_job, j) for j in seed_jobs] + [("point", point_job, j) for j in point_jobs])
    results = run_many(_call, [{"fn": fn, "job": j} for _, fn, j in tagged], executor=executor,
                       progress=progress, description="ktier: study")
    gpus = [r for (t, _, _), r in zip(tagged, results) if t == "gpus"]
    caps = base_rows + [r for (t, _, _), r in zip(tagged, results) if t == "cap"]
    seed_rows = [r for (t, _, _), r in zip(tagged, results) if t == "seed"]
    points = [r for (t, _, _), r in zip(tagged, results) if t == "point"]
    wall_s = time.perf_counter() - t0
    return write_report(study, out, caps, points, gpus, seed_rows, base_cap, wall_s)
