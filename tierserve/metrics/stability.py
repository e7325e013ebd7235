"""Is a run's queue stable, what are its steady-state statistics, and how sure are we over seeds.

Pure statistics over per-request records; no simulator here. The pieces every reproduction uses:

`steady_state_mask(arrival_s, drop_fraction=0.1)` — the steady-state window: requests are ranked by arrival
(ties by position) and ⌊drop_fraction·n⌋ are dropped from each end, so exactly that many leave at the start
(warm-up from an empty cluster) and at the end (the drain tail). `steady_state_summary(table, ...)` summarises
only that window: throughput and goodput are per second of the window's arrival span, and token-level TBT is
left empty (the simulator keeps TBT per tier, not per request; the per-request TPOT column stands in).

`stability_verdict(arrival_s, ttft_s, censored, end_s)` — the queue-trend rule (busy fraction is not used:
under continuous batching it is ≈ 1 at any load). Over its own steady-state window (`drop_fraction`, 0.1 by
default, whatever window the statistics use), in arrival order:
  1. A request that never got its first token before the run ended (censored) has TTFT at least
     `end_s − arrival_s`; that lower bound is its TTFT sample. If more than `max_censored_fraction` of the
     window is censored, the verdict is "unstable" (the queue did not drain before the run stopped).
  2. The window is split into `windows` (default 10) groups of equal count; each gives its median TTFT and its
     median arrival time.
  3. Trend test: Mann–Kendall (Kendall's τ of median TTFT against window index, one-sided "increasing");
     slope: Theil–Sen slope of median TTFT against arrival time, in seconds of TTFT per second of arrivals.
  4. Practical size: `ratio` = last window's median / first window's median, and
     `growth_s` = slope × (span between first and last window's median arrival).
  The verdict is "unstable" when (1) holds, or when p < `alpha` (0.01) AND ratio ≥ `min_ratio` (2) AND
  growth_s ≥ `min_growth_s` (0.5 s): a significant trend that is also large in relative and absolute terms
  (near its knee a stable queue's median wanders, but does not both double and rise by half a second).
  Fewer than `min_per_window`·4 requests in the window give "unknown" (no trend can be read); callers treat
  "unknown" as not unstable. Rejected requests (never queued) are left out.

`run_stability(table, end_s, names)` — the verdict for every tier on its own and for all requests: a tier
served last by a priority policy can starve while the overall median stays flat, so a run is stable only when
every entry is. `steady_run(table, end_s, tiers, seed)` bundles a run's window summary and verdicts into a
`SteadyRun`, the unit `tierserve.experiments.capacity` works with; its verdicts add `backlog_verdict` under
"backlog".

`backlog_verdict(table)` — the backlog rule. The queue-trend rule reads TTFT in arrival order, which a
deadline-ordered scheduler defeats in a run shorter than its relaxed deadlines: it serves requests with
600–1,800 s targets after the arrivals end, so their TTFT need not rise along the window even when the replica
is overloaded. The number of unfinished requests does not depend on the order a work-conserving scheduler
serves in. It is read at `windows` + 1 instants evenly spaced in arrival rank over the steady-state window;
the run is "unstable" when it grew from the first instant to the last by more than `max_growth` of the
window's n requests (default max(5%, 2/√n), so that the Poisson noise of small windows is not read as growth)
AND Mann–Kendall finds the rise significant (p < `alpha`, 0.01): a stable queue's backlog wanders, an
overloaded one climbs. Rejected requests (never queued) are left out; one that never finished counts as
unfinished to the end.

`seeds_verdict(runs)` — over seeds, a configuration is "stable" when more than half of its seeds are.

`mean_ci95(values)` — mean and 95% interval over seeds: Student t with n−1 degrees of freedom on per-seed
values (half-width t₀.₉₇₅·s/√n; NaN with one value). `aggregate(summaries, metrics)` does it per tier and
metric.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from tierserve.core import TierSet
from tierserve.metrics.records import RequestTable
from tierserve.metrics.summary import ALL, RunSummary, summarize

STABLE, UNSTABLE, UNKNOWN = "stable", "unstable", "unknown"
DEFAULT_DROP_FRACTION = 0.1
BACKLOG = "backlog"              # the key and measure of the backlog verdict
MAX_BACKLOG_GROWTH = 0.05        # of the window's requests (the floor of the backlog rule's threshold)


# ---- steady-state window ------------------------------------------------------------------------------
def _check_fraction(drop_fraction: float) -> None:
    if not (0 <= drop_fraction < 0.5):
        raise ValueError(f"drop_fraction must lie in [0, 0.5); got {drop_fraction}")


def steady_state_mask(arrival_s: ArrayLike, drop_fraction: float = DEFAULT_DROP_FRACTION) -> NDArray[np.bool_]:
    """True for requests kept in the steady-state window: ⌊f·n⌋ earliest and ⌊f·n⌋ latest arrivals dropped."""
    _check_fraction(drop_fraction)
    a = np.asarray(arrival_s, dtype=np.float64).ravel()
    n = a.size
    k = int(math.floor(drop_fraction * n + 1e-9))  # epsilon: 0.1·1000 must give 100, not 99
    keep = np.zeros(n, dtype=bool)
    order = np.argsort(a, kind="stable")  # stable: equal arrivals keep their given order
    keep[order[k:n - k]] = True
    return keep


def steady_state_table(table: RequestTable, drop_fraction: float = DEFAULT_DROP_FRACTION) -> RequestTable:
    """The rows of `table` inside the steady-state window (rank by arrival over the whole run, all tiers)."""
    return table.select(steady_state_mask(table.arrival_s, drop_fraction))


def steady_state_summary(table: RequestTable, tier_names: Sequence[str] | TierSet | None = None,
                         drop_fraction: float = DEFAULT_DROP_FRACTION,
                         extras: Mapping[str, Any] | None = None) -> RunSummary:
    """Per-tier summary of the steady-state window; rates are per second of the window's arrival span.

    Token-level TBT is empty here (it is not kept per request); `extras` gains `steady_state` = the fraction
    dropped at each end, the counts kept and dropped, and the window's arrival span.
    """
    window = steady_state_table(table, drop_fraction)
    a = window.arrival_s
    span_s = float(a.max() - a.min()) if len(window) > 1 else 0.0
    info = {"drop_fraction_each_end": drop_fraction, "kept": len(window), "dropped": len(table) - len(window),
            "arrival_from_s": float(a.min()) if len(window) else math.nan,
            "arrival_to_s": float(a.max()) if len(window) else math.nan,
            "tbt": "not windowed (kept per tier, not per request); see TPOT"}
    return summarize(window, None, span_s, tier_names, {**dict(extras or {}), "steady_state": info})


# ---- stability verdict --------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class StabilityVerdict:
    """The queue-trend verdict of one request stream (module docstring has the rule).

    `slope`: Theil–Sen slope of window median TTFT over arrival time (s per s of arrivals); `ratio`: last
    window median / first; `growth_s`: slope × window span; `p_value`: one-sided Mann–Kendall;
    `window_medians_s`: median TTFT per window; `censored_fraction` of the requests judged.
    """

    verdict: str
    slope: float = math.nan
    ratio: float = math.nan
    growth_s: float = math.nan
    p_value: float = math.nan
    censored_fraction: float = 0.0
    n: int = 0
    window_medians_s: tuple[float, ...] = ()
    reason: str = ""
    measure: str = "ttft"        # "ttft": the queue-trend rule; "backlog": the backlog rule (slope in
                                 # requests per s, ratio = growth / n, window_medians_s = backlog samples)

    @property
    def stable(self) -> bool:
        """False only for "unstable"; "unknown" (too few requests) is not evidence against stability."""
        return self.verdict != UNSTABLE

    def __str__(self) -> str:
        if self.verdict == UNKNOWN:
            return f"{self.verdict} ({self.reason})"
        if self.measure == BACKLOG:
            return (f"{self.verdict}: backlog {self.window_medians_s[0]:.0f} → {self.window_medians_s[-1]:.0f} "
                    f"unfinished requests, growth {self.ratio:+.1%} of n={self.n}, p={self.p_value:.3g}")
        return (f"{self.verdict}: slope {self.slope:+.3f} s/s, last/first median TTFT {self.ratio:.2f}×, "
                f"growth {self.growth_s:+.2f} s, p={self.p_value:.3g}, censored {self.censored_fraction:.1%}, "
                f"{len(self.window_medians_s)} windows of n={self.n}" + (f" ({self.reason})" if self.reason else ""))

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "slope": self.slope, "ratio": self.ratio, "growth_s": self.growth_s,
                "p_value": self.p_value, "censored_fraction": self.censored_fraction, "n": self.n,
                "window_medians_s": list(self.window_medians_s), "reason": self.reason, "measure": self.measure}


def trend_test(x: ArrayLike, y: ArrayLike) -> tuple[float, float]:
    """(one-sided Mann–Kendall p-value that y increases along x's order, Theil–Sen slope dy/dx)."""
    from scipy import stats  # lazy: only trend verdicts need scipy
    xa, ya = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if xa.size < 3:
        return math.nan, math.nan
    if np.all(ya == ya[0]):  # a flat sequence: no trend, and kendalltau would return NaN
        return 1.0, 0.0
    p = float(stats.kendalltau(np.arange(ya.size), ya, alternative="greater").pvalue)
    slope = float(stats.theilslopes(ya, xa).slope) if np.ptp(xa) > 0 else math.nan
    return p, slope


def stability_verdict(arrival_s: ArrayLike, ttft_s: ArrayLike, censored: ArrayLike | None = None,
                      end_s: float | None = None, *, drop_fraction: float = DEFAULT_DROP_FRACTION,
                      windows: int = 10, min_per_window: int = 5, alpha: float = 0.01, min_ratio: float = 2.0,
                      min_growth_s: float = 0.5, max_censored_fraction: float = 0.01) -> StabilityVerdict:
    """Verdict for one stream; `ttft_s` NaN where no first token came (then `censored` must say so).

    Censored requests without a first token count with TTFT `end_s − arrival_s` (a lower bound; `end_s`
    defaults to the latest arrival). Rows that are neither finished-with-TTFT nor censored (rejected
    requests) must be removed by the caller or have `censored` False and TTFT NaN: they are skipped.
    """
    a = np.asarray(arrival_s, dtype=np.float64).ravel()
    t = np.asarray(ttft_s, dtype=np.float64).ravel().copy()
    c = np.zeros(a.size, bool) if censored is None else np.asarray(censored, dtype=bool).ravel()
    if not (a.size == t.size == c.size):
        raise ValueError(f"arrival_s, ttft_s and censored differ in length: {a.size}, {t.size}, {c.size}")
    end = float(end_s) if end_s is not None else (float(a.max()) if a.size else 0.0)
    no_first = np.isnan(t)
    t[c & no_first] = np.maximum(end - a[c & no_first], 0.0)  # waited at least until the run ended
    judged = ~np.isnan(t)
    a, t, c = a[judged], t[judged], c[judged]
    keep = steady_state_mask(a, drop_fraction)
    a, t, c = a[keep], t[keep], c[keep]
    n = int(a.size)
    cens = float(c.mean()) if n else 0.0
    if n and cens > max_censored_fraction:
        return StabilityVerdict(UNSTABLE, censored_fraction=cens, n=n,
                                reason=f"{cens:.1%} of the window never finished (> {max_censored_fraction:.1%})")
    w = min(windows, n // min_per_window)
    if w < 4:
        return StabilityVerdict(UNKNOWN, censored_fraction=cens, n=n,
                                reason=f"{n} requests in the window: too few for a trend")
    order = np.argsort(a, kind="stable")
    groups = np.array_split(order, w)  # equal counts (±1), in arrival order
    med_ttft = np.array([np.median(t[g]) for g in groups])
    med_arrival = np.array([np.median(a[g]) for g in groups])
    return verdict_from_windows(med_ttft, med_arrival, cens, n, alpha, min_ratio, min_growth_s)


def verdict_from_windows(med_ttft: NDArray[np.float64], med_arrival: NDArray[np.float64], cens: float, n: int,
                         alpha: float, min_ratio: float, min_growth_s: float) -> StabilityVerdict:
    """Steps 3–4 of the rule from each window's median TTFT and median arrival (shared with the streamed
    verdicts of `tierserve.metrics.stream`)."""
    p, slope = trend_test(med_arrival, med_ttft)
    first = med_ttft[0]
    ratio = float(med_ttft[-1] / first) if first > 0 else (math.inf if med_ttft[-1] > 0 else 1.0)
    growth = slope * float(med_arrival[-1] - med_arrival[0]) if math.isfinite(slope) else math.nan
    unstable = p < alpha and ratio >= min_ratio and growth >= min_growth_s
    return StabilityVerdict(UNSTABLE if unstable else STABLE, slope, ratio, growth, p, cens, n,
                            tuple(float(x) for x in med_ttft))


def table_verdict(table: RequestTable, end_s: float, **rule: Any) -> StabilityVerdict:
    """`stability_verdict` of a request table (rejected rows left out)."""
    queued = ~table.rejected
    return stability_verdict(table.arrival_s[queued], table.ttft_s[queued], table.censored[queued], end_s, **rule)


def run_stability(table: RequestTable, end_s: float, tier_names: Sequence[str] | TierSet | None = None,
                  **rule: Any) -> dict[str, StabilityVerdict]:
    """Verdict per tier (by name, in tier order) and for all requests under "all"."""
    if isinstance(tier_names, TierSet):
        names = {t.index: t.name for t in tier_names}
    else:
        names = {i: n for i, n in enumerate(tier_names or [])}
    out = {names.get(k, f"tier{k}"): table_verdict(table.for_tier(k), end_s, **rule)
           for k in sorted(set(names) | set(table.tiers))}
    out[ALL] = table_verdict(table, end_s, **rule)
    return out


def backlog_verdict(table: RequestTable, drop_fraction: float = DEFAULT_DROP_FRACTION, *, windows: int = 10,
                    max_growth: float | None = None, alpha: float = 0.01) -> StabilityVerdict:
    """Does the number of unfinished requests grow across the steady-state window? (module docstring)"""
    queued = ~table.rejected
    a = np.asarray(table.arrival_s, dtype=np.float64)[queued]
    done = np.nan_to_num(np.asarray(table["finish_s"], dtype=np.float64)[queued], nan=np.inf)
    keep = steady_state_mask(a, drop_fraction)
    n = int(keep.sum())
    if n < 4 * windows:
        return StabilityVerdict(UNKNOWN, n=n, measure=BACKLOG, reason=f"{n} requests in the window: too few "
                                                                      "for a backlog verdict")
    window = np.sort(a[keep])
    at = window[np.linspace(0, n - 1, windows + 1).round().astype(int)]
    # unfinished at t = arrived by t − finished by t (a request finishes after it arrives)
    backlog = (np.searchsorted(np.sort(a), at, side="right")
               - np.searchsorted(np.sort(done), at, side="right")).astype(np.float64)
    growth = float(backlog[-1] - backlog[0]) / n
    limit = max(MAX_BACKLOG_GROWTH, 2.0 / math.sqrt(n)) if max_growth is None else max_growth
    p, slope = trend_test(at, backlog)
    unstable = growth > limit and p < alpha
    return StabilityVerdict(UNSTABLE if unstable else STABLE, slope=slope, ratio=growth, p_value=p, n=n,
                            window_medians_s=tuple(float(x) for x in backlog), measure=BACKLOG,
                            reason=f"backlog grew by {growth:+.1%} of the window's requests (limit {limit:.1%})")


def all_stable(verdicts: Mapping[str, StabilityVerdict]) -> bool:
    return all(v.stable for v in verdicts.values())


# ---- a run judged in steady state ---------------------------------------------------------------------
@dataclass(slots=True)
class SteadyRun:
    """One seed at one rate: the steady-state summary, the stability verdicts, and what produced them."""

    summary: RunSummary
    stability: dict[str, StabilityVerdict]
    seed: int
    rate: float = math.nan
    drop_fraction: float = DEFAULT_DROP_FRACTION

    @property
    def stable(self) -> bool:
        return all_stable(self.stability)

    def verdict_line(self) -> str:
        """'stable' or 'unstable (tier2)': the run's verdict and which entries are unstable."""
        bad = [k for k, v in self.stability.items() if not v.stable]
        return STABLE if not bad else f"{UNSTABLE} ({', '.join(bad)})"

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "rate": self.rate, "drop_fraction_each_end": self.drop_fraction,
                "verdict": self.verdict_line(), "stability": {k: v.to_dict() for k, v in self.stability.items()},
                "summary": self.summary.to_dict()}


def steady_run(table: RequestTable, end_s: float, tier_names: Sequence[str] | TierSet | None, seed: int,
               rate: float = math.nan, drop_fraction: float = DEFAULT_DROP_FRACTION,
               extras: Mapping[str, Any] | None = None, **rule: Any) -> SteadyRun:
    """Steady-state summary plus the verdicts of one finished run: queue trend per tier and for all requests,
    and the backlog under "backlog" (module docstring)."""
    summary = steady_state_summary(table, tier_names, drop_fraction, extras)
    stability = run_stability(table, end_s, tier_names, drop_fraction=drop_fraction, **rule)
    stability[BACKLOG] = backlog_verdict(table, drop_fraction)
    return SteadyRun(summary, stability, seed, rate, drop_fraction)


def majority(flags: Sequence[bool]) -> bool:
    """True when more than half of the flags are."""
    return 2 * sum(bool(f) for f in flags) > len(flags)


def seeds_verdict(runs: Sequence[SteadyRun]) -> str:
    """A configuration's verdict over seeds: "stable" when more than half of its seeds are (every tier and all)."""
    return STABLE if majority([r.stable for r in runs]) else UNSTABLE


# ---- intervals over seeds -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Interval:
    """Mean of `n` per-seed values and the half-width of its 95% Student-t interval (NaN when n < 2)."""

    mean: float
    half_width: float
    n: int

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    def __str__(self) -> str:
        return f"{self.mean:.4g} ± {self.half_width:.2g}" if math.isfinite(self.half_width) else f"{self.mean:.4g}"

    def to_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "half_width_95": self.half_width, "n": self.n}


