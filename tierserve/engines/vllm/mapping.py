"""Per-request tier and SLO as they reach a vLLM engine, and back.

What a client sends (OpenAI-compatible server; the same fields exist on `LLM.generate`):
  * `priority` (request body, or the `X-Vllm-Priority` header): vLLM serves LOWER values first. tierserve's
    tier index has the same orientation (0 = most important), so a client sends `priority = tier`.
  * `vllm_xargs` (request body; `SamplingParams.extra_args` in-process), keys read here:
        tier      int    the tier index (wins over `priority` when both are given)
        ttft_s    float  time-to-first-token target, seconds
        tbt_s     float  time-between-tokens target, seconds
        ttlt_s    float  time-to-last-token target, seconds (non-interactive requests)
        app       str    application label (per-app statistics some policies keep)
    A request's deadlines are its arrival plus these targets; a policy computes them from the `RequestState`
    exactly as in the simulator (`arrival_s` + `slo`), so nothing else is carried.

Gateway priorities are inverted. Kubernetes' Gateway API inference extension (`InferenceObjective.priority`)
and llm-d treat HIGHER as more important; vLLM and tierserve treat lower as more important. A gateway priority
p therefore reaches vLLM as `-p` (`gateway_to_vllm_priority`), and without an explicit `tier` the tier is that
vLLM priority as given (negative values keep their order; they are not tier indices).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from tierserve.core import NO_SLO, SLO, ConfigError

XARG_KEYS = ("tier", "ttft_s", "tbt_s", "ttlt_s", "app")


@dataclass(frozen=True, slots=True)
class RequestMeta:
    """What tierserve knows of a request from the engine: its tier, SLO and application."""

    tier: int
    slo: SLO = NO_SLO
    app: str = ""


def request_meta(priority: int, extra_args: Mapping[str, Any] | None) -> RequestMeta:
    """Tier, SLO and app of one request from vLLM's `priority` and `SamplingParams.extra_args`.

    Raises ConfigError naming the field when a value is malformed (the scheduler turns it into a refusal of
    that request, never a crash of the engine).
    """
    xargs = extra_args or {}
    tier = xargs.get("tier", priority)
    if isinstance(tier, bool) or not isinstance(tier, int):
        raise ConfigError("vllm_xargs.tier", tier, "an integer tier index (0 = most important)")
    if "tier" in xargs and tier < 0:
        raise ConfigError("vllm_xargs.tier", tier, "an integer >= 0 (0 = most important)")
    targets = {}
    for key in ("ttft_s", "tbt_s", "ttlt_s"):
        v = xargs.get(key)
        if v is not None:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ConfigError(f"vllm_xargs.{key}", v, "a positive number of seconds")
            targets[key] = float(v)
    slo = SLO(**targets) if targets else NO_SLO     # SLO validates: positive and finite
    app = xargs.get("app", "")
    if not isinstance(app, str):
        raise ConfigError("vllm_xargs.app", app, "a string")
    return RequestMeta(tier, slo, app)


def gateway_to_vllm_priority(gateway_priority: int) -> int:
    """A gateway's priority (higher = more important) as vLLM's (lower = served first)."""
    return -int(gateway_priority)


def vllm_request_fields(tier: int, slo: SLO = NO_SLO, app: str = "") -> dict[str, Any]:
    """The request-body fields carrying a tier and SLO to a tierserve-scheduled vLLM server:
    `{"priority": tier, "vllm_xargs": {...}}` (merge into an OpenAI completions/chat request)."""
    if isinstance(tier, bool) or not isinstance(tier, int) or tier < 0:
        raise ConfigError("tier", tier, "an integer >= 0 (0 = most important)")
    xargs: dict[str, Any] = {"tier": tier}
    for key in ("ttft_s", "tbt_s", "ttlt_s"):
        v = getattr(slo, key)
        if v is not None:
            xargs[key] = v
    if app:
        xargs["app"] = app
    return {"priority": tier, "vllm_xargs": xargs}
