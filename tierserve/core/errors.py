"""Errors raised on bad input. Each names the field, the value and what is allowed."""


class TierserveError(Exception):
    """Base class for every error tierserve raises on purpose."""


class ConfigError(TierserveError, ValueError):
    """An impossible or unknown configuration value."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field, self.value, self.allowed = field, value, allowed
        super().__init__(f"{field}: got {value!r}; allowed: {allowed}")


class TraceError(TierserveError, ValueError):
    """A malformed workload trace; names the file, the row and the field."""

    def __init__(self, source: str, row: int | None, field: str, value: object, problem: str) -> None:
        self.source, self.row, self.field, self.value = source, row, field, value
        where = f"{source}" + (f", row {row}" if row is not None else "")
        super().__init__(f"{where}: field {field!r} = {value!r}: {problem}")
