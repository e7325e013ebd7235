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
    for name in ("sweep_cmds", "plan_cmds", "report_cmds", "router_cmds"):   # sweeps, plans, reports, router
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
    for name in ("uniboost_cmds", "niyama_cmds", "contract_cmds"):   # each reproduction adds its command
        try:
            module = importlib.import_module(f"tierserve.cli.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"tierserve.cli.{name}":
                raise
            continue
        module.register(reproduce_app)
    app.add_typer(reproduce_app, name="reproduce", help="One-command reproductions of the seeds' tables.")


def interrupted_exit(exc: KeyboardInterrupt, out: Optional[Path] = None, kept: bool = False) -> "typer.Exit":
    """Report an interrupt (what finished, which signal) and the exit code to leave with: 130 for SIGINT, 143
    for SIGTERM, as a shell reports a process stopped by that signal. What was published under `out` is said:
    with `kept`, the whole files staged so far (manifest "complete": false); otherwise nothing."""
    from tierserve.core.errors import Interrupted
    from tierserve.experiments.runs import last_signal
    err = Console(stderr=True)
    name = exc.signal_name if isinstance(exc, Interrupted) else last_signal()
    if isinstance(exc, Interrupted):
        err.print(f"[bold yellow]interrupted[/] by {name}: {len(exc.finished)} of {len(exc.results)} "
                  f"{exc.description} had finished; the rest were cancelled and their workers stopped")
    else:
        err.print(f"[bold yellow]interrupted[/] by {name}: the run was stopped before it finished")
    if out is not None:
        err.print(f"outputs under {out}/: " + (
            "the whole files written so far were published; manifest.json says \"complete\": false"
            if kept else "nothing was published (this run's staging folder was removed; files that were "
                         "already there are untouched)"))
    return typer.Exit(143 if name == "SIGTERM" else 130)


# Commands whose --out is a folder holding one result: written through a staging folder and published whole
# (tierserve.core.files.output_folder). Every reproduction is one too.
FOLDER_OUTPUT_COMMANDS = {"simulate", "compare"}
# Commands whose interrupted result is worth keeping (finished stacks; a study that --resume continues).
KEEP_ON_INTERRUPT = {"compare"}


def _guard(command: Callable[..., Any], staged: bool) -> Callable[..., Any]:
    """A command wrapped so an interrupt is reported (not a bare exit) and, for a folder `--out`, the command
    writes into a private staging folder that is published whole when it ends (`output_folder`)."""
    import inspect
    takes_resume = "resume" in inspect.signature(command).parameters
    keep = takes_resume or command.__name__ in KEEP_ON_INTERRUPT

    @functools.wraps(command)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        from tierserve.core.limits import check_options
        check_options(kwargs)                       # every number bounded, every name given, before any work
        _check_reuse_files(kwargs)
        if isinstance(kwargs.get("doc"), Path):     # a results document written when the study ends: checked now
            from tierserve.core.outputs import check_out_file
            check_out_file(kwargs["doc"], "--doc")
        out = kwargs.get("out")
        if not (staged and isinstance(out, Path)):
            try:
                return command(*args, **kwargs)
            except KeyboardInterrupt as e:
                raise interrupted_exit(e) from None
        from tierserve.core.files import output_folder
        try:
            with output_folder(out, keep_on_interrupt=keep,
                               start_from_previous=bool(kwargs.get("resume"))) as stage:
                return command(*args, **{**kwargs, "out": stage})
        except KeyboardInterrupt as e:
            raise interrupted_exit(e, out, kept=keep) from None
    return guarded


# A reproduction's --reuse* file: a previous run's JSON results, with these mappings in it.
REUSE_FILES = {"reuse": ("goodput", "gpus"), "reuse_capacities": ("study", "capacities_rps", "capacity_probes")}


def _check_reuse_files(options: dict[str, Any]) -> None:
    from tierserve.core.errors import ConfigError
    from tierserve.core.files import read_mapping
    for name, keys in REUSE_FILES.items():
        path = options.get(name)
        if path is None:
            continue
        flag = "--" + name.replace("_", "-")
        doc = read_mapping(path, flag, "json", kind="JSON")
        missing = [k for k in keys if not isinstance(doc.get(k), dict)]
        if missing:
            raise ConfigError(flag, str(path), f"a previous run's results file (JSON with the mappings "
                                               f"{', '.join(keys)}; {missing[0]!r} is missing or not a mapping)")


def _guard_commands(typer_app: typer.Typer, all_staged: bool) -> None:
    for info in typer_app.registered_commands:
        if info.callback is not None and not hasattr(info.callback, "__wrapped__"):
            name = info.name or info.callback.__name__
            info.callback = _guard(info.callback, all_staged or name in FOLDER_OUTPUT_COMMANDS)


from tierserve.cli import simulate_cmds  # noqa: E402  (registers simulate/compare/policies)

simulate_cmds.register(app, console)
_register_optional()
_guard_commands(app, all_staged=False)         # simulate and compare publish a folder; calibrate writes one file
for _group in app.registered_groups:           # reproductions: each publishes its --out folder whole
    if _group.typer_instance is not None:
        _guard_commands(_group.typer_instance, all_staged=True)


def main() -> None:
    from tierserve.experiments.runs import _raise_interrupt
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
