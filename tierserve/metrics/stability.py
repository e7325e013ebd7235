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
from collections.abc import Callable, Mapping, Sequence
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
                         drop_fraction: float | None = DEFAULT_DROP_FRACTION,
                         extras: Mapping[str, Any] | None = None, *, warmup_s: float | None = None) -> RunSummary:
    """Per-tier summary of the steady-state window; rates are per second of the window's arrival span.

    The window is either ⌊f·n⌋ arrivals dropped at each end (`drop_fraction` f), or, with `warmup_s` (and
    `drop_fraction` None), every request arriving from the warm-up's end on (the run drains, so its last
    arrivals are served in steady state too). Token-level TBT is empty here (it is not kept per request);
    `extras` gains `steady_state` = how the window was cut, the counts kept and dropped, and its arrival span.
    """
    if drop_fraction is None:
        start = -math.inf if warmup_s is None or not math.isfinite(warmup_s) else float(warmup_s)
        window = table.select(np.asarray(table.arrival_s) >= start)
        how: dict[str, Any] = {"warmup_s": start if math.isfinite(start) else None,
                               "cut": "warm-up found by MSER on the unfinished work; no tail dropped"}
    else:
        window = steady_state_table(table, drop_fraction)
        how = {"drop_fraction_each_end": drop_fraction}
    a = window.arrival_s
    span_s = float(a.max() - a.min()) if len(window) > 1 else 0.0
    info = {**how, "kept": len(window), "dropped": len(table) - len(window),
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


# ---- the work verdict: unfinished tokens and their growth with run length ----------------------------
WORK = "work"                    # the key of the work verdict in a SteadyRun's `stability`
UNDECIDED = "undecided"
WORK_TOLERANCE = 0.02            # growth below 2% of the arriving work is no growth (ρ ≲ 1.02)
WORK_GRID = 200                  # instants at which the unfinished work is read
WORK_BATCHES = 10                # batch means the growth is fitted on


@dataclass(frozen=True, slots=True)
class WorkVerdict:
    """Stable / unstable / undecided from the unfinished work of a run (module docstring has the rule).

    `growth`: the fitted rise of unfinished work over the steady window as a fraction of the work that arrived
    in it (≈ 1 − 1/ρ for an overloaded queue, 0 for a stable one), with its 95% interval `growth_low`–
    `growth_high`; `warmup_s`: when the warm-up found ends; `work_tokens`: batch means of the unfinished work.
    `num_requests`: requests the run offered (its length); `lengths`: every length run to reach the verdict.
    """

    verdict: str
    growth: float = math.nan
    growth_low: float = math.nan
    growth_high: float = math.nan
    tolerance: float = WORK_TOLERANCE
    warmup_s: float = math.nan
    window_s: tuple[float, float] = (math.nan, math.nan)
    warmup_fraction: float = math.nan       # of the requests, arriving before the warm-up's end
    work_tokens: tuple[float, ...] = ()
    num_requests: int = 0
    lengths: tuple[int, ...] = ()
    reason: str = ""
    measure: str = WORK

    @property
    def stable(self) -> bool:
        """True only for "stable": an undecided run has not shown it is stable."""
        return self.verdict == STABLE

    @property
    def n(self) -> int:
        return self.num_requests

    def lengthened(self, lengths: Sequence[int]) -> WorkVerdict:
        from dataclasses import replace
        return replace(self, lengths=tuple(int(x) for x in lengths))

    def __str__(self) -> str:
        if not math.isfinite(self.growth):
            return f"{self.verdict} ({self.reason})"
        runs = "→".join(str(x) for x in self.lengths) if len(self.lengths) > 1 else str(self.num_requests)
        return (f"{self.verdict}: unfinished work grows {self.growth:+.1%} of the arriving work "
                f"[{self.growth_low:+.1%}, {self.growth_high:+.1%}] (tolerance {self.tolerance:.0%}), "
                f"warm-up {self.warmup_fraction:.0%} dropped, {runs} requests")

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "measure": self.measure, "growth": self.growth,
                "growth_low": self.growth_low, "growth_high": self.growth_high, "tolerance": self.tolerance,
                "warmup_s": self.warmup_s, "window_s": list(self.window_s), "warmup_fraction": self.warmup_fraction,
                "work_tokens": list(self.work_tokens), "num_requests": self.num_requests,
                "lengths": list(self.lengths), "reason": self.reason}


