# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""A streaming log-binned histogram: token-level TBT for millions of tokens in a few kilobytes."""
from __future__ import annotations

import math


class LogHistogram:
    """Counts positive values in geometric bins of relative width `rel_width` (default 0.1%).

    Quantiles read from it are within `rel_width` of the exact ones; values ≤ `min_value` share bin 0.
    """

    __slots__ = ("min_value", "rel_width", "_inv_log_step", "_log_min", "counts", "total", "sum")

    def __init__(self, min_value: float = 1e-6, rel_width: float = 1e-3) -> None:
        self.min_value = min_value
        self.rel_width = rel_width
        self._inv_log_step = 1.0 / math.log1p(rel_width)
        self._log_min = math.log(min_value)
        self.counts: dict[int, int] = {}
        self.total = 0
        self.sum = 0.0

    def bin_of(self, value: float) -> int:
        """The bin `value` falls in (monotone non-decreasing in `value`)."""
        return int((math.log(value) - self._log_min) * self._inv_log_step) if value > self.min_value else 0

    def add(self, value: float, count: int = 1) -> None:
        b = int((math.log(value) - self._log_min) * self._inv_log_step) if value > self.min_value else 0
        c = self.counts
        c[b] = c.get(b, 0) + count
        self.total += count
        self.sum += value * count

    def add_bin(self, b: int, count: int, value_sum: float) -> None:
        """Count `count` values already known to fall in bin `b` (summing to `value_sum`)."""
        c = self.counts
        c[b] = c.get(b, 0) + count
        self.total += count
        self.sum += value_sum

    def merge(self, other: LogHistogram) -> None:
        for b, n in other.counts.items():
            self.counts[b] = self.counts.get(b, 0) + n
        self.total += other.total
        self.sum += other.sum

    def bin_value(self, b: int) -> float:
        """Geometric centre of bin b."""
        return math.exp(self._log_min + (b + 0.5) / self._inv_log_step)

    def items(self) -> tuple[list[float], list[int]]:
        """(bin centres, counts) in increasing order, for weighted quantiles."""
        keys = sorted(self.counts)
        return [self.bin_value(b) for b in keys], [self.counts[b] for b in keys]
