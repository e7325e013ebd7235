"""Workloads: arrival processes, length distributions (fitted to public traces), tier/QoS mixes and trace
readers, assembled by `WorkloadConfig` → `build_requests`.

Names are imported from their submodule on first use (PEP 562): reading a trace does not build the pydantic
workload models, and a generated workload does not load the trace readers."""
from __future__ import annotations

from typing import TYPE_CHECKING

from tierserve.core.lazy import lazy_exports

# public name -> submodule that defines it
_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("ArrivalProcess", "GammaArrivals", "PiecewiseRateArrivals", "PoissonArrivals", "TraceArrivals",
                     "diurnal", "servegen", "servegen_rate_shape"), "arrivals"),
    **dict.fromkeys(("ArrivalConfig", "LengthConfig", "SLOConfig", "TiersConfig", "TraceConfig", "Workload",
                     "WorkloadConfig", "build_requests", "build_workload", "default_workload", "with_tier_slos",
                     "RequestStream", "StreamedWorkload", "stream_workload"), "config"),
    **dict.fromkeys(("ChoiceLengths", "ClipResult", "EmpiricalLengths", "LengthSampler", "LognormalMixtureLengths",
                     "clip_total_tokens", "fitted_lengths", "load_length_fits"), "lengths"),
    **dict.fromkeys(("TRACE_FORMATS", "ReadResult", "TraceRow", "read_azure", "read_csv", "read_mooncake",
                     "read_rows", "read_trace", "read_vidur", "read_vidur_run"), "readers"),
    **dict.fromkeys(("NIYAMA_MIX", "NIYAMA_SLOS", "assign_tiers", "default_slos", "default_tier_set",
                     "enterprise_mix", "explicit_mix", "gaussian_mix", "niyama_tier_set", "tier_mix",
                     "uniform_mix"), "tiers"),
}

__all__ = [
    "ArrivalProcess", "GammaArrivals", "PiecewiseRateArrivals", "PoissonArrivals", "TraceArrivals", "diurnal",
    "servegen", "servegen_rate_shape",
    "ArrivalConfig", "LengthConfig", "SLOConfig", "TiersConfig", "TraceConfig", "Workload", "WorkloadConfig",
    "build_requests", "build_workload", "default_workload", "with_tier_slos", "RequestStream", "StreamedWorkload",
    "stream_workload",
    "ChoiceLengths", "ClipResult", "EmpiricalLengths", "LengthSampler", "LognormalMixtureLengths",
    "clip_total_tokens", "fitted_lengths", "load_length_fits",
    "TRACE_FORMATS", "ReadResult", "TraceRow", "read_azure", "read_csv", "read_mooncake", "read_rows",
    "read_trace", "read_vidur", "read_vidur_run",
    "NIYAMA_MIX", "NIYAMA_SLOS", "assign_tiers", "default_slos", "default_tier_set", "enterprise_mix",
    "explicit_mix", "gaussian_mix", "niyama_tier_set", "tier_mix", "uniform_mix",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())

if TYPE_CHECKING:   # what static tools see; at run time the names come from __getattr__
    from tierserve.workload.arrivals import (
        ArrivalProcess, GammaArrivals, PiecewiseRateArrivals, PoissonArrivals, TraceArrivals, diurnal, servegen,
        servegen_rate_shape,
    )
    from tierserve.workload.config import (
        ArrivalConfig, LengthConfig, RequestStream, SLOConfig, StreamedWorkload, TiersConfig, TraceConfig, Workload,
        WorkloadConfig, build_requests, build_workload, default_workload, stream_workload, with_tier_slos,
    )
    from tierserve.workload.lengths import (
        ChoiceLengths, ClipResult, EmpiricalLengths, LengthSampler, LognormalMixtureLengths, clip_total_tokens,
        fitted_lengths, load_length_fits,
    )
    from tierserve.workload.readers import (
        TRACE_FORMATS, ReadResult, TraceRow, read_azure, read_csv, read_mooncake, read_rows, read_trace, read_vidur,
        read_vidur_run,
    )
    from tierserve.workload.tiers import (
        NIYAMA_MIX, NIYAMA_SLOS, assign_tiers, default_slos, default_tier_set, enterprise_mix, explicit_mix,
        gaussian_mix, niyama_tier_set, tier_mix, uniform_mix,
    )