def unfinished_work(at_s: ArrayLike, arrival_s: ArrayLike, first_s: ArrayLike, finish_s: ArrayLike,
                    prefill: ArrayLike, decode: ArrayLike) -> NDArray[np.float64]:
    """Tokens still to compute at each instant of `at_s`: a request's prefill until its first token, its decode
    falling linearly from the first token to its finish. NaN first/finish = not reached (never done)."""
    t = np.asarray(at_s, dtype=np.float64)
    a = np.asarray(arrival_s, dtype=np.float64)
    first = np.nan_to_num(np.asarray(first_s, dtype=np.float64), nan=np.inf)
    fin = np.nan_to_num(np.asarray(finish_s, dtype=np.float64), nan=np.inf)
    fin = np.maximum(fin, first)
    p = np.asarray(prefill, dtype=np.float64)
    d = np.asarray(decode, dtype=np.float64)

    def total_by(times: NDArray[np.float64], weight: NDArray[np.float64]) -> NDArray[np.float64]:
        order = np.argsort(times, kind="stable")
        cum = np.concatenate([[0.0], np.cumsum(weight[order])])
        return cum[np.searchsorted(times[order], t, side="right")]

    arrived = total_by(a, p + d)
    with np.errstate(invalid="ignore"):                     # inf − inf where neither token came: not linear
        span = fin - first
    linear = np.isfinite(fin) & (span > 0)                  # decodes over a positive time
    rate = np.where(linear, d / np.where(linear, span, 1.0), 0.0)   # decode tokens per s while decoding
    rate_first = rate * np.where(linear, first, 0.0)
    # done by t: prefill at the first token, decode whole at the finish, and rate·(t − first) while decoding
    decoding_rate = total_by(first, rate) - total_by(fin, rate)
    decoding_offset = total_by(first, rate_first) - total_by(fin, rate_first)
    done = total_by(first, p) + total_by(fin, d) + t * decoding_rate - decoding_offset
    return np.maximum(arrived - done, 0.0)


def mser_cut(series: ArrayLike, max_fraction: float = 0.5) -> int:
    """Warm-up length by MSER (White 1997): the cut d ≤ max_fraction·n minimising the squared standard error of
    the mean of series[d:], Σ(x − x̄)² / (n − d)²."""
    x = np.asarray(series, dtype=np.float64)
    n = x.size
    tail_sum = np.cumsum(x[::-1])[::-1]
    tail_sq = np.cumsum((x * x)[::-1])[::-1]
    m = n - np.arange(n)
    sse = tail_sq - tail_sum * tail_sum / m
    score = sse / (m.astype(np.float64) ** 2)
    limit = max(1, int(max_fraction * n))
    return int(np.argmin(score[:limit]))


def work_verdict(arrival_s: ArrayLike, first_s: ArrayLike, finish_s: ArrayLike, prefill: ArrayLike,
                 decode: ArrayLike, *, tolerance: float = WORK_TOLERANCE, grid: int = WORK_GRID,
                 batches: int = WORK_BATCHES, min_requests: int = 200) -> WorkVerdict:
    """Verdict from a run's unfinished work over its arrival span (module docstring)."""
    from scipy import stats  # lazy: only verdicts need scipy
    a = np.asarray(arrival_s, dtype=np.float64).ravel()
    n = int(a.size)
    if n < min_requests:
        return WorkVerdict(UNDECIDED, tolerance=tolerance, num_requests=n, lengths=(n,),
                           reason=f"{n} requests: too few to read a growth (< {min_requests})")
    t0, t1 = float(a.min()), float(a.max())
    at = np.linspace(t0, t1, grid)
    work = unfinished_work(at, a, first_s, finish_s, prefill, decode)
    cut = mser_cut(work)
    start = float(at[cut])
    tail_at, tail = at[cut:], work[cut:]
    groups = np.array_split(np.arange(tail.size), batches)
    means = np.array([tail[g].mean() for g in groups])
    mids = np.array([tail_at[g].mean() for g in groups])
    size = np.asarray(prefill, dtype=np.float64) + np.asarray(decode, dtype=np.float64)
    inside = a >= start
    arriving = float(size[inside].sum())
    fit = stats.linregress(mids, means)
    half = float(stats.t.ppf(0.975, batches - 2) * fit.stderr)
    span = t1 - start
    scale = span / arriving if arriving > 0 and span > 0 else math.nan   # tokens/s of growth → fraction
    g, lo, hi = fit.slope * scale, (fit.slope - half) * scale, (fit.slope + half) * scale
    if lo > tolerance:
        verdict = UNSTABLE
    elif hi < tolerance:
        verdict = STABLE
    else:
        verdict = UNDECIDED
    return WorkVerdict(verdict, float(g), float(lo), float(hi), tolerance, start, (start, t1),
                       float(1.0 - inside.mean()), tuple(float(x) for x in means), n, (n,),
                       reason=f"growth interval straddles the tolerance" if verdict == UNDECIDED else "")