def mean_ci95(values: ArrayLike) -> Interval:
    """Mean and 95% half-width (Student t, n−1 df) of the finite values; NaN values are left out."""
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[np.isfinite(v)]
    if v.size == 0:
        return Interval(math.nan, math.nan, 0)
    if v.size == 1:
        return Interval(float(v[0]), math.nan, 1)
    from scipy import stats  # lazy: the t quantile is the only use
    half = float(stats.t.ppf(0.975, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size))
    return Interval(float(v.mean()), half, int(v.size))


def aggregate(summaries: Sequence[RunSummary], metrics: Sequence[str]) -> dict[str, dict[str, Interval]]:
    """Per tier name (as in the first summary) and metric ('ttft.p50', 'slo_attainment', ...): mean ± 95%."""
    if not summaries:
        raise ValueError("aggregate: no summaries")
    out: dict[str, dict[str, Interval]] = {}
    for name in summaries[0].tiers:
        out[name] = {m: mean_ci95([s.tiers[name].get(m) if name in s.tiers else math.nan for s in summaries])
                     for m in metrics}
    return out


@dataclass(slots=True)
class SeedsResult:
    """Several seeds of one configuration: each seed's steady run and the per-tier intervals over seeds."""

    runs: list[SteadyRun]
    intervals: dict[str, dict[str, Interval]] = field(default_factory=dict)

    @property
    def seeds(self) -> list[int]:
        return [r.seed for r in self.runs]

    @property
    def drop_fraction(self) -> float:
        return self.runs[0].drop_fraction

    def to_dict(self) -> dict[str, Any]:
        return {"seeds": self.seeds, "drop_fraction_each_end": self.drop_fraction,
                "intervals": {t: {m: i.to_dict() for m, i in ms.items()} for t, ms in self.intervals.items()},
                "runs": [r.to_dict() for r in self.runs]}
