"""A run's output folder: `requests.csv`, `summary.json` (with the config) and `summary_by_tier.csv`."""
from __future__ import annotations

import csv
import dataclasses
import enum
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core.files import atomic_path, output_folder, write_text_atomic
from tierserve.metrics.records import RequestTable
from tierserve.metrics.summary import RunSummary

REQUESTS_CSV = "requests.csv"
REQUESTS_PARQUET = "requests.parquet"     # streamed runs asked for Parquet write this instead of requests.csv
SUMMARY_JSON = "summary.json"
SUMMARY_BY_TIER_CSV = "summary_by_tier.csv"


def to_jsonable(x: Any) -> Any:
    """Plain JSON values from configs: dataclasses, enums, paths, numpy; NaN/inf become null."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return to_jsonable(dataclasses.asdict(x))
    if hasattr(x, "model_dump"):  # pydantic models (run configs)
        return to_jsonable(x.model_dump())
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple, set, frozenset)):
        return [to_jsonable(v) for v in x]
    if isinstance(x, np.ndarray):
        return to_jsonable(x.tolist())
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, enum.Enum):
        return x.name
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, (str, type(None))):
        return x
    return str(x)  # Path and anything else: its text form, rather than failing at the end of a long run


def _csv_cell(v: Any) -> Any:
    return repr(v) if isinstance(v, float) else v


@dataclass(slots=True)
class RunOutputs:
    table: RequestTable
    summary: RunSummary
    config: dict[str, Any] | None


def write_outputs(outdir: str | Path, table: RequestTable, summary: RunSummary,
                  config: dict[str, Any] | None = None) -> dict[str, Path]:
    """Write the three files into `outdir` (created if needed); returns their paths by file name.

    The files are written into a private staging folder and published together with `manifest.json` (each
    file's SHA-256) by `tierserve.core.files.output_folder`: a rerun replaces the previous run's files whole and
    an interrupted one publishes nothing. `summary.json` carries `"complete": true`."""
    out = Path(outdir)
    with output_folder(out, "outdir") as stage:          # published whole, with manifest.json (core.files)
        with atomic_path(stage / REQUESTS_CSV) as tmp:
            table.to_csv(tmp)
        write_summary_files(stage, summary, config)
    (out / REQUESTS_PARQUET).unlink(missing_ok=True)      # a stale streamed file must not shadow this run's
    return {n: out / n for n in (REQUESTS_CSV, SUMMARY_JSON, SUMMARY_BY_TIER_CSV)}


def write_summary_files(outdir: str | Path, summary: RunSummary,
                        config: dict[str, Any] | None = None) -> dict[str, Path]:
    """`summary_by_tier.csv`, then `summary.json` with `"complete": true` (last: it vouches for the folder).

    `write_outputs` calls it after `requests.csv`; a streamed run (`tierserve.metrics.stream.RunRecorder`)
    after its record file was renamed to its final name."""
    out = Path(outdir)
    paths = {n: out / n for n in (SUMMARY_JSON, SUMMARY_BY_TIER_CSV)}
    rows = summary.to_rows()
    with atomic_path(paths[SUMMARY_BY_TIER_CSV]) as tmp, tmp.open("w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()) if rows else ["name"])
        w.writeheader()
        w.writerows({k: _csv_cell(v) for k, v in r.items()} for r in rows)
    doc = {"complete": True, "config": to_jsonable(config), "summary": summary.to_dict()}
    # allow_nan=False: a NaN that slipped through is a bug here, not a file other tools cannot parse
    write_text_atomic(paths[SUMMARY_JSON], json.dumps(doc, indent=2, allow_nan=False) + "\n")
    return paths


def load_outputs(outdir: str | Path) -> RunOutputs:
    """Read back what `write_outputs` wrote (NaN restored from null); a folder whose summary.json does not say
    `complete: true` is an error, not a result."""
    from tierserve.core.errors import InputError
    from tierserve.core.files import parse_json, read_text
    out = Path(outdir)
    src = out / SUMMARY_JSON
    doc = parse_json(read_text(src, "summary.json", "JSON"), "summary.json", str(src))
    if not (isinstance(doc, dict) and doc.get("complete") is True):
        raise InputError(str(src), None, "complete", doc.get("complete") if isinstance(doc, dict) else None,
                         "not a complete run's outputs (the run was interrupted or the file is not tierserve's)")
    table = (RequestTable.from_parquet(out / REQUESTS_PARQUET)
             if not (out / REQUESTS_CSV).exists() and (out / REQUESTS_PARQUET).exists()
             else RequestTable.from_csv(out / REQUESTS_CSV))
    return RunOutputs(table=table, summary=RunSummary.from_dict(doc["summary"]), config=doc.get("config"))
