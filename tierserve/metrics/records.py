"""Per-request records of one run, stored column-wise, and the token-level TBT samples.

`RequestTable` holds one row per request that entered the run. Timestamps are absolute simulated seconds;
a timestamp that never happened (the executor's -1 sentinel) is NaN. SLO targets that do not apply are NaN.
"""
from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
from operator import attrgetter
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tierserve.core import Outcome, RequestState, Status, request_of
from tierserve.metrics.stats import LatencyStats, weighted_latency_stats, weighted_mean, weighted_quantile

# Column name -> numpy dtype, in CSV order. `object` columns hold Python str.
COLUMNS: dict[str, type | str] = {
    "id": np.int64,
    "tier": np.int64,
    "app": object,
    "arrival_s": np.float64,
    "dispatch_s": np.float64,
    "first_token_s": np.float64,
    "finish_s": np.float64,
    "prompt_tokens": np.int64,
    "output_tokens": np.int64,
    "generated_tokens": np.int64,
    "preemptions": np.int64,
    "swaps": np.int64,
    "migrations": np.int64,
    "replica": np.int64,
    "outcome": np.int8,
    "reason": object,
    "relegated_s": np.float64,
    "tbt_max_s": np.float64,
    "ttft_slo_s": np.float64,
    "tbt_slo_s": np.float64,
    "ttlt_slo_s": np.float64,
}

# Slack when comparing a latency with its target: float sums of iteration times may miss an exact tie by an ulp.
SLO_EPS_S = 1e-9


def _le_or_unset(value: NDArray[np.float64], target: NDArray[np.float64]) -> NDArray[np.bool_]:
    """value <= target where a target is set; True where it is NaN (does not apply)."""
    with np.errstate(invalid="ignore"):
        return np.isnan(target) | (value <= target + SLO_EPS_S)


