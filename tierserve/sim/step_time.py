# Compiled with mypyc (tierserve/_native.py, COMPILED_SOURCES): edit it and the package runs pure Python until rebuilt.
"""Step-time variability: each iteration's time factor, drawn from (seed, replica, iteration) by a counter hash.

Owns: the hash and the factor of one iteration (`step_time_factor`). May not touch: a replica's state (the
replica's `_scale` applies the factor; the speed trace is applied by `sim/simulate.py` through `set_slowdown`).
An iteration timed ahead in a run and the same iteration stepped alone draw the same factor, which is what
keeps skip-ahead exact under variability.
"""
from __future__ import annotations

_MASK64 = (1 << 64) - 1
_GOLDEN64 = 0x9E3779B97F4A7C15


def _splitmix64(z: int) -> int:
    """splitmix64's output function of a 64-bit counter value: a stateless, well-mixed 64-bit hash."""
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def step_factor_key(seed: int, replica_index: int) -> int:
    """The counter key of one replica's step-time factors, from the run's seed and the replica's index."""
    return _splitmix64((_splitmix64((seed & _MASK64) ^ _GOLDEN64) + replica_index * _GOLDEN64) & _MASK64)


def step_time_factor(table: list[float], key: int, iteration: int) -> float:
    """The step-time factor of the replica's `iteration`-th iteration (0-based, counted as stepping counts
    them): one of `table`'s equally likely values, chosen by a counter-based hash, so an iteration timed
    ahead in a run and the same iteration stepped alone draw the same factor."""
    z = _splitmix64((key + (iteration + 1) * _GOLDEN64) & _MASK64)
    return table[(z * len(table)) >> 64]

