"""Per-request records of one run, stored column-wise, and the token-level TBT samples.

`RequestTable` holds one row per request that entered the run. Timestamps are absolute simulated seconds;
a timestamp that never happened (the executor's -1 sentinel) is NaN. SLO targets that do not apply are NaN.
"""
from __future__ import annotations

import csv
import math
from collections.abc import Iterable, Mapping
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
        reqs = [request_of(s) for s in states]
        slos = [r.slo for r in reqs]
        nan = math.nan
        # -1 timestamps (never happened) and unset targets become NaN; outcome from status and relegation
        finished, rejected = Status.FINISHED, Status.REJECTED
        relegated, done = int(Outcome.RELEGATED), int(Outcome.FINISHED)
        rejected_code, censored = int(Outcome.REJECTED), int(Outcome.CENSORED)
        cols = {
            "id": [r.id for r in reqs],
            "tier": [r.tier for r in reqs],
            "app": [r.app for r in reqs],
            "arrival_s": [r.arrival_s for r in reqs],
            "dispatch_s": [x if (x := s.dispatch_s) >= 0 else nan for s in states],
            "first_token_s": [x if (x := s.first_token_s) >= 0 else nan for s in states],
            "finish_s": [x if (x := s.finish_s) >= 0 else nan for s in states],
            "prompt_tokens": [r.prompt_tokens for r in reqs],
            "output_tokens": [r.output_tokens for r in reqs],
            "generated_tokens": [s.num_generated for s in states],
            "preemptions": [s.num_preemptions for s in states],
            "swaps": [s.num_swaps for s in states],
            "migrations": [s.num_migrations for s in states],
            "replica": [s.replica for s in states],
            "outcome": [(relegated if s.relegated_s >= 0 else done) if (st := s.status) == finished
                        else rejected_code if st == rejected else censored for s in states],
            "reason": [reasons.get(s.id) or s.relegation_reason for s in states],
            "relegated_s": [x if (x := s.relegated_s) >= 0 else nan for s in states],
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
        return [int(t) for t in np.unique(self._cols["tier"])]

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
        # repr of Python floats/ints is the shortest exact text; tolist() converts numpy scalars in bulk
        text_cols = []
        plain = True            # every field is a str that csv would write unquoted: rows are joined directly
        float_texts: dict[bytes, list[str]] = {}     # a float column bit-identical to an earlier one: its text
        for name, dtype in COLUMNS.items():
            arr = self._cols[name]
            if dtype is np.float64:
                key = arr.tobytes()
                col = float_texts.get(key)
                if col is None:
                    col = float_texts[key] = (["nan"] * arr.size if np.isnan(arr).all()
                                              else list(map(repr, arr.tolist())))
                text_cols.append(col)
                continue
            col = arr.tolist()
            if dtype is object:
                if plain and col:
                    joined = "\x00".join(col) if set(map(type, col)) == {str} else ","
                    plain = not any(ch in joined for ch in ',"\r\n')
            else:
                col = list(map(str, col))      # ints (and the int8 outcome) as csv writes them
            text_cols.append(col)
        with path.open("w", newline="", encoding="utf-8") as f:
            if plain:           # csv.writer's output for these rows, byte for byte (QUOTE_MINIMAL, "\r\n")
                f.write(",".join(COLUMNS.keys()) + "\r\n")
                if text_cols[0]:
                    f.write("\r\n".join(map(",".join, zip(*text_cols))))
                    f.write("\r\n")
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
