"""Per-tier and whole-run summaries of a run, and the capacity search built on them.

Conventions (each stated once here):
- Latency distributions (TTFT, TPOT, TTLT/E2E, normalized latency) are over FINISHED requests only; a
  rejected or censored request has no complete latency. Its cost shows in SLO attainment instead.
- TBT is token-level: every inter-token gap of every request (censored ones included) is one sample,
  weighted by token count, with inverted-CDF quantiles. Other quantiles use numpy.percentile (linear).
- SLO attainment = requests meeting all their targets / all requests of the tier (rejected and censored
  count as misses). TBT targets are judged on per-request mean TPOT (DistServe); `tbt_max_attainment`
  reports the stricter every-gap criterion.
- Goodput = requests meeting their SLO per second of `duration_s`. Throughput counts finished requests and
  their tokens (vLLM's benchmark convention); `generated_tokens_per_s` counts every emitted token.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from tierserve.core import TierSet
from tierserve.metrics.records import RequestTable, TokenTBT
from tierserve.metrics.stats import LatencyStats, latency_stats

ALL = "all"
LATENCY_FIELDS: tuple[str, ...] = ("ttft", "tbt", "tpot", "ttlt", "normalized_latency")


def _nan_to_none(x: Any) -> Any:
    """JSON has no NaN/inf: they become null; numpy scalars become Python numbers."""
    if isinstance(x, dict):
        return {str(k): _nan_to_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_nan_to_none(v) for v in x]
    if isinstance(x, np.ndarray):
        return _nan_to_none(x.tolist())
    if isinstance(x, (np.bool_, bool)):
        return bool(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return float(x) if math.isfinite(x) else None
    return x


def _none_to_nan(x: Any) -> float:
    return math.nan if x is None else float(x)


@dataclass(slots=True)
class TierSummary:
    """Summary of one tier (or of all requests, `tier == -1`, `name == "all"`). Latencies in seconds."""

    name: str
    tier: int
    total: int = 0
    finished: int = 0
    rejected: int = 0
    censored: int = 0
    relegated: int = 0                        # finished after a policy relegated them (counted in finished)
    ttft: LatencyStats = field(default_factory=LatencyStats)
    tbt: LatencyStats = field(default_factory=LatencyStats)
    tpot: LatencyStats = field(default_factory=LatencyStats)
    ttlt: LatencyStats = field(default_factory=LatencyStats)
    normalized_latency: LatencyStats = field(default_factory=LatencyStats)
    slo_met: int = 0
    slo_attainment: float = math.nan          # slo_met / total; NaN when total == 0
    tbt_max_attainment: float = math.nan      # as slo_attainment, TBT judged on the worst gap
    attainment_goal: float = math.nan         # the tier's SLO.attainment when a TierSet was given
    goodput_rps: float = math.nan
    throughput_rps: float = math.nan
    output_tokens_per_s: float = math.nan
    total_tokens_per_s: float = math.nan
    generated_tokens_per_s: float = math.nan
    preemptions: int = 0
    migrations: int = 0

    @property
    def e2e(self) -> LatencyStats:
        return self.ttlt

    @property
    def meets_goal(self) -> bool:
        """True when attainment reaches the tier's goal (False when no goal is known)."""
        return bool(self.slo_attainment >= self.attainment_goal)

    def get(self, path: str) -> float:
        """A number by dotted name: 'ttft.p99', 'e2e.p50', 'slo_attainment', 'goodput_rps', ..."""
        head, _, sub = path.partition(".")
        obj = getattr(self, "ttlt" if head == "e2e" else head)
        return float(getattr(obj, sub) if sub else obj)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            out[f.name] = v.to_dict() if isinstance(v, LatencyStats) else v
        return out

    def to_row(self) -> dict[str, Any]:
        """Flat: latency stats become '<metric>_<stat>' columns."""
        row: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, LatencyStats):
                row.update({f"{f.name}_{k}": x for k, x in v.to_dict().items()})
            else:
                row[f.name] = v
        return row

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TierSummary:
        kw: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in d:
                continue
            v = d[f.name]
            if f.name in LATENCY_FIELDS:
                kw[f.name] = LatencyStats.from_dict(v or {})
            elif f.type in ("float", float):
                kw[f.name] = _none_to_nan(v)
            else:
                kw[f.name] = v
        return cls(**kw)


