"""Streaming outputs: per-request records written to disk as requests end, per-tier statistics from streaming
estimators, and queue-stability verdicts from a compact spool — memory flat in the number of requests.

`RunRecorder` is the sink `simulate(..., sink=...)` hands every request to when it ends (finished, rejected,
or — at the end of the run — censored, each with its reason) and then forgets. It:
- writes `requests.csv` (or `requests.parquet`, through pyarrow) under a temporary `.partial` name, in arrival
  order (a reorder buffer holds rows that ended before an earlier arrival did: memory proportional to the
  requests in flight, not to the run), renamed to its final name only when the run is whole; the CSV is
  byte-identical to `RequestTable.to_csv` of the in-memory run;
- accumulates, per tier, the summary `summarize` computes from a table. Exact: every count (total, finished,
  rejected, censored, relegated, SLO met, TBT-max met), SLO attainment, goodput, throughput and token rates,
  preemptions, migrations, each latency's `n` and `max`, and the token-level TBT (the simulator's histogram,
  the same as in memory). Latency means come from a compensated (Neumaier) sum: equal to numpy's mean to
  float rounding (~1e-15 relative). Latency percentiles (TTFT, TPOT, TTLT, normalized latency; P50–P99) come
  from a `LogHistogram` of relative bin width w (0.1%): each order statistic is read as its bin's geometric
  centre, clamped to the observed min/max, and interpolated linearly as numpy.percentile does, so
  |estimate − exact| ≤ (√(1+w) − 1)·exact + (1+w)·1 µs, i.e. ≤ 0.05% + 1 µs (`PERCENTILE_BOUND`);
- spools (arrival, TTFT, censored, tier) of every queued request, 21 bytes each, to a temporary file, from
  which `verdicts` computes the same stability verdicts as `run_stability` on the table (exactly: the same
  windows, the same medians), holding one window of values at a time.
"""
from __future__ import annotations

import contextlib
import csv
import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tierserve.core import Outcome, RequestState, Status, TierSet, request_of
from tierserve.core.histogram import LogHistogram
from tierserve.metrics.records import COLUMNS, SLO_EPS_S, TokenTBT
from tierserve.metrics.stats import PERCENTILES, LatencyStats
from tierserve.metrics.summary import ALL, RunSummary, TierSummary, _tier_names

REL_WIDTH = 1e-3
MIN_VALUE_S = 1e-6
PERCENTILE_REL = math.sqrt(1.0 + REL_WIDTH) - 1.0
PERCENTILE_ABS_S = MIN_VALUE_S * (1.0 + REL_WIDTH)
PERCENTILE_BOUND = (f"latency percentiles (P50/P90/P95/P99 of TTFT, TPOT, TTLT, normalized latency) are streamed "
                    f"estimates from log-binned histograms ({REL_WIDTH:.1%} bins): |estimate - exact| <= "
                    f"{PERCENTILE_REL:.2e} x exact + {PERCENTILE_ABS_S:.3g} s; counts, attainment, goodput, "
                    f"throughput, n and max are exact; means equal to float rounding; TBT as in memory")
FORMATS = ("csv", "parquet")
_FLOAT_COLS = {n for n, d in COLUMNS.items() if d is np.float64}
_SPOOL_DTYPE = np.dtype([("a", "<f8"), ("t", "<f8"), ("c", "u1"), ("k", "<i4")])
_FLUSH_ROWS = 1 << 15


def _ts(x: float) -> float:
    return x if x >= 0 else math.nan


def _target(x: float | None) -> float:
    return math.nan if x is None else float(x)


def _le_or_unset(value: float, target: float) -> bool:
    return target != target or value <= target + SLO_EPS_S


