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
SEEDS = Limit("seeds", 1000, "seeds per run or point")
REPLICAS = Limit("replicas", 4096, "replicas")
SEGMENTS = Limit("segments", 100_000, "rate segments")
TIERS = Limit("tiers", 100, "tiers")
YAML_NODES = Limit("yaml_nodes", 100_000, "YAML values after alias expansion")
CELL_CHARS = Limit("cell_chars", 1_048_576, "characters in one CSV cell or JSON line field")
LINE_CHARS = Limit("line_chars", 1_048_576, "characters in one line of a text file")
CONFIG_BYTES = Limit("config_bytes", 16 * 2**20, "bytes in a YAML/JSON configuration file")
LIMITS = (REQUESTS, SEEDS, REPLICAS, SEGMENTS, TIERS, YAML_NODES, CELL_CHARS, LINE_CHARS, CONFIG_BYTES)


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


MAX_PARAM_INT = MAX_TOKENS
# A replica's speed factor (its time x its modelled time) stays within 1000x either way: a measured slowdown or
# speed-up beyond that is a broken trace, and a factor of 1e300 would push times past MAX_TIME_S.
MIN_SPEED_FACTOR, MAX_SPEED_FACTOR = 1e-3, 1e3


def check_param_magnitude(field: str, value: Any) -> None:
    """A policy parameter's whole numbers (also inside lists) are at most MAX_TOKENS in magnitude: each is a
    count of tokens, steps or tiers that the simulator's compiled code keeps in 64-bit integers and multiplies."""
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_param_magnitude(f"{field}[{i}]", v)
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_PARAM_INT:
        raise ConfigError(field, value, f"a whole number of magnitude at most {MAX_PARAM_INT:,} (2^31 - 1, the "
                                        "stated bound on counts and token numbers)")


# ---- command-line numbers ---------------------------------------------------------------------------------

MAX_TP = 64                     # tensor-parallel degree: no listed GPU node has more
MAX_WORKERS = 1024              # process-pool size
# option (its Python name) -> (lowest, highest or a size Limit, what it counts)
CLI_BOUNDS: dict[str, tuple[float, float | Limit, str]] = {
    "seeds": (1, SEEDS, "seeds"), "requests": (1, REQUESTS, "requests"), "num_requests": (1, REQUESTS, "requests"),
    "replicas": (1, REPLICAS, "replicas"), "tp": (1, MAX_TP, "GPUs per replica"),
    "workers": (1, MAX_WORKERS, "worker processes"), "seed": (0, 2**63 - 1, "a seed"),
    "rate": (1e-12, 1e12, "req/s"), "time_limit": (1e-9, MAX_TIME_S, "s"), "segment_s": (1e-6, MAX_TIME_S, "s"),
}
NAME_OPTIONS = ("model", "gpu", "local_policy", "cluster_policy", "trace_format", "executor", "stacks")


def check_options(options: dict[str, Any]) -> None:
    """Every number a command is given is finite and within its stated bounds, and a name is not blank; a
    ConfigError names the flag, the value and the bound. (Options the command was not given are None.)"""
    for name, v in options.items():
        flag = "--" + name.replace("_", "-")
        if isinstance(v, str) and name in NAME_OPTIONS and not v.strip():
            raise ConfigError(flag, v, "a name (not blank); leave the option out for the default")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise ConfigError(flag, v, "a finite number")
        if name not in CLI_BOUNDS:
            continue
        lo, hi, unit = CLI_BOUNDS[name]
        if isinstance(hi, Limit):
            if v < lo:
                raise ConfigError(flag, v, f"at least {lo:g} {unit}")
            hi.check(flag, v)
        elif not lo <= v <= hi:
            span = f"a whole number in [{lo:,}, {hi:,}]" if isinstance(lo, int) else f"a number in [{lo:g}, {hi:g}]"
            raise ConfigError(flag, v, f"{span} ({unit}; a stated bound)")
