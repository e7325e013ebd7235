"""The K-tier study's sensitivity rows on their own: `tierserve reproduce ktier --sensitivity` (issue 23).

Each axis repeats capacity searches with one assumption changed (`Study.variants`): the token budget, the exec
model, the model architecture (Llama-3-8B, GQA) or the migration bandwidth (halved and doubled). What runs:
- a variant that changes the replica (budget, exec, model): `fcfs` (its own baseline), `local_prio` and
  `llumnix_k` on it;
- a bandwidth variant: the stacks that migrate, `+migration` and `llumnix_k`, at each bandwidth and at the main
  setup's, and the main setup's `fcfs` as the baseline (it does not migrate, so bandwidth cannot move it).
Bandwidth can move a capacity only through live migrations, so every row states the migrations per run at its
capacity rate and at the lowest failing rate above it; a size where they are 0 cannot show a bandwidth effect.
Each row is compared with the same stack on the main setup where that was run here: capacities whose intervals
overlap are no measured difference.

API: run_sensitivity(study, out, executor, progress) -> dict (rows, markdown, wall_s).
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tierserve.core import ConfigError
from tierserve.experiments.ktier import POISSON, CapacityRow, Study, _baseline, _cap_key, capacity_job, ladder_stacks
from tierserve.experiments.ktier_report import (
    _jsonable, capacity_table, md_table, setup_lines, stack_name, write_csv,
)
from tierserve.experiments.runs import run_many

AXES = ("budget", "exec", "model", "bandwidth")
MIGRATING = ("+migration", "llumnix_k")          # the stacks a bandwidth row repeats
REPLICA_ROWS = ("local_prio", "llumnix_k")       # beside the variant's own fcfs baseline


def check_axes(axes: tuple[str, ...]) -> tuple[str, ...]:
    bad = [a for a in axes if a not in AXES]
    if bad or not axes:
        raise ConfigError("sensitivity_axes", ",".join(axes), "a non-empty subset of " + ", ".join(AXES))
    return tuple(axes)


def _jobs(study: Study) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(baseline capacity jobs, the other capacity jobs) of the sensitivity rows."""
    s0, k = study.setup, study.ladder_k
    lo_r, hi_r = study.baseline_bracket_per_replica
    ladder = {st.label: st for st in ladder_stacks(k)}
    variants = {n: s for n, s in study.variants().items() if n}

    def job(group, stack, s, lo, hi):
        return dict(group=group, stack=stack, setup=s, arrival=POISSON, lo=lo, hi=hi, seeds=tuple(study.seeds),
                    rel_tol=study.rel_tol)
    base, rest = [], []
    bandwidth = {n: s for n, s in variants.items() if s.bandwidth_gbytes_s != s0.bandwidth_gbytes_s}
    if bandwidth:
        base.append(job("main setup", _baseline(k), s0, lo_r * s0.num_replicas, hi_r * s0.num_replicas))
        rest += [job("main setup", ladder[m], s0, None, None) for m in MIGRATING]
        rest += [job(f"sensitivity {n}", ladder[m], s, None, None) for n, s in bandwidth.items() for m in MIGRATING]
    for n, s in variants.items():
        if n not in bandwidth:
            base.append(job(f"sensitivity {n}", _baseline(k), s, lo_r * s.num_replicas, hi_r * s.num_replicas))
            rest += [job(f"sensitivity {n}", ladder[m], s, None, None) for m in REPLICA_ROWS]
    return base, rest


