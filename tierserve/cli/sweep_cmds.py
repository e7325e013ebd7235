"""`tierserve sweep SPEC`: the cross product of named parameters over a base scenario, resumable."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from tierserve.cli.options import PoolExecutor


def register(app: typer.Typer) -> None:
    @app.command()
    def sweep(
        spec: Path = typer.Argument(..., help="Sweep spec YAML (params, seeds, base scenario; see docs/planning.md)."),
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="Folder for points/ and the result table "
                                                                       "(default: sweeps/<name>). Run again to resume."),
        executor: PoolExecutor = "process",
        address: Optional[str] = typer.Option(None, help="With --executor ray: the cluster to join, e.g. "
                                                         "ray://head:10001 (default $RAY_ADDRESS, else a local Ray)."),
        workers: Optional[int] = typer.Option(None, min=1, help="Process-pool size (default: one per core)."),
        table_format: str = typer.Option("parquet", "--format", help="parquet | csv."),
        dry_run: bool = typer.Option(False, "--dry-run", help="List how many points would run, and stop."),
    ) -> None:
        """Run every point of a sweep (parameters × seeds) and write one table with each point's full config.
        Points already in --out are not re-run, so a killed sweep continues where it stopped."""
        from tierserve.core.errors import Interrupted
        from tierserve.core.files import check_out_dir
        from tierserve.experiments.sweep import Sweep, finished_points, run_sweep
        console = Console()
        plan = Sweep.from_yaml(spec)
        folder = out or Path("sweeps") / plan.name
        check_out_dir(folder)
        done = finished_points(plan, folder) if folder.exists() else set()
        console.print(f"[bold]sweep {plan.name}[/]: {len(plan.points)} points ({' × '.join(plan.param_names)} × "
                      f"{len(plan.spec['seeds'])} seeds); {len(done)} already in {folder}/, "
                      f"{len(plan.points) - len(done)} to run on {executor}")
        if dry_run:
            return
        try:
            res = run_sweep(plan, folder, executor, workers, progress=True, table_format=table_format,
                            address=address)
        except Interrupted as e:
            Console(stderr=True).print(f"[bold yellow]interrupted[/]: {len(e.finished)} more points finished and "
                                       f"are kept in {folder}/points/; run the same command to continue")
            raise typer.Exit(143 if e.signal_name == "SIGTERM" else 130) from None
        unstable = sum(1 for r in res.rows if not r["stable"])
        console.print(f"ran {res.ran} points, reused {res.reused}; {unstable} of {len(res.rows)} points have an "
                      "unstable queue (column verdict)")
        if res.ran and executor != "ray":
            console.print(f"CPU {res.cpu_s:.1f} s over {res.wall_s:.1f} s wall: {res.cpu_s / res.wall_s:.2f} cores busy "
                          "on average")
        console.print(f"wrote {res.table_path} ({len(res.rows)} rows) and {folder}/sweep.json; "
                      f"`tierserve report {folder}` draws it")
