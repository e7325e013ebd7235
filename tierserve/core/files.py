"""Reading a configuration file into a mapping, with errors that name the field, the file and the problem."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable


def read_mapping(path: str | Path, field: str, parse: Callable[[str], Any], errors: tuple[type[Exception], ...],
                 kind: str) -> dict:
    """Parse `path` with `parse` (e.g. yaml.safe_load, json.loads); an empty file is an empty mapping."""
    from tierserve.core.errors import ConfigError
    p = Path(path)
    if not p.is_file():
        raise ConfigError(field, str(path), f"an existing {kind} file")
    try:
        data = parse(p.read_text())
    except errors as e:
        raise ConfigError(field, str(path), f"valid {kind} ({e})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(field, str(path), f"a {kind} mapping at the top level")
    return data