def table_work_verdict(table: RequestTable, end_s: float | None = None, **rule: Any) -> WorkVerdict:
    """`work_verdict` of a request table: rejected rows left out; a request cut off by the run's end counts its
    decode as progressing at the pace it had (its generated tokens by `end_s`), an unstarted one as all to do."""
    queued = ~table.rejected
    a = np.asarray(table.arrival_s, dtype=np.float64)[queued]
    first = np.asarray(table["first_token_s"], dtype=np.float64)[queued].copy()
    fin = np.asarray(table["finish_s"], dtype=np.float64)[queued].copy()
    decode = np.asarray(table["output_tokens"], dtype=np.float64)[queued]
    made = np.asarray(table["generated_tokens"], dtype=np.float64)[queued]
    end = float(end_s) if end_s is not None else (float(np.nanmax(fin)) if np.isfinite(fin).any() else 0.0)
    cut_off = np.isnan(fin) & np.isfinite(first) & (made > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        fin[cut_off] = first[cut_off] + (end - first[cut_off]) * decode[cut_off] / made[cut_off]
    v = work_verdict(a, first, fin, np.asarray(table["prompt_tokens"], dtype=np.float64)[queued], decode, **rule)
    from dataclasses import replace
    return replace(v, num_requests=len(table), lengths=(len(table),))   # its length counts the rejected too


def sequential_verdict(run_at: Callable[[int], Any], start: int, most: int,
                       verdict_of: Callable[[Any], WorkVerdict]) -> tuple[Any, WorkVerdict]:
    """Run at `start` requests and double the length while the verdict is undecided, up to `most`.

    Returns the last run and its verdict, whose `lengths` lists every length tried (the run length the
    method chose is the last)."""
    if not (0 < start <= most):
        raise ValueError(f"run lengths need 0 < start <= most; got start={start}, most={most}")
    lengths: list[int] = []
    n = int(start)
    while True:
        run = run_at(n)
        lengths.append(n)
        v = verdict_of(run)
        if v.verdict != UNDECIDED or n >= most:
            return run, v.lengthened(lengths)
        n = min(2 * n, int(most))


def all_stable(verdicts: Mapping[str, StabilityVerdict]) -> bool:
    return all(v.stable for v in verdicts.values())


# ---- a run judged in steady state ---------------------------------------------------------------------
@dataclass(slots=True)
class SteadyRun:
    """One seed at one rate: the steady-state summary, the stability verdict(s), and what produced them.

    `stability[WORK]` (from `steady_run`) is the work verdict and alone decides `stable`; runs built from the
    older per-stream verdicts (no WORK entry) are stable when every entry is. `drop_fraction`: the share of
    requests left out of the summary as warm-up (found, or the fixed fraction given).
    """

    summary: RunSummary
    stability: dict[str, Any]
    seed: int
    rate: float = math.nan
    drop_fraction: float = DEFAULT_DROP_FRACTION

    @property
    def work(self) -> WorkVerdict | None:
        v = self.stability.get(WORK)
        return v if isinstance(v, WorkVerdict) else None

    @property
    def num_requests(self) -> int:
        """Requests the run offered (its length, as the work verdict read it; 0 when there is none)."""
        w = self.work
        return w.num_requests if w is not None else 0

    @property
    def stable(self) -> bool:
        w = self.work
        return w.stable if w is not None else all_stable(self.stability)

    def verdict_line(self) -> str:
        """'stable', 'undecided' or 'unstable' (with the unstable entries named for the older verdicts)."""
        w = self.work
        if w is not None:
            return w.verdict
        bad = [k for k, v in self.stability.items() if not v.stable]
        return STABLE if not bad else f"{UNSTABLE} ({', '.join(bad)})"

    def to_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "rate": self.rate, "drop_fraction_each_end": self.drop_fraction,
                "num_requests": self.num_requests, "verdict": self.verdict_line(),
                "stability": {k: v.to_dict() for k, v in self.stability.items()},
                "summary": self.summary.to_dict()}


def steady_run(table: RequestTable, end_s: float, tier_names: Sequence[str] | TierSet | None, seed: int,
               rate: float = math.nan, drop_fraction: float | None = None,
               extras: Mapping[str, Any] | None = None, **rule: Any) -> SteadyRun:
    """The work verdict of one finished run (under WORK) and its steady-state summary: from the warm-up the
    verdict found on (`drop_fraction` None, the default) or with a fixed fraction dropped at each end."""
    work = table_work_verdict(table, end_s, **rule)
    summary = steady_state_summary(table, tier_names, drop_fraction, extras, warmup_s=work.warmup_s)
    dropped = drop_fraction if drop_fraction is not None else (
        work.warmup_fraction if math.isfinite(work.warmup_fraction) else 0.0)
    return SteadyRun(summary, {WORK: work}, seed, rate, dropped)


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