def run_sensitivity(study: Study, out: Path, executor: str = "process", progress: bool = True) -> dict[str, Any]:
    """The sensitivity rows of `study.sensitivity_axes` (module docstring); CSV, Markdown and meta under `out`."""
    check_axes(tuple(study.sensitivity_axes))
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    base_jobs, jobs = _jobs(study)
    base_rows: list[CapacityRow] = run_many(capacity_job, base_jobs, executor=executor, progress=progress,
                                            description="ktier sensitivity: baselines")
    base_cap = {_cap_key(r.setup, r.arrival): r.rate for r in base_rows}
    main = base_cap.get(_cap_key(study.setup, POISSON))
    for j in jobs:     # bracket around the setup's own baseline; a bandwidth row's is the main setup's fcfs
        c = base_cap.get(_cap_key(j["setup"], POISSON), main)
        c = c if c and c > 0 else study.baseline_bracket_per_replica[0] * j["setup"].num_replicas
        j["lo"], j["hi"] = study.bracket[0] * c, study.bracket[1] * c
        base_cap.setdefault(_cap_key(j["setup"], POISSON), c)
    rows = base_rows + run_many(capacity_job, jobs, executor=executor, progress=progress,
                                description="ktier sensitivity: rows")
    wall_s = time.perf_counter() - t0
    table = capacity_table(rows, base_cap)
    for t, r in zip(table, rows):
        t["live_migrations_above"] = r.migrations_live_above
    write_csv(table, out / "ktier_capacity.csv")
    md = markdown(study, rows, table)
    (out / "ktier_report.md").write_text(md)
    meta = {"study": _jsonable(asdict(study)), "wall_s": wall_s, "mode": "sensitivity rows only"}
    (out / "ktier_meta.json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return {"capacity": table, "markdown": md, "plots": [], "wall_s": wall_s}


def comparisons(rows: list[CapacityRow]) -> list[str]:
    """One line per variant row against the same stack on the main setup (when that was run here)."""
    main = {r.stack.label: r for r in rows if r.group == "main setup"}
    lines = []
    for r in rows:
        if not r.group.startswith("sensitivity") or r.stack.label == "fcfs":
            continue
        mig = (f"{r.migrations_live:.3g} live migrations per run at its capacity, "
               f"{r.migrations_live_above:.3g} at {r.fails_at:.3g} req/s")
        ref = main.get(r.stack.label)
        if ref is None:
            lines.append(f"- {r.group[len('sensitivity '):]}, {stack_name(r.stack)}: [{r.rate:.3g}, "
                         f"{r.fails_at:.3g}) req/s; {mig}.")
            continue
        overlap = r.rate < ref.fails_at and ref.rate < r.fails_at
        lines.append(f"- {r.group[len('sensitivity '):]}, {stack_name(r.stack)}: [{r.rate:.3g}, {r.fails_at:.3g}) "
                     f"req/s vs [{ref.rate:.3g}, {ref.fails_at:.3g}) at the main setup's "
                     f"{ref.setup.bandwidth_gbytes_s:g} GB/s ({ref.migrations_live:.3g} live migrations per run "
                     f"there): {'overlap — no measured difference' if overlap else 'DO NOT overlap'}; {mig}.")
    return lines


def markdown(study: Study, rows: list[CapacityRow], table: list[dict[str, Any]]) -> str:
    cols = ["group", "stack", "setup", "capacity_rps", "fails_at_rps", "runs", "saturated", "capacity_x_baseline",
            "stable_only_rps", "verdict_at_capacity", "fails_above", "live_migrations", "live_migrations_above",
            "queued_migrations", "downtime_p99_ms"]
    moved = [r for r in rows if r.group.startswith("sensitivity") and r.setup.bandwidth_gbytes_s
             != study.setup.bandwidth_gbytes_s]
    no_mig = moved and all(r.migrations_live == 0 and not (r.migrations_live_above > 0) for r in moved)
    L = ["# K-tier study (seed 000): sensitivity rows", "", *setup_lines(study),
         f"Axes: {', '.join(study.sensitivity_axes)}. Capacity: bisection over rate to ±{study.rel_tol:.0%} with "
         "common random numbers (`tierserve.experiments.capacity`); interval [capacity, `fails_at`). "
         "`capacity_x_baseline`: against `fcfs` on the row's replica (bandwidth rows: the main setup's `fcfs`, "
         "which does not migrate). Migrations: mean per run at the capacity rate (`live_migrations`) and at "
         "`fails_at` (`live_migrations_above`); bandwidth acts only through them.", ""]
    if no_mig:
        L += ["**No live migration happened in any bandwidth row at this size, so these rows cannot show a "
              "bandwidth effect.**", ""]
    L += ["## Capacity (req/s)", "", md_table(table, cols), "", "## Each row against the main setup", "",
          *comparisons(rows), ""]
    return "\n".join(L) + "\n"
