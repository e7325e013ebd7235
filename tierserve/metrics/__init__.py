"""Per-request records (columnar), per-tier summaries, SLO attainment, goodput, capacity bisection, and the
steady-state window, queue-stability verdict and 95% intervals over seeds (`stability`)."""
from tierserve.metrics.io import RunOutputs, load_outputs, write_outputs
from tierserve.metrics.records import COLUMNS, RequestTable, TokenTBT
from tierserve.metrics.stats import LatencyStats, latency_stats, weighted_latency_stats, weighted_mean, weighted_quantile
from tierserve.metrics.summary import (
    ALL, CapacityResult, Probe, RunSummary, TierSummary, attainment_of, bisect_rate, capacity_search, summarize,
    summarize_tier,
)
from tierserve.metrics.stability import (
    Interval, SeedsResult, StabilityVerdict, SteadyRun, aggregate, mean_ci95, run_stability, seeds_verdict,
    stability_verdict, steady_state_mask, steady_state_summary, steady_state_table,
)

__all__ = [
    "ALL", "COLUMNS", "CapacityResult", "LatencyStats", "Probe", "RequestTable", "RunOutputs", "RunSummary",
    "TierSummary", "TokenTBT", "attainment_of", "bisect_rate", "capacity_search", "latency_stats", "load_outputs",
    "summarize", "summarize_tier", "weighted_latency_stats", "weighted_mean", "weighted_quantile", "write_outputs",
    "Interval", "SeedsResult", "StabilityVerdict", "SteadyRun", "aggregate", "mean_ci95", "run_stability",
    "seeds_verdict", "stability_verdict", "steady_state_mask", "steady_state_summary", "steady_state_table",
]
