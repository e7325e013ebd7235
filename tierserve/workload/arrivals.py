"""Arrival processes. Each returns `n` non-decreasing arrival times (seconds) from a seeded numpy Generator.

Generated processes start at t = 0 and the first arrival is one inter-arrival gap later (as Vidur's Poisson
generator does). Time-varying rates use the time-rescaling theorem: a unit-rate renewal process (Poisson or
Gamma with the requested CV) is mapped through the inverse cumulative rate Λ⁻¹, which keeps the CV of the
base process locally and the rate profile globally.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Protocol

import numpy as np

from tierserve.core.errors import ConfigError, TraceError
from tierserve.core.paths import shared_data

SERVEGEN_MODELS = ("deepseek_r1", "m_large", "m_mid", "m_small")


class ArrivalProcess(Protocol):
    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray: ...


def _check_positive(name: str, v: float) -> None:
    if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
        raise ConfigError(name, v, "a positive finite number")


def _check_n(n: int) -> None:
    if not isinstance(n, (int, np.integer)) or n < 0:
        raise ConfigError("num_requests", n, "an integer >= 0")


def _unit_gaps(n: int, cv: float, rng: np.random.Generator) -> np.ndarray:
    """Gaps of a unit-rate renewal process with the given CV (cv = 1 is exponential)."""
    if cv == 1.0:
        return rng.exponential(1.0, n)
    k = 1.0 / (cv * cv)
    return rng.gamma(k, 1.0 / k, n)  # Gamma(k, θ=1/k): mean 1, CV 1/√k


@dataclass(frozen=True, slots=True)
class PoissonArrivals:
    """Poisson process at `rate` requests/s."""

    rate: float

    def __post_init__(self) -> None:
        _check_positive("arrivals.rate", self.rate)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        _check_n(n)
        return np.cumsum(_unit_gaps(n, 1.0, rng)) / self.rate

    def _from_unit(self, s: np.ndarray) -> np.ndarray:
        return s / self.rate


@dataclass(frozen=True, slots=True)
class GammaArrivals:
    """Gamma renewal process: mean rate `rate` req/s, inter-arrival CV `cv` (cv > 1 is bursty)."""

    rate: float
    cv: float

    def __post_init__(self) -> None:
        _check_positive("arrivals.rate", self.rate)
        _check_positive("arrivals.cv", self.cv)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        _check_n(n)
        return np.cumsum(_unit_gaps(n, self.cv, rng)) / self.rate

    def _from_unit(self, s: np.ndarray) -> np.ndarray:
        return s / self.rate


@dataclass(frozen=True, slots=True)
class PiecewiseRateArrivals:
    """Piecewise-constant rate `rates[i]` over `durations_s[i]`, repeated periodically.

    `cv` is the CV of the underlying renewal process (1 = inhomogeneous Poisson). Segments may have rate 0.
    """

    rates: tuple[float, ...]
    durations_s: tuple[float, ...]
    cv: float = 1.0

    def __post_init__(self) -> None:
        if len(self.rates) == 0 or len(self.rates) != len(self.durations_s):
            raise ConfigError("arrivals.rates", len(self.rates),
                              f"a non-empty list as long as durations_s ({len(self.durations_s)})")
        for i, r in enumerate(self.rates):
            if not (math.isfinite(r) and r >= 0):
                raise ConfigError(f"arrivals.rates[{i}]", r, "a finite rate >= 0")
        for i, d in enumerate(self.durations_s):
            _check_positive(f"arrivals.durations_s[{i}]", d)
        if sum(self.rates) <= 0:
            raise ConfigError("arrivals.rates", list(self.rates), "at least one rate > 0")
        _check_positive("arrivals.cv", self.cv)

    @property
    def period_s(self) -> float:
        return float(sum(self.durations_s))

    @property
    def mean_rate(self) -> float:
        """Time-averaged rate over one period."""
        return float(np.dot(self.rates, self.durations_s) / self.period_s)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        _check_n(n)
        return self._from_unit(np.cumsum(_unit_gaps(n, self.cv, rng)))  # unit-rate epochs = Λ(t)

    def _from_unit(self, s: np.ndarray) -> np.ndarray:
        """Arrival times of unit-rate epochs `s` (cumulative intensity Λ(t)), through Λ⁻¹; elementwise."""
        rates = np.asarray(self.rates, float)
        edges = np.concatenate(([0.0], np.cumsum(self.durations_s)))
        cum = np.concatenate(([0.0], np.cumsum(rates * np.diff(edges))))
        area = cum[-1]
        periods = np.floor(s / area)
        rem = s - periods * area
        # side='right' skips zero-rate segments, whose cumulative value equals the next one's start
        idx = np.clip(np.searchsorted(cum, rem, side="right") - 1, 0, len(rates) - 1)
        return periods * self.period_s + edges[idx] + (rem - cum[idx]) / rates[idx]

    def scaled_to(self, mean_rate: float) -> PiecewiseRateArrivals:
        """Same shape, rescaled so the time-averaged rate is `mean_rate`."""
        _check_positive("arrivals.mean_rate", mean_rate)
        f = mean_rate / self.mean_rate
        return PiecewiseRateArrivals(tuple(r * f for r in self.rates), self.durations_s, self.cv)


def diurnal(mean_rate: float, amplitude: float = 0.5, period_s: float = 86400.0, segments: int = 48,
            cv: float = 1.0) -> PiecewiseRateArrivals:
    """Diurnal preset: rate = mean·(1 − amplitude·cos(2πt/period)), lowest at t = 0, peak at half period.

    amplitude 0.5 spans mean/2 … 1.5·mean, e.g. Niyama's 2–6 QPS diurnal load is mean 4, amplitude 0.5.
    Discretised into `segments` equal pieces, each at its midpoint rate.
    """
    _check_positive("arrivals.mean_rate", mean_rate)
    if not 0 <= amplitude <= 1:
        raise ConfigError("arrivals.amplitude", amplitude, "a number in [0, 1]")
    _check_positive("arrivals.period_s", period_s)
    if not isinstance(segments, int) or segments < 1:
        raise ConfigError("arrivals.segments", segments, "an integer >= 1")
    mids = (np.arange(segments) + 0.5) / segments
    rates = mean_rate * (1 - amplitude * np.cos(2 * np.pi * mids))
    d = period_s / segments
    # midpoint cosine samples average exactly to 0 for segments >= 2, so the mean rate is kept
    return PiecewiseRateArrivals(tuple(float(r) for r in rates), (d,) * segments, cv)


def servegen_rate_shape(model: str) -> tuple[np.ndarray, np.ndarray]:
    """(window start times s, relative total rate) of a ServeGen model from the shared rate series."""
    if model not in SERVEGEN_MODELS:
        raise ConfigError("arrivals.model", model, " | ".join(SERVEGEN_MODELS))
    path = shared_data("traces", "distributions", f"servegen_{model}_rate.csv")
    if path is None:
        raise ConfigError("arrivals.model", model,
                          "a ServeGen rate file under shared/data/traces/distributions (not found)")
    t, r = [], []
    with open(path, newline="") as f:
        for i, rec in enumerate(csv.DictReader(f), start=1):
            try:
                t.append(float(rec["t_s"]))
                r.append(float(rec["total_rate"]))
            except (KeyError, TypeError, ValueError):
                raise TraceError(str(path), i, "t_s/total_rate", rec, "not numeric or missing") from None
    return np.asarray(t), np.asarray(r)


def servegen(model: str, mean_rate: float, period_s: float | None = None, cv: float = 1.0
             ) -> PiecewiseRateArrivals:
    """ServeGen rate-series shape (10-min windows) rescaled to `mean_rate`; `period_s` compresses or
    stretches the whole series (e.g. a 1-day series into 3600 s) while keeping its shape."""
    t, r = servegen_rate_shape(model)
    w = np.diff(np.append(t, t[-1] + (t[-1] - t[-2] if len(t) > 1 else 600.0)))
    if period_s is not None:
        _check_positive("arrivals.period_s", period_s)
        w = w * (period_s / w.sum())
    base = PiecewiseRateArrivals(tuple(float(x) for x in r), tuple(float(x) for x in w), cv)
    return base.scaled_to(mean_rate)


@dataclass(frozen=True, slots=True)
class TraceArrivals:
    """Replays trace timestamps exactly as read (no rebasing). `target_rate` rescales time so the mean rate
    (n−1)/duration of the replayed prefix equals it. `tick_s` spreads arrivals uniformly inside quantised
    ticks (Mooncake's ~3 s ticks) and keeps them in row order."""

    times_s: tuple[float, ...]
    target_rate: float | None = None
    tick_s: float | None = None

    def __post_init__(self) -> None:
        if self.target_rate is not None:
            _check_positive("arrivals.target_rate", self.target_rate)
        if self.tick_s is not None:
            _check_positive("arrivals.tick_s", self.tick_s)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        _check_n(n)
        if n > len(self.times_s):
            raise ConfigError("num_requests", n, f"at most {len(self.times_s)} (rows in the trace)")
        t = np.asarray(self.times_s[:n], float)
        if n == 0:
            return t
        if self.tick_s is not None:
            t = np.sort(t + rng.uniform(0.0, self.tick_s, n))
        if self.target_rate is not None and n > 1:
            duration = t[-1] - t[0]
            if duration <= 0:
                raise ConfigError("arrivals.target_rate", self.target_rate,
                                  "only with a trace whose arrivals span a positive duration")
            t = t * ((n - 1) / duration) / self.target_rate  # scaling about t = 0 keeps a trace's start offset
        return t


def sample_blocks(process: ArrivalProcess, n: int, rng: np.random.Generator, block: int) -> Iterator[np.ndarray]:
    """The `n` arrival times of `process.sample(n, rng)`, bit for bit, as consecutive arrays of at most `block`.

    Renewal-based processes (Poisson, Gamma, piecewise/diurnal/ServeGen) draw their unit gaps block by block
    (numpy's Generator draws the same numbers in pieces as in one call) and carry the running sum across
    blocks (a cumulative sum is sequential, so the carried sum is the same float); memory is O(block).
    Other processes (trace replay, whose times are in memory anyway) are sampled whole and sliced.
    """
    _check_n(n)
    if not isinstance(process, (PoissonArrivals, GammaArrivals, PiecewiseRateArrivals)):
        t = process.sample(n, rng)
        for lo in range(0, n, block):
            yield t[lo:lo + block]
        return
    cv = 1.0 if isinstance(process, PoissonArrivals) else process.cv
    carry = np.zeros(1)
    for lo in range(0, n, block):
        s = np.cumsum(np.concatenate((carry, _unit_gaps(min(block, n - lo), cv, rng))))[1:]
        carry = s[-1:]
        yield process._from_unit(s)


def trace_times(path: str | Path) -> tuple[float, ...]:
    """Arrival column of a common-format CSV trace (convenience for TraceArrivals)."""
    from tierserve.workload.readers import read_csv_rows

    return tuple(float(r.arrival_s) for r in read_csv_rows(path).rows)  # type: ignore[arg-type]
