"""Per-request records (columnar), per-tier summaries, SLO attainment, goodput and capacity search."""
from tierserve.metrics.io import RunOutputs, load_outputs, write_outputs
from tierserve.metrics.records import COLUMNS, RequestTable, TokenTBT
from tierserve.metrics.stats import LatencyStats, latency_stats, weighted_latency_stats, weighted_mean, weighted_quantile
from tierserve.metrics.summary import (
    ALL, CapacityResult, Probe, RunSummary, TierSummary, attainment_of, capacity_search, summarize, summarize_tier,
)

__all__ = [
    "ALL", "COLUMNS", "CapacityResult", "LatencyStats", "Probe", "RequestTable", "RunOutputs", "RunSummary",
    "TierSummary", "TokenTBT", "attainment_of", "capacity_search", "latency_stats", "load_outputs", "summarize",
    "summarize_tier", "weighted_latency_stats", "weighted_mean", "weighted_quantile", "write_outputs",
]
