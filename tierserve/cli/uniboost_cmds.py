"""`tierserve reproduce uniboost`: seed 001 (UniBoost) in units of measured capacity."""
from __future__ import annotations

import time
from pathlib import Path

import typer

from tierserve.cli.options import StudyExecutor, StudySeeds
from tierserve.core.files import shown


def register(reproduce_app: typer.Typer) -> None:
    @reproduce_app.command("uniboost")
    def uniboost(quick: bool = typer.Option(False, "--quick", help="Smoke run: Table 2 at ρ = 0.9 with 240 "
                                                                   "requests and the starvation test (8 replicas "
                                                                   "by replay, 300 requests each)."),
                 out: Path = typer.Option(Path("results/uniboost"), "--out", help="Folder for the report and runs."),
                 executor: StudyExecutor = "process",
                 seeds: StudySeeds = 3,
                 requests: int = typer.Option(None, "--requests", help="Override Table 2's requests per run."),
                 reuse_capacities: Path = typer.Option(None, "--reuse-capacities", help="A previous run's "
                                                       "uniboost_meta.json: reuse its measured capacities for "
                                                       "identical setups instead of searching again."),
                 resume: bool = typer.Option(False, "--resume", help="Keep the finished runs in --out that match "
                                                                     "this study's jobs; run the rest."),
                 table2_rhos: str = typer.Option(None, "--table2-rhos", help="Comma-separated loads (ρ of fcfs's "
                                                 "capacity) for Table 2, e.g. 0.7,0.9,1.0,1.25."),
                 sections: str = typer.Option(None, "--sections", help="Comma-separated subset, in run order, of: "
                                              "table2, starvation, dispatch, replay, gamma, fig7, sensitivity, "
                                              "tiers (default: all)."),
                 doc: Path = typer.Option(None, "--doc", help="Also write the report into this Markdown document "
                                          "as its section for this run (quick | full | the sections chosen), "
                                          "replacing that section.")) -> None:
        """Table 2 (% vs srpt) at several loads, §4.4 SLO scale, Fig. 7 ablation knee, A.3 starvation (8 replicas
        by replay), sensitivity (k, δ, chunk), Table 9 dispatch on 64 replicas, Table 10 replay on 32–512
        replicas, γ-Ada over time, and tiers, with stability verdicts and 95% intervals over seeds.

        Progress goes to stderr (a line per capacity probe and per finished point); the report, runs and meta
        files in --out are rewritten after every batch and say PARTIAL (or INTERRUPTED) until the study ends."""
        from dataclasses import replace

        from rich.console import Console

        from tierserve.experiments.uniboost import Study
        from tierserve.experiments.uniboost_report import run_study
        study = Study.quick() if quick else Study()
        study = replace(study, seeds=tuple(range(seeds)))
        if sections:
            from tierserve.core import ConfigError
            from tierserve.experiments.uniboost import SECTIONS
            chosen = tuple(x.strip() for x in sections.split(",") if x.strip())
            bad = [x for x in chosen if x not in SECTIONS]
            if bad or not chosen:
                err = ConfigError("--sections", sections, "a comma-separated subset of " + ", ".join(SECTIONS))
                typer.echo(f"error: {err}", err=True)
                raise typer.Exit(2)
            study = replace(study, sections=chosen)
        if table2_rhos:
            from tierserve.core import ConfigError
            try:
                rhos = tuple(float(x) for x in table2_rhos.split(",") if x.strip())
            except ValueError:
                rhos = ()
            if not rhos or any(not (0 < r < 10) for r in rhos):
                typer.echo(f"error: {ConfigError('--table2-rhos', table2_rhos, 'comma-separated loads in (0, 10)')}",
                           err=True)
                raise typer.Exit(2)
            study = replace(study, table2_rhos=rhos)
        if requests is not None:
            study = replace(study, table2=replace(study.table2, num_requests=requests))
        console = Console(width=220)
        err = Console(stderr=True, width=220)
        t0 = time.perf_counter()

        def log(line: str) -> None:      # one line per capacity probe and per finished point, as they come
            err.print(f"[{time.perf_counter() - t0:6.0f} s] {line}", markup=False, highlight=False)
        result = run_study(study, out, executor=executor, log=log, reuse_meta=reuse_capacities, resume=resume)
        console.print(result["markdown"], markup=False, highlight=False)
        if doc is not None:
            from tierserve.experiments.results_doc import write_section
            name = "uniboost " + ("quick" if quick else ",".join(study.sections) if sections else "full")
            write_section(doc, name, result["markdown"], "UniBoost (seed 001) results")
            console.print(f"wrote its section '{name}' of {shown(doc)}")
        console.print(f"wrote {shown(out)}/uniboost_report.md, uniboost_runs.json, uniboost_meta.json "
                      f"in {time.perf_counter() - t0:.1f} s")
