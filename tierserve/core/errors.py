"""Errors raised on bad input. Each names the field, the value and what is allowed."""
from __future__ import annotations

MAX_VALUE_CHARS = 120      # a value is quoted in a message at most this long (never an expanded YAML bomb)


def short_repr(value: object, limit: int = MAX_VALUE_CHARS) -> str:
    """repr(value), cut to `limit` characters with the full length stated; containers are never expanded
    beyond what the cut keeps (reprlib walks at most a few items of each)."""
    import reprlib

    r = reprlib.Repr()
    r.maxstring = r.maxother = r.maxlong = limit
    r.maxlist = r.maxtuple = r.maxdict = r.maxset = r.maxfrozenset = r.maxdeque = r.maxarray = 6
    r.maxlevel = 3
    text = r.repr(value)
    if len(text) > limit:
        text = text[:limit] + f"… ({len(text)} chars)"
    return text


class TierserveError(Exception):
    """Base class for every error tierserve raises on purpose."""


class ConfigError(TierserveError, ValueError):
    """An impossible or unknown configuration value."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}: got {short_repr(value)}; allowed: {allowed}")

    def __reduce__(self):       # survives the trip back from a pool worker
        return (type(self), (self.field, self.value, self.allowed))


class InputError(TierserveError, ValueError):
    """A file that cannot be read as what it should be; names the file, the row (or byte offset) and the field."""

    def __init__(self, source: str, row: int | None, field: str, value: object, problem: str) -> None:
        self.source, self.row, self.field, self.value, self.problem = source, row, field, value, problem
        where = f"{source}" + (f", row {row}" if row is not None else "")
        super().__init__(f"{where}: field {field!r} = {short_repr(value)}: {problem}")

    def __reduce__(self):
        return (type(self), (self.source, self.row, self.field, self.value, self.problem))


class OutputError(TierserveError):
    """A result that cannot be written: one line naming the path and what went wrong (disk full, name too long…)."""

    def __init__(self, path: str, problem: str) -> None:
        self.path, self.problem = path, problem
        super().__init__(f"{path}: {problem}")

    def __reduce__(self):
        return (type(self), (self.path, self.problem))


class TraceError(InputError):
    """A malformed workload trace; names the file, the row and the field."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a batch of runs: which of them had finished (their results, None for the rest).

    A KeyboardInterrupt, so nothing that catches Exception swallows it on the way out."""

    def __init__(self, signal_name: str, description: str, results: list, finished: list[int]) -> None:
        self.signal_name, self.description = signal_name, description
        self.results, self.finished = results, finished
        super().__init__(f"{signal_name}: {len(finished)} of {len(results)} {description} finished; "
                         "queued and running ones were cancelled")


def config_error_from_validation(exc, root: str) -> ConfigError:
    """One ConfigError from a pydantic ValidationError: the first error's field path, input and rule.

    A ConfigError raised inside a validator keeps its own field, appended to the path it was raised under."""
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or root
    inner = (err.get("ctx") or {}).get("error")
    if isinstance(inner, ConfigError):
        parts = where.split(".")
        if not inner.field or inner.field.startswith(where) or inner.field.startswith("TIERSERVE_"):
            field = inner.field or where
        elif inner.field.split(".")[0].split("[")[0] == parts[-1]:   # the validator named its own field
            field = ".".join(parts[:-1] + [inner.field])
        else:
            field = f"{where}.{inner.field}"
        return ConfigError(field, inner.value, inner.allowed)
    return ConfigError(where, err.get("input"), str(err["msg"]).removeprefix("Value error, "))
