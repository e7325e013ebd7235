"""Trace readers: each turns one public trace format into `list[Request]`, sorted by arrival, ids 0..n-1.

Every malformed value raises `TraceError(source, row, field, value, problem)`; no row is ever dropped or
changed silently. `row` is the 1-based data row (the header is row 0; JSONL lines count from 1). Files go
through the input layer (`tierserve.core.files`): UTF-8 or gzip, no duplicate columns, no ragged rows, sizes
within the stated limits. Numbers are plain decimal text (no `1_000`) or JSON numbers (never `true`); token
counts are integers up to 2^31 − 1 and arrival times at most 1e9 s (`tierserve.core.limits`).

Output length 0: Vidur (and the simulator) need prompts >= 1 and outputs >= 1. A zero output is an error
naming the row unless the caller passes `min_output=1`, which clamps it explicitly and reports the count in
`ReadResult.num_clamped`.

Prefix identity (issue 28): a CSV may carry `hash_ids` (Mooncake's space-separated ids, one per
`hash_block_tokens` = 512 prompt tokens, the last block possibly partial) and `session_id`. The ids are chained
(`chain_block_ids`: hash i covers ids 0..i) so that equal hashes mean equal prefixes whatever the file's ids
mean, and only full blocks are kept (vLLM caches full blocks only). Both columns are optional.

Over 600 lines: every reader (csv, lengths, azure, mooncake, vidur, vidur_run, 20–60 lines each) and the cell
parsers they all share (numbers, tokens, times, tiers, prefix columns) with their error rule, kept in one
place so a format's rule for a value is the same as every other's.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from itertools import repeat
from pathlib import Path

from tierserve.core import limits
from tierserve.core.errors import ConfigError, TraceError
from tierserve.core.files import CsvTable, open_lines, read_csv_table
from tierserve.core.gc_tuning import collect_less_often
from tierserve.core.limits import MAX_TIME_S, MAX_TOKENS
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
    prefix_hashes: tuple[int, ...] = ()   # chained, one per full block of hash_block_tokens prompt tokens
    hash_block_tokens: int = 0
    session_id: int = -1


@dataclass(slots=True)
class ReadResult:
    """Parsed rows plus what was done to them on request (never silently)."""

    rows: list[TraceRow] = field(default_factory=list)
    num_clamped: int = 0          # outputs raised from 0 to min_output (opt-in)
    source: str = ""


# ---- value parsing ---------------------------------------------------------------------------------------

# A number as text: ASCII digits, optional sign, fraction and exponent. Python's float() also takes `1_000`,
# non-ASCII digits and surrounding junk-free words like "infinity"; a trace cell must be a plain number.
_NUMBER = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_NON_FINITE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)


def _float_or_none(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _parse_float(src: str, row: int, name: str, raw: object) -> float:
    """A finite number from a CSV cell (plain decimal text) or a JSON value (a number, never a boolean)."""
    if type(raw) is str and raw.isascii() and "_" not in raw:      # the common case, parsed once
        try:
            v = float(raw)
        except ValueError:
            pass
        else:
            if v - v == 0.0:        # finite: inf - inf and NaN - NaN are NaN; the rest is told below
                return v
    return _parse_float_checked(src, row, name, raw)


def _parse_float_checked(src: str, row: int, name: str, raw: object) -> float:
    """`_parse_float`, every case told apart (the errors)."""
    if type(raw) is str and raw.isascii() and "_" not in raw and _float_or_none(raw) is not None:
        v = float(raw)        # the common case; with no "_" and ASCII only, float() reads exactly _NUMBER's forms
    elif isinstance(raw, str):
        if _NON_FINITE.fullmatch(raw.strip()):
            raise TraceError(src, row, name, raw, "NaN is not allowed" if "n" == raw.strip().lstrip("+-")[:1].lower()
                             else "must be finite")
        raise TraceError(src, row, name, raw, "not a number (plain decimal digits, e.g. 12 or 0.5)")
    elif isinstance(raw, bool):
        raise TraceError(src, row, name, raw, "a number is needed, not a boolean")
    elif isinstance(raw, (int, float)):
        try:
            v = float(raw)
        except OverflowError:
            raise TraceError(src, row, name, raw, "must be finite") from None
    else:
        raise TraceError(src, row, name, raw, "not a number")
    if v != v:
        raise TraceError(src, row, name, raw, "NaN is not allowed")
    if v in (math.inf, -math.inf):
        raise TraceError(src, row, name, raw, "must be finite")
    return v


def _parse_time(src: str, row: int, name: str, raw: object, scale: float = 1.0) -> float:
    """An arrival time in seconds (raw value × scale): >= 0 and at most MAX_TIME_S."""
    t = _parse_float(src, row, name, raw) * scale
    if t < 0:
        raise TraceError(src, row, name, raw, "arrival time must be >= 0")
    if t > MAX_TIME_S:
        raise TraceError(src, row, name, raw, f"arrival time must be at most {MAX_TIME_S:g} s (beyond it float "
                                              "time loses sub-microsecond resolution)")
    return t


def _parse_tokens(src: str, row: int, name: str, raw: object, minimum: int) -> int:
    # the common case: plain ASCII digits within the bounds (at most 10 of them: MAX_TOKENS has 10)
    if type(raw) is str and len(raw) <= 10 and raw.isdigit() and raw.isascii():
        n = int(raw)
        if minimum <= n <= MAX_TOKENS:
            return n
    return _parse_tokens_checked(src, row, name, raw, minimum)


def _parse_tokens_checked(src: str, row: int, name: str, raw: object, minimum: int) -> int:
    """`_parse_tokens`, every value through the general float parser (the errors)."""
    v = _parse_float_checked(src, row, name, raw)
    if v != int(v):
        raise TraceError(src, row, name, raw, "token count must be an integer")
    if v < 0:
        raise TraceError(src, row, name, raw, "token count must not be negative")
    if v > MAX_TOKENS:
        raise TraceError(src, row, name, raw, f"token count must be at most {MAX_TOKENS:,}")
    n = int(v)
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
    k = num_tiers if num_tiers is not None else limits.TIERS.value
    if v >= k:
        raise TraceError(src, row, "tier", raw, f"tier outside 0..{k - 1} (K = {k})" if num_tiers is not None
                         else f"tier outside 0..{k - 1} ({limits.TIERS.allowed()})")
    return int(v)


def parse_count(src: str, row: int, name: str, raw: object, minimum: int = 0) -> int:
    """An integer count from a cell of any reader's file: plain digits, or an integral float such as `44.0`
    (Vidur writes token counts so in trace replays); `44.5` is a TraceError naming file, row and field."""
    return _parse_tokens(src, row, name, raw, minimum)


def parse_number(src: str, row: int, name: str, raw: object) -> float:
    """A finite number from a cell of any reader's file; anything else is a TraceError naming file, row and field."""
    return _parse_float(src, row, name, raw)


