"""Name → class registries. A new policy is one file plus one line in its package's table."""
from __future__ import annotations

import importlib
from typing import Any

from tierserve.core import ConfigError


class Registry:
    """Maps paper names to `module:Class` paths, imported on first use."""

    def __init__(self, kind: str, table: dict[str, str]) -> None:
        self.kind = kind
        self.table = table

    @property
    def names(self) -> list[str]:
        return sorted(self.table)

    def get_class(self, name: str) -> type:
        path = self.table.get(name)
        if path is None:
            raise ConfigError(f"{self.kind}_policy", name, ", ".join(self.names))
        module, cls = path.split(":")
        return getattr(importlib.import_module(module), cls)

    def create(self, name: str, **params: Any):
        cls = self.get_class(name)
        try:
            return cls(**params)
        except TypeError as exc:
            raise ConfigError(f"{self.kind}_policy_params[{name}]", params, f"parameters of {cls.__name__}: {exc}")
