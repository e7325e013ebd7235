"""`tierserve reproduce niyama`: Niyama/QoServe (seed 003) against Sarathi baselines and silos."""
from __future__ import annotations

import time
from pathlib import Path

import typer

from tierserve.cli.options import StudyExecutorByQuick
from tierserve.core.files import shown


def register(reproduce_app: typer.Typer) -> None:
    @reproduce_app.command("niyama")
    def niyama(quick: bool = typer.Option(False, "--quick", help="Azure-Code only, runs from 250 requests per "
                                                                 "one-replica run (300 per 2-replica run, 100 per "
                                                                 "replica on the 3-replica dispatch runs), ±50% "
                                                                 "searches, 5 s diurnal segments (the tests' size)."),
               out: Path = typer.Option(Path("results/niyama"), "--out", help="Folder for the report, JSON and plot."),
               executor: StudyExecutorByQuick = None,
               segment_s: float = typer.Option(None, "--segment-s", help="Override the diurnal segment length (s)."),
               requests: int = typer.Option(None, "--requests", help="Override requests per one-replica run."),
               workers: int = typer.Option(2, "--workers", min=1, help="Process-pool size: capacity searches run "
                                                                       "side by side, then every fixed-rate run."),
               reuse: Path = typer.Option(None, "--reuse", help="niyama_results.json of an earlier run of the same "
                                                                "study: reuse its Llama-3-8B goodput and silo "
                                                                "searches, run the rest."),
               goodput_only: bool = typer.Option(False, "--goodput-only", help="Only the one-replica goodput "
                                                 "searches per dataset (with the calibrated-predictor row)."),
               datasets: str = typer.Option(None, "--datasets", help="Comma-separated datasets (default: all)."),
               doc: Path = typer.Option(None, "--doc", help="Also write the report into this Markdown document as "
                                        "its section for this size (quick | full), replacing that section.")) -> None:
        """Goodput per replica (Llama-3-8B; Qwen-7B TP2), GPUs for 50 QPS (silos vs shared), Niyama behind
        round-robin / JSQ / deadline-aware dispatch, the ablation, α sensitivity, violations by request length and
        the diurnal run, judged on per-request deadlines with stability verdicts and 95% intervals over 3 seeds.
        Capacity searches run side by side in a process pool of --workers, then every fixed-rate run."""
        from dataclasses import replace

        from rich.console import Console

        from tierserve.experiments.niyama import Study
        from tierserve.experiments.niyama_report import run_study
        study = Study.quick() if quick else Study()
        if segment_s is not None:
            study = replace(study, segment_s=segment_s)
        if requests is not None:
            study = replace(study, num_requests=requests)
        study = replace(study, workers=workers, goodput_only=goodput_only)
        if datasets:
            study = replace(study, datasets=tuple(x.strip() for x in datasets.split(",") if x.strip()))
        executor = executor or ("serial" if quick else "process")
        console = Console(width=200)
        t0 = time.perf_counter()
        import json
        previous = json.loads(reuse.read_text()) if reuse is not None else None
        result = run_study(study, out, executor=executor, reuse=previous,
                           log=lambda msg: console.print(msg, markup=False, highlight=False))
        console.print(result["markdown"], markup=False, highlight=False)
        if doc is not None:
            from tierserve.experiments.results_doc import write_section
            name = "niyama " + ("quick" if quick else "goodput" if goodput_only else "full")
            write_section(doc, name, result["markdown"], "Niyama/QoServe (seed 003) results")
            console.print(f"wrote its section '{name}' of {shown(doc)}")
        console.print(f"wrote {shown(out)}/niyama_report.md, niyama_results.json and {len(result['plots'])} plot(s) "
                      f"in {time.perf_counter() - t0:.1f} s")
