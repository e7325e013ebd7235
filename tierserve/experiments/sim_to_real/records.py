"""sim_to_real: the engine's logs read back (request log, iteration log) and rows written as CSV."""
from __future__ import annotations

import csv
import json
from pathlib import Path

from tierserve.core.outputs import atomic_path


def engine_records(out: Path, run: str) -> dict[int, dict]:
    """The engine's request log for one run, by trace index."""
    recs = [json.loads(line) for line in (out / "requests.jsonl").open() if line.strip()]
    return {r["xargs"]["trace_i"]: r for r in recs if r["xargs"].get("run") == run}


def iteration_rows(out: Path) -> list[dict]:
    with (out / "iterations.csv").open() as f:
        return list(csv.DictReader(f))


def write_rows(rows: list[dict], path: Path) -> Path:
    """`rows` as CSV at `path`, through the output layer (a temporary file renamed in; a non-regular target or a
    write error is one line naming the path)."""
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path