def record_row(state: RequestState, reason: str | None) -> tuple:
    """The row `RequestTable.from_states` makes of `state`, as Python values in `COLUMNS` order."""
    r = request_of(state)
    slo = r.slo
    status = state.status
    if status == Status.FINISHED:
        outcome = int(Outcome.RELEGATED if state.relegated_s >= 0 else Outcome.FINISHED)
    elif status == Status.REJECTED:
        outcome = int(Outcome.REJECTED)
    else:
        outcome = int(Outcome.CENSORED)
    return (int(r.id), int(r.tier), r.app, float(r.arrival_s), float(_ts(state.dispatch_s)),
            float(_ts(state.first_token_s)), float(_ts(state.finish_s)), int(r.prompt_tokens),
            int(r.output_tokens), int(state.num_generated), int(state.num_preemptions), int(state.num_swaps),
            int(state.num_migrations), int(state.replica), outcome, reason or state.relegation_reason,
            float(_ts(state.relegated_s)), float(state.tbt_max_s), _target(slo.ttft_s), _target(slo.tbt_s),
            _target(slo.ttlt_s))


class _Latency:
    """Streaming stats of one latency: exact n, max, min; compensated sum; log-binned histogram."""

    __slots__ = ("hist", "n", "s", "comp", "lo", "hi")

    def __init__(self) -> None:
        self.hist = LogHistogram(MIN_VALUE_S, REL_WIDTH)
        self.n = 0
        self.s = 0.0
        self.comp = 0.0
        self.lo = math.inf
        self.hi = -math.inf

    def add(self, v: float) -> None:
        if v != v:
            return
        self.hist.add(v)
        self.n += 1
        t = self.s + v                              # Neumaier's compensated sum
        self.comp += (self.s - t) + v if abs(self.s) >= abs(v) else (v - t) + self.s
        self.s = t
        if v < self.lo:
            self.lo = v
        if v > self.hi:
            self.hi = v

    def merge(self, o: _Latency) -> None:
        self.hist.merge(o.hist)
        self.n += o.n
        t = self.s + o.s
        self.comp += ((self.s - t) + o.s if abs(self.s) >= abs(o.s) else (o.s - t) + self.s) + o.comp
        self.s = t
        self.lo = min(self.lo, o.lo)
        self.hi = max(self.hi, o.hi)

    def stats(self) -> LatencyStats:
        if self.n == 0:
            return LatencyStats()
        keys = sorted(self.hist.counts)
        cum = np.cumsum([self.hist.counts[b] for b in keys])
        centres = [self.hist.bin_value(b) for b in keys]

        def order_stat(j: int) -> float:          # the (j+1)-th smallest, 0-based j
            if j <= 0:
                return self.lo
            if j >= self.n - 1:
                return self.hi
            v = centres[int(np.searchsorted(cum, j + 1, side="left"))]
            return min(max(v, self.lo), self.hi)

        ps = []
        for p in PERCENTILES:
            h = (self.n - 1) * (p / 100.0)
            j = int(math.floor(h))
            g = h - j
            a = order_stat(j)
            ps.append(a if g == 0 else a + g * (order_stat(j + 1) - a))
        return LatencyStats(self.n, (self.s + self.comp) / self.n, *ps, self.hi)


