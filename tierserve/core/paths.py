"""Where the reference material (`../shared`: Vidur profiles, public traces) lives, if it is present."""
from __future__ import annotations

import os
from pathlib import Path


def shared_dir() -> Path | None:
    """`$TIERSERVE_SHARED`, else a `shared/` folder beside the checkout or the working directory."""
    env = os.environ.get("TIERSERVE_SHARED")
    if env:
        p = Path(env)
        return p if p.is_dir() else None
    here = Path(__file__).resolve()
    candidates = [here.parents[3] / "shared", Path.cwd().parent / "shared", Path.cwd() / "shared"]
    for c in candidates:
        if (c / "data").is_dir():
            return c
    return None


def shared_data(*parts: str) -> Path | None:
    """A path under `shared/data/`, or None when the reference material is absent."""
    root = shared_dir()
    if root is None:
        return None
    p = root.joinpath("data", *parts)
    return p if p.exists() else None
