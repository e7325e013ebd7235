"""Per-request records (columnar), per-tier summaries, SLO attainment, goodput, capacity bisection, and the
steady-state window, queue-stability verdict and 95% intervals over seeds (`stability`).

Names are imported from their submodule on first use (PEP 562), so a plain run does not pay for the ones it
never touches (stability, the output folder readers)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tierserve.core.lazy import lazy_exports

# public name -> submodule that defines it
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("RunOutputs", "load_outputs", "write_outputs"), "io"),
    **dict.fromkeys(("COLUMNS", "RequestTable", "TokenTBT"), "records"),
    **dict.fromkeys(("LatencyStats", "latency_stats", "weighted_latency_stats", "weighted_mean",
                     "weighted_quantile"), "stats"),
    **dict.fromkeys(("ALL", "CapacityResult", "Probe", "RunSummary", "TierSummary", "attainment_of",
                     "bisect_rate", "capacity_search", "summarize", "summarize_tier"), "summary"),
    **dict.fromkeys(("Interval", "SeedsResult", "StabilityVerdict", "SteadyRun", "aggregate", "mean_ci95",
                     "run_stability", "seeds_verdict", "stability_verdict", "steady_state_mask",
                     "steady_state_summary", "steady_state_table"), "stability"),
}

__all__ = [
    "ALL", "COLUMNS", "CapacityResult", "LatencyStats", "Probe", "RequestTable", "RunOutputs", "RunSummary",
    "TierSummary", "TokenTBT", "attainment_of", "bisect_rate", "capacity_search", "latency_stats", "load_outputs",
    "summarize", "summarize_tier", "weighted_latency_stats", "weighted_mean", "weighted_quantile", "write_outputs",
    "Interval", "SeedsResult", "StabilityVerdict", "SteadyRun", "aggregate", "mean_ci95", "run_stability",
    "seeds_verdict", "stability_verdict", "steady_state_mask", "steady_state_summary", "steady_state_table",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:   # what static tools see; at run time the names come from __getattr__
    from tierserve.metrics.io import RunOutputs, load_outputs, write_outputs
    from tierserve.metrics.records import COLUMNS, RequestTable, TokenTBT
    from tierserve.metrics.stability import (
        Interval, SeedsResult, StabilityVerdict, SteadyRun, aggregate, mean_ci95, run_stability, seeds_verdict,
        stability_verdict, steady_state_mask, steady_state_summary, steady_state_table,
    )
    from tierserve.metrics.stats import (
        LatencyStats, latency_stats, weighted_latency_stats, weighted_mean, weighted_quantile,
    )
    from tierserve.metrics.summary import (
        ALL, CapacityResult, Probe, RunSummary, TierSummary, attainment_of, bisect_rate, capacity_search, summarize,
        summarize_tier,
    )