def _check_min_output(min_output: int | None) -> None:
    if min_output is not None and (isinstance(min_output, bool) or not isinstance(min_output, int)
                                   or not 1 <= min_output <= MAX_TOKENS):
        raise ConfigError("min_output", min_output, "None (error on output 0) or an integer >= 1")


MOONCAKE_BLOCK_TOKENS = 512      # the Mooncake traces' hash_ids block size (kvcache-ai/Mooncake FAST25-release)
_CHAIN_ROOT = 0


def chain_block_ids(ids, start: int = _CHAIN_ROOT) -> tuple[int, ...]:
    """Chained block hashes: hash i = H(hash i-1, id i), so equal hashes mean equal id sequences up to i (as
    vLLM v1 hashes blocks); `start` continues a chain from its last hash. Ints only: Python's int and tuple
    hashes do not depend on PYTHONHASHSEED."""
    out = []
    h = start
    for x in ids:
        h = hash((h, x))
        out.append(h)
    return tuple(out)


def _parse_hash_ids(src: str, row: int, name: str, raw: object, prompt_tokens: int,
                    block_tokens: int) -> tuple[int, ...]:
    """A row's block ids (space-separated non-negative integers, or a JSON list of them) → chained hashes of
    its full blocks. More ids than the prompt has blocks is an error naming the row."""
    if isinstance(raw, str):
        parts = raw.split()
        if not all(p.isascii() and p.isdigit() and len(p) <= 19 for p in parts):
            raise TraceError(src, row, name, raw[:80], "space-separated non-negative integer block ids "
                                                       "(e.g. '0 1 2')")
        ids = list(map(int, parts))
    elif isinstance(raw, list) and all(type(x) is int and 0 <= x < 2**63 for x in raw):
        ids = raw
    else:
        raise TraceError(src, row, name, str(raw)[:80], "a list of non-negative integer block ids")
    max_blocks = -(-prompt_tokens // block_tokens)
    if len(ids) > max_blocks:
        raise TraceError(src, row, name, raw if isinstance(raw, str) and len(raw) <= 80 else f"{len(ids)} ids",
                         f"{len(ids)} block ids for {prompt_tokens} prompt tokens; at most {max_blocks} "
                         f"(one per {block_tokens}-token block)")
    return chain_block_ids(ids[:prompt_tokens // block_tokens])


def _parse_session(src: str, row: int, raw: str) -> int:
    return _parse_tokens(src, row, "session_id", raw, 0)


def _with_prefix_columns(rows: list[TraceRow], t: CsvTable, src: str, block_tokens: int) -> list[TraceRow]:
    """Rows with their `hash_ids` and `session_id` cells parsed (rows unchanged when the file has neither)."""
    hi = t.index("hash_ids") if t.has("hash_ids") else None
    si = t.index("session_id") if t.has("session_id") else None
    if hi is None and si is None:
        return rows
    out = []
    for i, (r, rec) in enumerate(zip(rows, t.rows), start=1):
        hashes = _parse_hash_ids(src, i, "hash_ids", rec[hi], r.prompt_tokens, block_tokens) if hi is not None else ()
        session = _parse_session(src, i, _cell(src, i, rec, si, "session_id")) if si is not None else -1
        out.append(TraceRow(r.arrival_s, r.prompt_tokens, r.output_tokens, r.tier, r.app, hashes,
                            block_tokens if hi is not None else 0, session))
    return out


# ---- whole columns at once ----------------------------------------------------------------------------------
# A column whose every cell is plain (what the cell-by-cell parsers accept without a question) is parsed in one
# pass; None otherwise, and the caller parses cell by cell, which names the first bad cell as before.

def _bulk_tokens(cells: list[str], minimum: int) -> list[int] | None:
    """int(cell) for each cell when all are ASCII digit strings (at most 10) within [minimum, MAX_TOKENS]."""
    if not cells or not all(cells) or max(map(len, cells)) > 10:
        return None
    joined = "".join(cells)
    if not (joined.isascii() and joined.isdigit()):
        return None
    values = list(map(int, cells))
    return values if minimum <= min(values) and max(values) <= MAX_TOKENS else None


def _bulk_times(cells: list[str]) -> list[float] | None:
    """float(cell) for each cell when all are ASCII number texts without "_" and every time is in
    [0, MAX_TIME_S] (`_parse_time` with scale 1)."""
    if not cells or not all(cells):
        return None
    joined = "".join(cells)
    if not joined.isascii() or "_" in joined:
        return None
    try:
        values = list(map(float, cells))
    except ValueError:
        return None
    if not all(map(math.isfinite, values)) or min(values) < 0 or max(values) > MAX_TIME_S:
        return None
    return values


# ---- row sources ------------------------------------------------------------------------------------------

def _csv_rows(path: Path, required: tuple[str, ...]) -> CsvTable:
    """Header and rows of a trace CSV (gzip read transparently), checked by the input layer."""
    return read_csv_table(path, required, error=TraceError, gzip_ok=True)


def _cell(src: str, row: int, rec: list[str], col: int, name: str) -> str:
    v = rec[col]
    if v == "":
        raise TraceError(src, row, name, v, "empty value")
    return v


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
                    optional_app: bool = False, table: CsvTable | None = None,
                    hash_block_tokens: int | None = None) -> ReadResult:
    """Shared CSV path: (prompt column, output column, arrival column or None); `hash_block_tokens` set reads
    the optional `hash_ids` and `session_id` columns."""
    _check_min_output(min_output)
    src = str(path)
    p_col, o_col, a_col = cols[0], cols[1], cols[2]
    required = tuple(c for c in (a_col, p_col, o_col) if c is not None)
    t = table if table is not None else _csv_rows(path, required)
    pi, oi = t.index(p_col), t.index(o_col)
    ai = t.index(a_col) if a_col is not None else None
    ti = t.index("tier") if optional_tier and t.has("tier") else None
    api = t.index("app") if optional_app and t.has("app") else None
    out = ReadResult(source=src)
    rows = _plain_columnar_rows(t.rows, pi, oi, ai, ti, api, num_tiers)
    if rows is not None:
        if hash_block_tokens is not None:
            rows = _with_prefix_columns(rows, t, src, hash_block_tokens)
        out.rows = _finish(rows, src, sort, a_col is not None)
        return out
    for i, rec in enumerate(t.rows, start=1):
        arrival = None
        if ai is not None:
            arrival = _parse_time(src, i, a_col, _cell(src, i, rec, ai, a_col))  # type: ignore[arg-type]
        prompt = _parse_tokens(src, i, p_col, _cell(src, i, rec, pi, p_col), 1)
        output, clamped = _parse_output(src, i, o_col, _cell(src, i, rec, oi, o_col), min_output)
        out.num_clamped += clamped
        tier = _parse_tier(src, i, _cell(src, i, rec, ti, "tier"), num_tiers) if ti is not None else None
        app = rec[api] if api is not None else ""
        out.rows.append(TraceRow(arrival, prompt, output, tier, app))
    if hash_block_tokens is not None:
        out.rows = _with_prefix_columns(out.rows, t, src, hash_block_tokens)
    out.rows = _finish(out.rows, src, sort, a_col is not None)
    return out


def _plain_columnar_rows(recs: list[list[str]], pi: int, oi: int, ai: int | None, ti: int | None,
                         api: int | None, num_tiers: int | None) -> list[TraceRow] | None:
    """`_parse_columnar`'s rows, a column at a time, when every cell is plain and no output needs clamping."""
    prompts = _bulk_tokens([r[pi] for r in recs], 1)
    outputs = _bulk_tokens([r[oi] for r in recs], 1) if prompts is not None else None
    if outputs is None:
        return None
    if ai is None:
        arrivals: list[float] | list[None] = [None] * len(recs)
    else:
        times = _bulk_times([r[ai] for r in recs])
        if times is None:
            return None
        arrivals = times
    if ti is None:
        tiers: list[int] | list[None] = [None] * len(recs)
    else:
        k = num_tiers if num_tiers is not None else limits.TIERS.value
        tier_values = _bulk_tokens([r[ti] for r in recs], 0)
        if tier_values is None or max(tier_values) >= k:
            return None
        tiers = tier_values
    apps = [r[api] for r in recs] if api is not None else repeat("")
    return list(map(TraceRow, arrivals, prompts, outputs, tiers, apps))


# ---- public readers (rows) ------------------------------------------------------------------------------

def read_csv_rows(path: str | Path, *, num_tiers: int | None = None, min_output: int | None = None,
                  sort: bool = False, hash_block_tokens: int = MOONCAKE_BLOCK_TOKENS) -> ReadResult:
    """Common CSV: `arrival_s,prompt_tokens,output_tokens[,tier][,app][,hash_ids][,session_id]`; extra columns
    are ignored. `hash_ids` are block ids of `hash_block_tokens` tokens each (Mooncake: 512)."""
    _check_block_tokens(hash_block_tokens)
    return _parse_columnar(Path(path), ("prompt_tokens", "output_tokens", "arrival_s"), num_tiers=num_tiers,
                           min_output=min_output, sort=sort, optional_tier=True, optional_app=True,
                           hash_block_tokens=hash_block_tokens)


def _check_block_tokens(n: object) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_TOKENS:
        raise ConfigError("hash_block_tokens", n, f"an integer in 1..{MAX_TOKENS:,}")


def read_lengths_rows(path: str | Path, *, min_output: int | None = None) -> ReadResult:
    """Length-only CSV `prompt_tokens,output_tokens` (shared `lengths/*.csv`)."""
    return _parse_columnar(Path(path), ("prompt_tokens", "output_tokens", None), num_tiers=None,
                           min_output=min_output, sort=False)


_AZURE_TS = re.compile(r"([0-9]{4}-[0-9]{2}-[0-9]{2} [0-9]{2}:[0-9]{2}:[0-9]{2})(?:\.([0-9]{1,9}))?")


def _parse_azure_timestamp(src: str, row: int, raw: str) -> float:
    """Azure 2023 `TIMESTAMP` like '2023-11-16 18:15:46.6805900' → POSIX seconds (7 fractional digits)."""
    from datetime import datetime, timezone

    m = _AZURE_TS.fullmatch(raw.strip())
    if m is None:
        raise TraceError(src, row, "TIMESTAMP", raw, "not a 'YYYY-MM-DD HH:MM:SS[.fffffff]' timestamp")
    text, f = m.group(1), m.group(2) or ""
    frac = int(f) / 10 ** len(f) if f else 0.0  # datetime parses at most 6 digits; Azure has 7
    try:
        dt = datetime.strptime(text, "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc)
    except ValueError:
        raise TraceError(src, row, "TIMESTAMP", raw, "not a 'YYYY-MM-DD HH:MM:SS[.fffffff]' timestamp") from None
    return dt.timestamp() + frac


def read_azure_rows(path: str | Path, *, min_output: int | None = None, sort: bool = False) -> ReadResult:
    """Raw Azure LLM inference 2023 CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`); arrivals rebased to
    the first row (as the shared converted files are; with sort=True, to the earliest)."""
    _check_min_output(min_output)
    path = Path(path)
    src = str(path)
    t = _csv_rows(path, ("TIMESTAMP", "ContextTokens", "GeneratedTokens"))
    si, ci, gi = t.index("TIMESTAMP"), t.index("ContextTokens"), t.index("GeneratedTokens")
    out = ReadResult(source=src)
    abs_times = [_parse_azure_timestamp(src, i, _cell(src, i, r, si, "TIMESTAMP")) for i, r in enumerate(t.rows, 1)]
    t0 = min(abs_times)  # the first row's time when sorted (an unsorted file is an error unless sort=True)
    for i, (rec, ts) in enumerate(zip(t.rows, abs_times), start=1):
        arrival = _parse_time(src, i, "TIMESTAMP", round(ts - t0, 6))
        prompt = _parse_tokens(src, i, "ContextTokens", _cell(src, i, rec, ci, "ContextTokens"), 1)
        output, clamped = _parse_output(src, i, "GeneratedTokens", _cell(src, i, rec, gi, "GeneratedTokens"),
                                        min_output)
        out.num_clamped += clamped
        out.rows.append(TraceRow(arrival, prompt, output))
    out.rows = _finish(out.rows, src, sort, True)
    return out


def read_mooncake_rows(path: str | Path, *, min_output: int | None = None, sort: bool = False) -> ReadResult:
    """Mooncake JSONL: one object a line with `timestamp` (ms), `input_length`, `output_length` and optional
    `hash_ids` (a list of 512-token block ids, chained as in `chain_block_ids`)."""
    _check_min_output(min_output)
    path = Path(path)
    src = str(path)
    out = ReadResult(source=src)
    row_limit = limits.REQUESTS.value
    with open_lines(path, error=TraceError, gzip_ok=True) as lines:
        for i, ln in enumerate(lines, start=1):
            if not ln.strip():
                continue
            if len(out.rows) >= row_limit:
                raise TraceError(src, i, "<rows>", f"more than {row_limit:,} rows", limits.REQUESTS.allowed())
            try:
                obj = json.loads(ln, object_pairs_hook=_unique_keys)
            except RecursionError:
                raise TraceError(src, i, "<line>", ln.strip()[:60], "invalid JSON (nested too deeply)") from None
            except ValueError as e:
                raise TraceError(src, i, "<line>", ln.strip()[:60],
                                 f"invalid JSON ({getattr(e, 'msg', None) or e})") from None
            if not isinstance(obj, dict):
                raise TraceError(src, i, "<line>", ln.strip()[:60], "expected a JSON object")
            for k in ("timestamp", "input_length", "output_length"):
                if k not in obj:
                    raise TraceError(src, i, k, None, f"missing field (object has {sorted(obj)[:10]})")
            for k in ("timestamp", "input_length", "output_length"):
                if isinstance(obj[k], str):
                    raise TraceError(src, i, k, obj[k], "not a number (a JSON number is needed, not text)")
            t = _parse_time(src, i, "timestamp", obj["timestamp"], 1e-3)
            prompt = _parse_tokens(src, i, "input_length", obj["input_length"], 1)
            output, clamped = _parse_output(src, i, "output_length", obj["output_length"], min_output)
            out.num_clamped += clamped
            if "hash_ids" in obj:
                hashes = _parse_hash_ids(src, i, "hash_ids", obj["hash_ids"], prompt, MOONCAKE_BLOCK_TOKENS)
                out.rows.append(TraceRow(t, prompt, output, None, "", hashes, MOONCAKE_BLOCK_TOKENS))
            else:
                out.rows.append(TraceRow(t, prompt, output))
    if not out.rows:
        raise TraceError(src, None, "<rows>", None, "empty file (no JSON lines)")
    out.rows = _finish(out.rows, src, sort, True)
    return out


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"duplicate key {k!r}")
        out[k] = v
    return out


def read_vidur_rows(path: str | Path, *, min_output: int | None = None, sort: bool = False) -> ReadResult:
    """Vidur processed trace: `arrived_at,num_prefill_tokens,num_decode_tokens`, or a length-only file
    (no `arrived_at`; rows then have arrival None)."""
    path = Path(path)
    table = _csv_rows(path, ("num_prefill_tokens", "num_decode_tokens"))
    cols = ("num_prefill_tokens", "num_decode_tokens", "arrived_at" if table.has("arrived_at") else None)
    return _parse_columnar(path, cols, num_tiers=None, min_output=min_output, sort=sort, table=table)


def read_vidur_run_rows(run_dir: str | Path, *, min_output: int | None = None) -> ReadResult:
    """A Vidur reference run folder: lengths from `request_metrics.csv` (by `Request Id`), arrivals from
    `request_arrival_time_series.csv` in request-id order, so the exact same requests replay."""
    _check_min_output(min_output)
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise TraceError(str(run_dir), None, "<folder>", str(run_dir), "a Vidur run folder (not found or not a folder)")
    mpath, apath = run_dir / "request_metrics.csv", run_dir / "request_arrival_time_series.csv"
    for p in (mpath, apath):
        if not p.exists():
            raise TraceError(str(run_dir), None, "<file>", p.name, "missing file in Vidur run folder")
    msrc, asrc = str(mpath), str(apath)
    mt = _csv_rows(mpath, ("Request Id", "request_num_prefill_tokens", "request_num_decode_tokens"))
    at = _csv_rows(apath, ("Time (sec)",))
    if len(at.rows) != len(mt.rows):
        raise TraceError(asrc, None, "<rows>", len(at.rows),
                         f"arrival series has {len(at.rows)} rows but request_metrics has {len(mt.rows)}")
    ri, pi, di = (mt.index(c) for c in ("Request Id", "request_num_prefill_tokens", "request_num_decode_tokens"))
    out = ReadResult(source=msrc)
    rows = _plain_vidur_run_rows(mt.rows, ri, pi, di, at.rows, at.index("Time (sec)"))
    if rows is not None:
        out.rows = _finish(rows, asrc, False, True)
        return out
    by_id: dict[int, tuple[int, int]] = {}
    for i, rec in enumerate(mt.rows, start=1):
        rid = _parse_tokens(msrc, i, "Request Id", _cell(msrc, i, rec, ri, "Request Id"), 0)
        if rid in by_id:
            raise TraceError(msrc, i, "Request Id", rid, "duplicate request id")
        prompt = _parse_tokens(msrc, i, "request_num_prefill_tokens",
                               _cell(msrc, i, rec, pi, "request_num_prefill_tokens"), 1)
        output, clamped = _parse_output(msrc, i, "request_num_decode_tokens",
                                        _cell(msrc, i, rec, di, "request_num_decode_tokens"), min_output)
        out.num_clamped += clamped
        by_id[rid] = (prompt, output)
    if sorted(by_id) != list(range(len(by_id))):
        raise TraceError(msrc, None, "Request Id", None, f"ids are not exactly 0..{len(by_id) - 1}")
    ti = at.index("Time (sec)")
    for i, rec in enumerate(at.rows, start=1):
        t = _parse_time(asrc, i, "Time (sec)", _cell(asrc, i, rec, ti, "Time (sec)"))
        prompt, output = by_id[i - 1]
        out.rows.append(TraceRow(t, prompt, output))
    out.rows = _finish(out.rows, asrc, False, True)
    return out


def _plain_vidur_run_rows(metric_recs: list[list[str]], ri: int, pi: int, di: int, arrival_recs: list[list[str]],
                          ti: int) -> list[TraceRow] | None:
    """`read_vidur_run_rows`' rows, a column at a time, when every cell is plain, the ids are exactly 0..n-1
    and no output needs clamping."""
    ids = _bulk_tokens([r[ri] for r in metric_recs], 0)
    if ids is None or sorted(ids) != list(range(len(ids))):
        return None
    prompts = _bulk_tokens([r[pi] for r in metric_recs], 1)
    outputs = _bulk_tokens([r[di] for r in metric_recs], 1) if prompts is not None else None
    times = _bulk_times([r[ti] for r in arrival_recs]) if outputs is not None else None
    if times is None:
        return None
    row_of_id = [0] * len(ids)
    for row, rid in enumerate(ids):
        row_of_id[rid] = row
    return [TraceRow(t, prompts[row], outputs[row]) for t, row in zip(times, row_of_id)]


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
                            app=r.app, prefix_hashes=r.prefix_hashes, hash_block_tokens=r.hash_block_tokens,
                            session_id=r.session_id))
    return reqs


def read_trace(path: str | Path, fmt: str = "csv", *, num_tiers: int | None = None,
               min_output: int | None = None, sort: bool = False) -> list[Request]:
    """Read any supported trace into requests sorted by arrival, ids 0..n-1 (tier 0 when the file has none)."""
    with collect_less_often():          # rows and requests are all kept: nothing for the collector to find
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