class RequestTable:
    """Columnar per-request records; every column is a 1-D numpy array of the same length.

    Columns are attributes (`table.ttft_slo_s`, ...) and items (`table["tier"]`). Derived latencies are
    properties computed on demand, NaN where they do not exist (e.g. TTFT of a rejected request).
    """

    __slots__ = ("_cols",)

    def __init__(self, columns: Mapping[str, ArrayLike]) -> None:
        missing = [c for c in COLUMNS if c not in columns]
        if missing:
            raise ValueError(f"RequestTable: missing columns {missing}")
        cols: dict[str, np.ndarray] = {}
        for name, dtype in COLUMNS.items():
            arr = np.asarray(columns[name], dtype=dtype)
            if arr.ndim != 1:
                arr = arr.ravel()
            cols[name] = arr
        n = {a.size for a in cols.values()}
        if len(n) > 1:
            raise ValueError(f"RequestTable: columns differ in length: {sorted(n)}")
        object.__setattr__(self, "_cols", cols)

    # ---- construction -------------------------------------------------------------------------------
    @classmethod
    def from_states(cls, states: Iterable[RequestState], reasons: Mapping[int, str] | None = None) -> RequestTable:
        """One row per state; `reasons` maps request id -> why it was rejected or censored."""
        states = list(states)
        reasons = reasons or {}
        reqs = list(map(request_of, states))
        slos = [r.slo for r in reqs]
        nan = math.nan

        def times(name: str) -> NDArray[np.float64]:
            """A timestamp column; -1 (never happened) becomes NaN."""
            col = np.array(list(map(attrgetter(name), states)), dtype=np.float64)
            col[col < 0] = nan
            return col

        relegated_s = times("relegated_s")
        status = np.array(list(map(attrgetter("status"), states)), dtype=np.int64)
        # outcome from status and relegation: finished (relegated or not), rejected, or censored (the rest)
        outcome = np.where(status == Status.FINISHED,
                           np.where(relegated_s >= 0, int(Outcome.RELEGATED), int(Outcome.FINISHED)),
                           np.where(status == Status.REJECTED, int(Outcome.REJECTED), int(Outcome.CENSORED)))
        cols = {
            "id": [r.id for r in reqs],
            "tier": [r.tier for r in reqs],
            "app": [r.app for r in reqs],
            "arrival_s": [r.arrival_s for r in reqs],
            "dispatch_s": times("dispatch_s"),
            "first_token_s": times("first_token_s"),
            "finish_s": times("finish_s"),
            "prompt_tokens": [r.prompt_tokens for r in reqs],
            "output_tokens": [r.output_tokens for r in reqs],
            "generated_tokens": [s.num_generated for s in states],
            "preemptions": [s.num_preemptions for s in states],
            "swaps": [s.num_swaps for s in states],
            "migrations": [s.num_migrations for s in states],
            "replica": [s.replica for s in states],
            "outcome": outcome,
            "reason": ([reasons.get(s.id) or s.relegation_reason for s in states] if reasons
                       else [s.relegation_reason for s in states]),
            "relegated_s": relegated_s,
            "tbt_max_s": [s.tbt_max_s for s in states],
            "ttft_slo_s": [nan if (x := o.ttft_s) is None else float(x) for o in slos],
            "tbt_slo_s": [nan if (x := o.tbt_s) is None else float(x) for o in slos],
            "ttlt_slo_s": [nan if (x := o.ttlt_s) is None else float(x) for o in slos],
        }
        return cls(cols)

    @classmethod
    def empty(cls) -> RequestTable:
        return cls({c: [] for c in COLUMNS})

    # ---- access -------------------------------------------------------------------------------------
    def __getattr__(self, name: str) -> np.ndarray:
        cols = object.__getattribute__(self, "_cols")
        try:
            return cols[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, name: str) -> np.ndarray:
        return self._cols[name]

    def __len__(self) -> int:
        return int(self._cols["id"].size)

    def __repr__(self) -> str:
        return f"RequestTable({len(self)} rows)"

    @property
    def columns(self) -> dict[str, np.ndarray]:
        """The stored columns (not the derived ones), by name, in CSV order."""
        return dict(self._cols)

    def select(self, mask: ArrayLike) -> RequestTable:
        """Rows where a boolean mask is True, or rows at the given integer indices."""
        m = np.asarray(mask)
        return RequestTable({k: v[m] for k, v in self._cols.items()})

    def for_tier(self, tier: int) -> RequestTable:
        return self.select(self._cols["tier"] == tier)

    @property
    def tiers(self) -> list[int]:
        """Tier indices present, ascending."""
        # a set, not np.unique: np.unique imports numpy.ma on first use (~40 ms of a plain run's start)
        return sorted(set(self._cols["tier"].tolist()))

    # ---- outcomes -----------------------------------------------------------------------------------
    @property
    def finished(self) -> NDArray[np.bool_]:
        """Produced every output token (relegated requests included: they still finish)."""
        o = self._cols["outcome"]
        return (o == Outcome.FINISHED) | (o == Outcome.RELEGATED)

    @property
    def relegated(self) -> NDArray[np.bool_]:
        """Finished after a policy relegated it (gave up on its deadline); `reason` says why."""
        return self._cols["outcome"] == Outcome.RELEGATED

    @property
    def rejected(self) -> NDArray[np.bool_]:
        return self._cols["outcome"] == Outcome.REJECTED

    @property
    def censored(self) -> NDArray[np.bool_]:
        return self._cols["outcome"] == Outcome.CENSORED

    # ---- derived latencies (seconds) ----------------------------------------------------------------
    @property
    def ttft_s(self) -> NDArray[np.float64]:
        """Time to first token: first_token - arrival (queueing included)."""
        return self._cols["first_token_s"] - self._cols["arrival_s"]

    @property
    def ttlt_s(self) -> NDArray[np.float64]:
        """Time to last token (end-to-end latency, E2E): finish - arrival."""
        return self._cols["finish_s"] - self._cols["arrival_s"]

    e2e_s = ttlt_s

    @property
    def tpot_s(self) -> NDArray[np.float64]:
        """Time per output token after the first: (finish - first_token) / (generated - 1); NaN if generated <= 1."""
        gaps = self._cols["generated_tokens"].astype(np.float64) - 1.0
        span = self._cols["finish_s"] - self._cols["first_token_s"]
        out = np.full(gaps.shape, np.nan)
        np.divide(span, gaps, out=out, where=gaps > 0)
        return out

    @property
    def normalized_latency_s(self) -> NDArray[np.float64]:
        """E2E latency per output token (vLLM/Orca 'normalized latency'); NaN when output_tokens is 0."""
        n = self._cols["output_tokens"].astype(np.float64)
        out = np.full(n.shape, np.nan)
        np.divide(self.ttlt_s, n, out=out, where=n > 0)
        return out

    # ---- SLO checks ---------------------------------------------------------------------------------
    @property
    def meets_ttft(self) -> NDArray[np.bool_]:
        return self.finished & _le_or_unset(self.ttft_s, self._cols["ttft_slo_s"])

    @property
    def meets_tpot(self) -> NDArray[np.bool_]:
        """TBT target judged on the request's mean TPOT (DistServe); vacuous when it has no decode gap."""
        tpot = self.tpot_s
        return self.finished & (np.isnan(tpot) | _le_or_unset(tpot, self._cols["tbt_slo_s"]))

    @property
    def meets_tbt_max(self) -> NDArray[np.bool_]:
        """TBT target judged on the request's worst token gap (`tbt_max_s`): a stricter, per-token criterion."""
        return self.finished & _le_or_unset(self._cols["tbt_max_s"], self._cols["tbt_slo_s"])

    @property
    def meets_ttlt(self) -> NDArray[np.bool_]:
        return self.finished & _le_or_unset(self.ttlt_s, self._cols["ttlt_slo_s"])

    @property
    def meets_slo(self) -> NDArray[np.bool_]:
        """Finished and every set target met: TTFT, TBT as mean TPOT (DistServe's per-request criterion),
        TTLT. Rejected and censored requests never meet. A request with no targets meets iff it finished."""
        return self.meets_ttft & self.meets_tpot & self.meets_ttlt

    @property
    def meets_slo_strict(self) -> NDArray[np.bool_]:
        """As `meets_slo`, but the TBT target must hold for every token gap (`tbt_max_s`)."""
        return self.meets_ttft & self.meets_tbt_max & self.meets_ttlt

    # ---- CSV ----------------------------------------------------------------------------------------
    def to_csv(self, path: str | Path) -> Path:
        """Write all stored columns; floats as repr (exact round trip), NaN as 'nan'."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        n = len(self)
        text_cols: list[list[str]] = []
        constants: list[str | None] = []          # per column: its text when every row has the same, else None
        plain = True            # every field is a str that csv would write unquoted: rows are joined directly
        done: dict[tuple[str, bytes], tuple[list[str], str | None]] = {}   # a column bit-identical to an earlier
        for name, dtype in COLUMNS.items():
            arr = self._cols[name]
            if dtype is object:
                col = arr.tolist()
                if plain and col:
                    joined = "\x00".join(col) if set(map(type, col)) == {str} else ","
                    plain = not any(ch in joined for ch in ',"\r\n')
                const = col[0] if plain and n and col.count(col[0]) == n else None
            else:
                key = (arr.dtype.str, arr.tobytes())
                if key not in done:
                    done[key] = _float_texts(arr) if dtype is np.float64 else _int_texts(arr)
                col, const = done[key]
            text_cols.append(col)
            constants.append(const)
        with path.open("w", newline="", encoding="utf-8") as f:
            if plain:           # csv.writer's output for these rows, byte for byte (QUOTE_MINIMAL, "\r\n")
                f.write(",".join(COLUMNS.keys()) + "\r\n")
                if n:
                    f.write(_join_rows(text_cols, constants, n))
            else:
                w = csv.writer(f)
                w.writerow(COLUMNS.keys())
                w.writerows(zip(*text_cols))
        return path

    @classmethod
    def from_csv(cls, path: str | Path) -> RequestTable:
        """Read a file written by `to_csv`; columns may come in any order, all must be present."""
        path = Path(path)
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
        if not rows:
            raise ValueError(f"{path}: empty file (expected a header row)")
        header, body = rows[0], rows[1:]
        missing = [c for c in COLUMNS if c not in header]
        if missing:
            raise ValueError(f"{path}: missing columns {missing}")
        cols_t = list(zip(*body)) if body else [() for _ in header]
        cols: dict[str, np.ndarray] = {}
        for name, dtype in COLUMNS.items():
            raw = cols_t[header.index(name)]
            if dtype is object:
                cols[name] = np.array(list(raw), dtype=object)
            elif dtype is np.float64:
                # float() parses repr exactly, and 'nan'; fromiter over map is ~3x faster than astype from str
                cols[name] = np.fromiter(map(float, raw), np.float64, len(raw))
            else:
                cols[name] = np.fromiter(map(int, raw), np.int64, len(raw)).astype(dtype)
        return cls(cols)

    @classmethod
    def from_parquet(cls, path: str | Path) -> RequestTable:
        """Read a `requests.parquet` a streamed run wrote (needs pyarrow)."""
        import pyarrow.parquet as pq
        t = pq.read_table(str(path))
        missing = [c for c in COLUMNS if c not in t.column_names]
        if missing:
            raise ValueError(f"{path}: missing columns {missing}")
        cols = {}
        for name, dtype in COLUMNS.items():
            col = t.column(name)
            cols[name] = (np.array(col.to_pylist(), dtype=object) if dtype is object
                          else col.to_numpy().astype(dtype))
        return cls(cols)

    def equals(self, other: RequestTable) -> bool:
        """Exact equality of every column (NaN equals NaN)."""
        if len(self) != len(other):
            return False
        for name, dtype in COLUMNS.items():
            a, b = self._cols[name], other._cols[name]
            if dtype is np.float64:
                if not np.array_equal(a, b, equal_nan=True):
                    return False
            elif not np.array_equal(a, b):
                return False
        return True


# ---- CSV text of columns (exactly what the csv module writes for them) ----------------------------------------
# A column's text is (one str per row, the common text when all rows share it or None); str/repr of the same
# Python values as `csv.writer` would get, only computed once per distinct value where values repeat.

_SAMPLE_ROWS = 1024      # a float column whose first rows are mostly distinct is written one repr a row


def _float_texts(arr: NDArray[np.float64]) -> tuple[list[str], str | None]:
    n = arr.size
    if n == 0:
        return [], None
    bits = arr.view(np.int64)                     # by bit pattern: -0.0 and 0.0 (and NaN payloads) kept apart
    if (bits == bits[0]).all():
        text = repr(arr[0].item())
        return [text] * n, text
    head = bits[:_SAMPLE_ROWS].tolist()
    if 2 * len(set(head)) > len(head):            # mostly distinct (timestamps): one repr a row
        return list(map(repr, arr.tolist())), None
    bits = bits.tolist()
    keys = list(dict.fromkeys(bits))
    text_of = dict(zip(keys, map(repr, np.array(keys, dtype=np.int64).view(np.float64).tolist())))
    return list(map(text_of.__getitem__, bits)), None


def _int_texts(arr: np.ndarray) -> tuple[list[str], str | None]:
    n = arr.size
    if n == 0:
        return [], None
    lo, hi = int(arr.min()), int(arr.max())
    if lo == hi:
        text = str(lo)
        return [text] * n, text
    if hi - lo < n // 2:                          # few possible values: each one's text made once
        texts = list(map(str, range(lo, hi + 1)))
        return list(map(texts.__getitem__, (arr.astype(np.int64) - lo).tolist())), None
    return list(map(str, arr.tolist())), None


def _join_rows(text_cols: list[list[str]], constants: list[str | None], n: int) -> str:
    """The rows, each ending in "\r\n": neighbouring constant columns are joined once, a constant run at the
    start or end of the row becomes a prefix/suffix of every row (fewer fields to join per row)."""
    segments: list[list[str] | str] = []        # a column's texts, or the text of a run of constant columns
    for col, const in zip(text_cols, constants):
        if const is None:
            segments.append(col)
        elif segments and isinstance(segments[-1], str):
            segments[-1] += "," + const
        else:
            segments.append(const)
    prefix = segments.pop(0) + "," if isinstance(segments[0], str) and len(segments) > 1 else ""
    suffix = "," + segments.pop() if isinstance(segments[-1], str) and len(segments) > 1 else ""
    if len(segments) == 1 and isinstance(segments[0], str):         # every column constant
        return (prefix + segments[0] + suffix + "\r\n") * n
    columns = [[seg] * n if isinstance(seg, str) else seg for seg in segments]
    rows = map(",".join, zip(*columns)) if len(columns) > 1 else iter(columns[0])
    return prefix + (suffix + "\r\n" + prefix).join(rows) + suffix + "\r\n"


class TokenTBT:
    """Token-level time-between-tokens samples: `weights[i]` tokens of tier `tiers[i]` had gap `values[i]` s."""

    __slots__ = ("values", "tiers", "weights")

    def __init__(self, values: ArrayLike, tiers: ArrayLike, weights: ArrayLike | None = None) -> None:
        self.values = np.asarray(values, dtype=np.float64).ravel()
        self.tiers = np.asarray(tiers, dtype=np.int64).ravel()
        self.weights = (np.ones(self.values.size, dtype=np.int64) if weights is None
                        else np.asarray(weights, dtype=np.int64).ravel())
        if not (self.values.size == self.tiers.size == self.weights.size):
            raise ValueError(f"TokenTBT: lengths differ: values {self.values.size}, tiers {self.tiers.size}, "
                             f"weights {self.weights.size}")

    @classmethod
    def empty(cls) -> TokenTBT:
        return cls([], [], [])

    @classmethod
    def from_histograms(cls, hists: Iterable) -> TokenTBT:
        """The samples of per-tier TBT histograms (`LogHistogram`, tier = position): bin centres weighted by
        their counts."""
        values: list[float] = []
        tiers: list[int] = []
        weights: list[int] = []
        for tier, hist in enumerate(hists):
            v, c = hist.items()
            values += v
            weights += c
            tiers += [tier] * len(v)
        return cls(values, tiers, weights)

    def __len__(self) -> int:
        return int(self.values.size)

    @property
    def num_tokens(self) -> int:
        return int(self.weights.sum())

    def for_tier(self, tier: int) -> TokenTBT:
        m = self.tiers == tier
        return TokenTBT(self.values[m], self.tiers[m], self.weights[m])

    def quantile(self, q: ArrayLike) -> NDArray[np.float64] | float:
        """Weighted inverted-CDF quantile(s), q in [0, 1]."""
        return weighted_quantile(self.values, self.weights, q)

    def mean(self) -> float:
        return weighted_mean(self.values, self.weights)

    def stats(self) -> LatencyStats:
        return weighted_latency_stats(self.values, self.weights)
