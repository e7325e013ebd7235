"""The router's configuration: validated YAML like a scenario (unknown fields refused, the bad field named).

    engines: [{url: "http://127.0.0.1:8001"}, {url: "http://127.0.0.1:8002"}]
    tiers:
      - {name: gold, slo: {ttft_s: 0.5, tbt_s: 0.05}, max_in_flight: 8, overflow: downgrade,
         service_tier: priority, gateway_priority: 100}
      - {name: silver, slo: {ttft_s: 2.0}, max_in_flight: 16, overflow: queue, max_queued: 64}
      - {name: bronze, max_in_flight: 4, overflow: reject}
    cluster_policy: jsq
    api_keys: {sk-abc: gold}
    service_tiers: {priority: gold, default: silver, auto: silver, flex: bronze}

Tier 0 is the most important (tierserve's and vLLM's orientation). Every field has a default except
`engines`; `tierserve router --check CONFIG` validates a file without serving.
"""
from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tierserve.core.errors import ConfigError, config_error_from_validation
from tierserve.core.files import read_mapping
from tierserve.core.limits import Float, Int
from tierserve.core.slo import NO_SLO, SLO
from tierserve.workload.config import SLOConfig, check_tier_name

MAX_ENGINES = 1024
MAX_SLO_MS = 3_600_000.0          # an SLO header above one hour is refused as absurd (not a latency target)
Seconds = Annotated[Float, Field(gt=0, le=86_400, allow_inf_nan=False)]
Count = Annotated[Int, Field(ge=0, le=1_000_000)]
CRITICALITIES = ("Critical", "Standard", "Sheddable")     # Gateway API Inference Extension's bands
OPENAI_SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")
# Policies that read an engine's step model (`uses_deadline_load`) need the simulator's replica state.
ROUTER_POLICY_REFUSED_REASON = ("a policy that reads neither deadline_load nor an instance's execution-time model "
                                "(the router has no engine step model)")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineConfig(_Section):
    url: str = Field(description="Base URL of a vLLM OpenAI-compatible server, e.g. http://127.0.0.1:8001")
    max_num_seqs: Annotated[Int, Field(ge=1, le=1_000_000)] = Field(
        256, description="The engine's --max-num-seqs (vLLM does not export it; policies read it).")
    total_blocks: Annotated[Int, Field(ge=1, le=2**31)] | None = Field(
        None, description="KV blocks, when the engine's vllm:cache_config_info does not say (it normally does).")
    block_size: Annotated[Int, Field(ge=1, le=4096)] = Field(
        16, description="Tokens per KV block, when vllm:cache_config_info does not say.")

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("an http(s) URL with a host, e.g. http://127.0.0.1:8001")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError("a base URL without a path (the router adds /v1/..., /metrics)")
        return v.rstrip("/")


class TierConfig(_Section):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    slo: SLOConfig | None = Field(None, description="Targets forwarded to the engine when the request names none.")
    max_in_flight: Count | None = Field(None, description="Requests of this tier at engines at once; null: no cap.")
    overflow: Literal["downgrade", "queue", "reject"] = Field(
        "queue", description="At the cap: serve as the next tier, wait in this tier's queue, or refuse (429).")
    max_queued: Count = Field(64, description="Bound of this tier's lane of the global queue (full: 429).")
    queue_timeout_s: Seconds = Field(30.0, description="Longest wait in the queue before a 429.")
    retry_after_s: Annotated[Int, Field(ge=1, le=86_400)] = Field(1, description="Retry-After of this tier's 429s.")
    service_tier: Annotated[str, Field(min_length=1, max_length=64)] | None = Field(
        None, description="The `service_tier` echoed in answers served at this tier (default: the tier's name).")
    gateway_priority: Annotated[Int, Field(ge=-2**31, le=2**31)] | None = Field(
        None, description="Gateway priority (higher = more important) from which requests land in this tier.")

    def to_slo(self) -> SLO:
        return self.slo.to_slo() if self.slo is not None else NO_SLO

    @property
    def echo(self) -> str:
        return self.service_tier or self.name


def default_tiers() -> list[TierConfig]:
    return [TierConfig(name="default")]


