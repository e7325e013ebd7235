"""`tierserve reproduce ktier`: seed 000's K sweep (K-tier Llumnix vs INFaaS+vLLM)."""
from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

reproduce_app = typer.Typer(no_args_is_help=True, help="One-command reproductions of the seeds' tables.")


@reproduce_app.command("ktier")
def ktier(quick: bool = typer.Option(False, "--quick", help="K ∈ {1,2,3,4,6}, 1,500 requests, 4 replicas (minutes)."),
          out: Path = typer.Option(Path("results/ktier"), "--out", help="Folder for CSV, Markdown and PNG outputs."),
          executor: str = typer.Option("process", "--executor", help="process | serial | ray"),
          rate_per_replica: float = typer.Option(None, "--rate-per-replica", help="Override the load (req/s per replica)."),
          no_adaptive: bool = typer.Option(False, "--no-adaptive", help="Skip the adaptive-headroom variant.")) -> None:
    """K = 1…10 × {uniform, gaussian, enterprise} at 10K and 15K requests; speedups over INFaaS+vLLM."""
    from dataclasses import replace

    from tierserve.experiments.ktier import COST_FORMULA, KTierSetup, run_ktier
    setup = KTierSetup.quick() if quick else KTierSetup()
    if rate_per_replica is not None:
        setup = replace(setup, rate_per_replica=rate_per_replica)
    if no_adaptive:
        setup = replace(setup, adaptive=False)
    console = Console(width=200)
    result = run_ktier(setup, out, executor=executor)
    console.print(result["markdown"])
    console.print(f"formula: {COST_FORMULA}")
    console.print(f"wrote {out}/ktier_table.md, ktier_table.csv, ktier_runs.csv and {len(result['plots'])} plots")


def register(app: typer.Typer) -> None:
    app.add_typer(reproduce_app, name="reproduce")