@dataclass(slots=True)
class RunSummary:
    """Per-tier summaries (in tier order) plus "all", the run's duration and run-level extras."""

    duration_s: float
    tiers: dict[str, TierSummary]
    extras: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, name_or_tier: str | int) -> TierSummary:
        """By name ('all', 'tier0', 'premium') or by tier index (int)."""
        if isinstance(name_or_tier, (int, np.integer)):
            for s in self.tiers.values():
                if s.tier == int(name_or_tier):
                    return s
            raise KeyError(name_or_tier)
        return self.tiers[name_or_tier]

    def __iter__(self) -> Iterator[TierSummary]:
        return iter(self.tiers.values())

    @property
    def all(self) -> TierSummary:
        return self.tiers[ALL]

    @property
    def per_tier(self) -> list[TierSummary]:
        """Tier summaries without "all"."""
        return [s for s in self.tiers.values() if s.tier >= 0]

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable (NaN and inf become null)."""
        return _nan_to_none({
            "duration_s": self.duration_s,
            "tiers": {k: v.to_dict() for k, v in self.tiers.items()},
            "extras": self.extras,
        })

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> RunSummary:
        return cls(duration_s=_none_to_nan(d.get("duration_s")),
                   tiers={k: TierSummary.from_dict(v) for k, v in d["tiers"].items()},
                   extras=dict(d.get("extras") or {}))

    def to_rows(self) -> list[dict[str, Any]]:
        """One flat dict per tier (then "all") for CSV; NaN kept as float NaN."""
        return [s.to_row() for s in self.tiers.values()]


def _tier_names(tier_names: Sequence[str] | TierSet | None, present: list[int]) -> dict[int, str]:
    if tier_names is None:
        return {t: f"tier{t}" for t in present}
    names = list(tier_names.names) if isinstance(tier_names, TierSet) else list(tier_names)
    out = {i: n for i, n in enumerate(names)}
    for t in present:  # a tier in the data but not in the names still gets reported
        out.setdefault(t, f"tier{t}")
    if ALL in out.values():
        raise ValueError(f"tier name {ALL!r} is reserved for the whole-run summary")
    return dict(sorted(out.items()))


def summarize_tier(table: RequestTable, tbt: TokenTBT, duration_s: float, name: str, tier: int,
                   attainment_goal: float = math.nan) -> TierSummary:
    """Summary of `table` (already restricted to one tier, or the whole run) over `duration_s` seconds."""
    fin = table.finished
    n = len(table)
    met = int(table.meets_slo.sum())
    per_s = (lambda x: float(x) / duration_s) if duration_s > 0 else (lambda x: math.nan)
    out_fin = int(table.generated_tokens[fin].sum())
    return TierSummary(
        name=name, tier=tier, total=n, finished=int(fin.sum()),
        rejected=int(table.rejected.sum()), censored=int(table.censored.sum()),
        relegated=int(table.relegated.sum()),
        ttft=latency_stats(table.ttft_s[fin]),
        tbt=tbt.stats(),
        tpot=latency_stats(table.tpot_s[fin]),
        ttlt=latency_stats(table.ttlt_s[fin]),
        normalized_latency=latency_stats(table.normalized_latency_s[fin]),
        slo_met=met,
        slo_attainment=met / n if n else math.nan,
        tbt_max_attainment=float(table.meets_slo_strict.sum()) / n if n else math.nan,
        attainment_goal=attainment_goal,
        goodput_rps=per_s(met),
        throughput_rps=per_s(fin.sum()),
        output_tokens_per_s=per_s(out_fin),
        total_tokens_per_s=per_s(out_fin + int(table.prompt_tokens[fin].sum())),
        generated_tokens_per_s=per_s(table.generated_tokens.sum()),
        preemptions=int(table.preemptions.sum()),
        migrations=int(table.migrations.sum()),
    )


def summarize(table: RequestTable, tbt: TokenTBT | None, duration_s: float,
              tier_names: Sequence[str] | TierSet | None = None,
              extras: Mapping[str, Any] | None = None) -> RunSummary:
    """Summaries per tier (every named tier, plus any tier present in the data) and for "all".

    `tier_names` may be a TierSet, which also supplies each tier's attainment goal.
    """
    tbt = tbt if tbt is not None else TokenTBT.empty()
    names = _tier_names(tier_names, table.tiers)
    goals = ({t.index: t.slo.attainment for t in tier_names} if isinstance(tier_names, TierSet) else {})
    out: dict[str, TierSummary] = {}
    for t, name in names.items():
        out[name] = summarize_tier(table.for_tier(t), tbt.for_tier(t), duration_s, name, t,
                                   goals.get(t, math.nan))
    out[ALL] = summarize_tier(table, tbt, duration_s, ALL, -1)
    return RunSummary(duration_s=float(duration_s), tiers=out, extras=dict(extras or {}))


# ---- capacity search ----------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Probe:
    rate: float
    attainment: float
    ok: bool
    summary: RunSummary | None = None


@dataclass(slots=True)
class CapacityResult:
    """`rate`: the largest probed rate that met the target (NaN when even `lo` failed).
    `saturated`: `hi` itself met it, so the true capacity may be higher."""

    rate: float
    probes: list[Probe]
    saturated: bool = False

    @property
    def feasible(self) -> bool:
        return not math.isnan(self.rate)


def attainment_of(summary: RunSummary, tier: str | int | None = None) -> float:
    """SLO attainment of one tier, or of "all" when `tier` is None."""
    return summary[ALL if tier is None else tier].slo_attainment


def bisect_rate(passes: Callable[[float], bool], lo: float, hi: float, *, tol: float | None = None,
                rel_tol: float | None = None, max_probes: int = 64) -> tuple[float, bool]:
    """(largest rate found to pass, whether `hi` itself passed), by bisection between `lo` and `hi`.

    Assumes `passes` holds below some rate and fails above it. Probes `lo` (NaN if it fails), then `hi`,
    then midpoints. Give exactly one stopping rule: `tol` (same units as rate) bisects arithmetically until
    failing − passing <= tol; `rel_tol` bisects geometrically until failing / passing <= 1 + rel_tol.
    At most `max_probes` calls of `passes`.
    A pointwise stricter `passes` never returns a higher rate: the two searches probe the same points
    until the stricter one fails where the other passes, and from then on their brackets do not overlap.
    """
    if (tol is None) == (rel_tol is None):
        raise ValueError("bisect_rate needs exactly one of tol and rel_tol")
    step = tol if tol is not None else rel_tol
    if not (0 <= lo < hi) or not (step > 0) or (rel_tol is not None and lo <= 0):
        raise ValueError(f"bisection needs 0 <= lo < hi (lo > 0 with rel_tol) and a positive tolerance; "
                         f"got lo={lo}, hi={hi}, tol={tol}, rel_tol={rel_tol}")
    if not passes(lo):
        return math.nan, False
    if passes(hi):
        return hi, True
    good, bad, probes = lo, hi, 2
    while probes < max_probes and (bad - good > tol if tol is not None else bad / good > 1 + rel_tol):
        mid = 0.5 * (good + bad) if tol is not None else math.sqrt(good * bad)
        probes += 1
        if passes(mid):
            good = mid
        else:
            bad = mid
    return good, False


def capacity_search(run_fn: Callable[[float], RunSummary], lo: float, hi: float,
                    target_attainment: float = 0.99, tol: float = 0.05, *,
                    tier: str | int | None = None,
                    meets: Callable[[RunSummary], bool] | None = None,
                    max_probes: int = 64, keep_summaries: bool = True) -> CapacityResult:
    """Largest rate in [lo, hi] whose run meets the target, by bisection to within `tol` (same units as rate).

    A single-run, attainment-only search. For capacity with stability verdicts, seeds and per-tier results
    use `tierserve.experiments.capacity.find_capacity`. By default a run passes when the attainment of `tier`
    (or "all") is >= `target_attainment`; pass `meets` for another criterion (e.g. every tier its goal).
    """
    if not (0 <= lo < hi) or tol <= 0:
        raise ValueError(f"capacity_search needs 0 <= lo < hi and tol > 0; got lo={lo}, hi={hi}, tol={tol}")
    probes: list[Probe] = []

    def probe(rate: float) -> bool:
        s = run_fn(rate)
        a = attainment_of(s, tier)
        ok = bool(meets(s)) if meets is not None else bool(a >= target_attainment)
        probes.append(Probe(rate, a, ok, s if keep_summaries else None))
        return ok

    rate, saturated = bisect_rate(probe, lo, hi, tol=tol, max_probes=max_probes)
    return CapacityResult(rate, probes, saturated)