class RouterConfig(_Section):
    engines: list[EngineConfig] = Field(min_length=1, max_length=MAX_ENGINES)
    host: str = Field("127.0.0.1", description="Address the router listens on.")
    port: Annotated[Int, Field(ge=0, le=65535)] = 8000
    tiers: list[TierConfig] = Field(default_factory=default_tiers, min_length=1, max_length=100)
    default_tier: str | None = Field(None, description="Tier of a request nothing names (default: the last).")
    cluster_policy: str = Field("jsq", description="A cluster policy of `tierserve policies` (the simulator's).")
    cluster_policy_params: dict[str, Any] = Field(default_factory=dict)
    seed: Annotated[Int, Field(ge=0, le=2**63 - 1)] = 0
    api_keys: dict[str, str] = Field(default_factory=dict, description="Bearer API key -> tier name.")
    tier_header: str = Field("x-tier", description="Header naming a tier.")
    service_tiers: dict[str, str] = Field(default_factory=dict,
                                          description="OpenAI `service_tier` value -> tier name.")
    criticalities: dict[str, str] = Field(default_factory=dict,
                                          description="GIE criticality (Critical/Standard/Sheddable) -> tier name.")
    criticality_header: str = Field("x-gateway-inference-criticality", description="Header carrying GIE's band.")
    gateway_priority_header: str = Field("x-gateway-inference-priority",
                                         description="Header carrying a gateway priority (higher = more important).")
    max_slo_ms: Annotated[Float, Field(gt=0, le=MAX_SLO_MS, allow_inf_nan=False)] = Field(
        600_000.0, description="Largest llm-d SLO header accepted (larger is refused as absurd).")
    scrape_interval_s: Annotated[Float, Field(ge=0.01, le=3600, allow_inf_nan=False)] = 0.5
    scrape_timeout_s: Seconds = 2.0
    scrape_failures_down: Annotated[Int, Field(ge=1, le=1000)] = Field(
        3, description="Failed scrapes in a row that mark an engine down (a refused connection: at once).")
    connect_timeout_s: Seconds = 2.0
    engine_timeout_s: Seconds = Field(120.0, description="Longest silence from an engine mid-request (then 504).")
    max_body_bytes: Annotated[Int, Field(ge=1024, le=2**30)] = 1_048_576
    retry_after_unavailable_s: Annotated[Int, Field(ge=1, le=86_400)] = 5
    log_requests: bool = Field(True, description="One JSON log line per request end.")

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        try:
            ipaddress.ip_address(v)
        except ValueError:
            if v != "localhost":
                raise ValueError("an IP address to listen on (e.g. 127.0.0.1) or localhost") from None
        return v

    @field_validator("cluster_policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        from tierserve.policies.cluster import CLUSTER_POLICIES
        if v not in CLUSTER_POLICIES.table:
            raise ValueError(f"one of {', '.join(CLUSTER_POLICIES.names)}")
        policy = CLUSTER_POLICIES.get_class(v)
        if getattr(policy, "uses_deadline_load", False) or getattr(policy, "uses_instance_predictor", False):
            raise ValueError(ROUTER_POLICY_REFUSED_REASON)
        return v

    @field_validator("tier_header", "criticality_header", "gateway_priority_header")
    @classmethod
    def _header(cls, v: str) -> str:
        if not v or not all(c.isalnum() or c in "-_" for c in v):
            raise ValueError("an HTTP header name (letters, digits, - and _)")
        return v.lower()

    @model_validator(mode="after")
    def _consistent(self) -> RouterConfig:
        names = [t.name for t in self.tiers]
        for i, t in enumerate(self.tiers):
            try:
                check_tier_name(f"tiers[{i}].name", t.name, names[:i])
            except ConfigError as e:
                raise ConfigError(f"tiers.{i}.name", t.name, e.allowed) from None
        last = len(self.tiers) - 1
        if self.tiers[last].overflow == "downgrade":
            raise ConfigError(f"tiers.{last}.overflow", "downgrade",
                              "queue or reject (the last tier has no tier below it)")
        prios = [(i, t.gateway_priority) for i, t in enumerate(self.tiers) if t.gateway_priority is not None]
        for (i, a), (j, b) in zip(prios, prios[1:]):
            if not b < a:
                raise ConfigError(f"tiers.{j}.gateway_priority", b, f"less than tier {i}'s {a} (higher gateway "
                                  "priority = more important = a lower tier index)")
        for field, table in (("api_keys", self.api_keys), ("service_tiers", self.service_tiers),
                             ("criticalities", self.criticalities)):
            for key, tier in table.items():
                if tier not in names:
                    raise ConfigError(f"{field}.{key}", tier, f"a tier name ({', '.join(names)})")
        for key in self.criticalities:
            if key not in CRITICALITIES:
                raise ConfigError(f"criticalities.{key}", key, ", ".join(CRITICALITIES))
        if self.default_tier is not None and self.default_tier not in names:
            raise ConfigError("default_tier", self.default_tier, f"a tier name ({', '.join(names)})")
        urls = [e.url for e in self.engines]
        for i, u in enumerate(urls):
            if u in urls[:i]:
                raise ConfigError(f"engines.{i}.url", u, "a URL no other engine has")
        if self.cluster_policy_params:
            from tierserve.policies.cluster import CLUSTER_POLICIES
            from tierserve.sim.config import check_policy_params
            try:
                check_policy_params(CLUSTER_POLICIES, self.cluster_policy, self.cluster_policy_params)
            except ConfigError as e:
                raise ConfigError(f"cluster_policy_params.{e.field}", e.value, e.allowed) from None
        return self

    @property
    def default_tier_index(self) -> int:
        names = [t.name for t in self.tiers]
        return names.index(self.default_tier) if self.default_tier is not None else len(names) - 1

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RouterConfig:
        """Validate; a wrong field raises one ConfigError naming the field path, the value and the rule."""
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise _named(config_error_from_validation(e, "router")) from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> RouterConfig:
        return cls.from_dict(read_mapping(path, "--config", "yaml"))


def _named(err: ConfigError) -> ConfigError:
    """A rule across fields raises its own ConfigError under the root: name that field alone."""
    if err.field.startswith("router."):
        return ConfigError(err.field.removeprefix("router."), err.value, err.allowed)
    return err
