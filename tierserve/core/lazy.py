"""Package names imported from their submodule on first use (PEP 562): `lazy_exports`.

A plain simulation should not pay for the parts of a package it never touches (a trace reader does not need
the pydantic workload models; a run does not need the stability statistics)."""
from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, str], namespace: dict[str, Any]
                 ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`, whose public name N lives in submodule `exports[N]`; a name
    read once is stored in `namespace` (the package's globals), so later reads skip the lookup."""
    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(exports))

    return __getattr__, __dir__
