"""The `tierserve` command."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from tierserve.core import TierserveError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="tierserve: SLA-tier-aware LLM serving — policies, a calibrated cluster simulator, reproductions.")
console = Console(width=max(Console().width, 140))


def _register_optional() -> None:
    """Command groups contributed by other modules (hardware, reproductions)."""
    try:
        from tierserve.cli import hardware_cmds
        hardware_cmds.register(app)
    except ImportError:
        pass
    try:
        from tierserve.cli.ktier_cmds import reproduce_app
    except ImportError:
        return
    import importlib
    for name in ("uniboost_cmds", "niyama_cmds"):        # each seed's reproduction adds its command
        try:
            module = importlib.import_module(f"tierserve.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"tierserve.cli.{name}":
                raise
            continue
        module.register(reproduce_app)
    app.add_typer(reproduce_app, name="reproduce", help="One-command reproductions of the seeds' tables.")


from tierserve.cli import simulate_cmds  # noqa: E402  (registers simulate/compare/policies)

simulate_cmds.register(app, console)
_register_optional()


def main() -> None:
    try:
        app()
    except TierserveError as e:
        Console(stderr=True).print(f"[bold red]error:[/] {e}")
        sys.exit(2)
