"""`tierserve report DIR`: one self-contained HTML page for a run, a comparison, a sweep or a plan."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        folder: Path = typer.Argument(..., help="A folder written by simulate/compare --out, sweep or plan."),
        out: Optional[Path] = typer.Option(None, "--out", "-o", help="The HTML file (default: DIR/report.html)."),
    ) -> None:
        """Write one HTML page (plots embedded, no scripts) for the folder: latency CDFs and percentiles per tier
        and stack, queues over time, a sweep's curves with intervals, a plan's Pareto front and burst."""
        from tierserve.report.html import detect, write_report
        kind = detect(folder)
        path = write_report(folder, out)
        Console().print(f"wrote {path} ({kind} report, {path.stat().st_size / 1024:.0f} KiB)")
