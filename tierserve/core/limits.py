"""Stated limits on input sizes and values, and the number types every config field uses.

Size limits keep a hostile or mistaken input from exhausting memory or time before anything useful happens;
each is raised with an environment variable (`TIERSERVE_MAX_<NAME>`), which the error message names.

Value bounds are not adjustable:
- `MAX_TIME_S` = 1e9 s (≈ 31.7 years): arrival times and time limits stay below it, so float64 time keeps a
  resolution of 2^-23 s ≈ 0.12 µs over the whole run (the spacing of doubles in [2^29, 2^30) s); iteration
  times of tens of µs are then never lost in rounding.
- `MAX_TOKENS` = 2^31 − 1: token counts fit every integer type the simulator and numpy use, with room for sums.
- `MAX_INT` = 2^53: any other integer field stays exact as a float.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BeforeValidator

from tierserve.core.errors import ConfigError

MAX_TIME_S = 1e9
MAX_TOKENS = 2**31 - 1
MAX_INT = 2**53


@dataclass(frozen=True, slots=True)
class Limit:
    """A size limit: its default and what it counts; `value` reads the environment override."""

    name: str
    default: int
    counts: str

    @property
    def env(self) -> str:
        return f"TIERSERVE_MAX_{self.name.upper()}"

    @property
    def value(self) -> int:
        raw = os.environ.get(self.env)
        if raw is None or raw.strip() == "":
            return self.default
        try:
            v = int(raw.strip())
        except ValueError:
            raise ConfigError(self.env, raw, "a whole number (an environment variable raising a limit)") from None
        if v < 1:
            raise ConfigError(self.env, raw, "a whole number >= 1")
        return v

    def allowed(self) -> str:
        return f"at most {self.value:,} {self.counts} (a stated limit; raise it with {self.env}=N)"

    def check(self, field: str, n: int, value: object | None = None) -> None:
        """ConfigError naming `field` when `n` exceeds the limit."""
        if n > self.value:
            raise ConfigError(field, n if value is None else value, self.allowed())


REQUESTS = Limit("requests", 10_000_000, "requests per run")
REPLICAS = Limit("replicas", 4096, "replicas")
SEGMENTS = Limit("segments", 100_000, "rate segments")
TIERS = Limit("tiers", 100, "tiers")
YAML_NODES = Limit("yaml_nodes", 100_000, "YAML values after alias expansion")
CELL_CHARS = Limit("cell_chars", 4096, "characters in one CSV cell or JSON line field")
LINE_CHARS = Limit("line_chars", 1_048_576, "characters in one line of a text file")
CONFIG_BYTES = Limit("config_bytes", 16 * 2**20, "bytes in a YAML/JSON configuration file")
LIMITS = (REQUESTS, REPLICAS, SEGMENTS, TIERS, YAML_NODES, CELL_CHARS, LINE_CHARS, CONFIG_BYTES)


# ---- number types for pydantic config fields ----------------------------------------------------------------

def _no_bool_or_text(v: Any) -> Any:
    """A config number must be written as a number: `true` is not a count, "12" is not a rate."""
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        raise ValueError(f"a number, not the boolean {v!r}")
    if isinstance(v, (str, bytes)):
        raise ValueError(f"a number, not the text {v!r}")
    return v


def _bounded_int(v: Any) -> Any:
    v = _no_bool_or_text(v)
    if isinstance(v, float) and not math.isfinite(v):
        raise ValueError(f"a whole number, not {v!r}")
    if isinstance(v, (int, float)) and abs(v) > MAX_INT:
        raise ValueError(f"a whole number of magnitude at most 2^53, not {v!r}")
    return v


# `Int`/`Float` refuse booleans and text before pydantic's own (lax) conversion; bounds go in Field().
Int = Annotated[int, BeforeValidator(_bounded_int)]
Float = Annotated[float, BeforeValidator(_no_bool_or_text)]


def check_time(field: str, t: float) -> None:
    """ConfigError unless 0 <= t <= MAX_TIME_S (see the module docstring for why)."""
    if not (0 <= t <= MAX_TIME_S):
        raise ConfigError(field, t, f"a time in [0, {MAX_TIME_S:g}] s (float time keeps sub-µs resolution "
                                    "only below 1e9 s)")
