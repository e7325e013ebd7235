"""Queues whose stability is known analytically: the ground truth the work verdict is checked against.

`simulate_queue(rho, ...)` runs a c-server queue with Poisson arrivals and one of four service orders — FCFS,
two-class priority, EDF (per-class deadlines) and SRPF (smallest job first among the waiting) — optionally
serving batches: a free server takes up to `batch` waiting jobs at once and holds them for
`batch_overhead_s + Σ sizes` seconds (one token per second per server). Non-preemptive and work-conserving.

Capacity is exact: without batching c / E[S] jobs/s (M/M/c with exponential sizes, M/G/c with lognormal);
with batching full batches are the most efficient, so c·B / (overhead + B·E[S]). The arrival rate is
ρ × that capacity, so ρ < 1 is stable and ρ > 1 unstable whatever the order.

The result maps onto the work verdict's inputs: a job's work is its size, all still to do until its batch
starts and falling linearly to zero at its finish.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from tierserve.metrics.stability import WorkVerdict, work_verdict

ORDERS = ("fcfs", "priority", "edf", "srpf")
HIGH_SHARE = 0.3                     # priority/EDF: share of jobs in the urgent class
DEADLINE_MEANS = (2.0, 20.0)         # EDF: deadline after arrival, in mean job sizes, urgent then relaxed


@dataclass(frozen=True)
class QueueSpec:
    """One analytic queue: `servers`, job sizes (exponential when `size_cv` is 1 and `lognormal` False), and
    batching (`batch` jobs at most per service, each costing `batch_overhead_s` on top of its jobs' sizes)."""

    servers: int = 2
    mean_size: float = 1.0
    size_cv: float = 1.0
    lognormal: bool = False
    batch: int = 1
    batch_overhead_s: float = 0.0

    @property
    def capacity(self) -> float:
        """Jobs per second the servers finish when always busy with full batches."""
        return self.servers * self.batch / (self.batch_overhead_s + self.batch * self.mean_size)

    @property
    def name(self) -> str:
        kind = "M/G" if self.lognormal else "M/M"
        return f"{kind}/{self.servers}" + (f" batch {self.batch}" if self.batch > 1 else "")


@dataclass(frozen=True)
class QueueRun:
    arrival_s: NDArray[np.float64]
    start_s: NDArray[np.float64]
    finish_s: NDArray[np.float64]
    size: NDArray[np.float64]

    def verdict(self, **rule) -> WorkVerdict:
        zeros = np.zeros_like(self.size)
        return work_verdict(self.arrival_s, self.start_s, self.finish_s, zeros, self.size, **rule)


def simulate_queue(rho: float, n: int, seed: int, order: str = "fcfs", spec: QueueSpec = QueueSpec()) -> QueueRun:
    """`n` Poisson arrivals at ρ × `spec.capacity` served in `order` (module docstring); deterministic in seed."""
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}; got {order!r}")
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / (rho * spec.capacity), n)
    arrival = np.cumsum(gaps)
    if spec.lognormal:
        s2 = math.log(1.0 + spec.size_cv ** 2)
        size = rng.lognormal(math.log(spec.mean_size) - s2 / 2, math.sqrt(s2), n)
    else:
        size = rng.exponential(spec.mean_size, n)
    urgent = rng.random(n) < HIGH_SHARE
    rank = np.zeros(n, dtype=np.int64)         # served lowest (rank, key) first
    if order == "fcfs":
        key = arrival
    elif order == "priority":
        key = arrival
        rank = np.where(urgent, 0, 1)
    elif order == "edf":
        key = arrival + spec.mean_size * np.where(urgent, DEADLINE_MEANS[0], DEADLINE_MEANS[1])
    else:
        key = size
    start, finish = np.full(n, np.nan), np.full(n, np.nan)
    free = [(0.0, k) for k in range(spec.servers)]      # (time the server is next free, server)
    waiting: list[tuple[int, float, int]] = []

    def serve(at: float) -> None:
        tf, k = heapq.heappop(free)
        jobs = [heapq.heappop(waiting)[2] for _ in range(min(spec.batch, len(waiting)))]
        t = max(tf, at)
        done = t + spec.batch_overhead_s + float(size[jobs].sum())
        start[jobs], finish[jobs] = t, done
        heapq.heappush(free, (done, k))

    for i in range(n):
        a = float(arrival[i])
        while waiting and free[0][0] <= a:   # servers freed before this arrival take the queue
            serve(free[0][0])
        heapq.heappush(waiting, (int(rank[i]), float(key[i]), i))
        if free[0][0] <= a:
            serve(a)
    while waiting:
        serve(free[0][0])
    return QueueRun(arrival, start, finish, size)


SPECS = {"M/M/2": QueueSpec(), "M/G/4 batch 8": QueueSpec(servers=4, size_cv=2.0, lognormal=True, batch=8,
                                                          batch_overhead_s=2.0)}


@dataclass(frozen=True)
class ErrorRates:
    """Verdicts of `reps` seeds of one queue at one ρ: how many came out each way, and the lengths chosen."""

    queue: str
    order: str
    rho: float
    stable: int
    unstable: int
    undecided: int
    lengths: tuple[int, ...]

    @property
    def reps(self) -> int:
        return self.stable + self.unstable + self.undecided

    @property
    def false_stable(self) -> float:
        """Share of seeds judged stable when the queue is overloaded (ρ > 1); 0 below capacity."""
        return self.stable / self.reps if self.rho > 1 else 0.0

    @property
    def false_unstable(self) -> float:
        """Share of seeds judged unstable when the queue is stable (ρ < 1); 0 above capacity."""
        return self.unstable / self.reps if self.rho < 1 else 0.0


def error_rates(queue: str, order: str, rho: float, reps: int, start: int, most: int,
                first_seed: int = 0) -> ErrorRates:
    """The sequential work verdict (`start` requests, doubled while undecided up to `most`) on `reps` seeds."""
    from tierserve.metrics.stability import STABLE, UNSTABLE, sequential_verdict
    spec = SPECS[queue]
    counts = {STABLE: 0, UNSTABLE: 0}
    undecided = 0
    lengths = []
    for seed in range(first_seed, first_seed + reps):
        _, v = sequential_verdict(lambda n: simulate_queue(rho, n, seed, order, spec), start, most,
                                  lambda r: r.verdict())
        lengths.append(v.num_requests)
        if v.verdict in counts:
            counts[v.verdict] += 1
        else:
            undecided += 1
    return ErrorRates(queue, order, rho, counts[STABLE], counts[UNSTABLE], undecided, tuple(lengths))