class _TierAcc:
    """Everything `summarize_tier` reads from a tier's rows, accumulated row by row."""

    __slots__ = ("total", "finished", "rejected", "censored", "relegated", "met", "met_strict", "out_fin",
                 "prompt_fin", "generated", "preemptions", "migrations", "ttft", "tpot", "ttlt", "norm")

    def __init__(self) -> None:
        self.total = self.finished = self.rejected = self.censored = self.relegated = 0
        self.met = self.met_strict = self.out_fin = self.prompt_fin = self.generated = 0
        self.preemptions = self.migrations = 0
        self.ttft, self.tpot, self.ttlt, self.norm = _Latency(), _Latency(), _Latency(), _Latency()

    def add(self, row: tuple) -> None:
        (_, _, _, arrival, _, first, finish, prompt, output, gen, preempt, _, migr, _, outcome, _, _,
         tbt_max, ttft_slo, tbt_slo, ttlt_slo) = row
        self.total += 1
        self.generated += gen
        self.preemptions += preempt
        self.migrations += migr
        if outcome == Outcome.REJECTED:
            self.rejected += 1
            return
        if outcome == Outcome.CENSORED:
            self.censored += 1
            return
        self.finished += 1
        if outcome == Outcome.RELEGATED:
            self.relegated += 1
        self.out_fin += gen
        self.prompt_fin += prompt
        ttft = first - arrival
        ttlt = finish - arrival
        tpot = (finish - first) / (gen - 1.0) if gen > 1 else math.nan
        norm = ttlt / float(output) if output > 0 else math.nan
        self.ttft.add(ttft)
        self.tpot.add(tpot)
        self.ttlt.add(ttlt)
        self.norm.add(norm)
        ok_ttft = _le_or_unset(ttft, ttft_slo)
        ok_ttlt = _le_or_unset(ttlt, ttlt_slo)
        if ok_ttft and ok_ttlt:
            if tpot != tpot or _le_or_unset(tpot, tbt_slo):
                self.met += 1
            if _le_or_unset(tbt_max, tbt_slo):
                self.met_strict += 1

    def merge(self, o: _TierAcc) -> None:
        for name in self.__slots__:
            a, b = getattr(self, name), getattr(o, name)
            if isinstance(a, _Latency):
                a.merge(b)
            else:
                setattr(self, name, a + b)

    def summary(self, tbt: TokenTBT, duration_s: float, name: str, tier: int, goal: float) -> TierSummary:
        n = self.total
        per_s = (lambda x: float(x) / duration_s) if duration_s > 0 else (lambda x: math.nan)
        return TierSummary(
            name=name, tier=tier, total=n, finished=self.finished, rejected=self.rejected,
            censored=self.censored, relegated=self.relegated, ttft=self.ttft.stats(), tbt=tbt.stats(),
            tpot=self.tpot.stats(), ttlt=self.ttlt.stats(), normalized_latency=self.norm.stats(),
            slo_met=self.met, slo_attainment=self.met / n if n else math.nan,
            tbt_max_attainment=float(self.met_strict) / n if n else math.nan, attainment_goal=goal,
            goodput_rps=per_s(self.met), throughput_rps=per_s(self.finished),
            output_tokens_per_s=per_s(self.out_fin), total_tokens_per_s=per_s(self.out_fin + self.prompt_fin),
            generated_tokens_per_s=per_s(self.generated), preemptions=self.preemptions,
            migrations=self.migrations)


class _CsvRows:
    def __init__(self, f) -> None:
        self.w = csv.writer(f)
        self.w.writerow(COLUMNS.keys())
        self.float_idx = [i for i, n in enumerate(COLUMNS) if n in _FLOAT_COLS]

    def write(self, rows: list[tuple]) -> None:
        fi = self.float_idx
        out = []
        for row in rows:
            r = list(row)
            for i in fi:
                r[i] = repr(r[i])
            out.append(r)
        self.w.writerows(out)


class _ParquetRows:
    def __init__(self, path: Path) -> None:
        try:
            import pyarrow as pa
            import pyarrow.parquet as pq
        except ImportError:
            from tierserve.core import ConfigError
            raise ConfigError("--records", "parquet", "the pyarrow package (pip install 'tierserve[parquet]')") from None
        self.pa = pa
        types = {np.int64: pa.int64(), np.int8: pa.int8(), np.float64: pa.float64(), object: pa.string()}
        self.schema = pa.schema([(n, types[d]) for n, d in COLUMNS.items()])
        self.w = pq.ParquetWriter(str(path), self.schema, compression="zstd")

    def write(self, rows: list[tuple]) -> None:
        cols = list(zip(*rows))
        self.w.write_batch(self.pa.record_batch([self.pa.array(c, type=f.type) for c, f in zip(cols, self.schema)],
                                                schema=self.schema))

    def close(self) -> None:
        self.w.close()


