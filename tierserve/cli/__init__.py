"""The `tierserve` command."""
from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer
from rich.console import Console

from tierserve.core import TierserveError

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="tierserve: SLA-tier-aware LLM serving — policies, a calibrated cluster simulator, reproductions.")
console = Console(width=max(Console().width, 140))


def _register_optional() -> None:
    """Command groups contributed by other modules (hardware, reproductions)."""
    import importlib
    try:
        from tierserve.cli import hardware_cmds
        hardware_cmds.register(app)
    except ImportError:
        pass
    for name in ("sweep_cmds", "plan_cmds", "report_cmds"):   # sweeps, capacity plans, HTML reports
        try:
            importlib.import_module(f"tierserve.cli.{name}").register(app)
        except ModuleNotFoundError as e:
            if e.name != f"tierserve.cli.{name}":
                raise
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


def interrupted_exit(exc: KeyboardInterrupt, out: Optional[Path] = None) -> "typer.Exit":
    """Report an interrupt (what finished, which signal) and the exit code to leave with: 130 for SIGINT, 143
    for SIGTERM, as a shell reports a process stopped by that signal. Partial files under `out` are removed."""
    from tierserve.core.errors import Interrupted
    from tierserve.core.files import remove_partial_files
    from tierserve.experiments.sweep import last_signal
    err = Console(stderr=True)
    name = exc.signal_name if isinstance(exc, Interrupted) else last_signal()
    if isinstance(exc, Interrupted):
        err.print(f"[bold yellow]interrupted[/] by {name}: {len(exc.finished)} of {len(exc.results)} "
                  f"{exc.description} had finished; the rest were cancelled and their workers stopped")
    else:
        err.print(f"[bold yellow]interrupted[/] by {name}: the run was stopped before it finished")
    if out is not None:
        removed = remove_partial_files(out)
        err.print(f"outputs under {out}/: only folders whose summary.json says \"complete\": true hold whole runs"
                  + (f" ({removed} partial file(s) removed)" if removed else ""))
    return typer.Exit(143 if name == "SIGTERM" else 130)


def _guard(command: Callable[..., Any], check_out: bool) -> Callable[..., Any]:
    """A command wrapped so an interrupt is reported (not a bare exit) and, when asked, `--out` is checked to
    be a writable folder before any work starts."""
    @functools.wraps(command)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        out = kwargs.get("out")
        if check_out and out is not None:
            from tierserve.core.files import check_out_dir
            check_out_dir(out)
        try:
            return command(*args, **kwargs)
        except KeyboardInterrupt as e:
            raise interrupted_exit(e, out if isinstance(out, Path) else None) from None
    return guarded


def _guard_commands(typer_app: typer.Typer, check_out: bool) -> None:
    for info in typer_app.registered_commands:
        if info.callback is not None and not hasattr(info.callback, "__wrapped__"):
            info.callback = _guard(info.callback, check_out)


from tierserve.cli import simulate_cmds  # noqa: E402  (registers simulate/compare/policies)

simulate_cmds.register(app, console)
_register_optional()
_guard_commands(app, check_out=False)          # simulate, compare, calibrate check their own --out
for _group in app.registered_groups:           # reproductions: --out checked before they start
    if _group.typer_instance is not None:
        _guard_commands(_group.typer_instance, check_out=True)


def main() -> None:
    from tierserve.experiments.sweep import _raise_interrupt
    import signal
    signal.signal(signal.SIGTERM, _raise_interrupt)   # SIGTERM cleans up exactly as Ctrl-C does
    try:
        app()
    except TierserveError as e:
        Console(stderr=True).print(f"[bold red]error:[/] {e}")
        sys.exit(2)
    except Exception as e:   # a pydantic error from code that builds a config directly: still no traceback
        from pydantic import ValidationError

        from tierserve.core.errors import config_error_from_validation
        if not isinstance(e, ValidationError):
            raise
        Console(stderr=True).print(f"[bold red]error:[/] {config_error_from_validation(e, e.title)}")
        sys.exit(2)
