"""The data model at the bottom of tierserve: requests, their state, SLOs, tiers and batches."""
from tierserve.core.batch import BatchPlan, PreemptMode
from tierserve.core.errors import ConfigError, TierserveError, TraceError
from tierserve.core.request import Outcome, Request, RequestState, Status
from tierserve.core.slo import NO_SLO, SLO, Tier, TierSet

__all__ = [
    "BatchPlan", "PreemptMode", "ConfigError", "TierserveError", "TraceError", "Outcome", "Request",
    "RequestState", "Status", "NO_SLO", "SLO", "Tier", "TierSet",
]
