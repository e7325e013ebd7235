"""`tierserve reproduce ktier`: the K-tier study (seed 000) in units of capacity."""
from __future__ import annotations

import time
from pathlib import Path

import typer
from rich.console import Console

from tierserve.cli.options import StudyExecutor, StudySeeds
from tierserve.core.files import shown

reproduce_app = typer.Typer(no_args_is_help=True, help="One-command reproductions of the seeds' studies.")


@reproduce_app.command("ktier")
def ktier(quick: bool = typer.Option(False, "--quick", help="Same regimes, small: 2 replicas, 300 requests per run, "
                                                            "K ∈ {1, 3}, ρ ∈ {0.6, 2.0}, a short overload episode."),
          out: Path = typer.Option(Path("results/ktier"), "--out", help="Folder for CSV, Markdown and PNG outputs."),
          executor: StudyExecutor = "process",
          seeds: StudySeeds = 3,
          replicas: int = typer.Option(None, "--replicas", help="Override the study's replica count."),
          requests: int = typer.Option(None, "--requests", help="Override the first length of every run (requests)."),
          standard: bool = typer.Option(False, "--standard", help="The main setup without the sensitivity "
                                        "repeats and with fewer K and loads (what docs/results/ktier.md shows)."),
          sensitivity: bool = typer.Option(False, "--sensitivity", help="Only the sensitivity rows (capacity with "
                                           "one assumption changed; tierserve.experiments.ktier_sensitivity), their "
                                           "own doc section ('ktier <size>-sensitivity')."),
          axes: str = typer.Option(None, "--axes", help="With --sensitivity: comma-separated subset of budget, exec, "
                                   "model, bandwidth (default: model at --quick, where no live migration happens; "
                                   "model,bandwidth otherwise). A non-default choice is named in the section."),
          doc: Path = typer.Option(None, "--doc", help="Also write the report into this Markdown document, as its "
                                   "section for this size (quick | standard | full), replacing that section.")) -> None:
    """Capacity per stack and class, attainment vs ρ, an overload episode, GPUs needed, sensitivity rows and the
    seed's own table (labelled), with stability verdicts and 95% intervals over seeds."""
    from dataclasses import replace

    from tierserve.experiments.ktier import Study
    from tierserve.experiments.ktier_report import run_study
    from tierserve.experiments.ktier_sensitivity import run_sensitivity
    study = Study.quick() if quick else Study.standard() if standard else Study()
    study = replace(study, seeds=tuple(range(seeds)))
    default_axes = ("model",) if quick else ("model", "bandwidth")
    chosen = default_axes
    if axes is not None or sensitivity:
        from tierserve.core import ConfigError
        from tierserve.experiments.ktier_sensitivity import check_axes
        try:
            if axes is not None and not sensitivity:
                raise ConfigError("--axes", axes, "no --axes without --sensitivity")
            chosen = check_axes(tuple(x.strip() for x in axes.split(",") if x.strip())) if axes else default_axes
        except ConfigError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2)
        study = replace(study, sensitivity=True, sensitivity_axes=chosen)
    if replicas is not None:
        study = replace(study, setup=replace(study.setup, num_replicas=replicas))
    if requests is not None:
        study = replace(study, setup=replace(study.setup, num_requests=requests))
    console = Console(width=220)
    t0 = time.perf_counter()
    result = (run_sensitivity if sensitivity else run_study)(study, out, executor=executor)
    console.print(result["markdown"], markup=False, highlight=False)
    if doc is not None:
        from tierserve.experiments.results_doc import write_section
        size = ("quick" if quick else "standard" if standard else "full") + ("-sensitivity" if sensitivity else "")
        size += "" if chosen == default_axes else "-" + "-".join(chosen)
        write_section(doc, f"ktier {size}", result["markdown"], "K-tier study results")
        console.print(f"wrote its section 'ktier {size}' of {shown(doc)}")
    console.print(f"wrote {shown(out)}/ktier_report.md, ktier_*.csv, ktier_meta.json and {len(result['plots'])} plots "
                  f"in {time.perf_counter() - t0:.1f} s")


def register(app: typer.Typer) -> None:
    app.add_typer(reproduce_app, name="reproduce")
