"""The CLI's shared options are declared once (issue 22): an option written with the same flags, bounds and
help in two command modules belongs in tierserve/cli/options.py as an `Annotated` type."""
from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import tierserve.cli

CLI = Path(tierserve.cli.__file__).parent


def _option_declarations(path: Path) -> list[tuple[tuple, int]]:
    """(flags, bounds and help) of every `typer.Option(...)` call in the module, with its line."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "Option"
                and isinstance(node.func.value, ast.Name) and node.func.value.id == "typer"):
            flags = tuple(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str))
            words = tuple(sorted((k.arg, ast.unparse(k.value)) for k in node.keywords if k.arg))
            found.append(((flags, words), node.lineno))
    return found


def test_no_option_is_declared_twice_outside_options_py() -> None:
    places = defaultdict(list)
    for path in sorted(CLI.glob("*.py")):
        if path.name == "options.py":
            continue
        for key, line in _option_declarations(path):
            places[key].append(f"{path.name}:{line}")
    twice = {k: v for k, v in places.items() if len(v) > 1}
    assert not twice, ("declare these once in tierserve/cli/options.py: "
                       + "; ".join(f"{k[0]} at {', '.join(v)}" for k, v in twice.items()))


def test_every_shared_option_is_used() -> None:
    from typing import Annotated, get_origin

    import tierserve.cli.options as options
    shared = [n for n, v in vars(options).items() if get_origin(v) is Annotated]
    text = "\n".join(p.read_text(encoding="utf-8") for p in CLI.glob("*_cmds.py"))
    unused = [n for n in shared if n not in text]
    assert shared and not unused, f"declared in options.py but used by no command: {unused}"
