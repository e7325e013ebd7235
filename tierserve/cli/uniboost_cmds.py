"""`tierserve reproduce uniboost`: seed 001 (UniBoost) in units of measured capacity."""
from __future__ import annotations

import time
from pathlib import Path

import typer


def register(reproduce_app: typer.Typer) -> None:
    @reproduce_app.command("uniboost")
    def uniboost(quick: bool = typer.Option(False, "--quick", help="Smoke run: Table 2 at ρ = 0.9 with 240 "
                                                                   "requests and the starvation test on 2 replicas."),
                 out: Path = typer.Option(Path("results/uniboost"), "--out", help="Folder for the report and runs."),
                 executor: str = typer.Option("process", "--executor", help="process | serial | ray"),
                 seeds: int = typer.Option(3, "--seeds", min=3, help="Seeds per point (≥ 3: intervals need them)."),
                 requests: int = typer.Option(None, "--requests", help="Override Table 2's requests per run."),
                 reuse_capacities: Path = typer.Option(None, "--reuse-capacities", help="A previous run's "
                                                       "uniboost_meta.json: reuse its measured capacities for "
                                                       "identical setups instead of searching again."),
                 resume: bool = typer.Option(False, "--resume", help="Keep the finished runs in --out that match "
                                                                     "this study's jobs; run the rest.")) -> None:
        """Table 2 (% vs srpt), §4.4 SLO scale, Fig. 7 ablation knee, A.3 starvation, sensitivity (k, δ, chunk),
        dispatch composition and tiers, with stability verdicts and 95% intervals over seeds.

        Progress goes to stderr (a line per capacity probe and per finished point); the report, runs and meta
        files in --out are rewritten after every batch and say PARTIAL (or INTERRUPTED) until the study ends."""
        from dataclasses import replace

        from rich.console import Console

        from tierserve.experiments.uniboost import Study, run_study
        study = Study.quick() if quick else Study()
        study = replace(study, seeds=tuple(range(seeds)))
        if requests is not None:
            study = replace(study, table2=replace(study.table2, num_requests=requests))
        console = Console(width=220)
        err = Console(stderr=True, width=220)
        t0 = time.perf_counter()

        def log(line: str) -> None:      # one line per capacity probe and per finished point, as they come
            err.print(f"[{time.perf_counter() - t0:6.0f} s] {line}", markup=False, highlight=False)
        result = run_study(study, out, executor=executor, log=log, reuse_meta=reuse_capacities, resume=resume)
        console.print(result["markdown"], markup=False, highlight=False)
        console.print(f"wrote {out}/uniboost_report.md, uniboost_runs.json, uniboost_meta.json "
                      f"in {time.perf_counter() - t0:.1f} s")
