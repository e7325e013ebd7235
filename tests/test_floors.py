"""The floors: every import in the package goes down (or sideways within a floor), never up, and no circle.

    core < hardware < policies < sim < workload, metrics < experiments, report, router < cli;  engines: core, policies

Read from the sources: every `import` / `from … import`, at any depth of a module, lazy ones included (an
import inside a function still goes up, and two modules that import each other only lazily are still one
tangle a reader must take in at once). A package missing from the table fails: give it its floor here.
"""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "tierserve"

FLOORS = {"core": 0, "hardware": 1, "policies": 2, "sim": 3, "workload": 4, "metrics": 4, "experiments": 5,
          "report": 5, "router": 5, "cli": 6}     # router: a front for engines, driven by the CLI alone
ENGINES_MAY_IMPORT = {"core", "policies"}
# Top-level modules: the package's own machinery (the compiled path's switch, the entry point).
TOP_LEVEL = {"__init__", "__main__", "_native"}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(target: str, names: list[str], known: dict[str, Path]) -> list[str]:
    """`from target import names`: the module each name is, else the module `target` itself."""
    out = []
    for name in names:
        sub = f"{target}.{name}"
        out.append(sub if sub in known else target)
    return out or [target]


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The tierserve modules `path` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "tierserve")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "tierserve":
                found.update(_resolve(target, [a.name for a in node.names], known))
    found.discard(here)
    return found


def floor_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_import_goes_down_a_floor_or_stays_on_its_own():
    known = modules()
    unplaced = sorted({floor_of(m) for m in known} - set(FLOORS) - {"engines", ""}
                      - {m.split(".")[1] for m in known if m.count(".") == 1 and m.split(".")[1] in TOP_LEVEL})
    assert not unplaced, f"packages with no floor in tests/test_floors.py: {unplaced}"
    wrong = []
    for module, path in known.items():
        src = floor_of(module)
        if src in TOP_LEVEL or not src:
            continue
        for target in sorted(imports(path, known)):
            dst = floor_of(target)
            if dst in TOP_LEVEL or not dst or dst == src:
                continue
            if src == "engines":
                ok = dst in ENGINES_MAY_IMPORT
            elif dst == "engines":
                ok = FLOORS[src] > FLOORS["policies"]        # the layers above may drive an engine
            else:
                ok = FLOORS[dst] <= FLOORS[src]                  # down, or across one floor (experiments, report)
            if not ok:
                wrong.append(f"{module} ({src}) imports {target} ({dst})")
    assert not wrong, "imports that go up a floor:\n  " + "\n  ".join(wrong)


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = counter
                counter += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def test_no_import_circle():
    known = modules()
    graph = {m: {t for t in imports(p, known) if t in known} for m, p in known.items()}
    # A package's __init__ re-exporting its own modules is not a circle between those modules.
    for m in graph:
        graph[m] = {t for t in graph[m] if not (known[t].name == "__init__.py" and m.startswith(t + "."))}
    found = circles(graph)
    assert not found, "import circles:\n  " + "\n  ".join(" <-> ".join(c) for c in found)


def test_the_checks_see_a_circle_and_an_upward_import():
    """The checks can fail: a planted circle is found, and a planted upward import is named."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []
    known = modules()
    sim = known["tierserve.sim.replica"]
    assert {"tierserve.sim.migration_endpoints", "tierserve.policies.local.base"} <= imports(sim, known)
    assert floor_of("tierserve.cli.simulate_cmds") == "cli" and FLOORS["cli"] > FLOORS["sim"]


def test_each_compiled_module_says_so_in_its_first_lines():
    from tierserve import _native
    root = PACKAGE.parent
    silent = [src for src in _native.COMPILED_SOURCES
              if "compiled" not in "\n".join((root / src).read_text().splitlines()[:12]).lower()]
    assert not silent, f"compiled modules whose first lines do not say so: {silent}"