class RunRecorder:
    """The streaming sink of one run (module docstring). `outdir=None` writes no per-request file."""

    def __init__(self, num_tiers: int, outdir: str | Path | None = None, records: str = "csv") -> None:
        from tierserve.core.files import PARTIAL_SUFFIX, atomic_path
        from tierserve.metrics.io import REQUESTS_CSV, REQUESTS_PARQUET, SUMMARY_JSON
        if records not in FORMATS:
            from tierserve.core import ConfigError
            raise ConfigError("--records", records, " | ".join(FORMATS))
        self.num_tiers = num_tiers
        self.records = records
        self.accs: dict[int, _TierAcc] = {}
        self.num_rows = 0
        self.relegated = 0
        self._pending: dict[int, tuple] = {}
        self._next = 0
        self._batch: list[tuple] = []
        self._spool_rows: list[tuple] = []
        self._spool_n = 0
        self._last_arrival = -math.inf
        self._in_order = True
        self._stack = contextlib.ExitStack()
        self._writer = None
        self._file = None
        self.path: Path | None = None
        self._spool_path = None
        try:
            if outdir is not None:
                Path(outdir).mkdir(parents=True, exist_ok=True)
            fd, spool = tempfile.mkstemp(prefix=".stability-spool.", suffix=PARTIAL_SUFFIX,
                                         dir=str(outdir) if outdir is not None else None)
            self._spool_path = Path(spool)
            self._spool = os.fdopen(fd, "wb")
            if outdir is not None:
                out = Path(outdir)
                (out / SUMMARY_JSON).unlink(missing_ok=True)     # an old summary must not vouch for new files
                name, other = ((REQUESTS_CSV, REQUESTS_PARQUET) if records == "csv"
                               else (REQUESTS_PARQUET, REQUESTS_CSV))
                (out / other).unlink(missing_ok=True)
                self.path = out / name
                tmp = self._stack.enter_context(atomic_path(self.path))
                if records == "csv":
                    self._file = tmp.open("w", newline="", encoding="utf-8")
                    self._writer = _CsvRows(self._file)
                else:
                    self._writer = _ParquetRows(tmp)
        except BaseException:
            self.abort()
            raise

    # ---- the sink ---------------------------------------------------------------------------------------
    def add(self, index: int, state: RequestState, reason: str | None) -> None:
        """Request number `index` (0-based arrival order) ended; `reason` says why when rejected/censored."""
        row = record_row(state, reason)
        if state.relegated_s >= 0:
            self.relegated += 1
        if index != self._next:
            self._pending[index] = row
            return
        self._emit(row)
        pending = self._pending
        while pending and self._next in pending:
            self._emit(pending.pop(self._next))

    def _emit(self, row: tuple) -> None:
        self._next += 1
        self.num_rows += 1
        tier = row[1]
        acc = self.accs.get(tier)
        if acc is None:
            acc = self.accs[tier] = _TierAcc()
        acc.add(row)
        if row[14] != Outcome.REJECTED:
            a = row[3]
            if a < self._last_arrival:
                self._in_order = False
            self._last_arrival = a
            self._spool_rows.append((a, row[5] - a, row[14] == Outcome.CENSORED, tier))
            if len(self._spool_rows) >= _FLUSH_ROWS:
                self._flush_spool()
        if self._writer is not None:
            self._batch.append(row)
            if len(self._batch) >= _FLUSH_ROWS:
                self._writer.write(self._batch)
                self._batch = []

    def _flush_spool(self) -> None:
        if self._spool_rows:
            np.array(self._spool_rows, dtype=_SPOOL_DTYPE).tofile(self._spool)
            self._spool_n += len(self._spool_rows)
            self._spool_rows = []

    # ---- the end ----------------------------------------------------------------------------------------
    def finish(self, duration_s: float, tbt_by_tier: Sequence[LogHistogram],
               tier_names: Sequence[str] | TierSet | None = None, extras: Mapping[str, Any] | None = None,
               **rule: Any) -> tuple[RunSummary, dict]:
        """Close the record file (renamed to its final name), and return (summary, stability verdicts)."""
        if self._pending:
            raise AssertionError(f"{len(self._pending)} requests ended but request {self._next} never did: "
                                 "a request was not accounted for")
        try:
            if self._writer is not None:
                if self._batch:
                    self._writer.write(self._batch)
                    self._batch = []
                if self._file is not None:
                    self._file.close()
                else:
                    self._writer.close()
            self._stack.close()                       # the rename: the record file is whole
            self._flush_spool()
            self._spool.close()
            summary = self.summary(duration_s, tbt_by_tier, tier_names, extras)
            verdicts = self.verdicts(duration_s, tier_names, **rule)
        finally:
            self._spool_path.unlink(missing_ok=True)
        return summary, verdicts

    def abort(self) -> None:
        """Drop everything written (the run did not end): no file is left under a final name."""
        for f in (self._file, getattr(self, "_spool", None)):
            with contextlib.suppress(Exception):
                f.close()
        if self._writer is not None and self._file is None:
            with contextlib.suppress(Exception):
                self._writer.close()
        with contextlib.suppress(BaseException):
            self._stack.__exit__(RuntimeError, RuntimeError("aborted"), None)
        if getattr(self, "_spool_path", None) is not None:
            self._spool_path.unlink(missing_ok=True)

    def summary(self, duration_s: float, tbt_by_tier: Sequence[LogHistogram],
                tier_names: Sequence[str] | TierSet | None = None,
                extras: Mapping[str, Any] | None = None) -> RunSummary:
        names = _tier_names(tier_names, sorted(self.accs))
        goals = ({t.index: t.slo.attainment for t in tier_names} if isinstance(tier_names, TierSet) else {})
        tbt = TokenTBT.from_histograms(tbt_by_tier)
        out: dict[str, TierSummary] = {}
        total = _TierAcc()
        for t in sorted(self.accs):
            total.merge(self.accs[t])
        for t, name in names.items():
            out[name] = self.accs.get(t, _TierAcc()).summary(tbt.for_tier(t), duration_s, name, t,
                                                             goals.get(t, math.nan))
        out[ALL] = total.summary(tbt, duration_s, ALL, -1, math.nan)
        ex = dict(extras or {})
        ex["streaming"] = {"records": self.records, "percentile_rel_error": PERCENTILE_REL,
                           "percentile_abs_error_s": PERCENTILE_ABS_S, "note": PERCENTILE_BOUND}
        return RunSummary(duration_s=float(duration_s), tiers=out, extras=ex)

    def verdicts(self, end_s: float, tier_names: Sequence[str] | TierSet | None = None,
                 **rule: Any) -> dict:
        """`run_stability` of the whole run, from the spool (exactly the in-memory verdicts)."""
        if not self._in_order:
            raise AssertionError("spooled rows are not in arrival order")
        if isinstance(tier_names, TierSet):
            names = {t.index: t.name for t in tier_names}
        else:
            names = {i: n for i, n in enumerate(tier_names or [])}
        keys = sorted(set(names) | set(self.accs))
        streams = {names.get(k, f"tier{k}"): k for k in keys}
        streams[ALL] = None
        return spool_verdicts(self._spool_path, self._spool_n, end_s, streams, **rule)


