"""Workloads: arrival processes, length distributions (fitted to public traces), tier/QoS mixes and trace
readers, assembled by `WorkloadConfig` → `build_requests`."""
from tierserve.workload.arrivals import (
    ArrivalProcess, GammaArrivals, PiecewiseRateArrivals, PoissonArrivals, TraceArrivals, diurnal, servegen,
    servegen_rate_shape,
)
from tierserve.workload.config import (
    ArrivalConfig, LengthConfig, SLOConfig, TiersConfig, TraceConfig, Workload, WorkloadConfig, build_requests,
    build_workload, default_workload, with_tier_slos, RequestStream, StreamedWorkload, stream_workload,
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
