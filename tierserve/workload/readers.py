"""Trace readers: each turns one public trace format into `list[Request]`, sorted by arrival, ids 0..n-1.

Every malformed value raises `TraceError(source, row, field, value, problem)`; no row is ever dropped or
changed silently. `row` is the 1-based data row (the header is row 0; JSONL lines count from 1).

Output length 0: Vidur (and the simulator) need prompts >= 1 and outputs >= 1. A zero output is an error
naming the row unless the caller passes `min_output=1`, which clamps it explicitly and reports the count in
`ReadResult.num_clamped`.
"""
from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from tierserve.core.errors import ConfigError, TraceError
from tierserve.core.request import Request

TRACE_FORMATS = ("csv", "azure", "mooncake", "vidur", "vidur_run")


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One parsed row before it becomes a Request (arrival None for length-only files)."""

    arrival_s: float | None
    prompt_tokens: int
    output_tokens: int
    tier: int | None = None
    app: str = ""


@dataclass(slots=True)
class ReadResult:
    """Parsed rows plus what was done to them on request (never silently)."""

    rows: list[TraceRow] = field(default_factory=list)
    num_clamped: int = 0          # outputs raised from 0 to min_output (opt-in)
    source: str = ""


# ---- value parsing ---------------------------------------------------------------------------------------

def _parse_float(src: str, row: int, name: str, raw: object) -> float:
    try:
        v = float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TraceError(src, row, name, raw, "not a number") from None
    if math.isnan(v):
        raise TraceError(src, row, name, raw, "NaN is not allowed")
    if math.isinf(v):
        raise TraceError(src, row, name, raw, "must be finite")
    return v


def _parse_tokens(src: str, row: int, name: str, raw: object, minimum: int) -> int:
    v = _parse_float(src, row, name, raw)
    if v != int(v):
        raise TraceError(src, row, name, raw, "token count must be an integer")
    n = int(v)
    if n < 0:
        raise TraceError(src, row, name, raw, "token count must not be negative")
    if n < minimum:
        raise TraceError(src, row, name, raw, f"token count must be >= {minimum}")
    return n


def _parse_output(src: str, row: int, name: str, raw: object, min_output: int | None) -> tuple[int, bool]:
    """Outputs >= 1; 0 is an error unless `min_output` asks for an explicit clamp (returned flag = clamped)."""
    n = _parse_tokens(src, row, name, raw, 0)
    if n == 0:
        if min_output is None:
            raise TraceError(src, row, name, raw,
                             "output length 0 (need >= 1; pass min_output=1 to clamp explicitly)")
        return min_output, True
    return n, False


def _parse_tier(src: str, row: int, raw: object, num_tiers: int | None) -> int:
    v = _parse_float(src, row, "tier", raw)
    if v != int(v) or v < 0:
        raise TraceError(src, row, "tier", raw, "tier must be a non-negative integer")
    t = int(v)
    if num_tiers is not None and t >= num_tiers:
        raise TraceError(src, row, "tier", raw, f"tier outside 0..{num_tiers - 1} (K = {num_tiers})")
    return t


def _check_min_output(min_output: int | None) -> None:
    if min_output is not None and (not isinstance(min_output, int) or min_output < 1):
        raise ConfigError("min_output", min_output, "None (error on output 0) or an integer >= 1")


# ---- row sources ------------------------------------------------------------------------------------------

def _check_file(path: Path) -> None:
    if not path.is_file():
        raise TraceError(str(path), None, "<file>", str(path), "file not found")


def _csv_rows(path: Path, required: tuple[str, ...]) -> tuple[list[str], list[dict[str, str]]]:
    """Header and rows of a CSV file; errors on an empty file or a missing column."""
    src = str(path)
    _check_file(path)
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames
        if not header:
            raise TraceError(src, None, "<header>", None, "empty file (no header)")
        header = [h.strip() for h in header]
        reader.fieldnames = header
        missing = [c for c in required if c not in header]
        if missing:
            raise TraceError(src, 0, missing[0], None, f"missing column (header has {header})")
        rows = list(reader)
    if not rows:
        raise TraceError(src, None, "<rows>", None, "file has a header but no data rows")
    return header, rows


def _cell(src: str, row: int, rec: dict, name: str) -> str:
    v = rec.get(name)
    if v is None or str(v).strip() == "":
        raise TraceError(src, row, name, v, "empty value")
    return str(v).strip()


def _finish(rows: list[TraceRow], src: str, sort: bool, has_arrivals: bool) -> list[TraceRow]:
    """Check arrivals are sorted (error by default) or sort them stably when asked."""
    if not has_arrivals:
        return rows
    for i in range(1, len(rows)):
        a, b = rows[i - 1].arrival_s, rows[i].arrival_s
        if b < a:  # type: ignore[operator]
            if sort:
                return sorted(rows, key=lambda r: r.arrival_s)  # stable: equal times keep row order
            raise TraceError(src, i + 1, "arrival", b,
                             f"arrivals not sorted (previous row {a}); pass sort=True to sort them")
    return rows


def _parse_columnar(path: Path, cols: tuple[str, str, str | None], *, num_tiers: int | None,
                    min_output: int | None, sort: bool, optional_tier: bool = False,
                    optional_app: bool = False) -> ReadResult:
    """Shared CSV path: (arrival column or None, prompt column, output column)."""
    _check_min_output(min_output)
    src = str(path)
    p_col, o_col, a_col = cols[0], cols[1], cols[2]
    required = tuple(c for c in (a_col, p_col, o_col) if c is not None)
    header, recs = _csv_rows(path, required)
    has_tier = optional_tier and "tier" in header
    has_app = optional_app and "app" in header
    out = ReadResult(source=src)
    for i, rec in enumerate(recs, start=1):
        arrival = None
        if a_col is not None:
            arrival = _parse_float(src, i, a_col, _cell(src, i, rec, a_col))
            if arrival < 0:
                raise TraceError(src, i, a_col, rec[a_col], "arrival time must be >= 0")
        prompt = _parse_tokens(src, i, p_col, _cell(src, i, rec, p_col), 1)
        output, clamped = _parse_output(src, i, o_col, _cell(src, i, rec, o_col), min_output)
        out.num_clamped += clamped
        tier = _parse_tier(src, i, _cell(src, i, rec, "tier"), num_tiers) if has_tier else None
        app = (rec.get("app") or "").strip() if has_app else ""
        out.rows.append(TraceRow(arrival, prompt, output, tier, app))
    out.rows = _finish(out.rows, src, sort, a_col is not None)
    return out


# ---- public readers (rows) ------------------------------------------------------------------------------

def read_csv_rows(path: str | Path, *, num_tiers: int | None = None, min_output: int | None = None,
                  sort: bool = False) -> ReadResult:
    """Common CSV: `arrival_s,prompt_tokens,output_tokens[,tier][,app]`; extra columns are ignored."""
    return _parse_columnar(Path(path), ("prompt_tokens", "output_tokens", "arrival_s"), num_tiers=num_tiers,
                           min_output=min_output, sort=sort, optional_tier=True, optional_app=True)


def read_lengths_rows(path: str | Path, *, min_output: int | None = None) -> ReadResult:
    """Length-only CSV `prompt_tokens,output_tokens` (shared `lengths/*.csv`)."""
    return _parse_columnar(Path(path), ("prompt_tokens", "output_tokens", None), num_tiers=None,
                           min_output=min_output, sort=False)


def _parse_azure_timestamp(src: str, row: int, raw: str) -> float:
    """Azure 2023 `TIMESTAMP` like '2023-11-16 18:15:46.6805900' → POSIX seconds (7 fractional digits)."""
    from datetime import datetime, timezone

    text = raw.strip()
    frac = 0.0
    if "." in text:
        text, f = text.split(".", 1)
        if not f.isdigit():
            raise TraceError(src, row, "TIMESTAMP", raw, "not a 'YYYY-MM-DD HH:MM:SS[.fffffff]' timestamp")
        frac = int(f) / 10 ** len(f)  # datetime parses at most 6 digits; Azure has 7
    try:
        dt = datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    except ValueError:
        raise TraceError(src, row, "TIMESTAMP", raw, "not a 'YYYY-MM-DD HH:MM:SS[.fffffff]' timestamp") from None
    return dt.timestamp() + frac


def read_azure_rows(path: str | Path, *, min_output: int | None = None, sort: bool = False) -> ReadResult:
    """Raw Azure LLM inference 2023 CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`); arrivals rebased to
    the first row (as the shared converted files are)."""
    _check_min_output(min_output)
    path = Path(path)
    src = str(path)
    _, recs = _csv_rows(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    out = ReadResult(source=src)
    abs_times = [_parse_azure_timestamp(src, i, _cell(src, i, r, "TIMESTAMP")) for i, r in enumerate(recs, 1)]
    t0 = abs_times[0]
    for i, (rec, t) in enumerate(zip(recs, abs_times), start=1):
        prompt = _parse_tokens(src, i, "ContextTokens", _cell(src, i, rec, "ContextTokens"), 1)
        output, clamped = _parse_output(src, i, "GeneratedTokens", _cell(src, i, rec, "GeneratedTokens"),
                                        min_output)
        out.num_clamped += clamped
        out.rows.append(TraceRow(round(t - t0, 6), prompt, output))
    out.rows = _finish(out.rows, src, sort, True)
    return out


def read_mooncake_rows(path: str | Path, *, min_output: int | None = None, sort: bool = False) -> ReadResult:
    """Mooncake JSONL: one object a line with `timestamp` (ms), `input_length`, `output_length`."""
    _check_min_output(min_output)
    path = Path(path)
    src = str(path)
    out = ReadResult(source=src)
    _check_file(path)
    with open(path) as f:
        lines = [(i, ln) for i, ln in enumerate(f, start=1) if ln.strip()]
    if not lines:
        raise TraceError(src, None, "<rows>", None, "empty file (no JSON lines)")
    for i, ln in lines:
        try:
            obj = json.loads(ln)
        except json.JSONDecodeError as e:
            raise TraceError(src, i, "<line>", ln.strip()[:60], f"invalid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise TraceError(src, i, "<line>", ln.strip()[:60], "expected a JSON object")
        for k in ("timestamp", "input_length", "output_length"):
            if k not in obj:
                raise TraceError(src, i, k, None, f"missing field (object has {sorted(obj)})")
        t = _parse_float(src, i, "timestamp", obj["timestamp"])
        if t < 0:
            raise TraceError(src, i, "timestamp", obj["timestamp"], "timestamp must be >= 0")
        prompt = _parse_tokens(src, i, "input_length", obj["input_length"], 1)
        output, clamped = _parse_output(src, i, "output_length", obj["output_length"], min_output)
        out.num_clamped += clamped
        out.rows.append(TraceRow(t / 1000.0, prompt, output))
    out.rows = _finish(out.rows, src, sort, True)
    return out


def read_vidur_rows(path: str | Path, *, min_output: int | None = None, sort: bool = False) -> ReadResult:
    """Vidur processed trace: `arrived_at,num_prefill_tokens,num_decode_tokens`, or a length-only file
    (no `arrived_at`; rows then have arrival None)."""
    path = Path(path)
    _check_file(path)
    with open(path, newline="") as f:
        first = f.readline()
    has_arrival = "arrived_at" in [c.strip() for c in first.strip().split(",")]
    cols = ("num_prefill_tokens", "num_decode_tokens", "arrived_at" if has_arrival else None)
    return _parse_columnar(path, cols, num_tiers=None, min_output=min_output, sort=sort)


def read_vidur_run_rows(run_dir: str | Path, *, min_output: int | None = None) -> ReadResult:
    """A Vidur reference run folder: lengths from `request_metrics.csv` (by `Request Id`), arrivals from
    `request_arrival_time_series.csv` in request-id order, so the exact same requests replay."""
    _check_min_output(min_output)
    run_dir = Path(run_dir)
    mpath, apath = run_dir / "request_metrics.csv", run_dir / "request_arrival_time_series.csv"
    for p in (mpath, apath):
        if not p.is_file():
            raise TraceError(str(run_dir), None, "<file>", p.name, "missing file in Vidur run folder")
    msrc, asrc = str(mpath), str(apath)
    _, mrecs = _csv_rows(mpath, ("Request Id", "request_num_prefill_tokens", "request_num_decode_tokens"))
    _, arecs = _csv_rows(apath, ("Time (sec)",))
    if len(arecs) != len(mrecs):
        raise TraceError(asrc, None, "<rows>", len(arecs),
                         f"arrival series has {len(arecs)} rows but request_metrics has {len(mrecs)}")
    by_id: dict[int, tuple[int, int]] = {}
    out = ReadResult(source=msrc)
    for i, rec in enumerate(mrecs, start=1):
        rid = _parse_tokens(msrc, i, "Request Id", _cell(msrc, i, rec, "Request Id"), 0)
        if rid in by_id:
            raise TraceError(msrc, i, "Request Id", rid, "duplicate request id")
        prompt = _parse_tokens(msrc, i, "request_num_prefill_tokens",
                               _cell(msrc, i, rec, "request_num_prefill_tokens"), 1)
        output, clamped = _parse_output(msrc, i, "request_num_decode_tokens",
                                        _cell(msrc, i, rec, "request_num_decode_tokens"), min_output)
        out.num_clamped += clamped
        by_id[rid] = (prompt, output)
    if sorted(by_id) != list(range(len(by_id))):
        raise TraceError(msrc, None, "Request Id", None, f"ids are not exactly 0..{len(by_id) - 1}")
    for i, rec in enumerate(arecs, start=1):
        t = _parse_float(asrc, i, "Time (sec)", _cell(asrc, i, rec, "Time (sec)"))
        if t < 0:
            raise TraceError(asrc, i, "Time (sec)", t, "arrival time must be >= 0")
        prompt, output = by_id[i - 1]
        out.rows.append(TraceRow(t, prompt, output))
    out.rows = _finish(out.rows, asrc, False, True)
    return out


def read_rows(path: str | Path, fmt: str, *, num_tiers: int | None = None, min_output: int | None = None,
              sort: bool = False) -> ReadResult:
    """Dispatch on `fmt` (one of TRACE_FORMATS)."""
    if fmt == "csv":
        return read_csv_rows(path, num_tiers=num_tiers, min_output=min_output, sort=sort)
    if fmt == "azure":
        return read_azure_rows(path, min_output=min_output, sort=sort)
    if fmt == "mooncake":
        return read_mooncake_rows(path, min_output=min_output, sort=sort)
    if fmt == "vidur":
        return read_vidur_rows(path, min_output=min_output, sort=sort)
    if fmt == "vidur_run":
        if sort:
            raise ConfigError("trace.sort", sort, "false for vidur_run (arrivals follow request ids)")
        return read_vidur_run_rows(path, min_output=min_output)
    raise ConfigError("trace.format", fmt, " | ".join(TRACE_FORMATS))


# ---- public readers (requests) --------------------------------------------------------------------------

def rows_to_requests(rows: list[TraceRow], source: str = "trace") -> list[Request]:
    """Requests with ids 0..n-1 in (sorted) row order; rows without arrivals are an error here."""
    reqs = []
    for i, r in enumerate(rows):
        if r.arrival_s is None:
            raise TraceError(source, i + 1, "arrival", None,
                             "length-only file has no arrivals; use it as a length distribution")
        reqs.append(Request(id=i, arrival_s=float(r.arrival_s), prompt_tokens=r.prompt_tokens,
                            output_tokens=r.output_tokens, tier=r.tier if r.tier is not None else 0,
                            app=r.app))
    return reqs


def read_trace(path: str | Path, fmt: str = "csv", *, num_tiers: int | None = None,
               min_output: int | None = None, sort: bool = False) -> list[Request]:
    """Read any supported trace into requests sorted by arrival, ids 0..n-1 (tier 0 when the file has none)."""
    res = read_rows(path, fmt, num_tiers=num_tiers, min_output=min_output, sort=sort)
    return rows_to_requests(res.rows, res.source)


def read_csv(path: str | Path, **kw) -> list[Request]:
    return read_trace(path, "csv", **kw)


def read_azure(path: str | Path, **kw) -> list[Request]:
    return read_trace(path, "azure", **kw)


def read_mooncake(path: str | Path, **kw) -> list[Request]:
    return read_trace(path, "mooncake", **kw)


def read_vidur(path: str | Path, **kw) -> list[Request]:
    return read_trace(path, "vidur", **kw)


def read_vidur_run(run_dir: str | Path, **kw) -> list[Request]:
    return read_trace(run_dir, "vidur_run", **kw)