def spool_verdicts(path: Path, n_rows: int, end_s: float, streams: Mapping[str, int | None], *,
                   drop_fraction: float | None = None, windows: int = 10, min_per_window: int = 5,
                   alpha: float = 0.01, min_ratio: float = 2.0, min_growth_s: float = 0.5,
                   max_censored_fraction: float = 0.01, chunk: int = 1 << 20) -> dict:
    """`stability_verdict` for each stream (a tier, or None for all) of spooled rows in arrival order,
    reading the spool in chunks and holding one window's values per stream."""
    from tierserve.metrics.stability import (
        DEFAULT_DROP_FRACTION, UNKNOWN, UNSTABLE, StabilityVerdict, _check_fraction, verdict_from_windows,
    )
    f = DEFAULT_DROP_FRACTION if drop_fraction is None else drop_fraction
    _check_fraction(f)
    data = np.memmap(path, dtype=_SPOOL_DTYPE, mode="r", shape=(n_rows,)) if n_rows else np.empty(0, _SPOOL_DTYPE)

    def chunks():
        for lo in range(0, n_rows, chunk):
            c = data[lo:lo + chunk]
            a, t, cen, k = (np.array(c["a"]), np.array(c["t"]), c["c"].astype(bool), np.array(c["k"]))
            fill = cen & np.isnan(t)
            t[fill] = np.maximum(end_s - a[fill], 0.0)
            judged = ~np.isnan(t)
            yield a[judged], t[judged], cen[judged], k[judged]

    counts = {name: 0 for name in streams}
    for a, t, cen, k in chunks():
        for name, tier in streams.items():
            counts[name] += a.size if tier is None else int(np.count_nonzero(k == tier))
    plan = {}
    for name, n_all in counts.items():
        drop = int(math.floor(f * n_all + 1e-9))
        n = n_all - 2 * drop
        w = min(windows, n // min_per_window)
        sizes = [n // w + (1 if i < n % w else 0) for i in range(w)] if w >= 4 else []
        plan[name] = {"drop": drop, "n": n, "sizes": sizes, "pos": 0, "cens": 0, "g": 0, "buf_a": [], "buf_t": [],
                      "fill": 0, "med_t": [], "med_a": []}
    for a, t, cen, k in chunks():
        for name, tier in streams.items():
            p = plan[name]
            if tier is not None:
                m = k == tier
                sa, st, sc = a[m], t[m], cen[m]
            else:
                sa, st, sc = a, t, cen
            lo = max(p["drop"] - p["pos"], 0)                 # the window: positions [drop, drop + n)
            hi = min(p["drop"] + p["n"] - p["pos"], sa.size)
            p["pos"] += sa.size
            if hi <= lo:
                continue
            sa, st, sc = sa[lo:hi], st[lo:hi], sc[lo:hi]
            p["cens"] += int(np.count_nonzero(sc))
            i = 0
            while i < sa.size and p["g"] < len(p["sizes"]):
                take = min(p["sizes"][p["g"]] - p["fill"], sa.size - i)
                p["buf_a"].append(sa[i:i + take])
                p["buf_t"].append(st[i:i + take])
                p["fill"] += take
                i += take
                if p["fill"] == p["sizes"][p["g"]]:
                    p["med_t"].append(np.median(np.concatenate(p["buf_t"])))
                    p["med_a"].append(np.median(np.concatenate(p["buf_a"])))
                    p["buf_a"], p["buf_t"], p["fill"] = [], [], 0
                    p["g"] += 1
    out = {}
    for name, p in plan.items():
        n = p["n"]
        cens = p["cens"] / n if n else 0.0
        if n and cens > max_censored_fraction:
            out[name] = StabilityVerdict(UNSTABLE, censored_fraction=cens, n=n,
                                         reason=f"{cens:.1%} of the window never finished (> {max_censored_fraction:.1%})")
        elif not p["sizes"]:
            out[name] = StabilityVerdict(UNKNOWN, censored_fraction=cens, n=n,
                                         reason=f"{n} requests in the window: too few for a trend")
        else:
            out[name] = verdict_from_windows(np.array(p["med_t"]), np.array(p["med_a"]), cens, n, alpha, min_ratio,
                                             min_growth_s)
    del data
    return out
