"""The data model at the bottom of tierserve: requests, their state, SLOs, tiers and batches."""
from tierserve.core.batch import AllocationRule, BatchPlan, PreemptMode
from tierserve.core.errors import ConfigError, TierserveError, TraceError
from tierserve.core.request import Outcome, Request, RequestState, Status, request_of, true_output_tokens
from tierserve.core.slo import NO_SLO, SLO, Tier, TierSet

__all__ = [
    "AllocationRule", "BatchPlan", "PreemptMode", "request_of", "true_output_tokens", "ConfigError", "TierserveError", "TraceError", "Outcome", "Request",
    "RequestState", "Status", "NO_SLO", "SLO", "Tier", "TierSet",
]
